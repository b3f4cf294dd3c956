//! Readiness and liveness: what `/readyz` waits for and what it does not, `/healthz` of a wedged
//! loop.

use super::*;

#[tokio::test(start_paused = true)]
async fn converges_and_reports_ready() {
    let h = start(Settings::default());
    h.send(workspace(vec![
        route(A, dns("a.svc")),
        route(B, ip("10.0.0.2:80")),
    ]));
    h.send(answer("a.svc", &["10.0.0.1"], None));
    h.pair(A, 90);
    h.pair(B, 90);
    let status = h.until("ready", |s| s.ready).await;
    assert_eq!(h.hosts_routed(), BTreeSet::from([A.into(), B.into()]));
    assert_eq!(h.backends(A), ["10.0.0.1:80"]);
    assert!(status.routes.iter().all(|r| r.state == RouteState::Ok));
}

/// A route port sozu cannot bind is that route's problem: its status shows sozu's reason, it
/// counts as not served, and the agent is ready for the others (strictly, it is not). Once the
/// port can be bound, the listener's retry serves the route.
#[tokio::test(start_paused = true)]
async fn a_route_port_sozu_cannot_bind_is_the_routes_problem() {
    for readiness in [ReadinessMode::Serving, ReadinessMode::Strict] {
        let h = start(Settings {
            readiness,
            ..Settings::default()
        });
        let port: std::net::SocketAddr = "127.0.0.1:2222".parse().unwrap();
        h.sozu.0.lock().unwrap().unbindable.insert(port);
        let mut tcp = route(B, ip("10.0.0.2:22"));
        tcp.kind = crate::workspace::RouteKind::Tcp(crate::workspace::StreamRoute {
            listen_port: port.port(),
            proxy_protocol: false,
            limits: None,
            client_auth_exempt: false,
        });
        h.send(workspace(vec![route(A, ip("10.0.0.1:80")), tcp]));
        h.pair(A, 90);
        let status = h
            .until("the TCP route in error", |s| {
                route_state(s, B).is_some_and(|r| r.0 == RouteState::Error)
            })
            .await;
        let failing = status.routes.iter().find(|r| r.host == B).unwrap();
        assert!(
            failing
                .last_error
                .as_deref()
                .is_some_and(|e| e.contains("Address already in use")),
            "{failing:?}"
        );
        let status = h.until_ok(A).await;
        assert_eq!(status.readiness.routes_not_served, 1, "{readiness}");
        match readiness {
            ReadinessMode::Serving => assert!(status.ready, "{:?}", status.readiness),
            ReadinessMode::Strict => assert!(!status.ready, "{:?}", status.readiness),
        }
        h.sozu.0.lock().unwrap().unbindable.clear();
        let status = h
            .until("the TCP route served at its retry", |s| {
                route_state(s, B).is_some_and(|r| r.0 == RouteState::Ok)
            })
            .await;
        assert!(status.ready, "{readiness}: {:?}", status.readiness);
        assert_eq!(status.readiness.routes_not_served, 0);
    }
}

/// An IP route is served as soon as its pair is known, beside a DNS route whose name has never
/// resolved: that one is shown waiting for DNS. The agent is ready, serving the other route
/// (strictly, it is not).
#[tokio::test(start_paused = true)]
async fn a_route_needing_dns_waits_alone() {
    a_route_needing_dns_waits_alone_in(ReadinessMode::Serving).await;
    a_route_needing_dns_waits_alone_in(ReadinessMode::Strict).await;
}

async fn a_route_needing_dns_waits_alone_in(readiness: ReadinessMode) {
    let h = start(Settings {
        readiness,
        ..Settings::default()
    });
    h.send(workspace(vec![
        route(A, ip("10.0.0.1:80")),
        route(B, dns("never.svc")),
    ]));
    h.pair(A, 90);
    h.pair(B, 90);
    h.send(answer("never.svc", &[], Some("no answer within 5000 ms")));
    let status = h.until_ok(A).await;
    assert_eq!(h.backends(A), ["10.0.0.1:80"]);
    assert_eq!(
        route_state(&status, B),
        Some((RouteState::Pending, vec![Waiting::Dns]))
    );
    let b = status.routes.iter().find(|r| r.host == B).unwrap();
    assert_eq!(
        b.last_error.as_deref(),
        Some("resolving never.svc: no answer within 5000 ms")
    );
    assert_eq!(status.readiness.routes_not_served, 1, "{readiness}");
    match readiness {
        ReadinessMode::Serving => assert!(status.ready, "{:?}", status.readiness),
        ReadinessMode::Strict => {
            assert!(!status.ready);
            assert_eq!(
                status.readiness.reason.as_deref(),
                Some("not all of the 2 routes can be served (1 not served)")
            );
        }
    }
    // The name resolves: the route gets its backend, and the agent is ready.
    h.send(answer("never.svc", &["10.0.0.9"], None));
    h.until("every route served", |s| {
        s.ready && s.readiness.routes_not_served == 0
    })
    .await;
    assert_eq!(h.backends(B), ["10.0.0.9:80"]);
}

/// Readiness waits for what is not known yet, and not for a route that cannot be served: one
/// host's pair missing, another route's only name failing. Strictly, it waits for every route;
/// and a workspace none of whose routes can be served is not ready in either mode.
#[tokio::test(start_paused = true)]
async fn readiness_waits_for_unknowns_and_not_for_routes_that_cannot_be_served() {
    let missing = |host: &str| {
        Fact::Pairs(vec![(
            host.into(),
            Err(crate::certs::CertError::Unreadable {
                path: format!("/tls/{host}/tls.crt").into(),
                reason: "No such file or directory (os error 2)".into(),
            }),
        )])
    };
    for readiness in [ReadinessMode::Serving, ReadinessMode::Strict] {
        let h = start(Settings {
            readiness,
            ..Settings::default()
        });
        h.send(workspace(vec![
            route(A, ip("10.0.0.1:80")),
            route(B, ip("10.0.0.2:80")),
            route(C, dns("gone.svc")),
        ]));
        h.pair(A, 90);
        h.pair(C, 90);
        // B's pair has not been read yet, nor gone.svc looked up: not ready in either mode.
        let status = h.until_ok(A).await;
        assert!(!status.ready, "{readiness}: {:?}", status.readiness);
        assert_eq!(
            status.readiness.reason.as_deref(),
            Some("1 route(s) wait for their certificate pair to be read or issued")
        );
        h.send(missing(B));
        let status = h
            .until("B's failure shown", |s| {
                s.routes
                    .iter()
                    .any(|r| r.host == B && r.certificate.error.is_some())
            })
            .await;
        assert!(!status.ready, "{readiness}: {:?}", status.readiness);
        assert_eq!(
            status.readiness.reason.as_deref(),
            Some("1 upstream name(s) wait for their first lookup")
        );
        h.send(answer("gone.svc", &[], Some("NXDOMAIN")));
        let status = h
            .until("gone.svc's failure shown", |s| {
                s.routes
                    .iter()
                    .any(|r| r.host == C && r.last_error.is_some())
            })
            .await;
        assert_eq!(status.readiness.routes_not_served, 2, "{readiness}");
        assert_eq!(status.readiness.mode, readiness);
        match readiness {
            ReadinessMode::Serving => assert!(status.ready, "{:?}", status.readiness),
            ReadinessMode::Strict => assert!(!status.ready, "{:?}", status.readiness),
        }
        // B has no frontend (no certificate); C has, and no backend: sozu answers 503.
        assert_eq!(h.hosts_routed(), BTreeSet::from([A.into(), C.into()]));
        // An edit that leaves only the two broken routes: none can be served, not ready.
        h.send(workspace(vec![
            route(B, ip("10.0.0.2:80")),
            route(C, dns("gone.svc")),
        ]));
        let status = h.until("the edit applied", |s| s.routes.len() == 2).await;
        assert!(!status.ready, "{readiness}: {:?}", status.readiness);
        assert_eq!(
            status.readiness.reason.as_deref(),
            Some("none of the 2 routes can be served (2 not served)")
        );
    }
}

/// A users file is read on a thread of its own, which may answer after the first pass: until
/// it has, the route is applied without credentials (everyone refused), and the agent is not
/// ready. Once read, the credentials are in sozu and the agent is ready.
#[tokio::test(start_paused = true)]
async fn readiness_waits_for_a_users_file_to_be_read() {
    let users_file = std::path::PathBuf::from("/etc/auth/admin.users");
    let h = start(Settings::default());
    let mut guarded = route(A, ip("10.0.0.1:80"));
    guarded.http_mut().policy = Some(Box::new(crate::workspace::RoutePolicy {
        basic_auth: Some(crate::workspace::BasicAuth {
            users_file: users_file.clone(),
            realm: "Admin".into(),
        }),
        ..Default::default()
    }));
    h.send(workspace(vec![guarded]));
    h.pair(A, 90);
    let status = h.until_ok(A).await;
    assert!(!status.ready, "{:?}", status.readiness);
    assert_eq!(
        status.readiness.reason.as_deref(),
        Some("1 policy file(s) wait for their first read")
    );
    let hashes = || {
        let s = h.sozu.0.lock().unwrap();
        s.actual
            .cluster_policies
            .get(&crate::workspace::route_id(A, "/"))
            .map(|p| p.authorized_hashes.clone())
            .unwrap_or_default()
    };
    assert!(hashes().is_empty(), "credentials before the file was read");
    let mut reads = crate::sources::route_policy_files::PolicyFileReads::default();
    let line = format!("alice:{}", "0".repeat(64));
    reads
        .users
        .insert(users_file, Ok(Arc::from(vec![line.clone()])));
    h.send(Fact::PolicyFiles(Box::new(reads)));
    h.until("ready", |s| s.ready).await;
    assert_eq!(hashes(), [line]);
}

/// The issuer's progress as a test sets it.
#[derive(Default)]
struct FakeIssuer(std::sync::Mutex<(u64, crate::reconcile::readiness::Stalled)>);

impl crate::reconcile::readiness::IssuerProgress for FakeIssuer {
    fn version(&self) -> u64 {
        self.0.lock().unwrap().0
    }

    fn stalled(&self) -> crate::reconcile::readiness::Stalled {
        self.0.lock().unwrap().1.clone()
    }
}

/// With `'sozu_managed`, a pair missing from the tls dir is one the agent's issuer is still
/// getting: waited for, until the issuer backs off on that host.
#[tokio::test(start_paused = true)]
async fn with_sozu_managed_a_missing_pair_is_waited_for_until_the_issuer_backs_off() {
    let issuer = Arc::new(FakeIssuer::default());
    let h = start_with(Settings::default(), Some(issuer.clone()));
    let Fact::Workspace(Ok(ws)) = workspace(vec![
        route(A, ip("10.0.0.1:80")),
        route(B, ip("10.0.0.2:80")),
    ]) else {
        unreachable!()
    };
    let mut ws = (*ws).clone();
    ws.tls_rotation = crate::workspace::TlsRotation::SozuManaged;
    h.send(Fact::Workspace(Ok(Arc::new(ws))));
    h.pair(A, 90);
    h.send(Fact::Pairs(vec![(
        B.into(),
        Err(crate::certs::CertError::Unreadable {
            path: format!("/tls/{B}/tls.crt").into(),
            reason: "No such file or directory (os error 2)".into(),
        }),
    )]));
    let status = h
        .until("B's missing pair shown", |s| {
            s.routes
                .iter()
                .any(|r| r.host == B && r.certificate.error.is_some())
        })
        .await;
    assert!(!status.ready, "{:?}", status.readiness);
    assert_eq!(
        status.readiness.reason.as_deref(),
        Some("1 route(s) wait for their certificate pair to be read or issued")
    );
    *issuer.0.lock().unwrap() = (
        1,
        crate::reconcile::readiness::Stalled {
            all: false,
            hosts: BTreeSet::from([B.to_owned()]),
        },
    );
    // The loop reads the issuer at its next turn: at the latest one TICK later.
    tokio::time::sleep(crate::reconcile::driver::TICK).await;
    let status = h.until("ready without B", |s| s.ready).await;
    assert_eq!(status.readiness.routes_not_served, 1);
}

/// `/healthz` as the kubelet sees it.
async fn healthz(h: &Harness) -> (u16, String) {
    use tower::ServiceExt;
    let views = crate::api::Views {
        status: h.status.clone(),
        heartbeat: h.heartbeat.clone(),
        ..crate::api::Views::default()
    };
    let response = crate::api::admin::router(views, Default::default())
        .oneshot(
            http::Request::get("/healthz")
                .header(http::header::HOST, "127.0.0.1:9180")
                .body(axum::body::Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    let status = response.status().as_u16();
    let body = axum::body::to_bytes(response.into_body(), 1 << 16)
        .await
        .unwrap();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// A loop that waits for facts is alive; one stuck in a pass that never ends is not, and
/// `/healthz` says so once it has not turned for the bound.
#[tokio::test(start_paused = true)]
async fn healthz_fails_when_the_loop_is_wedged() {
    let h = start(Settings::default());
    h.send(workspace(vec![route(A, ip("10.0.0.1:80"))]));
    h.pair(A, 90);
    h.until("ready", |s| s.ready).await;
    // Idle for ten minutes, no fact at all: it still turns.
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert_eq!(healthz(&h).await, (200, "ok\n".to_owned()));
    // A rotation whose request sozu never answers.
    h.sozu.0.lock().unwrap().hang = true;
    h.pair(A, 120);
    tokio::time::sleep(crate::api::DEFAULT_STALE_AFTER - Duration::from_secs(5)).await;
    assert_eq!(healthz(&h).await.0, 200, "within the bound");
    tokio::time::sleep(Duration::from_secs(10)).await;
    let (code, body) = healthz(&h).await;
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("has not turned for"), "{body}");
}

/// A start's bulk pass leaves sozu's reports of its changes queued for the loop, and a pair
/// swapped during it queued behind them. `/readyz` says ready only once the loop has taken them
/// up: the swapped pair is sent before readiness says ready, not after it, behind the start.
#[tokio::test(start_paused = true)]
async fn readiness_waits_for_what_queued_during_the_start() {
    let h = start(Settings {
        resync: None,
        ..Settings::default()
    });
    let hosts: Vec<String> = (0..100).map(|i| format!("h{i}.in.example.org")).collect();
    let swapped = certificate(&hosts[7], h.clock.now(), 90);
    {
        let mut s = h.sozu.0.lock().unwrap();
        s.events = Some(h.facts.clone());
        // Four requests a route (cluster, two frontends, certificate): past the first third.
        s.during = Some((
            150,
            Fact::Pairs(vec![(hosts[7].clone(), Ok(swapped.clone()))]),
        ));
        s.watch = Some((h.status.clone(), Vec::new()));
    }
    h.send(workspace(
        hosts
            .iter()
            .enumerate()
            .map(|(i, host)| route(host, ip(&format!("10.0.2.{}:80", i + 1))))
            .collect(),
    ));
    for host in &hosts {
        h.pair(host, 90);
    }
    h.until("ready", |s| s.ready).await;
    assert_eq!(
        h.served(&hosts[7]),
        std::slice::from_ref(&swapped.fingerprint)
    );
    let s = h.sozu.0.lock().unwrap();
    let seen = &s.watch.as_ref().unwrap().1;
    assert!(seen.len() > 400, "a bulk start: {} requests", seen.len());
    let sent_when_ready = seen
        .iter()
        .find(|(_, fp)| fp.as_deref() == Some(&*swapped.fingerprint))
        .map(|(ready, _)| *ready);
    assert_eq!(
        sent_when_ready,
        Some(false),
        "the swapped pair was sent before /readyz said ready"
    );
    drop(s);
    // Nothing of the start was taken for drift.
    assert_eq!(h.status().counters.drift_repairs, 0);
}
