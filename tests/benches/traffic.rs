//! What the traffic stream costs: HTTPS requests through sozu at its fastest on this machine,
//! with sozu's records sent to the agent, against sozu writing no access log and against sozu's
//! own default (a text line per request on its standard output), rounds interleaved in one run.
//! Then the agent frozen (SIGSTOP) under the same load: what sozu served meanwhile, and what the
//! agent knows it lost. Prints figures; asserts nothing.
//!
//!     cargo bench -p private-ingress-tests --bench traffic [-- --seconds 10 --rounds 3 --clients 16]
//!
//! The load is closed-loop: `--clients` keep-alive HTTPS connections, each sending its next
//! request when the last response has arrived, so throughput is what sozu (and the machine)
//! manage, and latency is per request as a client sees it. The agent runs pinned to one core
//! (`taskset`), to show whether one core keeps up with sozu's rate.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use private_ingress_tests::bench::mass::cpu;
use private_ingress_tests::live::{certificate, eventually, free_port, Backend, KeepAlive, Stack};

const HOST: &str = "bench.in.example.org";

struct Args {
    seconds: u64,
    rounds: usize,
    clients: usize,
}

fn args() -> Args {
    let mut args = Args {
        seconds: 10,
        rounds: 3,
        clients: 16,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| -> u64 {
            it.next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{name} needs a number"))
        };
        match arg.as_str() {
            "--seconds" => args.seconds = value("--seconds"),
            "--rounds" => args.rounds = value("--rounds") as usize,
            "--clients" => args.clients = value("--clients") as usize,
            "--bench" => {}
            other => panic!("unknown argument {other}"),
        }
    }
    args
}

/// How sozu writes its access log in a round.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    /// `log_level = "warn"`: no access log at all.
    None,
    /// sozu's default: a text line per request on its standard output (a file here).
    Text,
    /// The stream sent to a port nobody reads: sozu's own part of the stream (encoding, one
    /// `sendto` per request), without the agent's use of the machine's cores.
    Unread,
    /// The stream: protobuf records over UDP to the agent.
    Stream,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::None => "no access log",
            Mode::Text => "sozu's text log",
            Mode::Unread => "stream, unread",
            Mode::Stream => "stream to the agent",
        }
    }
}

/// sozu's configuration for `mode`, from the stack's own (which already has the stream lines).
fn configure(stack: &Stack, base: &str, mode: Mode) {
    let config: String = match mode {
        Mode::Stream => base.to_owned(),
        Mode::Unread => base
            .lines()
            .map(|l| {
                if l.starts_with("access_logs_target") {
                    format!("access_logs_target = \"udp://127.0.0.1:{}\"\n", free_port())
                } else {
                    format!("{l}\n")
                }
            })
            .collect(),
        Mode::Text | Mode::None => base
            .lines()
            .filter(|l| !l.starts_with("access_logs_"))
            .map(|l| format!("{l}\n"))
            .collect(),
    };
    let config = if mode == Mode::None {
        config.replace("log_level = \"info\"", "log_level = \"warn\"")
    } else {
        config
    };
    std::fs::write(stack.dir.path().join("sozu.toml"), config).expect("write sozu.toml");
}

/// One round of one configuration.
struct Round {
    mode: Mode,
    measured: Measured,
    agent_cpu: Duration,
}

/// What a load of `clients` for `length` saw.
struct Measured {
    requests: u64,
    failed: u64,
    elapsed: Duration,
    /// Request latencies, µs, sorted.
    latencies: Vec<u32>,
    /// Requests completed in each 100 ms.
    per_tick: Vec<u64>,
}

fn load(https: std::net::SocketAddr, clients: usize, length: Duration) -> Measured {
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let threads: Vec<_> = (0..clients)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut latencies = Vec::new();
                let mut ticks = Vec::new();
                let mut failed = 0u64;
                let mut connection = None;
                while !stop.load(Ordering::Relaxed) {
                    let c = match &mut connection {
                        Some(c) => c,
                        None => match KeepAlive::connect(https, HOST) {
                            Ok(c) => connection.insert(c),
                            Err(_) => {
                                failed += 1;
                                std::thread::sleep(Duration::from_millis(5));
                                continue;
                            }
                        },
                    };
                    let sent = Instant::now();
                    match c.get("/") {
                        Ok((200, _)) => {
                            latencies.push(sent.elapsed().as_micros().min(u32::MAX as u128) as u32);
                            ticks.push((start.elapsed().as_millis() / 100) as usize);
                        }
                        _ => {
                            failed += 1;
                            connection = None;
                        }
                    }
                }
                (latencies, ticks, failed)
            })
        })
        .collect();
    std::thread::sleep(length);
    stop.store(true, Ordering::Relaxed);
    let elapsed = start.elapsed();
    let mut latencies = Vec::new();
    let mut per_tick = vec![0u64; (elapsed.as_millis() / 100) as usize + 2];
    let mut failed = 0;
    for t in threads {
        let (l, ticks, f) = t.join().expect("a load thread");
        latencies.extend(l);
        for tick in ticks {
            if let Some(n) = per_tick.get_mut(tick) {
                *n += 1;
            }
        }
        failed += f;
    }
    latencies.sort_unstable();
    Measured {
        requests: latencies.len() as u64,
        failed,
        elapsed,
        latencies,
        per_tick,
    }
}

fn percentile(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    f64::from(sorted[i]) / 1000.0
}

fn counter(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

fn serve_again(stack: &Stack) {
    eventually(Duration::from_secs(60), "sozu serving the route", || {
        KeepAlive::connect(stack.https, HOST)
            .ok()
            .and_then(|mut c| c.get("/").ok())
            .filter(|(status, _)| *status == 200)
    });
}

fn main() {
    let args = args();
    let length = Duration::from_secs(args.seconds);
    let backend = Backend::start("bench");
    let mut stack = Stack::new();
    certificate(&stack.tls_dir(), HOST);
    let traffic = stack.send_traffic();
    let base = std::fs::read_to_string(stack.dir.path().join("sozu.toml")).expect("sozu.toml");
    stack.write_workspace(&stack.workspace_text_of(
        &[format!(
            "{{ host = \"{HOST}\", upstream = \"{}\", port = {} }}",
            backend.address.ip(),
            backend.address.port()
        )],
        &format!(
            "{traffic}  traffic.access_log.path = \"{}\",\n",
            stack.dir.path().join("access.log").display()
        ),
    ));
    stack.start_sozu();
    stack.start_agent();
    stack.wait_ready(Duration::from_secs(60));
    let agent = stack.agent_pid().expect("the agent runs");
    let pinned = std::process::Command::new("taskset")
        .args(["-a", "-p", "0x1", &agent.to_string()])
        .output()
        .is_ok_and(|o| o.status.success());
    println!(
        "traffic bench: {} clients, {} s per round, {} rounds; agent pinned to one core: {pinned}; {}",
        args.clients,
        args.seconds,
        args.rounds,
        private_ingress_tests::bench::report::machine()
    );
    let modes = [Mode::None, Mode::Text, Mode::Unread, Mode::Stream];
    let mut results: Vec<Round> = Vec::new();
    for round in 0..args.rounds {
        for mode in modes {
            stack.kill_sozu();
            configure(&stack, &base, mode);
            stack.start_sozu();
            serve_again(&stack);
            let before = counter(&stack.metrics(), "private_ingress_traffic_records_total");
            let cpu_before = cpu(agent);
            let measured = load(stack.https, args.clients, length);
            // Records arrive once their response has ended: let the last ones in.
            std::thread::sleep(Duration::from_millis(500));
            let agent_cpu = cpu(agent).saturating_sub(cpu_before);
            let records =
                counter(&stack.metrics(), "private_ingress_traffic_records_total") - before;
            println!(
                "round {round} {:<20} {:>8.0} req/s  p50 {:>6.2} ms  p99 {:>6.2} ms  failed {}  records {} (of {} answered + warm-up)  agent CPU {:?}",
                mode.name(),
                measured.requests as f64 / measured.elapsed.as_secs_f64(),
                percentile(&measured.latencies, 0.5),
                percentile(&measured.latencies, 0.99),
                measured.failed,
                records,
                measured.requests,
                agent_cpu
            );
            results.push(Round {
                mode,
                measured,
                agent_cpu,
            });
            let _ = records;
        }
    }
    println!(
        "\nsummary over {} rounds (medians of the rounds):",
        args.rounds
    );
    let median = |mut v: Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    };
    let of = |mode: Mode, f: &dyn Fn(&Round) -> f64| {
        median(results.iter().filter(|r| r.mode == mode).map(f).collect())
    };
    let rate = |r: &Round| r.measured.requests as f64 / r.measured.elapsed.as_secs_f64();
    let p50 = |r: &Round| percentile(&r.measured.latencies, 0.5);
    let p99 = |r: &Round| percentile(&r.measured.latencies, 0.99);
    let none = (
        of(Mode::None, &rate),
        of(Mode::None, &p50),
        of(Mode::None, &p99),
    );
    for mode in modes {
        let (r, a, b) = (of(mode, &rate), of(mode, &p50), of(mode, &p99));
        println!(
            "  {:<20} {:>8.0} req/s ({:.3}× no access log)  p50 {:.2} ms (+{:.2})  p99 {:.2} ms (+{:.2})",
            mode.name(),
            r,
            r / none.0,
            a,
            a - none.1,
            b,
            b - none.2
        );
    }
    let stream: Vec<_> = results.iter().filter(|r| r.mode == Mode::Stream).collect();
    let requests: u64 = stream.iter().map(|r| r.measured.requests).sum();
    let agent_cpu: Duration = stream.iter().map(|r| r.agent_cpu).sum();
    let busy: Duration = stream.iter().map(|r| r.measured.elapsed).sum();
    println!(
        "  agent: {:.1} ms of CPU per 10,000 requests, {:.1} % of one core at sozu's rate",
        agent_cpu.as_secs_f64() * 1000.0 / requests as f64 * 10_000.0,
        agent_cpu.as_secs_f64() / busy.as_secs_f64() * 100.0
    );

    // The agent frozen for a third of a round, under the same load.
    let metrics = stack.metrics();
    let (records0, lost0) = (
        counter(&metrics, "private_ingress_traffic_records_total"),
        counter(&metrics, "private_ingress_traffic_records_lost_total"),
    );
    let third = length / 3;
    let freezer = std::thread::spawn(move || {
        std::thread::sleep(third);
        let _ = std::process::Command::new("kill")
            .args(["-STOP", &agent.to_string()])
            .status();
        std::thread::sleep(third);
        let _ = std::process::Command::new("kill")
            .args(["-CONT", &agent.to_string()])
            .status();
    });
    let measured = load(stack.https, args.clients, length);
    freezer.join().expect("the freezer");
    // Whatever is neither counted nor known lost after a while is reported as unaccounted.
    let deadline = Instant::now() + Duration::from_secs(10);
    let counted = loop {
        let m = stack.metrics();
        let records = counter(&m, "private_ingress_traffic_records_total") - records0;
        let lost = counter(&m, "private_ingress_traffic_records_lost_total") - lost0;
        if records + lost >= measured.requests as f64 || Instant::now() > deadline {
            break (records, lost);
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let ticks = |from: Duration, to: Duration| {
        let (a, b) = (
            (from.as_millis() / 100) as usize,
            (to.as_millis() / 100) as usize,
        );
        measured.per_tick[a..b].iter().sum::<u64>() as f64 / (to - from).as_secs_f64()
    };
    println!(
        "\nagent frozen {:?} of {:?}: sozu served {:.0} req/s before, {:.0} req/s while frozen, {:.0} after; \
         {} answered, {} counted, {} known lost (SO_RXQ_OVFL), {} unaccounted",
        third,
        length,
        ticks(Duration::ZERO, third),
        ticks(third, third * 2),
        ticks(third * 2, third * 3),
        measured.requests,
        counted.0,
        counted.1,
        measured.requests as f64 - counted.0 - counted.1
    );
}
