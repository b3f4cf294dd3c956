//! Reading a host's certificate pair from `<tls_dir>/<host>/{tls.crt,tls.key}` and turning it into
//! what sozu is sent. Parsing is pure (bytes in); [`read_pair`] is the one function that reads
//! files.
//!
//! `tls.crt` holds the chain, leaf first; `tls.key` the private key (PKCS#1, PKCS#8 or SEC1).
//! Key bytes never appear in an error: errors name the file and what is wrong with it.

pub mod client_ca;
pub mod names;
mod parse;
mod read;

pub use parse::{fingerprint, names_of_pem, parse, parse_named};
pub use read::{read_files, read_pair, RawPair, MAX_FILE_BYTES};

use std::collections::BTreeSet;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

/// A private key in PEM. Kept out of `Debug`, `Display` and serialisation so that it cannot
/// reach a log line, an error or a status document by accident, and wiped from memory when its
/// last copy goes. It stays resident while its certificate is served: a restarted sozu gets it
/// back within a second, without reading files that may have changed since.
#[derive(Clone, PartialEq, Eq)]
pub struct KeyPem(Arc<zeroize::Zeroizing<String>>);

impl KeyPem {
    pub fn new(pem: String) -> KeyPem {
        KeyPem(Arc::new(zeroize::Zeroizing::new(pem)))
    }

    /// The PEM text, for the one place that must send it: the request to sozu.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for KeyPem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KeyPem([redacted])")
    }
}

/// A certificate chain ready to send: leaf first. Cheap to clone (its fingerprint, PEM text and
/// names are shared): the last good pair of every host is copied into each pass's desired state
/// and plan, and its fingerprint into the index of what sozu holds, the status and the tracker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Certificate {
    /// SHA-256 of the leaf's DER, lowercase hex: how sozu names certificates.
    pub fingerprint: Arc<str>,
    /// PEM blocks, leaf first.
    pub chain: Arc<[String]>,
    pub key: KeyPem,
    /// The validity window, seconds since the epoch.
    pub not_before: i64,
    pub not_after: i64,
    /// The names sozu serves it for. A pair read from `<tls dir>/<host>/` serves `host` alone:
    /// sozu's `names` override the SANs, so a pair that also names another route host cannot
    /// take that host's clients (sozu serves the longest-lived certificate of a name).
    pub names: Names,
    /// What else its DNS SANs name, which sozu is not told (shown in the status).
    pub other_names: Arc<[String]>,
    /// The leaf's issuer, as a distinguished name (shown in the status and by `top`).
    pub issuer: Arc<str>,
    /// The certificate file of the `certificates` pair it was read from (shown in the status);
    /// `None` for a pair of the tls dir.
    pub listed: Option<Arc<std::path::Path>>,
}

/// The names a certificate is served for, sorted, each once. A shared list rather than a set:
/// a certificate names one host or two, and a set's first node has room for eleven (about 300
/// bytes a certificate, 3 MiB at 10,000 hosts).
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Names(Arc<[String]>);

impl Names {
    pub fn contains(&self, name: &str) -> bool {
        self.0.binary_search_by(|n| n.as_str().cmp(name)).is_ok()
    }
}

impl std::ops::Deref for Names {
    type Target = [String];

    fn deref(&self) -> &[String] {
        &self.0
    }
}

impl<'a> IntoIterator for &'a Names {
    type Item = &'a String;
    type IntoIter = std::slice::Iter<'a, String>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl From<BTreeSet<String>> for Names {
    fn from(names: BTreeSet<String>) -> Names {
        Names(names.into_iter().collect())
    }
}

impl From<&BTreeSet<String>> for Names {
    fn from(names: &BTreeSet<String>) -> Names {
        Names(names.iter().cloned().collect())
    }
}

impl FromIterator<String> for Names {
    fn from_iter<I: IntoIterator<Item = String>>(names: I) -> Names {
        names.into_iter().collect::<BTreeSet<String>>().into()
    }
}

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

#[cfg(test)]
mod tests {
    use super::parse::pem;
    use super::*;
    use crate::certs::Certificate;
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::CertificateDer;
    use std::collections::BTreeSet;
    use std::path::Path;
    use x509_parser::prelude::{FromDer, X509Certificate};

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
        assert_eq!(cert.names, BTreeSet::from([HOST.to_owned()]).into());
        let der = CertificateDer::from_pem_slice(m.crt.as_bytes()).unwrap();
        assert_eq!(*cert.fingerprint, fingerprint(der.as_ref()));
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
            // A key written in place and read half-way is no key, not an unsupported one.
            ("truncated key", (m.crt.clone(), m.key[..m.key.len() / 2].to_owned()), "no_key"),
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
        assert_eq!(reason(&altered(&m.crt), &m.key), "bad_signature");
    }

    /// The serial number's last byte flipped in a certificate's DER: it still parses, and its
    /// signature no longer verifies.
    fn altered(pem_text: &str) -> String {
        let der = CertificateDer::from_pem_slice(pem_text.as_bytes()).unwrap();
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
        pem("CERTIFICATE", &altered)
    }

    /// Intermediates are verified once per issuer key and remembered: a second pair of the
    /// same CA passes, and an altered copy of the intermediate (or a leaf altered under a
    /// remembered one) is refused all the same.
    #[test]
    fn a_remembered_intermediate_never_lets_an_altered_one_through() {
        let root_key = KeyPair::generate().unwrap();
        let mut root = CertificateParams::new(Vec::<String>::new()).unwrap();
        root.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        root.distinguished_name
            .push(rcgen::DnType::CommonName, "remembered root");
        let root_pem = root.self_signed(&root_key).unwrap().pem();
        let int_key = KeyPair::generate().unwrap();
        let mut int = CertificateParams::new(Vec::<String>::new()).unwrap();
        int.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        int.distinguished_name
            .push(rcgen::DnType::CommonName, "remembered intermediate");
        let int_pem = int
            .signed_by(&int_key, &Issuer::from_params(&root, &root_key))
            .unwrap()
            .pem();
        let issuer = Issuer::from_params(&int, &int_key);
        let leaf = || {
            let key = KeyPair::generate().unwrap();
            let mut params = CertificateParams::new(vec![HOST.to_owned()]).unwrap();
            params.not_before = rcgen::date_time_ymd(2026, 1, 1);
            params.not_after = rcgen::date_time_ymd(2027, 1, 1);
            let crt = params.signed_by(&key, &issuer).unwrap().pem();
            (crt, key.serialize_pem())
        };
        for _ in 0..2 {
            let (crt, key) = leaf();
            assert_eq!(reason(&format!("{crt}{int_pem}{root_pem}"), &key), "ok");
        }
        let (crt, key) = leaf();
        let chain = format!("{crt}{}{root_pem}", altered(&int_pem));
        match check(&chain, &key) {
            Err(CertError::BadSignature { index: 1, .. }) => {}
            other => panic!("an altered intermediate passed: {other:?}"),
        }
        let chain = format!("{}{int_pem}{root_pem}", altered(&crt));
        match check(&chain, &key) {
            Err(CertError::BadSignature { index: 0, .. }) => {}
            other => panic!("an altered leaf passed: {other:?}"),
        }
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
        assert_eq!(*cert.fingerprint, fingerprint(der.as_ref()));
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
