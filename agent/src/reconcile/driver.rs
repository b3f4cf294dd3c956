//! The loop's mechanics: facts in, timers, the phase ([`super::phase`]: running, backing off,
//! settling), memory handed back after churn, one pass at a time. What a fact or a pass does
//! to the state is [`super::state`]'s; this file decides only when.
//!
//! | what happens | what the next pass does |
//! |---|---|
//! | the workspace changed | plans the routes that differ, after asking sozu who it is |
//! | a DNS answer changed | plans the clusters of the name's routes, after asking sozu who it is |
//! | a host's pair changed | plans that host alone, trusting the shadow without asking sozu first: a rotation costs one request, whatever the number of routes; one that commutes with the requests of a pass sozu is answering goes past them ([`Driver::beside`]) |
//! | sozu's socket came or went | asks sozu who it is; reads its state again, and plans everything, if it is a new sozu |
//! | resync (`--resync-interval`) | nothing at once: sozu's state is read beside the loop and every pair again; once read, plans only what differs from the shadow ([`super::resync`]) |
//! | sozu could not be reached | nothing until the back-off ends (a new socket, or a sozu listening at a socket not tried yet, ends it early); facts keep arriving meanwhile |
//! | a request was refused | only that request and what depends on it wait for their retry, which plans their hosts and clusters |
//! | a served certificate enters its expiry warning | only the status changes |

use std::time::Duration;

use tokio::sync::mpsc::UnboundedReceiver;
use tokio::time::Instant;

use super::phase::{LoopPhase, Phase};
use super::state::{Begun, InFlight, NextPass, Overtaken, PassOutcome, Reconciler};
use crate::api::{Heartbeat, SharedStatus};
use crate::clock::Clock;
use crate::document::ReadinessMode;
use crate::plan::Scope;
use crate::sources::{CertSource, Fact};
use crate::sozu::proxy::SendBeside;
use crate::sozu::Proxy;

#[derive(Debug, Clone)]
pub struct Settings {
    /// Re-read sozu's state and every pair, and repair drift, this often; `None` disables.
    pub resync: Option<Duration>,
    /// A served certificate with less than this left is flagged (status, metric, one log line).
    pub expiry_warning: Duration,
    /// Seeds the back-off's jitter (its waits are [`super::phase`]'s).
    pub seed: u64,
    /// Whether readiness waits for every route or for those that can be served.
    pub readiness: ReadinessMode,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            resync: Some(Duration::from_secs(60)),
            expiry_warning: Duration::from_secs(14 * 86_400),
            seed: 0x5eed,
            readiness: ReadinessMode::default(),
        }
    }
}

/// The loop turns at least this often, facts or not, so that its heartbeat says it is alive.
pub const TICK: Duration = Duration::from_secs(10);

/// A pass that sent at least this many requests was a bulk one (a start, a restarted sozu, a big
/// edit): the memory it used for the plan and its copies is handed back to the system afterwards,
/// and, before readiness first says ready, the loop settles.
const BULK_REQUESTS: u64 = 256;

/// The loop: the reconciler's state, and the mechanics that decide when it changes.
pub struct Driver<P, C> {
    state: Reconciler<P>,
    /// Asked to read every pair again at each resync.
    cert_source: C,
    resync: Option<Duration>,
    phase: LoopPhase,
    trim: MemoryTrim,
    /// Beaten at every turn of the loop: `/healthz` reads it.
    heartbeat: Heartbeat,
}

impl<P: Proxy, C: CertSource> Driver<P, C> {
    pub fn new(
        proxy: P,
        cert_source: C,
        settings: Settings,
        status: SharedStatus,
        clock: std::sync::Arc<dyn Clock>,
    ) -> Self {
        Driver {
            state: Reconciler::new(
                proxy,
                status,
                clock,
                settings.readiness,
                settings.expiry_warning,
            ),
            cert_source,
            resync: settings.resync,
            phase: LoopPhase::new(settings.seed),
            trim: MemoryTrim::default(),
            heartbeat: Heartbeat::default(),
        }
    }

    /// Emits what it does and sees on `events` (`/v1/events`).
    pub fn with_events(mut self, events: crate::api::events::Events) -> Self {
        self.state = self.state.with_events(events);
        self
    }

    /// Readiness asks `issuer` whether a missing pair is still being issued (see
    /// [`super::readiness`]). The loop reads it at each turn, so readiness follows the issuer
    /// giving up on a host within [`TICK`].
    pub fn with_issuer(mut self, issuer: super::readiness::SharedIssuerProgress) -> Self {
        self.state = self.state.with_issuer(issuer);
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
        let mut next = NextPass::default();
        let mut next_resync = self.resync.map(|d| Instant::now() + d);
        self.state.publish(self.phase.settling());
        loop {
            self.heartbeat.beat();
            let never = Instant::now() + Duration::from_secs(86_400 * 365);
            let backing_off = self.phase.backing_off();
            let retry_at = self.phase.retry_at();
            let probe_at = self.phase.probe_at();
            let refusal_at = self.state.next_refusal_retry();
            let expiry_at = self.state.next_expiry_warning().map(|d| Instant::now() + d);
            // Work already taken up (by a settle) is done before waiting for more.
            let pending = next.needs_pass() && !backing_off;
            if !pending {
                tokio::select! {
                    _ = &mut shutdown => return self.state.into_proxy(),
                    fact = facts.recv() => {
                        let Some(fact) = fact else {
                            return self.state.into_proxy();
                        };
                        self.take(fact, &mut next);
                        // Coalesce whatever else is already queued.
                        self.take_queued(&mut facts, &mut next);
                    }
                    _ = tokio::time::sleep_until(retry_at.unwrap_or(never)), if retry_at.is_some() => {
                        self.phase.wait_over();
                    }
                    _ = tokio::time::sleep_until(probe_at.unwrap_or(never)), if probe_at.is_some() => {
                        if self.state.sozu_listening_again().await {
                            tracing::info!("a sozu listens at a socket the agent has not tried yet; \
                                the back-off ends");
                            self.phase.wait_over();
                        } else {
                            self.phase.nobody_new_listening(Instant::now());
                        }
                    }
                    _ = tokio::time::sleep_until(next_resync.unwrap_or(never)), if next_resync.is_some() => {
                        next.resync = true;
                        self.cert_source.reread();
                        next_resync = self.resync.map(|d| Instant::now() + d);
                    }
                    read = self.state.read_finished(), if self.state.reading() => {
                        self.state.read_back(read, &mut next);
                    }
                    _ = tokio::time::sleep_until(refusal_at.unwrap_or(never)),
                        if refusal_at.is_some() && !backing_off => {
                        self.state.refusals_due(Instant::now(), &mut next);
                    }
                    _ = tokio::time::sleep_until(expiry_at.unwrap_or(never)), if expiry_at.is_some() => {
                        self.state.expiry_warning_reached(&mut next);
                    }
                    _ = tokio::time::sleep_until(self.trim.trim_at.unwrap_or(never)),
                        if self.trim.trim_at.is_some() => {
                        self.trim.trim();
                    }
                    _ = tokio::time::sleep(TICK) => {}
                }
            }
            self.state.follow_issuer(&mut next);
            if self.phase.backing_off() {
                continue;
            }
            if std::mem::take(&mut next.resync) {
                self.state.start_resync(&mut next);
            }
            if next.needs_pass() {
                self.pass(&mut facts, &mut next).await;
            } else if std::mem::take(&mut next.publish) {
                self.state.publish(self.phase.settling());
            }
        }
    }

    /// One pass, then what its outcome asks of the loop: back off, settle, or hand memory back.
    async fn pass(&mut self, facts: &mut UnboundedReceiver<Fact>, next: &mut NextPass) {
        let (outcome, deferred) = match self.state.begin(std::mem::take(next)).await {
            Begun::Done(outcome) => (outcome, false),
            Begun::Sending(flight, sending) => self.beside(flight, sending, facts, next).await,
        };
        // A rotation deferred during the pass is in the desired state but not in sozu: the
        // status waits for the pass that sends it, which comes next. One that shows sozu
        // unreachable is published at once.
        let publish = !deferred || outcome == PassOutcome::Unreachable;
        self.passed(outcome, next, publish);
        if self.phase.phase() == Phase::Settling {
            self.settle(facts, next);
        }
    }

    /// While a pass's requests are with sozu: a rotation taken up meanwhile goes past them when
    /// it commutes with them, rather than waiting for their answers (11 to 31 ms for an edit at
    /// 10,000 routes). Only pairs are taken up. Every other fact waits, in its order, for the
    /// pass to finish: sozu's reports among them, of the requests under way too, which the
    /// ledger must know were sent before it reads them. Pairs may be taken up before the reports
    /// waiting (the two are about different things, and the reports come during every edit);
    /// once any other fact waits, the pairs after it wait too, so that they never go before a
    /// workspace, an answer or a new socket that came first. Says whether a rotation was
    /// deferred: its host is in the desired state as it will be once the next pass has sent
    /// it.
    async fn beside(
        &mut self,
        flight: Box<InFlight>,
        mut sending: SendBeside,
        facts: &mut UnboundedReceiver<Fact>,
        next: &mut NextPass,
    ) -> (PassOutcome, bool) {
        let mut waiting = Vec::new();
        // A fact other than a pair or a report of sozu's waits: pairs wait behind it.
        let mut blocked = false;
        let mut open = true;
        let mut deferred = false;
        // What the deferred rotations concern, kept out of `next` until the pass is answered:
        // in `next` it would make every pair after them wait too (`certificates_only`), when a
        // rotation of another host still commutes with the pass. An edit that brings a host in
        // has its pair read as the tls dir source follows the edit, so this is every such edit.
        let mut held = Scope::default();
        let delivered = loop {
            tokio::select! {
                biased;
                delivered = &mut sending => break delivered,
                fact = facts.recv(), if open => match fact {
                    None => open = false,
                    Some(fact @ Fact::Pairs(_)) if !blocked => {
                        self.take(fact, next);
                        if next.certificates_only() && self.state.may_overtake() {
                            match self.state.overtake(std::mem::take(next), &flight).await {
                                // Published with the pass it went past, once that is answered.
                                Overtaken::Done(outcome) => self.passed(outcome, next, false),
                                Overtaken::Deferred(scope) => {
                                    held.extend(scope);
                                    deferred = true;
                                }
                            }
                        }
                    }
                    Some(fact) => {
                        blocked |= !matches!(fact, Fact::Sozu(_) | Fact::Pairs(_));
                        waiting.push(fact);
                    }
                },
            }
        };
        let outcome = self.state.finish(flight, delivered).await;
        next.differs.extend(held);
        for fact in waiting {
            self.take(fact, next);
        }
        (outcome, deferred)
    }

    /// What a pass's outcome asks of the loop: back off, or hand memory back; and the status
    /// published, unless another pass's requests are still with sozu (`publish` false): the
    /// status would show their routes as served before sozu has answered.
    fn passed(&mut self, outcome: PassOutcome, next: &mut NextPass, publish: bool) {
        match outcome {
            PassOutcome::Unreachable => {
                if publish {
                    self.state.publish(self.phase.settling());
                }
                let wait = self.phase.unreachable(Instant::now());
                tracing::warn!(
                    error = self.state.sozu_error().unwrap_or_default(),
                    retry_in_ms = wait.as_millis() as u64,
                    "sozu unreachable; retrying"
                );
                // Level-triggered: the retry recomputes everything, so no reason is lost.
                next.everything = true;
                next.check_generation = true;
            }
            PassOutcome::Done { requests_sent } => {
                let bulk = requests_sent >= BULK_REQUESTS;
                // A bulk pass that may make the agent ready settles first (`settle`). One made
                // while ready (a big edit, a restarted sozu) leaves readiness as it is.
                self.phase
                    .reached(Instant::now(), bulk && !self.state.ready());
                if publish {
                    let started = std::time::Instant::now();
                    self.state.publish(self.phase.settling());
                    tracing::debug!(
                        elapsed_ms = started.elapsed().as_secs_f64() * 1e3,
                        "status published"
                    );
                }
                // After publishing, so that the publication's own garbage is returned too:
                // trimmed before it, 30 MiB more stayed at rest at 10,000 routes.
                if bulk {
                    if !self.phase.settling() {
                        self.trim.trim();
                    }
                } else {
                    self.trim
                        .add(usize::try_from(requests_sent).unwrap_or(usize::MAX));
                }
            }
        }
    }

    /// Ends the start's settling: takes up what queued during its bulk pass, returns the memory
    /// the start freed, and only then publishes a readiness that may say ready.
    ///
    /// sozu reports every change twice on its event stream, so a start at 10,000 routes leaves
    /// some 60,000 reports queued for the loop, and glibc holds the start's freed pages until a
    /// trim walks its heap (3 to 33 ms at that size). Taken up after `/readyz` said 200, they
    /// would hold up the first rotation (20 ms where the others took 3 ms); taken up before it,
    /// they cost the same and a rollout acts on a readiness that has them behind it.
    ///
    /// What was queued may ask for a pass (a pair swapped during the start): that pass comes
    /// first, and the settle after it.
    fn settle(&mut self, facts: &mut UnboundedReceiver<Fact>, next: &mut NextPass) {
        let started = std::time::Instant::now();
        let taken = self.take_queued(facts, next);
        tracing::debug!(
            elapsed_ms = started.elapsed().as_secs_f64() * 1e3,
            facts = taken,
            "facts queued during the bulk pass taken up"
        );
        if next.needs_pass() {
            return;
        }
        self.trim.trim();
        self.phase.settled();
        self.state.publish(self.phase.settling());
    }

    /// Takes up every fact already queued; returns how many.
    fn take_queued(&mut self, facts: &mut UnboundedReceiver<Fact>, next: &mut NextPass) -> usize {
        let mut taken = 0;
        while let Ok(fact) = facts.try_recv() {
            self.take(fact, next);
            taken += 1;
        }
        taken
    }

    /// Takes one fact into the state. What the mechanics see of it: a new socket is the sozu a
    /// back-off waits for, and pairs are churn.
    fn take(&mut self, fact: Fact, next: &mut NextPass) {
        if matches!(fact, Fact::SozuSocket) {
            self.phase.wait_over();
        }
        if let Fact::Pairs(pairs) = &fact {
            self.trim.add(pairs.len());
        }
        self.state.absorb(fact, next);
    }
}

/// When to hand freed memory back to the system. Every renewal allocates a new certificate, its
/// status and its copies, and frees the old ones; glibc keeps what was freed as part of the
/// process's resident memory, spread over its heaps, so a sidecar that renews a thousand
/// certificates would grow by megabytes and stay there. Once churn has quietened down, the
/// freed pages are returned.
#[derive(Debug, Default)]
struct MemoryTrim {
    /// Pairs taken in and requests sent since the last trim.
    since_trim: usize,
    trim_at: Option<Instant>,
}

/// How much churn is worth a trim (a trim costs about a millisecond on a small heap).
const CHURN_TRIM_MIN: usize = 64;
/// How long churn must have stopped before the trim: a mass renewal trims once, at its end.
const CHURN_QUIET: Duration = Duration::from_secs(2);

impl MemoryTrim {
    fn add(&mut self, n: usize) {
        self.since_trim += n;
        if self.since_trim >= CHURN_TRIM_MIN {
            self.trim_at = Some(Instant::now() + CHURN_QUIET);
        }
    }

    fn trim(&mut self) {
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
