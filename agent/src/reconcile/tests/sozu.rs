//! sozu as the loop meets it: restarted, unreachable, drifted, read again at a resync, loaded in
//! bulk; and a pass that starts from what it holds ends where one from scratch would.

use super::*;

#[tokio::test(start_paused = true)]
async fn a_broken_edit_keeps_the_last_good_workspace_serving() {
    let h = start(Settings::default());
    h.send(workspace(vec![route(A, ip("10.0.0.1:80"))]));
    h.pair(A, 90);
    h.until("ready", |s| s.ready).await;
    h.send(Fact::Workspace(Err("syntax error at ws.ncl:3:1".into())));
    let status = h
        .until("the error shown", |s| s.workspace.last_error.is_some())
        .await;
    assert_eq!(
        status.workspace.last_error.as_deref(),
        Some("syntax error at ws.ncl:3:1")
    );
    assert_eq!(status.counters.workspace_errors, 1);
    assert_eq!(h.hosts_routed(), BTreeSet::from([A.into()]));
    // The next good edit applies, and the error is cleared.
    h.send(workspace(vec![route(B, ip("10.0.0.2:80"))]));
    h.pair(B, 90);
    h.until("the new workspace served", |s| {
        s.ready && s.workspace.last_error.is_none() && s.routes.len() == 1
    })
    .await;
    assert_eq!(h.hosts_routed(), BTreeSet::from([B.into()]));
}

#[tokio::test(start_paused = true)]
async fn a_restarted_sozu_gets_the_whole_state_back() {
    let h = start(Settings::default());
    h.send(workspace(vec![route(A, ip("10.0.0.1:80"))]));
    h.pair(A, 90);
    h.until("ready", |s| s.ready).await;
    {
        let mut s = h.sozu.0.lock().unwrap();
        s.actual = Actual::default();
        s.restarts += 1;
    }
    h.send(Fact::SozuSocket);
    let status = h
        .until("served again", |s| {
            s.counters.sozu_reconnects == 1 && s.ready
        })
        .await;
    assert_eq!(h.hosts_routed(), BTreeSet::from([A.into()]));
    assert!(status.sozu.generation.unwrap().ends_with("workers 101"));
}

/// sozu down: the loop backs off (jittered, growing), absorbing facts meanwhile, and converges
/// once sozu answers; a new socket ends the wait at once.
#[tokio::test(start_paused = true)]
async fn an_unreachable_sozu_is_retried_with_backoff_and_a_new_socket_ends_the_wait() {
    let h = start(Settings::default());
    h.sozu.0.lock().unwrap().down = true;
    h.send(workspace(vec![route(A, ip("10.0.0.1:80"))]));
    h.pair(A, 90);
    h.until("the failure shown", |s| s.sozu.last_error.is_some())
        .await;
    tokio::time::sleep(Duration::from_secs(20)).await;
    let failures = h.status().counters.reconcile_errors;
    // 100 ms doubling (jittered) to 10 s: about eight attempts in 20 s, not two hundred.
    assert!((5..=12).contains(&failures), "{failures}");
    assert!(!h.status().ready);
    h.sozu.0.lock().unwrap().down = false;
    let started = tokio::time::Instant::now();
    h.send(Fact::SozuSocket);
    h.until("ready", |s| s.ready).await;
    assert!(
        started.elapsed() < Duration::from_millis(10),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(h.hosts_routed(), BTreeSet::from([A.into()]));
}

#[tokio::test(start_paused = true)]
async fn a_periodic_resync_reads_every_pair_and_repairs_drift() {
    let h = start(Settings::default());
    h.send(workspace(vec![route(A, ip("10.0.0.1:80"))]));
    h.pair(A, 90);
    h.until("ready", |s| s.ready).await;
    // Someone removes the frontends behind the agent's back, same sozu.
    h.sozu.0.lock().unwrap().actual.frontends.clear();
    tokio::time::sleep(Duration::from_secs(59)).await;
    assert!(h.hosts_routed().is_empty(), "not before the resync");
    assert_eq!(h.certs.0.load(Ordering::SeqCst), 0);
    let status = h.until("repaired", |s| s.counters.resyncs == 1).await;
    assert_eq!(h.hosts_routed(), BTreeSet::from([A.into()]));
    assert_eq!(h.certs.0.load(Ordering::SeqCst), 1, "every pair read again");
    assert!(status.ready);
}

/// A restarted agent finds sozu serving: until its first reads and lookups it keeps what sozu
/// holds (certificates, frontends, backends) instead of tearing it down, and once the facts
/// match, it sends nothing at all.
#[tokio::test(start_paused = true)]
async fn a_restarted_agent_keeps_what_sozu_serves_until_its_facts_arrive() {
    let first = start(Settings::default());
    let routes = || vec![route(A, dns("a.svc")), route(B, ip("10.0.0.2:80"))];
    first.send(workspace(routes()));
    first.send(answer("a.svc", &["10.0.0.1"], None));
    let a = first.pair(A, 90);
    let b = first.pair(B, 90);
    first.until("ready", |s| s.ready).await;

    // The second agent, on the same sozu, before any pair or answer.
    let sozu = first.sozu.clone();
    let before = sozu.0.lock().unwrap().actual.clone();
    let requests = sozu.0.lock().unwrap().requests;
    let status = SharedStatus::default();
    let (facts, rx) = tokio::sync::mpsc::unbounded_channel();
    let agent = Driver::new(
        sozu.clone(),
        FakeCerts::default(),
        Settings::default(),
        status.clone(),
        first.clock.clone(),
    );
    tokio::spawn(agent.run(rx, std::future::pending()));
    let second = Harness {
        sozu,
        certs: FakeCerts::default(),
        status,
        heartbeat: crate::api::Heartbeat::default(),
        facts,
        clock: first.clock.clone(),
    };
    second.send(workspace(routes()));
    second
        .until("a pass made", |s| s.counters.reconciles >= 1)
        .await;
    assert_eq!(
        second.sozu.0.lock().unwrap().actual,
        before,
        "nothing torn down"
    );
    assert_eq!(second.sozu.0.lock().unwrap().requests, requests);
    second.send(answer("a.svc", &["10.0.0.1"], None));
    second.send(Fact::Pairs(vec![(A.into(), Ok(a)), (B.into(), Ok(b))]));
    second.until("ready", |s| s.ready).await;
    assert_eq!(second.sozu.0.lock().unwrap().actual, before);
    assert_eq!(
        second.sozu.0.lock().unwrap().requests,
        requests,
        "not one request"
    );
}

/// What the loop was told, kept by a test to recompute the desired state from scratch.
#[derive(Default)]
struct Mirror {
    workspace: Option<Arc<crate::workspace::Workspace>>,
    resolved: std::collections::BTreeMap<String, Vec<IpAddr>>,
    last_good: std::collections::BTreeMap<String, Certificate>,
}

/// Incremental passes end where a full recomputation would: random sequences of facts (new and
/// refused pairs, DNS answers and failures, workspace edits adding and removing routes, periodic
/// resyncs, sozu restarts), and after each, planning everything from the same facts against what
/// sozu holds plans nothing.
#[tokio::test(start_paused = true)]
async fn incremental_passes_end_where_a_full_recomputation_would() {
    let hosts: Vec<String> = (0..6).map(|i| format!("h{i}.in.example.org")).collect();
    let names = ["n0.svc", "n1.svc", "n2.svc"];
    for seed in 1..=12u64 {
        let mut rng = fastrand::Rng::with_seed(seed);
        let h = start(Settings::default());
        let mut mirror = Mirror::default();
        // Routes: (host, path prefix) → upstream.
        let mut routes: std::collections::BTreeMap<(usize, &str), Upstream> = Default::default();
        let mut log = Vec::new();
        for step in 0..60 {
            let host = rng.usize(..hosts.len());
            match rng.u8(..10) {
                0..=2 => {
                    let c = certificate(&hosts[host], h.clock.now(), 90);
                    mirror.last_good.insert(hosts[host].clone(), c.clone());
                    h.send(Fact::Pairs(vec![(hosts[host].clone(), Ok(c))]));
                    log.push(format!("new pair {}", hosts[host]));
                }
                3 => {
                    h.send(Fact::Pairs(vec![(
                        hosts[host].clone(),
                        Err(crate::certs::CertError::NoKey {
                            path: "/tls/tls.key".into(),
                        }),
                    )]));
                    log.push(format!("refused pair {}", hosts[host]));
                }
                4..=5 => {
                    let name = names[rng.usize(..names.len())];
                    let addresses: Vec<String> = (0..rng.usize(0..3))
                        .map(|_| format!("10.0.0.{}", rng.u8(1..5)))
                        .collect();
                    let refs: Vec<&str> = addresses.iter().map(String::as_str).collect();
                    let error = refs.is_empty().then_some("SERVFAIL");
                    if !refs.is_empty() {
                        let mut ips: Vec<IpAddr> =
                            refs.iter().map(|a| a.parse().unwrap()).collect();
                        ips.sort();
                        ips.dedup();
                        if mirror
                            .workspace
                            .as_ref()
                            .is_some_and(|w| crate::plan::desired::upstream_names(w).contains(name))
                        {
                            mirror.resolved.insert(name.into(), ips);
                        }
                    }
                    // A failure keeps the last addresses: the source sends them again.
                    let kept: Vec<String> = mirror
                        .resolved
                        .get(name)
                        .map(|a| a.iter().map(ToString::to_string).collect())
                        .unwrap_or_default();
                    let sent: Vec<&str> = if refs.is_empty() {
                        kept.iter().map(String::as_str).collect()
                    } else {
                        refs
                    };
                    h.send(answer(name, &sent, error));
                    log.push(format!("answer {name} {sent:?} {error:?}"));
                }
                6..=7 => {
                    let path = if rng.bool() { "/" } else { "/api" };
                    if routes.remove(&(host, path)).is_none() {
                        let upstream = if rng.bool() {
                            dns(names[rng.usize(..names.len())])
                        } else {
                            ip(&format!("10.1.0.{}:80", rng.u8(1..9)))
                        };
                        routes.insert((host, path), upstream);
                    }
                    let list: Vec<Route> = routes
                        .iter()
                        .map(|((host, path), upstream)| {
                            let upstreams = route(&hosts[*host], upstream.clone()).upstreams;
                            Route::http(&hosts[*host], path, upstreams)
                        })
                        .collect();
                    let mut ws =
                        crate::workspace::test_workspace(std::path::Path::new("/tls"), list);
                    ws.routes.sort_by(|a, b| {
                        (&a.host, a.path_prefix()).cmp(&(&b.host, b.path_prefix()))
                    });
                    let ws = Arc::new(ws);
                    let used = crate::plan::desired::upstream_names(&ws);
                    mirror.resolved.retain(|n, _| used.contains(n));
                    let hosts_used: BTreeSet<&str> =
                        ws.routes.iter().map(|r| r.host.as_str()).collect();
                    mirror
                        .last_good
                        .retain(|h, _| hosts_used.contains(h.as_str()));
                    mirror.workspace = Some(ws.clone());
                    h.send(Fact::Workspace(Ok(ws)));
                    log.push(format!("workspace {} routes", routes.len()));
                }
                8 => {
                    tokio::time::sleep(Duration::from_secs(61)).await;
                    log.push("resync".into());
                }
                _ => {
                    {
                        let mut s = h.sozu.0.lock().unwrap();
                        s.actual = Actual::default();
                        s.restarts += 1;
                    }
                    h.send(Fact::SozuSocket);
                    log.push("sozu restarted".into());
                }
            }
            // Let the loop take it all in (paused time: this costs nothing).
            tokio::time::sleep(Duration::from_millis(50)).await;
            let Some(ws) = &mirror.workspace else {
                continue;
            };
            let actual = h.sozu.0.lock().unwrap().actual.clone();
            let (expected, _) = crate::plan::desired::build(
                ws,
                &mirror.resolved,
                &mirror.last_good,
                &Default::default(),
                Some(&actual),
            );
            let missing = crate::plan::plan(&actual, &expected);
            assert!(
                missing.is_empty(),
                "seed {seed}, step {step}: a full pass would still send {:#?}\nafter {log:#?}",
                missing.iter().map(Op::describe).collect::<Vec<_>>()
            );
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_frontend_removed_behind_the_agents_back_is_restored_from_the_event_alone() {
    use crate::sources::sozu_events::{Change, ChangeKind, SozuEvent};
    // No periodic resync: only the event can bring the frontend back.
    let h = start(Settings {
        resync: None,
        ..Settings::default()
    });
    h.send(workspace(vec![route(A, ip("10.0.0.1:80"))]));
    h.pair(A, 90);
    h.until("ready", |s| s.ready).await;
    // The agent's own changes, reported by sozu, are not drift.
    let own = |kind| {
        Fact::Sozu(SozuEvent::Changed(Change {
            kind,
            cluster_id: Some(format!("pi-{A}")),
            address: None,
        }))
    };
    h.send(own(ChangeKind::ClusterAdded));
    h.send(own(ChangeKind::FrontendAdded));
    h.send(own(ChangeKind::FrontendAdded));
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(h.status().counters.drift_repairs, 0);
    let requests = h.sozu.0.lock().unwrap().requests;

    // Someone removes the HTTPS frontend: sozu reports it.
    {
        let mut s = h.sozu.0.lock().unwrap();
        let https = s
            .actual
            .frontends
            .iter()
            .find(|f| f.protocol == crate::plan::state::Protocol::Https)
            .cloned()
            .unwrap();
        s.actual.frontends.remove(&https);
    }
    assert!(h.hosts_routed().is_empty());
    h.send(own(ChangeKind::FrontendRemoved));
    h.until("repaired", |s| s.counters.drift_repairs == 1).await;
    h.until("served again", |_| h.hosts_routed().contains(A))
        .await;
    // One request: the frontend, nothing else.
    assert_eq!(h.sozu.0.lock().unwrap().requests, requests + 1);
}

/// sozu reports a request of its own twice and a state file once: the proxy says which went
/// how, so that the agent's own changes are never taken for drift, also once bulk loading has
/// been turned off mid-run and a change as large goes one request at a time.
#[tokio::test(start_paused = true)]
async fn bulk_turned_off_mid_run_counts_no_drift() {
    let h = start(Settings {
        resync: None,
        ..Settings::default()
    });
    {
        let mut s = h.sozu.0.lock().unwrap();
        s.events = Some(h.facts.clone());
        s.bulk_from = Some(crate::sozu::bulk::BATCH_MIN);
    }
    let routes = |from: usize, to: usize| -> Vec<Route> {
        (from..to)
            .map(|i| {
                route(
                    &format!("h{i}.in.example.org"),
                    ip(&format!("10.0.1.{}:80", i + 1)),
                )
            })
            .collect()
    };
    let grow = |to: usize| {
        h.send(workspace(routes(0, to)));
        for i in 0..to {
            h.pair(&format!("h{i}.in.example.org"), 90);
        }
    };
    // A cold start in bulk.
    grow(20);
    h.until("ready", |s| s.ready && s.routes.len() == 20).await;
    let bulk_requests = h.sozu.0.lock().unwrap().requests;
    // The next large change fails to load in part: bulk is off for good, and it is sent again
    // one request at a time.
    h.sozu.0.lock().unwrap().bulk_fails_next = true;
    grow(40);
    h.until("ready", |s| s.ready && s.routes.len() == 40).await;
    assert_eq!(h.sozu.0.lock().unwrap().bulk_from, None, "bulk turned off");
    // A third large change, one request at a time.
    let before = h.sozu.0.lock().unwrap().requests;
    grow(60);
    h.until("ready", |s| s.ready && s.routes.len() == 60).await;
    assert!(
        h.sozu.0.lock().unwrap().requests - before >= crate::sozu::bulk::BATCH_MIN,
        "sent one request at a time"
    );
    assert!(
        bulk_requests < 40,
        "the cold start went in bulk: {bulk_requests} requests"
    );
    // Every report has come in.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let status = h.status();
    assert_eq!(status.counters.drift_repairs, 0, "{:?}", status.counters);
}
