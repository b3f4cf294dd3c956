//! Reading a host's certificate pair from `<tls_dir>/<host>/{tls.crt,tls.key}` and turning it into
//! what sozu is sent. Parsing is pure (bytes in); [`read_pair`] is the one function that reads
//! files.
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
    #[error("{}: the leaf is a CA certificate", path.display())]
    CaAsLeaf { path: PathBuf },
    #[error("{}: the chain is out of order (certificate {index} did not issue the one before it)", path.display())]
    ChainOrder { path: PathBuf, index: usize },
    #[error("{}: the signature of certificate {index} does not verify with its issuer's key ({reason})", path.display())]
    BadSignature {
        path: PathBuf,
        index: usize,
        reason: String,
    },
    #[error("{}: no private key found", path.display())]
    NoKey { path: PathBuf },
    #[error("{}: the private key is encrypted; sozu needs it in the clear", path.display())]
    EncryptedKey { path: PathBuf },
    #[error("{}: unsupported private key: {reason}", path.display())]
    UnsupportedKey { path: PathBuf, reason: String },
    #[error("{}: the private key does not match the leaf certificate", path.display())]
    KeyMismatch { path: PathBuf },
    #[error("{}: not valid yet (valid from {not_before})", path.display())]
    NotYetValid { path: PathBuf, not_before: String },
    #[error("{}: expired (valid until {not_after})", path.display())]
    Expired { path: PathBuf, not_after: String },
    #[error("{}: has no DNS subject alternative name; clients ignore the common name and refuse it", path.display())]
    NoSubjectAltName { path: PathBuf },
    #[error("{}: does not cover {host} (it names {names})", path.display())]
    WrongName {
        path: PathBuf,
        host: String,
        names: String,
    },
    #[error("{}: the certificate files kept changing while being read", dir.display())]
    Unstable { dir: PathBuf },
}

impl CertError {
    /// A short, stable name of the failure, for metrics labels.
    pub fn reason(&self) -> &'static str {
        match self {
            CertError::Unreadable { .. } => "unreadable",
            CertError::NoCertificate { .. } => "no_certificate",
            CertError::BadLeaf { .. } => "bad_leaf",
            CertError::CaAsLeaf { .. } => "ca_as_leaf",
            CertError::ChainOrder { .. } => "chain_order",
            CertError::BadSignature { .. } => "bad_signature",
            CertError::NoKey { .. } => "no_key",
            CertError::EncryptedKey { .. } => "encrypted_key",
            CertError::UnsupportedKey { .. } => "unsupported_key",
            CertError::KeyMismatch { .. } => "key_mismatch",
            CertError::NotYetValid { .. } => "not_yet_valid",
            CertError::Expired { .. } => "expired",
            CertError::NoSubjectAltName { .. } => "no_san",
            CertError::WrongName { .. } => "wrong_name",
            CertError::Unstable { .. } => "unstable",
        }
    }
}

/// How many times a read is retried when the volume's `..data` link moves under it.
const READ_ATTEMPTS: usize = 5;

/// A pair's bytes as read, consistently, from one host directory.
#[derive(Clone, PartialEq, Eq)]
pub struct RawPair {
    pub crt: Vec<u8>,
    /// Wiped from memory when the read is done with.
    pub key: zeroize::Zeroizing<Vec<u8>>,
    /// The visible paths (`<dir>/tls.crt`, `<dir>/tls.key`), which errors name.
    pub crt_path: PathBuf,
    pub key_path: PathBuf,
}

impl RawPair {
    pub fn parse(&self, host: &str, now: i64) -> Result<Certificate, CertError> {
        parse(
            &self.crt,
            &self.crt_path,
            &self.key,
            &self.key_path,
            host,
            now,
        )
    }

    /// A digest of both files' bytes: equal digests, equal pairs. Kept instead of the bytes, so
    /// no key lingers in memory to compare a later read with.
    pub fn digest(&self) -> [u8; 32] {
        let mut digest = Sha256::new();
        for part in [&self.crt, &self.key] {
            digest.update((part.len() as u64).to_le_bytes());
            digest.update(part);
        }
        digest.finalize().into()
    }
}

impl std::fmt::Debug for RawPair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawPair")
            .field("crt_path", &self.crt_path)
            .field("key_path", &self.key_path)
            .finish_non_exhaustive()
    }
}

/// Reads `<dir>/tls.crt` and `<dir>/tls.key` as one pair: the one function here that reads files.
///
/// A Kubernetes volume (cert-manager's CSI driver, a Secret) swaps a `..data` symlink to a new
/// timestamped directory and removes the old one at once. Reading `tls.crt` and then `tls.key`
/// through the visible links could straddle a swap and pair one renewal's certificate with
/// another's key; so `..data` is resolved once, both files are read from the directory it
/// names, and the link is checked again afterwards (a moved link or a vanished file means a swap
/// was under way: read again). [`RawPair::parse`] then validates it, without I/O.
pub fn read_pair(dir: &Path) -> Result<RawPair, CertError> {
    let data = dir.join("..data");
    for _ in 0..READ_ATTEMPTS {
        let target = std::fs::read_link(&data).ok();
        let base = match &target {
            Some(target) => dir.join(target),
            None => dir.to_owned(),
        };
        let (crt_path, key_path) = (base.join("tls.crt"), base.join("tls.key"));
        let pair = read_bounded(&crt_path).and_then(|crt| Ok((crt, read_bounded(&key_path)?)));
        let moved = target.is_some() && std::fs::read_link(&data).ok() != target;
        match pair {
            Ok(_) if moved => continue,
            Ok((crt, key)) => {
                // Errors name the visible paths, which are what an operator looks at.
                return Ok(RawPair {
                    crt,
                    key: key.into(),
                    crt_path: dir.join("tls.crt"),
                    key_path: dir.join("tls.key"),
                });
            }
            // A file gone because the link moved is a swap under way: read again. A file missing
            // behind a link that stayed put is simply missing.
            Err(CertError::Unreadable { .. }) if moved => continue,
            Err(e) => return Err(visible(e, dir)),
        }
    }
    Err(CertError::Unstable {
        dir: dir.to_owned(),
    })
}

/// Names the visible file (`<dir>/tls.crt`) rather than the timestamped directory behind it.
fn visible(err: CertError, dir: &Path) -> CertError {
    match err {
        CertError::Unreadable { path, reason } => CertError::Unreadable {
            path: dir.join(path.file_name().unwrap_or_default()),
            reason,
        },
        other => other,
    }
}

/// Reads a regular file of at most [`MAX_FILE_BYTES`]. Anything else is refused without blocking:
/// opening a named pipe with no writer would stall the loop, and `/dev/zero` never ends.
fn read_bounded(path: &Path) -> Result<Vec<u8>, CertError> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let unreadable = |reason: String| CertError::Unreadable {
        path: path.to_owned(),
        reason,
    };
    let too_big = |len: u64| {
        unreadable(format!(
            "{len} bytes or more, more than the {MAX_FILE_BYTES} a certificate file may have"
        ))
    };
    // Non-blocking, so that even a pipe swapped in after a check cannot block the open; checked
    // on the descriptor itself, so what is checked is what is read.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| unreadable(io_reason(&e)))?;
    let meta = file.metadata().map_err(|e| unreadable(io_reason(&e)))?;
    if !meta.is_file() {
        return Err(unreadable("not a regular file".into()));
    }
    if meta.len() > MAX_FILE_BYTES {
        return Err(too_big(meta.len()));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| unreadable(io_reason(&e)))?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(too_big(bytes.len() as u64));
    }
    Ok(bytes)
}

/// The label of a PEM private key block the key loader does not know (`DSA PRIVATE KEY`, ...).
fn other_key_label(pem: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(pem).ok()?;
    text.lines().find_map(|line| {
        let label = line
            .trim()
            .strip_prefix("-----BEGIN ")?
            .strip_suffix("-----")?;
        label.ends_with("PRIVATE KEY").then(|| label.to_owned())
    })
}

fn io_reason(err: &std::io::Error) -> String {
    match err.kind() {
        std::io::ErrorKind::NotFound => "no such file".into(),
        std::io::ErrorKind::PermissionDenied => "permission denied".into(),
        _ => err.to_string(),
    }
}

/// Parses and validates a chain and a key already in memory, for `host` as of `now` (Unix
/// seconds); the paths only name them in errors.
pub fn parse(
    crt: &[u8],
    crt_path: &Path,
    key: &[u8],
    key_path: &Path,
    host: &str,
    now: i64,
) -> Result<Certificate, CertError> {
    let ders: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(crt)
        .collect::<Result<_, _>>()
        .map_err(|_| CertError::NoCertificate {
            path: crt_path.to_owned(),
        })?;
    let leaf_der = ders.first().ok_or_else(|| CertError::NoCertificate {
        path: crt_path.to_owned(),
    })?;
    let parsed: Vec<X509Certificate<'_>> = ders
        .iter()
        .map(|der| X509Certificate::from_der(der.as_ref()).map(|(_, c)| c))
        .collect::<Result<_, _>>()
        .map_err(|e| CertError::BadLeaf {
            path: crt_path.to_owned(),
            reason: e.to_string(),
        })?;
    let leaf = &parsed[0];
    if leaf.is_ca() {
        return Err(CertError::CaAsLeaf {
            path: crt_path.to_owned(),
        });
    }
    for (index, pair) in parsed.windows(2).enumerate() {
        if pair[0].issuer() != pair[1].subject() {
            return Err(CertError::ChainOrder {
                path: crt_path.to_owned(),
                index: index + 1,
            });
        }
    }

    if std::str::from_utf8(key).is_ok_and(|k| k.contains("ENCRYPTED")) {
        return Err(CertError::EncryptedKey {
            path: key_path.to_owned(),
        });
    }
    let key_der = PrivateKeyDer::from_pem_slice(key).map_err(|_| match other_key_label(key) {
        Some(label) => CertError::UnsupportedKey {
            path: key_path.to_owned(),
            reason: format!("a {label} block, which sozu cannot load"),
        },
        None => CertError::NoKey {
            path: key_path.to_owned(),
        },
    })?;
    // The same key loader sozu's TLS stack uses: what it refuses here, sozu would refuse.
    let signing = rustls::crypto::ring::sign::any_supported_type(&key_der).map_err(|e| {
        CertError::UnsupportedKey {
            path: key_path.to_owned(),
            reason: e.to_string(),
        }
    })?;
    let matches = signing
        .public_key()
        .is_some_and(|spki| spki.as_ref() == leaf.public_key().raw);
    if !matches {
        return Err(CertError::KeyMismatch {
            path: key_path.to_owned(),
        });
    }

    // After the key: a key sozu cannot load is the better diagnosis for a P-521 or DSA pair,
    // whose signatures ring cannot verify either.
    verify_signatures(&parsed, crt_path)?;

    let validity = leaf.validity();
    if now < validity.not_before.timestamp() {
        return Err(CertError::NotYetValid {
            path: crt_path.to_owned(),
            not_before: validity.not_before.to_string(),
        });
    }
    if now > validity.not_after.timestamp() {
        return Err(CertError::Expired {
            path: crt_path.to_owned(),
            not_after: validity.not_after.to_string(),
        });
    }
    let names = dns_names(leaf);
    if names.is_empty() {
        return Err(CertError::NoSubjectAltName {
            path: crt_path.to_owned(),
        });
    }
    if !valid_for(leaf_der, host) {
        return Err(CertError::WrongName {
            path: crt_path.to_owned(),
            host: host.to_owned(),
            names: names.iter().cloned().collect::<Vec<_>>().join(", "),
        });
    }

    // Re-encode from the DER that parsed, so what sozu receives is exactly what was checked.
    let chain: std::sync::Arc<[String]> = ders
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
        not_before: validity.not_before.timestamp(),
        not_after: validity.not_after.timestamp(),
        names: BTreeSet::from([host.to_owned()]).into(),
        other_names: names.into_iter().filter(|n| n != host).collect(),
    })
}

/// Whether the leaf is valid for `host` the way TLS clients decide it: webpki's subject-name
/// check (the one rustls clients run), which reads the DNS SANs only, never the common name, and
/// lets a `*.` wildcard cover exactly one leftmost label.
fn valid_for(leaf: &CertificateDer<'_>, host: &str) -> bool {
    let Ok(name) = rustls_pki_types::ServerName::try_from(host) else {
        return false;
    };
    webpki::EndEntityCert::try_from(leaf)
        .is_ok_and(|cert| cert.verify_is_valid_for_subject_name(&name).is_ok())
}

/// Verifies each certificate's signature with the key of the next one in the chain (its issuer,
/// as the order check established), and a self-signed last certificate with its own key. The
/// last certificate of a chain that stops below its root cannot be checked here: its issuer is
/// not in the file. Clients verify every signature, so a certificate altered on disk (one byte
/// of its DER changed still parses and can still match the key) would be refused by all of them.
fn verify_signatures(chain: &[X509Certificate<'_>], crt_path: &Path) -> Result<(), CertError> {
    for (index, cert) in chain.iter().enumerate() {
        let issuer_key = match chain.get(index + 1) {
            Some(issuer) => Some(issuer.public_key()),
            None if cert.issuer() == cert.subject() => None,
            None => continue,
        };
        cert.verify_signature(issuer_key)
            .map_err(|e| CertError::BadSignature {
                path: crt_path.to_owned(),
                index,
                reason: match e {
                    x509_parser::error::X509Error::SignatureUnsupportedAlgorithm => {
                        "an algorithm TLS clients do not accept".into()
                    }
                    other => other.to_string(),
                },
            })?;
    }
    Ok(())
}

/// SHA-256 of the DER, lowercase hex: sozu's certificate fingerprint.
pub fn fingerprint(der: &[u8]) -> String {
    Sha256::digest(der)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The DNS subject alternative names, lowercase: the names a TLS client checks.
fn dns_names(cert: &X509Certificate<'_>) -> BTreeSet<String> {
    cert.subject_alternative_name()
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
        .unwrap_or_default()
}

/// The names sozu indexes the first certificate in `pem` under (its DNS SANs, or its subject CN
/// when it has none), or `None` when it does not parse. For certificates read back from sozu,
/// which may have been added by anyone.
pub fn names_of_pem(pem: &[u8]) -> Option<BTreeSet<String>> {
    let der = CertificateDer::from_pem_slice(pem).ok()?;
    let (_, cert) = X509Certificate::from_der(der.as_ref()).ok()?;
    let sans = dns_names(&cert);
    if !sans.is_empty() {
        return Some(sans);
    }
    Some(
        cert.subject()
            .iter_common_name()
            .filter_map(|cn| cn.as_str().ok())
            .map(str::to_ascii_lowercase)
            .collect(),
    )
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
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};

    /// 2026-06-01: inside the validity of the test certificates below.
    const NOW: i64 = 1_780_272_000;
    const HOST: &str = "a.in.example.org";

    /// A throwaway P-521 key made for this test: sozu's TLS stack (rustls with ring) cannot sign
    /// with P-521, and ring cannot generate one at test time.
    const P521_KEY: &str = "-----BEGIN PRIVATE KEY-----\nMIHuAgEAMBAGByqGSM49AgEGBSuBBAAjBIHWMIHTAgEBBEIBN78qdztdbobk9dTy\nFcmmLLpFkSh3eqer/FvRUVVCW/RxoiRjn1aPulcajvFylGsTS+FW8pe4DM41U757\n9saNkeihgYkDgYYABAFw9jSkSuT7VucLrl0G6XosNRwyfw8X/sVEGz7KE0YizPk3\n0QGRMWYJZ0XeyLGPl3c+gAt8YBlANssHy1Tr3Cv/1QAkMSVrZ8lk4yl86bw2W8UQ\njUvlIRjiKH7FwAMnFZjb5Wl49VMAucY79unvigEx8qihI3+qDjkzg/NAswMDBy4/\n6Q==\n-----END PRIVATE KEY-----\n";

    struct Made {
        crt: String,
        key: String,
    }

    fn make(names: &[&str], from: (i32, u8, u8), to: (i32, u8, u8), ca: bool) -> Made {
        let key = KeyPair::generate().unwrap();
        let mut params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .unwrap();
        params.not_before = rcgen::date_time_ymd(from.0, from.1, from.2);
        params.not_after = rcgen::date_time_ymd(to.0, to.1, to.2);
        if ca {
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        }
        Made {
            crt: params.self_signed(&key).unwrap().pem(),
            key: key.serialize_pem(),
        }
    }

    fn good(names: &[&str]) -> Made {
        make(names, (2026, 1, 1), (2027, 1, 1), false)
    }

    fn check(crt: &str, key: &str) -> Result<Certificate, CertError> {
        parse(
            crt.as_bytes(),
            Path::new("/t/tls.crt"),
            key.as_bytes(),
            Path::new("/t/tls.key"),
            HOST,
            NOW,
        )
    }

    fn reason(crt: &str, key: &str) -> &'static str {
        match check(crt, key) {
            Ok(_) => "ok",
            Err(e) => e.reason(),
        }
    }

    #[test]
    fn a_valid_pair_parses_with_fingerprint_names_and_expiry() {
        let m = good(&[HOST]);
        let cert = check(&m.crt, &m.key).unwrap();
        assert_eq!(*cert.names, BTreeSet::from([HOST.to_owned()]));
        let der = CertificateDer::from_pem_slice(m.crt.as_bytes()).unwrap();
        assert_eq!(cert.fingerprint, fingerprint(der.as_ref()));
        assert_eq!(cert.not_after, 1_798_761_600);
        assert_eq!(
            CertificateDer::from_pem_slice(cert.chain[0].as_bytes()).unwrap(),
            der
        );
    }

    #[test]
    fn a_chain_signed_by_an_intermediate_parses_in_order_and_not_reversed() {
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "test intermediate");
        let ca_cert = ca_params.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca_params, ca_key);
        let leaf_key = KeyPair::generate().unwrap();
        let mut leaf_params = CertificateParams::new(vec![HOST.to_owned()]).unwrap();
        leaf_params.not_before = rcgen::date_time_ymd(2026, 1, 1);
        leaf_params.not_after = rcgen::date_time_ymd(2027, 1, 1);
        let leaf = leaf_params.signed_by(&leaf_key, &issuer).unwrap();
        let key = leaf_key.serialize_pem();
        let in_order = format!("{}{}", leaf.pem(), ca_cert.pem());
        assert_eq!(check(&in_order, &key).unwrap().chain.len(), 2);
        let reversed = format!("{}{}", ca_cert.pem(), leaf.pem());
        assert_eq!(reason(&reversed, &key), "ca_as_leaf");
        let other = good(&["other.in.example.org"]);
        let unrelated = format!("{}{}", leaf.pem(), other.crt);
        assert_eq!(reason(&unrelated, &key), "chain_order");
    }

    #[test]
    fn each_kind_of_bad_pair_is_refused_with_its_reason() {
        let m = good(&[HOST]);
        let other = good(&[HOST]);
        let own = |made: Made| (made.crt, made.key);
        let cases: Vec<(&str, (String, String), &str)> = vec![
            ("mismatched key", (m.crt.clone(), other.key.clone()), "key_mismatch"),
            ("expired", own(make(&[HOST], (2024, 1, 1), (2025, 1, 1), false)), "expired"),
            ("not yet valid", own(make(&[HOST], (2027, 1, 1), (2028, 1, 1), false)), "not_yet_valid"),
            ("wrong SAN", own(good(&["b.in.example.org"])), "wrong_name"),
            ("wildcard one level too deep", own(good(&["*.example.org"])), "wrong_name"),
            ("CA as leaf", own(make(&[HOST], (2026, 1, 1), (2027, 1, 1), true)), "ca_as_leaf"),
            ("truncated PEM", (m.crt[..m.crt.len() / 2].to_owned(), m.key.clone()), "no_certificate"),
            ("empty certificate", (String::new(), m.key.clone()), "no_certificate"),
            ("binary garbage", ("\u{0}\u{1}\u{2}\u{fffd}garbage".into(), m.key.clone()), "no_certificate"),
            ("key in place of the certificate", (m.key.clone(), m.key.clone()), "no_certificate"),
            ("certificate in place of the key", (m.crt.clone(), m.crt.clone()), "no_key"),
            ("empty key", (m.crt.clone(), String::new()), "no_key"),
            (
                "encrypted key",
                (m.crt.clone(), "-----BEGIN ENCRYPTED PRIVATE KEY-----\nMIIB\n-----END ENCRYPTED PRIVATE KEY-----\n".into()),
                "encrypted_key",
            ),
            ("unsupported key type", (m.crt.clone(), P521_KEY.into()), "unsupported_key"),
        ];
        for (what, (crt, key), expected) in cases {
            assert_eq!(reason(&crt, &key), expected, "{what}");
        }
        assert_eq!(reason(&m.crt, &m.key), "ok");
    }

    #[test]
    fn names_match_the_way_clients_match_them() {
        let for_host = |names: &[&str], host: &str| {
            let m = good(names);
            parse(
                m.crt.as_bytes(),
                Path::new("/t/tls.crt"),
                m.key.as_bytes(),
                Path::new("/t/tls.key"),
                host,
                NOW,
            )
            .map(|_| ())
            .map_err(|e| e.reason())
        };
        assert_eq!(for_host(&["*.in.example.org"], "a.in.example.org"), Ok(()));
        assert_eq!(
            for_host(&["*.in.example.org"], "a.b.in.example.org"),
            Err("wrong_name")
        );
        assert_eq!(
            for_host(&["*.in.example.org"], "in.example.org"),
            Err("wrong_name")
        );
        assert_eq!(for_host(&["A.In.Example.Org"], "a.in.example.org"), Ok(()));
        assert_eq!(
            for_host(
                &["b.in.example.org", "a.in.example.org"],
                "a.in.example.org"
            ),
            Ok(())
        );
    }

    /// A certificate naming the host only in its common name: browsers and rustls refuse it, so
    /// serving it would replace a good certificate with one no client accepts.
    #[test]
    fn a_certificate_without_a_san_is_refused() {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, HOST);
        params.not_before = rcgen::date_time_ymd(2026, 1, 1);
        params.not_after = rcgen::date_time_ymd(2027, 1, 1);
        let crt = params.self_signed(&key).unwrap().pem();
        assert_eq!(reason(&crt, &key.serialize_pem()), "no_san");
    }

    /// One byte of the leaf's signed part changed: it still parses and its key still matches
    /// (the key is not in the byte changed), but no client would accept it.
    #[test]
    fn an_altered_certificate_is_refused_by_its_signature() {
        let m = good(&[HOST]);
        let der = CertificateDer::from_pem_slice(m.crt.as_bytes()).unwrap();
        let (_, cert) = X509Certificate::from_der(der.as_ref()).unwrap();
        // The serial number lies early in the signed part, far from the public key.
        let serial = cert.tbs_certificate.raw_serial();
        let at = der
            .as_ref()
            .windows(serial.len())
            .position(|w| w == serial)
            .unwrap();
        let mut altered = der.to_vec();
        altered[at + serial.len() - 1] ^= 0x01;
        let crt = pem("CERTIFICATE", &altered);
        assert_eq!(reason(&crt, &m.key), "bad_signature");
    }

    #[test]
    fn errors_name_the_file_and_never_the_key() {
        let m = good(&[HOST]);
        let err = check("garbage", &m.key).unwrap_err();
        assert_eq!(err.to_string(), "/t/tls.crt: no PEM certificate found");
        let other = good(&[HOST]);
        let err = check(&m.crt, &other.key).unwrap_err();
        assert_eq!(
            err.to_string(),
            "/t/tls.key: the private key does not match the leaf certificate"
        );
        let body: String = other.key.lines().nth(1).unwrap().into();
        assert!(!format!("{err:?}").contains(&body));
    }

    /// The layout cert-manager's CSI driver and the kubelet write: `..data` → a timestamped
    /// directory, visible links through `..data`.
    /// What the tls dir source does with a host's directory: read, then parse.
    fn load(tls_dir: &Path, host: &str, now: i64) -> Result<Certificate, CertError> {
        read_pair(&tls_dir.join(host))?.parse(host, now)
    }

    #[test]
    fn a_kubernetes_volume_is_read_through_its_data_link() {
        let tls = tempfile::tempdir().unwrap();
        let dir = tls.path().join(HOST);
        let stamp = dir.join("..2026_06_01_00_00_00.1");
        std::fs::create_dir_all(&stamp).unwrap();
        let m = good(&[HOST]);
        std::fs::write(stamp.join("tls.crt"), &m.crt).unwrap();
        std::fs::write(stamp.join("tls.key"), &m.key).unwrap();
        std::os::unix::fs::symlink("..2026_06_01_00_00_00.1", dir.join("..data")).unwrap();
        std::os::unix::fs::symlink("..data/tls.crt", dir.join("tls.crt")).unwrap();
        std::os::unix::fs::symlink("..data/tls.key", dir.join("tls.key")).unwrap();
        let cert = load(tls.path(), HOST, NOW).unwrap();
        let der = CertificateDer::from_pem_slice(m.crt.as_bytes()).unwrap();
        assert_eq!(cert.fingerprint, fingerprint(der.as_ref()));
        // The timestamped directory gone (a swap half done): a clear error naming the visible file.
        std::fs::remove_dir_all(&stamp).unwrap();
        let err = load(tls.path(), HOST, NOW).unwrap_err();
        assert!(
            matches!(
                err,
                CertError::Unstable { .. } | CertError::Unreadable { .. }
            ),
            "{err}"
        );
    }

    #[test]
    fn oversized_files_are_refused_unread() {
        let tls = tempfile::tempdir().unwrap();
        let dir = tls.path().join(HOST);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("tls.crt"), vec![b'A'; 10 << 20]).unwrap();
        std::fs::write(dir.join("tls.key"), "k").unwrap();
        let err = load(tls.path(), HOST, NOW).unwrap_err();
        assert!(err.to_string().contains("more than the"), "{err}");
    }
}
