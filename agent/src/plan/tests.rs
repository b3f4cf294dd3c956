use super::*;
use crate::plan::state::{Certificate, Frontend, PathRule};
use crate::plan::state::{KeyPem, OWNER_TAG};
use crate::workspace::{Route, Upstream, Workspace};
use std::net::SocketAddr;

pub(crate) fn workspace(routes: &[(&str, &str, &str)]) -> Workspace {
    let routes = routes
        .iter()
        .map(|(host, path, upstream)| {
            Route::http(
                host,
                path,
                vec![crate::workspace::RouteUpstream {
                    upstream: Upstream::Ip {
                        address: upstream.parse().unwrap(),
                    },
                    weight: 1,
                    drain: false,
                }],
            )
        })
        .collect();
    crate::workspace::test_workspace(std::path::Path::new("/tls"), routes)
}

pub(crate) fn cert(host: &str, serial: u8) -> Certificate {
    Certificate {
        other_names: std::sync::Arc::from([]),
        issuer: "CN=test".into(),
        listed: None,
        fingerprint: format!("{serial:02x}{}", "ab".repeat(31)).into(),
        chain: vec![format!("PEM {host} {serial}")].into(),
        key: KeyPem::new("key".into()),
        not_before: 1_700_000_000,
        not_after: 2_000_000_000,
        names: BTreeSet::from([host.to_owned()]).into(),
    }
}

pub(crate) fn desired(ws: &Workspace, certs: &[Certificate]) -> Desired {
    let certificates = certs
        .iter()
        .map(|c| (c.names.iter().next().unwrap().clone(), c.clone()))
        .collect();
    crate::plan::desired::build(
        ws,
        &BTreeMap::new(),
        &certificates,
        &Default::default(),
        None,
    )
    .0
}

fn converge(actual: &mut Actual, desired: &Desired) -> Vec<Op> {
    let ops = plan(actual, desired);
    for op in &ops {
        if let Some(reason) = crate::plan::refusal(actual, op) {
            panic!("sozu would refuse {}: {reason}\n{ops:#?}", op.describe());
        }
        apply(actual, op);
    }
    ops
}

fn position(ops: &[Op], pred: impl Fn(&Op) -> bool) -> usize {
    ops.iter().position(pred).expect("op present")
}

/// A pair that names another host too is served for its own host only: one held under
/// every SAN (as an older agent sent it) is replaced by itself under its host's name, in one
/// request, and then left alone.
#[test]
fn a_certificate_held_under_other_names_is_replaced_by_itself() {
    let ws = workspace(&[
        ("a.in.example.org", "/", "10.0.0.1:80"),
        ("b.in.example.org", "/", "10.0.0.2:80"),
    ]);
    let (a, b) = (cert("a.in.example.org", 1), cert("b.in.example.org", 2));
    let want = desired(&ws, &[a.clone(), b.clone()]);
    let mut actual = Actual::default();
    for op in plan(&Actual::default(), &want) {
        apply(&mut actual, &op);
    }
    let https = want.https_address.unwrap();
    let held = actual.certificates.get_mut(&https).unwrap();
    held.remove(&a.fingerprint);
    held.insert(
        Arc::clone(&a.fingerprint),
        BTreeSet::from(["a.in.example.org".to_owned(), "b.in.example.org".to_owned()]),
    );
    let ops = plan(&actual, &want);
    assert_eq!(
        ops,
        [Op::ReplaceCertificate {
            address: https,
            old_fingerprint: a.fingerprint.clone(),
            certificate: a.clone(),
        }]
    );
    apply(&mut actual, &ops[0]);
    let held = &actual.certificates[&https];
    assert_eq!(
        held.names_of(&a.fingerprint).map(|names| &names[..]),
        Some(&["a.in.example.org".to_owned()][..])
    );
    let b_served: Vec<&Arc<str>> = held.named("b.in.example.org").map(|(f, _)| f).collect();
    assert_eq!(b_served, [&b.fingerprint]);
    assert_eq!(plan(&actual, &want), []);
}

#[test]
fn cold_start_builds_each_route_before_routing_to_it() {
    let ws = workspace(&[("a.in.example.org", "/", "10.0.0.1:80")]);
    let mut actual = Actual::default();
    let ops = converge(&mut actual, &desired(&ws, &[cert("a.in.example.org", 1)]));
    let cluster = position(&ops, |o| matches!(o, Op::AddCluster { .. }));
    let backend = position(&ops, |o| matches!(o, Op::AddBackend { .. }));
    let certificate = position(&ops, |o| matches!(o, Op::AddCertificate { .. }));
    let frontend = position(&ops, |o| matches!(o, Op::AddFrontend(_)));
    let listener = position(&ops, |o| matches!(o, Op::ActivateListener { .. }));
    assert!(
        listener < cluster && cluster < backend && backend < certificate && certificate < frontend
    );
    assert_eq!(
        ops.iter()
            .filter(|o| matches!(o, Op::AddFrontend(_)))
            .count(),
        2
    );
}

#[test]
fn a_converged_state_plans_nothing() {
    let ws = workspace(&[
        ("a.in.example.org", "/", "10.0.0.1:80"),
        ("a.in.example.org", "/api", "10.0.0.2:80"),
        ("b.in.example.org", "/", "[fd00::1]:80"),
    ]);
    let want = desired(
        &ws,
        &[cert("a.in.example.org", 1), cert("b.in.example.org", 2)],
    );
    let mut actual = Actual::default();
    assert!(!converge(&mut actual, &want).is_empty());
    assert_eq!(plan(&actual, &want), []);
}

#[test]
fn what_the_agent_does_not_own_is_left_alone() {
    let ws = workspace(&[("a.in.example.org", "/", "10.0.0.1:80")]);
    let want = desired(&ws, &[cert("a.in.example.org", 1)]);
    let https: SocketAddr = "127.0.0.1:8443".parse().unwrap();
    let mut actual = Actual::default();
    actual.clusters.insert("operator-app".into());
    actual.frontends.insert(std::sync::Arc::new(Frontend {
        protocol: Protocol::Https,
        address: https,
        hostname: "app.example.org".into(),
        path: PathRule::prefix("/"),
        method: None,
        header_predicates: Vec::new(),
        cluster_id: Some("operator-app".into()),
        tags: Default::default(),
        hsts: None,
        policy: None,
        alias: false,
    }));
    actual.certificates.entry(https).or_default().insert(
        "ff".repeat(32),
        BTreeSet::from(["app.example.org".to_owned()]),
    );
    let ops = converge(&mut actual, &want);
    assert!(
        ops.iter().all(|o| !o.describe().contains("operator-app")
            && !o.describe().contains("app.example.org")
            && !o.describe().contains("ffffffff")),
        "{ops:?}"
    );
}

#[test]
fn a_renewed_certificate_replaces_the_old_one_and_leaves_exactly_one() {
    let ws = workspace(&[("a.in.example.org", "/", "10.0.0.1:80")]);
    let https: SocketAddr = "127.0.0.1:8443".parse().unwrap();
    let mut actual = Actual::default();
    converge(&mut actual, &desired(&ws, &[cert("a.in.example.org", 1)]));
    // A stale duplicate left behind by someone else's add.
    actual.certificates.get_mut(&https).unwrap().insert(
        cert("a.in.example.org", 9).fingerprint,
        BTreeSet::from(["a.in.example.org".to_owned()]),
    );
    let renewed = cert("a.in.example.org", 2);
    let ops = converge(&mut actual, &desired(&ws, std::slice::from_ref(&renewed)));
    let old = [1, 9].map(|serial| cert("a.in.example.org", serial).fingerprint);
    assert!(
        matches!(&ops[0], Op::ReplaceCertificate { old_fingerprint, .. } if old.contains(old_fingerprint)),
        "{ops:?}"
    );
    let left: Vec<_> = actual.certificates[&https]
        .iter()
        .map(|(fingerprint, _)| fingerprint.to_owned())
        .collect();
    assert_eq!(left, [renewed.fingerprint]);
}

#[test]
fn a_changed_upstream_adds_the_new_backend_before_removing_the_old() {
    let c = cert("a.in.example.org", 1);
    let mut actual = Actual::default();
    converge(
        &mut actual,
        &desired(
            &workspace(&[("a.in.example.org", "/", "10.0.0.1:80")]),
            std::slice::from_ref(&c),
        ),
    );
    let ops = converge(
        &mut actual,
        &desired(
            &workspace(&[("a.in.example.org", "/", "10.0.0.2:80")]),
            std::slice::from_ref(&c),
        ),
    );
    // The old backend's sessions are left to end: a WebSocket open on it goes on, and sozu sends
    // no new request to a backend it no longer holds. Only a drain closes them (below).
    assert_eq!(ops.len(), 2, "{ops:?}");
    assert!(
        matches!(&ops[0], Op::AddBackend { backend, .. } if backend.address.to_string() == "10.0.0.2:80")
    );
    assert!(
        matches!(&ops[1], Op::RemoveBackend { backend, .. } if backend.address.to_string() == "10.0.0.1:80")
    );

    // With HSTS the old backend's sessions are left to end: sozu would break a response in
    // flight on a session it closes while adding the header.
    let mut with_hsts = workspace(&[("a.in.example.org", "/", "10.0.0.3:80")]);
    with_hsts.hsts = crate::workspace::recommended_hsts();
    let ops = converge(&mut actual, &desired(&with_hsts, &[c]));
    assert!(
        matches!(
            &ops[..],
            [Op::SetListenerHsts { hsts: Some(_), .. }, Op::AddBackend { .. }, Op::RemoveBackend { backend, .. }]
                if backend.address.to_string() == "10.0.0.2:80"
        ),
        "{ops:?}"
    );
}

/// One route of `a.in.example.org` over two IP upstreams with these weights and drains.
fn two_upstreams(upstreams: [(u32, bool); 2]) -> Workspace {
    let mut ws = workspace(&[("a.in.example.org", "/", "10.0.0.1:80")]);
    ws.routes[0].upstreams = upstreams
        .iter()
        .enumerate()
        .map(|(i, &(weight, drain))| crate::workspace::RouteUpstream {
            upstream: Upstream::Ip {
                address: format!("10.0.0.{}:80", i + 1).parse().unwrap(),
            },
            weight,
            drain,
        })
        .collect();
    ws
}

#[test]
fn a_drain_takes_the_backend_out_and_closes_its_sessions_and_an_undrain_puts_it_back() {
    let c = cert("a.in.example.org", 1);
    let mut actual = Actual::default();
    converge(
        &mut actual,
        &desired(
            &two_upstreams([(9, false), (1, false)]),
            std::slice::from_ref(&c),
        ),
    );
    let weights: Vec<u32> = actual.backends["pi-a.in.example.org"]
        .values()
        .map(|b| b.weight)
        .collect();
    assert_eq!(weights, [9, 1]);
    let drain = converge(
        &mut actual,
        &desired(
            &two_upstreams([(9, true), (1, false)]),
            std::slice::from_ref(&c),
        ),
    );
    assert!(
        matches!(&drain[..], [Op::RemoveBackend { backend: a, .. }, Op::CloseSessions { backend: b, .. }]
                if a.address.to_string() == "10.0.0.1:80" && a == b),
        "{drain:?}"
    );
    let undrain = converge(
        &mut actual,
        &desired(
            &two_upstreams([(9, false), (1, false)]),
            std::slice::from_ref(&c),
        ),
    );
    assert!(
        matches!(&undrain[..], [Op::AddBackend { backend, .. }] if backend.weight == 9),
        "{undrain:?}"
    );
    // A new weight is the same backend added again (sozu replaces it), never removed.
    let reweigh = converge(
        &mut actual,
        &desired(&two_upstreams([(5, false), (1, false)]), &[c]),
    );
    assert!(
        matches!(&reweigh[..], [Op::AddBackend { backend, .. }] if backend.weight == 5),
        "{reweigh:?}"
    );
}

#[test]
fn health_checks_and_hsts_follow_the_workspace() {
    let c = cert("a.in.example.org", 1);
    let mut ws = workspace(&[("a.in.example.org", "/", "10.0.0.1:80")]);
    ws.hsts = crate::workspace::recommended_hsts();
    let mut actual = Actual::default();
    let first = converge(&mut actual, &desired(&ws, std::slice::from_ref(&c)));
    let hsts = position(&first, |o| {
        matches!(o, Op::SetListenerHsts { hsts: Some(_), .. })
    });
    let listener = position(&first, |o| matches!(o, Op::ActivateListener { .. }));
    assert!(
        listener < hsts,
        "the listener exists before its policy is set"
    );
    assert!(!first.iter().any(|o| matches!(o, Op::SetHealthCheck { .. })));

    let check = crate::plan::state::HealthCheck {
        probe: crate::plan::state::Probe::Http {
            path: "/health".into(),
            accepted_statuses: vec![(200, 299)],
        },
        interval: 1,
        timeout: 1,
        healthy_threshold: 1,
        unhealthy_threshold: 2,
        port: None,
    };
    ws.routes[0].health = Some(check.clone());
    ws.routes[0].http_mut().hsts = Some(crate::plan::state::Hsts::OFF);
    let ops = converge(&mut actual, &desired(&ws, std::slice::from_ref(&c)));
    assert!(ops.contains(&Op::SetHealthCheck {
        cluster_id: "pi-a.in.example.org".into(),
        check
    }));
    // The HTTPS frontend's policy changed: its successor comes under the host's other
    // spelling, then it goes.
    let added = ops.iter().find_map(|o| match o {
        Op::SwapFrontend {
            frontend: f,
            add: true,
            ..
        } if f.protocol == Protocol::Https => Some(f),
        _ => None,
    });
    assert_eq!(
        added.and_then(|f| f.hsts),
        Some(crate::plan::state::Hsts::OFF)
    );
    assert!(added.is_some_and(|f| f.alias));
    let removed = position(
        &ops,
        |o| matches!(o, Op::SwapFrontend { add: false, frontend, .. } if !frontend.alias),
    );
    let swapped_in = position(&ops, |o| matches!(o, Op::SwapFrontend { add: true, .. }));
    assert!(swapped_in < removed, "added before the old one goes");
    assert!(
        plan(&actual, &desired(&ws, std::slice::from_ref(&c))).is_empty(),
        "converged"
    );

    ws.routes[0].health = None;
    ws.hsts = None;
    let ops = converge(&mut actual, &desired(&ws, &[c]));
    assert!(ops.contains(&Op::RemoveHealthCheck {
        cluster_id: "pi-a.in.example.org".into()
    }));
    assert!(ops
        .iter()
        .any(|o| matches!(o, Op::SetListenerHsts { hsts: None, .. })));
}

#[test]
fn a_removed_route_loses_its_frontends_before_its_cluster_and_its_certificate() {
    let a = cert("a.in.example.org", 1);
    let b = cert("b.in.example.org", 2);
    let mut actual = Actual::default();
    converge(
        &mut actual,
        &desired(
            &workspace(&[
                ("a.in.example.org", "/", "10.0.0.1:80"),
                ("b.in.example.org", "/", "10.0.0.2:80"),
            ]),
            &[a.clone(), b],
        ),
    );
    let ops = converge(
        &mut actual,
        &desired(
            &workspace(&[("a.in.example.org", "/", "10.0.0.1:80")]),
            &[a],
        ),
    );
    let frontend = position(&ops, |o| matches!(o, Op::RemoveFrontend(_)));
    let cluster = position(
        &ops,
        |o| matches!(o, Op::RemoveCluster { id } if id == "pi-b.in.example.org"),
    );
    assert!(frontend < cluster);
    assert!(ops
        .iter()
        .any(|o| matches!(o, Op::RemoveCertificate { .. })));
    assert!(actual
        .frontends
        .iter()
        .all(|f| f.hostname == "a.in.example.org" && f.tags.get(OWNER_TAG.0).is_some()));
}

#[test]
fn a_route_without_a_certificate_gets_no_frontend_yet() {
    let ws = workspace(&[("a.in.example.org", "/", "10.0.0.1:80")]);
    let (want, held) = crate::plan::desired::build(
        &ws,
        &BTreeMap::new(),
        &BTreeMap::new(),
        &Default::default(),
        None,
    );
    assert!(want.frontends.is_empty());
    assert_eq!(held.len(), 1);
    assert!(want.clusters.contains_key("pi-a.in.example.org"));
}

/// Listener settings: a new listener is made with them; on a running one, the PROXY
/// protocol and the timeouts are patched in place, and what sozu takes on a new listener
/// only (TLS versions, interface) is reported, not applied.
#[test]
fn listener_settings_are_patched_where_sozu_can_and_reported_where_it_cannot() {
    let c = cert("a.in.example.org", 1);
    let mut ws = workspace(&[("a.in.example.org", "/", "10.0.0.1:80")]);
    let mut actual = Actual::default();
    let ops = converge(&mut actual, &desired(&ws, std::slice::from_ref(&c)));
    assert!(ops.iter().any(
        |o| matches!(o, Op::AddListener { settings, .. } if settings.timeouts == [360, 360, 3, 10])
    ));
    assert!(converge(&mut actual, &desired(&ws, std::slice::from_ref(&c))).is_empty());

    ws.listener_policy.expect_proxy = true;
    ws.listener_policy.timeouts.front = 120;
    ws.listener_policy.min_tls_version = crate::workspace::TlsVersion::V1_3;
    let want = desired(&ws, std::slice::from_ref(&c));
    let ops = converge(&mut actual, &want);
    let patched: Vec<_> = ops
        .iter()
        .filter_map(|o| match o {
            Op::PatchListener { settings, .. } => {
                Some((settings.expect_proxy, settings.timeouts[0]))
            }
            _ => None,
        })
        .collect();
    assert_eq!(patched, [(true, 120), (true, 120)], "{ops:?}");
    assert!(converge(&mut actual, &want).is_empty());
    let https = ws.listeners.https;
    assert_eq!(
        listeners_need_restart(&actual, &want),
        [format!("{https}: min_tls_version")]
    );

    // The HTTP/2 offer is the HTTPS listener's alone, and sozu changes it in place.
    ws.listener_policy.http2 = crate::workspace::Http2Offer::Only;
    let want = desired(&ws, std::slice::from_ref(&c));
    let ops = converge(&mut actual, &want);
    let patched: Vec<_> = ops
        .iter()
        .filter_map(|o| match o {
            Op::PatchListener {
                protocol, settings, ..
            } => Some((*protocol, settings.http2)),
            _ => None,
        })
        .collect();
    assert_eq!(
        patched,
        [(Protocol::Https, crate::workspace::Http2Offer::Only)],
        "{ops:?}"
    );
    assert!(converge(&mut actual, &want).is_empty());
}

/// A host with nested routes swaps spellings in an order that routes every request as the
/// workspace says at each step: to the pattern spelling, the exact one empties least specific
/// first; back, the exact one fills most specific first.
#[test]
fn a_changed_frontend_swaps_its_hosts_spelling_in_a_safe_order() {
    let routes = [
        ("a.in.example.org", "/", "10.0.0.1:80"),
        ("a.in.example.org", "/api", "10.0.0.2:80"),
        ("a.in.example.org", "/api/v2", "10.0.0.3:80"),
    ];
    let mut ws = workspace(&routes);
    let c = cert("a.in.example.org", 1);
    let mut actual = Actual::default();
    converge(&mut actual, &desired(&ws, std::slice::from_ref(&c)));
    let https_steps = |ops: &[Op]| -> Vec<(bool, String, bool)> {
        ops.iter()
            .filter_map(|o| match o {
                Op::SwapFrontend { frontend, add, .. } if frontend.protocol == Protocol::Https => {
                    Some((*add, frontend.path.value.clone(), frontend.alias))
                }
                _ => None,
            })
            .collect()
    };
    ws.headers.response.set.insert("X-A".into(), "1".into());
    let ops = converge(&mut actual, &desired(&ws, std::slice::from_ref(&c)));
    let removals: Vec<String> = https_steps(&ops)
        .into_iter()
        .filter(|(add, _, _)| !add)
        .map(|(_, path, _)| path)
        .collect();
    assert_eq!(removals, ["/", "/api", "/api/v2"]);
    assert!(actual
        .frontends
        .iter()
        .filter(|f| f.protocol == Protocol::Https)
        .all(|f| f.alias));
    // Phases are strictly ordered: each removal is a phase after the one before.
    let phases: Vec<u32> = ops
        .iter()
        .filter(|o| matches!(o, Op::SwapFrontend { add: false, .. }))
        .map(phase)
        .collect();
    assert!(phases.windows(2).all(|w| w[0] < w[1]), "{phases:?}");

    ws.headers.response.set.insert("X-A".into(), "2".into());
    let ops = converge(&mut actual, &desired(&ws, std::slice::from_ref(&c)));
    let additions: Vec<String> = https_steps(&ops)
        .into_iter()
        .filter(|(add, _, alias)| *add && !alias)
        .map(|(_, path, _)| path)
        .collect();
    assert_eq!(additions, ["/api/v2", "/api", "/"]);
    assert!(plan(&actual, &desired(&ws, &[c])).is_empty(), "converged");
}

/// A workspace of one TCP route on `port` to 10.0.0.9:22, passed through by SNI when `sni`.
fn port_routes(routes: &[(&str, u16, bool)]) -> Workspace {
    use crate::workspace::{port_route_id, RouteKind, RouteUpstream, StreamRoute};
    let routes = routes
        .iter()
        .map(|&(host, port, sni)| Route {
            id: port_route_id(host, if sni { "tls" } else { "tcp" }, port),
            host: host.to_owned(),
            upstreams: vec![RouteUpstream {
                upstream: Upstream::Ip {
                    address: "10.0.0.9:22".parse().unwrap(),
                },
                weight: 1,
                drain: false,
            }],
            health: None,
            balancing: Default::default(),
            kind: {
                let stream = StreamRoute {
                    listen_port: port,
                    proxy_protocol: false,
                    limits: None,
                    client_auth_exempt: false,
                };
                if sni {
                    RouteKind::TlsPassthrough(stream)
                } else {
                    RouteKind::Tcp(stream)
                }
            },
        })
        .collect();
    crate::workspace::test_workspace(std::path::Path::new("/tls"), routes)
}

/// A route of its own port gets a listener of its own and a frontend after its cluster and
/// backends; sozu's listener is removed with the route's last frontend, and left alone when an
/// operator's frontend shares it.
#[test]
fn a_port_of_its_own_has_a_listener_made_and_removed_with_its_routes() {
    let mut actual = Actual::default();
    let ws = port_routes(&[
        ("a.in.example.org", 2222, true),
        ("b.in.example.org", 2222, true),
    ]);
    let ops = converge(&mut actual, &desired(&ws, &[]));
    let listener = "127.0.0.1:2222".parse::<SocketAddr>().unwrap();
    let added = position(
        &ops,
        |op| matches!(op, Op::AddListener { address, protocol: Protocol::Tcp, .. } if *address == listener),
    );
    let frontends: Vec<usize> = ops
        .iter()
        .enumerate()
        .filter(|(_, op)| matches!(op, Op::AddStreamFrontend(f) if f.sni.is_some()))
        .map(|(i, _)| i)
        .collect();
    assert_eq!(frontends.len(), 2, "{ops:?}");
    let backend = position(&ops, |op| matches!(op, Op::AddBackend { .. }));
    assert!(
        added < backend && frontends.iter().all(|&f| f > backend),
        "{ops:?}"
    );
    assert!(plan(&actual, &desired(&ws, &[])).is_empty(), "converged");

    // One host goes: its frontend only; the other keeps the listener.
    let one = port_routes(&[("a.in.example.org", 2222, true)]);
    let ops = converge(&mut actual, &desired(&one, &[]));
    assert!(
        ops.iter().any(|op| matches!(op, Op::RemoveStreamFrontend(f) if f.sni.as_deref() == Some("b.in.example.org"))),
        "{ops:?}"
    );
    assert!(
        !ops.iter().any(|op| matches!(op, Op::RemoveListener { .. })),
        "{ops:?}"
    );

    // The last goes: frontend, then the listener, deactivated first.
    let none = port_routes(&[]);
    let ops = converge(&mut actual, &desired(&none, &[]));
    let frontend = position(&ops, |op| matches!(op, Op::RemoveStreamFrontend(_)));
    let deactivated = position(
        &ops,
        |op| matches!(op, Op::DeactivateListener { address, .. } if *address == listener),
    );
    let removed = position(
        &ops,
        |op| matches!(op, Op::RemoveListener { address, .. } if *address == listener),
    );
    assert!(frontend < deactivated && deactivated < removed, "{ops:?}");
    assert!(!actual.listeners.contains_key(&listener));

    // A listener holding an operator's frontend stays.
    let mut actual = Actual::default();
    converge(&mut actual, &desired(&one, &[]));
    let theirs = crate::plan::state::StreamFrontend {
        protocol: Protocol::Tcp,
        address: listener,
        sni: Some("theirs.example.org".into()),
        cluster_id: "theirs".into(),
        tags: Default::default(),
    };
    actual.stream_frontends.insert(theirs.clone());
    let ops = converge(&mut actual, &desired(&none, &[]));
    assert!(
        !ops.iter().any(|op| matches!(op, Op::RemoveListener { .. })),
        "{ops:?}"
    );
    assert!(!ops.contains(&Op::RemoveStreamFrontend(theirs)), "{ops:?}");
}

/// A swap cut short (the agent killed between its additions and its removals) leaves a host's
/// frontends under both spellings. The next agent finishes it without asking sozu for a
/// frontend under a key it holds (sozu refuses one: `converge` checks), whether the workspace
/// still says what the swap was for or has moved on since.
#[test]
fn a_swap_cut_short_is_finished_without_a_frontend_sozu_refuses() {
    let c = cert("a.in.example.org", 1);
    let mut ws = workspace(&[("a.in.example.org", "/", "10.0.0.1:80")]);
    let mut actual = Actual::default();
    converge(&mut actual, &desired(&ws, std::slice::from_ref(&c)));
    ws.headers.response.set.insert("X-A".into(), "1".into());
    let swap = plan(&actual, &desired(&ws, std::slice::from_ref(&c)));
    // Only the additions reach sozu.
    let mut cut = actual.clone();
    for op in swap
        .iter()
        .filter(|o| matches!(o, Op::SwapFrontend { add: true, .. }))
    {
        apply(&mut cut, op);
    }
    let https = |a: &Actual| -> Vec<(bool, bool)> {
        a.frontends
            .iter()
            .filter(|f| f.protocol == Protocol::Https)
            .map(|f| (f.alias, f.policy.is_some()))
            .collect()
    };
    assert_eq!(
        https(&cut),
        [(false, false), (true, true)],
        "both spellings"
    );

    // The same workspace: the old frontend goes, nothing is added.
    let mut same = cut.clone();
    let ops = converge(&mut same, &desired(&ws, std::slice::from_ref(&c)));
    assert!(
        ops.iter()
            .all(|o| matches!(o, Op::SwapFrontend { add: false, frontend, .. } if !frontend.alias)),
        "{ops:#?}"
    );
    assert_eq!(https(&same), [(true, true)]);
    assert!(plan(&same, &desired(&ws, std::slice::from_ref(&c))).is_empty());

    // Edited again meanwhile: both spellings hold a frontend in the way; one goes first, the
    // new one takes its key, the other goes.
    ws.headers.response.set.insert("X-A".into(), "2".into());
    let mut moved = cut;
    let want = desired(&ws, std::slice::from_ref(&c));
    converge(&mut moved, &want);
    let held: Vec<_> = moved
        .frontends
        .iter()
        .filter(|f| f.protocol == Protocol::Https)
        .collect();
    assert_eq!(held.len(), 1, "{held:#?}");
    assert!(plan(&moved, &want).is_empty(), "converged");
}

/// A route of `host` at `path` to `upstream`, with `method`, its id as the workspace gives it.
fn matched_route(
    host: &str,
    path: crate::workspace::PathMatch,
    method: Option<&str>,
    headers: Vec<crate::workspace::HeaderMatch>,
    upstream: &str,
) -> Route {
    let mut route = Route::http(
        host,
        "/",
        vec![crate::workspace::RouteUpstream {
            upstream: Upstream::Ip {
                address: upstream.parse().unwrap(),
            },
            weight: 1,
            drain: false,
        }],
    );
    let http = route.http_mut();
    http.path = path;
    http.method = method.map(str::to_owned);
    http.match_headers = headers;
    route.id = crate::workspace::http_route_id(host, route.http_mut());
    route
}

/// sozu's route table for each host spelling on each listener, in the order sozu holds it:
/// `ops` applied one after the other, as sozu receives them. Operations of one phase go
/// concurrently, so two additions to one table in one phase must be ones whose order decides
/// nothing (both matched by prefix alone).
fn apply_to_tables(
    tables: &mut BTreeMap<(Protocol, SocketAddr, String), Vec<Frontend>>,
    ops: &[Op],
) {
    let mut added_in_phase: BTreeMap<(u32, Protocol, SocketAddr, String), Vec<Frontend>> =
        BTreeMap::new();
    for op in ops {
        let (frontend, add) = match op {
            Op::AddFrontend(f) => (f, true),
            Op::RemoveFrontend(f) => (f, false),
            Op::SwapFrontend { frontend, add, .. } => (frontend, *add),
            _ => continue,
        };
        let table = (
            frontend.protocol,
            frontend.address,
            frontend.sozu_hostname(),
        );
        let held = tables.entry(table.clone()).or_default();
        if add {
            let same_phase = added_in_phase
                .entry((phase(op), table.0, table.1, table.2))
                .or_default();
            assert!(
                same_phase
                    .iter()
                    .all(|other| other.prefix_only() && frontend.prefix_only()),
                "{} and {} go to one table concurrently",
                frontend.match_key(),
                same_phase[0].match_key()
            );
            same_phase.push((**frontend).clone());
            held.push((**frontend).clone());
        } else {
            held.retain(|f| !(f.same_match(frontend)));
        }
    }
    tables.retain(|_, held| !held.is_empty());
}

/// The key order sozu replays a host's frontends in to a restarted worker is the order the
/// agent gives them in, from a cold start and after an edit: where two frontends tie for a
/// request (the same prefix with and without a method), sozu serves the later one, so the
/// agent's order and a restarted worker's agree on who serves it.
#[test]
fn a_hosts_frontends_reach_sozu_in_the_order_it_replays_them() {
    use crate::workspace::PathMatch;
    let host = "api.in.example.org";
    let c = cert(host, 1);
    let routes = |method: &str| {
        vec![
            matched_route(
                host,
                PathMatch::Prefix("/v2".into()),
                None,
                vec![],
                "10.0.0.1:80",
            ),
            matched_route(
                host,
                PathMatch::Prefix("/v2".into()),
                Some(method),
                vec![],
                "10.0.0.2:80",
            ),
            matched_route(
                host,
                PathMatch::Exact("/v2/health".into()),
                None,
                vec![],
                "10.0.0.3:80",
            ),
        ]
    };
    let ws = crate::workspace::test_workspace(std::path::Path::new("/tls"), routes("GET"));
    let mut actual = Actual::default();
    let mut tables = BTreeMap::new();
    let ops = converge(&mut actual, &desired(&ws, std::slice::from_ref(&c)));
    apply_to_tables(&mut tables, &ops);
    let keys = |tables: &BTreeMap<(Protocol, SocketAddr, String), Vec<Frontend>>| {
        tables
            .iter()
            .filter(|((protocol, _, _), _)| *protocol == Protocol::Https)
            .map(|((_, _, name), held)| {
                (
                    name.clone(),
                    held.iter().map(Frontend::match_key).collect::<Vec<_>>(),
                )
            })
            .collect::<Vec<_>>()
    };
    let held = keys(&tables);
    assert_eq!(held.len(), 1, "{held:?}");
    assert_eq!(
        held[0].1,
        [
            "P/v2".to_owned(),
            "P/v2;GET".to_owned(),
            "R^/v2/health(?:\\?.*)?$".to_owned(),
        ]
    );

    // The method of a route changes: its frontend is a new one (sozu keys it by its method),
    // and it files before one sozu holds, so the host's frontends are added again in order
    // under the other spelling, then the old ones go; sozu refuses none (`converge`).
    let ws = crate::workspace::test_workspace(std::path::Path::new("/tls"), routes("POST"));
    let ops = converge(&mut actual, &desired(&ws, std::slice::from_ref(&c)));
    apply_to_tables(&mut tables, &ops);
    let held = keys(&tables);
    assert_eq!(held.len(), 1, "{held:?}");
    assert_eq!(held[0].0, "/api/.in.example.org");
    let mut sorted = held[0].1.clone();
    sorted.sort();
    assert_eq!(held[0].1, sorted);
    assert!(held[0].1.contains(&"P/v2;POST".to_owned()));
    assert!(plan(&actual, &desired(&ws, &[c])).is_empty(), "converged");
}

/// A new route whose frontend files after every one its host holds is added alone, without
/// moving the others.
#[test]
fn a_route_that_files_last_is_added_without_a_swap() {
    use crate::workspace::PathMatch;
    let host = "api.in.example.org";
    let c = cert(host, 1);
    let first = matched_route(
        host,
        PathMatch::Prefix("/v2".into()),
        None,
        vec![],
        "10.0.0.1:80",
    );
    let mut ws =
        crate::workspace::test_workspace(std::path::Path::new("/tls"), vec![first.clone()]);
    let mut actual = Actual::default();
    converge(&mut actual, &desired(&ws, std::slice::from_ref(&c)));
    ws.routes.push(matched_route(
        host,
        PathMatch::Prefix("/v2".into()),
        Some("GET"),
        vec![],
        "10.0.0.2:80",
    ));
    let ops = converge(&mut actual, &desired(&ws, std::slice::from_ref(&c)));
    assert!(
        ops.iter()
            .all(|o| !matches!(o, Op::SwapFrontend { .. } | Op::RemoveFrontend(_))),
        "{ops:#?}"
    );
    assert!(actual.frontends.iter().all(|f| !f.alias));
}

/// A drain on a route of its own port takes the backend out without closing its sessions: an
/// SSH session or a database connection open to it goes on (docs/contract.md, "Kinds of
/// routes"); an HTTP route's drain closes them (the test above).
#[test]
fn a_drain_on_a_tcp_route_keeps_the_sessions_open_to_the_drained_backend() {
    let two = |drain: bool| {
        let mut ws = port_routes(&[("db.in.example.org", 5432, false)]);
        ws.routes[0].upstreams = (1..=2)
            .map(|i| crate::workspace::RouteUpstream {
                upstream: Upstream::Ip {
                    address: format!("10.0.0.{i}:5432").parse().unwrap(),
                },
                weight: 1,
                drain: drain && i == 1,
            })
            .collect();
        ws
    };
    let mut actual = Actual::default();
    converge(&mut actual, &desired(&two(false), &[]));
    let drain = converge(&mut actual, &desired(&two(true), &[]));
    assert!(
        matches!(&drain[..], [Op::RemoveBackend { backend, .. }] if backend.address.to_string() == "10.0.0.1:5432"),
        "{drain:?}"
    );
}

/// The scene of an edit (a route added: its cluster, backend and frontend; another removed with
/// its certificate): the workspaces before and after, and sozu as it holds the one before.
fn before_an_edit() -> (Workspace, Workspace, Actual) {
    let before = workspace(&[
        ("a.in.example.org", "/", "10.0.0.1:80"),
        ("r.in.example.org", "/", "10.0.0.2:80"),
    ]);
    let after = workspace(&[
        ("b.in.example.org", "/", "10.0.0.3:80"),
        ("r.in.example.org", "/", "10.0.0.2:80"),
    ]);
    let mut actual = Actual::default();
    converge(
        &mut actual,
        &desired(
            &before,
            &[
                cert("a.in.example.org", 1),
                cert("b.in.example.org", 3),
                cert("r.in.example.org", 5),
            ],
        ),
    );
    (before, after, actual)
}

/// The plan of that edit, with r's pair of serial `r_serial` (5 unchanged, 6 renewed with it).
fn edit_plan(after: &Workspace, actual: &Actual, r_serial: u8) -> Vec<Op> {
    plan(
        actual,
        &desired(
            after,
            &[
                cert("b.in.example.org", 3),
                cert("r.in.example.org", r_serial),
            ],
        ),
    )
}

/// The plans of that edit and of a rotation of r, made by the planner from real states.
fn edit_and_rotation() -> (Vec<Op>, Vec<Op>) {
    let (before, after, actual) = before_an_edit();
    let edit = edit_plan(&after, &actual, 5);
    let rotation = plan(
        &actual,
        &desired(
            &before,
            &[
                cert("a.in.example.org", 1),
                cert("b.in.example.org", 3),
                cert("r.in.example.org", 6),
            ],
        ),
    );
    (edit, rotation)
}

#[test]
fn a_rotation_goes_past_an_edit_that_touches_none_of_its_certificates_or_listeners() {
    let (edit, rotation) = edit_and_rotation();
    assert!(
        edit.iter().any(|op| matches!(op, Op::AddFrontend(_)))
            && edit
                .iter()
                .any(|op| matches!(op, Op::RemoveCertificate { .. })),
        "{edit:#?}"
    );
    assert!(
        matches!(&rotation[..], [Op::ReplaceCertificate { .. }]),
        "{rotation:#?}"
    );
    assert!(overtakes(&rotation, &edit));
    // Nothing goes past a plan that would have to wait for the edit itself.
    assert!(!overtakes(&edit, &rotation));
}

/// A rotation planned with an edit (both taken up before one pass) goes first: sozu answers
/// the plan's phases in order, and the edit's clusters, backends and certificates took it
/// 10–20 ms at 10,000 routes, which the rotation would otherwise wait for.
#[test]
fn a_rotation_planned_with_an_edit_goes_first() {
    let (_, after, actual) = before_an_edit();
    let both = edit_plan(&after, &actual, 6);
    assert!(
        both.iter().any(|op| matches!(op, Op::AddCluster { .. })),
        "{both:#?}"
    );
    assert!(
        matches!(&both[0], Op::ReplaceCertificate { .. }),
        "the rotation goes first: {both:#?}"
    );
    assert!(both[1..]
        .iter()
        .all(|op| !matches!(op, Op::ReplaceCertificate { .. })));
}

#[test]
fn a_rotation_waits_for_an_edit_sharing_a_fingerprint_or_changing_its_listener() {
    let (edit, rotation) = edit_and_rotation();
    let Op::ReplaceCertificate {
        address,
        old_fingerprint,
        certificate,
    } = &rotation[0]
    else {
        panic!("{rotation:#?}");
    };
    // The edit removes the certificate the rotation replaces, or brings in its successor.
    let removes_old = Op::RemoveCertificate {
        address: *address,
        fingerprint: old_fingerprint.clone(),
    };
    let adds_new = Op::AddCertificate {
        address: *address,
        certificate: certificate.clone(),
    };
    for clash in [removes_old, adds_new] {
        let mut edit = edit.clone();
        edit.push(clash.clone());
        assert!(!overtakes(&rotation, &edit), "{}", clash.describe());
    }
    let hsts = Op::SetListenerHsts {
        address: *address,
        hsts: None,
    };
    let mut edit_with_listener = edit.clone();
    edit_with_listener.push(hsts);
    assert!(!overtakes(&rotation, &edit_with_listener));
    // Another listener's settings do not concern it.
    let elsewhere = Op::SetListenerHsts {
        address: "127.0.0.1:1".parse().unwrap(),
        hsts: None,
    };
    let mut edit_elsewhere = edit;
    edit_elsewhere.push(elsewhere);
    assert!(overtakes(&rotation, &edit_elsewhere));
}
