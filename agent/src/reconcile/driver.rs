//! The loop: facts in, timers, the error policy, one pass at a time.
//!
//! | what happens | what the next pass does |
//! |---|---|
//! | the workspace changed | plans the routes that differ, after asking sozu who it is |
//! | a DNS answer changed | plans the clusters of the name's routes, after asking sozu who it is |
//! | a host's pair changed | plans that host alone, trusting the shadow without asking sozu first: a rotation costs one request, whatever the number of routes |
//! | sozu's socket came or went | asks sozu who it is; reads its state again, and plans everything, if it is a new sozu |
//! | resync (`--resync-interval`) | nothing at once: sozu's state is read beside the loop and every pair again; once read, plans only what differs from the shadow ([`super::resync`]) |
//! | sozu could not be reached | nothing until the back-off ends (a new socket, or a sozu listening at a socket not tried yet, ends it early); facts keep arriving meanwhile |
//! | a request was refused | only that request and what depends on it wait for their retry, which plans their hosts and clusters |
//! | a served certificate enters its expiry warning | only the status changes |

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc::UnboundedReceiver;
use tokio::time::Instant;

use super::backends::{BackendTracker, Drift, Ledger};
use super::model::Model;
use super::pass::PassOutcome;
use super::publish::Dirty;
use super::readiness::Stalled;
use super::resync::{self, Reading};
use super::retry_policy::{Backoff, Refusals};
use super::sync::SozuSync;
use super::trackers::{CertTracker, DnsTracker, PairChange, WorkspaceTracker};
use crate::api::{Heartbeat, SharedStatus};
use crate::api::{RouteKey, RouteView};
use crate::clock::Clock;
use crate::document::{Counters, ReadinessMode};
use crate::plan::edit::{Edit, RouteIndex};
use crate::plan::Scope;
use crate::sources::sozu_events::SozuEvent;
use crate::sources::{CertSource, Fact};
use crate::sozu::Proxy;
use crate::workspace::Workspace;

#[derive(Debug, Clone)]
pub struct Settings {
    /// Re-read sozu's state and every pair, and repair drift, this often; `None` disables.
    pub resync: Option<Duration>,
    /// After sozu could not be reached: the first wait, its ceiling, and how long sozu must stay
    /// reachable before the waits start again from the first.
    pub retry_min: Duration,
    pub retry_max: Duration,
    pub retry_reset: Duration,
    /// A served certificate with less than this left is flagged (status, metric, one log line).
    pub expiry_warning: Duration,
    /// Seeds the back-off's jitter.
    pub seed: u64,
    /// Whether readiness waits for every route or for those that can be served.
    pub readiness: ReadinessMode,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            resync: Some(Duration::from_secs(60)),
            retry_min: Duration::from_millis(100),
            retry_max: Duration::from_secs(10),
            retry_reset: Duration::from_secs(30),
            expiry_warning: Duration::from_secs(14 * 86_400),
            seed: 0x5eed,
            readiness: ReadinessMode::default(),
        }
    }
}

/// The loop and everything it keeps between passes.
pub struct Agent<P, C> {
    pub(super) settings: Settings,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) sozu: SozuSync<P>,
    pub(super) cert_source: C,
    pub(super) workspace: WorkspaceTracker,
    pub(super) dns: DnsTracker,
    pub(super) certs: CertTracker,
    pub(super) refusals: Refusals,
    /// What sozu's events said of backends, and the changes the agent made that sozu has not
    /// reported yet.
    pub(super) backends: BackendTracker,
    pub(super) ledger: Ledger,
    pub(super) counters: Counters,
    /// The desired state, kept between passes; `None` until the first pass with a workspace.
    pub(super) model: Option<Model>,
    /// The routes' status as last published, and which routes must be built again.
    pub(super) routes: imbl::OrdMap<RouteKey, Arc<RouteView>>,
    pub(super) dirty: Dirty,
    pub(super) churn: Churn,
    /// A bulk pass made the agent's readiness wait: see [`Agent::settle`].
    pub(super) settling: bool,
    /// Whether readiness was last published as ready.
    pub(super) ready: bool,
    /// Why the last pass could not reach sozu.
    pub(super) sozu_error: Option<String>,
    pub(super) last_converged: Option<u64>,
    /// What the workspace asks of a listener that sozu holds otherwise and can only take on a
    /// new listener (a restart of sozu): `<address>: <setting>`.
    pub(super) listeners_need_restart: Vec<String>,
    /// The CA and CRLs of `listeners.client_auth`, as last read good.
    pub(super) client_auth: super::client_auth::ClientAuthTracker,
    /// The basic-auth users files and error pages, as last read good.
    pub(super) policy_files: super::route_policy_files::PolicyFilesTracker,
    pub(super) status: SharedStatus,
    /// Beaten at every turn of the loop: `/healthz` reads it.
    heartbeat: Heartbeat,
    /// What the agent did and why, for `/v1/events`: emitting never waits for a reader.
    pub(super) events: crate::api::events::Events,
    /// With `tls_rotation = 'sozu_managed`: the issuer's progress, the version last read, and
    /// what it had given up on then.
    pub(super) issuer: Option<(super::readiness::SharedIssuerProgress, u64, Stalled)>,
    /// A resync's read of sozu under way beside the loop.
    pub(super) reading: Option<Reading>,
    /// Why the last read of sozu's state failed, until one succeeds.
    pub(super) read_error: Option<String>,
    /// What the edits taken up since the model last took a workspace change, worked out beside
    /// the loop ([`crate::plan::edit`]).
    pub(super) prepared: Option<Prepared>,
}

/// Edits taken up and not yet in the model: what they change from `base`, and the index of
/// the latest, `workspace`.
#[derive(Debug)]
pub struct Prepared {
    pub base: Arc<Workspace>,
    pub scope: Scope,
    pub workspace: Arc<Workspace>,
    pub index: RouteIndex,
}

use crate::sozu::socket::PROBE_EVERY;

/// The loop turns at least this often, facts or not, so that its heartbeat says it is alive.
pub const TICK: Duration = Duration::from_secs(10);

/// What the next pass must do, gathered from facts and timers.
#[derive(Debug, Default)]
pub struct Work {
    /// Recompute and plan everything: a retry after sozu could not be reached.
    pub everything: bool,
    /// The workspace changed: the routes that differ are planned.
    pub workspace: bool,
    /// Hosts whose certificate to serve changed.
    pub hosts: BTreeSet<String>,
    /// Upstream names whose addresses changed.
    pub names: BTreeSet<String>,
    /// Requests sozu refused whose retry time came.
    pub retry: Scope,
    /// Clusters someone else changed in sozu: read again, then planned.
    pub drifted: BTreeSet<String>,
    /// Ask sozu who it is before trusting the shadow.
    pub check_generation: bool,
    /// Read sozu's whole state again (beside the loop when the shadow is known).
    pub resync: bool,
    /// What a resync's read found differing from the shadow: planned like a retry.
    pub differs: Scope,
    /// The client-auth files said something new: the model takes it at the next pass.
    pub client_auth: bool,
    /// The policies' files said something new: the model takes them at the next pass.
    pub policy_files: bool,
    /// Only what is shown changed.
    pub publish: bool,
}

/// Memory handed back after churn. Every renewal allocates a new certificate, its status and its
/// copies, and frees the old ones; glibc keeps what was freed as part of the process's resident
/// memory, spread over its heaps, so a sidecar that renews a thousand certificates would grow by
/// megabytes and stay there. Once churn has quietened down, the freed pages are returned.
#[derive(Debug, Default)]
pub struct Churn {
    /// Pairs taken in and requests sent since the last trim.
    since_trim: usize,
    pub trim_at: Option<Instant>,
}

/// How much churn is worth a trim (a trim costs about a millisecond on a small heap).
const CHURN_TRIM_MIN: usize = 64;
/// How long churn must have stopped before the trim: a mass renewal trims once, at its end.
const CHURN_QUIET: Duration = Duration::from_secs(2);

impl Churn {
    pub fn add(&mut self, n: usize) {
        self.since_trim += n;
        if self.since_trim >= CHURN_TRIM_MIN {
            self.trim_at = Some(Instant::now() + CHURN_QUIET);
        }
    }

    pub fn trim(&mut self) {
        let started = std::time::Instant::now();
        crate::memory::release_freed_memory();
        let elapsed_ms = started.elapsed().as_secs_f64() * 1e3;
        let (in_use, kept) = crate::memory::heap_usage().unwrap_or_default();
        tracing::debug!(
            elapsed_ms,
            churn = self.since_trim,
            heap_in_use_kib = in_use / 1024,
            heap_free_kept_kib = kept / 1024,
            "freed memory returned after churn"
        );
        self.since_trim = 0;
        self.trim_at = None;
    }
}

impl Work {
    fn needs_pass(&self) -> bool {
        self.everything
            || self.workspace
            || !self.hosts.is_empty()
            || !self.names.is_empty()
            || !self.retry.is_empty()
            || !self.drifted.is_empty()
            || self.check_generation
            || self.resync
            || !self.differs.is_empty()
            || self.client_auth
            || self.policy_files
    }

    /// Whether the pass is about certificates alone: it trusts the shadow of sozu's state.
    pub fn certificates_only(&self) -> bool {
        !self.hosts.is_empty()
            && !self.everything
            && !self.workspace
            && self.names.is_empty()
            && self.retry.is_empty()
            && self.drifted.is_empty()
            && !self.check_generation
            && !self.resync
            && self.differs.is_empty()
            && !self.client_auth
            && !self.policy_files
    }
}

impl<P: Proxy, C: CertSource> Agent<P, C> {
    pub fn new(
        proxy: P,
        cert_source: C,
        settings: Settings,
        status: SharedStatus,
        clock: Arc<dyn Clock>,
    ) -> Self {
        let warning = i64::try_from(settings.expiry_warning.as_secs()).unwrap_or(i64::MAX);
        Agent {
            settings,
            clock,
            sozu: SozuSync::new(proxy),
            cert_source,
            workspace: WorkspaceTracker::default(),
            dns: DnsTracker::default(),
            certs: CertTracker::new(warning),
            refusals: Refusals::default(),
            backends: BackendTracker::default(),
            ledger: Ledger::default(),
            counters: Counters::default(),
            model: None,
            routes: imbl::OrdMap::new(),
            dirty: Dirty::default(),
            churn: Churn::default(),
            settling: false,
            ready: false,
            sozu_error: None,
            last_converged: None,
            listeners_need_restart: Vec::new(),
            client_auth: Default::default(),
            policy_files: Default::default(),
            status,
            heartbeat: Heartbeat::default(),
            events: Default::default(),
            issuer: None,
            reading: None,
            read_error: None,
            prepared: None,
        }
    }

    /// Emits what it does and sees on `events` (`/v1/events`).
    pub fn with_events(mut self, events: crate::api::events::Events) -> Self {
        self.events = events;
        self
    }

    /// Readiness asks `issuer` whether a missing pair is still being issued (see
    /// [`super::readiness`]). The loop reads it at each turn, so readiness follows the issuer
    /// giving up on a host within [`TICK`].
    pub fn with_issuer(mut self, issuer: super::readiness::SharedIssuerProgress) -> Self {
        self.issuer = Some((issuer, u64::MAX, Stalled::default()));
        self
    }

    /// Beats `heartbeat` at every turn of the loop.
    pub fn with_heartbeat(mut self, heartbeat: Heartbeat) -> Self {
        self.heartbeat = heartbeat;
        self
    }

    /// Runs until `shutdown` resolves or `facts` closes (every source gone), never in the middle
    /// of a pass. Returns the proxy so that the caller can reuse it.
    pub async fn run(
        mut self,
        mut facts: UnboundedReceiver<Fact>,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> P {
        let mut shutdown = std::pin::pin!(shutdown);
        let mut backoff = Backoff::new(
            self.settings.retry_min,
            self.settings.retry_max,
            self.settings.retry_reset,
            self.settings.seed,
        );
        let mut retry_at: Option<Instant> = None;
        // While a back-off waits: when to look at sozu's socket next.
        let mut probe_at: Option<Instant> = None;
        let mut work = Work::default();
        let mut next_resync = self.settings.resync.map(|d| Instant::now() + d);
        self.publish();
        loop {
            self.heartbeat.beat();
            let never = Instant::now() + Duration::from_secs(86_400 * 365);
            let refusal_at = self.refusals.next_retry();
            let expiry_at = self.next_expiry_flag();
            // Work already taken up (by a settle) is done before waiting for more.
            let pending = work.needs_pass() && retry_at.is_none();
            if !pending {
                tokio::select! {
                    _ = &mut shutdown => return self.sozu.into_proxy(),
                    fact = facts.recv() => {
                        let Some(fact) = fact else {
                            return self.sozu.into_proxy();
                        };
                        // A new socket is the sozu a back-off waits for.
                        if matches!(fact, Fact::SozuSocket) {
                            retry_at = None;
                        }
                        self.absorb(fact, &mut work);
                        // Coalesce whatever else is already queued.
                        self.absorb_queued(&mut facts, &mut work, &mut retry_at);
                    }
                    _ = tokio::time::sleep_until(retry_at.unwrap_or(never)), if retry_at.is_some() => {
                        retry_at = None;
                    }
                    _ = tokio::time::sleep_until(probe_at.unwrap_or(never)),
                        if probe_at.is_some() && retry_at.is_some() => {
                        if self.sozu.listening_again().await {
                            tracing::info!("a sozu listens at a socket the agent has not tried yet; \
                                the back-off ends");
                            retry_at = None;
                        } else {
                            probe_at = Some(Instant::now() + PROBE_EVERY);
                        }
                    }
                    _ = tokio::time::sleep_until(next_resync.unwrap_or(never)), if next_resync.is_some() => {
                        work.resync = true;
                        self.cert_source.reread();
                        next_resync = self.settings.resync.map(|d| Instant::now() + d);
                    }
                    read = Reading::finished(&mut self.reading), if self.reading.is_some() => {
                        if let Some(reading) = self.reading.take() {
                            self.resync_read(reading, read, &mut work);
                        }
                    }
                    _ = tokio::time::sleep_until(refusal_at.unwrap_or(never)),
                        if refusal_at.is_some() && retry_at.is_none() => {
                        work.retry.extend(self.refusals.due(Instant::now()));
                    }
                    _ = tokio::time::sleep_until(expiry_at.unwrap_or(never)), if expiry_at.is_some() => {
                        // The flag is part of each route's status, built again here: a resync
                        // no longer rebuilds every route.
                        self.dirty.all = true;
                        work.publish = true;
                    }
                    _ = tokio::time::sleep_until(self.churn.trim_at.unwrap_or(never)),
                        if self.churn.trim_at.is_some() => {
                        self.churn.trim();
                    }
                    _ = tokio::time::sleep(TICK) => {}
                }
            }
            if let Some((issuer, seen, stalled)) = &mut self.issuer {
                let version = issuer.version();
                if version != *seen {
                    *seen = version;
                    *stalled = issuer.stalled();
                    work.publish = true;
                }
            }
            if retry_at.is_some() {
                continue;
            }
            if std::mem::take(&mut work.resync) {
                self.resync(&mut work);
            }
            if work.needs_pass() {
                match self.pass(std::mem::take(&mut work)).await {
                    PassOutcome::Unreachable => {
                        let wait = backoff.failed();
                        tracing::warn!(
                            error = self.sozu_error.as_deref().unwrap_or_default(),
                            retry_in_ms = wait.as_millis() as u64,
                            "sozu unreachable; retrying"
                        );
                        retry_at = Some(Instant::now() + wait);
                        probe_at = Some(Instant::now() + PROBE_EVERY);
                        // Level-triggered: the retry recomputes everything, so no reason is lost.
                        work.everything = true;
                        work.check_generation = true;
                    }
                    PassOutcome::Done => backoff.succeeded(Instant::now()),
                }
                if self.settling && retry_at.is_none() {
                    self.settle(&mut facts, &mut work, &mut retry_at);
                }
            } else if std::mem::take(&mut work.publish) {
                self.publish();
            }
        }
    }

    /// Ends the start's settling: takes up what queued during its bulk pass, returns the memory
    /// the start freed, and only then publishes a readiness that may say ready.
    ///
    /// sozu reports every change twice on its event stream, so a start at 10,000 routes leaves
    /// some 60,000 reports queued for the loop, and glibc holds the start's freed pages until a
    /// trim walks its heap (3 to 33 ms at that size). Both used to come right after `/readyz`
    /// said 200: the first rotation then waited 20 ms behind them where the others took 3 ms.
    /// The work is the same; it now comes before the readiness that a rollout acts on.
    ///
    /// What was queued may ask for a pass (a pair swapped during the start): that pass comes
    /// first, and the settle after it.
    fn settle(
        &mut self,
        facts: &mut UnboundedReceiver<Fact>,
        work: &mut Work,
        retry_at: &mut Option<Instant>,
    ) {
        let started = std::time::Instant::now();
        let taken = self.absorb_queued(facts, work, retry_at);
        tracing::debug!(
            elapsed_ms = started.elapsed().as_secs_f64() * 1e3,
            facts = taken,
            "facts queued during the bulk pass taken up"
        );
        if work.needs_pass() {
            return;
        }
        self.churn.trim();
        self.settling = false;
        self.publish();
    }

    /// Takes up every fact already queued; returns how many. A new socket is the sozu a back-off
    /// waits for.
    fn absorb_queued(
        &mut self,
        facts: &mut UnboundedReceiver<Fact>,
        work: &mut Work,
        retry_at: &mut Option<Instant>,
    ) -> usize {
        let mut taken = 0;
        while let Ok(fact) = facts.try_recv() {
            if matches!(fact, Fact::SozuSocket) {
                *retry_at = None;
            }
            self.absorb(fact, work);
            taken += 1;
        }
        taken
    }

    /// Takes one fact into the trackers and notes what it asks of the next pass.
    fn absorb(&mut self, fact: Fact, work: &mut Work) {
        match fact {
            Fact::Workspace(Ok(workspace)) => {
                // Not prepared beside the loop (a test's fact): worked out here.
                let edit = Edit::prepare(self.workspace.current.clone(), workspace);
                self.absorb_edit(edit, work);
            }
            Fact::Edit(edit) => {
                let edit = if edit.follows(self.workspace.current.as_ref()) {
                    *edit
                } else {
                    Edit::prepare(self.workspace.current.clone(), edit.workspace)
                };
                self.absorb_edit(edit, work);
            }
            Fact::Workspace(Err(diagnostic)) => {
                let first = diagnostic
                    .lines()
                    .find(|l| !l.trim().is_empty())
                    .unwrap_or("")
                    .to_owned();
                self.workspace.reject(diagnostic, &mut self.counters);
                self.events.emit(
                    crate::document::EventKind::WorkspaceRejected,
                    None,
                    true,
                    format!("workspace edit rejected, the last good one stays live: {first}"),
                );
                work.publish = true;
            }
            Fact::Dns(fact) => {
                let name = fact.name.clone();
                if self.dns.absorb(fact) {
                    self.announce_name(&name);
                    work.names.insert(name.clone());
                }
                self.dirty.names.insert(name);
                work.publish = true;
            }
            Fact::Pairs(pairs) => {
                let started = std::time::Instant::now();
                let count = pairs.len();
                self.churn.add(count);
                for (host, read) in pairs {
                    match self.certs.absorb(&host, read, &mut self.counters) {
                        PairChange::Serve => {
                            work.hosts.insert(host);
                        }
                        PairChange::Shown => {
                            self.dirty.hosts.insert(host);
                            work.publish = true;
                        }
                        PairChange::None => {}
                    }
                }
                // A resync reads every pair again: this is its share of the loop's time.
                tracing::debug!(
                    pairs = count,
                    elapsed_ms = started.elapsed().as_secs_f64() * 1e3,
                    "certificate pairs taken up"
                );
            }
            Fact::ClientAuth(files) => {
                self.client_auth.absorb(*files);
                work.publish = true;
                work.client_auth = true;
            }
            Fact::PolicyFiles(reads) => {
                for (path, reason) in reads
                    .users
                    .iter()
                    .map(|(p, r)| (p, r.as_ref().err()))
                    .chain(reads.pages.iter().map(|(p, r)| (p, r.as_ref().err())))
                    .filter_map(|(p, r)| Some((p, r?)))
                {
                    tracing::warn!(file = %path.display(), %reason,
                        "a policy file is refused; its last good version stays");
                }
                self.policy_files.absorb(*reads);
                work.publish = true;
                work.policy_files = true;
            }
            Fact::SozuSocket => work.check_generation = true,
            Fact::Sozu(event) => self.absorb_event(event, work),
            Fact::WatchOverflow => {
                self.counters.watch_overflows += 1;
                work.publish = true;
            }
        }
    }

    /// Takes one of sozu's events: backend health and drains go to the status; a change the
    /// agent did not make to what it owns is repaired by the next pass.
    fn absorb_event(&mut self, event: SozuEvent, work: &mut Work) {
        let cluster_of = |backend_id: &str| {
            self.model
                .as_ref()
                .and_then(|m| m.cluster_of_backend(backend_id))
        };
        match event {
            SozuEvent::BackendUp { backend_id } => {
                if self.backends.health(&backend_id, true) {
                    self.dirty.clusters.extend(cluster_of(&backend_id));
                }
            }
            SozuEvent::BackendDown { backend_id } => {
                if self.backends.health(&backend_id, false) {
                    self.dirty.clusters.extend(cluster_of(&backend_id));
                }
            }
            SozuEvent::NoAvailableBackends { cluster_id } => {
                self.backends.cluster_available(&cluster_id, false);
                self.dirty.clusters.insert(cluster_id);
            }
            SozuEvent::ClusterRecovered { cluster_id } => {
                self.backends.cluster_available(&cluster_id, true);
                self.dirty.clusters.insert(cluster_id);
            }
            SozuEvent::BackendDrained { backend_id } => {
                if self.backends.drained(&backend_id) {
                    self.dirty.clusters.extend(cluster_of(&backend_id));
                }
            }
            SozuEvent::Changed(change) => match self.ledger.reported(&change, Instant::now()) {
                Drift::None => return,
                Drift::Cluster(id) => {
                    tracing::info!(cluster = %id, change = %change.kind,
                        "a cluster of the agent's changed in sozu behind its back; repairing it");
                    let host = self
                        .model
                        .as_ref()
                        .and_then(|m| m.route_by_id(&id))
                        .map(|r| r.host.clone());
                    self.events.emit(
                        crate::document::EventKind::DriftRepaired,
                        host.as_deref(),
                        false,
                        format!("{id} changed in sozu behind the agent's back ({}): read again and repaired", change.kind),
                    );
                    self.counters.drift_repairs += 1;
                    work.drifted.insert(id);
                }
                Drift::Everything => {
                    tracing::info!(change = %change.kind,
                        "sozu's certificates or state changed behind the agent's back; reading it again");
                    self.events.emit(
                        crate::document::EventKind::DriftRepaired,
                        None,
                        false,
                        format!("sozu's certificates or state changed behind the agent's back ({}): reading it all again", change.kind),
                    );
                    self.counters.drift_repairs += 1;
                    work.resync = true;
                }
            },
            SozuEvent::StreamBroken => {
                self.counters.event_stream_breaks += 1;
                work.check_generation = true;
            }
        }
        work.publish = true;
    }

    /// A new workspace is live: how many routes, and how many came and went.
    /// Takes a workspace that evaluated, with what it changes from the one the loop holds
    /// (`edit` follows it).
    fn absorb_edit(&mut self, edit: Edit, work: &mut Work) {
        let started = std::time::Instant::now();
        let Edit {
            workspace,
            previous,
            same,
            scope,
            added,
            removed,
            upstream_names,
            gone_hosts,
            index,
        } = edit;
        work.publish = true;
        if !self.workspace.take(workspace.clone(), same) {
            return;
        }
        self.announce_workspace(added, removed);
        work.workspace = true;
        // The status of the routes that differ is built again (every route's when what they
        // share changed), here rather than only from the pass's scope: a pass that breaks off
        // after updating the model publishes too.
        self.dirty.scope(&scope);
        // The names are few: those the workspace does not use are dropped. The hosts are as
        // many as the routes: those the previous workspace had and this one has not are
        // forgotten one by one (before the first workspace there are none).
        self.dns.retain(&upstream_names);
        self.certs.forget(&gone_hosts);
        // For the model, while it holds the workspace the scope was worked out against: edits
        // taken up between two passes add up.
        self.prepared = match (self.prepared.take(), previous) {
            (Some(mut prepared), Some(previous)) if Arc::ptr_eq(&prepared.workspace, &previous) => {
                prepared.scope.extend(scope);
                prepared.workspace = workspace;
                prepared.index = index;
                Some(prepared)
            }
            (_, Some(base)) => Some(Prepared {
                base,
                scope,
                workspace,
                index,
            }),
            (_, None) => None,
        };
        super::pass::step_took(started, "workspace edit taken up");
    }

    fn announce_workspace(&self, added: usize, removed: usize) {
        let Some(workspace) = &self.workspace.current else {
            return;
        };
        let now = workspace.routes.len();
        self.events.emit(
            crate::document::EventKind::WorkspaceAccepted,
            None,
            false,
            format!(
                "workspace applied: {} route{} in zone {} ({added} added, {removed} removed)",
                now,
                if now == 1 { "" } else { "s" },
                workspace.zone
            ),
        );
    }

    /// An upstream name's addresses changed; the host is named when one host's routes alone
    /// use the name.
    fn announce_name(&self, name: &str) {
        let addresses = self
            .dns
            .resolved()
            .get(name)
            .map(|a| {
                a.iter()
                    .map(|ip| ip.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default();
        let hosts: BTreeSet<&str> = self
            .model
            .iter()
            .flat_map(|m| m.routes_of_name(name).map(|r| r.host.as_str()))
            .collect();
        let host = match hosts.len() {
            1 => hosts.first().copied(),
            _ => None,
        };
        self.events.emit(
            crate::document::EventKind::DnsChanged,
            host,
            false,
            if addresses.is_empty() {
                format!("{name} no longer resolves to any address in use")
            } else {
                format!("{name} now resolves to {addresses}")
            },
        );
    }

    /// A resync: sozu's state read beside the loop when the shadow is known (see
    /// [`super::resync`]); otherwise the next pass reads it, as it must anyway.
    fn resync(&mut self, work: &mut Work) {
        if self.reading.is_some() {
            return;
        }
        if !self.sozu.is_known() {
            work.check_generation = true;
            return;
        }
        self.reading = Some(Reading {
            read: self.sozu.read_state_beside(),
            journal: Vec::new(),
            generation: self.sozu.generation().cloned(),
            started: std::time::Instant::now(),
        });
    }

    /// A resync's read came back: compared with the shadow once the requests sent meanwhile
    /// are applied to it; what differs is planned, and nothing else.
    fn resync_read(
        &mut self,
        reading: Reading,
        read: Result<crate::plan::state::Actual, crate::sozu::SozuError>,
        work: &mut Work,
    ) {
        let read_ms = reading.started.elapsed().as_secs_f64() * 1e3;
        let read = match read {
            Ok(read) => read,
            Err(e) => {
                self.counters.sozu_read_failures += 1;
                tracing::warn!(error = %e,
                    "a resync could not read sozu's state; rotations and edits go on from what \
                     the agent knows");
                if self.read_error.is_none() {
                    self.events.emit(
                        crate::document::EventKind::Sozu,
                        None,
                        true,
                        format!("sozu's state could not be read for a resync: {e}"),
                    );
                }
                self.read_error = Some(e.to_string());
                // A broken connection may be a new sozu: the next pass asks.
                work.check_generation = !e.is_refusal();
                work.publish = true;
                return;
            }
        };
        if !self.sozu.is_known() || self.sozu.generation() != reading.generation.as_ref() {
            tracing::debug!("a resync's read of a sozu the agent no longer talks to, dropped");
            return;
        }
        let started = std::time::Instant::now();
        let read = resync::caught_up(read, &reading.journal);
        let differs = self
            .sozu
            .shadow()
            .map(|shadow| resync::differences(shadow, &read))
            .unwrap_or_else(crate::plan::Scope::everything);
        self.counters.resyncs += 1;
        // The counters change: published, with no route's status built again.
        work.publish = true;
        self.read_error = None;
        if differs.is_empty() {
            tracing::debug!(
                read_ms,
                requests_meanwhile = reading.journal.len(),
                compared_ms = started.elapsed().as_secs_f64() * 1e3,
                "resync: sozu holds what the agent expects"
            );
            // Freed beside the loop: at 10,000 routes a whole state's allocations took the
            // loop some 20–30 ms after each unchanged resync, and a rotation waited for it.
            tokio::task::spawn_blocking(move || drop(read));
            return;
        }
        tracing::info!(
            read_ms,
            everything = differs.everything,
            hosts = differs.hosts.len(),
            clusters = differs.clusters.len(),
            "resync: sozu differs from what the agent expects; planning what differs"
        );
        self.sozu.replace_shadow(read);
        work.differs.extend(differs);
    }

    /// When the next served certificate enters its expiry warning, as a timer deadline.
    fn next_expiry_flag(&self) -> Option<Instant> {
        let now = self.clock.unix();
        let at = self.certs.next_expiry_warning(now)?;
        let wait = u64::try_from(at.saturating_sub(now)).unwrap_or(0) + 1;
        Some(Instant::now() + Duration::from_secs(wait))
    }
}
