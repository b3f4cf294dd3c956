//! The DNS source: resolves every upstream name of the workspace, concurrently, each lookup with
//! a deadline, each name on its own schedule, and publishes a name's addresses when they change.
//!
//! - Re-resolution follows the answer's TTL, within bounds ([`DnsSettings::min_interval`] to
//!   [`DnsSettings::interval`]); without a TTL, the interval.
//! - A failed or timed-out lookup keeps the last good answer, is retried sooner (doubling from
//!   [`DnsSettings::retry_min`] up to the interval), and is reported per name.
//! - A lookup that never answers holds up nothing but the next lookup of its own name.
//! - An answer is not trusted whole: loopback, link-local (the cloud metadata address among
//!   them), unspecified and multicast addresses are dropped unless the workspace allows them
//!   (`allow_special_upstream_addresses`), and at most [`MAX_ADDRESSES_PER_NAME`] are kept; what
//!   was dropped is logged once, counted, and shown with the name. An answer left with nothing is
//!   a failed lookup.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc::UnboundedSender;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::{Fact, NameFact, WorkspaceWatch};
use crate::clock::Clock;
use crate::document::DnsNameStatus;

/// A resolver's answer: every address, and how long it may be kept, when the resolver says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub addresses: Vec<IpAddr>,
    pub ttl: Option<Duration>,
}

/// The addresses kept of one answer: a Service has a handful, a headless one its pods' (a large
/// StatefulSet stays under this); more is a resolver gone wrong, and each is a backend in sozu.
pub const MAX_ADDRESSES_PER_NAME: usize = 64;

/// Why an address of an answer is not used as a backend, unless the workspace allows it; `None`
/// for an address that may be.
pub fn special(address: &IpAddr) -> Option<&'static str> {
    let mapped = match address {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4),
        IpAddr::V4(_) => None,
    };
    match mapped.as_ref().unwrap_or(address) {
        a if a.is_loopback() => Some("loopback"),
        a if a.is_unspecified() => Some("unspecified"),
        a if a.is_multicast() => Some("multicast"),
        IpAddr::V4(v4) if v4.is_link_local() => Some("link-local"),
        IpAddr::V4(v4) if v4.is_broadcast() => Some("broadcast"),
        IpAddr::V6(v6) if v6.is_unicast_link_local() => Some("link-local"),
        _ => None,
    }
}

/// Splits `addresses` (sorted) into those kept and those dropped, each with why.
pub fn filter(
    addresses: Vec<IpAddr>,
    allow_special: bool,
) -> (Vec<IpAddr>, Vec<(IpAddr, &'static str)>) {
    let mut kept = Vec::with_capacity(addresses.len().min(MAX_ADDRESSES_PER_NAME));
    let mut dropped = Vec::new();
    for address in addresses {
        match special(&address).filter(|_| !allow_special) {
            Some(why) => dropped.push((address, why)),
            None if kept.len() >= MAX_ADDRESSES_PER_NAME => dropped.push((address, "over the cap")),
            None => kept.push(address),
        }
    }
    (kept, dropped)
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    #[error("no such name")]
    NotFound,
    #[error("no A or AAAA record")]
    NoAddresses,
    #[error("no usable address: {0}")]
    OnlySpecial(String),
    #[error("no answer within {} ms", .0.as_millis())]
    TimedOut(Duration),
    #[error("{0}")]
    Failed(String),
}

/// Name resolution for DNS upstreams.
pub trait Resolve: Send + Sync + 'static {
    fn resolve(&self, name: &str) -> impl Future<Output = Result<Answer, ResolveError>> + Send;
}

#[derive(Debug, Clone)]
pub struct DnsSettings {
    /// The longest a name goes without a lookup (`--dns-interval`), whatever its TTL.
    pub interval: Duration,
    /// The shortest, whatever its TTL: a TTL of 0 must not turn into a busy loop.
    pub min_interval: Duration,
    /// A lookup that has not answered by then has failed (`--dns-timeout-ms`).
    pub timeout: Duration,
    /// The first retry after a failure; each further failure doubles it, up to the interval.
    pub retry_min: Duration,
    /// Lookups in flight at once.
    pub concurrency: usize,
}

impl Default for DnsSettings {
    fn default() -> Self {
        DnsSettings {
            interval: Duration::from_secs(30),
            min_interval: Duration::from_secs(5),
            timeout: Duration::from_secs(5),
            retry_min: Duration::from_secs(1),
            concurrency: 64,
        }
    }
}

/// Every name's state; kept by the source, read by the admin endpoints.
pub type DnsTable = Arc<Mutex<DnsNames>>;

#[derive(Debug, Clone, Default)]
pub struct DnsNames {
    /// The names the workspace uses now.
    pub names: BTreeMap<String, DnsNameStatus>,
    /// Failed lookups since the agent started, of every name, those no longer in use included:
    /// a counter that never goes down (Prometheus takes a drop for a restart).
    pub failures_total: u64,
    /// Counts the changes: a body rendered from the table is rendered again when it moved.
    pub version: u64,
    /// Addresses dropped from answers since the agent started (see the module).
    pub dropped_total: u64,
}

struct Entry {
    fact: NameFact,
    status: DnsNameStatus,
    next: Instant,
    in_flight: bool,
}

struct Source<R> {
    resolver: Arc<R>,
    /// The workspace's `allow_special_upstream_addresses`.
    allow_special: bool,
    settings: DnsSettings,
    facts: UnboundedSender<Fact>,
    table: DnsTable,
    clock: Arc<dyn Clock>,
    names: BTreeMap<String, Entry>,
    lookups: JoinSet<(String, Result<Answer, ResolveError>)>,
}

/// Starts the source. It follows the names of `workspace` and ends when `facts` closes or the
/// workspace sender goes.
pub fn spawn<R: Resolve>(
    resolver: R,
    settings: DnsSettings,
    workspace: WorkspaceWatch,
    facts: UnboundedSender<Fact>,
    table: DnsTable,
    clock: Arc<dyn Clock>,
) -> tokio::task::JoinHandle<()> {
    let source = Source {
        resolver: Arc::new(resolver),
        allow_special: false,
        settings,
        facts,
        table,
        clock,
        names: BTreeMap::new(),
        lookups: JoinSet::new(),
    };
    tokio::spawn(source.run(workspace))
}

impl<R: Resolve> Source<R> {
    async fn run(mut self, mut workspace: WorkspaceWatch) {
        self.follow(&workspace);
        loop {
            self.start_due();
            let next = self
                .names
                .values()
                .filter(|e| !e.in_flight)
                .map(|e| e.next)
                .min();
            tokio::select! {
                changed = workspace.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    self.follow(&workspace);
                }
                Some(done) = self.lookups.join_next(), if !self.lookups.is_empty() => {
                    if let Ok((name, result)) = done {
                        self.answered(&name, result);
                    }
                }
                _ = tokio::time::sleep_until(next.unwrap_or_else(Instant::now)), if next.is_some() => {}
            }
            if self.facts.is_closed() {
                return;
            }
        }
    }

    /// Takes the names of the latest workspace: new ones are looked up at once, gone ones are
    /// forgotten (a lookup in flight for one is ignored when it answers).
    fn follow(&mut self, workspace: &WorkspaceWatch) {
        let wanted = {
            let workspace = workspace.borrow();
            self.allow_special = workspace
                .as_deref()
                .is_some_and(|w| w.allow_special_upstream_addresses);
            workspace
                .as_deref()
                .map(crate::plan::desired::upstream_names)
                .unwrap_or_default()
        };
        self.names.retain(|name, _| wanted.contains(name));
        let now = Instant::now();
        for name in wanted {
            self.names.entry(name.clone()).or_insert_with(|| Entry {
                fact: NameFact {
                    name: name.clone(),
                    addresses: None,
                    error: None,
                },
                status: DnsNameStatus {
                    name,
                    ..DnsNameStatus::default()
                },
                next: now,
                in_flight: false,
            });
        }
        self.publish_table();
    }

    fn start_due(&mut self) {
        let now = Instant::now();
        for (name, entry) in &mut self.names {
            if self.lookups.len() >= self.settings.concurrency {
                return;
            }
            if entry.in_flight || entry.next > now {
                continue;
            }
            entry.in_flight = true;
            let (resolver, name, timeout) =
                (self.resolver.clone(), name.clone(), self.settings.timeout);
            self.lookups.spawn(async move {
                let result = tokio::time::timeout(timeout, resolver.resolve(&name))
                    .await
                    .unwrap_or(Err(ResolveError::TimedOut(timeout)));
                (name, result)
            });
        }
    }

    fn answered(&mut self, name: &str, result: Result<Answer, ResolveError>) {
        let Some(entry) = self.names.get_mut(name) else {
            return;
        };
        entry.in_flight = false;
        let now = Instant::now();
        let mut dropped = Vec::new();
        let allow_special = self.allow_special;
        let result = result.and_then(|mut answer| {
            answer.addresses.sort();
            answer.addresses.dedup();
            if answer.addresses.is_empty() {
                return Err(ResolveError::NoAddresses);
            }
            let (kept, out) = filter(std::mem::take(&mut answer.addresses), allow_special);
            dropped = out;
            if kept.is_empty() {
                let why: Vec<String> = dropped
                    .iter()
                    .map(|(a, why)| format!("{a} ({why})"))
                    .collect();
                return Err(ResolveError::OnlySpecial(why.join(", ")));
            }
            answer.addresses = kept;
            Ok(answer)
        });
        let dropped_text: Vec<String> = dropped
            .iter()
            .map(|(a, why)| format!("{a} ({why})"))
            .collect();
        if dropped_text != entry.status.dropped_addresses {
            if !dropped_text.is_empty() {
                tracing::warn!(name, dropped = %dropped_text.join(", "),
                    "addresses of the upstream name's answer are not used as backends");
            }
            entry.status.dropped_addresses = dropped_text;
        }
        if !dropped.is_empty() {
            self.table
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .dropped_total += dropped.len() as u64;
        }
        let before = entry.fact.clone();
        let settings = &self.settings;
        match result {
            Ok(answer) => {
                if before.error.is_some() {
                    tracing::info!(name, "upstream name resolves again");
                }
                let wait = answer.ttl.unwrap_or(settings.interval).clamp(
                    settings.min_interval.min(settings.interval),
                    settings.interval,
                );
                entry.next = now + wait;
                entry.status.consecutive_failures = 0;
                entry.status.last_success = Some(self.clock.unix());
                entry.status.ttl_seconds = answer.ttl.map(|t| t.as_secs());
                entry.fact.addresses = Some(answer.addresses.into());
                entry.fact.error = None;
            }
            Err(e) => {
                let message = e.to_string();
                if before.error.as_ref() != Some(&message) {
                    tracing::warn!(name, error = %message,
                        kept = before.addresses.as_ref().map_or(0, |a| a.len()),
                        "upstream name lookup failed; the last addresses stay");
                }
                entry.status.consecutive_failures += 1;
                entry.status.failures += 1;
                self.table
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .failures_total += 1;
                let doublings = entry.status.consecutive_failures.saturating_sub(1).min(16);
                entry.next =
                    now + (settings.retry_min * 2u32.pow(doublings)).min(settings.interval);
                entry.fact.error = Some(message);
            }
        }
        entry.status.addresses = entry
            .fact
            .addresses
            .iter()
            .flat_map(|a| a.iter())
            .map(IpAddr::to_string)
            .collect();
        entry.status.resolved = entry.fact.addresses.is_some();
        entry.status.last_error = entry.fact.error.clone();
        let status = entry.status.clone();
        if entry.fact != before {
            let _ = self.facts.send(Fact::Dns(entry.fact.clone()));
        }
        let mut table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        table.names.insert(name.to_owned(), status);
        table.version += 1;
    }

    fn publish_table(&self) {
        let mut table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        table.version += 1;
        table.names.retain(|name, _| self.names.contains_key(name));
        for (name, entry) in &self.names {
            table
                .names
                .entry(name.clone())
                .or_insert_with(|| entry.status.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workspace::{Upstream, Workspace};

    /// What the fake says for a name: an answer or a failure, or `None` for never answering.
    type Scripted = Option<Result<Answer, ResolveError>>;

    /// Answers from a table; a name not in it does not exist.
    #[derive(Clone, Default)]
    struct Fake(Arc<Mutex<BTreeMap<String, Scripted>>>);

    impl Fake {
        fn set(&self, name: &str, answer: Scripted) {
            self.0.lock().unwrap().insert(name.into(), answer);
        }
    }

    impl Resolve for Fake {
        async fn resolve(&self, name: &str) -> Result<Answer, ResolveError> {
            let answer = self.0.lock().unwrap().get(name).cloned();
            match answer {
                Some(Some(answer)) => answer,
                Some(None) => std::future::pending().await,
                None => Err(ResolveError::NotFound),
            }
        }
    }

    fn answer(ip: &str, ttl: Option<u64>) -> Scripted {
        Some(Ok(Answer {
            addresses: vec![ip.parse().unwrap()],
            ttl: ttl.map(Duration::from_secs),
        }))
    }

    fn workspace(names: &[&str]) -> Arc<Workspace> {
        let routes = names
            .iter()
            .enumerate()
            .map(|(i, name)| {
                crate::workspace::test_route(
                    &format!("r{i}.in.example.org"),
                    Upstream::Dns {
                        name: (*name).into(),
                        port: 80,
                    },
                )
            })
            .collect();
        Arc::new(crate::workspace::test_workspace(
            std::path::Path::new("/tls"),
            routes,
        ))
    }

    struct Running {
        facts: tokio::sync::mpsc::UnboundedReceiver<Fact>,
        table: DnsTable,
        workspace: tokio::sync::watch::Sender<Option<Arc<Workspace>>>,
    }

    fn start(fake: &Fake, names: &[&str]) -> Running {
        let (ws_tx, ws_rx) = tokio::sync::watch::channel(Some(workspace(names)));
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let table = DnsTable::default();
        let settings = DnsSettings {
            interval: Duration::from_secs(30),
            min_interval: Duration::from_secs(5),
            timeout: Duration::from_secs(2),
            retry_min: Duration::from_secs(1),
            concurrency: 8,
        };
        let clock = Arc::new(crate::clock::TokioClock::starting_at(std::time::UNIX_EPOCH));
        spawn(fake.clone(), settings, ws_rx, tx, table.clone(), clock);
        Running {
            facts: rx,
            table,
            workspace: ws_tx,
        }
    }

    async fn next_fact(running: &mut Running) -> (Instant, NameFact) {
        match running.facts.recv().await {
            Some(Fact::Dns(fact)) => (Instant::now(), fact),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_name_that_never_answers_holds_up_no_other_name() {
        let fake = Fake::default();
        fake.set("stalled.svc", None);
        fake.set("ok.svc", answer("10.0.0.1", None));
        let started = Instant::now();
        let mut running = start(&fake, &["stalled.svc", "ok.svc"]);
        let (at, fact) = next_fact(&mut running).await;
        assert_eq!(fact.name, "ok.svc");
        assert_eq!(at, started, "answered at once, beside a lookup that hangs");
        let (at, fact) = next_fact(&mut running).await;
        assert_eq!(fact.name, "stalled.svc");
        assert_eq!(
            at - started,
            Duration::from_secs(2),
            "failed at its deadline"
        );
        assert_eq!(fact.addresses, None);
        assert_eq!(fact.error.as_deref(), Some("no answer within 2000 ms"));
        let table = running.table.lock().unwrap().names.clone();
        assert!(table["ok.svc"].resolved && !table["stalled.svc"].resolved);
    }

    #[tokio::test(start_paused = true)]
    async fn re_resolution_follows_the_ttl_within_bounds_and_failures_keep_the_last_answer() {
        let fake = Fake::default();
        fake.set("a.svc", answer("10.0.0.1", Some(8)));
        let started = Instant::now();
        let mut running = start(&fake, &["a.svc"]);
        next_fact(&mut running).await;
        // The TTL (8 s): the new answer is picked up then, not at the 30 s interval.
        fake.set("a.svc", answer("10.0.0.2", Some(1)));
        let (at, fact) = next_fact(&mut running).await;
        assert_eq!(at - started, Duration::from_secs(8));
        assert_eq!(
            fact.addresses.as_deref(),
            Some(&["10.0.0.2".parse().unwrap()][..])
        );
        // A TTL of 1 s is raised to the 5 s floor.
        fake.set("a.svc", answer("10.0.0.3", Some(1)));
        let (at, _) = next_fact(&mut running).await;
        assert_eq!(at - started, Duration::from_secs(13));
        // A failure keeps the addresses, is retried after 1 s, then 2 s, and its recovery shows.
        fake.set("a.svc", Some(Err(ResolveError::Failed("SERVFAIL".into()))));
        let (at, fact) = next_fact(&mut running).await;
        assert_eq!(at - started, Duration::from_secs(18));
        assert_eq!(
            fact.addresses.as_deref(),
            Some(&["10.0.0.3".parse().unwrap()][..])
        );
        assert_eq!(fact.error.as_deref(), Some("SERVFAIL"));
        fake.set("a.svc", answer("10.0.0.3", None));
        let (at, fact) = next_fact(&mut running).await;
        assert_eq!(at - started, Duration::from_secs(19));
        assert_eq!(fact.error, None);
        let table = running.table.lock().unwrap().names.clone();
        assert_eq!(table["a.svc"].failures, 1);
        assert_eq!(table["a.svc"].consecutive_failures, 0);
    }

    /// The total of failed lookups is a counter: a name leaving the workspace takes its own
    /// series away, never a part of the total.
    #[tokio::test(start_paused = true)]
    async fn the_failures_total_never_goes_down_when_a_name_leaves() {
        let fake = Fake::default();
        fake.set("ok.svc", answer("10.0.0.1", None));
        let mut running = start(&fake, &["gone.svc", "ok.svc"]);
        next_fact(&mut running).await;
        next_fact(&mut running).await;
        let views = crate::api::Views {
            dns: running.table.clone(),
            ..crate::api::Views::default()
        };
        let total = |views: &crate::api::Views| {
            let text = views.metrics();
            let line = text
                .lines()
                .find(|l| l.starts_with("private_ingress_dns_failures_total "))
                .unwrap_or_else(|| panic!("{text}"))
                .to_owned();
            (line, views.snapshot().counters.dns_failures)
        };
        let before = total(&views);
        assert_eq!(before.1, 1, "{before:?}");
        running.workspace.send_replace(Some(workspace(&["ok.svc"])));
        tokio::time::sleep(Duration::from_millis(1)).await;
        for _ in 0..2 {
            assert_eq!(total(&views), before);
            assert!(!views.metrics().contains("gone.svc"));
        }
    }

    #[test]
    fn special_addresses_are_dropped_unless_allowed_and_answers_are_capped() {
        let ip = |a: &str| a.parse::<IpAddr>().unwrap();
        let answer: Vec<IpAddr> = [
            "10.0.0.1",
            "127.0.0.1",
            "169.254.169.254",
            "0.0.0.0",
            "224.0.0.1",
            "::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            "fd00::5",
        ]
        .iter()
        .map(|a| ip(a))
        .collect();
        let (kept, dropped) = filter(answer.clone(), false);
        assert_eq!(kept, [ip("10.0.0.1"), ip("fd00::5")]);
        let reasons: Vec<(String, &str)> =
            dropped.iter().map(|(a, w)| (a.to_string(), *w)).collect();
        assert!(
            reasons.contains(&("169.254.169.254".into(), "link-local")),
            "{reasons:?}"
        );
        assert!(
            reasons.contains(&("::ffff:127.0.0.1".into(), "loopback")),
            "{reasons:?}"
        );
        assert_eq!(dropped.len(), 7);
        let (kept, dropped) = filter(answer, true);
        assert_eq!((kept.len(), dropped.len()), (9, 0));
        let many: Vec<IpAddr> = (0..100u8).map(|i| IpAddr::from([10, 1, 0, i])).collect();
        let (kept, dropped) = filter(many, false);
        assert_eq!(
            (kept.len(), dropped.len()),
            (MAX_ADDRESSES_PER_NAME, 100 - MAX_ADDRESSES_PER_NAME)
        );
        assert!(dropped.iter().all(|(_, why)| *why == "over the cap"));
    }

    /// An answer of the metadata address and loopback only: no backend, a failed lookup that
    /// says why, and the addresses in use stay the last good ones.
    #[tokio::test(start_paused = true)]
    async fn an_answer_of_special_addresses_alone_is_a_failed_lookup() {
        let fake = Fake::default();
        fake.set("a.svc", answer("10.0.0.1", Some(6)));
        let mut running = start(&fake, &["a.svc"]);
        next_fact(&mut running).await;
        fake.set(
            "a.svc",
            Some(Ok(Answer {
                addresses: vec![
                    "169.254.169.254".parse().unwrap(),
                    "127.0.0.1".parse().unwrap(),
                ],
                ttl: None,
            })),
        );
        let (_, fact) = next_fact(&mut running).await;
        assert_eq!(
            fact.addresses.as_deref(),
            Some(&["10.0.0.1".parse().unwrap()][..])
        );
        let error = fact.error.unwrap();
        assert!(error.contains("169.254.169.254 (link-local)"), "{error}");
        let table = running.table.lock().unwrap().clone();
        assert_eq!(table.dropped_total, 2);
        assert_eq!(table.names["a.svc"].dropped_addresses.len(), 2);
    }
}
