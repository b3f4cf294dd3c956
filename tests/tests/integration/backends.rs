//! Routes that know their backends, through a real sozu: health checks take a failing backend
//! out and bring it back, a drain lets the requests in flight finish and sends new ones
//! elsewhere, weights split the traffic, HSTS reaches the client, and a frontend removed behind
//! the agent's back comes back from sozu's event alone.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use private_ingress_tests::live::{
    certificate, eventually, https_get, https_get_sending, route_of, sozu_add_backend,
    strict_transport_security, Backend, KeepAlive, Stack,
};

/// How long a start may take before the test calls the agent wedged. Not a measure of speed
/// (the benches measure that): beside two CPU hogs, sozu's main process once answered nothing
/// for 19 s, and the agent sent the whole workspace the moment it answered again.
const READY: Duration = Duration::from_secs(60);
const HOST: &str = "app.in.example.org";

/// One upstream of a route: `{ upstream, port, weight, drain }`.
fn upstream(backend: &Backend, weight: u32, drain: bool) -> String {
    format!(
        "{{ upstream = \"{}\", port = {}, weight = {weight}, drain = {drain} }}",
        backend.address.ip(),
        backend.address.port()
    )
}

/// A route of `host` over `upstreams`, with more fields (`more`, each ending in a comma).
fn route(host: &str, upstreams: &[String], more: &str) -> String {
    format!(
        "{{ host = \"{host}\", upstreams = [{}], {more} }}",
        upstreams.join(", ")
    )
}

/// sozu and the agent serving `routes` (whose hosts have certificates), ready.
fn serving(stack: &mut Stack, routes: &[String], extra: &str, args: &[&str]) {
    stack.write_workspace(&stack.workspace_text_of(routes, extra));
    stack.start_sozu();
    let log = std::env::var("AGENT_LOG").unwrap_or_else(|_| "info".into());
    stack.start_agent_with(args, &[("RUST_LOG", &log)]);
    stack.wait_ready(READY);
}

/// Who answered `n` requests to `host`, each on a new connection: body (or error) → count.
fn answers(stack: &Stack, host: &str, n: usize) -> BTreeMap<String, usize> {
    let mut seen = BTreeMap::new();
    for _ in 0..n {
        let who = match https_get(stack.https, host, "/") {
            Ok(s) if s.status == 200 => s.body,
            Ok(s) => format!("status {}", s.status),
            Err(e) => format!("error: {e}"),
        };
        *seen.entry(who).or_default() += 1;
    }
    seen
}

/// The route of `host` in `/v1/state`.
fn route_state(stack: &Stack, host: &str) -> serde_json::Value {
    let state = stack.state().expect("/v1/state");
    route_of(&state, host)
        .cloned()
        .unwrap_or_else(|| panic!("{host} not in /v1/state: {state}"))
}

/// The `/v1/state` entry of the upstream whose backend is `backend`.
fn upstream_state(stack: &Stack, host: &str, backend: &Backend) -> serde_json::Value {
    let route = route_state(stack, host);
    let address = backend.address.to_string();
    route["upstreams"]
        .as_array()
        .and_then(|ups| {
            ups.iter().find(|u| {
                u["backends"]
                    .as_array()
                    .is_some_and(|bs| bs.iter().any(|b| b["address"] == address.as_str()))
                    || u["upstream"] == address.as_str()
            })
        })
        .cloned()
        .unwrap_or_else(|| panic!("no upstream of {host} at {address}: {route}"))
}

/// The health `/v1/state` shows for `backend`, and its backend id.
fn backend_health(stack: &Stack, host: &str, backend: &Backend) -> (String, String) {
    let upstream = upstream_state(stack, host, backend);
    let address = backend.address.to_string();
    let entry = upstream["backends"]
        .as_array()
        .and_then(|bs| bs.iter().find(|b| b["address"] == address.as_str()))
        .cloned()
        .unwrap_or_else(|| panic!("backend {address} not shown: {upstream}"));
    (
        entry["health"].as_str().unwrap_or_default().to_owned(),
        entry["id"].as_str().unwrap_or_default().to_owned(),
    )
}

#[test]
fn a_failing_health_check_takes_its_backend_out_and_recovery_brings_it_back() {
    let mut stack = Stack::new();
    certificate(&stack.tls_dir(), HOST);
    let (a, b) = (Backend::start("a"), Backend::start("b"));
    let (interval, timeout, unhealthy, healthy) = (1, 1, 2, 2);
    let health = format!(
        "health = {{ path = \"/healthz\", interval = {interval}, timeout = {timeout}, \
         unhealthy_threshold = {unhealthy}, healthy_threshold = {healthy} }},"
    );
    serving(
        &mut stack,
        &[route(
            HOST,
            &[upstream(&a, 1, false), upstream(&b, 1, false)],
            &health,
        )],
        "",
        &[],
    );
    let both = answers(&stack, HOST, 20);
    assert_eq!(
        both.get("a").zip(both.get("b")),
        Some((&10, &10)),
        "{both:?}"
    );

    // A down within its thresholds: `unhealthy` failed probes, one `interval` apart, plus one
    // interval for the probe already scheduled, its `timeout`, and a second for the event to
    // reach the agent on a loaded machine (seen here: 2.9 to 3.9 s).
    a.set_healthy(false);
    let failed = Instant::now();
    let within = Duration::from_secs((interval * (unhealthy + 1) + timeout + 1) as u64);
    eventually(within, "a reported down", || {
        (backend_health(&stack, HOST, &a).0 == "down").then_some(())
    });
    eprintln!(
        "a down {:?} after its health endpoint failed",
        failed.elapsed()
    );
    let only_b = answers(&stack, HOST, 20);
    assert_eq!(only_b, BTreeMap::from([("b".to_owned(), 20)]));

    // Both down. sozu 2.3.3 fails open: it still sends to backends that accept connections,
    // so the route answers; the agent shows it has no backend up.
    b.set_healthy(false);
    eventually(within, "b reported down", || {
        (backend_health(&stack, HOST, &b).0 == "down").then_some(())
    });
    eventually(
        Duration::from_secs(2),
        "the route shown without a backend",
        || (route_state(&stack, HOST)["no_available_backend"] == true).then_some(()),
    );
    let open = answers(&stack, HOST, 10);
    assert_eq!(open.values().sum::<usize>(), 10);
    assert!(
        open.keys().all(|who| who == "a" || who == "b"),
        "fail-open should reach the backends: {open:?}"
    );
    let route = route_state(&stack, HOST);
    assert_eq!(route["state"], "error", "{route}");
    assert!(
        route["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("every backend is reported down")),
        "{route}"
    );
    let metrics = stack.metrics();
    assert!(
        metrics.contains(&format!(
            "private_ingress_route_no_available_backend{{host=\"{HOST}\",route=\"pi-{HOST}\"}} 1"
        )),
        "{metrics}"
    );
    let status = stack.status_text();
    assert!(status.contains(&format!("{} down", a.address)), "{status}");

    // A back within its healthy threshold: `healthy` passed probes. sozu spaces the probes of
    // a backend it holds down more widely than `interval` (seen here: up 3.9 s after recovery,
    // with an interval of 1 s and a threshold of 2), so twice the interval each, plus one.
    a.set_healthy(true);
    let recovered = Instant::now();
    let within = Duration::from_secs((2 * interval * (healthy + 1) + 1) as u64);
    eventually(within, "a reported up again", || {
        (backend_health(&stack, HOST, &a).0 == "up").then_some(())
    });
    eprintln!("a up {:?} after it recovered", recovered.elapsed());
    let back = answers(&stack, HOST, 10);
    assert_eq!(back, BTreeMap::from([("a".to_owned(), 10)]));
    let metrics = stack.metrics();
    let labels = format!(
        "{{backend=\"{}\",host=\"{HOST}\",route=\"pi-{HOST}\"}}",
        a.address
    );
    for line in [
        format!("private_ingress_backend_up{labels} 1"),
        // Down, then up.
        format!("private_ingress_backend_transitions_total{labels} 2"),
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line}: {metrics}");
    }

    // A restarted sozu holds no health check until the agent gives it back: b, still failing,
    // is taken out again by the restored check.
    stack.kill_sozu();
    stack.start_sozu();
    stack.wait_ready(READY);
    eventually(within, "b reported down by the restored check", || {
        (backend_health(&stack, HOST, &b).0 == "down").then_some(())
    });
    let after_restart = answers(&stack, HOST, 10);
    assert_eq!(after_restart, BTreeMap::from([("a".to_owned(), 10)]));
}

/// The drain test's route: `a` (drained or not) and `b`, of equal weight.
fn drain_route(a: &Backend, b: &Backend, drain_a: bool) -> String {
    route(HOST, &[upstream(a, 1, drain_a), upstream(b, 1, false)], "")
}

/// Without HSTS (the default): the drained backend's sessions are closed as well, and status
/// counts them.
#[test]
fn a_drain_finishes_the_requests_in_flight_and_sends_new_ones_elsewhere() {
    drain("");
}

/// With HSTS, sozu adds the header to every response, so the agent does not close the drained
/// backend's sessions (sozu 2.3.3 breaks a response in flight on a session it closes while it
/// adds a header): the requests in flight must still arrive whole.
#[test]
fn a_drain_with_hsts_leaves_the_sessions_to_end_and_breaks_no_response() {
    drain("  hsts = true,");
}

/// Drain as users mean it: the request in flight on the drained upstream completes, new
/// requests and keep-alive clients go to the other one, status says `draining` then `drained`,
/// and undraining restores traffic. First, what the field design avoids: a weight of 0 given to
/// sozu still sends traffic. `extra`: more workspace fields.
fn drain(extra: &str) {
    let closes_sessions = !extra.contains("hsts = true");
    let mut stack = Stack::new();
    certificate(&stack.tls_dir(), HOST);
    let (a, b) = (Backend::start("a"), Backend::start("b"));
    serving(&mut stack, &[drain_route(&a, &b, false)], extra, &[]);

    // Weight 0 is not a drain in sozu: with the agent stopped, so that sozu alone decides, a is
    // given weight 0 on sozu's socket, and still gets its share.
    let (_, a_id) = backend_health(&stack, HOST, &a);
    assert!(stack.stop_agent(), "the agent did not stop on SIGTERM");
    sozu_add_backend(&stack.socket(), &format!("pi-{HOST}"), &a_id, a.address, 0)
        .expect("a backend of weight 0");
    let zero = answers(&stack, HOST, 20);
    assert!(
        zero.get("a").is_some_and(|&n| n >= 5),
        "a backend of weight 0 should still be picked by sozu 2.3.3 (clamped to 1): {zero:?}"
    );
    eprintln!("weight 0 on sozu: {zero:?}");
    stack.start_agent();
    stack.wait_ready(READY);

    // Slow requests in flight on both upstreams (round robin alternates), then an idle
    // keep-alive client of a.
    let https = stack.https;
    let slow: Vec<_> = (0..4)
        .map(|_| {
            std::thread::spawn(move || {
                https_get(https, HOST, "/delay/3000").map(|s| (s.status, s.body))
            })
        })
        .collect();
    eventually(
        Duration::from_secs(30),
        "the slow requests in flight",
        || (a.delayed_requests() + b.delayed_requests() == slow.len()).then_some(()),
    );
    let mut keep_alive = (0..6)
        .find_map(|_| {
            let mut c = KeepAlive::connect(https, HOST).expect("keep-alive connection");
            let (_, body) = c.get("/").expect("first keep-alive request");
            (body == "a").then_some(c)
        })
        .expect("a keep-alive client on a");

    stack.write_workspace(&stack.workspace_text_of(&[drain_route(&a, &b, true)], extra));
    eventually(Duration::from_secs(5), "a shown draining", || {
        let state = upstream_state(&stack, HOST, &a)["state"].clone();
        state
            .as_str()
            .is_some_and(|s| s.starts_with("draining"))
            .then_some(())
    });
    let draining = stack.status_text();
    // A session count only where sozu was asked to close them.
    let shown = if closes_sessions {
        "draining ("
    } else {
        "draining"
    };
    assert!(draining.contains(shown), "{draining}");
    let new = answers(&stack, HOST, 20);
    assert_eq!(
        new,
        BTreeMap::from([("b".to_owned(), 20)]),
        "new requests after the drain"
    );
    // Closed sessions: the client reconnects, and lands on b. Sessions left open: sozu picks
    // a backend for each request, so the next one goes to b.
    match keep_alive.get("/") {
        Ok((_, body)) => assert_eq!(body, "b", "a keep-alive client stayed on the drain"),
        Err(e) => assert!(closes_sessions, "a keep-alive session broke: {e}"),
    }
    // sozu reports a removed backend drained once every client session that used it has
    // closed; left open, the client's session would hold it (`drained` never comes).
    drop(keep_alive);

    let finished: Vec<_> = slow
        .into_iter()
        .map(|t| t.join().expect("slow request thread"))
        .collect();
    assert!(
        finished.iter().all(|r| matches!(r, Ok((200, _)))),
        "a request in flight failed: {finished:?}"
    );
    assert!(
        finished
            .iter()
            .any(|r| matches!(r, Ok((_, body)) if body == "a")),
        "no slow request was in flight on a: {finished:?}"
    );
    eventually(Duration::from_secs(5), "a shown drained", || {
        (upstream_state(&stack, HOST, &a)["state"] == "drained").then_some(())
    });
    let drained = stack.status_text();
    assert!(drained.contains("drained"), "{drained}");

    // Every upstream drained: sozu answers 503, and the agent says why.
    let both_drained = route(HOST, &[upstream(&a, 1, true), upstream(&b, 1, true)], "");
    stack.write_workspace(&stack.workspace_text_of(&[both_drained], extra));
    eventually(Duration::from_secs(5), "b shown drained", || {
        (upstream_state(&stack, HOST, &b)["state"] == "drained").then_some(())
    });
    assert_eq!(
        answers(&stack, HOST, 5),
        BTreeMap::from([("status 503".to_owned(), 5)])
    );
    let route = route_state(&stack, HOST);
    assert_eq!(route["no_available_backend"], true, "{route}");
    assert!(
        route["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("every upstream is drained")),
        "{route}"
    );

    stack.write_workspace(&stack.workspace_text_of(&[drain_route(&a, &b, false)], extra));
    eventually(Duration::from_secs(5), "b back in rotation", || {
        (upstream_state(&stack, HOST, &b)["state"] == "in rotation").then_some(())
    });
    eventually(Duration::from_secs(5), "a back in rotation", || {
        (upstream_state(&stack, HOST, &a)["state"] == "in rotation").then_some(())
    });
    let both = answers(&stack, HOST, 20);
    assert_eq!(
        both.get("a").zip(both.get("b")),
        Some((&10, &10)),
        "{both:?}"
    );
}

#[test]
fn weights_split_the_traffic_in_proportion() {
    let mut stack = Stack::new();
    certificate(&stack.tls_dir(), HOST);
    let (a, b) = (Backend::start("a"), Backend::start("b"));
    serving(
        &mut stack,
        &[route(
            HOST,
            &[upstream(&a, 90, false), upstream(&b, 10, false)],
            "",
        )],
        "",
        &[],
    );
    let n = 2000;
    let seen = answers(&stack, HOST, n);
    let a_share = *seen.get("a").unwrap_or(&0) as f64 * 100.0 / n as f64;
    eprintln!("90/10 over {n} requests: {seen:?}");
    assert_eq!(seen.values().sum::<usize>(), n);
    assert!(
        (85.0..=95.0).contains(&a_share),
        "a got {a_share:.1} % of {n} requests, not 90 ± 5: {seen:?}"
    );
    assert_eq!(
        seen.get("a").copied().unwrap_or(0) + seen.get("b").copied().unwrap_or(0),
        n,
        "{seen:?}"
    );
}

#[test]
fn hsts_is_on_https_responses_as_configured_and_absent_where_a_route_turns_it_off() {
    let mut stack = Stack::new();
    let hosts = ["a", "off", "own"].map(|h| format!("{h}.in.example.org"));
    for host in &hosts {
        certificate(&stack.tls_dir(), host);
    }
    let backend = Backend::start("app");
    let up = [upstream(&backend, 1, false)];
    let routes = [
        route(&hosts[0], &up, ""),
        route(&hosts[1], &up, "hsts = false,"),
        route(
            &hosts[2],
            &up,
            "hsts = { max_age = 1200, include_subdomains = true },",
        ),
    ];
    serving(&mut stack, &routes, "  hsts = { max_age = 600 },", &[]);
    let header = |host: &str| {
        let (seen, values) =
            strict_transport_security(stack.https, host).unwrap_or_else(|e| panic!("{host}: {e}"));
        assert_eq!((seen.status, seen.body.as_str()), (200, "app"), "{host}");
        values
    };
    assert_eq!(header(&hosts[0]), ["max-age=600"]);
    assert_eq!(header(&hosts[1]), Vec::<String>::new());
    assert_eq!(header(&hosts[2]), ["max-age=1200; includeSubDomains"]);

    // The workspace's policy removed: none is the default, and the route's own stays.
    stack.write_workspace(&stack.workspace_text_of(&routes, ""));
    eventually(Duration::from_secs(5), "the listener's header gone", || {
        header(&hosts[0]).is_empty().then_some(())
    });
    assert_eq!(header(&hosts[1]), Vec::<String>::new());
    assert_eq!(header(&hosts[2]), ["max-age=1200; includeSubDomains"]);
}

/// A frontend removed with sozu's own command line is put back from sozu's event, well before
/// the periodic resync (an hour here) would.
#[test]
fn a_frontend_removed_behind_the_agents_back_is_restored_within_a_second() {
    let mut stack = Stack::new();
    certificate(&stack.tls_dir(), HOST);
    let backend = Backend::start("app");
    serving(
        &mut stack,
        &[route(HOST, &[upstream(&backend, 1, false)], "")],
        "",
        &["--resync-interval", "3600"],
    );
    let ok = || https_get(stack.https, HOST, "/").is_ok_and(|s| s.status == 200 && s.body == "app");
    assert!(ok());

    let removed = std::process::Command::new(private_ingress_tests::sozu_bin())
        .arg("-c")
        .arg(stack.dir.path().join("sozu.toml"))
        .args([
            "frontend",
            "https",
            "remove",
            "--address",
            &stack.https.to_string(),
        ])
        .args([
            "--hostname",
            HOST,
            "--path-prefix",
            "/",
            "id",
            &format!("pi-{HOST}"),
        ])
        .output()
        .expect("run sozu's command line");
    let gone = Instant::now();
    assert!(removed.status.success(), "{removed:?}");
    eventually(Duration::from_secs(1), "the frontend restored", || {
        ok().then_some(())
    });
    eprintln!(
        "frontend restored {:?} after sozu's CLI returned",
        gone.elapsed()
    );
    let metrics = stack.metrics();
    assert!(
        metrics.contains("private_ingress_drift_repairs_total 1"),
        "{metrics}"
    );
}

/// The `Set-Cookie` values of a response, and who answered.
fn answered_with_cookies(stack: &Stack, host: &str, cookie: Option<&str>) -> (String, Vec<String>) {
    let headers: Vec<(&str, &str)> = cookie.map(|c| ("Cookie", c)).into_iter().collect();
    let (seen, response) =
        https_get_sending(stack.https, host, "/", &headers).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(seen.status, 200, "{seen:?}");
    let cookies = response
        .into_iter()
        .filter(|(name, _)| name == "set-cookie")
        .map(|(_, value)| value)
        .collect();
    (seen.body, cookies)
}

/// `sticky = true`: sozu answers a client without its cookie with `SOZUBALANCEID=<backend>;
/// Path=/`, and every request carrying that cookie reaches the backend it names, while clients
/// without it are still spread over both backends. A route without `sticky` sets no cookie and
/// ignores one sent to it. `balancing = 'hrw` pins a client by its address alone: every
/// request from loopback reaches one backend, cookie or not. The status shows both.
#[test]
fn a_sticky_route_keeps_a_client_on_the_backend_its_cookie_names() {
    let mut stack = Stack::new();
    let (sticky, plain, hashed) = (
        "sticky.in.example.org",
        "plain.in.example.org",
        "hashed.in.example.org",
    );
    for host in [sticky, plain, hashed] {
        certificate(&stack.tls_dir(), host);
    }
    let (a, b) = (Backend::start("a"), Backend::start("b"));
    let both = [upstream(&a, 1, false), upstream(&b, 1, false)];
    serving(
        &mut stack,
        &[
            route(sticky, &both, "sticky = true,"),
            route(plain, &both, ""),
            route(hashed, &both, "balancing = 'hrw,"),
        ],
        "",
        &[],
    );

    // Without the cookie: both backends answer, and each answer sets the cookie.
    let mut spread = BTreeMap::new();
    let mut cookies = BTreeMap::new();
    for _ in 0..20 {
        let (who, set) = answered_with_cookies(&stack, sticky, None);
        let [cookie] = &set[..] else {
            panic!("one Set-Cookie expected from a sticky route, got {set:?}")
        };
        let (pair, attributes) = cookie.split_once(';').unwrap_or((cookie, ""));
        assert!(pair.starts_with("SOZUBALANCEID="), "{cookie}");
        assert_eq!(attributes.trim(), "Path=/", "{cookie}");
        *spread.entry(who.clone()).or_insert(0) += 1;
        cookies.insert(who, pair.to_owned());
    }
    assert_eq!(
        spread.len(),
        2,
        "both backends answer new clients: {spread:?}"
    );

    // With it: every request reaches the backend it names, and no new cookie is set.
    for (who, cookie) in &cookies {
        for _ in 0..10 {
            let (answered, set) = answered_with_cookies(&stack, sticky, Some(cookie));
            assert_eq!(&answered, who, "{cookie} pins to {who}");
            assert!(set.is_empty(), "the cookie sent is kept: {set:?}");
        }
    }

    // Not sticky: no cookie set, and one sent does not pin.
    let mut plain_spread = BTreeMap::new();
    let any_cookie = cookies.values().next().unwrap().clone();
    for _ in 0..10 {
        let (who, set) = answered_with_cookies(&stack, plain, Some(&any_cookie));
        assert!(set.is_empty(), "{set:?}");
        *plain_spread.entry(who).or_insert(0) += 1;
    }
    assert_eq!(plain_spread.len(), 2, "{plain_spread:?}");

    // HRW: one client address, one backend.
    let hashed_answers = answers(&stack, hashed, 20);
    assert_eq!(hashed_answers.len(), 1, "{hashed_answers:?}");

    let status = stack.status_text();
    assert!(status.contains("sticky"), "{status}");
    assert!(status.contains("balancing hrw"), "{status}");
    assert_eq!(route_state(&stack, sticky)["policy"], "sticky");
}
