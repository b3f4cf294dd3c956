//! Reading a host's certificate pair from `<tls_dir>/<host>/{tls.crt,tls.key}` and turning it into
//! what sozu is sent. Parsing is pure (bytes in); [`load`] is the one function that reads files.
//!
//! `tls.crt` holds the chain, leaf first; `tls.key` the private key (PKCS#1, PKCS#8 or SEC1).
//! Key bytes never appear in an error: errors name the file and what is wrong with it.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use sha2::{Digest, Sha256};
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

use crate::state::{Certificate, KeyPem};

/// Files larger than this are refused unread: a chain is a few KiB.
pub const MAX_FILE_BYTES: u64 = 1 << 20;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CertError {
    #[error("{}: {reason}", path.display())]
    Unreadable { path: PathBuf, reason: String },
    #[error("{}: no PEM certificate found", path.display())]
    NoCertificate { path: PathBuf },
    #[error("{}: the leaf certificate does not parse: {reason}", path.display())]
    BadLeaf { path: PathBuf, reason: String },
    #[error("{}: no private key found", path.display())]
    NoKey { path: PathBuf },
}

/// Reads and parses the pair of `host` under `tls_dir`.
pub fn load(tls_dir: &Path, host: &str) -> Result<Certificate, CertError> {
    let dir = tls_dir.join(host);
    let crt_path = dir.join("tls.crt");
    let key_path = dir.join("tls.key");
    let crt = read_bounded(&crt_path)?;
    let key = read_bounded(&key_path)?;
    parse(&crt, &crt_path, &key, &key_path)
}

fn read_bounded(path: &Path) -> Result<Vec<u8>, CertError> {
    let unreadable = |reason: String| CertError::Unreadable {
        path: path.to_owned(),
        reason,
    };
    let meta = std::fs::metadata(path).map_err(|e| unreadable(io_reason(&e)))?;
    if meta.len() > MAX_FILE_BYTES {
        return Err(unreadable(format!(
            "{} bytes, more than the {} a certificate file may have",
            meta.len(),
            MAX_FILE_BYTES
        )));
    }
    std::fs::read(path).map_err(|e| unreadable(io_reason(&e)))
}

fn io_reason(err: &std::io::Error) -> String {
    match err.kind() {
        std::io::ErrorKind::NotFound => "no such file".into(),
        std::io::ErrorKind::PermissionDenied => "permission denied".into(),
        _ => err.to_string(),
    }
}

/// Parses a chain and a key already in memory; the paths only name them in errors.
pub fn parse(
    crt: &[u8],
    crt_path: &Path,
    key: &[u8],
    key_path: &Path,
) -> Result<Certificate, CertError> {
    let ders: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(crt)
        .collect::<Result<_, _>>()
        .map_err(|_| CertError::NoCertificate {
            path: crt_path.to_owned(),
        })?;
    let leaf_der = ders.first().ok_or_else(|| CertError::NoCertificate {
        path: crt_path.to_owned(),
    })?;
    let (_, leaf) =
        X509Certificate::from_der(leaf_der.as_ref()).map_err(|e| CertError::BadLeaf {
            path: crt_path.to_owned(),
            reason: e.to_string(),
        })?;
    let key_der = PrivateKeyDer::from_pem_slice(key).map_err(|_| CertError::NoKey {
        path: key_path.to_owned(),
    })?;
    // Re-encode from the DER that parsed, so what sozu receives is exactly what was checked.
    let chain = ders
        .iter()
        .map(|der| pem("CERTIFICATE", der.as_ref()))
        .collect();
    let key_label = match &key_der {
        PrivateKeyDer::Pkcs1(_) => "RSA PRIVATE KEY",
        PrivateKeyDer::Sec1(_) => "EC PRIVATE KEY",
        _ => "PRIVATE KEY",
    };
    Ok(Certificate {
        fingerprint: fingerprint(leaf_der.as_ref()),
        chain,
        key: KeyPem::new(pem(key_label, key_der.secret_der())),
        not_after: leaf.validity().not_after.timestamp(),
        names: names(&leaf),
    })
}

/// SHA-256 of the DER, lowercase hex: sozu's certificate fingerprint.
pub fn fingerprint(der: &[u8]) -> String {
    Sha256::digest(der)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The DNS SANs, or the subject CN when there is no SAN: the names a TLS client checks.
fn names(cert: &X509Certificate<'_>) -> BTreeSet<String> {
    let sans: BTreeSet<String> = cert
        .subject_alternative_name()
        .ok()
        .flatten()
        .map(|ext| {
            ext.value
                .general_names
                .iter()
                .filter_map(|n| match n {
                    GeneralName::DNSName(d) => Some(d.to_ascii_lowercase()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    if !sans.is_empty() {
        return sans;
    }
    cert.subject()
        .iter_common_name()
        .filter_map(|cn| cn.as_str().ok())
        .map(str::to_ascii_lowercase)
        .collect()
}

/// The names of the first certificate in `pem`, or `None` when it does not parse.
pub fn names_of_pem(pem: &[u8]) -> Option<BTreeSet<String>> {
    let der = CertificateDer::from_pem_slice(pem).ok()?;
    let (_, cert) = X509Certificate::from_der(der.as_ref()).ok()?;
    Some(names(&cert))
}

fn pem(label: &str, der: &[u8]) -> String {
    use base64::Engine as _;
    let body = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for line in body.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(line));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(host: &str) -> (String, String) {
        let c = rcgen::generate_simple_self_signed(vec![host.to_owned()]).unwrap();
        (c.cert.pem(), c.signing_key.serialize_pem())
    }

    #[test]
    fn a_pair_parses_with_fingerprint_names_and_expiry() {
        let (crt, key) = pair("a.in.example.org");
        let cert = parse(
            crt.as_bytes(),
            Path::new("tls.crt"),
            key.as_bytes(),
            Path::new("tls.key"),
        )
        .unwrap();
        assert_eq!(cert.names, BTreeSet::from(["a.in.example.org".to_owned()]));
        let der = CertificateDer::from_pem_slice(crt.as_bytes()).unwrap();
        assert_eq!(cert.fingerprint, fingerprint(der.as_ref()));
        assert_eq!(cert.fingerprint.len(), 64);
        assert!(cert.not_after > 0);
        assert_eq!(cert.chain.len(), 1);
        assert_eq!(
            CertificateDer::from_pem_slice(cert.chain[0].as_bytes()).unwrap(),
            der
        );
    }

    #[test]
    fn errors_name_the_file_and_never_the_key() {
        let (crt, key) = pair("a.in.example.org");
        let err = parse(
            b"garbage",
            Path::new("/t/tls.crt"),
            key.as_bytes(),
            Path::new("/t/tls.key"),
        )
        .unwrap_err();
        assert_eq!(err.to_string(), "/t/tls.crt: no PEM certificate found");
        let err = parse(
            crt.as_bytes(),
            Path::new("/t/tls.crt"),
            crt.as_bytes(),
            Path::new("/t/tls.key"),
        )
        .unwrap_err();
        assert_eq!(err.to_string(), "/t/tls.key: no private key found");
        let err = format!(
            "{:?}",
            parse(crt.as_bytes(), Path::new("c"), b"", Path::new("k"))
        );
        assert!(!err.contains("PRIVATE KEY"));
    }
}
