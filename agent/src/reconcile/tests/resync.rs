//! A resync beside the loop: a rotation never waits for its read, an unchanged sozu costs no
//! request, what differs is repaired, a failed read is shown and stops nothing; and a back-off
//! never outlasts a sozu already listening.

use super::*;

/// The resync's read is held open, as a long read of a large state is: a rotation that comes
/// meanwhile is served before the read ends, and the read, which may have listed sozu before
/// or after it, puts nothing back.
#[tokio::test(start_paused = true)]
async fn a_rotation_during_a_resync_read_is_served_before_the_read_ends() {
    let h = start(Settings::default());
    h.send(workspace(vec![route(A, ip("10.0.0.1:80"))]));
    h.pair(A, 90);
    h.until("ready", |s| s.ready).await;
    let gate = Arc::new(tokio::sync::Notify::new());
    h.sozu.0.lock().unwrap().read_gate = Some(gate.clone());
    tokio::time::sleep(Duration::from_secs(61)).await;
    assert_eq!(
        h.sozu.0.lock().unwrap().reads_beside,
        1,
        "the resync's read is under way"
    );
    let renewed = h.pair(A, 90);
    h.until("the rotation served during the read", |_| {
        h.served(A) == [renewed.fingerprint.clone()]
    })
    .await;
    assert_eq!(h.status().counters.resyncs, 0, "the read has not ended");
    let requests = h.sozu.0.lock().unwrap().requests;
    gate.notify_one();
    h.until("the resync done", |s| s.counters.resyncs == 1)
        .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(h.served(A), [renewed.fingerprint], "the new pair stays");
    assert_eq!(
        h.sozu.0.lock().unwrap().requests,
        requests,
        "nothing sent again"
    );
}

#[tokio::test(start_paused = true)]
async fn a_resync_of_an_unchanged_sozu_sends_nothing_and_repairs_what_changed() {
    let h = start(Settings::default());
    h.send(workspace(vec![
        route(A, ip("10.0.0.1:80")),
        route(B, ip("10.0.0.2:80")),
    ]));
    h.pair(A, 90);
    h.pair(B, 90);
    h.until("ready", |s| s.ready).await;
    let requests = h.sozu.0.lock().unwrap().requests;
    tokio::time::sleep(Duration::from_secs(60)).await;
    h.until("one resync", |s| s.counters.resyncs == 1).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(h.sozu.0.lock().unwrap().requests, requests, "nothing sent");
    // Someone removes B's frontends behind the agent's back, and no event says so: the next
    // resync puts them back, and B's alone.
    h.sozu
        .0
        .lock()
        .unwrap()
        .actual
        .frontends
        .retain(|f| f.hostname != B);
    assert_eq!(h.hosts_routed(), BTreeSet::from([A.into()]));
    tokio::time::sleep(Duration::from_secs(59)).await;
    h.until("two resyncs", |s| s.counters.resyncs == 2).await;
    h.until("B routed again", |_| h.hosts_routed().len() == 2)
        .await;
    let sent = h.sozu.0.lock().unwrap().requests - requests;
    assert!(
        (1..=2).contains(&sent),
        "B's frontends only: {sent} requests"
    );
}

/// A read that fails is shown (status, readiness's body) and counted; rotations go on; the
/// next read that succeeds clears it.
#[tokio::test(start_paused = true)]
async fn a_failed_resync_read_is_shown_and_stops_no_rotation() {
    let h = start(Settings::default());
    h.send(workspace(vec![route(A, ip("10.0.0.1:80"))]));
    h.pair(A, 90);
    h.until("ready", |s| s.ready).await;
    h.sozu.0.lock().unwrap().read_fails = Some("message too large for the buffer".into());
    tokio::time::sleep(Duration::from_secs(60)).await;
    let status = h
        .until("the failure shown", |s| s.sozu.last_read_error.is_some())
        .await;
    assert!(status.ready, "a pod whose sozu serves stays in service");
    assert!(status
        .sozu
        .last_read_error
        .as_deref()
        .is_some_and(|e| e.contains("too large")));
    assert_eq!(status.counters.sozu_read_failures, 1);
    let renewed = h.pair(A, 90);
    h.until("rotated", |_| h.served(A) == [renewed.fingerprint.clone()])
        .await;
    h.sozu.0.lock().unwrap().read_fails = None;
    tokio::time::sleep(Duration::from_secs(59)).await;
    let status = h
        .until("cleared", |s| {
            s.sozu.last_read_error.is_none() && s.counters.resyncs >= 1
        })
        .await;
    assert_eq!(status.counters.sozu_read_failures, 1);
}

/// The back-off has grown to its ceiling; sozu comes back at a socket the agent has not tried,
/// and no event of the socket's watch comes (it came before the agent saw the old connection
/// break): the wait ends at the next look at the socket, not when the back-off would.
#[tokio::test(start_paused = true)]
async fn a_sozu_listening_again_ends_a_long_back_off() {
    let h = start(Settings::default());
    h.sozu.0.lock().unwrap().down = true;
    h.send(workspace(vec![route(A, ip("10.0.0.1:80"))]));
    h.pair(A, 90);
    tokio::time::sleep(Duration::from_secs(60)).await;
    let failures = h.status().counters.reconcile_errors;
    assert!(failures >= 6, "{failures}: the back-off has grown");
    {
        let mut s = h.sozu.0.lock().unwrap();
        s.down = false;
        s.listening_again = true;
    }
    let started = tokio::time::Instant::now();
    h.until("ready", |s| s.ready).await;
    assert!(
        started.elapsed() <= crate::reconcile::phase::PROBE_EVERY,
        "{:?}",
        started.elapsed()
    );
    assert_eq!(h.hosts_routed(), BTreeSet::from([A.into()]));
}
