use std::time::Duration;

use private_ingress_tests::live::{
    certificate, eventually, https_get, route_of, Backend, RouteSpec, SilentNameServer, Stack,
};

const READY: Duration = Duration::from_secs(60);

fn host(name: &str) -> String {
    format!("{name}.in.example.org")
}

/// A fresh sozu and agent, as a new pod gets them, for three routes: `served` (its pair and
/// backend are there), `gone` (its upstream name no longer resolves, as a deleted Service's) and
/// `refused` (its pair names another host).
fn start(stack: &mut Stack, backend: &Backend, readiness: &str) -> SilentNameServer {
    let silent = SilentNameServer::start();
    let resolv_conf = stack.dir.path().join("resolv.conf");
    std::fs::write(&resolv_conf, silent.resolv_conf()).unwrap();
    let hosts = stack.dir.path().join("hosts");
    std::fs::write(&hosts, "").unwrap();
    let ip = backend.address.ip().to_string();
    let port = Some(backend.address.port());
    stack.write_workspace(&stack.workspace_text(&[
        RouteSpec {
            host: host("served"),
            upstream: ip.clone(),
            port,
        },
        RouteSpec {
            host: host("gone"),
            upstream: "pi-deleted-service".into(),
            port,
        },
        RouteSpec {
            host: host("refused"),
            upstream: ip,
            port,
        },
    ]));
    stack.start_sozu();
    stack.start_agent_with_resolver(
        &hosts,
        &resolv_conf,
        &[
            "--dns-interval",
            "1",
            "--dns-timeout-ms",
            "500",
            "--readiness",
            readiness,
        ],
    );
    silent
}

/// The tls dir of the three routes: good pairs for `served` and `gone`, and for `refused` a
/// pair whose certificate names another host (written under `refused`'s directory). The
/// fingerprints of the certificates a client must never see for `refused`.
fn write_pairs(stack: &Stack) -> [String; 3] {
    let served = certificate(&stack.tls_dir(), &host("served"));
    let gone = certificate(&stack.tls_dir(), &host("gone"));
    let other = stack.dir.path().join("other");
    let elsewhere = certificate(&other, &host("elsewhere"));
    std::fs::rename(
        other.join(host("elsewhere")),
        stack.tls_dir().join(host("refused")),
    )
    .unwrap();
    [served, gone, elsewhere]
}

fn route<'a>(state: &'a serde_json::Value, host: &str) -> &'a serde_json::Value {
    route_of(state, host).unwrap_or(&serde_json::Value::Null)
}

/// One route's upstream deleted and one route's certificate refused: a new agent still becomes
/// Ready and serves the route that can be served; `/readyz`, `/v1/state`, `/metrics` and
/// `status` say how many are not served and each route says why.
#[test]
fn one_bad_route_does_not_keep_a_new_agent_unready() {
    let mut stack = Stack::new();
    let backend = Backend::start("served-backend");
    let others = write_pairs(&stack);
    let _silent = start(&mut stack, &backend, "serving");
    stack.wait_ready(READY);

    let served = https_get(stack.https, &host("served"), "/").expect("the served route");
    assert_eq!(
        (served.status, served.body.as_str()),
        (200, "served-backend")
    );

    // Both bad routes are known for what they are once the agent is ready.
    let (status, body) = stack.readyz().expect("/readyz answers");
    assert_eq!(
        (status, body.as_str()),
        (200, "ready (2 routes not served)\n")
    );
    let state = stack.state().expect("/v1/state");
    assert_eq!(state["readiness"]["routes_not_served"], 2, "{state:#}");
    let gone = route(&state, &host("gone"))["last_error"]
        .as_str()
        .unwrap_or_default();
    assert!(gone.contains("pi-deleted-service"), "{gone}");
    let refused = route(&state, &host("refused"))["last_error"]
        .as_str()
        .unwrap_or_default();
    assert!(refused.contains(&host("refused")), "{refused}");
    assert!(
        stack
            .metrics()
            .contains("\nprivate_ingress_routes_not_served 2\n"),
        "{}",
        stack.metrics()
    );
    let (code, out, err) = private_ingress_tests::run(
        std::process::Command::new(private_ingress_tests::agent_bin()).args([
            "status",
            "--admin-address",
            &stack.admin.to_string(),
        ]),
    );
    assert!(
        out.starts_with("ready: yes (2 routes not served)"),
        "{code}\n{out}\n{err}"
    );

    // The refused host is not routed, and its clients are not given another host's
    // certificate (sozu may fail the handshake, or answer with a default of its own).
    let refused = https_get(stack.https, &host("refused"), "/");
    assert!(
        refused.as_ref().map_or(true, |s| s.status != 200
            && !others.contains(&s.fingerprint)),
        "{:?}",
        refused.map(|s| (s.status, s.body))
    );
}

/// `--readiness strict`: the same routes keep the agent unready, and it says why; the route
/// that can be served is served all the same.
#[test]
fn the_strict_mode_keeps_a_new_agent_unready_while_one_route_is_not_served() {
    let mut stack = Stack::new();
    let backend = Backend::start("served-backend");
    write_pairs(&stack);
    let _silent = start(&mut stack, &backend, "strict");

    // Unready for the reason the bad routes give, not merely not yet ready.
    let body = eventually(
        READY,
        "/readyz's reason names the routes not served",
        || {
            stack
                .readyz()
                .filter(|(_, body)| body.contains("not all of the 3 routes can be served"))
        },
    );
    assert_eq!(body.0, 503, "{}", body.1);
    assert_eq!(
        body.1,
        "not ready: not all of the 3 routes can be served (2 not served)\n"
    );
    let served = https_get(stack.https, &host("served"), "/").expect("the served route");
    assert_eq!(
        (served.status, served.body.as_str()),
        (200, "served-backend")
    );
    assert!(!stack.ready());
    let state = stack.state().expect("/v1/state");
    assert_eq!(state["readiness"]["mode"], "strict", "{state:#}");
    assert_eq!(state["ready"], false, "{state:#}");
}
