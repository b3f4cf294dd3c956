//! Bad certificate pairs, one per way a renewal can go wrong (see [`Kind`]), written into a host
//! directory the way a Kubernetes volume changes: a new timestamped directory swapped in through
//! `..data`, the old one removed.
//!
//! Certificates are made with rcgen at test time. What rcgen and ring cannot make (encrypted,
//! P-521, DSA and 1024-bit RSA keys) comes from `tests/fixtures/corpus/`, throwaway keys made once
//! with the OpenSSL CLI by `tests/fixtures/corpus/make.sh`.

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};

use crate::live::{atomic_write, fingerprint_of_pem};

/// The host every corpus pair is (or pretends to be) for; the fixtures name it too.
pub const HOST: &str = "corpus.in.example.org";

macro_rules! fixture {
    ($name:literal) => {
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/fixtures/corpus/",
            $name
        ))
    };
}

/// One way a certificate pair on disk can be unusable. Each must be refused with its reason while
/// the last good pair keeps serving.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A good leaf with the key of another pair.
    MismatchedKey,
    /// notAfter in 2001.
    Expired,
    /// notBefore in 2090.
    NotYetValid,
    /// A SAN for another host only.
    WrongSan,
    /// `*.example.org`: a wildcard covers one label, the host is two below.
    WildcardTooDeep,
    /// A CA certificate (basicConstraints CA:TRUE) naming the host, used as the leaf.
    CaAsLeaf,
    /// leaf, root, intermediate: the root did not issue the leaf.
    ChainOutOfOrder,
    /// intermediate, leaf: the whole chain backwards, so a CA comes first.
    ChainReversed,
    /// The first half of the certificate PEM: a BEGIN line, no END.
    TruncatedPem,
    /// `tls.crt` of zero bytes.
    EmptyFile,
    /// `tls.crt` of pseudo-random bytes (not UTF-8).
    BinaryGarbage,
    /// `tls.crt` of 10 MiB (the leaf repeated), over the agent's 1 MiB cap.
    TenMib,
    /// The volume holds `tls.key` only: `tls.crt` dangles through `..data`.
    KeyOnly,
    /// The volume holds `tls.crt` only: `tls.key` dangles through `..data`.
    CertOnly,
    /// An encrypted PKCS#8 key (`ENCRYPTED PRIVATE KEY`) with its certificate.
    EncryptedKey,
    /// An encrypted traditional RSA key (`Proc-Type: 4,ENCRYPTED`) with its certificate.
    EncryptedRsaKey,
    /// A P-521 key with its certificate: ring (sozu's rustls) cannot sign with it.
    P521Key,
    /// A DSA key (PKCS#8) with its certificate.
    DsaKey,
    /// The same DSA key in its traditional `DSA PRIVATE KEY` form.
    DsaTraditionalKey,
    /// A 1024-bit RSA key with its certificate: ring refuses RSA signing keys under 2048 bits.
    Rsa1024Key,
    /// `tls.crt` in the timestamped directory is a symlink to itself.
    SymlinkLoop,
    /// `..data` → `..loop` → `..data`.
    DataLinkLoop,
    /// A directory where `tls.crt` should be.
    DirectoryAsCert,
    /// The certificate in `tls.key` and the key in `tls.crt`.
    Swapped,
    /// The certificate in both files: no key at all.
    CertInKeyFile,
    /// `tls.key` of zero bytes.
    EmptyKey,
    /// A CERTIFICATE block whose base64 decodes to something that is not DER.
    LeafNotDer,
    /// A good leaf followed by a CERTIFICATE block that is not DER (a corrupt intermediate).
    GarbageAfterLeaf,
    /// A named pipe where `tls.crt` should be, with no writer: opening it for reading would block.
    FifoAsCert,
    /// `tls.crt` a link to `/dev/zero`: reading it would never end.
    EndlessDevice,
    /// The host in the subject's common name only, no subject alternative name: clients ignore
    /// the common name.
    CommonNameOnly,
    /// A good leaf with one byte of its serial number changed on disk: it parses and matches its
    /// key, but its signature no longer verifies.
    AlteredLeaf,
}

impl Kind {
    /// Every kind, in an order where no two neighbours share a reason, so a test that writes them
    /// one after the other sees the reported reason change at every step (and the agent counts
    /// each refusal once).
    pub const ALL: [Kind; 32] = [
        Kind::CommonNameOnly,
        Kind::MismatchedKey,
        Kind::EndlessDevice,
        Kind::Expired,
        Kind::TruncatedPem,
        Kind::NotYetValid,
        Kind::WrongSan,
        Kind::CaAsLeaf,
        Kind::WildcardTooDeep,
        Kind::ChainOutOfOrder,
        Kind::EmptyFile,
        Kind::TenMib,
        Kind::BinaryGarbage,
        Kind::KeyOnly,
        Kind::EncryptedKey,
        Kind::CertOnly,
        Kind::P521Key,
        Kind::SymlinkLoop,
        Kind::Swapped,
        Kind::DsaKey,
        Kind::EmptyKey,
        Kind::ChainReversed,
        Kind::CertInKeyFile,
        Kind::LeafNotDer,
        Kind::DataLinkLoop,
        Kind::Rsa1024Key,
        Kind::GarbageAfterLeaf,
        Kind::EncryptedRsaKey,
        Kind::DirectoryAsCert,
        Kind::DsaTraditionalKey,
        Kind::FifoAsCert,
        Kind::AlteredLeaf,
    ];

    /// A short human name, for messages.
    pub fn name(self) -> &'static str {
        match self {
            Kind::MismatchedKey => "mismatched key",
            Kind::Expired => "expired",
            Kind::NotYetValid => "not yet valid",
            Kind::WrongSan => "wrong SAN",
            Kind::WildcardTooDeep => "wildcard that does not cover",
            Kind::CaAsLeaf => "CA certificate as leaf",
            Kind::ChainOutOfOrder => "chain in the wrong order",
            Kind::ChainReversed => "chain reversed",
            Kind::TruncatedPem => "truncated PEM",
            Kind::EmptyFile => "empty file",
            Kind::BinaryGarbage => "binary garbage",
            Kind::TenMib => "10 MiB file",
            Kind::KeyOnly => "key only",
            Kind::CertOnly => "cert only",
            Kind::EncryptedKey => "encrypted key (PKCS#8)",
            Kind::EncryptedRsaKey => "encrypted key (traditional RSA)",
            Kind::P521Key => "unsupported key type (P-521)",
            Kind::DsaKey => "unsupported key type (DSA, PKCS#8)",
            Kind::DsaTraditionalKey => "unsupported key type (DSA, traditional PEM)",
            Kind::Rsa1024Key => "unsupported key type (RSA 1024)",
            Kind::SymlinkLoop => "symlink loop",
            Kind::DataLinkLoop => "..data symlink loop",
            Kind::DirectoryAsCert => "directory in place of tls.crt",
            Kind::Swapped => "cert and key swapped",
            Kind::CertInKeyFile => "certificate in place of the key",
            Kind::EmptyKey => "empty key file",
            Kind::LeafNotDer => "leaf not DER",
            Kind::GarbageAfterLeaf => "chain with garbage after the leaf",
            Kind::FifoAsCert => "named pipe in place of tls.crt",
            Kind::EndlessDevice => "tls.crt a link to /dev/zero",
            Kind::CommonNameOnly => "host in the common name only",
            Kind::AlteredLeaf => "leaf altered on disk",
        }
    }

    /// The reason the agent should report (`CertError::reason` in agent/src/certs/mod.rs).
    pub fn reason(self) -> &'static str {
        match self {
            Kind::MismatchedKey => "key_mismatch",
            Kind::Expired => "expired",
            Kind::NotYetValid => "not_yet_valid",
            Kind::WrongSan | Kind::WildcardTooDeep => "wrong_name",
            Kind::CaAsLeaf | Kind::ChainReversed => "ca_as_leaf",
            Kind::ChainOutOfOrder => "chain_order",
            Kind::TruncatedPem | Kind::EmptyFile | Kind::BinaryGarbage | Kind::Swapped => {
                "no_certificate"
            }
            Kind::TenMib
            | Kind::KeyOnly
            | Kind::CertOnly
            | Kind::SymlinkLoop
            | Kind::DataLinkLoop
            | Kind::DirectoryAsCert
            | Kind::FifoAsCert
            | Kind::EndlessDevice => "unreadable",
            Kind::EncryptedKey | Kind::EncryptedRsaKey => "encrypted_key",
            Kind::P521Key | Kind::DsaKey | Kind::DsaTraditionalKey | Kind::Rsa1024Key => {
                "unsupported_key"
            }
            Kind::CertInKeyFile | Kind::EmptyKey => "no_key",
            Kind::LeafNotDer | Kind::GarbageAfterLeaf => "bad_leaf",
            Kind::CommonNameOnly => "no_san",
            Kind::AlteredLeaf => "bad_signature",
        }
    }
}

/// What was written: the served leaf's fingerprint for a good pair, and every private key PEM
/// that went to disk (a test checks none of them leaks).
#[derive(Debug, Clone, Default)]
pub struct Written {
    pub fingerprint: Option<String>,
    pub keys: Vec<String>,
}

/// A host directory laid out like a Kubernetes volume, and its next generation number (each
/// write creates a new timestamped directory).
pub struct Volume {
    pub dir: PathBuf,
    generation: u32,
}

impl Volume {
    pub fn new(dir: PathBuf) -> Volume {
        Volume { dir, generation: 0 }
    }

    fn next(&mut self) -> u32 {
        self.generation += 1;
        self.generation
    }

    /// A fresh, valid pair for [`HOST`], swapped in with [`atomic_write`].
    pub fn write_good(&mut self) -> Written {
        let pair = leaf(&[HOST]);
        let generation = self.next();
        atomic_write(&self.dir, &pair.crt, &pair.key, generation);
        Written {
            fingerprint: Some(fingerprint_of_pem(&pair.crt)),
            keys: vec![pair.key],
        }
    }

    /// The bad pair of `kind`, swapped in: file contents through [`atomic_write`], file-system
    /// kinds by hand through the same `..data` swap.
    pub fn write(&mut self, kind: Kind) -> Written {
        let generation = self.next();
        let dir = self.dir.clone();
        let text = |crt: &str, key: &str, keys: Vec<String>| {
            atomic_write(&dir, crt, key, generation);
            Written {
                fingerprint: None,
                keys,
            }
        };
        let good = leaf(&[HOST]);
        match kind {
            Kind::MismatchedKey => {
                let other = leaf(&[HOST]);
                text(&good.crt, &other.key, vec![other.key.clone(), good.key])
            }
            Kind::Expired => {
                let p = dated((2000, 1, 1), (2001, 1, 1));
                text(&p.crt, &p.key, vec![p.key.clone()])
            }
            Kind::NotYetValid => {
                let p = dated((2090, 1, 1), (2091, 1, 1));
                text(&p.crt, &p.key, vec![p.key.clone()])
            }
            Kind::WrongSan => {
                let p = leaf(&["other.in.example.org"]);
                text(&p.crt, &p.key, vec![p.key.clone()])
            }
            Kind::WildcardTooDeep => {
                let p = leaf(&["*.example.org"]);
                text(&p.crt, &p.key, vec![p.key.clone()])
            }
            Kind::CaAsLeaf => {
                let key = KeyPair::generate().expect("generate a key");
                let mut params = CertificateParams::new(vec![HOST.to_owned()]).expect("params");
                params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
                let crt = params.self_signed(&key).expect("self-sign").pem();
                let key = key.serialize_pem();
                text(&crt, &key, vec![key.clone()])
            }
            Kind::ChainOutOfOrder => {
                let c = chain();
                let crt = format!("{}{}{}", c.leaf, c.root, c.intermediate);
                text(&crt, &c.key, vec![c.key.clone()])
            }
            Kind::ChainReversed => {
                let c = chain();
                let crt = format!("{}{}", c.intermediate, c.leaf);
                text(&crt, &c.key, vec![c.key.clone()])
            }
            Kind::TruncatedPem => {
                let half = &good.crt[..good.crt.len() / 2];
                text(half, &good.key, vec![good.key.clone()])
            }
            Kind::EmptyFile => text("", &good.key, vec![good.key.clone()]),
            Kind::BinaryGarbage => {
                // atomic_write takes text, and real garbage is not UTF-8: the same swap by hand.
                swap_by_hand(&dir, generation, |new| {
                    write(&new.join("tls.crt"), noise(b"binary garbage", 4096));
                    write(&new.join("tls.key"), &good.key);
                });
                Written {
                    fingerprint: None,
                    keys: vec![good.key],
                }
            }
            Kind::TenMib => {
                let crt = good.crt.repeat((10 << 20) / good.crt.len() + 1);
                text(&crt, &good.key, vec![good.key.clone()])
            }
            Kind::KeyOnly => {
                swap_by_hand(&dir, generation, |new| {
                    write(&new.join("tls.key"), &good.key);
                });
                Written {
                    fingerprint: None,
                    keys: vec![good.key],
                }
            }
            Kind::CertOnly => {
                swap_by_hand(&dir, generation, |new| {
                    write(&new.join("tls.crt"), &good.crt);
                });
                Written::default()
            }
            Kind::EncryptedKey => fixture_pair(
                text,
                fixture!("encrypted-pkcs8.crt"),
                fixture!("encrypted-pkcs8.key"),
            ),
            Kind::EncryptedRsaKey => fixture_pair(
                text,
                fixture!("encrypted-rsa.crt"),
                fixture!("encrypted-rsa.key"),
            ),
            Kind::P521Key => fixture_pair(text, fixture!("p521.crt"), fixture!("p521.key")),
            Kind::DsaKey => fixture_pair(text, fixture!("dsa.crt"), fixture!("dsa.key")),
            Kind::DsaTraditionalKey => {
                fixture_pair(text, fixture!("dsa.crt"), fixture!("dsa-traditional.key"))
            }
            Kind::Rsa1024Key => {
                fixture_pair(text, fixture!("rsa1024.crt"), fixture!("rsa1024.key"))
            }
            Kind::SymlinkLoop => {
                swap_by_hand(&dir, generation, |new| {
                    symlink("tls.crt", &new.join("tls.crt"));
                    write(&new.join("tls.key"), &good.key);
                });
                Written {
                    fingerprint: None,
                    keys: vec![good.key],
                }
            }
            Kind::DataLinkLoop => {
                // `..loop` stands where a timestamped directory would; the next swap removes it
                // like one (remove_dir_all removes a symlink itself).
                let old = std::fs::read_link(dir.join("..data")).ok();
                symlink("..data", &dir.join("..loop"));
                symlink("..loop", &dir.join("..data_tmp"));
                std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).expect("swap ..data");
                remove_old(&dir, old);
                Written::default()
            }
            Kind::DirectoryAsCert => {
                swap_by_hand(&dir, generation, |new| {
                    std::fs::create_dir(new.join("tls.crt")).expect("create a directory");
                    write(&new.join("tls.key"), &good.key);
                });
                Written {
                    fingerprint: None,
                    keys: vec![good.key],
                }
            }
            Kind::Swapped => text(&good.key, &good.crt, vec![good.key.clone()]),
            Kind::CertInKeyFile => text(&good.crt, &good.crt, vec![]),
            Kind::EmptyKey => text(&good.crt, "", vec![]),
            Kind::LeafNotDer => text(&not_der(&good.crt), &good.key, vec![good.key.clone()]),
            Kind::GarbageAfterLeaf => {
                let c = chain();
                let crt = format!("{}{}", c.leaf, not_der(&c.intermediate));
                text(&crt, &c.key, vec![c.key.clone()])
            }
            Kind::FifoAsCert => {
                swap_by_hand(&dir, generation, |new| {
                    let fifo = new.join("tls.crt");
                    let status = std::process::Command::new("mkfifo")
                        .arg(&fifo)
                        .status()
                        .expect("run mkfifo");
                    assert!(status.success(), "mkfifo {}", fifo.display());
                    write(&new.join("tls.key"), &good.key);
                });
                Written {
                    fingerprint: None,
                    keys: vec![good.key],
                }
            }
            Kind::EndlessDevice => {
                swap_by_hand(&dir, generation, |new| {
                    symlink("/dev/zero", &new.join("tls.crt"));
                    write(&new.join("tls.key"), &good.key);
                });
                Written {
                    fingerprint: None,
                    keys: vec![good.key],
                }
            }
            Kind::CommonNameOnly => {
                let key = KeyPair::generate().expect("generate a key");
                let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
                params.distinguished_name.push(DnType::CommonName, HOST);
                let crt = params.self_signed(&key).expect("self-sign").pem();
                let key = key.serialize_pem();
                text(&crt, &key, vec![key.clone()])
            }
            Kind::AlteredLeaf => text(&altered(&good.crt), &good.key, vec![good.key.clone()]),
        }
    }
}

struct Pair {
    crt: String,
    key: String,
}

/// A self-signed CA:FALSE leaf (rcgen's defaults: P-256, valid 1975..4096).
fn leaf(names: &[&str]) -> Pair {
    let certified =
        rcgen::generate_simple_self_signed(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
            .expect("generate a certificate");
    Pair {
        crt: certified.cert.pem(),
        key: certified.signing_key.serialize_pem(),
    }
}

/// A leaf for [`HOST`] valid from `from` to `to` (year, month, day).
fn dated(from: (i32, u8, u8), to: (i32, u8, u8)) -> Pair {
    let key = KeyPair::generate().expect("generate a key");
    let mut params = CertificateParams::new(vec![HOST.to_owned()]).expect("params");
    params.not_before = rcgen::date_time_ymd(from.0, from.1, from.2);
    params.not_after = rcgen::date_time_ymd(to.0, to.1, to.2);
    Pair {
        crt: params.self_signed(&key).expect("self-sign").pem(),
        key: key.serialize_pem(),
    }
}

/// root → intermediate → leaf for [`HOST`], each PEM apart, and the leaf's key.
struct Chain {
    root: String,
    intermediate: String,
    leaf: String,
    key: String,
}

fn chain() -> Chain {
    let ca_params = |cn: &str| {
        let mut p = CertificateParams::new(Vec::<String>::new()).expect("params");
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name.push(DnType::CommonName, cn);
        p
    };
    let root_key = KeyPair::generate().expect("generate a key");
    let root_params = ca_params("corpus root");
    let root = root_params.self_signed(&root_key).expect("self-sign");
    let root_issuer = Issuer::new(root_params, root_key);
    let inter_key = KeyPair::generate().expect("generate a key");
    let inter_params = ca_params("corpus intermediate");
    let intermediate = inter_params
        .signed_by(&inter_key, &root_issuer)
        .expect("sign the intermediate");
    let inter_issuer = Issuer::new(inter_params, inter_key);
    let leaf_key = KeyPair::generate().expect("generate a key");
    let mut leaf_params = CertificateParams::new(vec![HOST.to_owned()]).expect("params");
    leaf_params
        .distinguished_name
        .push(DnType::CommonName, HOST);
    let leaf = leaf_params
        .signed_by(&leaf_key, &inter_issuer)
        .expect("sign the leaf");
    Chain {
        root: root.pem(),
        intermediate: intermediate.pem(),
        leaf: leaf.pem(),
        key: leaf_key.serialize_pem(),
    }
}

/// A fixture pair (certificate and key made together by make.sh) written with `text`.
fn fixture_pair(
    text: impl FnOnce(&str, &str, Vec<String>) -> Written,
    crt: &str,
    key: &str,
) -> Written {
    text(crt, key, vec![key.to_owned()])
}

/// `pem` with the last byte of its DER flipped: a byte of the signature, so the certificate still
/// parses and still matches its key, but its signature no longer verifies.
fn altered(pem: &str) -> String {
    use base64::Engine as _;
    use rustls::pki_types::pem::PemObject;
    let der = rustls::pki_types::CertificateDer::from_pem_slice(pem.as_bytes())
        .expect("a PEM certificate");
    let mut der = der.to_vec();
    if let Some(last) = der.last_mut() {
        *last ^= 0x01;
    }
    let body = base64::engine::general_purpose::STANDARD.encode(&der);
    let lines: Vec<&str> = body
        .as_bytes()
        .chunks(64)
        .map(|l| std::str::from_utf8(l).expect("base64 is ASCII"))
        .collect();
    format!(
        "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
        lines.join("\n")
    )
}

/// `pem` with its first four base64 characters (`MIIB`/`MIIC`: a DER SEQUENCE header) replaced
/// by `AAAA`: still valid base64, no longer DER.
fn not_der(pem: &str) -> String {
    let body = pem.find('\n').expect("a PEM header line") + 1;
    format!("{}AAAA{}", &pem[..body], &pem[body + 4..])
}

/// `len` deterministic pseudo-random bytes (a SHA-256 chain seeded with `seed`).
fn noise(seed: &[u8], len: usize) -> Vec<u8> {
    use sha2::Digest;
    let mut out = Vec::with_capacity(len + 32);
    let mut block = sha2::Sha256::digest(seed);
    while out.len() < len {
        out.extend_from_slice(&block);
        block = sha2::Sha256::digest(block);
    }
    out.truncate(len);
    out
}

fn write(path: &Path, contents: impl AsRef<[u8]>) {
    std::fs::write(path, contents).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

fn symlink(target: &str, link: &Path) {
    std::os::unix::fs::symlink(target, link)
        .unwrap_or_else(|e| panic!("symlink {} -> {target}: {e}", link.display()));
}

/// [`atomic_write`]'s swap with the new timestamped directory filled by `fill`: for contents
/// that are not text or not plain files.
fn swap_by_hand(dir: &Path, generation: u32, fill: impl FnOnce(&Path)) {
    let stamp = format!("..2026_11_30_00_01_{generation:02}.{generation}");
    let new = dir.join(&stamp);
    std::fs::create_dir(&new).expect("create the timestamped directory");
    fill(&new);
    let old = std::fs::read_link(dir.join("..data")).ok();
    symlink(&stamp, &dir.join("..data_tmp"));
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).expect("swap ..data");
    for name in ["tls.crt", "tls.key"] {
        if std::fs::symlink_metadata(dir.join(name)).is_err() {
            symlink(&format!("..data/{name}"), &dir.join(name));
        }
    }
    remove_old(dir, old);
}

/// Removes what `..data` named before a swap, as the AtomicWriter does at once.
fn remove_old(dir: &Path, old: Option<PathBuf>) {
    if let Some(old) = old {
        std::fs::remove_dir_all(dir.join(&old))
            .unwrap_or_else(|e| panic!("remove {}: {e}", old.display()));
    }
}
