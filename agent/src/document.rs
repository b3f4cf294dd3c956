//! The `/v1/state` document: every type of it, and nothing else. The agent's loop, its sources and
//! its issuer fill it in; the admin server serves it as JSON; `private-ingress status` reads it
//! back and prints it; `/metrics` renders the same figures for Prometheus. A leaf: it imports
//! none of them.
//!
//! The field names are public interface: extend, never rename. To add a field, add it here
//! (with `#[serde(default)]`, so that a `status` of this version reads an older agent), fill it
//! where its fact is known, and show it in `cli::status` or `api::metrics` if it should be seen
//! there.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// The agent's own view, served on `/v1/state` and read by `private-ingress status`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Document {
    /// What `/readyz` answers; [`Document::readiness`] says how it was decided and why not.
    pub ready: bool,
    #[serde(default)]
    pub readiness: Readiness,
    pub workspace: WorkspaceStatus,
    pub sozu: SozuStatus,
    pub routes: Vec<RouteStatus>,
    /// Each upstream DNS name the workspace uses.
    #[serde(default)]
    pub dns: Vec<DnsNameStatus>,
    pub counters: Counters,
    /// With `tls_rotation = 'sozu_managed`: the ACME issuer, per host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issuer: Option<IssuerStatus>,
    /// What sozu carries, from its per-request records: absent from an older agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traffic: Option<TrafficStatus>,
}

/// sozu's access-log stream as the agent receives it, and each route's requests over the last
/// [`TrafficStatus::window_seconds`].
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct TrafficStatus {
    /// The UDP address records are received on, once bound.
    pub listen: Option<String>,
    /// Why the agent receives nothing: the address cannot be bound, or no record has arrived
    /// (sozu's configuration lacks the two lines, or nothing was requested yet).
    pub problem: Option<String>,
    /// Records taken since the agent started.
    pub records: u64,
    /// Datagrams that were not a record sozu sends (truncated, malformed), skipped.
    pub malformed: u64,
    /// Datagrams from an address that is neither loopback nor a `traffic.senders` one, dropped.
    pub rejected: u64,
    /// Datagrams the kernel dropped because the agent did not read them in time.
    pub lost: u64,
    /// Unix seconds of the latest record.
    pub last_record: Option<i64>,
    /// Where the JSON access log goes: `stdout`, a path, or `off`.
    pub access_log: String,
    /// Access-log lines not written because the output did not keep up (the metrics still
    /// counted their requests).
    pub access_log_dropped: u64,
    /// The length of the window the per-route figures cover.
    pub window_seconds: u64,
    /// By route id; requests that matched no route under `unmatched`. Routes without a request
    /// in the window are left out.
    pub routes: BTreeMap<String, RouteTraffic>,
}

/// One route's requests over the window.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct RouteTraffic {
    pub requests: u64,
    pub requests_per_second: f64,
    /// Share of the requests answered with a 5xx status, from 0 to 1.
    pub error_ratio: f64,
    /// The 99th percentile of the request duration, interpolated within the histogram's
    /// buckets as Prometheus' `histogram_quantile` does.
    pub p99_seconds: Option<f64>,
}

/// How readiness is decided (`--readiness`), and what it found.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Readiness {
    pub mode: ReadinessMode,
    pub ready: bool,
    /// Routes that cannot be served for a reason known for certain (a refused or missing pair,
    /// names that failed to resolve, a request sozu refused); each route's status says which.
    pub routes_not_served: usize,
    /// Why the agent is not ready.
    pub reason: Option<String>,
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ReadinessMode {
    /// Ready once every route that can be served is served; the others are reported.
    #[default]
    Serving,
    /// Ready once every route is served.
    Strict,
}

impl std::fmt::Display for ReadinessMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ReadinessMode::Serving => "serving",
            ReadinessMode::Strict => "strict",
        })
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct WorkspaceStatus {
    pub loaded: bool,
    pub zone: Option<String>,
    /// Why the latest edit was not applied (the last good workspace keeps serving).
    pub last_error: Option<String>,
    /// The listeners the workspace in force asks for: `top` shows them beside the client
    /// certificates sozu holds. Absent from an older agent, and before a workspace is loaded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listeners: Option<ListenersStatus>,
    /// With a `traefik` record: each Traefik file and endpoint read, and the routers not
    /// served. Absent from an older agent, and without the record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traefik: Option<TraefikStatus>,
}

/// The workspace's `traefik` record as the agent reads it: each source's state, and the
/// routers it does not serve, each with its file, line and name, and why.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct TraefikStatus {
    /// Each file (of the directory, or the one file) and the endpoint, in name order.
    pub sources: Vec<TraefikSourceStatus>,
    /// The routes served from them.
    pub routes: usize,
    /// Routers not served: `<file>:<line>: http router `name`: not served: <reason>`.
    #[serde(default)]
    pub refused: Vec<String>,
}

/// One Traefik file or endpoint.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct TraefikSourceStatus {
    /// The file's path, or the endpoint's URL.
    pub source: String,
    /// `file` or `endpoint`.
    pub kind: String,
    /// `ok`; `error` (its last good version, if any, is what serves); `pending` (never read).
    pub state: String,
    /// Unix seconds of the last good read.
    pub last_good: Option<i64>,
    /// Why the latest read was not taken, with the file's line where it can be told.
    pub error: Option<String>,
}

/// The workspace's listeners and their policy, as the workspace in force declares them.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ListenersStatus {
    pub https: String,
    pub http: String,
    /// The lowest TLS version the HTTPS listener accepts: `1.2` or `1.3`.
    pub min_tls_version: String,
    /// Both listeners expect the PROXY protocol.
    pub expect_proxy: bool,
    /// The interface they are bound to (`SO_BINDTODEVICE`), if any.
    pub interface: Option<String>,
    /// Seconds: `front`, `back`, `connect`, `request`.
    pub timeouts: BTreeMap<String, u32>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct SozuStatus {
    pub connected: bool,
    /// Which sozu the agent talks to: its connection and worker processes.
    pub generation: Option<String>,
    pub last_error: Option<String>,
    /// Why the last resync could not read sozu's state, until one can: rotations and edits go
    /// on from what the agent knows meanwhile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_read_error: Option<String>,
    /// Unix seconds of the last reconcile that left sozu equal to the desired state.
    pub last_converged: Option<u64>,
    /// Listener settings the workspace asks for that sozu can only take on a new listener
    /// (`<address>: <setting>`): sozu must be restarted to apply them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub listeners_need_restart: Vec<String>,
    /// The HTTPS listener as sozu holds it: what it offers in ALPN and its timeouts, which are
    /// every WebSocket's and event stream's idle limit. `None` before sozu has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub https_listener: Option<HttpsListenerStatus>,
    /// The HTTPS listener's client certificates, with `listeners.client_auth` on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_auth: Option<ClientAuthStatus>,
    /// Basic-auth users files and error pages refused at their latest read, each with its
    /// reason (its last good version stays in sozu).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub policy_files_refused: Vec<String>,
}

/// The HTTPS listener's settings that decide what protocols it carries and for how long.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct HttpsListenerStatus {
    /// `offered` (h2, then http/1.1), `off` (http/1.1 only) or `only` (h2 only).
    pub http2: String,
    /// Seconds: a client connection, a backend connection idle this long is closed.
    pub front_timeout: u32,
    pub back_timeout: u32,
}

/// `listeners.client_auth` as the agent holds it: each file's version in force and why the
/// latest read of it was refused, and whether sozu refused what the files hold.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ClientAuthStatus {
    /// `optional` or `required`.
    pub mode: String,
    pub ca: Option<ClientCaStatus>,
    pub crls: Vec<ClientCrlStatus>,
    /// sozu's reason for refusing the CA and CRLs the agent validated from the files: sozu keeps
    /// enforcing the ones it held before (what each file shows then), so a revocation the files
    /// add is not in force. `None` while sozu holds what the files hold.
    #[serde(default)]
    pub sozu_refused: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ClientCaStatus {
    pub file: String,
    /// Of the version in force: the last good one, or while sozu refuses it (`sozu_refused`) the
    /// one sozu kept; none until one was read (or when the agent does not know what sozu kept).
    pub subject: Option<String>,
    /// Unix seconds: the earliest notAfter of its certificates.
    pub not_after: Option<i64>,
    /// Why the latest read was refused.
    pub problem: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ClientCrlStatus {
    pub file: String,
    /// Unix seconds, of the version in force (as for the CA): sozu fails every handshake once it
    /// passes.
    pub next_update: Option<i64>,
    /// How many certificates the version in force revokes.
    pub revoked: Option<usize>,
    /// Why the latest read was refused.
    pub problem: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct RouteStatus {
    pub id: String,
    pub host: String,
    /// An HTTPS route's path prefix; empty for a route matched another way, or of its own
    /// port.
    pub path_prefix: String,
    /// How an HTTPS route matched other than by its prefix alone matches requests: its path
    /// field, method and header matches (`exact /v2 method GET header x-canary=1`); empty for
    /// the others.
    #[serde(rename = "match", default, skip_serializing_if = "String::is_empty")]
    pub matches: String,
    /// How sozu carries the route: `https`, `tcp`, `tls_passthrough` or `udp`.
    #[serde(default = "https")]
    pub protocol: String,
    /// The port of the ingress a route of its own port listens on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listen_port: Option<u16>,
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
    /// The route's policies in one line (redirect, rewrites, headers, basic auth, limits,
    /// error pages); empty for none.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub policy: String,
    /// What the route does that its author should keep in mind though the workspace allows it:
    /// a route of its own port open without a client certificate while the https listener
    /// requires one (`client_auth_exempt`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// Where a route not written in the workspace comes from:
    /// `traefik: dynamic/orca-web.yaml:3: http router `orca-web``.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<String>,
}

/// What a route written before routes had kinds is.
fn https() -> String {
    "https".to_owned()
}

impl RouteStatus {
    /// What tells the route apart from its host's others: its path prefix or its match (as
    /// [`crate::workspace::Route::place`] writes them), or its protocol and port (`tcp:2222`).
    pub fn place(&self) -> String {
        match self.listen_port {
            Some(port) => format!("{}:{port}", self.protocol),
            None if !self.matches.is_empty() => self.matches.clone(),
            None => self.path_prefix.clone(),
        }
    }
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
    /// The fingerprints and the issuer are the certificates' own, shared (`Arc`): a status of
    /// 10,000 routes copied them per route.
    pub disk_fingerprint: Option<Arc<str>>,
    pub disk_not_before: Option<i64>,
    pub disk_not_after: Option<i64>,
    /// The pair served expires within the expiry warning (`--expiry-warning-days`): its renewal
    /// is overdue.
    pub expiring_soon: bool,
    pub served_fingerprints: Vec<Arc<str>>,
    /// Validity of the certificate sozu serves (the one expiring first, when sozu serves
    /// several), Unix seconds; absent when the agent never read it (sozu held it before the
    /// agent started and the agent has not replaced it).
    pub served_not_before: Option<i64>,
    pub served_not_after: Option<i64>,
    /// The issuer (distinguished name) of the pair on disk's leaf.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_issuer: Option<Arc<str>>,
    pub error: Option<String>,
    /// Why the pair on disk was refused, as a stable name (see `CertError::reason`).
    pub error_reason: Option<String>,
    /// Names of the pair on disk besides the host's own (another route host, a wildcard): sozu
    /// is told the host's name alone, so the pair is served for this host only. For a pair of
    /// `certificates`, the names it has besides the route hosts it serves.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub other_names: Vec<String>,
    /// The certificate file of the pair of `certificates` the host's certificate is read from;
    /// absent for the host's pair in the tls dir.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// Certificates replaced in sozu for this host since the agent started.
    pub rotations: u64,
    /// Unix seconds of the last replacement.
    pub last_rotation: Option<u64>,
}

/// One upstream DNS name, as the DNS source last saw it: the source keeps these, and
/// `/v1/state` and `/metrics` show them as they are.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
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
    /// Resync reads of sozu's state that failed (rotations went on from what the agent knew).
    #[serde(default)]
    pub sozu_read_failures: u64,
    /// Queries resyncs sent to sozu's workers (cluster hashes, clusters by id, served
    /// certificates): each has every worker answer on the thread that serves its traffic. None
    /// while nobody but the agent changes sozu.
    #[serde(default)]
    pub resync_worker_queries: u64,
    /// Resyncs that had sozu's main process list every frontend: only when its census counted
    /// a frontend request the agent did not send, or the agent cannot be sure of its own count.
    #[serde(default)]
    pub resync_frontend_listings: u64,
}

/// With `tls_rotation = 'sozu_managed`: the ACME issuer, per host.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct IssuerStatus {
    /// The ACME directory orders go to.
    pub directory: String,
    /// The account is known to the CA and stored.
    pub account_ready: bool,
    /// Whether the CA offers ACME Renewal Information; unknown until asked.
    pub ari_supported: Option<bool>,
    /// How the configured profile was handled when the CA does not offer it.
    pub profile_note: Option<String>,
    /// A failure that holds back every host (the account, the state directory).
    pub last_error: Option<String>,
    pub hosts: BTreeMap<String, HostStatus>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HostStatus {
    /// `valid` (served, renewal scheduled), `ordering`, `waiting` (no certificate yet, an order
    /// held back) or `backing_off`.
    pub state: String,
    pub fingerprint: Option<String>,
    /// notAfter of the certificate in hand, Unix seconds.
    pub valid_until: Option<i64>,
    /// When it is to be renewed, Unix seconds, and why then.
    pub renewal_due: Option<i64>,
    pub renewal_basis: Option<RenewalBasis>,
    /// Orders placed since the agent started.
    pub orders_placed: u64,
    pub certificates_issued: u64,
    /// Failed orders since the agent started, by reason.
    pub orders_failed: BTreeMap<String, u64>,
    pub backoff: Option<Backoff>,
    pub last_error: Option<String>,
    /// How long the last successful order took, from placing it to the validated chain.
    pub last_order_seconds: Option<f64>,
}

/// No order for a host before `until`, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Backoff {
    pub reason: String,
    /// Unix seconds.
    pub until: i64,
    /// Consecutive failures so far (0 for a rate limit reached without a failure).
    pub failures: u32,
}

/// Why a renewal is due when it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RenewalBasis {
    /// Inside the CA's renewal window (ARI).
    Ari,
    /// At a fraction of the certificate's lifetime.
    Lifetime,
}

impl std::fmt::Display for RenewalBasis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RenewalBasis::Ari => "ari",
            RenewalBasis::Lifetime => "lifetime",
        })
    }
}

/// One thing the agent did or saw, as `/v1/events` streams it (Server-Sent Events: `id:` is
/// [`Event::id`], `event:` is [`Event::kind`], `data:` this record as one line of JSON). Like
/// `/v1/state`, the field names are public interface. Never a key, a credential or a users
/// file's line: only names, fingerprints, counts and the agent's own messages.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Event {
    /// Increasing by one from 1 since the agent started: a client that reconnects sends the
    /// last it saw (`Last-Event-ID`) and gets only what came after.
    pub id: u64,
    /// When, RFC 3339 in UTC to the millisecond.
    pub time: String,
    pub kind: EventKind,
    /// The route host it concerns, where there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// It reports something wrong (a refusal, a backend down, a route in error, sozu
    /// unreachable): `top` shows it in red and among a route's last errors.
    #[serde(default)]
    pub problem: bool,
    /// What happened and why, in a sentence.
    pub message: String,
}

/// What an [`Event`] is about: its SSE `event:` type.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// A new certificate is served for a host (sozu's certificate was replaced, or a first one
    /// added).
    CertificateRotated,
    /// A host's pair on disk was refused (the last good one keeps serving), with its reason.
    PairRefused,
    /// A host's pair on disk is valid again after a refusal.
    PairAccepted,
    /// A workspace edit was evaluated and applied.
    WorkspaceAccepted,
    /// A workspace edit was rejected: the last good workspace stays live.
    WorkspaceRejected,
    /// Something changed behind the agent's back in sozu, and the agent put it back.
    DriftRepaired,
    /// An upstream name's addresses changed.
    DnsChanged,
    /// sozu reported a backend up, or down.
    BackendUp,
    BackendDown,
    /// A route's state changed (`ok`, `pending`, `error`), with its last error.
    RouteState,
    /// The agent became ready, or stopped being ready.
    Readiness,
    /// sozu could not be reached, or was reached again.
    Sozu,
    /// With `'sozu_managed`: a host's ACME order moved (ordering, issued, backing off).
    AcmeOrder,
    /// A client-certificate CA or CRL file was refused, or sozu refused the set.
    ClientAuth,
}

impl EventKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::CertificateRotated => "certificate_rotated",
            EventKind::PairRefused => "pair_refused",
            EventKind::PairAccepted => "pair_accepted",
            EventKind::WorkspaceAccepted => "workspace_accepted",
            EventKind::WorkspaceRejected => "workspace_rejected",
            EventKind::DriftRepaired => "drift_repaired",
            EventKind::DnsChanged => "dns_changed",
            EventKind::BackendUp => "backend_up",
            EventKind::BackendDown => "backend_down",
            EventKind::RouteState => "route_state",
            EventKind::Readiness => "readiness",
            EventKind::Sozu => "sozu",
            EventKind::AcmeOrder => "acme_order",
            EventKind::ClientAuth => "client_auth",
        }
    }
}

impl std::fmt::Display for EventKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
