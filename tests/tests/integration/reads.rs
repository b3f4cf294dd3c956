use std::time::Duration;

use private_ingress_tests::live::{
    atomic_write, eventually, fingerprint_of_pem, https_get, Backend, RouteSpec, Stack,
};

/// Routes, each with a certificate naming its host and [`EXTRA_NAMES`] names under it: about
/// 3.5 KB a certificate with its key, so that sozu's certificates (2.5 MB) are larger than its
/// default command buffer (2,000,000 bytes), as 250 routes with RSA chains of 8 KB would be.
const ROUTES: usize = 700;
const EXTRA_NAMES: usize = 80;

fn host(i: usize) -> String {
    format!("r{i}.in.example.org")
}

/// A pair for `host` (the leaf's PEM, the key's PEM), naming [`EXTRA_NAMES`] more hosts under
/// it, signed with `key`.
fn pair(host: &str, key: &rcgen::KeyPair) -> (String, String) {
    let mut names = vec![host.to_owned()];
    names.extend((0..EXTRA_NAMES).map(|j| format!("alias-{j:03}.{host}")));
    let cert = rcgen::CertificateParams::new(names)
        .unwrap()
        .self_signed(key)
        .unwrap();
    (cert.pem(), key.serialize_pem())
}

fn resyncs(stack: &Stack) -> u64 {
    stack.state().unwrap()["counters"]["resyncs"]
        .as_u64()
        .unwrap()
}

/// sozu with its default command buffer holds more certificates than one of its answers can
/// carry. The agent's resyncs read its state all the same (it converges, again and again, with
/// no error shown), and a rotation is served: before, the first resync's listing made sozu close
/// the connection, and the agent retried "sozu unreachable" for good, serving no rotation.
#[test]
fn a_sozu_with_its_default_command_buffer_keeps_taking_resyncs_and_rotations() {
    let mut stack = Stack::new();
    stack.use_default_command_buffer();
    let backend = Backend::start("app");
    let key = rcgen::KeyPair::generate().unwrap();
    let routes: Vec<RouteSpec> = (0..ROUTES)
        .map(|i| {
            let (crt, key) = pair(&host(i), &key);
            atomic_write(&stack.tls_dir().join(host(i)), &crt, &key, 0);
            RouteSpec {
                host: host(i),
                upstream: backend.address.ip().to_string(),
                port: Some(backend.address.port()),
            }
        })
        .collect();
    stack.write_workspace(&stack.workspace_text(&routes));
    stack.start_sozu();
    stack.start_agent_args(&["--resync-interval", "1"]);
    stack.wait_ready(Duration::from_secs(180));
    // A resync lists the certificates only when sozu's census says someone else changed them;
    // an agent started again in front of sozu's whole state lists them all.
    assert!(stack.stop_agent(), "the agent stopped on SIGTERM");
    stack.start_agent_args(&["--resync-interval", "1"]);
    stack.wait_ready(Duration::from_secs(180));

    // Resyncs, one a second, each ending converged: sozu's state was read whole.
    eventually(
        Duration::from_secs(120),
        "resyncs that converge after the start",
        || {
            let state = stack.state()?;
            let sozu = &state["sozu"];
            // A resync is counted once its read came back whole; a failed one is shown.
            (sozu["connected"] == true
                && sozu["last_error"].is_null()
                && sozu["last_read_error"].is_null()
                && state["counters"]["sozu_read_failures"].as_u64()? == 0
                && state["counters"]["resyncs"].as_u64()? >= 3)
                .then_some(())
        },
    );
    let sozu_log = std::fs::read_to_string(stack.dir.path().join("sozu.log")).unwrap();
    assert!(
        sozu_log.contains("too large for back buffer capacity"),
        "sozu's certificates were expected not to fit one answer: the test no longer tests \
         what it is for"
    );

    // A rotation, after those resyncs: served.
    let rotated = host(ROUTES / 2);
    let new_key = rcgen::KeyPair::generate().unwrap();
    let (crt, new_key_pem) = pair(&rotated, &new_key);
    atomic_write(&stack.tls_dir().join(&rotated), &crt, &new_key_pem, 1);
    let wanted = fingerprint_of_pem(&crt);
    eventually(
        Duration::from_secs(60),
        "the rotated certificate served",
        || {
            let seen = https_get(stack.https, &rotated, "/").ok()?;
            (seen.fingerprint == wanted).then_some(())
        },
    );
    // And the resyncs go on, still converging, with the rotation in sozu's state.
    let resyncs_at_rotation = resyncs(&stack);
    eventually(
        Duration::from_secs(120),
        "resyncs that converge after the rotation",
        || {
            let state = stack.state()?;
            let sozu = &state["sozu"];
            (sozu["last_error"].is_null()
                && sozu["last_read_error"].is_null()
                && state["counters"]["sozu_read_failures"].as_u64()? == 0
                && state["counters"]["resyncs"].as_u64()? >= resyncs_at_rotation + 2)
                .then_some(())
        },
    );
    assert_eq!(
        https_get(stack.https, &rotated, "/").unwrap().fingerprint,
        wanted
    );
    // The start's bulk change was loaded from state files: its request fits sozu's buffer.
    let log = stack.agent_logs();
    assert!(
        !log.contains("did not load the bulk change"),
        "the bulk change failed:\n{log}"
    );
}
