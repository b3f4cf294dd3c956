//! The level-triggered loop: whatever happened (the workspace changed, DNS answers changed, sozu
//! restarted, a timer fired), recompute the desired state from the latest inputs and apply the
//! difference. Triggers coalesce and one reconcile runs at a time.
//!
//! The loop is generic over [`Proxy`], [`Resolve`] and [`LoadWorkspace`], so its timing and its
//! recovery are tested against in-memory fakes with paused time; `run` wires the real ones.
//!
//! What sozu holds is read from sozu itself at start, after any reconnect, when its workers
//! change, and on every periodic resync; in between, a shadow copy advances with each request
//! that succeeded.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::net::IpAddr;
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use serde::Serialize;
use tokio::sync::mpsc::UnboundedReceiver;

use crate::desired::{self, Held};
use crate::plan::{self, Op};
use crate::state::{Actual, Certificate};
use crate::workspace::{Upstream, Workspace};

/// What sozu is to the loop.
pub trait Proxy: Send {
    /// An identifier of the sozu the proxy talks to: it changes when sozu restarts (a new
    /// connection, new worker processes), and then the state must be read again.
    fn generation(&mut self) -> impl Future<Output = Result<String, String>> + Send;
    fn read_state(&mut self) -> impl Future<Output = Result<Actual, String>> + Send;
    /// Sends `ops` (see [`plan::send_in_phases`]) and says what became of each.
    fn apply(&mut self, ops: Vec<Op>) -> impl Future<Output = Vec<plan::Outcome>> + Send;
}

/// Name resolution for DNS upstreams.
pub trait Resolve: Send + Sync {
    fn resolve(&self, name: &str) -> impl Future<Output = Result<Vec<IpAddr>, String>> + Send;
}

/// Loading the workspace: evaluation with the contract, isolated.
pub trait LoadWorkspace: Send + Sync {
    fn load(&self) -> impl Future<Output = Result<Workspace, String>> + Send;
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Trigger {
    /// The workspace file (or its directory) changed.
    Workspace,
    /// Files in this host's certificate directory changed: only its pair is read again.
    Host(String),
    /// Time to re-resolve upstream names.
    Dns,
    /// Periodic full resync (re-read sozu's state and every pair, and repair drift), or sozu's
    /// socket changed.
    Resync,
    /// The file watcher lost events (its queue overflowed): a resync, counted apart.
    Overflow,
}

#[derive(Debug, Clone)]
pub struct Settings {
    /// Overrides the workspace's `tls_dir`.
    pub tls_dir: Option<std::path::PathBuf>,
    /// Re-read sozu's state and repair drift this often; `None` disables.
    pub resync: Option<Duration>,
    /// Re-resolve upstream names this often.
    pub dns_interval: Duration,
    /// Retry after a failed reconcile, doubling up to `retry_max`.
    pub retry_min: Duration,
    pub retry_max: Duration,
    /// A served certificate with less than this left is flagged (status, metric, one log line).
    pub expiry_warning: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            tls_dir: None,
            resync: Some(Duration::from_secs(60)),
            dns_interval: Duration::from_secs(30),
            retry_min: Duration::from_millis(100),
            retry_max: Duration::from_secs(5),
            expiry_warning: Duration::from_secs(14 * 86_400),
        }
    }
}

/// The agent's own view, served on `/v1/state` and read by `private-ingress status`.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize, PartialEq)]
pub struct Status {
    pub ready: bool,
    pub workspace: WorkspaceStatus,
    pub sozu: SozuStatus,
    pub routes: Vec<RouteStatus>,
    pub counters: Counters,
    /// The ACME issuer's view per host, with `tls_rotation = 'sozu_managed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issuer: Option<crate::acme::IssuerStatus>,
}

#[derive(Debug, Clone, Default, Serialize, serde::Deserialize, PartialEq)]
pub struct WorkspaceStatus {
    pub loaded: bool,
    pub zone: Option<String>,
    /// Why the latest edit was not applied (the last good workspace keeps serving).
    pub last_error: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, serde::Deserialize, PartialEq)]
pub struct SozuStatus {
    pub connected: bool,
    pub generation: Option<String>,
    pub last_error: Option<String>,
    /// Unix seconds of the last reconcile that left sozu equal to the desired state.
    pub last_converged: Option<u64>,
}

#[derive(Debug, Clone, Default, Serialize, serde::Deserialize, PartialEq)]
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
    /// `ok`, `pending` (waiting for a certificate or an address) or `error`.
    pub state: String,
    pub last_error: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, serde::Deserialize, PartialEq)]
pub struct CertificateStatus {
    pub disk_fingerprint: Option<String>,
    pub disk_not_before: Option<i64>,
    pub disk_not_after: Option<i64>,
    /// The pair served expires within the expiry warning (`--expiry-warning-days`): its renewal
    /// is overdue.
    pub expiring_soon: bool,
    pub served_fingerprints: Vec<String>,
    pub error: Option<String>,
    /// Why the pair on disk was refused, as a stable name (see `CertError::reason`).
    pub error_reason: Option<String>,
    /// Certificates replaced in sozu for this host since the agent started.
    pub rotations: u64,
    /// Unix seconds of the last replacement.
    pub last_rotation: Option<u64>,
}

#[derive(Debug, Clone, Default, Serialize, serde::Deserialize, PartialEq)]
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
    /// Full resyncs: every pair and sozu's state read again (periodic, sozu restarted, or after
    /// the watcher lost events).
    pub resyncs: u64,
    /// Times the file watcher's queue overflowed and events were lost.
    pub watch_overflows: u64,
}

pub type SharedStatus = Arc<RwLock<Status>>;

/// The loop's memory between reconciles.
pub struct Agent<P, R, L> {
    proxy: P,
    resolver: R,
    loader: L,
    settings: Settings,
    status: SharedStatus,
    workspace: Option<Workspace>,
    resolved: BTreeMap<String, Vec<IpAddr>>,
    dns_errors: BTreeMap<String, String>,
    shadow: Option<Actual>,
    generation: Option<String>,
    /// Refusals of the last pass, by host or cluster id.
    route_errors: BTreeMap<String, String>,
    /// The current failure of each host's pair on disk (message, reason), so each is logged and
    /// counted once, and shown until fixed.
    cert_failures: BTreeMap<String, (String, &'static str)>,
    /// Fingerprints already warned about as close to expiry.
    expiry_warned: BTreeSet<String>,
    /// Replacements per host: (count, Unix seconds of the last).
    rotations: BTreeMap<String, (u64, u64)>,
    /// The last pair of each host that loaded and validated: it keeps serving while the files on
    /// disk are missing, half-written or invalid.
    last_good: BTreeMap<String, Certificate>,
    /// Where to announce the effective tls dir, so its host directories get watched.
    tls_dir_updates: Option<(
        tokio::sync::mpsc::UnboundedSender<std::path::PathBuf>,
        Option<std::path::PathBuf>,
    )>,
    /// Where to publish each newly loaded workspace (the ACME issuer follows it).
    workspace_updates: Option<tokio::sync::watch::Sender<Option<Arc<Workspace>>>>,
    counters: Counters,
}

impl<P: Proxy, R: Resolve, L: LoadWorkspace> Agent<P, R, L> {
    pub fn new(proxy: P, resolver: R, loader: L, settings: Settings, status: SharedStatus) -> Self {
        Agent {
            proxy,
            resolver,
            loader,
            settings,
            status,
            workspace: None,
            resolved: BTreeMap::new(),
            dns_errors: BTreeMap::new(),
            shadow: None,
            generation: None,
            route_errors: BTreeMap::new(),
            last_good: BTreeMap::new(),
            cert_failures: BTreeMap::new(),
            expiry_warned: BTreeSet::new(),
            rotations: BTreeMap::new(),
            tls_dir_updates: None,
            workspace_updates: None,
            counters: Counters::default(),
        }
    }

    /// Publishes every newly loaded workspace on `updates`.
    pub fn publish_workspace(
        mut self,
        updates: tokio::sync::watch::Sender<Option<Arc<Workspace>>>,
    ) -> Self {
        self.workspace_updates = Some(updates);
        self
    }

    /// Announces the effective tls dir (the flag's, else the workspace's) on `updates` whenever it
    /// changes.
    pub fn announce_tls_dir(
        mut self,
        updates: tokio::sync::mpsc::UnboundedSender<std::path::PathBuf>,
    ) -> Self {
        self.tls_dir_updates = Some((updates, None));
        self
    }

    /// Runs until `triggers` closes. Returns the proxy so that the caller can reuse it.
    pub async fn run(mut self, mut triggers: UnboundedReceiver<Trigger>) -> P {
        let mut pending: BTreeSet<Trigger> = BTreeSet::from([Trigger::Workspace, Trigger::Dns]);
        let mut retry = self.settings.retry_min;
        let mut next_dns = tokio::time::Instant::now() + self.settings.dns_interval;
        let mut next_resync = self
            .settings
            .resync
            .map(|d| tokio::time::Instant::now() + d);
        loop {
            if !pending.is_empty() {
                let ok = self.reconcile(std::mem::take(&mut pending)).await;
                if ok {
                    retry = self.settings.retry_min;
                } else {
                    // Level-triggered: the retry recomputes everything, so no reason is lost.
                    let wait = tokio::time::sleep(retry);
                    retry = (retry * 2).min(self.settings.retry_max);
                    tokio::select! {
                        _ = wait => { pending.insert(Trigger::Resync); continue; }
                        t = triggers.recv() => match t {
                            Some(t) => { pending.insert(t); pending.insert(Trigger::Resync); continue; }
                            None => return self.proxy,
                        },
                    }
                }
            }
            let resync_at = next_resync
                .unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(86_400 * 365));
            tokio::select! {
                t = triggers.recv() => match t {
                    Some(t) => {
                        pending.insert(t);
                        // Coalesce whatever else is already queued.
                        while let Ok(t) = triggers.try_recv() {
                            pending.insert(t);
                        }
                    }
                    None => return self.proxy,
                },
                _ = tokio::time::sleep_until(next_dns) => {
                    pending.insert(Trigger::Dns);
                    next_dns = tokio::time::Instant::now() + self.settings.dns_interval;
                }
                _ = tokio::time::sleep_until(resync_at), if next_resync.is_some() => {
                    pending.insert(Trigger::Resync);
                    next_resync = self.settings.resync.map(|d| tokio::time::Instant::now() + d);
                }
            }
        }
    }

    /// One pass: bring inputs up to date, then sozu. Returns true when sozu ended equal to the
    /// desired state (routes held back for a missing certificate do not count as failure).
    ///
    /// What is read again depends on why: a host's directory event re-reads that host's pair
    /// only, and skips asking sozu whether it restarted (a restart is a socket event and a
    /// [`Trigger::Resync`] of its own; a broken connection on the way is noticed anyway), so a
    /// rotation costs one read, one validation and one request.
    pub async fn reconcile(&mut self, reasons: BTreeSet<Trigger>) -> bool {
        self.counters.reconciles += 1;
        let overflow = reasons.contains(&Trigger::Overflow);
        let resync = overflow || reasons.contains(&Trigger::Resync);
        if overflow {
            self.counters.watch_overflows += 1;
        }
        if resync {
            self.counters.resyncs += 1;
            self.shadow = None;
        }
        let workspace_changed = reasons.contains(&Trigger::Workspace) || self.workspace.is_none();
        if workspace_changed {
            self.reload_workspace().await;
        }
        let Some(workspace) = self.workspace.clone() else {
            self.publish(None, &BTreeMap::new(), false);
            return false;
        };
        if reasons.contains(&Trigger::Dns) || workspace_changed {
            self.resolve_upstreams(&workspace).await;
        }

        let tls_dir = self
            .settings
            .tls_dir
            .clone()
            .unwrap_or_else(|| workspace.tls_dir.clone());
        let mut tls_dir_changed = false;
        if let Some((updates, last)) = &mut self.tls_dir_updates {
            if last.as_ref() != Some(&tls_dir) {
                let absolute = std::path::absolute(&tls_dir).unwrap_or_else(|_| tls_dir.clone());
                let _ = updates.send(absolute);
                *last = Some(tls_dir.clone());
                tls_dir_changed = true;
            }
        }
        let hosts: BTreeSet<&str> = workspace.routes.iter().map(|r| r.host.as_str()).collect();
        let every_host = resync || workspace_changed || tls_dir_changed;
        let to_read: Vec<&str> = if every_host {
            hosts.iter().copied().collect()
        } else {
            reasons
                .iter()
                .filter_map(|r| match r {
                    Trigger::Host(host) => hosts.get(host.as_str()).copied(),
                    _ => None,
                })
                .collect()
        };
        let started = std::time::Instant::now();
        self.read_certificates(&tls_dir, &to_read);
        tracing::debug!(
            hosts = to_read.len(),
            elapsed_ms = started.elapsed().as_secs_f64() * 1e3,
            "certificate pairs read"
        );
        self.last_good
            .retain(|host, _| hosts.contains(host.as_str()));
        self.cert_failures
            .retain(|host, _| hosts.contains(host.as_str()));
        self.warn_expiring();
        let started = std::time::Instant::now();
        let (want, held) = desired::build(&workspace, &self.resolved, &self.last_good);
        step_took(started, "desired state built");

        let only_certificates = reasons.iter().all(|r| matches!(r, Trigger::Host(_)));
        let sent_before = self.counters.sozu_requests;
        let converged = match self.sync(&want, !only_certificates).await {
            Ok(()) => true,
            Err(e) => {
                self.counters.reconcile_errors += 1;
                let mut status = self.status.write().unwrap_or_else(|p| p.into_inner());
                status.sozu.last_error = Some(e.clone());
                drop(status);
                tracing::warn!(error = %e, "reconcile failed; retrying");
                false
            }
        };
        drop(want);
        let ready = converged && held.is_empty() && self.dns_pending(&workspace).is_empty();
        let started = std::time::Instant::now();
        self.publish(Some(&workspace), &held, ready);
        step_took(started, "status published");
        if converged {
            let mut status = self.status.write().unwrap_or_else(|p| p.into_inner());
            status.sozu.last_error = None;
            status.sozu.last_converged = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .ok()
                .map(|d| d.as_secs());
        }
        // Last, once readiness is published: returning pages is not worth a later /readyz.
        if self.counters.sozu_requests - sent_before >= BULK_REQUESTS {
            let started = std::time::Instant::now();
            crate::memory::release_freed_memory();
            step_took(started, "freed memory returned");
        }
        converged
    }

    /// Reads and validates the pairs of `hosts`. A valid pair becomes the host's last good one; a
    /// refused pair leaves the last good one serving and is reported until fixed, logged and
    /// counted once per distinct failure rather than once per pass.
    fn read_certificates(&mut self, tls_dir: &std::path::Path, hosts: &[&str]) {
        let now = unix_now();
        for (host, loaded) in load_pairs(tls_dir, hosts, now) {
            match loaded {
                Ok(c) => {
                    if self.cert_failures.remove(host).is_some() {
                        tracing::info!(host, "certificate pair valid again");
                    }
                    self.last_good.insert(host.to_owned(), c);
                }
                Err(e) => {
                    let message = e.to_string();
                    if self.cert_failures.get(host).map(|(m, _)| m) != Some(&message) {
                        tracing::warn!(host, reason = e.reason(), error = %message,
                            kept_serving = self.last_good.contains_key(host),
                            "certificate pair refused");
                        self.counters.certificate_errors += 1;
                        *self
                            .counters
                            .certificate_errors_by_reason
                            .entry(e.reason().to_owned())
                            .or_default() += 1;
                    }
                    self.cert_failures
                        .insert(host.to_owned(), (message, e.reason()));
                }
            }
        }
    }

    /// Logs once per certificate that it is served with less than the expiry warning left.
    fn warn_expiring(&mut self) {
        let now = unix_now();
        let mut flagged = BTreeSet::new();
        for (host, c) in &self.last_good {
            if !self.expiring_soon(c, now) {
                continue;
            }
            if !self.expiry_warned.contains(&c.fingerprint) {
                tracing::warn!(host, fingerprint = %c.fingerprint, not_after = c.not_after,
                    "the certificate served expires soon; its renewal is overdue");
            }
            flagged.insert(c.fingerprint.clone());
        }
        self.expiry_warned = flagged;
    }

    fn expiring_soon(&self, certificate: &Certificate, now: i64) -> bool {
        let left = certificate.not_after.saturating_sub(now);
        left < i64::try_from(self.settings.expiry_warning.as_secs()).unwrap_or(i64::MAX)
    }

    async fn reload_workspace(&mut self) {
        let started = std::time::Instant::now();
        let loaded = self.loader.load().await;
        step_took(started, "workspace evaluated");
        match loaded {
            Ok(ws) => {
                if self.workspace.as_ref() != Some(&ws) {
                    tracing::info!(routes = ws.routes.len(), zone = %ws.zone, "workspace loaded");
                    if let Some(updates) = &self.workspace_updates {
                        updates.send_replace(Some(Arc::new(ws.clone())));
                    }
                }
                self.workspace = Some(ws);
                let mut status = self.status.write().unwrap_or_else(|p| p.into_inner());
                status.workspace.last_error = None;
            }
            Err(e) => {
                self.counters.workspace_errors += 1;
                tracing::error!(diagnostic = %e, "workspace rejected; the last good one stays live");
                let mut status = self.status.write().unwrap_or_else(|p| p.into_inner());
                status.workspace.last_error = Some(e);
            }
        }
    }

    async fn resolve_upstreams(&mut self, workspace: &Workspace) {
        let names = desired::upstream_names(workspace);
        self.resolved.retain(|name, _| names.contains(name));
        self.dns_errors.retain(|name, _| names.contains(name));
        for name in names {
            match self.resolver.resolve(&name).await {
                Ok(mut addresses) if !addresses.is_empty() => {
                    addresses.sort();
                    addresses.dedup();
                    self.resolved.insert(name.clone(), addresses);
                    self.dns_errors.remove(&name);
                }
                // A failed lookup keeps the last known addresses.
                Ok(_) => {
                    self.counters.dns_failures += 1;
                    self.dns_errors.insert(name, "no addresses".into());
                }
                Err(e) => {
                    self.counters.dns_failures += 1;
                    self.dns_errors.insert(name, e);
                }
            }
        }
    }

    fn dns_pending(&self, workspace: &Workspace) -> Vec<String> {
        desired::upstream_names(workspace)
            .into_iter()
            .filter(|n| !self.resolved.contains_key(n))
            .collect()
    }

    /// Brings sozu to `want`: re-reads its state when it is new to us, plans, applies. With
    /// `check_generation` false, a shadow in hand is trusted without asking sozu first.
    async fn sync(
        &mut self,
        want: &crate::state::Desired,
        check_generation: bool,
    ) -> Result<(), String> {
        if check_generation || self.shadow.is_none() || self.generation.is_none() {
            let started = std::time::Instant::now();
            self.check_generation().await?;
            step_took(started, "sozu's generation checked");
        }
        let mut shadow = match self.shadow.take() {
            Some(s) => s,
            None => {
                let started = std::time::Instant::now();
                let state = self.proxy.read_state().await?;
                step_took(started, "sozu's state read");
                state
            }
        };
        let started = std::time::Instant::now();
        let ops = plan::plan(&shadow, want);
        step_took(started, "changes planned");
        if ops.is_empty() {
            self.shadow = Some(shadow);
            return Ok(());
        }
        tracing::info!(requests = ops.len(), summary = ?plan::summary(&ops), "applying changes to sozu");
        let started = std::time::Instant::now();
        let outcomes = self.proxy.apply(ops.clone()).await;
        tracing::debug!(
            requests = ops.len(),
            elapsed_ms = started.elapsed().as_secs_f64() * 1e3,
            "changes sent"
        );
        let mut failures = Vec::new();
        let mut broken = false;
        self.route_errors.clear();
        for (op, outcome) in ops.iter().zip(&outcomes) {
            match outcome {
                plan::Outcome::Applied => {
                    self.counters.sozu_requests += 1;
                    plan::apply(&mut shadow, op);
                    if let Op::ReplaceCertificate { certificate, .. } = op {
                        let now = SystemTime::now()
                            .duration_since(SystemTime::UNIX_EPOCH)
                            .map_or(0, |d| d.as_secs());
                        for name in certificate.names.iter() {
                            let entry = self.rotations.entry(name.clone()).or_default();
                            entry.0 += 1;
                            entry.1 = now;
                        }
                        tracing::info!(fingerprint = %certificate.fingerprint, names = ?certificate.names, "certificate replaced");
                    }
                }
                plan::Outcome::Refused(reason) => {
                    self.counters.sozu_requests += 1;
                    let message = format!("{}: {reason}", op.describe());
                    for key in plan::concerns(op) {
                        self.route_errors.insert(key, message.clone());
                    }
                    failures.push(message);
                }
                plan::Outcome::Skipped => {}
                plan::Outcome::NotSent(reason) => {
                    if !broken {
                        failures.push(format!("{}: {reason}", op.describe()));
                    }
                    broken = true;
                }
            }
        }
        if broken {
            // The connection broke: whoever answers next may be a new sozu; read it again.
            self.generation = None;
        } else {
            self.shadow = Some(shadow);
        }
        match failures.first() {
            None => Ok(()),
            Some(first) if failures.len() == 1 => Err(first.clone()),
            Some(first) => Err(format!("{first} (and {} more)", failures.len() - 1)),
        }
    }

    /// Asks sozu who it is; a new generation drops the shadow, so its state is read again.
    async fn check_generation(&mut self) -> Result<(), String> {
        let generation = self.proxy.generation().await?;
        if self.generation.as_ref() != Some(&generation) {
            if self.generation.is_some() {
                tracing::info!(%generation, "sozu changed; reading its state again");
                self.counters.sozu_reconnects += 1;
            }
            self.shadow = None;
            self.generation = Some(generation.clone());
            let mut status = self.status.write().unwrap_or_else(|p| p.into_inner());
            status.sozu.generation = Some(generation);
            status.sozu.connected = true;
        }
        Ok(())
    }

    fn publish(&self, workspace: Option<&Workspace>, held: &BTreeMap<String, Held>, ready: bool) {
        let now = unix_now();
        let https = workspace.map(|w| w.listeners.https);
        let sozu_error = self
            .status
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .sozu
            .last_error
            .clone();
        let served = self
            .shadow
            .as_ref()
            .zip(https)
            .and_then(|(shadow, address)| shadow.certificates.get(&address))
            .map(|held| held.by_name());
        // Built before taking the lock: readers of /readyz and /v1/state wait on it.
        let routes = workspace
            .map(|w| &w.routes[..])
            .unwrap_or_default()
            .iter()
            .map(|route| {
                let backends_desired: Vec<String> = match &route.upstream {
                    Upstream::Dns { name, port } => self
                        .resolved
                        .get(name)
                        .into_iter()
                        .flatten()
                        .map(|ip| std::net::SocketAddr::new(*ip, *port).to_string())
                        .collect(),
                    other => vec![other.to_string()],
                };
                let backends_actual: Vec<String> = self
                    .shadow
                    .as_ref()
                    .and_then(|s| s.backends.get(&route.id))
                    .map(|b| {
                        b.values()
                            .map(|b| match &b.unix_path {
                                Some(p) => format!("unix://{}", p.display()),
                                None => b.address.to_string(),
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                let disk = self.last_good.get(&route.host);
                let served_fingerprints = served
                    .iter()
                    .flat_map(|served| served.named(&route.host))
                    .map(|(fingerprint, _)| fingerprint.to_owned())
                    .collect();
                let dns_error = match &route.upstream {
                    Upstream::Dns { name, .. } => self
                        .dns_errors
                        .get(name)
                        .map(|e| format!("resolving {name}: {e}")),
                    _ => None,
                };
                let cert_error = self.cert_failures.get(&route.host);
                let rotation = self.rotations.get(&route.host);
                let refused = self
                    .route_errors
                    .get(&route.host)
                    .or_else(|| self.route_errors.get(&route.id))
                    .cloned();
                let last_error = cert_error.map(|(m, _)| m.clone()).or(refused).or(dns_error);
                let state = if held.contains_key(&route.id) || backends_desired.is_empty() {
                    "pending"
                } else if last_error.is_some()
                    || (self.route_errors.is_empty() && sozu_error.is_some())
                {
                    "error"
                } else {
                    "ok"
                };
                RouteStatus {
                    id: route.id.clone(),
                    host: route.host.clone(),
                    path_prefix: route.path_prefix.clone(),
                    upstream: route.upstream.to_string(),
                    backends_desired,
                    backends_actual,
                    certificate: CertificateStatus {
                        disk_fingerprint: disk.map(|c| c.fingerprint.clone()),
                        disk_not_before: disk.map(|c| c.not_before),
                        disk_not_after: disk.map(|c| c.not_after),
                        expiring_soon: disk.is_some_and(|c| self.expiring_soon(c, now)),
                        served_fingerprints,
                        error: cert_error.map(|(m, _)| m.clone()),
                        error_reason: cert_error.map(|(_, r)| (*r).to_owned()),
                        rotations: rotation.map_or(0, |r| r.0),
                        last_rotation: rotation.map(|r| r.1),
                    },
                    state: state.into(),
                    last_error,
                }
            })
            .collect();
        let mut status = self.status.write().unwrap_or_else(|p| p.into_inner());
        status.ready = ready;
        status.counters = self.counters.clone();
        status.workspace.loaded = workspace.is_some();
        status.workspace.zone = workspace.map(|w| w.zone.clone());
        status.routes = routes;
    }
}

/// A pass that sent at least this many requests was a bulk one (a start, a restarted sozu, a big
/// edit): the memory it used for the plan and its copies is handed back to the system afterwards.
const BULK_REQUESTS: u64 = 256;

/// Logs at debug how long a step of a pass took: the breakdown the cold-start figures come from.
fn step_took(started: std::time::Instant, step: &str) {
    tracing::debug!(elapsed_ms = started.elapsed().as_secs_f64() * 1e3, "{step}");
}

/// From this many pairs on, reading is spread over threads: parsing and checking a pair is
/// CPU work (about 40 µs), and a cold start reads every route's pair before sending anything.
const PARALLEL_READ_MIN: usize = 64;

/// Loads and validates the pairs of `hosts`, in order. Many pairs (a cold start, a resync) are
/// read on one thread per core; a rotation's one pair stays on the caller's thread.
fn load_pairs<'h>(
    tls_dir: &std::path::Path,
    hosts: &[&'h str],
    now: i64,
) -> Vec<(&'h str, Result<Certificate, crate::certs::CertError>)> {
    let load = |host: &'h str| (host, crate::certs::load(tls_dir, host, now));
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    if hosts.len() < PARALLEL_READ_MIN || threads < 2 {
        return hosts.iter().map(|&h| load(h)).collect();
    }
    let chunk = hosts.len().div_ceil(threads);
    std::thread::scope(|scope| {
        let handles: Vec<_> = hosts
            .chunks(chunk)
            .map(|part| scope.spawn(move || part.iter().map(|&h| load(h)).collect::<Vec<_>>()))
            .collect();
        handles
            .into_iter()
            .zip(hosts.chunks(chunk))
            // A thread that panicked (it should not: loading returns errors) loses nothing:
            // its hosts are read again here.
            .flat_map(|(h, part)| {
                h.join()
                    .unwrap_or_else(|_| part.iter().map(|&h| load(h)).collect())
            })
            .collect()
    })
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    use crate::workspace::Route;

    /// An in-memory sozu: applies operations as sozu would, can fail, and can "restart".
    #[derive(Default)]
    struct FakeSozu {
        actual: Actual,
        generation: u64,
        failures_left: usize,
        down: bool,
    }

    #[derive(Clone, Default)]
    struct Fake(Arc<Mutex<FakeSozu>>);

    impl Proxy for Fake {
        async fn generation(&mut self) -> Result<String, String> {
            let s = self.0.lock().unwrap();
            if s.down {
                return Err("connection refused".into());
            }
            Ok(s.generation.to_string())
        }
        async fn read_state(&mut self) -> Result<Actual, String> {
            Ok(self.0.lock().unwrap().actual.clone())
        }
        async fn apply(&mut self, ops: Vec<Op>) -> Vec<plan::Outcome> {
            plan::send_in_phases(&ops, 1, |_, op| {
                let mut s = self.0.lock().unwrap();
                if s.failures_left > 0 {
                    s.failures_left -= 1;
                    return Err(plan::SendError::Refused("refused".into()));
                }
                plan::apply(&mut s.actual, op);
                Ok(())
            })
        }
    }

    #[derive(Clone, Default)]
    struct FakeDns(Arc<Mutex<BTreeMap<String, Vec<IpAddr>>>>);

    impl Resolve for FakeDns {
        async fn resolve(&self, name: &str) -> Result<Vec<IpAddr>, String> {
            self.0
                .lock()
                .unwrap()
                .get(name)
                .cloned()
                .ok_or_else(|| "NXDOMAIN".into())
        }
    }

    #[derive(Clone)]
    struct FakeWorkspace(Arc<Mutex<Result<Workspace, String>>>);

    impl LoadWorkspace for FakeWorkspace {
        async fn load(&self) -> Result<Workspace, String> {
            self.0.lock().unwrap().clone()
        }
    }

    fn workspace(tls_dir: &std::path::Path, routes: &[(&str, &str)]) -> Workspace {
        let routes = routes
            .iter()
            .map(|(host, name)| Route {
                id: crate::workspace::route_id(host, "/"),
                host: (*host).into(),
                path_prefix: "/".into(),
                upstream: Upstream::Dns {
                    name: (*name).into(),
                    port: 80,
                },
            })
            .collect();
        crate::workspace::test_workspace(tls_dir, routes)
    }

    fn write_cert(tls_dir: &std::path::Path, host: &str) {
        write_cert_expiring_in(tls_dir, host, Duration::from_secs(365 * 86_400));
    }

    fn write_cert_expiring_in(tls_dir: &std::path::Path, host: &str, left: Duration) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec![host.to_owned()]).unwrap();
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap();
        params.not_after = rcgen::date_time_ymd(1970, 1, 1) + now + left;
        let dir = tls_dir.join(host);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("tls.crt"), params.self_signed(&key).unwrap().pem()).unwrap();
        std::fs::write(dir.join("tls.key"), key.serialize_pem()).unwrap();
    }

    /// Fingerprints of the certificates the fake sozu holds for `host`.
    fn served(h: &Harness, host: &str) -> Vec<String> {
        let s = h.sozu.0.lock().unwrap();
        s.actual
            .certificates
            .values()
            .flat_map(|held| {
                held.by_name()
                    .named(host)
                    .map(|(fingerprint, _)| fingerprint.to_owned())
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    fn on_disk(h: &Harness, host: &str) -> String {
        crate::certs::load(&h.tls_dir, host, unix_now())
            .unwrap()
            .fingerprint
    }

    struct Harness {
        sozu: Fake,
        dns: FakeDns,
        ws: FakeWorkspace,
        status: SharedStatus,
        triggers: tokio::sync::mpsc::UnboundedSender<Trigger>,
        _tls: tempfile::TempDir,
        tls_dir: std::path::PathBuf,
    }

    fn start(routes: &[(&str, &str)]) -> Harness {
        let tls = tempfile::tempdir().unwrap();
        let tls_dir = tls.path().to_owned();
        for (host, _) in routes {
            write_cert(&tls_dir, host);
        }
        let dns = FakeDns::default();
        for (_, name) in routes {
            dns.0
                .lock()
                .unwrap()
                .insert((*name).into(), vec!["10.0.0.1".parse().unwrap()]);
        }
        let ws = FakeWorkspace(Arc::new(Mutex::new(Ok(workspace(&tls_dir, routes)))));
        let sozu = Fake::default();
        let status = SharedStatus::default();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let agent = Agent::new(
            sozu.clone(),
            dns.clone(),
            ws.clone(),
            Settings::default(),
            status.clone(),
        );
        tokio::spawn(agent.run(rx));
        Harness {
            sozu,
            dns,
            ws,
            status,
            triggers: tx,
            _tls: tls,
            tls_dir,
        }
    }

    /// Lets the loop run until it has nothing left to do (time is paused: sleeps auto-advance).
    async fn settle() {
        for _ in 0..50 {
            tokio::task::yield_now().await;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
        for _ in 0..50 {
            tokio::task::yield_now().await;
        }
    }

    fn served_hosts(h: &Harness) -> BTreeSet<String> {
        h.sozu
            .0
            .lock()
            .unwrap()
            .actual
            .frontends
            .iter()
            .map(|f| f.hostname.clone())
            .collect()
    }

    fn backends(h: &Harness, id: &str) -> Vec<String> {
        h.sozu
            .0
            .lock()
            .unwrap()
            .actual
            .backends
            .get(id)
            .map(|b| b.values().map(|b| b.address.to_string()).collect())
            .unwrap_or_default()
    }

    #[tokio::test(start_paused = true)]
    async fn converges_and_reports_ready() {
        let h = start(&[("a.in.example.org", "a.svc"), ("b.in.example.org", "b.svc")]);
        settle().await;
        assert_eq!(
            served_hosts(&h),
            BTreeSet::from(["a.in.example.org".into(), "b.in.example.org".into()])
        );
        assert!(h.status.read().unwrap().ready);
        assert_eq!(backends(&h, "pi-a.in.example.org"), ["10.0.0.1:80"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_broken_edit_keeps_the_last_good_workspace_serving() {
        let h = start(&[("a.in.example.org", "a.svc")]);
        settle().await;
        *h.ws.0.lock().unwrap() = Err("syntax error at ws.ncl:3:1".into());
        h.triggers.send(Trigger::Workspace).unwrap();
        settle().await;
        assert_eq!(
            served_hosts(&h),
            BTreeSet::from(["a.in.example.org".into()])
        );
        let status = h.status.read().unwrap().clone();
        assert_eq!(
            status.workspace.last_error.as_deref(),
            Some("syntax error at ws.ncl:3:1")
        );
        // The next good edit applies.
        write_cert(&h.tls_dir, "c.in.example.org");
        h.dns
            .0
            .lock()
            .unwrap()
            .insert("c.svc".into(), vec!["10.0.0.3".parse().unwrap()]);
        *h.ws.0.lock().unwrap() = Ok(workspace(&h.tls_dir, &[("c.in.example.org", "c.svc")]));
        h.triggers.send(Trigger::Workspace).unwrap();
        settle().await;
        assert_eq!(
            served_hosts(&h),
            BTreeSet::from(["c.in.example.org".into()])
        );
        assert!(h.status.read().unwrap().workspace.last_error.is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn new_dns_answers_replace_backends_on_the_next_resolution() {
        let h = start(&[("a.in.example.org", "a.svc")]);
        settle().await;
        h.dns.0.lock().unwrap().insert(
            "a.svc".into(),
            vec!["10.0.0.7".parse().unwrap(), "fd00::7".parse().unwrap()],
        );
        tokio::time::sleep(Duration::from_secs(29)).await;
        settle().await;
        assert_eq!(
            backends(&h, "pi-a.in.example.org"),
            ["10.0.0.1:80"],
            "not before the interval"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
        settle().await;
        assert_eq!(
            backends(&h, "pi-a.in.example.org"),
            ["10.0.0.7:80", "[fd00::7]:80"]
        );
        // A failed lookup keeps the last known addresses.
        h.dns.0.lock().unwrap().clear();
        tokio::time::sleep(Duration::from_secs(31)).await;
        settle().await;
        assert_eq!(
            backends(&h, "pi-a.in.example.org"),
            ["10.0.0.7:80", "[fd00::7]:80"]
        );
        let route = h.status.read().unwrap().routes[0].clone();
        assert!(route.last_error.unwrap().contains("NXDOMAIN"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_restarted_sozu_gets_the_whole_state_back() {
        let h = start(&[("a.in.example.org", "a.svc")]);
        settle().await;
        {
            let mut s = h.sozu.0.lock().unwrap();
            s.actual = Actual::default();
            s.generation += 1;
        }
        h.triggers.send(Trigger::Resync).unwrap();
        settle().await;
        assert_eq!(
            served_hosts(&h),
            BTreeSet::from(["a.in.example.org".into()])
        );
    }

    #[tokio::test(start_paused = true)]
    async fn sozu_down_at_start_and_refusals_are_retried_until_converged() {
        let h = start(&[("a.in.example.org", "a.svc")]);
        h.sozu.0.lock().unwrap().down = true;
        settle().await;
        assert!(served_hosts(&h).is_empty());
        assert!(!h.status.read().unwrap().ready);
        {
            let mut s = h.sozu.0.lock().unwrap();
            s.down = false;
            s.failures_left = 2;
        }
        tokio::time::sleep(Duration::from_secs(10)).await;
        settle().await;
        assert_eq!(
            served_hosts(&h),
            BTreeSet::from(["a.in.example.org".into()])
        );
        assert!(h.status.read().unwrap().ready);
    }

    #[tokio::test(start_paused = true)]
    async fn a_periodic_resync_repairs_drift() {
        let h = start(&[("a.in.example.org", "a.svc")]);
        settle().await;
        // Someone removes a frontend behind the agent's back, same sozu.
        h.sozu.0.lock().unwrap().actual.frontends.clear();
        tokio::time::sleep(Duration::from_secs(61)).await;
        settle().await;
        assert_eq!(
            served_hosts(&h),
            BTreeSet::from(["a.in.example.org".into()])
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_host_event_rotates_its_pair_and_a_lost_event_is_caught_by_the_resync() {
        let (a, b) = ("a.in.example.org", "b.in.example.org");
        let h = start(&[(a, "a.svc"), (b, "b.svc")]);
        settle().await;
        write_cert(&h.tls_dir, a);
        h.triggers.send(Trigger::Host(a.into())).unwrap();
        settle().await;
        assert_eq!(served(&h, a), [on_disk(&h, a)], "exactly the new one");

        // b's files change, but the watcher overflowed and its event was lost.
        write_cert(&h.tls_dir, b);
        h.triggers.send(Trigger::Overflow).unwrap();
        settle().await;
        assert_eq!(served(&h, b), [on_disk(&h, b)]);
        let status = h.status.read().unwrap().clone();
        assert_eq!(status.counters.watch_overflows, 1);
        assert_eq!(status.counters.resyncs, 1);
        let rotated: Vec<u64> = status
            .routes
            .iter()
            .map(|r| r.certificate.rotations)
            .collect();
        assert_eq!(rotated, [1, 1]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_pair_close_to_expiry_is_served_and_flagged() {
        let (a, b) = ("a.in.example.org", "b.in.example.org");
        let h = start(&[(a, "a.svc"), (b, "b.svc")]);
        write_cert_expiring_in(&h.tls_dir, a, Duration::from_secs(3 * 86_400));
        settle().await;
        assert_eq!(served(&h, a), [on_disk(&h, a)]);
        let status = h.status.read().unwrap().clone();
        assert!(status.ready);
        let flags: Vec<(String, bool)> = status
            .routes
            .iter()
            .map(|r| (r.host.clone(), r.certificate.expiring_soon))
            .collect();
        assert_eq!(flags, [(a.into(), true), (b.into(), false)]);
    }
}
