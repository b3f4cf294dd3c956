//! The system's resolver configuration (`/etc/resolv.conf`: name servers, search domains,
//! `ndots`; and `/etc/hosts`), through hickory's asynchronous stub resolver. Unlike
//! `getaddrinfo`, it says how long an answer may be kept, and a lookup that never answers costs
//! a future, not a thread.
//!
//! A name in `/etc/hosts` is answered from it alone, as the C library does (`hosts: files dns`):
//! hickory would otherwise ask the name servers for the address family the file lacks, and a
//! stalled name server would stall a name the file answers.
//!
//! Both files are read again when they change (a kubelet rewrites a pod's resolv.conf, an
//! operator edits hosts), at the next lookup.

use std::net::IpAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use hickory_resolver::config::{LookupIpStrategy, ResolveHosts};
use hickory_resolver::lookup_ip::LookupIp;
use hickory_resolver::proto::op::Query;
use hickory_resolver::proto::rr::{Name, RecordType};
use hickory_resolver::{Hosts, TokioResolver};

use super::dns::{Answer, Resolve, ResolveError};

const RESOLV_CONF: &str = "/etc/resolv.conf";
const HOSTS: &str = "/etc/hosts";

/// [`Resolve`] as the system is configured.
#[derive(Default)]
pub struct SystemResolver {
    loaded: Mutex<Option<Loaded>>,
}

struct Loaded {
    resolver: Arc<TokioResolver>,
    hosts: Arc<Hosts>,
    files: [Option<FileStamp>; 2],
}

/// What tells a changed file from an unchanged one without reading it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FileStamp {
    modified: Option<SystemTime>,
    len: u64,
    inode: u64,
}

fn stamp(path: &str) -> Option<FileStamp> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(Path::new(path)).ok().map(|m| FileStamp {
        modified: m.modified().ok(),
        len: m.len(),
        inode: m.ino(),
    })
}

impl SystemResolver {
    /// The resolver and the hosts file as they are now, read again when either file changed.
    fn current(&self) -> Result<(Arc<TokioResolver>, Arc<Hosts>), ResolveError> {
        let files = [stamp(RESOLV_CONF), stamp(HOSTS)];
        let mut loaded = self.loaded.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(l) = loaded.as_ref().filter(|l| l.files == files) {
            return Ok((l.resolver.clone(), l.hosts.clone()));
        }
        let mut builder = TokioResolver::builder_tokio().map_err(|e| {
            ResolveError::Failed(format!("cannot read the resolver configuration: {e}"))
        })?;
        let options = builder.options_mut();
        // Every A and AAAA address, as getaddrinfo gives them.
        options.ip_strategy = LookupIpStrategy::Ipv4AndIpv6;
        // The hosts file is read here instead (see the module).
        options.use_hosts_file = ResolveHosts::Never;
        // The DNS source keeps answers itself and asks again when they expire; a cache here
        // would only hand back a stale or a negative answer.
        options.cache_size = 0;
        let resolver = Arc::new(
            builder
                .build()
                .map_err(|e| ResolveError::Failed(format!("cannot build the resolver: {e}")))?,
        );
        let hosts = Arc::new(Hosts::from_system().unwrap_or_default());
        if loaded.is_some() {
            tracing::info!("resolver configuration changed; read again");
        }
        *loaded = Some(Loaded {
            resolver: resolver.clone(),
            hosts: hosts.clone(),
            files,
        });
        Ok((resolver, hosts))
    }
}

/// Every address the hosts file gives `name`, if it names it.
fn from_hosts(hosts: &Hosts, name: &str) -> Option<Vec<IpAddr>> {
    let name: Name = name.parse().ok()?;
    let found: Vec<IpAddr> = [RecordType::A, RecordType::AAAA]
        .into_iter()
        .filter_map(|kind| hosts.lookup_static_host(&Query::query(name.clone(), kind)))
        .flat_map(|lookup| LookupIp::from(lookup).iter().collect::<Vec<_>>())
        .collect();
    (!found.is_empty()).then_some(found)
}

impl Resolve for SystemResolver {
    async fn resolve(&self, name: &str) -> Result<Answer, ResolveError> {
        let (resolver, hosts) = self.current()?;
        if let Some(addresses) = from_hosts(&hosts, name) {
            return Ok(Answer {
                addresses,
                ttl: None,
            });
        }
        match resolver.lookup_ip(name).await {
            Ok(lookup) => {
                let ttl = lookup
                    .valid_until()
                    .saturating_duration_since(std::time::Instant::now());
                let addresses: Vec<IpAddr> = lookup.iter().collect();
                Ok(Answer {
                    addresses,
                    ttl: Some(ttl.max(Duration::ZERO)),
                })
            }
            Err(e) if e.is_no_records_found() => Err(if e.is_nx_domain() {
                ResolveError::NotFound
            } else {
                ResolveError::NoAddresses
            }),
            Err(e) => Err(ResolveError::Failed(e.to_string())),
        }
    }
}
