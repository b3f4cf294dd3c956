use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use private_ingress_tests::live::{
    certificate, eventually, https_get, route_of, sample, Backend, RouteSpec, Seen, Stack,
};

/// How long a start may take before the test calls the agent wedged. Not a measure of speed
/// (the benches measure that): beside two CPU hogs, sozu's main process once answered nothing
/// for 19 s, and the agent sent the whole workspace the moment it answered again.
const READY: Duration = Duration::from_secs(60);

fn host(i: usize) -> String {
    format!("svc{i}.in.example.org")
}

/// `n` routes, each with its own certificate and its own backend answering with its name.
fn routes(stack: &Stack, n: usize) -> (Vec<RouteSpec>, Vec<Backend>, BTreeMap<String, String>) {
    let mut specs = Vec::new();
    let mut backends = Vec::new();
    let mut fingerprints = BTreeMap::new();
    for i in 0..n {
        let backend = Backend::start(&format!("backend-{i}"));
        fingerprints.insert(host(i), certificate(&stack.tls_dir(), &host(i)));
        specs.push(RouteSpec {
            host: host(i),
            upstream: backend.address.ip().to_string(),
            port: Some(backend.address.port()),
        });
        backends.push(backend);
    }
    (specs, backends, fingerprints)
}

/// sozu and the agent serving `n` routes, ready.
fn running(
    n: usize,
) -> (
    Stack,
    Vec<RouteSpec>,
    Vec<Backend>,
    BTreeMap<String, String>,
) {
    running_with(n, &[])
}

/// [`running`], the agent started with `args`.
fn running_with(
    n: usize,
    args: &[&str],
) -> (
    Stack,
    Vec<RouteSpec>,
    Vec<Backend>,
    BTreeMap<String, String>,
) {
    let mut stack = Stack::new();
    let (specs, backends, fingerprints) = routes(&stack, n);
    stack.write_workspace(&stack.workspace_text(&specs));
    stack.start_sozu();
    stack.start_agent_args(args);
    stack.wait_ready(READY);
    (stack, specs, backends, fingerprints)
}

/// Each host's handshake presents its own certificate and its request reaches its own backend.
fn assert_serves(stack: &Stack, fingerprints: &BTreeMap<String, String>) {
    for (i, (host, fingerprint)) in fingerprints.iter().enumerate() {
        let seen = https_get(stack.https, host, "/").unwrap_or_else(|e| panic!("{host}: {e}"));
        let index: usize = host
            .trim_start_matches("svc")
            .split('.')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or(i);
        assert_eq!(
            seen,
            Seen {
                fingerprint: fingerprint.clone(),
                status: 200,
                body: format!("backend-{index}"),
            },
            "{host}"
        );
    }
}

#[test]
fn cold_start_serves_every_route_with_its_certificate() {
    let (stack, _specs, _backends, fingerprints) = running(25);
    assert_serves(&stack, &fingerprints);

    // HTTP redirects to HTTPS.
    let response = ureq::get(&format!("http://{}/", stack.http))
        .header("Host", host(3))
        .config()
        .max_redirects(0)
        .http_status_as_error(false)
        .build()
        .call()
        .expect("http request");
    assert_eq!(response.status(), 301);
    assert_eq!(
        response
            .headers()
            .get("location")
            .and_then(|v| v.to_str().ok()),
        Some(format!("https://{}/", host(3)).as_str())
    );

    // The agent's log goes to a file here: plain text, no colour codes.
    let logs = stack.agent_logs();
    assert!(logs.contains("starting"), "{logs}");
    assert!(
        !logs.contains('\u{1b}'),
        "colour codes in a log file:\n{logs}"
    );
}

/// `/metrics` is valid Prometheus exposition (`promtool check metrics`, which scripts/test
/// installs) and says what a dashboard needs: ready, routes, each host's certificate.
#[test]
fn metrics_pass_promtool_and_describe_every_route() {
    let (stack, _specs, _backends, fingerprints) = running(3);
    let metrics = stack.metrics();
    if let Err(e) = private_ingress_tests::live::promtool_check(&metrics) {
        panic!("{e}\n{metrics}");
    }
    assert!(metrics.contains("private_ingress_ready 1"), "{metrics}");
    assert!(metrics.contains("private_ingress_routes 3"), "{metrics}");
    for (host, fingerprint) in &fingerprints {
        assert!(
            metrics.contains(&format!(
                "private_ingress_certificate_served_info{{fingerprint=\"{fingerprint}\",host=\"{host}\"}} 1"
            )),
            "{host}: {metrics}"
        );
    }
}

#[test]
fn the_agent_started_before_sozu_converges_once_sozu_is_up() {
    let mut stack = Stack::new();
    let (specs, _backends, fingerprints) = routes(&stack, 3);
    stack.write_workspace(&stack.workspace_text(&specs));
    stack.start_agent();
    std::thread::sleep(Duration::from_millis(500));
    assert!(!stack.ready(), "ready without sozu");
    stack.start_sozu();
    stack.wait_ready(READY);
    assert_serves(&stack, &fingerprints);
}

#[test]
fn editing_the_workspace_adds_changes_and_removes_routes() {
    let mut stack = Stack::new();
    let (mut specs, backends, mut fingerprints) = routes(&stack, 4);
    stack.write_workspace(&stack.workspace_text(&specs[..3]));
    stack.start_sozu();
    stack.start_agent();
    stack.wait_ready(READY);

    // Add the fourth route, in place.
    stack.write_workspace(&stack.workspace_text(&specs));
    eventually(Duration::from_secs(10), "the added route", || {
        https_get(stack.https, &host(3), "/")
            .ok()
            .filter(|s| s.body == "backend-3")
    });

    // Point route 0 at backend 2, by a ConfigMap-style `..data` swap of the directory.
    specs[0].port = Some(backends[2].address.port());
    let ws_dir = stack.dir.path().join("ws");
    let data = ws_dir.join("..2026_11_30_00_00_00.1");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("workspace.ncl"), stack.workspace_text(&specs)).unwrap();
    std::fs::remove_file(stack.workspace_path()).unwrap();
    std::os::unix::fs::symlink(&data, ws_dir.join("..data_tmp")).unwrap();
    std::fs::rename(ws_dir.join("..data_tmp"), ws_dir.join("..data")).unwrap();
    std::os::unix::fs::symlink("..data/workspace.ncl", stack.workspace_path()).unwrap();
    eventually(Duration::from_secs(10), "route 0 on backend 2", || {
        https_get(stack.https, &host(0), "/")
            .ok()
            .filter(|s| s.body == "backend-2")
    });

    // Remove route 1: its host then gets sozu's default answer, not backend 1.
    specs.remove(1);
    fingerprints.remove(&host(1));
    let next = ws_dir.join("..2026_11_30_00_00_01.2");
    std::fs::create_dir_all(&next).unwrap();
    std::fs::write(next.join("workspace.ncl"), stack.workspace_text(&specs)).unwrap();
    std::os::unix::fs::symlink(&next, ws_dir.join("..data_tmp")).unwrap();
    std::fs::rename(ws_dir.join("..data_tmp"), ws_dir.join("..data")).unwrap();
    std::fs::remove_dir_all(&data).unwrap();
    eventually(Duration::from_secs(10), "route 1 gone", || match https_get(
        stack.https,
        &host(1),
        "/",
    ) {
        Ok(seen) if seen.body == "backend-1" => None,
        _ => Some(()),
    });
    assert!(https_get(stack.https, &host(3), "/").is_ok_and(|s| s.body == "backend-3"));
}

#[test]
fn a_broken_edit_keeps_the_last_good_state_serving() {
    let (stack, _specs, _backends, fingerprints) = running(2);

    stack.write_workspace("{ zone = \"in.example.org\", routes = [ { host = \"oops\" } ] ");
    let error = eventually(
        Duration::from_secs(10),
        "the rejected edit in /v1/state",
        || {
            stack
                .state()
                .and_then(|s| s["workspace"]["last_error"].as_str().map(str::to_owned))
        },
    );
    assert!(error.contains("workspace.ncl"), "{error}");
    assert_serves(&stack, &fingerprints);
    let metrics = stack.metrics();
    assert!(
        metrics.contains("private_ingress_workspace_valid 0"),
        "{metrics}"
    );
}

/// A resync reads again only the clusters whose hash sozu reports changed; a change made behind
/// the agent's back still shows, and is undone: a backend removed with sozu's own command line
/// comes back, and the other route is served throughout.
#[test]
fn a_resync_puts_back_a_backend_removed_behind_the_agents_back() {
    resync_puts_back_a_removed_backend(2);
}

/// The same with more clusters than a start sends one by one: the start loads them in bulk and
/// takes what it created as read, so the first resync reads back only the cluster that changed,
/// and one of an unchanged sozu sends nothing.
#[test]
fn a_resync_of_many_clusters_puts_back_a_backend_removed_behind_the_agents_back() {
    resync_puts_back_a_removed_backend(80);
}

/// How long a pass may take to show in the agent's counters: a busy machine's scheduling.
const COUNTED: Duration = Duration::from_secs(60);

fn resync_puts_back_a_removed_backend(count: usize) {
    let (stack, _, backends, _) = running_with(count, &["--resync-interval", "2"]);
    let requests = |metrics: &str| sample(metrics, "private_ingress_sozu_requests_total");
    let worker_queries =
        |metrics: &str| sample(metrics, "private_ingress_resync_worker_queries_total");
    let sent = requests(&stack.metrics()).expect("private_ingress_sozu_requests_total");
    // Past the first resync, which remembers each cluster's hash. A pass's counters show once
    // it has ended.
    let metrics = eventually(COUNTED, "a resync", || {
        let metrics = stack.metrics();
        let resynced = sample(&metrics, "private_ingress_resyncs_total").is_some_and(|n| n >= 1.0);
        resynced.then_some(metrics)
    });
    assert_eq!(
        requests(&metrics),
        Some(sent),
        "a resync of a sozu nobody else changed sent requests\n{metrics}"
    );
    assert_eq!(
        sample(&metrics, "private_ingress_drift_repairs_total"),
        Some(0.0),
        "{metrics}"
    );
    // Nobody else changed sozu: its census said so, and no resync asked its workers anything
    // or had its main process list the frontends.
    assert_eq!(worker_queries(&metrics), Some(0.0), "{metrics}");
    assert_eq!(
        sample(&metrics, "private_ingress_resync_frontend_listings_total"),
        Some(0.0),
        "{metrics}"
    );
    let body = |i: usize| https_get(stack.https, &host(i), "/").map(|s| s.body);
    assert_eq!(body(0).as_deref(), Ok("backend-0"));

    remove_backend(&stack, &route_id(&stack, &host(0)), &backends[0]);
    assert_ne!(
        body(0).as_deref(),
        Ok("backend-0"),
        "the backend was not removed"
    );

    eventually(Duration::from_secs(6), "the backend put back", || {
        (body(0).as_deref() == Ok("backend-0")).then_some(())
    });
    assert_eq!(body(1).as_deref(), Ok("backend-1"));
    // No event tells of a backend removed: the census did, and the workers were asked.
    let metrics = stack.metrics();
    assert!(
        worker_queries(&metrics).is_some_and(|n| n >= 1.0),
        "{metrics}"
    );
}

/// A resync of a sozu nobody else changed has its main process list no frontend (at 10,000
/// routes, 17–20 ms of its one thread per protocol, which a rotation waited behind); once
/// someone else removes one, sozu's census shows it, and the next resync lists them once.
#[test]
fn a_resync_lists_the_frontends_only_after_someone_else_changed_one() {
    let (stack, _, _backends, _) = running_with(2, &["--resync-interval", "1"]);
    let listings =
        |metrics: &str| sample(metrics, "private_ingress_resync_frontend_listings_total");
    let resyncs = |metrics: &str| sample(metrics, "private_ingress_resyncs_total").unwrap_or(0.0);
    let past = |at_least: f64| {
        eventually(COUNTED, "resyncs", || {
            let metrics = stack.metrics();
            (resyncs(&metrics) >= at_least).then_some(metrics)
        })
    };
    let metrics = past(2.0);
    assert_eq!(listings(&metrics), Some(0.0), "{metrics}");

    let id = route_id(&stack, &host(0));
    let removed = std::process::Command::new(private_ingress_tests::sozu_bin())
        .arg("-c")
        .arg(stack.dir.path().join("sozu.toml"))
        .args(["frontend", "https", "remove", "--address"])
        .arg(stack.https.to_string())
        .args(["--hostname", &host(0), "--path-prefix", "/", "id", &id])
        .output()
        .expect("run sozu's command line");
    assert!(removed.status.success(), "{removed:?}");
    let body = |i: usize| https_get(stack.https, &host(i), "/").map(|s| s.body);
    eventually(COUNTED, "the frontend put back", || {
        (body(0).as_deref() == Ok("backend-0")).then_some(())
    });
    let metrics = eventually(COUNTED, "a resync listing the frontends", || {
        let metrics = stack.metrics();
        listings(&metrics)
            .is_some_and(|n| n >= 1.0)
            .then_some(metrics)
    });
    // Listed once for the foreign request; the resyncs after it list nothing again.
    let listed = listings(&metrics);
    let metrics = past(resyncs(&metrics) + 2.0);
    assert_eq!(listings(&metrics), listed, "{metrics}");
    assert_eq!(body(1).as_deref(), Ok("backend-1"));
}

/// A backend someone else added to a route's cluster (no event in sozu 2.3.3 tells of it) is
/// taken away by the next resync: the route's requests all go to its own backend again.
#[test]
fn a_resync_takes_away_a_backend_added_behind_the_agents_back() {
    let (stack, _, _backends, _) = running_with(2, &["--resync-interval", "2"]);
    let intruder = Backend::start("intruder");
    let id = route_id(&stack, &host(0));
    private_ingress_tests::live::sozu_add_backend(
        &stack.socket(),
        &id,
        &format!("{id}-intruder"),
        intruder.address,
        100,
    )
    .expect("add a backend behind the agent's back");
    // Weighted 100 to 1, the intruder would take nearly every request while it stays.
    let body = || https_get(stack.https, &host(0), "/").map(|s| s.body);
    eventually(Duration::from_secs(10), "the intruder taken away", || {
        (0..20)
            .all(|_| body().as_deref() == Ok("backend-0"))
            .then_some(())
    });
    // sozu's census told of the foreign request, and the resync asked the workers.
    let metrics = stack.metrics();
    assert!(
        sample(&metrics, "private_ingress_resync_worker_queries_total").is_some_and(|n| n >= 1.0),
        "{metrics}"
    );
    assert_eq!(
        https_get(stack.https, &host(1), "/")
            .map(|s| s.body)
            .as_deref(),
        Ok("backend-1")
    );
}

/// A certificate someone else replaced is put back by a resync: the agent's own is presented
/// again.
#[test]
fn a_resync_puts_back_a_certificate_replaced_behind_the_agents_back() {
    let (stack, _, _backends, fingerprints) = running_with(2, &["--resync-interval", "2"]);
    let ours = fingerprints[&host(0)].clone();
    let other = tempfile::tempdir().expect("a directory");
    let chain = private_ingress_tests::write_certificate(other.path(), &host(0));
    let key = std::fs::read_to_string(other.path().join(host(0)).join("tls.key")).expect("the key");
    private_ingress_tests::live::sozu_replace_certificate(
        &stack.socket(),
        stack.https,
        &ours,
        &chain,
        &key,
    )
    .expect("replace the certificate behind the agent's back");
    let presented = || https_get(stack.https, &host(0), "/").map(|s| s.fingerprint);
    eventually(
        Duration::from_secs(10),
        "the agent's certificate back",
        || (presented().as_deref() == Ok(ours.as_str())).then_some(()),
    );
    assert_eq!(
        https_get(stack.https, &host(1), "/").map(|s| s.fingerprint),
        Ok(fingerprints[&host(1)].clone())
    );
}

/// A start against a sozu that already holds more clusters than the agent reads one after the
/// other reads them over connections of their own, and what it read is what it compares with:
/// a backend removed while the agent was down is back once it is ready.
#[test]
fn a_backend_removed_while_the_agent_was_down_is_put_back_when_it_starts() {
    let args = ["--resync-interval", "0"];
    let (mut stack, _, backends, _) = running_with(80, &args);
    let id = route_id(&stack, &host(0));
    let status = stack.stop_agent_status();
    assert!(
        status.is_some_and(|s| s.success()),
        "the agent stopped on SIGTERM (exit: {status:?}; None: killed, see above)\n{}",
        stack.logs()
    );
    let https = stack.https;
    let body = |i: usize| https_get(https, &host(i), "/").map(|s| s.body);
    remove_backend(&stack, &id, &backends[0]);
    assert_ne!(
        body(0).as_deref(),
        Ok("backend-0"),
        "the backend was not removed"
    );

    stack.start_agent_args(&args);
    stack.wait_ready(READY);
    assert_eq!(body(0).as_deref(), Ok("backend-0"));
    assert_eq!(body(79).as_deref(), Ok("backend-79"));
}

/// The id `host`'s route has in `/v1/state` (its cluster's in sozu).
fn route_id(stack: &Stack, host: &str) -> String {
    let state = stack.state().expect("/v1/state");
    let route = route_of(&state, host).unwrap_or_else(|| panic!("{host}'s route in /v1/state"));
    route["id"].as_str().expect("route id").to_owned()
}

/// Removes `backend` from cluster `id` with sozu's own command line, as someone else with access
/// to its socket would.
fn remove_backend(stack: &Stack, id: &str, backend: &Backend) {
    let address = backend.address.to_string();
    let removed = std::process::Command::new(private_ingress_tests::sozu_bin())
        .arg("-c")
        .arg(stack.dir.path().join("sozu.toml"))
        .args(["backend", "remove", "--id", id, "--address", &address])
        .args(["--backend-id", &format!("{id}-{address}")])
        .output()
        .expect("run sozu's command line");
    assert!(removed.status.success(), "{removed:?}");
}

#[test]
fn a_restarted_sozu_gets_the_full_state_back_within_a_second() {
    let (mut stack, _specs, _backends, fingerprints) = running(10);

    stack.kill_sozu();
    stack.start_sozu();
    // start_sozu returns once the socket accepts connections.
    let socket_up = Instant::now();
    eventually(Duration::from_secs(1), "every route served again", || {
        fingerprints
            .iter()
            .all(|(h, f)| https_get(stack.https, h, "/").is_ok_and(|s| &s.fingerprint == f))
            .then_some(())
    });
    eprintln!(
        "state back {:?} after the socket reappeared",
        socket_up.elapsed()
    );
    assert_serves(&stack, &fingerprints);
}

#[test]
fn a_restarted_agent_adopts_the_running_state_without_a_request_failing() {
    let (mut stack, _specs, _backends, fingerprints) = running(5);
    assert!(
        stack.stop_agent(),
        "the agent did not stop cleanly on SIGTERM"
    );

    let https = stack.https;
    let (host0, fp0) = fingerprints
        .iter()
        .next()
        .map(|(h, f)| (h.clone(), f.clone()))
        .unwrap();
    let load = std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(3);
        let mut failures = Vec::new();
        let mut count = 0;
        while Instant::now() < deadline {
            match https_get(https, &host0, "/") {
                Ok(seen) if seen.status == 200 && seen.fingerprint == fp0 => {}
                other => failures.push(format!("{other:?}")),
            }
            count += 1;
        }
        (count, failures)
    });
    stack.start_agent();
    stack.wait_ready(READY);
    let (count, failures) = load.join().unwrap();
    assert!(count > 10, "only {count} requests");
    assert!(
        failures.is_empty(),
        "{} of {count} failed: {:?}",
        failures.len(),
        &failures[..failures.len().min(3)]
    );

    // Nothing was re-sent: sozu already held the whole state, and no duplicate was made.
    let state = stack.state().unwrap();
    assert_eq!(state["counters"]["sozu_requests"], 0, "{state}");
    for route in state["routes"].as_array().unwrap() {
        assert_eq!(
            route["certificate"]["served_fingerprints"]
                .as_array()
                .unwrap()
                .len(),
            1,
            "{route}"
        );
    }
    assert_serves(&stack, &fingerprints);
}

#[test]
fn a_killed_sozu_worker_is_replaced_and_routes_keep_serving() {
    let (stack, _specs, _backends, fingerprints) = running(3);

    let pid_text = std::fs::read_to_string(stack.dir.path().join("run/sozu.pid")).unwrap();
    let main_pid = pid_text.trim();
    let children = std::process::Command::new("pgrep")
        .args(["-P", main_pid])
        .output()
        .unwrap();
    let worker = String::from_utf8_lossy(&children.stdout)
        .lines()
        .next()
        .expect("sozu has a worker")
        .to_owned();
    std::process::Command::new("kill")
        .args(["-KILL", &worker])
        .status()
        .unwrap();

    eventually(
        Duration::from_secs(5),
        "every route served by the new worker",
        || {
            fingerprints
                .iter()
                .all(|(h, f)| https_get(stack.https, h, "/").is_ok_and(|s| &s.fingerprint == f))
                .then_some(())
        },
    );
    // The agent sees a new worker generation and reads sozu again, which already holds it all.
    stack.wait_ready(READY);
}

/// Private key bytes never reach a log line, /v1/state, /metrics or `status`, even with debug
/// logs in JSON and a failing certificate in the mix.
#[test]
fn private_keys_appear_nowhere_the_agent_writes() {
    let mut stack = Stack::new();
    let (mut specs, _backends, _) = routes(&stack, 3);
    // A host whose key does not match its certificate: sozu refuses it, the agent reports it.
    let bad = "bad.in.example.org";
    certificate(&stack.tls_dir(), bad);
    let other = rcgen::generate_simple_self_signed(vec![bad.to_owned()]).unwrap();
    std::fs::write(
        stack.tls_dir().join(bad).join("tls.key"),
        other.signing_key.serialize_pem(),
    )
    .unwrap();
    specs.push(RouteSpec {
        host: bad.into(),
        upstream: "127.0.0.1".into(),
        port: Some(9),
    });
    stack.write_workspace(&stack.workspace_text(&specs));
    stack.start_sozu();
    stack.start_agent_with(&["--log-format", "json"], &[("RUST_LOG", "debug")]);
    // The refused certificate holds back its own host only.
    eventually(READY, "the good routes served", || {
        (0..3)
            .all(|i| https_get(stack.https, &host(i), "/").is_ok_and(|s| s.status == 200))
            .then_some(())
    });
    let bad_error = eventually(READY, "the refusal reported on the bad route", || {
        stack.state().and_then(|s| {
            route_of(&s, bad).and_then(|r| r["last_error"].as_str().map(str::to_owned))
        })
    });
    assert!(bad_error.contains("certificate"), "{bad_error}");
    // And it does not hold the others hostage: the agent is ready, and says one is left out.
    assert_eq!(
        stack.readyz(),
        Some((200, "ready (1 route not served)\n".to_owned()))
    );

    let mut written = String::new();
    written.push_str(&serde_json::to_string(&stack.state().unwrap()).unwrap());
    for path in ["/metrics", "/readyz", "/healthz"] {
        if let Ok(mut r) = ureq::get(&format!("http://{}{path}", stack.admin))
            .config()
            .http_status_as_error(false)
            .build()
            .call()
        {
            written.push_str(&r.body_mut().read_to_string().unwrap_or_default());
        }
    }
    let status = std::process::Command::new(private_ingress_tests::agent_bin())
        .args(["status", "--admin-address", &stack.admin.to_string()])
        .output()
        .unwrap();
    written.push_str(&String::from_utf8_lossy(&status.stdout));
    written.push_str(&stack.agent_logs());
    assert!(
        written.len() > 1000,
        "too little output to mean anything: {written}"
    );

    let mut keys = 0;
    for entry in std::fs::read_dir(stack.tls_dir()).unwrap() {
        let key = std::fs::read_to_string(entry.unwrap().path().join("tls.key")).unwrap();
        for line in key
            .lines()
            .filter(|l| !l.starts_with("-----") && l.len() >= 16)
        {
            assert!(
                !written.contains(line),
                "key material found in the agent's output"
            );
            keys += 1;
        }
    }
    assert!(keys >= 4);
    assert!(
        !written.contains("PRIVATE KEY"),
        "a PEM key header in the agent's output"
    );
}

/// Regression: the agent's own reads of the workspace used to fire the directory watch, and each
/// reload read it again. Idle, nothing but the timers may wake the loop.
#[test]
fn an_idle_agent_stays_idle() {
    let (stack, _specs, _backends, _) = running(2);
    let passes = |stack: &Stack| {
        stack.state().unwrap()["counters"]["reconciles"]
            .as_u64()
            .unwrap()
    };
    let before = passes(&stack);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(passes(&stack), before, "the loop ran while nothing changed");
}
