use std::time::{Duration, Instant};

use private_ingress_tests::live::{
    atomic_write, certificate, eventually, eventually_every, fingerprint_of_pem, https_get,
    route_of, Backend, RouteSpec, SilentNameServer, Stack,
};

const READY: Duration = Duration::from_secs(60);

fn host(i: usize) -> String {
    format!("svc{i}.in.example.org")
}

/// The upstream name resolves through the system's resolver configuration, reading an
/// /etc/hosts the test writes (bind-mounted in the agent's own mount namespace; its resolv.conf
/// names a server that never answers, so nothing else does). Its answer moves from one address
/// to another: requests follow, and the old backend is dropped. Then the name stops resolving:
/// the last addresses keep serving and /v1/state says why.
#[test]
fn a_changed_dns_answer_moves_the_backends_and_a_failed_lookup_keeps_them() {
    let mut stack = Stack::new();
    let backends = Backend::start_on_one_port(&["first-address", "second-address"]);
    let silent = SilentNameServer::start();
    let resolv_conf = stack.dir.path().join("resolv.conf");
    std::fs::write(&resolv_conf, silent.resolv_conf()).unwrap();
    let hosts = stack.dir.path().join("hosts");
    let name = "pi-upstream";
    let answer = |backend: &Backend| format!("{} {name}\n", backend.address.ip());
    std::fs::write(&hosts, answer(&backends[0])).unwrap();
    certificate(&stack.tls_dir(), &host(0));
    // The backends listen on loopback addresses, which an answer may hold only when allowed.
    stack.write_workspace(&stack.workspace_text_with(
        &[RouteSpec {
            host: host(0),
            upstream: name.into(),
            port: Some(backends[0].address.port()),
        }],
        "  allow_special_upstream_addresses = true,",
    ));
    stack.start_sozu();
    stack.start_agent_with_resolver(
        &hosts,
        &resolv_conf,
        &["--dns-interval", "1", "--dns-timeout-ms", "1000"],
    );
    stack.wait_ready(READY);
    let body = || https_get(stack.https, &host(0), "/").map(|s| s.body);
    assert_eq!(body().as_deref(), Ok("first-address"));

    // In place, as an edit of /etc/hosts would be: the bind mount follows the same file.
    std::fs::write(&hosts, answer(&backends[1])).unwrap();
    eventually(
        Duration::from_secs(10),
        "requests on the new address",
        || (body().as_deref() == Ok("second-address")).then_some(()),
    );
    // The old address is gone from sozu, not just outnumbered.
    for _ in 0..20 {
        assert_eq!(body().as_deref(), Ok("second-address"));
    }

    // The name stops resolving: the last answer stays, and the route says why.
    std::fs::write(&hosts, "").unwrap();
    let error = eventually(
        Duration::from_secs(10),
        "the lookup failure reported",
        || {
            stack.state()?["routes"][0]["last_error"]
                .as_str()
                .filter(|e| e.contains(name))
                .map(str::to_owned)
        },
    );
    assert!(error.starts_with(&format!("resolving {name}")), "{error}");
    std::thread::sleep(Duration::from_millis(1500));
    for _ in 0..20 {
        assert_eq!(body().as_deref(), Ok("second-address"));
    }
}

/// An answer of the cloud metadata address and loopback is not trusted: no backend in sozu
/// (clients get 503), the name shows what was dropped and why, and `/metrics` counts it; the
/// workspace that allows such addresses gets them served.
#[test]
fn special_addresses_in_an_answer_become_no_backend_unless_allowed() {
    let mut stack = Stack::new();
    let backend = Backend::start("on-loopback");
    let silent = SilentNameServer::start();
    let resolv_conf = stack.dir.path().join("resolv.conf");
    std::fs::write(&resolv_conf, silent.resolv_conf()).unwrap();
    let hosts = stack.dir.path().join("hosts");
    let name = "pi-upstream";
    std::fs::write(
        &hosts,
        format!("169.254.169.254 {name}\n{} {name}\n", backend.address.ip()),
    )
    .unwrap();
    certificate(&stack.tls_dir(), &host(0));
    let routes = [RouteSpec {
        host: host(0),
        upstream: name.into(),
        port: Some(backend.address.port()),
    }];
    stack.write_workspace(&stack.workspace_text(&routes));
    stack.start_sozu();
    stack.start_agent_with_resolver(
        &hosts,
        &resolv_conf,
        &["--dns-interval", "1", "--dns-timeout-ms", "1000"],
    );
    // The DNS source shows its names as soon as it has looked them up, which may be before the
    // loop's first pass has published the route: wait for both.
    let dropped = eventually(
        Duration::from_secs(60),
        "the answer's addresses dropped, and the route shown",
        || {
            let state = stack.state()?;
            let dropped = state["dns"][0]["dropped_addresses"].as_array()?.clone();
            (dropped.len() == 2 && state["routes"][0].is_object()).then_some((state, dropped))
        },
    );
    let (state, dropped) = dropped;
    let dropped: Vec<&str> = dropped.iter().filter_map(|d| d.as_str()).collect();
    assert!(
        dropped.contains(&"169.254.169.254 (link-local)"),
        "{dropped:?}"
    );
    assert!(
        dropped.contains(&format!("{} (loopback)", backend.address.ip()).as_str()),
        "{dropped:?}"
    );
    assert_eq!(state["routes"][0]["backends_actual"], serde_json::json!([]));
    let served = https_get(stack.https, &host(0), "/");
    assert!(
        served.as_ref().is_err() || served.as_ref().is_ok_and(|s| s.status == 503),
        "{:?}",
        served.map(|s| (s.status, s.body))
    );
    let metrics = stack.metrics();
    assert!(
        metrics.lines().any(
            |l| l.starts_with("private_ingress_dns_dropped_addresses_total ") && !l.ends_with(" 0")
        ),
        "{metrics}"
    );
    // Allowed: served from the loopback address.
    std::fs::write(&hosts, format!("{} {name}\n", backend.address.ip())).unwrap();
    stack.write_workspace(
        &stack.workspace_text_with(&routes, "  allow_special_upstream_addresses = true,"),
    );
    eventually(Duration::from_secs(30), "served once allowed", || {
        https_get(stack.https, &host(0), "/")
            .ok()
            .filter(|s| s.status == 200 && s.body == "on-loopback")
    });
}

/// The cluster DNS stalls (its only name server swallows every query): a route to an IP address
/// is served at once, certificate rotations go through while lookups hang, and the name that
/// never resolves is reported as such.
#[test]
fn a_resolver_that_never_answers_stalls_nothing() {
    let mut stack = Stack::new();
    let backend = Backend::start("by-address");
    let silent = SilentNameServer::start();
    let resolv_conf = stack.dir.path().join("resolv.conf");
    std::fs::write(&resolv_conf, silent.resolv_conf()).unwrap();
    let hosts = stack.dir.path().join("hosts");
    std::fs::write(&hosts, "127.0.0.1 localhost\n").unwrap();
    let (by_ip, by_name, stalled) = (host(0), host(1), "never.svc.cluster.internal");
    let dir = stack.tls_dir().join(&by_ip);
    let renew = |generation: u32| {
        let pair = rcgen::generate_simple_self_signed(vec![by_ip.clone()]).unwrap();
        atomic_write(
            &dir,
            &pair.cert.pem(),
            &pair.signing_key.serialize_pem(),
            generation,
        );
        fingerprint_of_pem(&pair.cert.pem())
    };
    let first = renew(0);
    certificate(&stack.tls_dir(), &by_name);
    stack.write_workspace(&stack.workspace_text(&[
        RouteSpec {
            host: by_ip.clone(),
            upstream: backend.address.ip().to_string(),
            port: Some(backend.address.port()),
        },
        RouteSpec {
            host: by_name.clone(),
            upstream: stalled.into(),
            port: Some(80),
        },
    ]));
    stack.start_sozu();
    let started = Instant::now();
    stack.start_agent_with_resolver(
        &hosts,
        &resolv_conf,
        &[
            "--dns-interval",
            "3",
            "--dns-timeout-ms",
            "2000",
            "--resync-interval",
            "0",
        ],
    );
    // The bound is generous (the workspace's evaluation alone takes over a second on a busy
    // machine); what tells a stalled agent from a slow one is the stalled name's first lookup,
    // which has not yet reached its 2 s deadline when the IP route is served.
    eventually_every(
        Duration::from_millis(2),
        Duration::from_secs(30),
        "the IP route served",
        || {
            https_get(stack.https, &by_ip, "/")
                .ok()
                .filter(|s| s.fingerprint == first && s.body == "by-address")
        },
    );
    let first_served = started.elapsed();
    let state = stack.state().expect("/v1/state");
    let failures_then = state["dns"]
        .as_array()
        .and_then(|names| names.iter().find(|n| n["name"] == stalled))
        .map_or(0, |n| n["failures"].as_u64().unwrap_or(0));
    assert_eq!(
        failures_then, 0,
        "the IP route was served only after the stalled lookup's deadline: it waited for it \
         ({state})"
    );

    // Swaps across several periods of lookups that never answer (each waits its 2 s deadline,
    // then the next comes 1, 2, then 3 s later).
    let mut latencies = Vec::new();
    let mut current = first;
    for generation in 1..=12 {
        std::thread::sleep(Duration::from_millis(700));
        let swapped = Instant::now();
        let new = renew(generation);
        eventually_every(
            Duration::from_millis(1),
            // Half a lookup's 2 s deadline: a swap that waited for a stalled lookup would take
            // up to the whole deadline; one that did not is served in milliseconds (printed
            // below), however busy the machine.
            Duration::from_secs(1),
            "the new certificate served well within a stalled lookup's deadline",
            || {
                let seen = https_get(stack.https, &by_ip, "/").ok()?;
                assert!(
                    seen.fingerprint == current || seen.fingerprint == new,
                    "a third certificate served"
                );
                (seen.fingerprint == new).then_some(())
            },
        );
        latencies.push(swapped.elapsed());
        current = new;
    }
    latencies.sort();
    eprintln!(
        "stalled resolver: IP route first served {:.1} ms after the agent started; 12 swaps \
         served in {:.1} ms (median) to {:.1} ms (max)",
        first_served.as_secs_f64() * 1e3,
        latencies[6].as_secs_f64() * 1e3,
        latencies[11].as_secs_f64() * 1e3
    );

    let state = stack.state().expect("/v1/state");
    let dns = state["dns"]
        .as_array()
        .and_then(|names| names.iter().find(|n| n["name"] == stalled))
        .unwrap_or_else(|| panic!("{stalled} in /v1/state: {state}"));
    assert_eq!(dns["resolved"], false, "{dns}");
    assert_eq!(dns["last_error"], "no answer within 2000 ms", "{dns}");
    assert!(dns["failures"].as_u64().unwrap_or(0) >= 2, "{dns}");
    let route = route_of(&state, &by_name).expect("the route");
    assert_eq!(route["state"], "pending", "{route}");
    assert_eq!(route["waiting_for"], serde_json::json!(["dns"]), "{route}");
    // Its name failed: the route is left out, and the agent is ready with the other.
    assert_eq!(state["ready"], true, "{state}");
    assert_eq!(state["readiness"]["routes_not_served"], 1, "{state}");
    let metrics = stack.metrics();
    assert!(
        metrics.contains(&format!(
            "private_ingress_dns_lookup_ok{{name=\"{stalled}\"}} 0"
        )),
        "{metrics}"
    );
    assert!(
        metrics.contains(&format!(
            "private_ingress_dns_addresses{{name=\"{stalled}\"}} 0"
        )),
        "{metrics}"
    );
}
