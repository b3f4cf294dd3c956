//! The loop's error policy, pure: how long to wait before trying sozu again after it could not
//! be reached ([`Backoff`]: the numbers it is given, and the phases of the loop around it, are
//! [`super::phase`]'s) and when to send a request sozu refused again ([`Refusals`]). When sozu
//! must be read again because it is not the one the agent knew is
//! [`crate::sozu::generation::should_resync`].
//!
//! The two failures are told apart on purpose. An unreachable sozu stops every change, so the
//! whole loop backs off, jittered so that a fleet of agents does not hammer a restarting sozu in
//! step. A refusal concerns one request (a certificate sozu will not load, say) while sozu keeps
//! working: only that request, and what depends on it, waits for its retry, and every other
//! change (another host's rotation) goes through at once.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tokio::time::Instant;

use crate::plan::{self, Op, Scope};

/// Exponential back-off with jitter, reset only after a stretch of health.
#[derive(Debug, Clone)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    /// How long attempts must keep succeeding before the next failure starts again from `min`.
    reset_after: Duration,
    failures: u32,
    healthy_since: Option<Instant>,
    rng: fastrand::Rng,
}

impl Backoff {
    pub fn new(min: Duration, max: Duration, reset_after: Duration, seed: u64) -> Backoff {
        Backoff {
            min,
            max,
            reset_after,
            failures: 0,
            healthy_since: None,
            rng: fastrand::Rng::with_seed(seed),
        }
    }

    /// A failure at `now`: how long to wait before the next attempt. The ceiling doubles with
    /// each failure since the last stretch of health, up to `max`; the wait is drawn from its
    /// upper half, so it never collapses to nothing.
    pub fn failed(&mut self) -> Duration {
        self.healthy_since = None;
        let ceiling = self
            .min
            .saturating_mul(2u32.saturating_pow(self.failures.min(20)))
            .min(self.max);
        self.failures = self.failures.saturating_add(1);
        let half = ceiling / 2;
        half + half.mul_f64(self.rng.f64())
    }

    /// A success at `now`. A single success does not forgive: a sozu that answers once and then
    /// fails again keeps the longer waits until it has stayed healthy for `reset_after`.
    pub fn succeeded(&mut self, now: Instant) {
        let since = *self.healthy_since.get_or_insert(now);
        if now.duration_since(since) >= self.reset_after {
            self.failures = 0;
        }
    }
}

/// Requests sozu refused, held back until their retry time.
#[derive(Debug, Default)]
pub struct Refusals {
    /// By the request's description, which names what it acts on (never key material): the
    /// same request planned again is the same entry, a changed one (a new fingerprint) a new one.
    entries: BTreeMap<String, Refusal>,
}

#[derive(Debug, Clone)]
pub struct Refusal {
    pub message: String,
    /// The hosts and clusters it concerns: its routes show the refusal, and its retry plans them.
    pub scope: Scope,
    /// The routes it alone keeps from being served, when `scope` is wider than they are: the
    /// routes of a port whose listener sozu could not make or bind (its retry still plans
    /// every listener). Their status shows it; the agent's readiness does not wait for it.
    pub routes: BTreeSet<String>,
    /// It was the HTTPS listener's new client certificates: sozu keeps enforcing the ones it
    /// held, which the client-auth status reports (`sozu_refused`), and the listener serves on.
    pub client_auth: bool,
    attempts: u32,
    retry_at: Instant,
}

/// The first retry of a refused request; each further refusal doubles it.
const REFUSAL_RETRY_MIN: Duration = Duration::from_secs(1);
const REFUSAL_RETRY_MAX: Duration = Duration::from_secs(300);

impl Refusals {
    /// `op` was refused with `message`; `routes` are the ones it was for alone
    /// ([`plan::listener_routes`]).
    pub fn refused(&mut self, op: &Op, message: String, routes: BTreeSet<String>, now: Instant) {
        let entry = self.entries.entry(op.describe()).or_insert(Refusal {
            message: String::new(),
            scope: plan::scope_of(op),
            routes: BTreeSet::new(),
            client_auth: matches!(op, Op::SetClientAuth { .. }),
            attempts: 0,
            retry_at: now,
        });
        let wait = REFUSAL_RETRY_MIN
            .saturating_mul(2u32.saturating_pow(entry.attempts.min(20)))
            .min(REFUSAL_RETRY_MAX);
        entry.attempts += 1;
        entry.retry_at = now + wait;
        entry.message = message;
        entry.routes = routes;
    }

    pub fn applied(&mut self, op: &Op) {
        // Nothing refused (the usual case): no description to format for each request.
        if self.entries.is_empty() {
            return;
        }
        self.entries.remove(&op.describe());
    }

    /// Splits a plan of `scope` into what goes now and what is held back: requests refused whose
    /// retry time has not come, and every request that depends on one of them (a route's
    /// frontends on its certificate). Refusals within the scope of requests no longer planned
    /// are forgotten.
    pub fn hold_back(&mut self, ops: Vec<Op>, now: Instant, scope: &Scope) -> (Vec<Op>, Vec<Op>) {
        if self.entries.is_empty() {
            return (ops, Vec::new());
        }
        let planned: BTreeSet<String> = ops.iter().map(Op::describe).collect();
        self.entries
            .retain(|key, refusal| planned.contains(key) || !covers(scope, &refusal.scope));
        let waiting: Vec<&Op> = ops
            .iter()
            .filter(|op| {
                self.entries
                    .get(&op.describe())
                    .is_some_and(|r| r.retry_at > now)
            })
            .collect();
        if waiting.is_empty() {
            return (ops, Vec::new());
        }
        let held = |op: &Op| waiting.iter().any(|w| *w == op || plan::depends_on(op, w));
        let (held, send): (Vec<Op>, Vec<Op>) = ops.iter().cloned().partition(|op| held(op));
        (send, held)
    }

    /// What the requests whose retry time has come concern.
    pub fn due(&self, now: Instant) -> Scope {
        let mut scope = Scope::default();
        for refusal in self.entries.values().filter(|r| r.retry_at <= now) {
            scope.extend(refusal.scope.clone());
        }
        scope
    }

    /// When the earliest held-back request may go again.
    pub fn next_retry(&self) -> Option<Instant> {
        self.entries.values().map(|r| r.retry_at).min()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Refusal> {
        self.entries.values()
    }
}

/// Whether a plan of `planned` would have planned every request of `request`.
fn covers(planned: &Scope, request: &Scope) -> bool {
    planned.everything
        || (!request.everything
            && request.hosts.is_subset(&planned.hosts)
            && request.clusters.is_subset(&planned.clusters))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn backoff_grows_with_jitter_and_resets_only_after_a_stretch_of_health() {
        let mut backoff = Backoff::new(
            Duration::from_millis(100),
            Duration::from_secs(10),
            Duration::from_secs(30),
            7,
        );
        let waits: Vec<Duration> = (0..10).map(|_| backoff.failed()).collect();
        for (i, wait) in waits.iter().enumerate() {
            let ceiling =
                (Duration::from_millis(100) * 2u32.pow(i as u32)).min(Duration::from_secs(10));
            assert!(
                *wait >= ceiling / 2 && *wait <= ceiling,
                "{i}: {wait:?} of {ceiling:?}"
            );
        }
        assert!(
            waits.windows(2).any(|w| w[0] != w[1] / 2),
            "jittered: {waits:?}"
        );
        // One success does not forgive.
        backoff.succeeded(Instant::now());
        assert!(backoff.failed() >= Duration::from_secs(5));
        // Thirty seconds of successes do.
        let start = Instant::now();
        backoff.succeeded(start);
        tokio::time::advance(Duration::from_secs(31)).await;
        backoff.succeeded(Instant::now());
        assert!(backoff.failed() <= Duration::from_millis(100));
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_request_and_its_dependents_wait_while_others_go() {
        use crate::plan::state::{Certificate, Frontend, KeyPem, Protocol};
        let https: std::net::SocketAddr = "127.0.0.1:8443".parse().unwrap();
        let cert = |host: &str, serial: u8| Certificate {
            fingerprint: format!("{serial:02x}{}", "cd".repeat(31)).into(),
            chain: vec!["PEM".to_owned()].into(),
            key: KeyPem::new("key".into()),
            not_before: 0,
            not_after: 1,
            names: BTreeSet::from([host.to_owned()]).into(),
            other_names: std::sync::Arc::from([]),
            issuer: "CN=test".into(),
            listed: None,
        };
        let add = |host: &str, serial| Op::AddCertificate {
            address: https,
            certificate: cert(host, serial),
        };
        let frontend = |host: &str| {
            Op::AddFrontend(std::sync::Arc::new(Frontend {
                protocol: Protocol::Https,
                address: https,
                hostname: host.into(),
                path: crate::plan::state::PathRule::prefix("/"),
                method: None,
                header_predicates: Vec::new(),
                cluster_id: Some(format!("pi-{host}")),
                tags: Default::default(),
                hsts: None,
                policy: None,
                alias: false,
            }))
        };
        let plan = vec![
            add("a.z", 1),
            add("b.z", 2),
            frontend("a.z"),
            frontend("b.z"),
        ];
        let mut refusals = Refusals::default();
        let now = Instant::now();
        refusals.refused(&plan[0], "KeyMismatch".into(), BTreeSet::new(), now);
        let all = Scope::everything();
        let (send, held) = refusals.hold_back(plan.clone(), now, &all);
        assert_eq!(send, [add("b.z", 2), frontend("b.z")]);
        assert_eq!(held, [add("a.z", 1), frontend("a.z")]);
        assert_eq!(refusals.next_retry(), Some(now + Duration::from_secs(1)));
        // At its retry time it goes again; refused again, it waits twice as long.
        tokio::time::advance(Duration::from_secs(1)).await;
        let (send, _) = refusals.hold_back(plan.clone(), Instant::now(), &all);
        assert_eq!(send.len(), 4);
        refusals.refused(
            &plan[0],
            "KeyMismatch".into(),
            BTreeSet::new(),
            Instant::now(),
        );
        assert_eq!(
            refusals.next_retry(),
            Some(Instant::now() + Duration::from_secs(2))
        );
        // A new pair for the host is a new request: it goes at once, the old refusal is forgotten.
        let renewed = vec![add("a.z", 3), frontend("a.z")];
        let (send, held) = refusals.hold_back(renewed.clone(), Instant::now(), &all);
        assert_eq!((send, held.len()), (renewed, 0));
        assert!(refusals.is_empty());
    }
}
