//! The reconciler's state, one value ([`Reconciler`]): the latest facts (the trackers), the
//! desired state kept between passes (the model), what the agent knows of sozu (its shadow),
//! and the routes' status as last published. Three things change it, each in a file of its own:
//!
//! - `intake`: a fact, or one of the loop's timers, taken into the trackers; what it asks of
//!   the next pass is noted in a [`NextPass`];
//! - `pass`: one pass, facts → desired state → plan → sozu;
//! - `publish`: the status the admin endpoints serve, rebuilt route by route.
//!
//! When each happens is the driver's ([`super::driver`]): nothing here sleeps or owns a timer,
//! so a pass and a publish are tested on the state alone. The fields are private to this module
//! and those three: the driver goes through the methods.

mod intake;
mod pass;
mod publish;

pub use pass::{Begun, InFlight, Overtaken};

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use super::backends::{BackendTracker, Ledger};
use super::client_auth::ClientAuthTracker;
use super::model::Model;
use super::readiness::{SharedIssuerProgress, Stalled};
use super::resync::Reading;
use super::retry_policy::Refusals;
use super::route_policy_files::PolicyFilesTracker;
use super::sync::SozuSync;
use super::trackers::{CertTracker, DnsTracker, WorkspaceTracker};
use crate::api::events::Events;
use crate::api::{RouteKey, RouteView, SharedStatus};
use crate::clock::Clock;
use crate::document::{Counters, ReadinessMode};
use crate::plan::edit::RouteIndex;
use crate::plan::Scope;
use crate::sozu::Proxy;
use crate::workspace::Workspace;

/// Everything the loop keeps between passes, but its timers.
pub struct Reconciler<P> {
    clock: Arc<dyn Clock>,
    /// Whether readiness waits for every route or for those that can be served.
    readiness: ReadinessMode,
    sozu: SozuSync<P>,
    workspace: WorkspaceTracker,
    dns: DnsTracker,
    certs: CertTracker,
    refusals: Refusals,
    /// What sozu's events said of backends, and the changes the agent made that sozu has not
    /// reported yet.
    backends: BackendTracker,
    ledger: Ledger,
    counters: Counters,
    /// The desired state, kept between passes; `None` until the first pass with a workspace.
    model: Option<Model>,
    /// Each route's status and metric lines as last published, and which must be built again.
    route_views: imbl::OrdMap<RouteKey, Arc<RouteView>>,
    stale_views: StaleViews,
    /// Whether readiness was last published as ready.
    ready: bool,
    /// Why the last pass could not reach sozu.
    sozu_error: Option<String>,
    last_converged: Option<u64>,
    /// What the workspace asks of a listener that sozu holds otherwise and can only take on a
    /// new listener (a restart of sozu): `<address>: <setting>`.
    listeners_need_restart: Vec<String>,
    /// The CA and CRLs of `listeners.client_auth`, as last read good.
    client_auth: ClientAuthTracker,
    /// The basic-auth users files and error pages, as last read good.
    policy_files: PolicyFilesTracker,
    status: SharedStatus,
    /// What the agent did and why, for `/v1/events`: emitting never waits for a reader.
    events: Events,
    /// With `tls_rotation = 'sozu_managed`: the issuer's progress, the version last read, and
    /// what it had given up on then.
    issuer: Option<(SharedIssuerProgress, u64, Stalled)>,
    /// A resync's read of sozu under way beside the loop.
    reading: Option<Reading>,
    /// Why the last read of sozu's state failed, until one succeeds.
    read_error: Option<String>,
    /// What the edits taken up since the model last took a workspace change, worked out beside
    /// the loop ([`crate::plan::edit`]).
    prepared: Option<Prepared>,
}

/// Edits taken up and not yet in the model: what they change from `base`, and the index of
/// the latest, `workspace`.
#[derive(Debug)]
struct Prepared {
    base: Arc<Workspace>,
    scope: Scope,
    workspace: Arc<Workspace>,
    index: RouteIndex,
}

/// What the next pass must do, gathered from facts and timers.
#[derive(Debug, Default)]
pub struct NextPass {
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

impl NextPass {
    /// Whether anything but the status changed: a pass, rather than a publish alone.
    pub fn needs_pass(&self) -> bool {
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

/// Which routes' status is stale, to be built again at the next publish: every route's, or
/// those of some hosts, of some clusters (a route's id) and of the routes using some upstream
/// names. The rest is shared with the previous snapshot.
#[derive(Debug, Default)]
struct StaleViews {
    all: bool,
    hosts: BTreeSet<String>,
    clusters: BTreeSet<String>,
    names: BTreeSet<String>,
}

impl StaleViews {
    /// The routes a plan of `scope` concerns.
    fn scope(&mut self, scope: &Scope) {
        self.all |= scope.everything;
        self.hosts.extend(scope.hosts.iter().cloned());
        self.clusters.extend(scope.clusters.iter().cloned());
    }
}

/// How a pass ended, for the loop's back-off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PassOutcome {
    /// As far as it could go: converged, or some requests refused (each retried on its own).
    /// `requests_sent` tells a bulk pass (a start, a restarted sozu, a big edit) from the rest.
    Done { requests_sent: u64 },
    /// sozu could not be reached, or the connection broke: the loop backs off.
    Unreachable,
}

impl<P: Proxy> Reconciler<P> {
    /// Nothing known yet: no workspace, no pair, no sozu. `expiry_warning`: a served
    /// certificate with less than this left is flagged (status, metric, one log line).
    pub fn new(
        proxy: P,
        status: SharedStatus,
        clock: Arc<dyn Clock>,
        readiness: ReadinessMode,
        expiry_warning: Duration,
    ) -> Self {
        let warning = i64::try_from(expiry_warning.as_secs()).unwrap_or(i64::MAX);
        Reconciler {
            clock,
            readiness,
            sozu: SozuSync::new(proxy),
            workspace: WorkspaceTracker::default(),
            dns: DnsTracker::default(),
            certs: CertTracker::new(warning),
            refusals: Refusals::default(),
            backends: BackendTracker::default(),
            ledger: Ledger::default(),
            counters: Counters::default(),
            model: None,
            route_views: imbl::OrdMap::new(),
            stale_views: StaleViews::default(),
            ready: false,
            sozu_error: None,
            last_converged: None,
            listeners_need_restart: Vec::new(),
            client_auth: ClientAuthTracker::default(),
            policy_files: PolicyFilesTracker::default(),
            status,
            events: Events::default(),
            issuer: None,
            reading: None,
            read_error: None,
            prepared: None,
        }
    }

    /// Emits what it does and sees on `events` (`/v1/events`).
    pub fn with_events(mut self, events: Events) -> Self {
        self.events = events;
        self
    }

    /// Readiness asks `issuer` whether a missing pair is still being issued (see
    /// [`super::readiness`]); [`Reconciler::follow_issuer`] reads it again.
    pub fn with_issuer(mut self, issuer: SharedIssuerProgress) -> Self {
        self.issuer = Some((issuer, u64::MAX, Stalled::default()));
        self
    }

    /// Whether readiness was last published as ready.
    pub fn ready(&self) -> bool {
        self.ready
    }

    /// Why the last pass could not reach sozu.
    pub fn sozu_error(&self) -> Option<&str> {
        self.sozu_error.as_deref()
    }

    /// The proxy back, for the caller to reuse.
    pub fn into_proxy(self) -> P {
        self.sozu.into_proxy()
    }
}

/// Logs at debug how long a step took: the breakdown the cold-start figures come from.
fn step_took(started: std::time::Instant, step: &str) {
    tracing::debug!(elapsed_ms = started.elapsed().as_secs_f64() * 1e3, "{step}");
}
