//! Cold start: from starting the agent (beside an empty, running sozu) to `/readyz` answering 200,
//! for 10, 1,000 and 10,000 routes each with its own certificate; beside it, in the same run,
//! sozu loading the same state from a rendered configuration file, from `sozu start` until the
//! last route's certificate is served. Then the agent's RSS and its idle wake-ups over 10 s.
//! Prints figures and ratios; asserts nothing.
//!
//!     cargo bench -p private-ingress-tests --bench cold_start [-- 10 1000]
//!
//! `COLD_START_LOGS=1` prints the agent's log after each start (with `AGENT_LOG=private_ingress=debug`,
//! the time each step of the first pass took).

use std::process::Command;
use std::time::{Duration, Instant};

use private_ingress_tests::agent_bin;
use private_ingress_tests::live::{
    certificate, fingerprint_of_pem, https_get, Backend, RouteSpec, Stack,
};

fn main() {
    let sizes: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let sizes = if sizes.is_empty() {
        vec![10, 1_000, 10_000]
    } else {
        sizes
    };
    // Build (or find) the agent before any clock starts.
    let _ = agent_bin();
    println!(
        "{:>7}  {:>12}  {:>14}  {:>7}  {:>9}  {:>16}  {:>22}  {:>14}",
        "routes",
        "agent→ready",
        "sozu from file",
        "ratio",
        "agent RSS",
        "idle wakeups/10s",
        "CPU: agent + its sozu",
        "CPU: sozu alone"
    );
    for n in sizes {
        let backend = Backend::start("bench");
        let mut stack = Stack::new();
        let specs: Vec<RouteSpec> = (0..n)
            .map(|i| {
                let host = format!("svc{i}.in.example.org");
                certificate(&stack.tls_dir(), &host);
                RouteSpec {
                    host,
                    upstream: backend.address.ip().to_string(),
                    port: Some(backend.address.port()),
                }
            })
            .collect();
        let last = specs.last().map(|r| r.host.clone()).unwrap_or_default();
        let last_fp = fingerprint_of(&stack, &last);
        stack.write_workspace(&stack.workspace_text(&specs));
        let timeout = Duration::from_secs(60 + n as u64 / 20);

        // The agent: sozu runs empty, the agent starts, until /readyz.
        stack.start_sozu();
        let sozu_pid = stack.sozu_pid().unwrap_or(0);
        let sozu_cpu_before = tree_cpu_ms(sozu_pid);
        let start = Instant::now();
        stack.start_agent();
        poll(timeout, "the agent's /readyz", || {
            stack.ready().then_some(())
        });
        let agent = start.elapsed();
        if std::env::var_os("COLD_START_LOGS").is_some() {
            eprintln!("{}", stack.agent_logs());
        }
        let pid = stack.agent_pid().unwrap_or(0);
        let agent_cpu = cpu_ms(pid, true);
        let sozu_cpu = tree_cpu_ms(sozu_pid) - sozu_cpu_before;
        let rss = rss_mib(pid);
        let switches = || context_switches(pid);
        let before = switches();
        std::thread::sleep(Duration::from_secs(10));
        let wakeups = wakeups(&before, &switches());
        stack.stop_agent();
        stack.kill_sozu();

        // sozu alone, loading the same routes from a rendered configuration file.
        let config = stack.dir.path().join("rendered.toml");
        let status = Command::new(agent_bin())
            .arg("render")
            .arg(stack.workspace_path())
            .args(["--format", "sozu-toml", "--output"])
            .arg(&config)
            .arg("--sozu-socket")
            .arg(stack.socket())
            .status()
            .expect("render");
        assert!(status.success());
        let start = Instant::now();
        stack.start_sozu_with_config(&config);
        poll(timeout, "sozu serving the last route", || {
            https_get(stack.https, &last, "/")
                .ok()
                .filter(|s| s.fingerprint == last_fp)
        });
        let sozu = start.elapsed();
        let sozu_alone_cpu = tree_cpu_ms(stack.sozu_pid().unwrap_or(0));
        stack.kill_sozu();

        println!(
            "{:>7}  {:>9.0} ms  {:>11.0} ms  {:>6.2}x  {:>5.1} MiB  {:>16}  {:>10} + {:>5} ms  {:>11} ms",
            n,
            agent.as_secs_f64() * 1e3,
            sozu.as_secs_f64() * 1e3,
            agent.as_secs_f64() / sozu.as_secs_f64(),
            rss,
            wakeups,
            agent_cpu,
            sozu_cpu,
            sozu_alone_cpu,
        );
    }
    println!("ratio = agent start→ready / sozu start→last route served from its own config file");
    println!(
        "CPU = user + system time to that point (10 ms ticks): the agent with its evaluation \
         child, and sozu's main process with its workers"
    );
}

/// Like `eventually`, at a 2 ms period instead of 20: both sides of the ratio are found
/// finished within 2 ms of the fact, not 20.
fn poll<T>(timeout: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn fingerprint_of(stack: &Stack, host: &str) -> String {
    let pem =
        std::fs::read_to_string(stack.tls_dir().join(host).join("tls.crt")).expect("certificate");
    fingerprint_of_pem(&pem)
}

/// User + system CPU time of `pid` in milliseconds, with its reaped children's when asked.
fn cpu_ms(pid: u32, with_children: bool) -> u64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0;
    };
    // Fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<u64> = stat
        .rsplit_once(')')
        .map(|(_, rest)| {
            rest.split_whitespace()
                .map(|f| f.parse().unwrap_or(0))
                .collect()
        })
        .unwrap_or_default();
    // utime, stime, cutime, cstime are fields 14-17; `fields[0]` is field 3.
    let field = |n: usize| fields.get(n - 3).copied().unwrap_or(0);
    let ticks = field(14)
        + field(15)
        + if with_children {
            field(16) + field(17)
        } else {
            0
        };
    // The kernel's USER_HZ is 100 on every Linux this runs on.
    ticks * 10
}

/// CPU time of `pid` and its live children (sozu's workers), in milliseconds.
fn tree_cpu_ms(pid: u32) -> u64 {
    let children =
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    cpu_ms(pid, false)
        + children
            .split_whitespace()
            .filter_map(|c| c.parse().ok())
            .map(|c| cpu_ms(c, false))
            .sum::<u64>()
}

fn rss_mib(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map(|kb| kb / 1024.0)
        .unwrap_or(f64::NAN)
}

/// Context switches (voluntary and involuntary) per thread of `pid`, by thread id: each wake-up
/// is one. Compare two samples thread by thread, since threads come and go.
fn context_switches(pid: u32) -> std::collections::BTreeMap<String, u64> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Default::default();
    };
    tasks
        .filter_map(Result::ok)
        .filter_map(|t| {
            let status = std::fs::read_to_string(t.path().join("status")).ok()?;
            let switches = status
                .lines()
                .filter(|l| l.contains("ctxt_switches"))
                .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                .sum();
            Some((t.file_name().to_string_lossy().into_owned(), switches))
        })
        .collect()
}

/// Wake-ups between two samples: growth of the threads present in both, plus every switch of
/// threads that appeared in between.
fn wakeups(
    before: &std::collections::BTreeMap<String, u64>,
    after: &std::collections::BTreeMap<String, u64>,
) -> u64 {
    after
        .iter()
        .map(|(tid, n)| n.saturating_sub(before.get(tid).copied().unwrap_or(0)))
        .sum()
}
