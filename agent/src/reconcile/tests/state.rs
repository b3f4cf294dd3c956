//! A pass and a publish on the reconciler's state alone: no driver, no timer, no task. Facts
//! are taken in, a pass is run and the status published by hand, and what is asserted is what
//! the endpoints would show and what sozu holds.

use super::*;
use crate::reconcile::state::{NextPass, PassOutcome, Reconciler};

struct Alone {
    sozu: Fake,
    status: SharedStatus,
    clock: Arc<TokioClock>,
    state: Reconciler<Fake>,
}

fn alone() -> Alone {
    let sozu = Fake::default();
    let status = SharedStatus::default();
    // 2026-06-01.
    let clock = Arc::new(TokioClock::starting_at(
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_780_272_000),
    ));
    let state = Reconciler::new(
        sozu.clone(),
        status.clone(),
        clock.clone(),
        ReadinessMode::default(),
        Settings::default().expiry_warning,
    );
    Alone {
        sozu,
        status,
        clock,
        state,
    }
}

impl Alone {
    /// Takes `facts` in and runs the pass they ask for.
    async fn pass(&mut self, facts: Vec<Fact>) -> PassOutcome {
        let mut next = NextPass::default();
        for fact in facts {
            self.state.absorb(fact, &mut next);
        }
        assert!(next.needs_pass(), "the facts ask for a pass: {next:?}");
        self.state.pass(next).await
    }

    fn pair(&self, host: &str) -> (Certificate, Fact) {
        let c = certificate(host, self.clock.now(), 90);
        (c.clone(), Fact::Pairs(vec![(host.into(), Ok(c))]))
    }

    fn served(&self, host: &str) -> Vec<std::sync::Arc<str>> {
        self.sozu.served(host)
    }
}

#[tokio::test(start_paused = true)]
async fn a_pass_on_the_state_alone_serves_a_route_and_a_rotation_costs_one_request() {
    let mut a = alone();
    let (first, pair) = a.pair(A);
    let outcome = a
        .pass(vec![workspace(vec![route(A, ip("10.0.0.1:80"))]), pair])
        .await;
    let PassOutcome::Done { requests_sent } = outcome else {
        panic!("sozu was reached: {outcome:?}");
    };
    assert!(requests_sent > 1, "{requests_sent}");
    // Nothing is shown until the state is published.
    assert!(!a.status.status().ready);
    a.state.publish(false);
    let shown = a.status.status();
    assert!(shown.ready, "{:?}", shown.readiness);
    assert_eq!(route_state(&shown, A), Some((RouteState::Ok, vec![])));
    assert_eq!(a.served(A), [first.fingerprint]);

    // A renewed pair: the pass trusts the shadow and replaces the certificate alone.
    let (renewed, pair) = a.pair(A);
    let requests = a.sozu.0.lock().unwrap().requests;
    let mut next = NextPass::default();
    a.state.absorb(pair, &mut next);
    assert!(next.certificates_only());
    assert_eq!(
        a.state.pass(next).await,
        PassOutcome::Done { requests_sent: 1 }
    );
    assert_eq!(a.sozu.0.lock().unwrap().requests, requests + 1);
    assert_eq!(a.served(A), std::slice::from_ref(&renewed.fingerprint));
    a.state.publish(false);
    let route = &a.status.status().routes[0];
    assert_eq!(route.certificate.served_fingerprints, [renewed.fingerprint]);
    assert_eq!(route.certificate.rotations, 1);
}

#[tokio::test(start_paused = true)]
async fn a_pass_that_cannot_reach_sozu_is_shown_and_the_next_one_recovers() {
    let mut a = alone();
    a.sozu.0.lock().unwrap().down = true;
    let (_, pair) = a.pair(A);
    let outcome = a
        .pass(vec![workspace(vec![route(A, ip("10.0.0.1:80"))]), pair])
        .await;
    assert_eq!(outcome, PassOutcome::Unreachable);
    a.state.publish(false);
    let shown = a.status.status();
    assert!(!shown.ready);
    assert!(
        shown
            .sozu
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("connection refused")),
        "{:?}",
        shown.sozu
    );
    // The desired state is built against what sozu holds: nothing to show of a route yet.
    assert!(shown.routes.is_empty(), "{:?}", shown.routes);

    // sozu is back: a pass that plans everything, as the driver's retry does, serves the route.
    a.sozu.0.lock().unwrap().down = false;
    let outcome = a
        .state
        .pass(NextPass {
            everything: true,
            check_generation: true,
            ..NextPass::default()
        })
        .await;
    assert!(matches!(outcome, PassOutcome::Done { .. }), "{outcome:?}");
    a.state.publish(false);
    let shown = a.status.status();
    assert!(shown.ready, "{:?}", shown.readiness);
    assert_eq!(shown.sozu.last_error, None);
    assert_eq!(route_state(&shown, A), Some((RouteState::Ok, vec![])));
}

#[tokio::test(start_paused = true)]
async fn a_publish_while_settling_keeps_readiness_waiting() {
    let mut a = alone();
    let (_, pair) = a.pair(A);
    a.pass(vec![workspace(vec![route(A, ip("10.0.0.1:80"))]), pair])
        .await;
    a.state.publish(true);
    let shown = a.status.status();
    assert!(!shown.ready);
    assert_eq!(
        shown.readiness.reason.as_deref(),
        Some("taking up sozu's reports of the changes just applied")
    );
    // The route itself is served meanwhile.
    assert_eq!(route_state(&shown, A), Some((RouteState::Ok, vec![])));
    assert!(!a.state.ready());
    a.state.publish(false);
    assert!(a.status.status().ready);
    assert!(a.state.ready());
}
