//! Workspace edits applied to the kept desired state and status, route by route: they end where
//! a build from scratch would, in the model, in sozu and in the status a user reads.

use std::collections::BTreeMap;

use super::*;
use crate::document::{Counters, RouteStatus};
use crate::plan::edit::Edit;
use crate::plan::state::{Hsts, Probe};
use crate::reconcile::model::Model;
use crate::reconcile::route_policy_files::PolicyFilesTracker;
use crate::reconcile::trackers::{CertTracker, DnsTracker};
use crate::workspace::{HealthCheck, RouteKind, RouteUpstream, StreamRoute, Workspace};

const HOSTS: usize = 5;
const NAMES: [&str; 3] = ["n0.svc", "n1.svc", "n2.svc"];

fn host(i: usize) -> String {
    format!("h{i}.in.example.org")
}

/// A route of host `h` at `path`, with what an edit may change drawn from `rng`: its
/// upstreams (names, addresses, weights, drains), its health check, its HSTS policy, a
/// limit (a cluster policy); now and then a route of its own port instead.
fn random_route(rng: &mut fastrand::Rng, h: usize, path: &str, own_ports: bool) -> Route {
    let upstreams: Vec<RouteUpstream> = (0..rng.usize(1..3))
        .map(|_| RouteUpstream {
            upstream: if rng.bool() {
                dns(NAMES[rng.usize(..NAMES.len())])
            } else {
                ip(&format!("10.1.0.{}:80", rng.u8(1..6)))
            },
            weight: rng.u32(1..4),
            drain: rng.u8(..5) == 0,
        })
        .collect();
    let mut route = Route::http(&host(h), path, upstreams);
    if rng.u8(..3) == 0 {
        route.health = Some(HealthCheck {
            probe: Probe::Tcp,
            interval: 10,
            timeout: rng.u32(1..5),
            healthy_threshold: 2,
            unhealthy_threshold: 3,
            port: None,
        });
    }
    if let RouteKind::Http(http) = &mut route.kind {
        if rng.u8(..3) == 0 {
            http.hsts = Some(Hsts {
                enabled: rng.bool(),
                max_age: 31_536_000,
                include_subdomains: false,
                preload: false,
            });
        }
        if rng.u8(..4) == 0 {
            http.policy = Some(Box::new(crate::workspace::RoutePolicy {
                limits: Some(crate::workspace::Limits {
                    connections_per_ip: Some(rng.u64(1..9)),
                    connections_per_subnet: None,
                    retry_after: 5,
                }),
                ..Default::default()
            }));
        }
    }
    if own_ports && rng.u8(..20) == 0 {
        // A port of its own for each place a route may take.
        let port = 9000 + 2 * u16::try_from(h).unwrap_or(0) + u16::from(path == "/api");
        route.kind = RouteKind::Tcp(StreamRoute {
            listen_port: port,
            proxy_protocol: false,
            limits: None,
            client_auth_exempt: false,
        });
    }
    route
}

/// A workspace of `routes`, sorted as the contract's output is.
fn workspace_of(routes: &BTreeMap<(usize, &str), Route>) -> Arc<Workspace> {
    let mut ws = crate::workspace::test_workspace(
        std::path::Path::new("/tls"),
        routes.values().cloned().collect(),
    );
    ws.routes
        .sort_by(|a, b| (&a.host, a.place()).cmp(&(&b.host, b.place())));
    Arc::new(ws)
}

/// One random edit of `routes`: a route added, removed or changed, or several at once.
fn edit(
    rng: &mut fastrand::Rng,
    routes: &mut BTreeMap<(usize, &'static str), Route>,
    own_ports: bool,
) {
    for _ in 0..rng.usize(1..4) {
        let h = rng.usize(..HOSTS);
        let path = if rng.bool() { "/" } else { "/api" };
        if rng.u8(..3) == 0 {
            routes.remove(&(h, path));
        } else {
            routes.insert((h, path), random_route(rng, h, path, own_ports));
        }
    }
}

/// A model kept up to date edit after edit equals one built from scratch from the same facts:
/// its desired state, the routes held back, and its indexes.
#[test]
fn an_edited_model_equals_one_built_from_scratch() {
    let clock_now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_780_272_000);
    for seed in 1..=30u64 {
        let mut rng = fastrand::Rng::with_seed(seed);
        let mut dns_tracker = DnsTracker::default();
        let mut certs = CertTracker::new(0);
        let files = PolicyFilesTracker::default();
        let mut counters = Counters::default();
        // Some names resolve, some hosts have a pair: the others are held, or keep what sozu
        // holds.
        for name in NAMES.iter().take(2) {
            let Fact::Dns(fact) = answer(name, &["10.0.0.1", "10.0.0.2"], None) else {
                unreachable!()
            };
            dns_tracker.absorb(fact);
        }
        for h in (0..HOSTS).filter(|h| h % 2 == 0) {
            certs.absorb(
                &host(h),
                Ok(certificate(&host(h), clock_now, 90)),
                &mut counters,
            );
        }
        let mut routes = BTreeMap::new();
        edit(&mut rng, &mut routes, true);
        // sozu holds what an earlier agent sent for a workspace of its own.
        let mut actual = Actual::default();
        let (earlier, _) = crate::plan::desired::build(
            &workspace_of(&routes),
            &BTreeMap::from([(NAMES[2].to_owned(), vec!["10.9.9.9".parse().unwrap()])]),
            certs.last_good(),
            &Default::default(),
            None,
        );
        for op in crate::plan::plan(&actual.clone(), &earlier) {
            plan::apply(&mut actual, &op);
        }
        let mut model = Model::build(workspace_of(&routes), &dns_tracker, &certs, &files, &actual);
        // The first pass plans everything, as the loop's does.
        for op in crate::plan::plan(&actual.clone(), model.desired()) {
            plan::apply(&mut actual, &op);
        }
        for step in 0..40 {
            edit(&mut rng, &mut routes, true);
            let ws = workspace_of(&routes);
            // Every other edit comes worked out beside the loop, as the workspace source sends
            // it; the others are worked out by the model.
            // An edit equal to the workspace is not taken up (the loop returns before).
            let prepared = (step % 2 == 0)
                .then(|| Edit::prepare(Some(model.workspace().clone()), ws.clone()))
                .filter(|edit| !edit.same)
                .map(|edit| (edit.scope, edit.index));
            let scope = model.update(ws.clone(), prepared, &dns_tracker, &certs, &files, &actual);
            let fresh = Model::build(ws.clone(), &dns_tracker, &certs, &files, &actual);
            let at = format!("seed {seed}, step {step}, scope {scope:?}");
            assert!(
                model.desired() == fresh.desired(),
                "{at}: the desired state differs:\n{:#?}\n{:#?}",
                model.desired(),
                fresh.desired()
            );
            assert_eq!(model.held(), fresh.held(), "{at}");
            assert_eq!(model.unresolved(), fresh.unresolved(), "{at}");
            assert_eq!(model.policy_files(), fresh.policy_files(), "{at}");
            for route in &ws.routes {
                let ids = |m: &Model, f: &dyn Fn(&Model) -> Vec<String>| f(m);
                let of_host = |m: &Model| -> Vec<String> {
                    m.routes_of_host(&route.host)
                        .map(|r| r.id.clone())
                        .collect()
                };
                assert_eq!(ids(&model, &of_host), ids(&fresh, &of_host), "{at}");
                assert_eq!(model.route_by_id(&route.id), Some(route), "{at}");
                for name in route.upstream_names() {
                    let of_name = |m: &Model| -> Vec<String> {
                        m.routes_of_name(name).map(|r| r.id.clone()).collect()
                    };
                    assert_eq!(ids(&model, &of_name), ids(&fresh, &of_name), "{at}");
                }
            }
            // The scope covers every route that differs: planned within it, against what sozu
            // would hold after the last edit, nothing is left for a full plan.
            let planned = crate::plan::plan_scope(&actual, model.desired(), &scope);
            let mut after = actual.clone();
            for op in &planned {
                plan::apply(&mut after, op);
            }
            let left = crate::plan::plan(&after, fresh.desired());
            assert!(
                left.is_empty(),
                "{at}: a full plan would still send {:#?}",
                left.iter().map(Op::describe).collect::<Vec<_>>()
            );
            actual = after;
        }
    }
}

/// What a user reads of a route, beside what only the history of the agent tells (rotation
/// counts, when a backend last changed).
fn shown(routes: &[RouteStatus]) -> Vec<String> {
    routes
        .iter()
        .map(|r| {
            format!(
                "{} {}{} {:?} upstream={} desired={:?} actual={:?} {:?} waiting={:?} policy={:?} served={:?}",
                r.id,
                r.host,
                r.path_prefix,
                r.listen_port,
                r.upstream,
                r.backends_desired,
                r.backends_actual,
                r.state,
                r.waiting_for,
                r.policy,
                r.certificate.served_fingerprints,
            )
        })
        .collect()
}

/// The loop after random edits (routes added, changed, removed, several at a time), DNS
/// answers and new pairs: sozu holds what a fresh agent given the same
/// facts makes it hold, and the status shows every route as that agent shows it, none left
/// over from an earlier workspace.
#[tokio::test(start_paused = true)]
async fn edits_end_where_a_fresh_agent_would_in_sozu_and_in_the_status() {
    for seed in 1..=8u64 {
        let mut rng = fastrand::Rng::with_seed(seed);
        let h = start(Settings::default());
        let mut routes = BTreeMap::new();
        let mut facts: Vec<Fact> = Vec::new();
        let mut last_ws = None;
        // The last workspace sent to the agent under test, as its source remembers it.
        let mut sent: Option<Arc<Workspace>> = None;
        // A workspace the agent under test is sent just before the step's own (the fresh
        // agent never sees it).
        let mut between: Option<Arc<Workspace>> = None;
        let mut pairs: BTreeMap<String, Certificate> = BTreeMap::new();
        // Every name resolves from the start: a route whose names never resolved keeps what
        // sozu held for it, which a fresh agent (a fresh sozu) has not.
        let mut answers: BTreeMap<&str, Vec<String>> = NAMES
            .iter()
            .map(|n| (*n, vec!["10.0.0.1".to_owned()]))
            .collect();
        for step in 0..25 {
            match rng.u8(..6) {
                0 => {
                    let name = NAMES[rng.usize(..NAMES.len())];
                    let addresses: Vec<String> = (0..rng.usize(1..3))
                        .map(|_| format!("10.0.0.{}", rng.u8(1..5)))
                        .collect();
                    answers.insert(name, addresses);
                }
                1 => {
                    let name = host(rng.usize(..HOSTS));
                    pairs.insert(name.clone(), certificate(&name, h.clock.now(), 90));
                }
                _ => {
                    // Now and then an edit comes right after another, both taken up before
                    // one pass: what the first changed must be planned too.
                    if rng.u8(..3) == 0 {
                        edit(&mut rng, &mut routes, false);
                        between = Some(workspace_of(&routes));
                    }
                    edit(&mut rng, &mut routes, false);
                    last_ws = Some(workspace_of(&routes));
                }
            }
            let Some(ws) = &last_ws else { continue };
            facts.clear();
            facts.push(Fact::Workspace(Ok(ws.clone())));
            for (name, addresses) in &answers {
                let refs: Vec<&str> = addresses.iter().map(String::as_str).collect();
                facts.push(answer(name, &refs, None));
            }
            facts.push(Fact::Pairs(
                pairs
                    .iter()
                    .map(|(h, c)| (h.clone(), Ok(c.clone())))
                    .collect(),
            ));
            // The agent under test takes the facts as they come, the workspace as its source
            // sends it (worked out against the one it sent before); what it already had, it
            // keeps.
            for fact in facts.iter().map(clone_fact) {
                match fact {
                    Fact::Workspace(Ok(ws)) => {
                        if let Some(first) = between.take() {
                            let edit = Edit::prepare(sent.replace(first.clone()), first);
                            h.send(Fact::Edit(Box::new(edit)));
                        }
                        let edit = Edit::prepare(sent.replace(ws.clone()), ws);
                        h.send(Fact::Edit(Box::new(edit)));
                    }
                    fact => h.send(fact),
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            let fresh = start(Settings::default());
            for fact in facts.iter().map(clone_fact) {
                fresh.send(fact);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            let at = format!("seed {seed}, step {step}");
            // Which spelling a host's frontends are held under depends on the swaps made
            // before (see `crate::plan`, "Frontend swaps"): sozu routes alike under either.
            let held = |harness: &Harness| {
                let mut actual = harness.sozu.0.lock().unwrap().actual.clone();
                actual.frontends = actual
                    .frontends
                    .iter()
                    .map(|f| crate::plan::state::Frontend::spelled_shared(f, false))
                    .collect();
                // A listener whose last certificate went holds none either way.
                actual
                    .certificates
                    .retain(|_, held| held.iter().next().is_some());
                actual
            };
            let (ours, theirs) = (held(&h), held(&fresh));
            assert!(
                ours == theirs,
                "{at}: sozu differs: frontends {:#?} / {:#?}; backends {:#?} / {:#?}; stream {:?} / {:?}; certificates {:?} / {:?}; clusters {:?} / {:?}",
                ours.frontends.difference(&theirs.frontends).collect::<Vec<_>>(),
                theirs.frontends.difference(&ours.frontends).collect::<Vec<_>>(),
                ours.backends.iter().filter(|(k, v)| theirs.backends.get(*k) != Some(v)).collect::<Vec<_>>(),
                theirs.backends.iter().filter(|(k, v)| ours.backends.get(*k) != Some(v)).collect::<Vec<_>>(),
                ours.stream_frontends, theirs.stream_frontends,
                ours.certificates, theirs.certificates,
                ours.clusters, theirs.clusters,
            );
            assert_eq!(
                shown(&h.status().routes),
                shown(&fresh.status().routes),
                "{at}"
            );
            assert_eq!(h.status().routes.len(), ws.routes.len(), "{at}");
        }
    }
}

fn clone_fact(fact: &Fact) -> Fact {
    match fact {
        Fact::Workspace(ws) => Fact::Workspace(ws.clone()),
        Fact::Dns(name) => Fact::Dns(NameFact {
            name: name.name.clone(),
            addresses: name.addresses.clone(),
            error: name.error.clone(),
        }),
        Fact::Pairs(pairs) => Fact::Pairs(
            pairs
                .iter()
                .map(|(h, p)| (h.clone(), Ok(p.as_ref().expect("valid pairs only").clone())))
                .collect(),
        ),
        _ => unreachable!("only workspaces, answers and pairs are sent"),
    }
}
