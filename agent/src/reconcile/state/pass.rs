//! One pass: the latest facts → the desired state → the plan → sozu. Nothing here waits on DNS,
//! a file or an evaluation; the only I/O is sozu's socket.
//!
//! The desired state is kept between passes ([`Model`]) and updated where facts changed it; the
//! plan covers what changed ([`Scope`]): one host for a rotation, the routes that differ for a
//! workspace edit, a name's clusters for a DNS answer, what a resync's read found differing
//! ([`crate::reconcile::resync`]). A new sozu or a retry after sozu could not be reached plan
//! everything.

use std::sync::Arc;
use std::time::Instant;

use tokio::time::Instant as TokioInstant;

use super::{step_took, NextPass, PassOutcome, Reconciler};
use crate::plan::state::{ClientAuthState, Protocol};
use crate::plan::{self, Op, Outcome, Scope};
use crate::reconcile::model::Model;
use crate::sozu::proxy::SendBeside;
use crate::sozu::{Delivered, Proxy};

/// The most requests a pass sends past another's ([`Reconciler::overtake`]), one at a time on
/// a connection of its own: a rotation's latency is worth it, a mass renewal's requests go
/// faster over every connection once the pass before them is answered.
const PAST_MAX: usize = 16;

/// A pass whose requests are with sozu beside the loop ([`Reconciler::begin`]): what is left of
/// it once they are answered ([`Reconciler::finish`]).
pub struct InFlight {
    next: NextPass,
    start: PassStart,
    planned: Planned,
}

/// A pass as [`Reconciler::begin`] left it.
pub enum Begun {
    /// Over: nothing to send, or sent and answered (a bulk change, which the loop awaits).
    Done(PassOutcome),
    /// Its requests are with sozu: the loop awaits the send, may send a rotation past it
    /// meanwhile ([`Reconciler::overtake`]), then finishes the pass with what was delivered.
    Sending(Box<InFlight>, SendBeside),
}

/// What became of a pass taken up while another's requests were with sozu.
pub enum Overtaken {
    /// It went past them, or had nothing to send.
    Done(PassOutcome),
    /// Its requests do not commute with those under way ([`plan::overtakes`]): nothing was
    /// sent, and this is what it concerns, for a pass after them.
    Deferred(Scope),
}

/// What a pass counts from.
struct PassStart {
    sent_before: u64,
    was_unreachable: bool,
}

/// A plan about to be sent: what it concerns, its requests, whether some were held back until
/// their retry, and when it was made.
struct Planned {
    scope: Scope,
    ops: Vec<Op>,
    held: bool,
    now: TokioInstant,
}

/// How far a pass's preparation got.
enum Step {
    /// Nothing to send for this scope.
    Nothing(Scope),
    Send(Planned),
}

impl<P: Proxy> Reconciler<P> {
    /// One pass over what `next` asks for, its requests awaited. The status is not published
    /// here: the caller publishes once it knows whether readiness must wait for a settle.
    pub async fn pass(&mut self, next: NextPass) -> PassOutcome {
        match self.begin(next).await {
            Begun::Done(outcome) => outcome,
            Begun::Sending(flight, sending) => {
                let delivered = sending.await;
                self.finish(flight, delivered).await
            }
        }
    }

    /// One pass over what `next` asks for, up to its requests: those that can go beside the
    /// loop are left with sozu ([`Begun::Sending`]), so that a rotation taken up while sozu
    /// answers them need not wait for them. An edit's few requests took sozu 11 to 31 ms at
    /// 10,000 routes, and a rotation's pair read meanwhile waited for all of them.
    pub async fn begin(&mut self, next: NextPass) -> Begun {
        let start = self.start_pass();
        let planned = match self.prepare(&next).await {
            Ok(Step::Send(planned)) => planned,
            Ok(Step::Nothing(scope)) => return Begun::Done(self.end_pass(&next, start, Ok(scope))),
            Err(e) => return Begun::Done(self.end_pass(&next, start, Err(e))),
        };
        log_sending(&planned.ops);
        match self.sozu.send_beside(planned.ops.clone()) {
            Ok(sending) => Begun::Sending(
                Box::new(InFlight {
                    next,
                    start,
                    planned,
                }),
                sending,
            ),
            Err(ops) => {
                let (done, files) = self.sozu.apply(ops).await;
                let result = self.applied(planned, done, files);
                Begun::Done(self.end_pass(&next, start, result))
            }
        }
    }

    /// Whether a pass may be taken up while `flight`'s requests are with sozu: only with a
    /// shadow to plan on, since asking sozu who it is would wait for them.
    pub fn may_overtake(&self) -> bool {
        self.sozu.is_known() && self.sozu_error.is_none()
    }

    /// A pass about certificates alone (`next`), taken up while `flight`'s requests are with
    /// sozu: sent past them on a connection of its own when its requests commute with theirs
    /// ([`plan::overtakes`]) and are few ([`PAST_MAX`]), deferred otherwise.
    pub async fn overtake(&mut self, next: NextPass, flight: &InFlight) -> Overtaken {
        let start = self.start_pass();
        let result = match self.prepare(&next).await {
            Ok(Step::Send(planned))
                if planned.ops.len() <= PAST_MAX
                    && plan::overtakes(&planned.ops, &flight.planned.ops) =>
            {
                log_sending(&planned.ops);
                let (done, files) = self.sozu.apply_past(planned.ops.clone()).await;
                self.applied(planned, done, files)
            }
            Ok(Step::Send(planned)) => {
                tracing::debug!(
                    requests = planned.ops.len(),
                    "a rotation waits for the change under way, whose requests it does not \
                     commute with"
                );
                return Overtaken::Deferred(planned.scope);
            }
            Ok(Step::Nothing(scope)) => Ok(scope),
            Err(e) => Err(e),
        };
        Overtaken::Done(self.end_pass(&next, start, result))
    }

    /// The end of a pass whose requests went beside the loop: `delivered` is what became of
    /// them.
    pub async fn finish(&mut self, flight: Box<InFlight>, delivered: Delivered) -> PassOutcome {
        let InFlight {
            next,
            start,
            planned,
        } = *flight;
        let (done, files) = self.sozu.sent(planned.ops.clone(), delivered).await;
        let result = self.applied(planned, done, files);
        self.end_pass(&next, start, result)
    }

    fn start_pass(&self) -> PassStart {
        PassStart {
            sent_before: self.counters.sozu_requests,
            was_unreachable: self.sozu_error.is_some(),
        }
    }

    /// What a pass's end leaves in the state, whatever became of its requests (`result`: the
    /// scope planned, or why sozu could not be reached).
    fn end_pass(
        &mut self,
        next: &NextPass,
        start: PassStart,
        result: Result<Scope, String>,
    ) -> PassOutcome {
        self.counters.reconciles += 1;
        if let Ok(scope) = &result {
            self.stale_views.scope(scope);
            // What the backend maps keep follows the routes and their names' answers.
            if scope.everything || next.workspace || !next.names.is_empty() {
                let started = Instant::now();
                self.prune_backends();
                step_took(started, "backend entries pruned");
            }
        }
        // Every route shows whether sozu can be reached.
        self.stale_views.all |= start.was_unreachable != result.is_err();
        if let Err(e) = result {
            self.counters.reconcile_errors += 1;
            self.sozu_error = Some(e);
            return PassOutcome::Unreachable;
        }
        PassOutcome::Done {
            requests_sent: self.counters.sozu_requests - start.sent_before,
        }
    }

    /// Brings the desired state and the plan up to what changed: asks who sozu is (unless a pass
    /// about certificates alone trusts the shadow), reads its state when the shadow is gone,
    /// updates the model, plans, holds back what waits for a retry. An error means sozu could
    /// not be reached.
    async fn prepare(&mut self, next: &NextPass) -> Result<Step, String> {
        let Some(workspace) = self.workspace.current.clone() else {
            return Ok(Step::Nothing(Scope::default()));
        };
        if !next.certificates_only() || !self.sozu.is_known() {
            let started = Instant::now();
            if self.sozu.check().await.map_err(|e| e.to_string())? {
                self.counters.sozu_reconnects += 1;
                self.backends.sozu_restarted();
                self.stale_views.all = true;
            }
            step_took(started, "sozu's generation checked");
        }
        let fresh = !self.sozu.is_known();
        self.sozu.actual().await.map_err(|e| e.to_string())?;
        if fresh && self.read_error.take().is_some() {
            self.stale_views.all = true;
        }
        // Clusters someone else changed: read again, in place of what the shadow believed.
        if !fresh {
            for id in &next.drifted {
                let hosts: Vec<String> = self
                    .model
                    .as_ref()
                    .and_then(|m| m.route_by_id(id))
                    .map(|r| vec![r.host.clone()])
                    .unwrap_or_default();
                let hosts: Vec<&str> = hosts.iter().map(String::as_str).collect();
                self.sozu
                    .refresh_cluster(id, &hosts)
                    .await
                    .map_err(|e| e.to_string())?;
            }
        }
        let actual = self.sozu.actual().await.map_err(|e| e.to_string())?;

        let started = Instant::now();
        let scope = match &mut self.model {
            Some(model) if !fresh && !next.everything => {
                let mut scope = if Arc::ptr_eq(model.workspace(), &workspace) {
                    Scope::default()
                } else {
                    let started = Instant::now();
                    // What the workspace source worked out, if against the model's workspace.
                    let prepared = self
                        .prepared
                        .take()
                        .filter(|p| {
                            Arc::ptr_eq(&p.base, model.workspace())
                                && Arc::ptr_eq(&p.workspace, &workspace)
                        })
                        .map(|p| (p.scope, p.index));
                    let was_prepared = prepared.is_some();
                    let scope = model.update(
                        workspace.clone(),
                        prepared,
                        &self.dns,
                        &self.certs,
                        &self.policy_files,
                        actual,
                    );
                    if let Some(old) = model.retired() {
                        tokio::task::spawn_blocking(move || drop(old));
                    }
                    tracing::debug!(
                        elapsed_ms = started.elapsed().as_secs_f64() * 1e3,
                        prepared = was_prepared,
                        "model updated for the edit"
                    );
                    scope
                };
                for host in &next.hosts {
                    scope.extend(model.host_changed(host, &self.certs, actual));
                }
                for name in &next.names {
                    scope.extend(model.name_changed(name, &self.dns, actual));
                }
                scope.extend(next.retry.clone());
                scope.extend(next.differs.clone());
                for id in &next.drifted {
                    scope.clusters.insert(id.clone());
                    scope
                        .hosts
                        .extend(model.route_by_id(id).map(|r| r.host.clone()));
                }
                scope
            }
            _ => {
                self.prepared = None;
                self.model = Some(Model::build(
                    workspace.clone(),
                    &self.dns,
                    &self.certs,
                    &self.policy_files,
                    actual,
                ));
                Scope::everything()
            }
        };
        let mut scope = scope;
        if let Some(model) = &mut self.model {
            if model.follow_client_auth(&self.client_auth) {
                scope = Scope::everything();
            }
            scope.extend(model.follow_policy_files(&self.policy_files));
        }
        step_took(started, "desired state updated");
        let Some(model) = &self.model else {
            return Ok(Step::Nothing(scope));
        };
        let started = Instant::now();
        let planned = plan::plan_scope(actual, model.desired(), &scope);
        step_took(started, "changes planned");
        let fixed = plan::listeners_need_restart(actual, model.desired());
        if fixed != self.listeners_need_restart {
            if !fixed.is_empty() {
                tracing::warn!(
                    settings = %fixed.join(", "),
                    "sozu's listeners differ from the workspace in what only a new listener \
                     takes: restart sozu to apply them"
                );
            }
            self.listeners_need_restart = fixed;
        }
        let now = TokioInstant::now();
        let (ops, held) = self.refusals.hold_back(planned, now, &scope);
        if !held.is_empty() {
            tracing::debug!(requests = held.len(), "held back until their retry");
        }
        if ops.is_empty() {
            if held.is_empty() && self.refusals.is_empty() {
                self.last_converged = u64::try_from(self.clock.unix()).ok();
            }
            self.sozu_error = None;
            return Ok(Step::Nothing(scope));
        }
        Ok(Step::Send(Planned {
            scope,
            ops,
            held: !held.is_empty(),
            now,
        }))
    }

    /// What became of a plan's requests (`done`, and `files` state files loaded) taken into
    /// the state; returns the scope planned, or why sozu could not be reached.
    fn applied(
        &mut self,
        planned: Planned,
        done: Vec<(Op, Outcome, bool)>,
        files: usize,
    ) -> Result<Scope, String> {
        let Planned {
            scope, held, now, ..
        } = planned;

        let mut broken = None;
        let mut refused = false;
        let sent_at = now;
        // Each state file is reported once, each request of its own twice.
        for _ in 0..files {
            self.ledger.loaded(sent_at);
        }
        for (op, outcome, in_file) in done {
            self.backends.applied(&op, &outcome);
            if !matches!(outcome, Outcome::NotSent(_) | Outcome::Skipped) && !in_file {
                self.ledger.sent(&op, sent_at);
            }
            match outcome {
                Outcome::Applied | Outcome::Closing(_) => {
                    // A resync's read under way may or may not have seen it: see `resync`.
                    if let Some(reading) = &mut self.reading {
                        reading.journal.push(op.clone());
                    }
                    self.counters.sozu_requests += 1;
                    self.refusals.applied(&op);
                    if let Some(sent) = client_auth_sent(&op) {
                        self.client_auth.sozu_took(sent);
                    }
                    if let Op::ReplaceCertificate { certificate, .. } = &op {
                        let at = u64::try_from(self.clock.unix()).unwrap_or(0);
                        self.certs.rotated(&certificate.names, at);
                        tracing::info!(fingerprint = %certificate.fingerprint,
                            names = %certificate.names.iter().cloned().collect::<Vec<_>>().join(","),
                            "certificate replaced");
                    }
                }
                Outcome::Refused(reason) => {
                    self.counters.sozu_requests += 1;
                    tracing::warn!(request = %op.describe(), %reason, "sozu refused a request");
                    // sozu keeps the client certificates it held: the status says so.
                    if matches!(op, Op::SetClientAuth { .. }) {
                        self.client_auth.sozu_refused(reason.clone());
                    }
                    let routes = self
                        .model
                        .as_ref()
                        .map(|m| plan::listener_routes(m.desired(), &op))
                        .unwrap_or_default();
                    self.refusals.refused(&op, reason, routes, now);
                    refused = true;
                }
                Outcome::Skipped => refused = true,
                Outcome::NotSent(reason) => {
                    broken.get_or_insert(format!("{}: {reason}", op.describe()));
                }
            }
        }
        if let Some(reason) = broken {
            return Err(reason);
        }
        self.sozu_error = None;
        if refused || held {
            self.counters.reconcile_errors += 1;
        } else if self.refusals.is_empty() {
            self.last_converged = u64::try_from(self.clock.unix()).ok();
        }
        Ok(scope)
    }

    /// Drops health and drain entries of backends no route has any more. Each entry the tracker
    /// keeps is looked up in its route (the cluster is the id up to its last `-`), rather than
    /// every backend of every route formatted to compare against: that took 40 ms of the loop
    /// after each edit at 10,000 routes, and a rotation that came meanwhile waited for it.
    fn prune_backends(&mut self) {
        let Some(model) = &self.model else {
            return;
        };
        let names = crate::plan::desired::DnsUpstreams::Resolved(self.dns.resolved());
        let keep = |id: &str| {
            let Some((cluster, _)) = id.rsplit_once('-') else {
                return false;
            };
            model.route_by_id(cluster).is_some_and(|route| {
                route.upstreams.iter().any(|upstream| {
                    crate::plan::desired::addresses(&upstream.upstream, names)
                        .iter()
                        .any(|address| crate::plan::desired::backend_id(&route.id, address) == id)
                })
            })
        };
        self.backends
            .retain(keep, |cluster| model.route_by_id(cluster).is_some());
    }
}

/// Says at info what a pass sends: how many requests of each kind.
fn log_sending(ops: &[Op]) {
    let summary = plan::summary(ops)
        .into_iter()
        .map(|(kind, count)| format!("{kind}={count}"))
        .collect::<Vec<_>>()
        .join(" ");
    tracing::info!(requests = ops.len(), %summary, "applying changes to sozu");
}

/// The device CA and CRLs `op` gives the HTTPS listener, when it gives it some: its
/// replacement, or a new listener made with them. Every kind of request is named, so that a new
/// one that carries client certificates cannot be missed.
fn client_auth_sent(op: &Op) -> Option<&ClientAuthState> {
    match op {
        Op::SetClientAuth {
            client_auth: Some(auth),
            ..
        } => Some(auth),
        Op::AddListener {
            protocol: Protocol::Https,
            settings,
            ..
        } => settings.client_auth.as_ref().filter(|a| !a.cas.is_empty()),
        Op::SetClientAuth {
            client_auth: None, ..
        }
        | Op::AddListener {
            protocol: Protocol::Http | Protocol::Tcp | Protocol::Udp,
            ..
        }
        | Op::PatchListener { .. }
        | Op::ActivateListener { .. }
        | Op::SetListenerHsts { .. }
        | Op::AddCluster { .. }
        | Op::SetListenerAnswers { .. }
        | Op::SwapFrontend { .. }
        | Op::SetHealthCheck { .. }
        | Op::RemoveHealthCheck { .. }
        | Op::AddBackend { .. }
        | Op::AddCertificate { .. }
        | Op::ReplaceCertificate { .. }
        | Op::RemoveCertificate { .. }
        | Op::RemoveFrontend(_)
        | Op::AddFrontend(_)
        | Op::AddStreamFrontend(_)
        | Op::RemoveStreamFrontend(_)
        | Op::DeactivateListener { .. }
        | Op::RemoveListener { .. }
        | Op::RemoveBackend { .. }
        | Op::CloseSessions { .. }
        | Op::RemoveCluster { .. } => None,
    }
}
