//! A rotation taken up while sozu answers an edit's requests: it goes past them when its
//! requests commute with theirs, and waits for them otherwise; facts other than pairs wait for
//! the edit, and the pairs after them too.

use super::*;

/// Two routes served, and a gate that holds the next change's requests from sozu, as sozu's
/// answers to an edit take their time.
async fn served_and_gated() -> (Harness, Arc<tokio::sync::Notify>) {
    let h = start(Settings::default());
    h.send(workspace(vec![
        route(A, ip("10.0.0.1:80")),
        route(B, ip("10.0.0.2:80")),
    ]));
    h.pair(A, 90);
    h.pair(B, 90);
    h.until("ready", |s| s.ready).await;
    let gate = Arc::new(tokio::sync::Notify::new());
    h.sozu.0.lock().unwrap().send_gate = Some(gate.clone());
    (h, gate)
}

/// The edit the tests make while the gate holds it: C added beside A and B.
fn bringing_c_in() -> Fact {
    workspace(vec![
        route(A, ip("10.0.0.1:80")),
        route(B, ip("10.0.0.2:80")),
        route(C, ip("10.0.0.3:80")),
    ])
}

impl Harness {
    /// Waits (in paused time) until a change's requests wait at the gate.
    async fn until_gated(&self) {
        for _ in 0..10_000 {
            if self.sozu.0.lock().unwrap().sends_waiting > 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        panic!("no change waits at the gate");
    }

    /// Lets the change at the gate through, and those after it.
    fn open_gate(&self, gate: &tokio::sync::Notify) {
        self.sozu.0.lock().unwrap().send_gate = None;
        gate.notify_one();
    }
}

#[tokio::test(start_paused = true)]
async fn a_rotation_goes_past_an_edit_sozu_has_not_answered() {
    let (h, gate) = served_and_gated().await;
    h.pair(C, 90);
    h.send(bringing_c_in());
    h.until_gated().await;
    let renewed = h.pair(A, 90);
    h.until("A's renewal served", |_| {
        h.served(A) == [renewed.fingerprint.clone()]
    })
    .await;
    assert!(
        !h.hosts_routed().contains(C),
        "the edit's requests are still waiting"
    );
    assert_eq!(h.sozu.0.lock().unwrap().sent_past, 1);
    // The status shows neither before sozu has answered the edit: C is not served yet.
    assert!(route_state(&h.status(), C).is_none_or(|r| r.0 != RouteState::Ok));
    h.open_gate(&gate);
    let status = h.until_ok(C).await;
    let a = status.routes.iter().find(|r| r.host == A).unwrap();
    assert_eq!(a.certificate.rotations, 1, "the rotation is shown");
    assert_eq!(h.served(A), [renewed.fingerprint], "the renewal stays");
    assert_eq!(
        h.hosts_routed().len(),
        3,
        "{:#?} {:#?}",
        h.hosts_routed(),
        h.sozu
            .0
            .lock()
            .unwrap()
            .actual
            .frontends
            .iter()
            .map(|f| (f.hostname.clone(), f.protocol))
            .collect::<Vec<_>>()
    );
    assert_eq!(h.backends(C), ["10.0.0.3:80"]);
}

/// sozu reports the edit's changes while it answers them: the reports wait for the edit (the
/// ledger must know its requests were sent), and a renewal after them still goes past it.
#[tokio::test(start_paused = true)]
async fn a_rotation_goes_past_an_edit_after_sozus_reports_of_it() {
    let (h, gate) = served_and_gated().await;
    h.send(bringing_c_in());
    h.until_gated().await;
    let report = Fact::Sozu(SozuEvent::Changed(Change {
        kind: ChangeKind::ClusterAdded,
        cluster_id: Some(crate::workspace::route_id(C, "/")),
        address: None,
    }));
    h.send(report.clone());
    h.send(report);
    let renewed = h.pair(A, 90);
    h.until("A's renewal served", |_| {
        h.served(A) == [renewed.fingerprint.clone()]
    })
    .await;
    assert_eq!(h.sozu.0.lock().unwrap().sent_past, 1);
    h.open_gate(&gate);
    h.until("C routed", |_| h.backends(C) == ["10.0.0.3:80"])
        .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        h.status().counters.drift_repairs,
        0,
        "the edit's reports taken for someone else's change"
    );
}

/// The edit brings C in, with its certificate; a renewal of C's pair meanwhile would plan the
/// edit's own requests for C again (its frontends): it waits, and is served once the edit is
/// answered.
#[tokio::test(start_paused = true)]
async fn a_rotation_of_a_host_the_edit_brings_in_waits_for_the_edit() {
    let (h, gate) = served_and_gated().await;
    let first = h.pair(C, 90);
    h.send(bringing_c_in());
    h.until_gated().await;
    let renewed = h.pair(C, 90);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(h.served(C).is_empty(), "nothing of C goes before the edit");
    assert_eq!(h.sozu.0.lock().unwrap().sent_past, 0);
    h.open_gate(&gate);
    h.until("C's renewal served", |_| {
        h.served(C) == [renewed.fingerprint.clone()]
    })
    .await;
    assert_ne!(first.fingerprint, renewed.fingerprint);
    h.until_ok(C).await;
}

/// The edit brings C in before C's pair was read, as a tls dir source reads a new host's pair
/// once it follows the edit: the pair arrives while sozu answers the edit and waits for it (C's
/// frontends go with it). A renewal of A after it is none of C's: it still goes past the edit.
#[tokio::test(start_paused = true)]
async fn a_rotation_goes_past_an_edit_after_another_that_waits_for_it() {
    let (h, gate) = served_and_gated().await;
    h.send(bringing_c_in());
    h.until_gated().await;
    let brought_in = h.pair(C, 90);
    let renewed = h.pair(A, 90);
    h.until("A's renewal served", |_| {
        h.served(A) == [renewed.fingerprint.clone()]
    })
    .await;
    assert!(h.served(C).is_empty(), "nothing of C goes before the edit");
    assert_eq!(h.sozu.0.lock().unwrap().sent_past, 1);
    h.open_gate(&gate);
    h.until("C served", |_| {
        h.served(C) == [brought_in.fingerprint.clone()]
    })
    .await;
    let status = h.until_ok(C).await;
    let a = status.routes.iter().find(|r| r.host == A).unwrap();
    assert_eq!(a.certificate.rotations, 1, "the rotation is shown");
    assert_eq!(h.served(A), [renewed.fingerprint], "the renewal stays");
    assert_eq!(h.backends(C), ["10.0.0.3:80"]);
}

/// A fact other than a pair (here a DNS answer) arrives first: it waits for the edit, and the
/// renewal after it waits too, so that facts are taken up in their order.
#[tokio::test(start_paused = true)]
async fn a_rotation_after_another_fact_waits_for_the_edit() {
    let (h, gate) = served_and_gated().await;
    let before = h.served(B);
    h.send(bringing_c_in());
    h.until_gated().await;
    h.send(answer("db.internal", &["10.0.1.1"], None));
    let renewed = h.pair(B, 90);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(h.served(B), before);
    h.open_gate(&gate);
    h.until("B's renewal served", |_| {
        h.served(B) == [renewed.fingerprint.clone()]
    })
    .await;
    assert_eq!(h.sozu.0.lock().unwrap().sent_past, 0);
}

/// A start's first pass, before any pair was read, is with sozu when the pairs arrive: their
/// rotations bring the hosts' frontends in, so they wait for it. Readiness says ready only once
/// sozu holds them: never while a request of theirs is still to be sent. (25 routes, as the
/// real proxy sends them: the first pass's 54 requests one at a time, the pairs' 75 in bulk.)
#[tokio::test(start_paused = true)]
async fn pairs_read_during_a_starts_first_pass_wait_and_readiness_waits_for_them() {
    let h = start(Settings::default());
    let gate = Arc::new(tokio::sync::Notify::new());
    {
        let mut s = h.sozu.0.lock().unwrap();
        s.send_gate = Some(gate.clone());
        s.bulk_from = Some(crate::sozu::bulk::BATCH_MIN);
        s.watch = Some((h.status.clone(), Vec::new()));
    }
    let hosts: Vec<String> = (0..25).map(|i| format!("svc{i}.in.example.org")).collect();
    h.send(workspace(
        hosts
            .iter()
            .enumerate()
            .map(|(i, host)| route(host, ip(&format!("10.0.3.{}:80", i + 1))))
            .collect(),
    ));
    h.until_gated().await;
    // The tls dir source reads every pair at start and sends them in one fact.
    let now = h.clock.now();
    h.send(Fact::Pairs(
        hosts
            .iter()
            .map(|host| (host.clone(), Ok(certificate(host, now, 90))))
            .collect(),
    ));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(h.sozu.0.lock().unwrap().sent_past, 0);
    h.open_gate(&gate);
    h.until("ready", |s| s.ready).await;
    assert_eq!(h.hosts_routed().len(), hosts.len());
    let s = h.sozu.0.lock().unwrap();
    let seen = &s.watch.as_ref().unwrap().1;
    assert!(
        seen.iter().all(|(ready, _)| !ready),
        "a request sent while /readyz said ready: {seen:?}"
    );
}

/// A renewal of many pairs at once waits for the edit, then goes over every connection, rather
/// than one request at a time past it.
#[tokio::test(start_paused = true)]
async fn a_mass_renewal_waits_for_the_edit() {
    let h = start(Settings::default());
    let hosts: Vec<String> = (0..20).map(|i| format!("svc{i}.in.example.org")).collect();
    let routes = |extra: bool| {
        let mut routes: Vec<Route> = hosts
            .iter()
            .enumerate()
            .map(|(i, host)| route(host, ip(&format!("10.0.3.{}:80", i + 1))))
            .collect();
        if extra {
            routes.push(route(C, ip("10.0.0.3:80")));
        }
        workspace(routes)
    };
    h.send(routes(false));
    let renew = || {
        let now = h.clock.now();
        let pairs: Vec<(String, Certificate)> = hosts
            .iter()
            .map(|host| (host.clone(), certificate(host, now, 90)))
            .collect();
        h.send(Fact::Pairs(
            pairs
                .iter()
                .map(|(h, c)| (h.clone(), Ok(c.clone())))
                .collect(),
        ));
        pairs
    };
    renew();
    h.until("ready", |s| s.ready).await;
    let gate = Arc::new(tokio::sync::Notify::new());
    h.sozu.0.lock().unwrap().send_gate = Some(gate.clone());
    h.send(routes(true));
    h.until_gated().await;
    let renewed = renew();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(h.sozu.0.lock().unwrap().sent_past, 0);
    h.open_gate(&gate);
    h.until("every renewal served", |_| {
        renewed
            .iter()
            .all(|(host, c)| h.served(host) == [c.fingerprint.clone()])
    })
    .await;
}
