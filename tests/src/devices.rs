//! A device CA, as an operator runs one for client certificates: it enrolls devices (a
//! certificate for client authentication each, with a serial of its own) and revokes them in a
//! CRL it signs.

use std::path::Path;
use std::process::Command;

use rcgen::{
    BasicConstraints, CertificateParams, CertificateRevocationListParams, CertifiedIssuer, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyIdMethod, KeyPair, KeyUsagePurpose, RevokedCertParams,
    SerialNumber,
};
use time::{Duration, OffsetDateTime};

use crate::live::ClientIdentity;
use crate::run;

pub struct DeviceCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
    next_serial: u64,
    crl_number: u64,
}

/// An enrolled device: what it presents, and its serial (what a CRL names).
#[derive(Debug, Clone)]
pub struct Device {
    pub identity: ClientIdentity,
    pub serial: u64,
}

impl DeviceCa {
    /// A new CA named `name`.
    pub fn new(name: &str) -> DeviceCa {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate().expect("a CA key");
        DeviceCa {
            issuer: CertifiedIssuer::self_signed(params, key).expect("a self-signed CA"),
            next_serial: 1000,
            crl_number: 1,
        }
    }

    /// The CA's certificate, PEM: what `listeners.client_auth.ca_file` holds.
    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// A certificate for the device `name`, for client authentication.
    pub fn enroll(&mut self, name: &str) -> Device {
        let serial = self.next_serial;
        self.next_serial += 1;
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("device parameters");
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.serial_number = Some(SerialNumber::from(serial));
        let key = KeyPair::generate().expect("a device key");
        let cert = params.signed_by(&key, &self.issuer).expect("sign a device");
        Device {
            identity: ClientIdentity {
                chain_pem: cert.pem(),
                key_pem: key.serialize_pem(),
            },
            serial,
        }
    }

    /// A CRL revoking `revoked`, issued now, its next update `next_update` from now (negative:
    /// already past).
    pub fn crl(&mut self, revoked: &[u64], next_update: Duration) -> String {
        let now = OffsetDateTime::now_utc();
        let number = self.crl_number;
        self.crl_number += 1;
        let params = CertificateRevocationListParams {
            this_update: now.min(now + next_update) - Duration::hours(1),
            next_update: now + next_update,
            crl_number: SerialNumber::from(number),
            issuing_distribution_point: None,
            revoked_certs: revoked
                .iter()
                .map(|&serial| RevokedCertParams {
                    serial_number: SerialNumber::from(serial),
                    revocation_time: now - Duration::minutes(1),
                    reason_code: None,
                    invalidity_date: None,
                })
                .collect(),
            key_identifier_method: KeyIdMethod::Sha256,
        };
        params
            .signed_by(&self.issuer)
            .expect("sign a CRL")
            .pem()
            .expect("a CRL in PEM")
    }

    /// A CRL revoking `revoked`, 7 days long, written by `openssl ca -gencrl` as an operator's
    /// CA writes one when its configuration names no `crlnumber` file: openssl then leaves out
    /// the CRL Number that RFC 5280 requires in every CRL, and with it every extension (a
    /// version 1 CRL). `dir` gets the CA's files (its key, 0600) and openssl's database.
    pub fn openssl_crl_without_crl_number(&self, revoked: &[&Device], dir: &Path) -> String {
        use std::os::unix::fs::PermissionsExt;
        std::fs::create_dir_all(dir).expect("the openssl CA's directory");
        let write = |name: &str, text: &str| {
            let path = dir.join(name);
            std::fs::write(&path, text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            path
        };
        write("ca.crt", &self.pem());
        let key = write("ca.key", &self.issuer.key().serialize_pem());
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600))
            .expect("the CA key's mode");
        write("index.txt", "");
        let config = write(
            "openssl.cnf",
            &format!(
                "[ca]\ndefault_ca = devices\n[devices]\ndir = {}\ndatabase = $dir/index.txt\n\
                 certificate = $dir/ca.crt\nprivate_key = $dir/ca.key\ndefault_md = sha256\n\
                 default_crl_days = 7\n",
                dir.display()
            ),
        );
        let openssl = |args: &[&str]| {
            let (code, out, err) = run(Command::new("openssl").args(args).current_dir(dir));
            assert_eq!(code, 0, "openssl {args:?}: {out}{err}");
        };
        let config = config.to_str().expect("a UTF-8 path");
        for device in revoked {
            let name = format!("{}.crt", device.serial);
            write(&name, &device.identity.chain_pem);
            openssl(&["ca", "-config", config, "-revoke", &name]);
        }
        openssl(&["ca", "-config", config, "-gencrl", "-out", "no-number.crl"]);
        let crl = std::fs::read_to_string(dir.join("no-number.crl")).expect("openssl's CRL");
        let (code, text, err) = run(Command::new("openssl")
            .args(["crl", "-noout", "-text", "-in"])
            .arg(dir.join("no-number.crl")));
        assert_eq!(code, 0, "openssl crl: {err}");
        assert!(
            !text.contains("CRL Number"),
            "openssl wrote a CRL Number: {text}"
        );
        for device in revoked {
            // openssl prints a serial in an even number of hex digits.
            let hex = format!("{:X}", device.serial);
            let hex = if hex.len() % 2 == 1 {
                format!("0{hex}")
            } else {
                hex
            };
            assert!(
                text.contains(&format!("Serial Number: {hex}\n")),
                "the CRL does not revoke {}: {text}",
                device.serial
            );
        }
        crl
    }
}
