//! Certificate rotation: from the AtomicWriter's `..data` swap to the first handshake presenting
//! the new certificate. Prints figures; asserts nothing.
//!
//! Without `--peers` (ours only): N rotations idle and N under HTTPS load, p50/p99/max; then the
//! mass renewal of `--hosts` hosts (each its own certificate directory), until all are served.
//!
//! With `--peers`: the same workload under load through private-ingress + sozu, envoy, haproxy,
//! nginx and Traefik, one table with ratios to ours, written with a plot of the distributions to
//! `--out` (default docs/) as rotation-peers.md and rotation-peers.svg. bench/run-peers installs
//! the peers and runs this.
//!
//! With `--baseline`: the same, between this build and another build of the agent
//! (`PRIVATE_INGRESS_BASELINE_BIN`), in the same run; the table is printed, nothing written.
//!
//! With sizes (`-- 10 1000 10000`): for each, the agent serving that many routes, each with its
//! own certificate; single rotations of random hosts, idle and with `/metrics` scraped back to
//! back beside them; one route appended. One table, with the ratios of each size to the first.
//!
//! With `--top`: the idle rotations of ours, half of them with `private-ingress top` attached to
//! the agent (on a pseudo-terminal, refreshing every second), in `--rounds` rounds taking turns
//! with and without it; the p50 and p99 of each, and their ratio.
//!
//! With `--busy` and sizes (`--busy 1000 10000`): for each, rotations of random hosts, one every
//! 0.3 s, first with nothing else going on, then with a workspace edit every 2 s, then with the
//! edits and a resync every 5 s, then the same with no agent (the floor; see `bench::busy`);
//! with `PRIVATE_INGRESS_BASELINE_BIN`, that build runs the same before this one at each size.
//!
//! With `--drift` and sizes (`--drift 10 10000`): for each, a frontend and then a backend of
//! random routes removed with sozu's own command line, `--rotations` times each (default 5
//! here), and the time until the route answers again (see `bench::drift`); with
//! `PRIVATE_INGRESS_BASELINE_BIN`, that build runs the same before this one at each size.
//!
//! With `--hops`: where each rotation's time goes, hop by hop (see `bench::hops`), at one route
//! or at each size given (`--hops 10 10000`); with `PRIVATE_INGRESS_BASELINE_BIN`, that build is
//! timed too, before this one at each size.
//!
//!     cargo bench -p private-ingress-tests --bench rotation [-- --rotations 100 --hosts 1000]
//!     cargo bench -p private-ingress-tests --bench rotation -- 10 1000 10000 [--rotations 30]
//!     cargo bench -p private-ingress-tests --bench rotation -- --top [--rotations 100] [--rounds 5]
//!     cargo bench -p private-ingress-tests --bench rotation -- --busy 1000 10000 [--rotations 200]
//!     cargo bench -p private-ingress-tests --bench rotation -- --drift 10 10000 [--rotations 5]
//!     bench/run-peers [--rotations 100] [--rounds 5] [--out DIR]
//!     PRIVATE_INGRESS_BASELINE_BIN=old/private-ingress cargo bench -p private-ingress-tests \
//!         --bench rotation -- --baseline [--rotations 100] [--rounds 5]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use private_ingress_tests::bench::report::{self, Row};
use private_ingress_tests::bench::workload::{
    self, percentile, wait_serving, Load, Outcome, Workload,
};
use private_ingress_tests::bench::{
    busy, contenders, hops, mass, ours, scale, Contender, Start, System, HOST, START_TIMEOUT,
};
use private_ingress_tests::live::Backend;

struct Args {
    peers: bool,
    top: bool,
    baseline: bool,
    hops: bool,
    busy: bool,
    drift: bool,
    sizes: Vec<usize>,
    rotations: usize,
    rounds: usize,
    hosts: usize,
    after_switch: Duration,
    out: PathBuf,
}

fn args() -> Args {
    let mut args = Args {
        peers: false,
        top: false,
        baseline: false,
        hops: false,
        busy: false,
        drift: false,
        sizes: Vec::new(),
        rotations: 100,
        rounds: 5,
        hosts: 1_000,
        after_switch: Duration::from_millis(300),
        out: PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs"),
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().unwrap_or_else(|| panic!("{name} needs a value"));
        match arg.as_str() {
            "--peers" => args.peers = true,
            "--top" => args.top = true,
            "--baseline" => args.baseline = true,
            "--hops" => args.hops = true,
            "--busy" => args.busy = true,
            "--drift" => args.drift = true,
            "--rotations" => args.rotations = value("--rotations").parse().expect("--rotations N"),
            "--hosts" => args.hosts = value("--hosts").parse().expect("--hosts N"),
            "--rounds" => args.rounds = value("--rounds").parse().expect("--rounds N"),
            "--after-switch-ms" => {
                args.after_switch =
                    Duration::from_millis(value("--after-switch-ms").parse().expect("--after-switch-ms N"))
            }
            "--out" => args.out = PathBuf::from(value("--out")),
            // cargo bench passes --bench to every harness = false target.
            "--bench" => {}
            size if size.parse::<usize>().is_ok() => {
                args.sizes.push(size.parse().unwrap_or_default());
            }
            other => panic!(
                "unknown argument {other}; use sizes, --peers, --baseline, --top, --hops, --busy, --rotations N, --rounds N, --hosts N, --after-switch-ms N, --out DIR"
            ),
        }
    }
    args
}

fn workload(args: &Args, load: bool) -> Workload {
    Workload {
        after_switch: args.after_switch,
        timeout: Duration::from_secs(10),
        load: load.then_some(Load {
            keep_alive: 2,
            pause: Duration::from_millis(2),
        }),
    }
}

fn main() {
    let args = args();
    // Build (or find) the agent before any clock starts.
    let _ = private_ingress_tests::agent_bin();
    if args.busy {
        busy(&args);
        return;
    }
    if args.drift {
        drift(&args);
        return;
    }
    let started = Instant::now();
    let pairs = workload::pairs(
        HOST,
        if args.top {
            2 * args.rotations + 1
        } else {
            args.rotations + 1
        },
    );
    println!(
        "{} certificates (ECDSA P-256) generated in {:.0?}",
        pairs.len(),
        started.elapsed()
    );
    if args.top {
        with_top(&args, &pairs);
    } else if args.hops {
        hops(&args, &pairs);
    } else if !args.sizes.is_empty() {
        sizes(&args);
    } else if args.baseline {
        let contenders = vec![
            contenders().remove(0),
            Contender {
                name: "baseline build",
                version: ours::baseline_version,
                start: ours::baseline_start,
            },
        ];
        compare(&args, &pairs, &contenders);
    } else if args.peers {
        let rows = compare(&args, &pairs, &contenders());
        write_report(&args, &rows);
    } else {
        ours(&args, &pairs);
    }
}

fn ours(args: &Args, pairs: &[workload::Pair]) {
    for load in [false, true] {
        let label = if load { "under load" } else { "idle" };
        let backend = Backend::start("app");
        // The idle run also logs the agent's own timings (a few lines per rotation).
        let log = if load {
            "warn"
        } else {
            "warn,private_ingress=debug"
        };
        let system = ours::serve(&[(HOST.to_owned(), &pairs[0])], backend.address, log)
            .unwrap_or_else(|e| panic!("private-ingress did not start: {e}"));
        wait_serving(system.https(), &pairs[0].fingerprint, START_TIMEOUT)
            .unwrap_or_else(|e| panic!("{e}: {}", system.logs()));
        let outcome = workload::run(&system, pairs, 1..=args.rotations, &workload(args, load));
        let f = |p| {
            percentile(&outcome.latencies, p)
                .map_or("–".into(), |d| format!("{:.2} ms", d.as_secs_f64() * 1e3))
        };
        println!(
            "rotation, {label}: {} rotations: p50 {}, p99 {}, max {}; old certificate after the switch {} of {} handshakes; {} timed out",
            outcome.latencies.len(),
            f(50.0),
            f(99.0),
            f(100.0),
            outcome.old_after_switch,
            outcome.after_handshakes,
            outcome.timed_out
        );
        let us = |v: &[Duration]| percentile(v, 50.0).map_or(0.0, |d| d.as_secs_f64() * 1e6);
        println!(
            "  the swap itself (p50) {:.0} µs; a probe handshake (p50) {:.0} µs",
            us(&outcome.swaps),
            us(&outcome.probe)
        );
        if load {
            println!(
                "  load: new connection per request {} ok, {} failed; keep-alive {} ok, {} failed ({} reconnects)",
                outcome.new_conn.ok,
                outcome.new_conn.failed,
                outcome.keep_alive.ok,
                outcome.keep_alive.failed,
                outcome.keep_alive.reconnects
            );
        } else {
            for (step, p50, count) in ours::split(&system.stack.agent_logs()) {
                println!("  the agent's log: {step}: p50 {p50:.3} ms ({count} times)");
            }
        }
    }
    if args.hosts == 0 {
        return;
    }
    let n = args.hosts;
    let generated = Instant::now();
    let firsts: Vec<_> = (0..n)
        .map(|i| workload::Pair::new(&mass::host(i)))
        .collect();
    let renewed: Vec<_> = (0..n)
        .map(|i| workload::Pair::new(&mass::host(i)))
        .collect();
    println!(
        "mass renewal: {} certificates generated in {:.1?}",
        2 * n,
        generated.elapsed()
    );
    let timeout = Duration::from_secs(60);
    let m = mass::run(&firsts, &renewed, timeout).unwrap_or_else(|e| panic!("mass renewal: {e}"));
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "mass renewal of {} hosts: all served {:.0} ms after the first swap, {:.0} ms after the last \
         (swaps written over {:.0} ms); per host p50 {:.0} ms, p99 {:.0} ms; {} not switched after {timeout:?}",
        m.hosts,
        ms(m.from_first),
        ms(m.from_last),
        ms(m.renew_span),
        ms(m.per_host_p50),
        ms(m.per_host_p99),
        m.not_switched
    );
    println!(
        "  one probe sweep over all {} hosts takes {:.0} ms (the method's resolution); {}",
        m.hosts,
        ms(m.sweep),
        m.inotify
    );
    if let Some(last) = m.agent_last {
        println!(
            "  the agent's log: the last certificate replaced {:.0} ms after the first swap",
            ms(last)
        );
    }
    for (step, p50, count) in &m.passes {
        println!("  the agent's log: {step}: p50 {p50:.3} ms ({count} times)");
    }
    println!("  the agent's counters: {}", m.counters);
    println!(
        "  the agent's RSS at rest ({:?} idle): {:.1} MiB after its start, {:.1} MiB after the renewal ({:+.1} %)",
        mass::REST,
        m.rss_started,
        m.rss_renewed,
        (m.rss_renewed / m.rss_started - 1.0) * 100.0
    );
}

/// Idle rotations with and without `top` attached, taking turns (see the module).
fn with_top(args: &Args, pairs: &[workload::Pair]) {
    let backend = Backend::start("app");
    let system = ours::serve(&[(HOST.to_owned(), &pairs[0])], backend.address, "warn")
        .unwrap_or_else(|e| panic!("private-ingress did not start: {e}"));
    wait_serving(system.https(), &pairs[0].fingerprint, START_TIMEOUT)
        .unwrap_or_else(|e| panic!("{e}: {}", system.logs()));
    let rounds = args.rounds.clamp(1, args.rotations.max(1));
    let per_round = (args.rotations / rounds).max(1);
    let (mut without, mut with) = (Outcome::default(), Outcome::default());
    let mut generation = 1;
    for round in 0..rounds {
        for attached in [false, true] {
            let top = attached.then(|| {
                private_ingress_tests::bench::top::attach(
                    system.stack.admin,
                    Duration::from_secs(1),
                )
            });
            let generations = generation..=generation + per_round - 1;
            generation += per_round;
            let outcome = workload::run(&system, pairs, generations, &workload(args, false));
            if attached {
                with.merge(outcome);
            } else {
                without.merge(outcome);
            }
            drop(top);
        }
        println!("round {} of {rounds} done", round + 1);
    }
    let ms =
        |o: &Outcome, p| percentile(&o.latencies, p).map_or(f64::NAN, |d| d.as_secs_f64() * 1e3);
    println!(
        "\nrotation, idle, {} rotations each way: without top p50 {:.2} ms, p99 {:.2} ms; with top \
         attached p50 {:.2} ms, p99 {:.2} ms; p50 ratio {:.2}x, p99 ratio {:.2}x; {} and {} timed out",
        without.latencies.len(),
        ms(&without, 50.0),
        ms(&without, 99.0),
        ms(&with, 50.0),
        ms(&with, 99.0),
        ms(&with, 50.0) / ms(&without, 50.0),
        ms(&with, 99.0) / ms(&without, 99.0),
        without.timed_out,
        with.timed_out
    );
}

/// Hop by hop, idle (see `bench::hops`): at one route, or at each size given (`--hops 10 10000`).
fn hops(args: &Args, pairs: &[workload::Pair]) {
    let sizes = if args.sizes.is_empty() {
        vec![1]
    } else {
        args.sizes.clone()
    };
    for routes in sizes {
        hops_at(args, pairs, routes);
    }
}

/// With `PRIVATE_INGRESS_BASELINE_BIN` set, that build is timed first at each size, in the same
/// run: before and after, on one machine at one moment.
fn hops_at(args: &Args, pairs: &[workload::Pair], routes: usize) {
    let baseline = ours::baseline_bin();
    if let Some(bin) = &baseline {
        hops_of(args, pairs, routes, Some(bin), "the baseline build");
    }
    let label = if baseline.is_some() { "this build" } else { "" };
    hops_of(args, pairs, routes, None, label);
}

fn hops_of(
    args: &Args,
    pairs: &[workload::Pair],
    routes: usize,
    bin: Option<&std::path::Path>,
    label: &str,
) {
    let outcome = hops::run(bin, pairs, args.rotations, routes).unwrap_or_else(|e| panic!("{e}"));
    let ms = |d: Option<Duration>| d.map_or(f64::NAN, |d| d.as_secs_f64() * 1e3);
    println!(
        "\n{routes} route(s){}{label}: {} rotations timed hop by hop ({} with a timestamp missing)",
        if label.is_empty() { "" } else { ", " },
        outcome.totals.len(),
        outcome.incomplete
    );
    println!(
        "{:>16}  {:>8}  {:>8}  {:>8}",
        "hop", "p50 ms", "p90 ms", "max ms"
    );
    for (name, samples) in hops::HOPS.iter().zip(&outcome.hops) {
        println!(
            "{:>16}  {:>8.3}  {:>8.3}  {:>8.3}",
            name,
            ms(percentile(samples, 50.0)),
            ms(percentile(samples, 90.0)),
            ms(percentile(samples, 100.0))
        );
    }
    println!(
        "{:>16}  {:>8.3}  {:>8.3}  {:>8.3}",
        "rename → served",
        ms(percentile(&outcome.totals, 50.0)),
        ms(percentile(&outcome.totals, 90.0)),
        ms(percentile(&outcome.totals, 100.0))
    );
}

/// Rotation at each size, one table (see the module).
fn drift(args: &Args) {
    use private_ingress_tests::bench::drift;
    let sizes = if args.sizes.is_empty() {
        vec![10, 10_000]
    } else {
        args.sizes.clone()
    };
    // Each removal waits for a repair (a backend's for a resync): 5 unless told.
    let repeats = if std::env::args().any(|a| a == "--rotations") {
        args.rotations
    } else {
        5
    };
    let baseline = ours::baseline_bin();
    let mut rows = Vec::new();
    for &n in &sizes {
        for (name, bin) in ours::builds(baseline.as_deref()) {
            let started = Instant::now();
            let outcome = drift::run(bin, n, repeats, 0xd21f7 + n as u64)
                .unwrap_or_else(|e| panic!("{name}, {n} routes: {e}"));
            println!("{name}, {n} routes measured in {:.0?}", started.elapsed());
            rows.push((name, outcome));
        }
    }
    println!(
        "\n| build | routes | frontend removed → served p50 / max | backend removed → served p50 / max | resyncs | queries to sozu's workers by resyncs |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let p = |v: &[Duration], q| percentile(v, q).map_or(f64::NAN, ms);
    for (name, r) in &rows {
        println!(
            "| {name} | {} | {:.0} / {:.0} ms | {:.0} / {:.0} ms | {} | {} |",
            r.routes,
            p(&r.frontend, 50.0),
            p(&r.frontend, 100.0),
            p(&r.backend, 50.0),
            p(&r.backend, 100.0),
            r.resyncs.map_or("–".to_owned(), |v| format!("{v:.0}")),
            r.worker_queries
                .map_or("– (no such metric)".to_owned(), |v| format!("{v:.0}")),
        );
    }
    println!(
        "drift: {repeats} frontends, then {repeats} backends, of routes drawn from a seed, removed \
         with sozu's command line; from its return to the route's first 200 from its backend; \
         the agent with --resync-interval {}",
        drift::RESYNC_EVERY
    );
}

fn busy(args: &Args) {
    let sizes = if args.sizes.is_empty() {
        vec![1_000, 10_000]
    } else {
        args.sizes.clone()
    };
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let p = |v: &[Duration], q| percentile(v, q).map_or(f64::NAN, ms);
    let median = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v.get(v.len().saturating_sub(1) / 2)
            .copied()
            .unwrap_or(f64::NAN)
    };
    let max = |v: &[f64]| v.iter().copied().fold(f64::NAN, f64::max);
    let baseline = ours::baseline_bin();
    let mut rows = Vec::new();
    for &n in &sizes {
        for (name, bin) in ours::builds(baseline.as_deref()) {
            let started = Instant::now();
            let outcome = busy::run(bin, n, args.rotations, 0x5eed + n as u64)
                .unwrap_or_else(|e| panic!("{name}, {n} routes: {e}"));
            println!("{name}, {n} routes measured in {:.0?}", started.elapsed());
            rows.push((name, outcome));
        }
    }
    println!(
        "\n| build | routes | quiet p50 / p99 / max | busy p50 / p99 / max | busy / quiet p99 | edit → served p50 / max | resyncs left alone (requests) | busy resyncs | read failures |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (name, r) in &rows {
        println!(
            "| {name} | {} | {} | {} | {:.2}x | {:.0} / {:.0} ms ({}) | {} ({}) | {} | {} |",
            r.routes,
            spread(&r.quiet),
            spread(&r.busy),
            p(&r.busy, 99.0) / p(&r.quiet, 99.0),
            p(&r.edits, 50.0),
            p(&r.edits, 100.0),
            r.edits.len(),
            r.unchanged_resyncs,
            r.unchanged_requests,
            r.busy_resyncs,
            r.read_failures,
        );
    }
    println!(
        "\n| build | routes | edits alone p50 / p99 / max | edits and resyncs (busy) p50 / p99 / max | floor p50 / p99 / max | above 10 ms: alone / busy / floor | floor edit → served p50 / max |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let above = |v: &[Duration]| v.iter().filter(|d| d.as_secs_f64() > 0.010).count();
    for (name, r) in &rows {
        let (floor, floor_above, floor_edits) = match &r.floor {
            Some(f) => (
                spread(&f.rotations),
                above(&f.rotations).to_string(),
                format!(
                    "{:.0} / {:.0} ms ({})",
                    p(&f.edits, 50.0),
                    p(&f.edits, 100.0),
                    f.edits.len()
                ),
            ),
            None => ("".into(), "–".into(), "".into()),
        };
        println!(
            "| {name} | {} | {} | {} | {floor} | {} / {} / {floor_above} of {} each | {floor_edits} |",
            r.routes,
            spread(&r.edits_alone),
            spread(&r.busy),
            above(&r.edits_alone),
            above(&r.busy),
            r.busy.len(),
        );
    }
    println!(
        "floor: the agent stopped after the busy phase; each rotation the same swap followed at \
         once by one ReplaceCertificate written straight on sozu's socket, the workspace renamed, \
         evaluated by `check` and its route added or taken away with four requests every {:?} \
         while the route is probed from the rename on, as in the busy phase, no resync reads",
        busy::EDIT_EVERY
    );
    println!("\n| build | routes | unchanged resync: read (beside the loop) p50 / max | compared (loop) p50 / max | pairs read again taken up (loop), a batch p50 / max | the same, a resync's total |");
    println!("|---|---:|---:|---:|---:|---:|");
    for (name, r) in &rows {
        println!(
            "| {name} | {} | {:.1} / {:.1} ms | {:.2} / {:.2} ms | {:.2} / {:.2} ms | {:.1} ms |",
            r.routes,
            median(&r.read_ms),
            max(&r.read_ms),
            median(&r.compared_ms),
            max(&r.compared_ms),
            median(&r.pairs_taken_ms),
            max(&r.pairs_taken_ms),
            r.pairs_taken_ms.iter().sum::<f64>() / r.unchanged_resyncs.max(1) as f64,
        );
    }
    println!(
        "rotation: from the AtomicWriter swap to the first handshake presenting the new certificate, \
         {} swaps of hosts drawn from a seed, one every {:?}; quiet: the agent with \
         --resync-interval 0 and nothing else going on; edits alone: the same agent, the \
         workspace edited every {:?} meanwhile (one route added, then taken away, in turn); \
         busy: the same agent restarted with --resync-interval {}, the same edits; edit → \
         served: each addition, from the rename to its first handshake; left alone: {:?} \
         between the last two phases, the resyncs completed and the requests \
         sent to sozu meanwhile; read/compared/pairs: from the agent's debug log, for the resyncs \
         of that time",
        args.rotations,
        busy::PACE,
        busy::EDIT_EVERY,
        busy::RESYNC_EVERY,
        busy::UNCHANGED,
    );
}

/// "p50 / p99 / max ms" of `v`.
fn spread(v: &[Duration]) -> String {
    let [p50, p99, max] =
        [50.0, 99.0, 100.0].map(|q| percentile(v, q).map_or(f64::NAN, |d| d.as_secs_f64() * 1e3));
    format!("{p50:.2} / {p99:.2} / {max:.2} ms")
}

fn sizes(args: &Args) {
    let rotations = args.rotations.min(100);
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let p = |v: &[Duration], q| percentile(v, q).map_or(f64::NAN, ms);
    let mut rows = Vec::new();
    for &n in &args.sizes {
        let started = Instant::now();
        let outcome = scale::run(n, rotations, 0x5eed + n as u64)
            .unwrap_or_else(|e| panic!("{n} routes: {e}"));
        println!("{n} routes measured in {:.0?}", started.elapsed());
        rows.push(outcome);
    }
    println!(
        "\n{:>7}  {:>10}  {:>8}  {:>24}  {:>24}  {:>16}  {:>10}  {:>10}  {:>10}",
        "routes",
        "cold start",
        "RSS rest",
        "rotation p50/p99/max",
        "with scrapes p50/p99/max",
        "scrape p50 (MB)",
        "append",
        "evaluation",
        "ratio"
    );
    for r in &rows {
        let evaluated = r.append_evaluated.map_or(f64::NAN, ms);
        println!(
            "{:>7}  {:>8.0}ms  {:>5.1}MiB  {:>6.2} / {:>6.2} / {:>6.2} ms  {:>6.2} / {:>6.2} / {:>6.2} ms  {:>7.1}ms ({:>4.1})  {:>8.0}ms  {:>8.0}ms  {:>9.2}x",
            r.routes,
            ms(r.cold_start),
            r.rss_rest,
            p(&r.rotations, 50.0),
            p(&r.rotations, 99.0),
            p(&r.rotations, 100.0),
            p(&r.rotations_scraped, 50.0),
            p(&r.rotations_scraped, 99.0),
            p(&r.rotations_scraped, 100.0),
            p(&r.scrapes, 50.0),
            r.scrape_bytes as f64 / 1e6,
            ms(r.append_served),
            evaluated,
            ms(r.append_served) / evaluated,
        );
    }
    println!(
        "\n{:>7}  {:>22}  {:>22}  {:>26}  {:>26}",
        "routes",
        "first swap after ready",
        "the next 9 (p50/max)",
        "scrape CPU, plain (bytes)",
        "scrape CPU, gzip (bytes)"
    );
    for r in &rows {
        let [(plain_cpu, plain_bytes), (gzip_cpu, gzip_bytes)] = r.scrape_cpu;
        println!(
            "{:>7}  {:>20.2}ms  {:>9.2} / {:>6.2} ms  {:>15.1}ms ({:>6.2} MB)  {:>15.1}ms ({:>6.2} MB)",
            r.routes,
            r.after_ready.first().copied().map_or(f64::NAN, ms),
            p(r.after_ready.get(1..).unwrap_or(&[]), 50.0),
            p(r.after_ready.get(1..).unwrap_or(&[]), 100.0),
            ms(plain_cpu),
            plain_bytes as f64 / 1e6,
            ms(gzip_cpu),
            gzip_bytes as f64 / 1e6,
        );
    }
    println!(
        "\n{:>7}  {:>12}  {:>12}  {:>14}  {:>22}",
        "routes", "agent RSS", "sozu main", "sozu worker", "agent per route"
    );
    for r in &rows {
        // Against the smallest size of the same run: what each route adds.
        let per_route = rows.first().map_or(f64::NAN, |small| {
            (r.rss_rest - small.rss_rest) * 1024.0 / (r.routes - small.routes) as f64
        });
        println!(
            "{:>7}  {:>9.1}MiB  {:>9.1}MiB  {:>11.1}MiB  {:>19.1}KiB",
            r.routes, r.rss_rest, r.sozu_rss_rest.0, r.sozu_rss_rest.1, per_route
        );
    }
    if let (Some(first), Some(last)) = (rows.first(), rows.last()) {
        println!(
            "rotation at {} routes / at {}: p50 {:.2}x, p99 {:.2}x; with scrapes, p50 {:.2}x",
            last.routes,
            first.routes,
            p(&last.rotations, 50.0) / p(&first.rotations, 50.0),
            p(&last.rotations, 99.0) / p(&first.rotations, 99.0),
            p(&last.rotations_scraped, 50.0) / p(&first.rotations, 50.0),
        );
    }
    println!(
        "rotation: from the AtomicWriter swap to the first handshake presenting the new certificate, \
         {rotations} swaps of hosts drawn from a seed, 50 ms apart; with scrapes: {rotations} more while \
         /metrics is fetched back to back (gzip, as Prometheus asks); first swap after ready: swaps \
         started the moment /readyz answered 200, 50 ms apart; scrape CPU: the agent's user + system \
         time per scrape, averaged over 20, after one request to every route (traffic families \
         included); append: from the workspace with one more route renamed \
         into place to that host's first handshake; evaluation: the agent's own, of that workspace \
         (its log); ratio = append / evaluation; RSS: resident memory after the start and 10 s idle, \
         the agent's beside sozu's main process and its worker at the same moment; per route: \
         the agent's growth over the smallest size, divided by the routes added"
    );
}

/// Starts a contender and waits for it to serve the first certificate.
fn start(
    contender: &Contender,
    pairs: &[workload::Pair],
) -> Result<(Backend, Box<dyn System>), String> {
    (contender.version)()?;
    let backend = Backend::start("app");
    let system = (contender.start)(&Start {
        backend: &backend,
        first: &pairs[0],
    })?;
    wait_serving(system.https(), &pairs[0].fingerprint, START_TIMEOUT)
        .map_err(|e| format!("{e}; logs: {}", system.logs()))?;
    Ok((backend, system))
}

/// All systems run at once; they take turns, `--rounds` turns of `rotations / rounds` each under
/// load, so that noise from the rest of the machine spreads over all of them. Prints the table.
fn compare(args: &Args, pairs: &[workload::Pair], contenders: &[Contender]) -> Vec<Row> {
    let workload = workload(args, true);
    let mut running: Vec<_> = contenders
        .iter()
        .map(|c| {
            let started = start(c, pairs);
            if let Err(why) = &started {
                println!("{}: skipped: {why}", c.name);
            }
            (started, Outcome::default())
        })
        .collect();
    let rounds = args.rounds.clamp(1, args.rotations.max(1));
    for round in 0..rounds {
        let generations =
            round * args.rotations / rounds + 1..=(round + 1) * args.rotations / rounds;
        println!(
            "round {} of {rounds}: rotations {generations:?}, each system in turn",
            round + 1
        );
        for (started, outcome) in &mut running {
            if let Ok((_, system)) = started {
                outcome.merge(workload::run(
                    system.as_ref(),
                    pairs,
                    generations.clone(),
                    &workload,
                ));
            }
        }
    }
    let rows: Vec<Row> = contenders
        .iter()
        .zip(running)
        .map(|(c, (started, outcome))| Row {
            name: c.name.to_owned(),
            version: (c.version)().unwrap_or_else(|_| "–".into()),
            result: started.map(|_| outcome).map_err(|e| {
                e.lines()
                    .next()
                    .unwrap_or_default()
                    .chars()
                    .take(300)
                    .collect()
            }),
        })
        .collect();
    println!("\n{}", report::text(&rows));
    rows
}

/// The peers' table and plot, into `--out`.
fn write_report(args: &Args, rows: &[Row]) {
    let machine = report::machine();
    let date = std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%d"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    let svg = report::svg(
        rows,
        &format!(
            "Certificate rotation, {} rotations under load",
            args.rotations
        ),
    )
    .unwrap_or_else(|e| panic!("plot: {e}"));
    let markdown = format!(
        "<!-- written by bench/run-peers (cargo bench -p private-ingress-tests --bench rotation -- --peers); do not edit -->\n\
         Measured {date} on {machine}; {rotations} rotations per system, the same certificates \
         (ECDSA P-256) and swaps for all, the systems taking turns in {rounds} rounds; after each \
         switch, {after} ms of probes; HTTPS load: one thread with a new connection per request \
         and 2 kept-alive connections, each pausing 2 ms between requests.\n\n{table}\n![Rotation latency distributions](rotation-peers.svg)\n",
        rotations = args.rotations,
        rounds = args.rounds.clamp(1, args.rotations.max(1)),
        after = args.after_switch.as_millis(),
        table = report::markdown(rows),
    );
    std::fs::create_dir_all(&args.out).expect("create the output directory");
    let md_path = args.out.join("rotation-peers.md");
    let svg_path = args.out.join("rotation-peers.svg");
    std::fs::write(&md_path, markdown).expect("write the table");
    std::fs::write(&svg_path, svg).expect("write the plot");
    println!("machine: {machine}");
    println!("wrote {} and {}", md_path.display(), svg_path.display());
}
