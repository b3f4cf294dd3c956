//! The agent as a process a kubelet supervises: a task that dies takes the agent down with a
//! non-zero exit naming it, a wedged loop fails `/healthz`, and SIGTERM ends it within its grace
//! whatever sozu is doing. Faults are injected into the running binary (a build with the
//! `test-hooks` feature: `PRIVATE_INGRESS_TEST_FAULT=<task>:panic|wedge`, at SIGUSR1).

use std::time::{Duration, Instant};

use private_ingress_tests::live::{Backend, Stack};
use private_ingress_tests::write_certificate;

const HOST: &str = "app.in.example.org";

/// sozu and the agent serving one route; the agent started with `env` and `args`.
fn serving(args: &[&str], env: &[(&str, &str)]) -> (Stack, Backend) {
    let mut stack = Stack::new();
    let backend = Backend::start("app");
    write_certificate(&stack.tls_dir(), HOST);
    stack.write_workspace(&stack.workspace_text_of(
        &[format!(
            "{{ host = \"{HOST}\", upstream = \"{}\", port = {} }}",
            backend.address.ip(),
            backend.address.port()
        )],
        "",
    ));
    stack.start_sozu();
    let mut env = env.to_vec();
    env.push(("RUST_LOG", "info"));
    stack.start_agent_with(args, &env);
    stack.wait_ready(Duration::from_secs(60));
    (stack, backend)
}

/// A panic in the loop, or in a source, ends the agent with a non-zero exit and a log line
/// that names the task: the kubelet restarts it instead of keeping a pod that answers its
/// probes and does nothing.
#[test]
fn a_panicking_task_makes_the_agent_exit_non_zero_naming_it() {
    for task in [
        "reconcile",
        "dns",
        "workspace",
        "tls-dir",
        "client-auth",
        "traffic",
        "handshakes",
    ] {
        let fault = format!("{task}:panic");
        let (mut stack, _backend) = serving(&[], &[("PRIVATE_INGRESS_TEST_FAULT", &fault)]);
        let injected = Instant::now();
        stack.signal_agent("USR1");
        let status = stack
            .wait_agent_exit(Duration::from_secs(60))
            .unwrap_or_else(|| panic!("{task}: the agent kept running\n{}", stack.logs()));
        println!("{task}: exited {:?} after the panic", injected.elapsed());
        assert_eq!(status.code(), Some(2), "{task}\n{}", stack.logs());
        let logs = stack.agent_logs();
        assert!(
            logs.contains(&format!("the {task} task panicked")),
            "{task}: {logs}"
        );
        assert!(logs.contains("fault injected"), "{task}: {logs}");
    }
}

/// A loop stuck mid-pass still holds everything, so nothing else notices: `/healthz` does, once
/// the loop has not turned for its bound (shortened here), and recovers nothing by itself.
#[test]
fn a_wedged_loop_fails_healthz() {
    let (stack, _backend) = serving(
        &[],
        &[
            ("PRIVATE_INGRESS_TEST_FAULT", "reconcile:wedge"),
            ("PRIVATE_INGRESS_TEST_HEALTHZ_STALE_SECS", "15"),
        ],
    );
    let healthz = || {
        ureq::get(&format!("http://{}/healthz", stack.admin))
            .config()
            .http_status_as_error(false)
            .build()
            .call()
            .map(|mut r| {
                (
                    r.status().as_u16(),
                    r.body_mut().read_to_string().unwrap_or_default(),
                )
            })
            .unwrap_or_else(|e| panic!("GET /healthz: {e}"))
    };
    // Alive past the bound while idle: the loop ticks (every 10 s).
    std::thread::sleep(Duration::from_secs(20));
    assert_eq!(healthz().0, 200, "{}", stack.logs());
    stack.signal_agent("USR1");
    let (code, body) = private_ingress_tests::live::eventually(
        Duration::from_secs(60),
        "/healthz to fail",
        || Some(healthz()).filter(|(code, _)| *code == 503),
    );
    assert_eq!(code, 503);
    assert!(body.contains("has not turned for"), "{body}");
    // The rest of the agent still answers: the probe is what tells.
    assert!(stack.state().is_some());
}

/// SIGTERM ends the agent well inside a kubelet's grace, while its pass waits on a sozu that
/// answers nothing (frozen, each request allowed 30 s), and once sozu is gone.
#[test]
fn sigterm_ends_the_agent_within_its_grace_whatever_sozu_does() {
    let (mut stack, backend) = serving(&["--sozu-timeout-ms", "30000"], &[]);
    let sozu = stack.sozu_pid().expect("sozu runs");
    let signal = |sig: &str, pid: u32| {
        std::process::Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .expect("kill");
    };
    signal("-STOP", sozu);
    // An edit: its pass asks the frozen sozu who it is, and waits.
    write_certificate(&stack.tls_dir(), "two.in.example.org");
    stack.write_workspace(&stack.workspace_text_of(
        &[
            format!(
                "{{ host = \"{HOST}\", upstream = \"{}\", port = {} }}",
                backend.address.ip(),
                backend.address.port()
            ),
            format!(
                "{{ host = \"two.in.example.org\", upstream = \"{}\", port = {} }}",
                backend.address.ip(),
                backend.address.port()
            ),
        ],
        "",
    ));
    stack.wait_agent_log("workspace loaded", Duration::from_secs(60));
    std::thread::sleep(Duration::from_millis(500));
    let asked = Instant::now();
    stack.signal_agent("TERM");
    let status = stack.wait_agent_exit(Duration::from_secs(30));
    let took = asked.elapsed();
    signal("-CONT", sozu);
    println!("frozen sozu: the agent exited {took:?} after SIGTERM: {status:?}");
    let status = status.unwrap_or_else(|| panic!("still running after 30 s\n{}", stack.logs()));
    assert!(status.success(), "{status:?}\n{}", stack.logs());
    // SHUTDOWN_GRACE (3 s) and the runtime's 1 s, with room for a busy machine; a kubelet's
    // grace is 30 s by default, 15 s in the rendered pod.
    assert!(took < Duration::from_secs(10), "{took:?}\n{}", stack.logs());

    // sozu gone: the next run stops as fast.
    stack.start_agent();
    stack.wait_ready(Duration::from_secs(60));
    stack.kill_sozu();
    let asked = Instant::now();
    stack.signal_agent("TERM");
    let status = stack
        .wait_agent_exit(Duration::from_secs(30))
        .unwrap_or_else(|| panic!("still running after 30 s\n{}", stack.logs()));
    println!(
        "sozu gone: the agent exited {:?} after SIGTERM",
        asked.elapsed()
    );
    assert!(status.success(), "{status:?}\n{}", stack.logs());
    assert!(asked.elapsed() < Duration::from_secs(10));
}
