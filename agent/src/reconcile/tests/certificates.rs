//! Certificates: a rotation, a refusal that holds back its host alone, the served validity, the
//! expiry flag.

use super::*;

/// A certificate sozu refuses holds back only its own host, and is retried on its own
/// schedule; another host's rotation meanwhile goes through at once.
#[tokio::test(start_paused = true)]
async fn a_refused_certificate_delays_no_other_host() {
    let h = start(Settings::default());
    h.send(workspace(vec![
        route(A, ip("10.0.0.1:80")),
        route(B, ip("10.0.0.2:80")),
    ]));
    let a = certificate(A, h.clock.now(), 90);
    h.sozu
        .0
        .lock()
        .unwrap()
        .refuse
        .insert(a.fingerprint.to_string());
    h.send(Fact::Pairs(vec![(A.into(), Ok(a.clone()))]));
    h.pair(B, 90);
    let status = h
        .until("the refusal shown", |s| {
            s.routes.iter().any(|r| r.last_error.is_some())
                && route_state(s, B).is_some_and(|r| r.0 == RouteState::Ok)
        })
        .await;
    // Ready, serving B; A is reported.
    assert!(status.ready, "{:?}", status.readiness);
    assert_eq!(status.readiness.routes_not_served, 1);
    assert!(status.routes[0]
        .last_error
        .as_deref()
        .unwrap()
        .contains("KeyMismatch"));
    assert_eq!(h.hosts_routed(), BTreeSet::from([B.into()]));
    let requests = h.sozu.0.lock().unwrap().requests;
    // B rotates: served at once, without waiting for A's retry.
    let renewed = h.pair(B, 90);
    h.until("B rotated", |_| {
        h.served(B) == [renewed.fingerprint.clone()]
    })
    .await;
    assert_eq!(
        h.sozu.0.lock().unwrap().requests,
        requests + 1,
        "one request, A's not sent again"
    );
    // sozu takes A's certificate on a retry.
    h.sozu.0.lock().unwrap().refuse.clear();
    h.until("every route served", |s| {
        s.ready && s.readiness.routes_not_served == 0
    })
    .await;
    assert_eq!(h.served(A), [a.fingerprint]);
}

/// While sozu refuses a renewal, the status gives the validity of the certificate it still
/// serves, not the renewal's on disk: the expiry alert is about what clients get.
#[tokio::test(start_paused = true)]
async fn the_served_validity_is_the_served_certificates_while_a_renewal_is_refused() {
    let h = start(Settings::default());
    h.send(workspace(vec![route(A, ip("10.0.0.1:80"))]));
    let old = h.pair(A, 3);
    let status = h.until("ready", |s| s.ready).await;
    let cert = &status.routes[0].certificate;
    assert_eq!(cert.served_not_before, Some(old.not_before));
    assert_eq!(cert.served_not_after, Some(old.not_after));

    let renewed = certificate(A, h.clock.now(), 90);
    h.sozu
        .0
        .lock()
        .unwrap()
        .refuse
        .insert(renewed.fingerprint.to_string());
    h.send(Fact::Pairs(vec![(A.into(), Ok(renewed.clone()))]));
    let status = h
        .until("the renewal refused", |s| {
            s.routes[0].last_error.is_some()
                && s.routes[0].certificate.disk_fingerprint.as_ref() == Some(&renewed.fingerprint)
        })
        .await;
    let cert = &status.routes[0].certificate;
    assert_eq!(cert.served_fingerprints, [old.fingerprint]);
    assert_eq!(cert.served_not_after, Some(old.not_after));
    assert_eq!(cert.disk_not_after, Some(renewed.not_after));

    h.sozu.0.lock().unwrap().refuse.clear();
    let status = h.until("ready", |s| s.ready).await;
    assert_eq!(
        status.routes[0].certificate.served_not_after,
        Some(renewed.not_after)
    );
}

#[tokio::test(start_paused = true)]
async fn a_new_pair_replaces_the_served_one_and_the_rotation_is_recorded() {
    let h = start(Settings::default());
    h.send(workspace(vec![route(A, ip("10.0.0.1:80"))]));
    h.pair(A, 90);
    h.until("ready", |s| s.ready).await;
    tokio::time::sleep(Duration::from_secs(3600)).await;
    let renewed = h.pair(A, 90);
    let status = h
        .until("rotated", |s| s.routes[0].certificate.rotations == 1)
        .await;
    assert_eq!(
        h.served(A),
        std::slice::from_ref(&renewed.fingerprint),
        "exactly the new one"
    );
    assert_eq!(
        status.routes[0].certificate.last_rotation,
        Some(1_780_272_000 + 3600),
        "at the clock's time"
    );
    // A refused pair on disk leaves the new one serving, and says why.
    h.send(Fact::Pairs(vec![(
        A.into(),
        Err(crate::certs::CertError::KeyMismatch {
            path: "/tls/a/tls.key".into(),
        }),
    )]));
    let status = h
        .until("refusal shown", |s| s.routes[0].certificate.error.is_some())
        .await;
    assert_eq!(
        status.routes[0].certificate.error_reason.as_deref(),
        Some("key_mismatch")
    );
    assert_eq!(status.counters.certificate_errors, 1);
    assert_eq!(h.served(A), [renewed.fingerprint]);
}

/// The expiry flag turns on by itself when the served certificate enters the warning, no fact
/// needed: 15 days left with a 14-day warning is not flagged, a day later it is.
#[tokio::test(start_paused = true)]
async fn a_served_certificate_is_flagged_when_it_enters_the_expiry_warning() {
    let h = start(Settings::default());
    h.send(workspace(vec![route(A, ip("10.0.0.1:80"))]));
    h.pair(A, 15);
    let status = h.until("ready", |s| s.ready).await;
    assert!(!status.routes[0].certificate.expiring_soon);
    tokio::time::sleep(Duration::from_secs(86_400 - 60)).await;
    assert!(!h.status().routes[0].certificate.expiring_soon);
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert!(h.status().routes[0].certificate.expiring_soon);
}
