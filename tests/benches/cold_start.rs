//! Cold start: from starting the agent (beside an empty, running sozu) to `/readyz` answering 200,
//! for 10, 1,000 and 10,000 routes each with its own certificate; beside it, in the same run,
//! sozu loading the same state from a rendered configuration file, from `sozu start` until the
//! last route's certificate is served. The two take turns for a few rounds (this machine's
//! timings swing from run to run) and the medians are compared. After the first round's start,
//! the agent's idle wake-ups over 10 s, and its RSS after them (at rest) and at its peak. Prints
//! figures and ratios; asserts nothing.
//!
//!     cargo bench -p private-ingress-tests --bench cold_start [-- 10 1000] [--rounds N]
//!
//! With `PRIVATE_INGRESS_BASELINE_BIN` set to another build of the agent (say, the previous
//! release), each round also starts that one the same way, and the table gains its median and
//! the ratio of this build's to it.
//!
//! `COLD_START_LOGS=1` prints the agent's log after the first round's start (with
//! `AGENT_LOG=private_ingress=debug`, the time each step of the first pass took).

use std::process::Command;
use std::time::{Duration, Instant};

use private_ingress_tests::agent_bin;
use private_ingress_tests::live::{
    certificate, eventually_every, fingerprint_of_pem, https_get, Backend, RouteSpec, Stack,
};

/// Rounds per size when `--rounds` is not given: enough for a median at 10 and 1,000 routes; one
/// at 10,000, where a round takes tens of seconds.
fn default_rounds(routes: usize) -> usize {
    if routes > 1_000 {
        1
    } else {
        5
    }
}

/// The time sozu is given, once its socket answers, to finish starting its workers before the
/// agent's clock starts: the agent is measured beside a running sozu, not one still starting.
const SOZU_SETTLE: Duration = Duration::from_millis(500);

struct Round {
    agent: Duration,
    baseline: Option<Duration>,
    sozu: Duration,
    agent_cpu: u64,
    its_sozu_cpu: u64,
    sozu_alone_cpu: u64,
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rounds: Option<usize> = args
        .iter()
        .position(|a| a == "--rounds")
        .and_then(|i| args.get(i + 1))
        .and_then(|r| r.parse().ok());
    let sizes: Vec<usize> = args
        .iter()
        .enumerate()
        .filter(|(i, _)| *i == 0 || args[i - 1] != "--rounds")
        .filter_map(|(_, a)| a.parse().ok())
        .collect();
    let sizes = if sizes.is_empty() {
        vec![10, 1_000, 10_000]
    } else {
        sizes
    };
    // Build (or find) the agent before any clock starts.
    let _ = agent_bin();
    let baseline = std::env::var_os("PRIVATE_INGRESS_BASELINE_BIN")
        .filter(|p| !p.is_empty())
        .map(std::path::PathBuf::from);
    println!(
        "{:>7}  {:>6}  {:>20}  {:>20}  {:>7}  {:>17}  {:>16}  {:>22}  {:>14}",
        "routes",
        "rounds",
        "agent→ready",
        "sozu from file",
        "ratio",
        "agent RSS rest/peak",
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

        let mut results = Vec::new();
        let (mut rss, mut peak, mut wakeups) = (f64::NAN, f64::NAN, 0);
        // The two take turns, so that both see the machine in the same state.
        for round in 0..rounds.unwrap_or_else(|| default_rounds(n)) {
            // The agent: sozu runs empty, the agent starts, until /readyz.
            stack.start_sozu();
            std::thread::sleep(SOZU_SETTLE);
            let sozu_pid = stack.sozu_pid().unwrap_or(0);
            let sozu_cpu_before = tree_cpu_ms(sozu_pid);
            let start = Instant::now();
            stack.start_agent();
            poll(timeout, "the agent's /readyz", || {
                stack.ready().then_some(())
            });
            let agent = start.elapsed();
            let pid = stack.agent_pid().unwrap_or(0);
            let agent_cpu = cpu_ms(pid, true);
            let its_sozu_cpu = tree_cpu_ms(sozu_pid) - sozu_cpu_before;
            if round == 0 {
                if std::env::var_os("COLD_START_LOGS").is_some() {
                    eprintln!("{}", stack.agent_logs());
                }
                let switches = || context_switches(pid);
                let before = switches();
                std::thread::sleep(Duration::from_secs(10));
                wakeups = count_wakeups(&before, &switches());
                rss = memory_mib(pid, "VmRSS:");
                peak = memory_mib(pid, "VmHWM:");
            }
            stack.stop_agent();
            stack.kill_sozu();

            // sozu alone, loading the same routes from the rendered configuration file.
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

            // The baseline build of the agent, as the agent above.
            let baseline = baseline.as_ref().map(|bin| {
                stack.start_sozu();
                std::thread::sleep(SOZU_SETTLE);
                let start = Instant::now();
                stack.start_agent_from(bin, &[], &[("RUST_LOG", "info")]);
                poll(timeout, "the baseline agent's /readyz", || {
                    stack.ready().then_some(())
                });
                let took = start.elapsed();
                stack.stop_agent();
                stack.kill_sozu();
                took
            });
            results.push(Round {
                agent,
                baseline,
                sozu,
                agent_cpu,
                its_sozu_cpu,
                sozu_alone_cpu,
            });
        }

        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let agent: Vec<f64> = results.iter().map(|r| ms(r.agent)).collect();
        let sozu: Vec<f64> = results.iter().map(|r| ms(r.sozu)).collect();
        let cpu =
            |f: fn(&Round) -> u64| median(&results.iter().map(|r| f(r) as f64).collect::<Vec<_>>());
        let baseline: Vec<f64> = results.iter().filter_map(|r| r.baseline.map(ms)).collect();
        println!(
            "{:>7}  {:>6}  {:>20}  {:>20}  {:>6.2}x  {:>5.1} / {:>5.1} MiB  {:>16}  {:>10.0} + {:>5.0} ms  {:>11.0} ms",
            n,
            results.len(),
            spread(&agent),
            spread(&sozu),
            median(&agent) / median(&sozu),
            rss,
            peak,
            wakeups,
            cpu(|r| r.agent_cpu),
            cpu(|r| r.its_sozu_cpu),
            cpu(|r| r.sozu_alone_cpu),
        );
        if !baseline.is_empty() {
            println!(
                "{:>7}  baseline build → ready {}; this build / baseline {:.2}x",
                n,
                spread(&baseline),
                median(&agent) / median(&baseline)
            );
        }
    }
    println!(
        "agent→ready: from starting the agent beside an empty sozu (running for {} ms) to /readyz 200",
        SOZU_SETTLE.as_millis()
    );
    println!("sozu from file: from `sozu start` with the rendered configuration to the last route served");
    println!("times: median (min–max) over the rounds; ratio = median agent→ready / median sozu from file");
    println!("agent RSS: after the 10 s idle that follows the first round's start, and its peak");
    println!(
        "CPU = median user + system time to that point (10 ms ticks): the agent with its evaluation \
         child, and sozu's main process with its workers"
    );
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// "median (min–max) ms", or the one value.
fn spread(values: &[f64]) -> String {
    let (min, max) = values
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &v| {
            (lo.min(v), hi.max(v))
        });
    if values.len() < 2 {
        format!("{:.0} ms", median(values))
    } else {
        format!("{:.0} ({:.0}–{:.0}) ms", median(values), min, max)
    }
}

/// Polls at 2 ms rather than the tests' 20: both sides of the ratio are found finished within
/// 2 ms of the fact, not 20.
fn poll<T>(timeout: Duration, what: &str, f: impl FnMut() -> Option<T>) -> T {
    eventually_every(Duration::from_millis(2), timeout, what, f)
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

/// A memory figure of `pid` from /proc (`VmRSS:` now, `VmHWM:` at its peak), in MiB.
fn memory_mib(pid: u32, field: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
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
fn count_wakeups(
    before: &std::collections::BTreeMap<String, u64>,
    after: &std::collections::BTreeMap<String, u64>,
) -> u64 {
    after
        .iter()
        .map(|(tid, n)| n.saturating_sub(before.get(tid).copied().unwrap_or(0)))
        .sum()
}
