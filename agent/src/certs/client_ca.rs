//! The device CA of `listeners.client_auth` and its revocation lists, validated before sozu gets
//! them: sozu refuses a CRL past its `nextUpdate`, and a CRL that lapses while it holds it makes
//! every handshake fail, so a file is only sent when it parses, its CRLs are signed by the CA,
//! and their `nextUpdate` is still ahead.
//!
//! A file is also built into what sozu 2.3.3 builds from it (`HttpsListener::client_cert_verifier`
//! and `check_crl_set` in sozu-lib): each CA certificate added to a `rustls::RootCertStore`,
//! each CRL parsed by rustls-webpki (the 0.103 line sozu's lock file pins), and the whole set
//! ([`check_set`]) under sozu's rule of one CRL per CA or per distribution point, then made into
//! rustls' client-certificate verifier. What passes here is what sozu takes: a file sozu would
//! refuse (a CRL without the CRL Number, which rustls-webpki refuses when it has no extension at
//! all) is refused here with its reason, and the last good version stays in force, where sozu's
//! refusal would leave the old CRL in force while the agent showed the new one. Pure: bytes in
//! (the caller reads the files).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::server::WebPkiClientVerifier;
use rustls::RootCertStore;
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
    #[error("{}: sozu cannot trust certificate {index} as a CA (rustls: {reason})", path.display())]
    UntrustedCa {
        path: PathBuf,
        index: usize,
        reason: String,
    },
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
    #[error(
        "{}: the CRL has no CRL Number, which RFC 5280 requires in every CRL, and sozu refuses \
         it (rustls-webpki: {reason}): issue it with one, as `openssl ca -gencrl` does with a \
         `crlnumber` file",
        path.display()
    )]
    NoCrlNumber { path: PathBuf, reason: String },
    #[error("{}: sozu refuses this CRL (rustls-webpki: {reason})", path.display())]
    CrlRefused { path: PathBuf, reason: String },
    #[error(
        "{}: this CRL and the one of {} are the same CA's for overlapping certificates, and sozu \
         refuses two such CRLs (it would consult the first alone): keep one CRL per CA, or one \
         per distribution point",
        path.display(),
        other.display()
    )]
    OverlappingCrls { path: PathBuf, other: PathBuf },
    #[error("{}: sozu cannot build its client-certificate verifier with this file (rustls: {reason})", path.display())]
    VerifierRefused { path: PathBuf, reason: String },
}

impl ClientCaError {
    /// The same refusal of a set ([`check_set`]), told of `file`, the file whose new version was
    /// tried in it: an overlap then names the other file, and the verifier's refusal is `file`'s.
    pub fn about(self, file: &Path) -> ClientCaError {
        match self {
            ClientCaError::OverlappingCrls { path, other } if other == file => {
                ClientCaError::OverlappingCrls {
                    path: other,
                    other: path,
                }
            }
            ClientCaError::VerifierRefused { reason, .. } => ClientCaError::VerifierRefused {
                path: file.to_owned(),
                reason,
            },
            other => other,
        }
    }
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
    der: Vec<u8>,
    /// What sozu's overlap rule compares, as rustls-webpki reads them: the issuer's name and the
    /// issuing distribution point, raw DER (none: the CRL covers all its CA issued).
    issuer_der: Vec<u8>,
    distribution_point: Option<Vec<u8>>,
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
        // What sozu does with each CA certificate (`roots.add`, "untrusted CA").
        RootCertStore::empty()
            .add(der.clone())
            .map_err(|e| ClientCaError::UntrustedCa {
                path: path.to_owned(),
                index,
                reason: e.to_string(),
            })?;
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
    // rustls-webpki's parser, which sozu's listener runs on every CRL it is given.
    let parsed = webpki::BorrowedCertRevocationList::from_der(der.as_ref())
        .map(webpki::CertRevocationList::from)
        .map_err(|e| match crl.crl_number() {
            None => ClientCaError::NoCrlNumber {
                path: path.to_owned(),
                reason: e.to_string(),
            },
            Some(_) => ClientCaError::CrlRefused {
                path: path.to_owned(),
                reason: e.to_string(),
            },
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
        der: der.as_ref().to_vec(),
        issuer_der: parsed.issuer().to_vec(),
        distribution_point: parsed.issuing_distribution_point().map(<[u8]>::to_vec),
    })
}

/// Checks the CA and the CRLs, in the order sozu gets them, as one set the way sozu 2.3.3 builds
/// its listener from them: no two CRLs of one CA whose scopes overlap (sozu's `check_crl_set`:
/// rustls-webpki consults the first CRL that is authoritative for a certificate and never the
/// others, so an old CRL listed before its replacement would hide the replacement's
/// revocations; CRLs of one CA with distinct distribution points do not overlap), then rustls'
/// client-certificate verifier built from them with the ring provider and revocation expiry
/// enforced, as sozu builds it. Time is left out, as sozu's own check of the set leaves it out:
/// each CRL's `nextUpdate` is checked when its file is read ([`parse_crl`]).
///
/// An overlap names the later file in `path` and the earlier in `other`; a verifier refused
/// names the CA file (see [`ClientCaError::about`]).
pub fn check_set(
    ca_path: &Path,
    ca: &ClientCa,
    crls: &[(&Path, &Crl)],
) -> Result<(), ClientCaError> {
    for (index, (path, crl)) in crls.iter().enumerate() {
        let overlapping = crls[..index].iter().find(|(_, seen)| {
            seen.issuer_der == crl.issuer_der
                && (seen.distribution_point.is_none()
                    || crl.distribution_point.is_none()
                    || seen.distribution_point == crl.distribution_point)
        });
        if let Some((other, _)) = overlapping {
            return Err(ClientCaError::OverlappingCrls {
                path: path.to_path_buf(),
                other: other.to_path_buf(),
            });
        }
    }
    let refused = |reason: String| ClientCaError::VerifierRefused {
        path: ca_path.to_owned(),
        reason,
    };
    let mut roots = RootCertStore::empty();
    for der in &ca.ders {
        roots
            .add(CertificateDer::from(der.clone()))
            .map_err(|e| refused(e.to_string()))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut builder = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
    if !crls.is_empty() {
        builder = builder
            .with_crls(
                crls.iter()
                    .map(|(_, crl)| CertificateRevocationListDer::from(crl.der.clone())),
            )
            .enforce_revocation_expiration();
    }
    builder.build().map_err(|e| refused(e.to_string()))?;
    Ok(())
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

/// The tests' device CAs and CRLs; the loop's tests use them too.
#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use rcgen::{
        BasicConstraints, CertificateParams, CertificateRevocationListParams, CertifiedIssuer,
        IsCa, KeyIdMethod, KeyPair, KeyUsagePurpose, RevokedCertParams, SerialNumber,
    };
    use time::{Duration, OffsetDateTime};

    pub(crate) fn ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
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

    /// A CRL of `issuer` revoking the serials `revoked`, 7 days long, scoped to the
    /// distribution point `uri` (none: everything the CA issued).
    pub(crate) fn crl_scoped(
        issuer: &CertifiedIssuer<'static, KeyPair>,
        uri: Option<&str>,
        revoked: &[u64],
    ) -> String {
        let now = OffsetDateTime::now_utc();
        CertificateRevocationListParams {
            this_update: now - Duration::hours(1),
            next_update: now + Duration::days(7),
            crl_number: SerialNumber::from(7u64),
            issuing_distribution_point: uri.map(|uri| rcgen::CrlIssuingDistributionPoint {
                distribution_point: rcgen::CrlDistributionPoint {
                    uris: vec![uri.to_owned()],
                },
                scope: None,
            }),
            revoked_certs: revoked
                .iter()
                .map(|&serial| RevokedCertParams {
                    serial_number: SerialNumber::from(serial),
                    revocation_time: now - Duration::hours(1),
                    reason_code: None,
                    invalidity_date: None,
                })
                .collect(),
            key_identifier_method: KeyIdMethod::Sha256,
        }
        .signed_by(issuer)
        .unwrap()
        .pem()
        .unwrap()
    }

    /// DER: `tag`, its length, `content`.
    fn tlv(tag: u8, content: &[u8]) -> Vec<u8> {
        let mut out = vec![tag];
        match u8::try_from(content.len()) {
            Ok(len) if len < 0x80 => out.push(len),
            _ => {
                let len = content.len().to_be_bytes();
                let zeros = len.iter().take_while(|b| **b == 0).count();
                out.push(0x80 | u8::try_from(len.len() - zeros).unwrap());
                out.extend_from_slice(&len[zeros..]);
            }
        }
        out.extend_from_slice(content);
        out
    }

    fn utc_time(t: OffsetDateTime) -> Vec<u8> {
        let text = format!(
            "{:02}{:02}{:02}{:02}{:02}{:02}Z",
            t.year() % 100,
            u8::from(t.month()),
            t.day(),
            t.hour(),
            t.minute(),
            t.second()
        );
        tlv(0x17, text.as_bytes())
    }

    /// A CRL of `issuer` revoking serial 1001, 7 days long, written field by field the way
    /// other tools write one (rcgen always adds a CRL Number): `version` 2 writes the version
    /// field (1 leaves it out, as openssl does without extensions), `extensions` the
    /// crlExtensions' DER (none: the field left out). Signed with the CA's key, ECDSA P-256.
    fn crl_written_by_hand(
        issuer: &CertifiedIssuer<'static, KeyPair>,
        version: u8,
        extensions: Option<Vec<u8>>,
    ) -> String {
        use rcgen::SigningKey;
        let now = OffsetDateTime::now_utc();
        // ecdsa-with-SHA256, 1.2.840.10045.4.3.2.
        let algorithm = tlv(
            0x30,
            &tlv(0x06, &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x02]),
        );
        let (_, ca) = X509Certificate::from_der(issuer.der()).unwrap();
        let mut tbs = Vec::new();
        if version == 2 {
            tbs.extend(tlv(0x02, &[0x01]));
        }
        tbs.extend(&algorithm);
        tbs.extend(ca.subject().as_raw());
        tbs.extend(utc_time(now - Duration::hours(1)));
        tbs.extend(utc_time(now + Duration::days(7)));
        let entry = [tlv(0x02, &[0x03, 0xe9]), utc_time(now - Duration::hours(1))].concat();
        tbs.extend(tlv(0x30, &tlv(0x30, &entry)));
        if let Some(extensions) = extensions {
            tbs.extend(tlv(0xa0, &tlv(0x30, &extensions)));
        }
        let tbs = tlv(0x30, &tbs);
        let signature = issuer.key().sign(&tbs).unwrap();
        let mut bits = vec![0u8];
        bits.extend(signature);
        let der = tlv(0x30, &[tbs, algorithm, tlv(0x03, &bits)].concat());
        pem("X509 CRL", &der)
    }

    /// One CRL extension's DER: `oid` (its encoded arcs) and its value's DER.
    fn extension(oid: &[u8], value: &[u8]) -> Vec<u8> {
        tlv(0x30, &[tlv(0x06, oid), tlv(0x04, value)].concat())
    }

    /// A CRL without the CRL Number is one sozu 2.3.3 refuses when it has no extension at all:
    /// a version 1 CRL, as `openssl ca -gencrl` writes without a `crlnumber` file (rustls-webpki:
    /// BadDer), or a version 2 one, as Python's `cryptography` builds by default
    /// (MalformedExtensions). The agent refuses both, saying why and how to issue one. The same
    /// CRL written with a CRL Number passes, and so does one with another extension but no CRL
    /// Number, which sozu takes too: the agent refuses what sozu refuses, no more.
    #[test]
    fn a_crl_without_a_crl_number_is_refused_as_sozu_refuses_it() {
        let devices = ca("devices");
        let parsed = parse_ca(
            devices.pem().as_bytes(),
            Path::new("/etc/devices/ca.crt"),
            now(),
        )
        .unwrap();
        let path = Path::new("/etc/devices/devices.crl");
        let parse = |pem: String| parse_crl(pem.as_bytes(), path, &parsed, now());
        // cRLNumber 2.5.29.20 = 5; authorityKeyIdentifier 2.5.29.35 (a keyIdentifier of 4 bytes).
        let crl_number = extension(&[0x55, 0x1d, 0x14], &tlv(0x02, &[0x05]));
        let key_identifier = extension(&[0x55, 0x1d, 0x23], &tlv(0x30, &tlv(0x80, &[1, 2, 3, 4])));

        let numbered = parse(crl_written_by_hand(&devices, 2, Some(crl_number))).unwrap();
        assert_eq!(numbered.revoked, 1);
        let without_number = parse(crl_written_by_hand(&devices, 2, Some(key_identifier))).unwrap();
        assert_eq!(without_number.revoked, 1);

        for (version, webpki_says) in [(1, "BadDer"), (2, "MalformedExtensions")] {
            let refused = parse(crl_written_by_hand(&devices, version, None)).unwrap_err();
            assert_eq!(
                refused,
                ClientCaError::NoCrlNumber {
                    path: path.to_owned(),
                    reason: webpki_says.to_owned(),
                },
                "version {version}"
            );
            let message = refused.to_string();
            assert!(
                message.starts_with("/etc/devices/devices.crl: the CRL has no CRL Number")
                    && message.contains("sozu refuses it")
                    && message.contains("`crlnumber` file"),
                "{message}"
            );
        }
    }

    /// Two CRLs of one CA for overlapping certificates make a set sozu refuses (it would consult
    /// the first alone), whichever scopes them (none, or one distribution point and none, or the
    /// same one twice); the refusal names both files, and told of either it names the other.
    /// CRLs of one CA with distinct distribution points pass, and so do CRLs of two CAs.
    #[test]
    fn two_crls_of_one_ca_for_overlapping_certificates_are_refused_as_a_set() {
        let devices = ca("devices");
        let phones = ca("phones");
        let ca_path = Path::new("/etc/devices/ca.crt");
        let both = format!("{}{}", devices.pem(), phones.pem());
        let parsed = parse_ca(both.as_bytes(), ca_path, now()).unwrap();
        let (one, two) = (
            Path::new("/etc/devices/one.crl"),
            Path::new("/etc/devices/two.crl"),
        );
        let read = |pem: String, path| parse_crl(pem.as_bytes(), path, &parsed, now()).unwrap();
        let set =
            |first: &Crl, second: &Crl| check_set(ca_path, &parsed, &[(one, first), (two, second)]);

        let whole = read(crl_scoped(&devices, None, &[]), one);
        let laptops = read(
            crl_scoped(&devices, Some("http://crl.example/laptops.crl"), &[]),
            one,
        );
        let tablets = read(
            crl_scoped(&devices, Some("http://crl.example/tablets.crl"), &[]),
            two,
        );
        let laptops_again = read(
            crl_scoped(&devices, Some("http://crl.example/laptops.crl"), &[]),
            two,
        );
        let whole_again = read(crl_scoped(&devices, None, &[]), two);
        for (first, second) in [
            (&whole, &whole_again),
            (&laptops, &whole_again),
            (&whole, &tablets),
            (&laptops, &laptops_again),
        ] {
            let refused = set(first, second).unwrap_err();
            assert_eq!(
                refused,
                ClientCaError::OverlappingCrls {
                    path: two.to_owned(),
                    other: one.to_owned()
                }
            );
            assert_eq!(
                refused.clone().about(one),
                ClientCaError::OverlappingCrls {
                    path: one.to_owned(),
                    other: two.to_owned()
                }
            );
            let message = refused.to_string();
            assert!(
                message.starts_with(
                    "/etc/devices/two.crl: this CRL and the one of /etc/devices/one.crl"
                ) && message.contains("one CRL per CA, or one per distribution point"),
                "{message}"
            );
        }
        assert_eq!(set(&laptops, &tablets), Ok(()));
        assert_eq!(
            set(&whole, &read(crl_scoped(&phones, None, &[]), two)),
            Ok(())
        );
        assert_eq!(check_set(ca_path, &parsed, &[(one, &whole)]), Ok(()));
        assert_eq!(check_set(ca_path, &parsed, &[]), Ok(()));
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
