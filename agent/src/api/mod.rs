//! The agent's view, as `/v1/state` serves it and `private-ingress status` reads it: the wire
//! types, the admin HTTP server ([`admin`]) and the Prometheus rendering ([`metrics`]).
//!
//! The field names are public interface: extend, never rename.

pub mod admin;
pub mod metrics;

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use serde::{Deserialize, Serialize};

/// The agent's own view, served on `/v1/state` and read by `private-ingress status`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Status {
    pub ready: bool,
    pub workspace: WorkspaceStatus,
    pub sozu: SozuStatus,
    pub routes: Vec<RouteStatus>,
    /// Each upstream DNS name the workspace uses.
    #[serde(default)]
    pub dns: Vec<DnsNameStatus>,
    pub counters: Counters,
    /// With `tls_rotation = 'sozu_managed`: the ACME issuer, per host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issuer: Option<crate::acme::IssuerStatus>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct WorkspaceStatus {
    pub loaded: bool,
    pub zone: Option<String>,
    /// Why the latest edit was not applied (the last good workspace keeps serving).
    pub last_error: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct SozuStatus {
    pub connected: bool,
    /// Which sozu the agent talks to: its connection and worker processes.
    pub generation: Option<String>,
    pub last_error: Option<String>,
    /// Unix seconds of the last reconcile that left sozu equal to the desired state.
    pub last_converged: Option<u64>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct RouteStatus {
    pub id: String,
    pub host: String,
    pub path_prefix: String,
    pub upstream: String,
    /// Backend addresses the route should have.
    pub backends_desired: Vec<String>,
    /// Backend addresses sozu has for the route.
    pub backends_actual: Vec<String>,
    pub certificate: CertificateStatus,
    pub state: RouteState,
    /// What a `pending` route waits for.
    #[serde(default)]
    pub waiting_for: Vec<Waiting>,
    pub last_error: Option<String>,
    /// Each upstream with its weight, whether it is drained, and its backends' health.
    #[serde(default)]
    pub upstreams: Vec<UpstreamStatus>,
    /// No backend can take a request: every upstream is drained (sozu answers 503), or every
    /// backend is reported down (sozu 2.3.3 then fails open: it still tries the backends, and
    /// answers 503 only when none of them connects).
    #[serde(default)]
    pub no_available_backend: bool,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct UpstreamStatus {
    /// As the workspace writes it.
    pub upstream: String,
    pub weight: u32,
    /// The workspace drains it (its own `drain`, or its route's).
    pub drain: bool,
    /// `in rotation`; or, drained: `draining (N sessions)` until sozu says its last
    /// connection ended, then `drained`.
    pub state: String,
    pub backends: Vec<BackendStatus>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct BackendStatus {
    /// sozu's backend id.
    pub id: String,
    pub address: String,
    /// As sozu last reported it: by its health check, or by failed connections.
    pub health: BackendHealth,
    /// Times sozu reported it going down or coming back up since the agent started.
    pub transitions: u64,
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum BackendHealth {
    /// sozu has said nothing of it yet.
    #[default]
    Unknown,
    Up,
    Down,
}

impl std::fmt::Display for BackendHealth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BackendHealth::Unknown => "unknown",
            BackendHealth::Up => "up",
            BackendHealth::Down => "down",
        })
    }
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum RouteState {
    /// Fully served.
    Ok,
    /// Not fully served yet: waiting for a certificate or for its upstream's first addresses.
    #[default]
    Pending,
    /// Served as far as it can be, with a problem: see `last_error`.
    Error,
}

impl std::fmt::Display for RouteState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RouteState::Ok => "ok",
            RouteState::Pending => "pending",
            RouteState::Error => "error",
        })
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Waiting {
    /// No valid pair has been found for the host yet: its frontends wait.
    Certificate,
    /// The upstream's name has never resolved: the cluster has no backend yet.
    Dns,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct CertificateStatus {
    pub disk_fingerprint: Option<String>,
    pub disk_not_before: Option<i64>,
    pub disk_not_after: Option<i64>,
    /// The pair served expires within the expiry warning (`--expiry-warning-days`): its renewal
    /// is overdue.
    pub expiring_soon: bool,
    pub served_fingerprints: Vec<String>,
    /// Validity of the certificate sozu serves (the one expiring first, when sozu serves
    /// several), Unix seconds; absent when the agent never read it (sozu held it before the
    /// agent started and the agent has not replaced it).
    pub served_not_before: Option<i64>,
    pub served_not_after: Option<i64>,
    pub error: Option<String>,
    /// Why the pair on disk was refused, as a stable name (see `CertError::reason`).
    pub error_reason: Option<String>,
    /// Names of the pair on disk besides the host's own (another route host, a wildcard): sozu
    /// is told the host's name alone, so the pair is served for this host only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub other_names: Vec<String>,
    /// Certificates replaced in sozu for this host since the agent started.
    pub rotations: u64,
    /// Unix seconds of the last replacement.
    pub last_rotation: Option<u64>,
}

/// One upstream DNS name, as the DNS source last saw it.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct DnsNameStatus {
    pub name: String,
    /// The addresses in use: the last good answer, kept while lookups fail.
    pub addresses: Vec<String>,
    /// The name has resolved at least once.
    pub resolved: bool,
    /// Why the latest lookup failed; none when it succeeded.
    pub last_error: Option<String>,
    pub consecutive_failures: u32,
    /// Failed lookups since the agent started.
    pub failures: u64,
    /// Unix seconds of the last successful lookup.
    pub last_success: Option<i64>,
    /// The TTL of the last answer, when the resolver gave one.
    pub ttl_seconds: Option<u64>,
    /// Addresses of the last answer not used as backends, each with why (`loopback`,
    /// `link-local`, `unspecified`, `multicast`, `broadcast`, `over the cap`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dropped_addresses: Vec<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Counters {
    pub reconciles: u64,
    pub reconcile_errors: u64,
    pub sozu_requests: u64,
    pub sozu_reconnects: u64,
    pub workspace_errors: u64,
    pub dns_failures: u64,
    /// Distinct refused pairs (a pair failing again the same way is not counted again).
    pub certificate_errors: u64,
    /// The same, by reason.
    pub certificate_errors_by_reason: BTreeMap<String, u64>,
    /// Full resyncs: every pair and sozu's state read again (periodic).
    pub resyncs: u64,
    /// Times a file watcher's queue overflowed and events were lost.
    pub watch_overflows: u64,
    /// Changes to the agent's objects in sozu that the agent did not make, each repaired by a
    /// targeted resync.
    #[serde(default)]
    pub drift_repairs: u64,
    /// Times sozu's event stream broke (counted as a possible sozu restart).
    #[serde(default)]
    pub event_stream_breaks: u64,
    /// Addresses dropped from upstream names' answers (special addresses, over the cap).
    #[serde(default)]
    pub dns_dropped_addresses: u64,
}

/// A route's status, with its metric lines rendered when it changed.
#[derive(Debug, Clone, PartialEq)]
pub struct RouteView {
    pub status: RouteStatus,
    pub metrics: metrics::RouteMetrics,
}

/// Routes by (host, path prefix): the workspace's own order.
pub type RouteKey = (String, String);

/// The parts of the status that are not per route.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Head {
    pub ready: bool,
    pub workspace: WorkspaceStatus,
    pub sozu: SozuStatus,
    pub counters: Counters,
}

/// What the loop publishes: cheap to hand out (a reader clones an `Arc`) and cheap to update (a
/// persistent map shares every route that did not change with the previous snapshot).
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub head: Head,
    pub routes: imbl::OrdMap<RouteKey, Arc<RouteView>>,
}

/// Where the loop publishes its snapshots. Readers never hold the lock longer than an `Arc`
/// clone takes, so a scrape at 10,000 routes never holds up a pass.
#[derive(Debug, Default)]
pub struct Published(RwLock<Arc<Snapshot>>);

impl Published {
    pub fn load(&self) -> Arc<Snapshot> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn store(&self, snapshot: Snapshot) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(snapshot);
    }

    /// The loop's status alone, as an owned document (no DNS names).
    pub fn status(&self) -> Status {
        self.load().status(&[])
    }
}

impl Snapshot {
    /// The whole document, owned; `/v1/state` serializes [`StatusRef`] instead, without copies.
    pub fn status(&self, dns: &[DnsNameStatus]) -> Status {
        Status {
            ready: self.head.ready,
            workspace: self.head.workspace.clone(),
            sozu: self.head.sozu.clone(),
            routes: self.routes.values().map(|r| r.status.clone()).collect(),
            dns: dns.to_vec(),
            counters: self.head.counters.clone(),
            issuer: None,
        }
    }
}

/// [`Status`] as serialized from a snapshot, borrowing everything: the same document.
#[derive(Serialize)]
pub struct StatusRef<'a> {
    ready: bool,
    workspace: &'a WorkspaceStatus,
    sozu: &'a SozuStatus,
    routes: RoutesRef<'a>,
    dns: &'a [DnsNameStatus],
    counters: &'a Counters,
    #[serde(skip_serializing_if = "Option::is_none")]
    issuer: Option<&'a crate::acme::IssuerStatus>,
}

struct RoutesRef<'a>(&'a imbl::OrdMap<RouteKey, Arc<RouteView>>);

impl Serialize for RoutesRef<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.values().map(|r| &r.status))
    }
}

/// The loop's published status.
pub type SharedStatus = Arc<Published>;

/// What the admin endpoints read: the loop's snapshots and heartbeat, the DNS source's table,
/// and the ACME issuer's status; and the bodies last rendered from them.
#[derive(Clone, Default)]
pub struct Views {
    pub status: SharedStatus,
    pub heartbeat: Heartbeat,
    pub dns: crate::sources::dns::DnsTable,
    pub issuer: crate::acme::IssuerHandle,
    pub bodies: Arc<Bodies>,
}

/// `/v1/state` and `/metrics` as last rendered, with what they were rendered from: a request
/// while nothing changed gets the same bytes, shared, not a copy of its own.
#[derive(Default)]
pub struct Bodies {
    state: tokio::sync::Mutex<Option<(Version, bytes::Bytes)>>,
    metrics: tokio::sync::Mutex<Option<(Version, bytes::Bytes)>>,
}

/// What a body was rendered from: the loop's snapshot (kept, so that it is compared by
/// identity), and the DNS table's and the issuer's versions.
#[derive(Clone)]
struct Version(Arc<Snapshot>, u64, u64);

impl PartialEq for Version {
    fn eq(&self, other: &Version) -> bool {
        Arc::ptr_eq(&self.0, &other.0) && self.1 == other.1 && self.2 == other.2
    }
}

/// When the reconcile loop last turned: `/healthz` answers from it. A loop that waits for
/// facts still turns every [`crate::reconcile::driver::TICK`]; one that has not turned for
/// [`Heartbeat::stale_after`] is wedged (a pass is bounded by sozu's request deadlines), and
/// only a restart repairs that.
#[derive(Debug, Clone)]
pub struct Heartbeat(Arc<Beats>);

#[derive(Debug)]
struct Beats {
    origin: tokio::time::Instant,
    /// Milliseconds since `origin` of the last turn.
    last: std::sync::atomic::AtomicU64,
    stale_after: std::time::Duration,
}

impl Default for Heartbeat {
    fn default() -> Self {
        Heartbeat::new(DEFAULT_STALE_AFTER)
    }
}

/// The longest the loop may go without turning before `/healthz` fails, unless `run` is told
/// otherwise: the tick every 10 s, and room for a pass against a sozu that answers nothing (a
/// few requests, each bounded by `--sozu-timeout-ms`).
pub const DEFAULT_STALE_AFTER: std::time::Duration = std::time::Duration::from_secs(60);

impl Heartbeat {
    /// A heart that has just beaten.
    pub fn new(stale_after: std::time::Duration) -> Heartbeat {
        Heartbeat(Arc::new(Beats {
            origin: tokio::time::Instant::now(),
            last: std::sync::atomic::AtomicU64::new(0),
            stale_after,
        }))
    }

    /// The loop turned.
    pub fn beat(&self) {
        let since = self.0.origin.elapsed().as_millis();
        self.0.last.store(
            u64::try_from(since).unwrap_or(u64::MAX),
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// How long since the loop last turned.
    pub fn age(&self) -> std::time::Duration {
        let last = self.0.last.load(std::sync::atomic::Ordering::Relaxed);
        self.0
            .origin
            .elapsed()
            .saturating_sub(std::time::Duration::from_millis(last))
    }

    /// `Err(age)` when the loop has not turned for longer than the bound.
    pub fn check(&self) -> Result<(), std::time::Duration> {
        let age = self.age();
        if age > self.0.stale_after {
            Err(age)
        } else {
            Ok(())
        }
    }

    pub fn stale_after(&self) -> std::time::Duration {
        self.0.stale_after
    }
}

impl Views {
    /// The DNS names, and the counters with the DNS source's failures counted in.
    pub fn dns(&self, counters: &Counters) -> (Vec<DnsNameStatus>, Counters) {
        let dns = self.dns.lock().unwrap_or_else(|p| p.into_inner());
        let mut counters = counters.clone();
        counters.dns_failures = dns.failures_total;
        counters.dns_dropped_addresses = dns.dropped_total;
        (dns.names.values().cloned().collect(), counters)
    }

    /// One consistent document: the loop's status with each DNS name's state.
    pub fn snapshot(&self) -> Status {
        let snapshot = self.status.load();
        let (dns, counters) = self.dns(&snapshot.head.counters);
        let mut status = snapshot.status(&dns);
        status.counters = counters;
        status.issuer = self.issuer.snapshot();
        status
    }

    fn version(&self) -> Version {
        let dns = self.dns.lock().unwrap_or_else(|p| p.into_inner()).version;
        Version(self.status.load(), dns, self.issuer.version())
    }

    /// `/v1/state` as bytes to send: rendered once per change, on the blocking pool.
    pub async fn state_body(&self) -> Result<bytes::Bytes, serde_json::Error> {
        let views = self.clone();
        self.cached(&self.bodies.state, move || {
            views.state_json().map(Into::into)
        })
        .await
    }

    /// `/metrics` as bytes to send: rendered once per change, on the blocking pool.
    pub async fn metrics_body(&self) -> Result<bytes::Bytes, serde_json::Error> {
        let views = self.clone();
        self.cached(&self.bodies.metrics, move || Ok(views.metrics().into()))
            .await
    }

    async fn cached(
        &self,
        slot: &tokio::sync::Mutex<Option<(Version, bytes::Bytes)>>,
        render: impl FnOnce() -> Result<bytes::Bytes, serde_json::Error> + Send + 'static,
    ) -> Result<bytes::Bytes, serde_json::Error> {
        // Held while rendering: a second request waits for the first's bytes.
        let mut slot = slot.lock().await;
        let version = self.version();
        if let Some((rendered, body)) = slot.as_ref() {
            if *rendered == version {
                return Ok(body.clone());
            }
        }
        let body = tokio::task::spawn_blocking(render)
            .await
            .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))?;
        *slot = Some((version, body.clone()));
        Ok(body)
    }

    /// `/v1/state`, serialized from the latest snapshot without copying it.
    pub fn state_json(&self) -> Result<Vec<u8>, serde_json::Error> {
        let snapshot = self.status.load();
        let (dns, counters) = self.dns(&snapshot.head.counters);
        let issuer = self.issuer.snapshot();
        serde_json::to_vec(&StatusRef {
            ready: snapshot.head.ready,
            workspace: &snapshot.head.workspace,
            sozu: &snapshot.head.sozu,
            routes: RoutesRef(&snapshot.routes),
            dns: &dns,
            counters: &counters,
            issuer: issuer.as_ref(),
        })
    }

    /// `/metrics`.
    pub fn metrics(&self) -> String {
        let snapshot = self.status.load();
        let (dns, counters) = self.dns(&snapshot.head.counters);
        let mut text = metrics::render(&snapshot, &counters, &dns);
        if let Some(issuer) = self.issuer.snapshot() {
            crate::acme::status::write_metrics(&mut text, &issuer);
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `/v1/state` from a snapshot is the document `status` reads back, field for field.
    #[test]
    fn the_borrowed_document_is_the_owned_one() {
        let route = RouteStatus {
            id: "pi-a.in.example.org".into(),
            host: "a.in.example.org".into(),
            path_prefix: "/".into(),
            state: RouteState::Pending,
            waiting_for: vec![Waiting::Dns],
            ..RouteStatus::default()
        };
        let mut routes = imbl::OrdMap::new();
        routes.insert(
            (route.host.clone(), route.path_prefix.clone()),
            Arc::new(RouteView {
                metrics: metrics::RouteMetrics::of(&route, true),
                status: route,
            }),
        );
        let views = Views::default();
        views.status.store(Snapshot {
            head: Head {
                ready: true,
                ..Head::default()
            },
            routes,
        });
        {
            let mut dns = views.dns.lock().unwrap();
            dns.names.insert(
                "a.svc".into(),
                DnsNameStatus {
                    name: "a.svc".into(),
                    failures: 2,
                    ..DnsNameStatus::default()
                },
            );
            dns.failures_total = 2;
        }
        let json = views.state_json().unwrap();
        let read: Status = serde_json::from_slice(&json).unwrap();
        assert_eq!(read, views.snapshot());
        assert_eq!(read.counters.dns_failures, 2);
        assert_eq!(read.routes.len(), 1);
    }
}
