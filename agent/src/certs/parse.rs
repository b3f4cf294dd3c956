//! Turning a pair's bytes into what sozu is sent, or the reason it is refused: chain order,
//! signatures, key match, validity, names. Pure: bytes in.

use std::collections::BTreeSet;
use std::path::Path;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use sha2::{Digest, Sha256};
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

use super::CertError;
use super::{Certificate, KeyPem};

/// The label of a PEM private key block the key loader does not know (`DSA PRIVATE KEY`, ...).
/// A block of a label it knows that still does not load is cut short or damaged (a key written
/// in place and read half-way): that is no key, not an unsupported one.
fn other_key_label(pem: &[u8]) -> Option<String> {
    const KNOWN: [&str; 3] = ["PRIVATE KEY", "RSA PRIVATE KEY", "EC PRIVATE KEY"];
    let text = std::str::from_utf8(pem).ok()?;
    text.lines().find_map(|line| {
        let label = line
            .trim()
            .strip_prefix("-----BEGIN ")?
            .strip_suffix("-----")?;
        (label.ends_with("PRIVATE KEY") && !KNOWN.contains(&label)).then(|| label.to_owned())
    })
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
    let (mut certificate, leaf_der) = parse_pair(crt, crt_path, key, key_path, now)?;
    if !valid_for(&leaf_der, host) {
        return Err(CertError::WrongName {
            path: crt_path.to_owned(),
            host: host.to_owned(),
            names: certificate.other_names.join(", "),
        });
    }
    certificate.names = BTreeSet::from([host.to_owned()]).into();
    certificate.other_names = certificate
        .other_names
        .iter()
        .filter(|n| *n != host)
        .cloned()
        .collect();
    Ok(certificate)
}

/// [`parse`] for a pair named by path (`certificates`), which serves whichever route hosts its
/// names cover: validated as every pair is, and returned with no `names` yet and every DNS
/// subject alternative name in `other_names` (the caller picks the hosts it serves,
/// [`super::names::covers`]).
pub fn parse_named(
    crt: &[u8],
    crt_path: &Path,
    key: &[u8],
    key_path: &Path,
    now: i64,
) -> Result<Certificate, CertError> {
    parse_pair(crt, crt_path, key, key_path, now).map(|(certificate, _)| certificate)
}

/// Everything [`parse`] checks but the host: the certificate with no `names` and every DNS SAN
/// in `other_names`, and the leaf's DER.
fn parse_pair(
    crt: &[u8],
    crt_path: &Path,
    key: &[u8],
    key_path: &Path,
    now: i64,
) -> Result<(Certificate, CertificateDer<'static>), CertError> {
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
    let certificate = Certificate {
        fingerprint: fingerprint(leaf_der.as_ref()).into(),
        chain,
        key: KeyPem::new(pem(key_label, key_der.secret_der())),
        not_before: validity.not_before.timestamp(),
        not_after: validity.not_after.timestamp(),
        names: Default::default(),
        other_names: names.into_iter().collect(),
        issuer: leaf.issuer().to_string().into(),
        listed: None,
    };
    Ok((certificate, leaf_der.clone().into_owned()))
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
///
/// The leaf's signature is verified every time. The CA certificates after it are the same in
/// every pair their CA issued and almost never change, so each is verified once per issuer key
/// ([`VerifiedIntermediates`]): a renewal, or a cold start of a thousand pairs from one CA, pays
/// for one signature per pair instead of one per certificate in its chain.
fn verify_signatures(chain: &[X509Certificate<'_>], crt_path: &Path) -> Result<(), CertError> {
    for (index, cert) in chain.iter().enumerate() {
        let issuer_key = match chain.get(index + 1) {
            Some(issuer) => Some(issuer.public_key()),
            None if cert.issuer() == cert.subject() => None,
            None => continue,
        };
        let known = (index > 0).then(|| {
            let key = issuer_key.unwrap_or_else(|| cert.public_key());
            VerifiedIntermediates::key(cert.as_raw(), key.raw)
        });
        if known.is_some_and(|k| VerifiedIntermediates::contains(&k)) {
            continue;
        }
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
        if let Some(key) = known {
            VerifiedIntermediates::insert(key);
        }
    }
    Ok(())
}

/// The CA certificates whose signature verified, each with the key that verified it: a digest of
/// the certificate's whole DER (its signed part and its signature) and of that key's bytes, so an
/// altered certificate, or the same one under another issuer, is verified afresh. Shared by
/// every reader (the tls dir's threads, the ACME issuer); bounded, since a tls dir can name any
/// number of CAs over a process's life.
struct VerifiedIntermediates;

static VERIFIED: std::sync::Mutex<Option<std::collections::HashSet<[u8; 32]>>> =
    std::sync::Mutex::new(None);

impl VerifiedIntermediates {
    /// More distinct CA certificates than any deployment has; past it the set starts over.
    const MAX: usize = 4096;

    fn key(cert_der: &[u8], issuer_key: &[u8]) -> [u8; 32] {
        let mut digest = Sha256::new();
        digest.update((cert_der.len() as u64).to_le_bytes());
        digest.update(cert_der);
        digest.update(issuer_key);
        digest.finalize().into()
    }

    fn contains(key: &[u8; 32]) -> bool {
        let set = VERIFIED.lock().unwrap_or_else(|p| p.into_inner());
        set.as_ref().is_some_and(|s| s.contains(key))
    }

    fn insert(key: [u8; 32]) {
        let mut set = VERIFIED.lock().unwrap_or_else(|p| p.into_inner());
        let set = set.get_or_insert_with(Default::default);
        if set.len() >= Self::MAX {
            set.clear();
        }
        set.insert(key);
    }
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

pub(super) fn pem(label: &str, der: &[u8]) -> String {
    use base64::Engine as _;
    let body = base64::engine::general_purpose::STANDARD.encode(der);
    // Sized exactly: every pair's text is kept while it is served, and a string grown by
    // doubling held about a third more than its text.
    let lines = body.len().div_ceil(64);
    let frame = "-----BEGIN -----\n".len() + "-----END -----\n".len() + 2 * label.len();
    let mut out = String::with_capacity(frame + body.len() + lines);
    out.push_str("-----BEGIN ");
    out.push_str(label);
    out.push_str("-----\n");
    for line in body.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(line));
        out.push('\n');
    }
    out.push_str("-----END ");
    out.push_str(label);
    out.push_str("-----\n");
    out
}
