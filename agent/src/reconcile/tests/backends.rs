//! Backends: DNS answers moving them, drains, and routes whose every backend is down.

use super::*;

#[tokio::test(start_paused = true)]
async fn a_new_dns_answer_moves_the_backends_and_a_failure_keeps_them() {
    let h = start(Settings::default());
    h.send(workspace(vec![route(A, dns("a.svc"))]));
    h.send(answer("a.svc", &["10.0.0.1"], None));
    h.pair(A, 90);
    h.until("ready", |s| s.ready).await;
    h.send(answer("a.svc", &["10.0.0.7", "fd00::7"], None));
    h.until("moved", |_| {
        h.backends(A) == ["10.0.0.7:80", "[fd00::7]:80"]
    })
    .await;
    h.send(answer("a.svc", &["10.0.0.7", "fd00::7"], Some("SERVFAIL")));
    let status = h
        .until("the failure shown", |s| s.routes[0].last_error.is_some())
        .await;
    assert_eq!(h.backends(A), ["10.0.0.7:80", "[fd00::7]:80"]);
    assert_eq!(status.routes[0].state, RouteState::Error);
}

/// A route of `A` over two IP upstreams, the first drained or not.
fn two_upstreams(drain_first: bool) -> Route {
    let mut r = route(A, ip("10.0.0.1:80"));
    r.upstreams = vec![
        crate::workspace::RouteUpstream {
            upstream: ip("10.0.0.1:80"),
            weight: 9,
            drain: drain_first,
        },
        crate::workspace::RouteUpstream {
            upstream: ip("10.0.0.2:80"),
            weight: 1,
            drain: false,
        },
    ];
    r
}

fn upstream_state(status: &Document, address: &str) -> Option<String> {
    status
        .routes
        .iter()
        .flat_map(|r| &r.upstreams)
        .find(|u| u.upstream == address)
        .map(|u| u.state.clone())
}

#[tokio::test(start_paused = true)]
async fn a_drained_upstream_is_draining_until_sozu_says_its_last_connection_ended() {
    use crate::sources::sozu_events::SozuEvent;
    let h = start(Settings::default());
    h.send(workspace(vec![two_upstreams(false)]));
    h.pair(A, 90);
    h.until("ready", |s| s.ready).await;
    assert_eq!(h.backends(A), ["10.0.0.1:80", "10.0.0.2:80"]);

    h.send(workspace(vec![two_upstreams(true)]));
    let status = h
        .until("draining", |s| {
            upstream_state(s, "10.0.0.1:80").is_some_and(|u| u.starts_with("draining"))
        })
        .await;
    assert_eq!(h.backends(A), ["10.0.0.2:80"]);
    // The fake sozu answers that no session was left finishing.
    assert_eq!(
        upstream_state(&status, "10.0.0.1:80").as_deref(),
        Some("draining (0 sessions)")
    );
    assert_eq!(
        upstream_state(&status, "10.0.0.2:80").as_deref(),
        Some("in rotation")
    );
    h.send(Fact::Sozu(SozuEvent::BackendDrained {
        backend_id: format!("pi-{A}-10.0.0.1:80"),
    }));
    h.until("drained", |s| {
        upstream_state(s, "10.0.0.1:80").as_deref() == Some("drained")
    })
    .await;
    // Undrained: back in rotation, with its weight.
    h.send(workspace(vec![two_upstreams(false)]));
    h.until("in rotation", |s| {
        upstream_state(s, "10.0.0.1:80").as_deref() == Some("in rotation")
    })
    .await;
    let s = h.sozu.0.lock().unwrap();
    let weights: Vec<u32> = s.actual.backends[&format!("pi-{A}")]
        .values()
        .map(|b| b.weight)
        .collect();
    assert_eq!(weights, [9, 1]);
}

#[tokio::test(start_paused = true)]
async fn a_route_whose_backends_are_all_down_or_drained_shows_it() {
    use crate::document::BackendHealth;
    use crate::sources::sozu_events::SozuEvent;
    let h = start(Settings::default());
    h.send(workspace(vec![two_upstreams(false)]));
    h.pair(A, 90);
    h.until("ready", |s| s.ready).await;
    let down = |address: &str| {
        Fact::Sozu(SozuEvent::BackendDown {
            backend_id: format!("pi-{A}-{address}"),
        })
    };
    h.send(down("10.0.0.1:80"));
    let status = h
        .until("one down", |s| {
            s.routes[0]
                .upstreams
                .iter()
                .any(|u| u.backends[0].health == BackendHealth::Down)
        })
        .await;
    assert!(!status.routes[0].no_available_backend);
    h.send(down("10.0.0.2:80"));
    let status = h
        .until("none left", |s| s.routes[0].no_available_backend)
        .await;
    assert_eq!(status.routes[0].state, RouteState::Error);
    assert_eq!(
        status.routes[0].last_error.as_deref(),
        Some(
            "every backend is reported down: sozu still tries them (fail-open) and answers 503 when none connects"
        )
    );
    h.send(Fact::Sozu(SozuEvent::BackendUp {
        backend_id: format!("pi-{A}-10.0.0.2:80"),
    }));
    let status = h.until("back", |s| !s.routes[0].no_available_backend).await;
    let b = &status.routes[0].upstreams[1].backends[0];
    assert_eq!((b.health, b.transitions), (BackendHealth::Up, 2));
    // Every upstream drained: no backend, said so.
    let mut both = two_upstreams(true);
    both.upstreams[1].drain = true;
    h.send(workspace(vec![both]));
    let status = h
        .until("all drained", |s| {
            s.routes[0].last_error.as_deref() == Some("every upstream is drained: sozu answers 503")
        })
        .await;
    assert!(status.routes[0].no_available_backend);
    assert!(h.backends(A).is_empty());
}
