//! DNS-01: where a challenge's TXT record goes, and waiting until the servers that matter answer
//! it. Publishing and removing it is [`super::provider`]'s.
//!
//! - **Where.** `_acme-challenge.<name>`, or where its CNAME chain ends: a delegation to a zone
//!   the agent may update (lego's behaviour, and the least-privilege setup: the update key only
//!   reaches a dedicated zone).
//! - **Waiting.** The CA is told to look only once every server asked answers the exact value:
//!   the zone's authoritative servers, found through the system resolver (NS of the zone, then
//!   their addresses) and then asked directly, never the pod's resolver for the record itself.
//!   In a split-horizon setup that resolver serves the private view, which the CA never sees.
//!   `propagation.nameservers` replaces the discovery with a fixed list.
//! - **Removal.** Exactly the value added, also when the order failed (the order
//!   removes every record it published, in every path; a value left by a concurrent order is
//!   left alone).

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use hickory_net::client::{Client, ClientHandle};
use hickory_net::runtime::TokioRuntimeProvider;
use hickory_net::udp::UdpClientStream;
use hickory_net::{DnsError, NetError};
use hickory_proto::op::Message;
use hickory_proto::rr::{DNSClass, Name, RData, RecordType};

use super::secret::SecretError;

/// One DNS query's deadline.
const QUERY_TIMEOUT: Duration = Duration::from_secs(5);
/// Between two rounds of propagation checks.
const POLL_INTERVAL: Duration = Duration::from_secs(2);
/// CNAMEs followed from `_acme-challenge.<name>` at most (lego follows 50; a real delegation is one).
const MAX_CNAME_HOPS: usize = 8;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Dns01Error {
    #[error(transparent)]
    Secret(#[from] SecretError),
    #[error("updating {name} through {server}: {reason}")]
    Update {
        server: String,
        name: String,
        reason: String,
    },
    #[error("{name} is outside the zone {zone} that dns01 updates (check the `_acme-challenge` CNAME or acme.dns01.zone)")]
    OutsideZone { name: String, zone: String },
    #[error("Cloudflare API, {what}: {reason}")]
    Cloudflare { what: String, reason: String },
    #[error("looking up {name}: {reason}")]
    Lookup { name: String, reason: String },
    #[error(
        "the TXT record {name} was not answered by {missing} after {waited_s} s (asked: {servers})"
    )]
    NotPropagated {
        name: String,
        servers: String,
        missing: String,
        waited_s: u64,
    },
}

impl Dns01Error {
    /// A short, stable name of the failure, for status and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Dns01Error::Secret(_) => "secret",
            Dns01Error::Update { .. } | Dns01Error::OutsideZone { .. } => "dns_update",
            Dns01Error::Cloudflare { .. } => "dns_update",
            Dns01Error::Lookup { .. } => "dns_lookup",
            Dns01Error::NotPropagated { .. } => "propagation",
        }
    }
}

/// `_acme-challenge.<identifier>.`, for a DNS identifier without a wildcard label.
pub fn challenge_name(identifier: &str) -> Result<Name, Dns01Error> {
    let text = format!("_acme-challenge.{}.", identifier.trim_end_matches('.'));
    Name::from_ascii(&text).map_err(|e| Dns01Error::Lookup {
        name: text,
        reason: e.to_string(),
    })
}

/// The servers asked about names: the fixed list, or the system resolver's.
#[derive(Debug, Clone)]
pub struct Lookup {
    /// `propagation.nameservers`: asked both to follow CNAMEs and for the record itself.
    pub fixed: Option<Vec<SocketAddr>>,
    /// The system resolver's servers (`/etc/resolv.conf`), for discovery.
    pub system: Vec<SocketAddr>,
    pub timeout: Duration,
}

impl Lookup {
    pub fn new(fixed: Option<Vec<SocketAddr>>, timeout: Duration) -> Lookup {
        let system = match hickory_resolver::system_conf::read_system_conf() {
            Ok((config, _)) => config
                .name_servers()
                .iter()
                .map(|ns| SocketAddr::new(ns.ip, 53))
                .collect(),
            Err(e) => {
                if fixed.is_none() {
                    tracing::warn!(error = %e, "cannot read the system resolver's configuration; DNS-01 propagation checks will fail");
                }
                Vec::new()
            }
        };
        Lookup {
            fixed,
            system,
            timeout,
        }
    }

    fn resolvers(&self) -> &[SocketAddr] {
        self.fixed.as_deref().unwrap_or(&self.system)
    }

    /// Follows the CNAME chain from `name`: where a TXT record for `name` must be written.
    pub async fn follow_cnames(&self, name: &Name) -> Result<Name, Dns01Error> {
        let mut current = name.clone();
        let mut seen = BTreeSet::from([current.to_lowercase()]);
        for _ in 0..MAX_CNAME_HOPS {
            let answer = ask_any(self.resolvers(), &current, RecordType::CNAME).await?;
            let next = answer.answers.iter().find_map(|r| match &r.data {
                RData::CNAME(target) if r.name.to_lowercase() == current.to_lowercase() => {
                    Some(target.0.clone())
                }
                _ => None,
            });
            match next {
                None => return Ok(current),
                Some(target) => {
                    if !seen.insert(target.to_lowercase()) {
                        return Err(Dns01Error::Lookup {
                            name: name.to_ascii(),
                            reason: format!("the CNAME chain loops at {target}"),
                        });
                    }
                    tracing::debug!(from = %current, to = %target, "following the _acme-challenge CNAME");
                    current = target;
                }
            }
        }
        Err(Dns01Error::Lookup {
            name: name.to_ascii(),
            reason: format!("more than {MAX_CNAME_HOPS} CNAMEs"),
        })
    }

    /// The servers that must answer a TXT record at `name` before the CA looks.
    pub async fn authoritative(&self, name: &Name) -> Result<Vec<SocketAddr>, Dns01Error> {
        if let Some(fixed) = &self.fixed {
            return Ok(fixed.clone());
        }
        let resolvers = &self.system;
        // The zone: the closest enclosing name with NS records.
        let mut zone = name.clone();
        let ns_names = loop {
            let answer = ask_any(resolvers, &zone, RecordType::NS).await?;
            let names: Vec<Name> = answer
                .answers
                .iter()
                .filter(|r| r.name.to_lowercase() == zone.to_lowercase())
                .filter_map(|r| match &r.data {
                    RData::NS(ns) => Some(ns.0.clone()),
                    _ => None,
                })
                .collect();
            if !names.is_empty() {
                break names;
            }
            if zone.is_root() {
                return Err(Dns01Error::Lookup {
                    name: name.to_ascii(),
                    reason: "no enclosing zone has NS records".into(),
                });
            }
            zone = zone.base_name();
        };
        let mut servers = Vec::new();
        for ns in &ns_names {
            for rtype in [RecordType::A, RecordType::AAAA] {
                let answer = ask_any(resolvers, ns, rtype).await?;
                servers.extend(answer.answers.iter().filter_map(|r| match &r.data {
                    RData::A(a) => Some(SocketAddr::new(a.0.into(), 53)),
                    RData::AAAA(a) => Some(SocketAddr::new(a.0.into(), 53)),
                    _ => None,
                }));
            }
        }
        servers.sort();
        servers.dedup();
        if servers.is_empty() {
            return Err(Dns01Error::Lookup {
                name: zone.to_ascii(),
                reason: "its name servers have no addresses".into(),
            });
        }
        Ok(servers)
    }

    /// Waits until every one of `servers` answers `value` in the TXT records at `name`.
    pub async fn wait_propagated(
        &self,
        servers: &[SocketAddr],
        name: &Name,
        value: &str,
    ) -> Result<(), Dns01Error> {
        let started = tokio::time::Instant::now();
        let deadline = started + self.timeout;
        let mut missing: Vec<SocketAddr> = servers.to_vec();
        loop {
            let mut still = Vec::new();
            for &server in &missing {
                match ask(server, name, RecordType::TXT).await {
                    Ok(answer) if has_txt(&answer, name, value) => {}
                    Ok(_) | Err(_) => still.push(server),
                }
            }
            missing = still;
            if missing.is_empty() {
                tracing::debug!(%name, servers = servers.len(),
                    elapsed_ms = started.elapsed().as_millis() as u64, "TXT record visible");
                return Ok(());
            }
            if tokio::time::Instant::now() + POLL_INTERVAL > deadline {
                return Err(Dns01Error::NotPropagated {
                    name: name.to_ascii(),
                    servers: join(servers),
                    missing: join(&missing),
                    waited_s: started.elapsed().as_secs(),
                });
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }
}

fn join(servers: &[SocketAddr]) -> String {
    servers
        .iter()
        .map(SocketAddr::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Whether `answer` holds a TXT record at `name` whose text is `value`.
pub fn has_txt(answer: &Message, name: &Name, value: &str) -> bool {
    answer.answers.iter().any(|r| {
        r.name.to_lowercase() == name.to_lowercase()
            && matches!(&r.data, RData::TXT(txt) if txt_text(txt) == value)
    })
}

fn txt_text(txt: &hickory_proto::rr::rdata::TXT) -> String {
    txt.txt_data
        .iter()
        .map(|part| String::from_utf8_lossy(part).into_owned())
        .collect()
}

/// Asks the first of `servers` that answers.
async fn ask_any(
    servers: &[SocketAddr],
    name: &Name,
    rtype: RecordType,
) -> Result<Message, Dns01Error> {
    let mut last = None;
    for &server in servers {
        match ask(server, name, rtype).await {
            Ok(answer) => return Ok(answer),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| Dns01Error::Lookup {
        name: name.to_ascii(),
        reason: "no name server to ask (none in /etc/resolv.conf, and no propagation.nameservers)"
            .into(),
    }))
}

/// One query to one server. A negative answer (no such name, no such record) is an empty answer.
pub async fn ask(
    server: SocketAddr,
    name: &Name,
    rtype: RecordType,
) -> Result<Message, Dns01Error> {
    let stream = UdpClientStream::builder(server, TokioRuntimeProvider::default())
        .with_timeout(Some(QUERY_TIMEOUT))
        .build();
    let (mut client, background) = Client::<TokioRuntimeProvider>::from_sender(stream);
    let background = tokio::spawn(background);
    let result = client.query(name.clone(), DNSClass::IN, rtype).await;
    background.abort();
    match result {
        Ok(response) => Ok(response.into_message()),
        Err(NetError::Dns(DnsError::NoRecordsFound(_))) => Ok(Message::query()),
        Err(e) => Err(Dns01Error::Lookup {
            name: format!("{name} {rtype} at {server}"),
            reason: e.to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_challenge_name_is_under_the_identifier() {
        assert_eq!(
            challenge_name("a.in.example.org").unwrap().to_ascii(),
            "_acme-challenge.a.in.example.org."
        );
        assert_eq!(
            challenge_name("a.in.example.org.").unwrap().to_ascii(),
            "_acme-challenge.a.in.example.org."
        );
    }

    #[test]
    fn a_txt_answer_matches_only_its_exact_value_and_name() {
        use hickory_proto::rr::rdata::TXT;
        use hickory_proto::rr::Record;
        let name = challenge_name("a.in.example.org").unwrap();
        let mut answer = Message::query();
        answer.answers.push(Record::from_rdata(
            name.clone(),
            60,
            RData::TXT(TXT::new(vec!["abc".into(), "def".into()])),
        ));
        assert!(has_txt(&answer, &name, "abcdef"));
        assert!(!has_txt(&answer, &name, "abc"));
        let other = challenge_name("b.in.example.org").unwrap();
        assert!(!has_txt(&answer, &other, "abcdef"));
    }
}
