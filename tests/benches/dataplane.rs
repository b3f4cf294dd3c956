//! The data plane beside the agent's upkeep: what a request through sozu waits while the agent
//! resyncs. Prints figures; asserts nothing.
//!
//! For each size (routes, each with its own certificate): sozu and the agent serving them, then
//! two clients through sozu at once for `--seconds`: requests on a kept-alive HTTPS connection,
//! and a new TLS connection (a full handshake, a host drawn at random) with one request each;
//! each request's latency as the client sees it (p50 / p99 / max). Two phases on the same sozu:
//! the agent with `--resync-interval 0` (no resync), then the agent stopped and started again
//! with `--resync-interval 5`, measured once its first resync has begun; the first phase
//! begins as long after Ready (5 s). The ratios (with / without
//! resyncs) per size are the figures issue 54 sets targets for. Clients pause `--pause-ms`
//! between requests: the load is light, so that what moves the tail is the agent's upkeep, not
//! the clients' own queueing.
//!
//! With `PRIVATE_INGRESS_BASELINE_BIN`, that build runs the same two phases first at each size,
//! on a sozu of its own.
//!
//!     cargo bench -p private-ingress-tests --bench dataplane [-- 10 1000 10000] [--seconds 20] [--pause-ms 2]
//!     PRIVATE_INGRESS_BASELINE_BIN=old/private-ingress cargo bench -p private-ingress-tests \
//!         --bench dataplane -- 10 1000

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use private_ingress_tests::bench::scale::{host, Rng};
use private_ingress_tests::bench::workload::{percentile, Pair};
use private_ingress_tests::bench::{ours, ours::Ours};
use private_ingress_tests::live::{Backend, KeepAlive};

struct Args {
    sizes: Vec<usize>,
    seconds: u64,
    pause: Duration,
}

fn args() -> Args {
    let mut args = Args {
        sizes: Vec::new(),
        seconds: 20,
        pause: Duration::from_millis(2),
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
            "--pause-ms" => args.pause = Duration::from_millis(value("--pause-ms")),
            "--bench" => {}
            other => args.sizes.push(
                other
                    .parse()
                    .expect("a number of routes, --seconds or --pause-ms"),
            ),
        }
    }
    if args.sizes.is_empty() {
        args.sizes = vec![10, 1_000, 10_000];
    }
    args
}

/// What one client saw over a phase: each successful request's latency, and the failures.
#[derive(Default)]
struct Seen {
    latencies: Vec<Duration>,
    failures: usize,
    first_failure: Option<String>,
}

impl Seen {
    fn record(&mut self, started: Instant, result: Result<(u16, String), String>) {
        match result {
            Ok((200, body)) if body == "app" => self.latencies.push(started.elapsed()),
            Ok((status, body)) => self.fail(format!("{status} {body:?}")),
            Err(e) => self.fail(e),
        }
    }

    fn fail(&mut self, why: String) {
        self.failures += 1;
        self.first_failure.get_or_insert(why);
    }

    fn ms(&self, p: f64) -> f64 {
        percentile(&self.latencies, p).map_or(f64::NAN, |d| d.as_secs_f64() * 1e3)
    }

    /// `p50 / p99 / max` in ms, with the count and any failure.
    fn cell(&self) -> String {
        let failed = match &self.first_failure {
            Some(why) => format!(
                ", {} failed ({})",
                self.failures,
                why.chars().take(60).collect::<String>()
            ),
            None => String::new(),
        };
        format!(
            "{:.2} / {:.2} / {:.1} ms ({}{failed})",
            self.ms(50.0),
            self.ms(99.0),
            self.ms(100.0),
            self.latencies.len()
        )
    }
}

/// A new HTTPS connection to `host`, with TCP_NODELAY like any HTTP client.
fn connect(address: SocketAddr, host: &str) -> Result<KeepAlive, String> {
    let conn = KeepAlive::connect(address, host)?;
    conn.set_nodelay()
        .map_err(|e| format!("TCP_NODELAY: {e}"))?;
    Ok(conn)
}

/// Requests on one kept-alive connection (to a host drawn from `seed`), one after the other with
/// `pause` between them, until `stop`. A connection the server closed is opened again, and the
/// request that found it closed is timed from its first try.
fn kept_alive(
    address: SocketAddr,
    n: usize,
    seed: u64,
    pause: Duration,
    stop: &AtomicBool,
) -> Seen {
    let mut seen = Seen::default();
    let mut rng = Rng(seed);
    let mut conn: Option<KeepAlive> = None;
    let mut opened = false;
    while !stop.load(Ordering::Relaxed) {
        let started = Instant::now();
        let result = match conn.as_mut().map(|c| c.get("/")) {
            Some(Ok(answer)) => Ok(answer),
            // Never opened, or closed between two requests: a new connection (its handshake
            // counted in this request's time), kept from then on.
            Some(Err(_)) | None => connect(address, &host(rng.below(n))).and_then(|mut c| {
                let answer = c.get("/");
                conn = Some(c);
                answer
            }),
        };
        if result.is_err() {
            conn = None;
        }
        // The first request opens the connection: its handshake is not a kept-alive request.
        if !opened && result.is_ok() {
            opened = true;
            continue;
        }
        seen.record(started, result);
        std::thread::sleep(pause);
    }
    seen
}

/// A new TLS connection per request, each to a host drawn from `seed` (its own certificate, a
/// full handshake), until `stop`.
fn new_connections(
    address: SocketAddr,
    n: usize,
    seed: u64,
    pause: Duration,
    stop: &AtomicBool,
) -> Seen {
    let mut seen = Seen::default();
    let mut rng = Rng(seed);
    while !stop.load(Ordering::Relaxed) {
        let started = Instant::now();
        let result = connect(address, &host(rng.below(n))).and_then(|mut c| c.get("/"));
        seen.record(started, result);
        std::thread::sleep(pause);
    }
    seen
}

/// Both clients at once for `seconds`: (kept-alive, new connections).
fn measure(address: SocketAddr, n: usize, seconds: u64, pause: Duration) -> (Seen, Seen) {
    let stop = Arc::new(AtomicBool::new(false));
    let kept = {
        let stop = stop.clone();
        std::thread::spawn(move || kept_alive(address, n, 0x9e37_79b9_7f4a_7c15, pause, &stop))
    };
    let fresh = {
        let stop = stop.clone();
        std::thread::spawn(move || new_connections(address, n, 0xd1b5_4a32_d192_ed03, pause, &stop))
    };
    std::thread::sleep(Duration::from_secs(seconds));
    stop.store(true, Ordering::Relaxed);
    (
        kept.join().expect("the kept-alive client"),
        fresh.join().expect("the new-connection client"),
    )
}

/// The resyncs the agent has begun (`/v1/state`'s counter).
fn resyncs(ours: &Ours) -> u64 {
    ours.stack
        .state()
        .and_then(|s| s["counters"]["resyncs"].as_u64())
        .unwrap_or(0)
}

/// The machine's load averages, as `uptime` shows them.
fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

/// The second phase's `--resync-interval`, in seconds.
const RESYNC_INTERVAL: u64 = 5;

/// One phase's row and what it measured.
struct Phase {
    kept: Seen,
    fresh: Seen,
    resyncs: u64,
}

/// The two phases of one build at one size, on one sozu.
fn phases(
    bin: Option<&Path>,
    hosts: &[(String, &Pair)],
    backend: SocketAddr,
    seconds: u64,
    pause: Duration,
) -> Result<[Phase; 2], String> {
    let n = hosts.len();
    let mut ours = ours::serve_as(
        hosts,
        backend,
        &ours::Options {
            bin,
            log: "warn",
            args: &["--resync-interval", "0"],
            ..ours::Options::default()
        },
    )?;
    let address = ours.stack.https;
    // As long after Ready as the second phase begins (its first resync, 5 s after its start):
    // neither phase then measures what the agent and sozu still do right after a start.
    std::thread::sleep(Duration::from_secs(RESYNC_INTERVAL));
    let (kept, fresh) = measure(address, n, seconds, pause);
    let without = Phase {
        kept,
        fresh,
        resyncs: resyncs(&ours),
    };
    // The same sozu, the agent started again: it reads what sozu holds and converges on it.
    if !ours.stack.stop_agent() {
        return Err("the agent did not stop on SIGTERM".into());
    }
    let interval = RESYNC_INTERVAL.to_string();
    let args = ["--resync-interval", interval.as_str()];
    let env = [("RUST_LOG", "warn")];
    match bin {
        Some(bin) => ours.stack.start_agent_from(bin, &args, &env),
        None => ours.stack.start_agent_with(&args, &env),
    }
    ours::wait_ready(&ours.stack, n)?;
    // Measured from the first resync on, so that every 5 s of the phase has one.
    let deadline = Instant::now() + Duration::from_secs(60);
    while resyncs(&ours) == 0 {
        if Instant::now() > deadline {
            return Err("no resync began within 60 s of the restart".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let before = resyncs(&ours);
    let (kept, fresh) = measure(address, n, seconds, pause);
    let with = Phase {
        kept,
        fresh,
        resyncs: resyncs(&ours).saturating_sub(before),
    };
    drop(ours);
    Ok([without, with])
}

fn main() {
    let args = args();
    let baseline = ours::baseline_bin();
    let backend = Backend::start("app");
    println!(
        "\ntwo clients through sozu at once, {} s a phase, {} ms between requests; latency p50 / \
         p99 / max (requests)\n",
        args.seconds,
        args.pause.as_millis()
    );
    println!(
        "| routes | agent | phase | kept-alive requests | new TLS connection + request | resyncs in the phase | load (1/5/15 min) |"
    );
    println!("|---:|---|---|---:|---:|---:|---|");
    let mut ratios = Vec::new();
    for &n in &args.sizes {
        let pairs: Vec<Pair> = (0..n).map(|i| Pair::new(&host(i))).collect();
        let hosts: Vec<(String, &Pair)> = pairs
            .iter()
            .enumerate()
            .map(|(i, p)| (host(i), p))
            .collect();
        for (name, bin) in ours::builds(baseline.as_deref()) {
            let load_before = load();
            match phases(bin, &hosts, backend.address, args.seconds, args.pause) {
                Ok([without, with]) => {
                    for (phase, p) in [
                        ("`--resync-interval 0`", &without),
                        ("`--resync-interval 5`", &with),
                    ] {
                        println!(
                            "| {n} | {name} | {phase} | {} | {} | {} | {load_before} → {} |",
                            p.kept.cell(),
                            p.fresh.cell(),
                            p.resyncs,
                            load()
                        );
                    }
                    let ratio = |a: &Seen, b: &Seen, q: f64| b.ms(q) / a.ms(q);
                    ratios.push(format!(
                        "| {n} | {name} | {:.2}× / {:.2}× | {:.2}× / {:.2}× | {:.2}× / {:.2}× |",
                        ratio(&without.kept, &with.kept, 99.0),
                        ratio(&without.kept, &with.kept, 100.0),
                        ratio(&without.fresh, &with.fresh, 99.0),
                        ratio(&without.fresh, &with.fresh, 100.0),
                        ratio(&without.kept, &with.kept, 50.0),
                        ratio(&without.fresh, &with.fresh, 50.0),
                    ));
                }
                Err(e) => println!("| {n} | {name} | failed: {e} | | | | {load_before} |"),
            }
        }
    }
    println!("\nwith resyncs / without (targets at 10,000 routes: p99 ≤ 1.2×, max ≤ 2×)\n");
    println!(
        "| routes | agent | kept-alive p99 / max | new connection p99 / max | p50 kept-alive / new connection |"
    );
    println!("|---:|---|---:|---:|---:|");
    for row in ratios {
        println!("{row}");
    }
}
