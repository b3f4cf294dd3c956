use std::time::{Duration, Instant};

use private_ingress_tests::live::{
    atomic_write, certificate, eventually, fingerprint_of_pem, https_get, Backend, KeepAlive,
    RouteSpec, Stack,
};

const HOST: &str = "app.in.example.org";

struct Rotating {
    stack: Stack,
    _backend: Backend,
    first: String,
}

/// sozu and the agent serving one route; its certificate directory is written the AtomicWriter
/// way when `atomic_writer`, as plain files otherwise.
fn serving(atomic_writer: bool) -> Rotating {
    let mut stack = Stack::new();
    let backend = Backend::start("app");
    let first = if atomic_writer {
        renew(&stack, 0)
    } else {
        certificate(&stack.tls_dir(), HOST)
    };
    stack.serve_one(HOST, &backend);
    assert_eq!(
        https_get(stack.https, HOST, "/").unwrap().fingerprint,
        first
    );
    Rotating {
        stack,
        _backend: backend,
        first,
    }
}

/// Renews the host's pair the AtomicWriter way (generation `generation`); returns the new leaf's
/// fingerprint.
fn renew(stack: &Stack, generation: u32) -> String {
    let pair = rcgen::generate_simple_self_signed(vec![HOST.to_owned()]).unwrap();
    atomic_write(
        &stack.tls_dir().join(HOST),
        &pair.cert.pem(),
        &pair.signing_key.serialize_pem(),
        generation,
    );
    fingerprint_of_pem(&pair.cert.pem())
}

/// Sends requests with `request` until `stop`, counting successes and keeping the failures.
fn load_until(
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    mut request: impl FnMut() -> Result<(), String> + Send + 'static,
) -> std::thread::JoinHandle<(u64, Vec<String>)> {
    std::thread::spawn(move || {
        let (mut ok, mut failed) = (0u64, Vec::new());
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            match request() {
                Ok(()) => ok += 1,
                Err(e) => failed.push(e),
            }
        }
        (ok, failed)
    })
}

/// Probes handshakes until the new certificate is served; every handshake saw the old or the new
/// one, and none saw the old one after the first saw the new one.
fn switches_to(stack: &Stack, old: &str, new: &str) -> Duration {
    let start = Instant::now();
    let mut switched = false;
    loop {
        let seen = https_get(stack.https, HOST, "/")
            .unwrap_or_else(|e| panic!("request failed during rotation: {e}"));
        assert!(
            seen.fingerprint == old || seen.fingerprint == new,
            "served a third certificate"
        );
        if seen.fingerprint == new {
            switched = true;
        } else {
            assert!(!switched, "the old certificate came back after the switch");
        }
        if switched && start.elapsed() > Duration::from_millis(300) {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "never switched to the new certificate; the agent's state: {:?}",
            stack.state()
        );
    }
}

#[test]
fn an_atomic_writer_swap_switches_the_served_certificate() {
    let r = serving(true);
    let mut old = r.first.clone();
    for generation in 1..=3 {
        let new = renew(&r.stack, generation);
        switches_to(&r.stack, &old, &new);
        old = new;
    }
    let state = r.stack.state().unwrap();
    let served = state["routes"][0]["certificate"]["served_fingerprints"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(
        served,
        [serde_json::Value::from(old)],
        "exactly one certificate for the host"
    );
}

#[test]
fn files_renamed_into_place_one_after_the_other_switch_once_both_are_there() {
    for cert_first in [true, false] {
        let r = serving(false);
        let dir = r.stack.tls_dir().join(HOST);
        let pair = rcgen::generate_simple_self_signed(vec![HOST.to_owned()]).unwrap();
        let new = fingerprint_of_pem(&pair.cert.pem());
        std::fs::write(dir.join(".tls.crt.tmp"), pair.cert.pem()).unwrap();
        std::fs::write(dir.join(".tls.key.tmp"), pair.signing_key.serialize_pem()).unwrap();
        let (first, second) = if cert_first {
            ("tls.crt", "tls.key")
        } else {
            ("tls.key", "tls.crt")
        };
        std::fs::rename(dir.join(format!(".{first}.tmp")), dir.join(first)).unwrap();
        // Half a pair on disk for 300 ms: the old certificate keeps serving.
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(
            https_get(r.stack.https, HOST, "/").unwrap().fingerprint,
            r.first
        );
        std::fs::rename(dir.join(format!(".{second}.tmp")), dir.join(second)).unwrap();
        switches_to(&r.stack, &r.first, &new);
    }
}

#[test]
fn files_rewritten_in_place_switch_the_served_certificate() {
    let r = serving(false);
    let dir = r.stack.tls_dir().join(HOST);
    let pair = rcgen::generate_simple_self_signed(vec![HOST.to_owned()]).unwrap();
    let new = fingerprint_of_pem(&pair.cert.pem());
    std::fs::write(dir.join("tls.crt"), pair.cert.pem()).unwrap();
    std::fs::write(dir.join("tls.key"), pair.signing_key.serialize_pem()).unwrap();
    switches_to(&r.stack, &r.first, &new);
}

#[test]
fn a_host_directory_deleted_and_recreated_is_picked_up() {
    let r = serving(false);
    let dir = r.stack.tls_dir().join(HOST);
    std::fs::remove_dir_all(&dir).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    // Missing files: the last good certificate keeps serving.
    assert_eq!(
        https_get(r.stack.https, HOST, "/").unwrap().fingerprint,
        r.first
    );
    let new = certificate(&r.stack.tls_dir(), HOST);
    switches_to(&r.stack, &r.first, &new);
    eventually(Duration::from_secs(5), "the route back to ok", || {
        r.stack.state().filter(|s| s["routes"][0]["state"] == "ok")
    });
}

/// 50 rotations under HTTPS load, a new connection per request and one kept-alive connection:
/// no request fails, and after each switch the previous certificate is never served again.
#[test]
fn fifty_rotations_under_load_fail_no_request() {
    let r = serving(true);
    let https = r.stack.https;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = load_until(stop.clone(), move || match https_get(https, HOST, "/") {
        Ok(seen) if seen.status == 200 && seen.body == "app" => Ok(()),
        other => Err(format!("{other:?}")),
    });
    // And one connection kept alive through every rotation.
    let mut conn = KeepAlive::connect(https, HOST).expect("keep-alive connection");
    let keep_alive = load_until(stop.clone(), move || match conn.get("/") {
        Ok((200, body)) if body == "app" => Ok(()),
        other => Err(format!("{other:?}")),
    });
    let mut old = r.first.clone();
    for generation in 1..=50 {
        let new = renew(&r.stack, generation);
        eventually(
            Duration::from_secs(10),
            "the new certificate served",
            || {
                https_get(r.stack.https, HOST, "/")
                    .ok()
                    .filter(|s| s.fingerprint == new)
            },
        );
        // After the switch, the previous certificate never comes back.
        for _ in 0..5 {
            let seen = https_get(r.stack.https, HOST, "/").unwrap();
            assert_ne!(
                seen.fingerprint, old,
                "rotation {generation}: the old certificate came back"
            );
        }
        old = new;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (kept_ok, kept_failed) = keep_alive.join().unwrap();
    assert!(kept_ok > 50, "only {kept_ok} keep-alive requests");
    assert!(
        kept_failed.is_empty(),
        "{} keep-alive requests failed: {:?}",
        kept_failed.len(),
        &kept_failed[..kept_failed.len().min(3)]
    );
    let (ok, failed) = load.join().unwrap();
    assert!(ok > 50, "only {ok} requests under load");
    assert!(
        failed.is_empty(),
        "{} of {} requests failed during rotations: {:?}",
        failed.len(),
        ok + failed.len() as u64,
        &failed[..failed.len().min(3)]
    );
    let state = r.stack.state().unwrap();
    assert_eq!(
        state["routes"][0]["certificate"]["rotations"], 50,
        "{state}"
    );
    assert_eq!(
        state["routes"][0]["certificate"]["served_fingerprints"],
        serde_json::json!([old])
    );
}

/// A pair swapped while the agent starts is served without waiting for a resync (there is none
/// here): the agent restarted beside a running sozu, again and again, with a swap of a random
/// host's pair as soon as it has logged its workspace loaded, between its first read of the
/// pairs and the watches that guard them.
#[test]
fn a_pair_swapped_while_the_agent_starts_is_served_without_a_resync() {
    const HOSTS: usize = 300;
    const RESTARTS: u32 = 10;
    let mut stack = Stack::new();
    let backend = Backend::start("app");
    let hosts: Vec<String> = (0..HOSTS).map(|i| format!("h{i}.in.example.org")).collect();
    for host in &hosts {
        certificate(&stack.tls_dir(), host);
    }
    let routes: Vec<RouteSpec> = hosts
        .iter()
        .map(|host| RouteSpec {
            host: host.clone(),
            upstream: backend.address.ip().to_string(),
            port: Some(backend.address.port()),
        })
        .collect();
    stack.write_workspace(&stack.workspace_text(&routes));
    stack.start_sozu();
    let args = ["--resync-interval", "0"];
    stack.start_agent_with(&args, &[("RUST_LOG", "info")]);
    stack.wait_ready(Duration::from_secs(30));
    // A fixed sequence of hosts (a seeded generator, so a failure repeats).
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut latencies = Vec::new();
    for restart in 1..=RESTARTS {
        let status = stack.stop_agent_status();
        assert!(
            status.is_some_and(|s| s.success()),
            "restart {restart}: the agent stopped on SIGTERM (exit: {status:?}; None: killed, \
             see above)\n{}",
            stack.logs()
        );
        stack.start_agent_with(&args, &[("RUST_LOG", "info")]);
        stack.wait_agent_log("workspace loaded", Duration::from_secs(20));
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let host = &hosts[(rng % HOSTS as u64) as usize];
        let swapped = Instant::now();
        let pair = rcgen::generate_simple_self_signed(vec![host.clone()]).unwrap();
        atomic_write(
            &stack.tls_dir().join(host),
            &pair.cert.pem(),
            &pair.signing_key.serialize_pem(),
            restart,
        );
        let new = fingerprint_of_pem(&pair.cert.pem());
        eventually(
            Duration::from_secs(3),
            &format!("restart {restart}: {host}'s new certificate served"),
            || {
                https_get(stack.https, host, "/")
                    .ok()
                    .filter(|s| s.fingerprint == new)
            },
        );
        latencies.push(swapped.elapsed());
    }
    latencies.sort();
    eprintln!(
        "swapped while the agent starts ({HOSTS} hosts): served after {:.0} ms (median), {:.0} ms \
         (max) of {RESTARTS}",
        latencies[latencies.len() / 2].as_secs_f64() * 1e3,
        latencies[latencies.len() - 1].as_secs_f64() * 1e3
    );
}
