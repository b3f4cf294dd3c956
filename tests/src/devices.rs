//! A device CA, as an operator runs one for client certificates: it enrolls devices (a
//! certificate for client authentication each, with a serial of its own) and revokes them in a
//! CRL it signs.

use rcgen::{
    BasicConstraints, CertificateParams, CertificateRevocationListParams, CertifiedIssuer, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyIdMethod, KeyPair, KeyUsagePurpose, RevokedCertParams,
    SerialNumber,
};
use time::{Duration, OffsetDateTime};

use crate::live::ClientIdentity;

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
}
