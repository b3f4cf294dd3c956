//! DNS-01 through RFC 2136 dynamic updates signed with TSIG (RFC 8945), with hickory's client:
//! BIND, Knot, PowerDNS and most self-hosted DNS servers accept them. The key's secret is read
//! from its file for every update, and only its name appears in errors.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use hickory_net::client::{Client, ClientHandle};
use hickory_net::runtime::TokioRuntimeProvider;
use hickory_net::udp::UdpClientStream;
use hickory_net::{DnsError, NetError};
use hickory_proto::op::ResponseCode;
use hickory_proto::rr::rdata::tsig::TsigAlgorithm as HickoryTsig;
use hickory_proto::rr::rdata::TXT;
use hickory_proto::rr::{Name, RData, Record, TSigner};

use super::dns01::Dns01Error;
use crate::workspace::TsigAlgorithm;

/// TTL of a challenge record: short, so a retried order's new value is not hidden by a cache.
const CHALLENGE_TTL: u32 = 60;
/// An update's deadline.
const UPDATE_TIMEOUT: Duration = Duration::from_secs(10);
/// TSIG's allowed clock difference, seconds (RFC 8945 recommends 300).
const FUDGE: u16 = 300;

pub struct Rfc2136 {
    pub server: SocketAddr,
    pub zone: Name,
    pub key_name: Name,
    pub algorithm: TsigAlgorithm,
    pub secret_file: PathBuf,
}

impl Rfc2136 {
    pub fn new(
        server: SocketAddr,
        zone: &str,
        key_name: &str,
        algorithm: TsigAlgorithm,
        secret_file: PathBuf,
    ) -> Result<Rfc2136, Dns01Error> {
        let name = |text: &str| {
            Name::from_ascii(format!("{}.", text.trim_end_matches('.'))).map_err(|e| {
                Dns01Error::Update {
                    server: server.to_string(),
                    name: text.to_owned(),
                    reason: e.to_string(),
                }
            })
        };
        Ok(Rfc2136 {
            server,
            zone: name(zone)?,
            key_name: name(key_name)?,
            algorithm,
            secret_file,
        })
    }

    pub async fn present(&self, name: &Name, value: &str) -> Result<(), Dns01Error> {
        self.update(name, value, true).await
    }

    pub async fn cleanup(&self, name: &Name, value: &str) -> Result<(), Dns01Error> {
        self.update(name, value, false).await
    }

    async fn update(&self, name: &Name, value: &str, add: bool) -> Result<(), Dns01Error> {
        if !self.zone.zone_of(name) {
            return Err(Dns01Error::OutsideZone {
                name: name.to_ascii(),
                zone: self.zone.to_ascii(),
            });
        }
        let fail = |reason: String| Dns01Error::Update {
            server: self.server.to_string(),
            name: name.to_ascii(),
            reason,
        };
        let secret = super::secret::read_base64(&self.secret_file)?;
        let algorithm = match self.algorithm {
            TsigAlgorithm::HmacSha256 => HickoryTsig::HmacSha256,
            TsigAlgorithm::HmacSha384 => HickoryTsig::HmacSha384,
            TsigAlgorithm::HmacSha512 => HickoryTsig::HmacSha512,
        };
        // hickory keeps its own copy inside the signer; ours is wiped when it goes.
        let signer = TSigner::new(secret.to_vec(), algorithm, self.key_name.clone(), FUDGE)
            .map_err(|e| fail(format!("TSIG key {}: {e}", self.key_name)))?;
        let stream = UdpClientStream::builder(self.server, TokioRuntimeProvider::default())
            .with_timeout(Some(UPDATE_TIMEOUT))
            .with_signer(Some(signer))
            .build();
        let (mut client, background) = Client::<TokioRuntimeProvider>::from_sender(stream);
        let background = tokio::spawn(background);
        let record = Record::from_rdata(
            name.clone(),
            CHALLENGE_TTL,
            RData::TXT(TXT::new(vec![value.to_owned()])),
        );
        let result = if add {
            client.append(record, self.zone.clone(), false).await
        } else {
            client.delete_by_rdata(record, self.zone.clone()).await
        };
        background.abort();
        let code = match result {
            Ok(response) => response.response_code,
            Err(NetError::Dns(DnsError::ResponseCode(code))) => code,
            Err(e) => return Err(fail(explain_error(&e, &self.key_name))),
        };
        match code {
            ResponseCode::NoError => Ok(()),
            code => Err(fail(explain(code, &self.key_name))),
        }
    }
}

/// What an error answer means for someone setting up the server.
fn explain(code: ResponseCode, key: &Name) -> String {
    match code {
        ResponseCode::NotAuth => format!(
            "NOTAUTH: the server did not accept the TSIG key {key} (wrong secret or algorithm, unknown key, or clocks more than {FUDGE} s apart)"
        ),
        ResponseCode::Refused => format!(
            "REFUSED: the server's update-policy does not let the key {key} change TXT records at this name"
        ),
        ResponseCode::NotZone => "NOTZONE: the name is not in the zone sent".into(),
        other => format!("{other}"),
    }
}

/// hickory reports an unsigned BADSIG answer as a failed verification, not as NOTAUTH.
fn explain_error(error: &NetError, key: &Name) -> String {
    let text = error.to_string();
    if text.to_ascii_lowercase().contains("tsig") || text.contains("signature") {
        format!("{} ({text})", explain(ResponseCode::NotAuth, key))
    } else {
        text
    }
}
