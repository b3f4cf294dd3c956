//! The device CA of `listeners.client_auth` and its revocation lists, validated before sozu gets
//! them: sozu refuses a CRL past its `nextUpdate`, and a CRL that lapses while it holds it makes
//! every handshake fail, so a file is only sent when it parses, its CRLs are signed by the CA,
//! and their `nextUpdate` is still ahead. Pure: bytes in (the caller reads the files).

use std::path::{Path, PathBuf};

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, CertificateRevocationListDer};
use x509_parser::prelude::{FromDer, X509Certificate};
use x509_parser::revocation_list::CertificateRevocationList;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientCaError {
    #[error("{}: {reason}", path.display())]
    Unreadable { path: PathBuf, reason: String },
    #[error("{}: no PEM certificate found", path.display())]
    NoCertificate { path: PathBuf },
    #[error("{}: certificate {index} does not parse: {reason}", path.display())]
    BadCertificate {
        path: PathBuf,
        index: usize,
        reason: String,
    },
    #[error("{}: certificate {index} is not a CA certificate (no basicConstraints CA:true)", path.display())]
    NotCa { path: PathBuf, index: usize },
    #[error("{}: the CA certificate expired at {not_after} (Unix seconds)", path.display())]
    CaExpired { path: PathBuf, not_after: i64 },
    #[error("{}: no PEM CRL found", path.display())]
    NoCrl { path: PathBuf },
    #[error("{}: the CRL does not parse: {reason}", path.display())]
    BadCrl { path: PathBuf, reason: String },
    #[error("{}: the CRL is not signed by the CA of `ca_file` ({issuer})", path.display())]
    ForeignCrl { path: PathBuf, issuer: String },
    #[error("{}: the CRL has no nextUpdate: sozu cannot tell when it lapses", path.display())]
    NoNextUpdate { path: PathBuf },
    #[error("{}: the CRL's nextUpdate ({next_update}, Unix seconds) has passed: sozu refuses it", path.display())]
    CrlExpired { path: PathBuf, next_update: i64 },
}

/// A validated CA file: its PEM as sozu takes it, and what operators are shown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientCa {
    /// Each certificate, PEM.
    pub pems: Vec<String>,
    /// The first certificate's subject.
    pub subject: String,
    /// The earliest notAfter of its certificates, Unix seconds.
    pub not_after: i64,
    /// Each certificate's DER, to check the CRLs' signatures against.
    ders: Vec<Vec<u8>>,
}

/// A validated CRL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Crl {
    pub pem: String,
    pub issuer: String,
    /// Unix seconds.
    pub this_update: i64,
    pub next_update: i64,
    pub revoked: usize,
}

/// Parses the CA file: one or more PEM CA certificates, none expired at `now`.
pub fn parse_ca(bytes: &[u8], path: &Path, now: i64) -> Result<ClientCa, ClientCaError> {
    let mut pems = Vec::new();
    let mut ders = Vec::new();
    let mut subject = String::new();
    let mut not_after = i64::MAX;
    for (index, der) in CertificateDer::pem_slice_iter(bytes).enumerate() {
        let der = der.map_err(|e| ClientCaError::BadCertificate {
            path: path.to_owned(),
            index,
            reason: e.to_string(),
        })?;
        let (_, cert) =
            X509Certificate::from_der(der.as_ref()).map_err(|e| ClientCaError::BadCertificate {
                path: path.to_owned(),
                index,
                reason: e.to_string(),
            })?;
        if !cert.is_ca() {
            return Err(ClientCaError::NotCa {
                path: path.to_owned(),
                index,
            });
        }
        let expires = cert.validity().not_after.timestamp();
        if expires <= now {
            return Err(ClientCaError::CaExpired {
                path: path.to_owned(),
                not_after: expires,
            });
        }
        if index == 0 {
            subject = cert.subject().to_string();
        }
        not_after = not_after.min(expires);
        pems.push(pem("CERTIFICATE", der.as_ref()));
        ders.push(der.as_ref().to_vec());
    }
    if pems.is_empty() {
        return Err(ClientCaError::NoCertificate {
            path: path.to_owned(),
        });
    }
    Ok(ClientCa {
        pems,
        subject,
        not_after,
        ders,
    })
}

/// Parses a CRL file (its first PEM CRL) and checks it against `ca` at `now`.
pub fn parse_crl(bytes: &[u8], path: &Path, ca: &ClientCa, now: i64) -> Result<Crl, ClientCaError> {
    let der = CertificateRevocationListDer::pem_slice_iter(bytes)
        .next()
        .ok_or_else(|| ClientCaError::NoCrl {
            path: path.to_owned(),
        })?
        .map_err(|e| ClientCaError::BadCrl {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
    let (_, crl) =
        CertificateRevocationList::from_der(der.as_ref()).map_err(|e| ClientCaError::BadCrl {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
    let issuer = crl.issuer().to_string();
    let signed = ca.ders.iter().any(|der| {
        X509Certificate::from_der(der)
            .map(|(_, cert)| crl.verify_signature(cert.public_key()).is_ok())
            .unwrap_or(false)
    });
    if !signed {
        return Err(ClientCaError::ForeignCrl {
            path: path.to_owned(),
            issuer,
        });
    }
    let next_update =
        crl.next_update()
            .map(|t| t.timestamp())
            .ok_or_else(|| ClientCaError::NoNextUpdate {
                path: path.to_owned(),
            })?;
    if next_update <= now {
        return Err(ClientCaError::CrlExpired {
            path: path.to_owned(),
            next_update,
        });
    }
    Ok(Crl {
        pem: pem("X509 CRL", der.as_ref()),
        issuer,
        this_update: crl.last_update().timestamp(),
        next_update,
        revoked: crl.iter_revoked_certificates().count(),
    })
}

/// DER as PEM with `label`, 64 columns.
fn pem(label: &str, der: &[u8]) -> String {
    use base64::Engine;
    let encoded = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for line in encoded.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(line));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{
        BasicConstraints, CertificateParams, CertificateRevocationListParams, CertifiedIssuer,
        IsCa, KeyIdMethod, KeyPair, KeyUsagePurpose, RevokedCertParams, SerialNumber,
    };
    use time::{Duration, OffsetDateTime};

    fn ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
    }

    fn crl(issuer: &CertifiedIssuer<'static, KeyPair>, next: Duration) -> String {
        let now = OffsetDateTime::now_utc();
        CertificateRevocationListParams {
            this_update: now - Duration::days(2),
            next_update: now + next,
            crl_number: SerialNumber::from(1u64),
            issuing_distribution_point: None,
            revoked_certs: vec![RevokedCertParams {
                serial_number: SerialNumber::from(1001u64),
                revocation_time: now - Duration::days(1),
                reason_code: None,
                invalidity_date: None,
            }],
            key_identifier_method: KeyIdMethod::Sha256,
        }
        .signed_by(issuer)
        .unwrap()
        .pem()
        .unwrap()
    }

    fn now() -> i64 {
        OffsetDateTime::now_utc().unix_timestamp()
    }

    /// A CA and its CRL pass, with what operators are shown; a CRL of another CA, one past its
    /// nextUpdate, a leaf in place of the CA, and files that hold no PEM are refused with why.
    #[test]
    fn a_ca_and_its_crl_pass_and_every_other_file_is_refused_with_why() {
        let devices = ca("devices");
        let path = Path::new("/etc/devices/ca.crt");
        let parsed = parse_ca(devices.pem().as_bytes(), path, now()).unwrap();
        assert_eq!(parsed.subject, "CN=devices");
        assert_eq!(parsed.pems.len(), 1);
        let crl_path = Path::new("/etc/devices/devices.crl");
        let good = parse_crl(
            crl(&devices, Duration::days(7)).as_bytes(),
            crl_path,
            &parsed,
            now(),
        )
        .unwrap();
        assert_eq!(good.revoked, 1);
        assert!(good.next_update > now() + 6 * 86_400);

        let foreign = parse_crl(
            crl(&ca("elsewhere"), Duration::days(7)).as_bytes(),
            crl_path,
            &parsed,
            now(),
        )
        .unwrap_err();
        assert!(
            matches!(foreign, ClientCaError::ForeignCrl { .. }),
            "{foreign}"
        );
        let lapsed = parse_crl(
            crl(&devices, -Duration::hours(1)).as_bytes(),
            crl_path,
            &parsed,
            now(),
        )
        .unwrap_err();
        assert!(
            lapsed.to_string().contains("has passed: sozu refuses it"),
            "{lapsed}"
        );
        let leaf = rcgen::generate_simple_self_signed(vec!["a.example".into()]).unwrap();
        let not_ca = parse_ca(leaf.cert.pem().as_bytes(), path, now()).unwrap_err();
        assert!(
            matches!(not_ca, ClientCaError::NotCa { index: 0, .. }),
            "{not_ca}"
        );
        assert!(matches!(
            parse_ca(b"garbage", path, now()),
            Err(ClientCaError::NoCertificate { .. })
        ));
        assert!(matches!(
            parse_crl(b"garbage", crl_path, &parsed, now()),
            Err(ClientCaError::NoCrl { .. })
        ));
        // A half-written file: the PEM cut in the middle.
        let half = crl(&devices, Duration::days(7));
        let cut = parse_crl(&half.as_bytes()[..half.len() / 2], crl_path, &parsed, now());
        assert!(cut.is_err(), "{cut:?}");
    }
}
