//! Cost of checking a workspace: `private-ingress check` on generated workspaces of 10, 1,000 and
//! 10,000 routes, beside the same file evaluated by Nickel without the contract (the floor any
//! contract adds to) in the same run. Each size is measured three times: routes written with
//! `upstream` and `port` only ("plain"); the same with one of the newer fields `drain`, `hsts`,
//! `health` and `upstreams` in turn ("one field"); and routes using several of them, with weighted
//! upstreams, health checks of both modes and HSTS policies ("fields"). The per-route cost of each
//! is compared with the plain one measured just before. Prints figures and ratios; asserts nothing.
//!
//!     cargo bench -p private-ingress --bench contract
//!     CONTRACT_BENCH_KEEP=/tmp/ws cargo bench -p private-ingress --bench contract   # keeps them
//!     CONTRACT_BENCH_BASELINE=<build> cargo bench -p private-ingress --bench contract
//!
//! With `CONTRACT_BENCH_BASELINE` (another build's binary), a second table puts this build's
//! `check` beside that build's on each file, the two taking turns, in wall time and in CPU time
//! of the process tree (the agent and its sandboxed child), which other work on the machine
//! moves less than the wall time.
//!
//! Targets (see docs/benchmarks.md): 1,000 routes ≤ 200 ms; 10,000 routes ≤ 2 s and ≤ 300 MiB;
//! a route using the newer fields within 1.5× the in-process cost of a plain one.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nickel_lang_core::eval::cache::CacheImpl;
use nickel_lang_core::program::{Program, ProgramBuilder};

const SIZES: [usize; 3] = [10, 1_000, 10_000];

/// Writes the `i`th route of a generated workspace.
type RouteOf = fn(usize) -> String;

/// The kinds of routes measured at each size, plain first: the others are compared with it.
const KINDS: [(&str, RouteOf); 3] = [
    ("plain", plain_route),
    ("one field", one_field_route),
    ("fields", new_field_route),
];

fn main() {
    // `cargo bench` passes `--bench`; a filter argument is not meaningful here.
    let dir = tempfile::tempdir().expect("temporary directory");
    // `CONTRACT_BENCH_KEEP=<dir>` writes the workspaces there too, to profile one of them alone.
    let keep = std::env::var_os("CONTRACT_BENCH_KEEP").map(std::path::PathBuf::from);
    let exe = env!("CARGO_BIN_EXE_private-ingress");

    // Every `check` first, while this process is small: a child's peak RSS counts its parent's
    // until it executes `check` (the two share their memory until then), and the in-process
    // evaluations below grow this process by hundreds of MiB.
    let mut checks = Vec::new();
    let mut files = Vec::new();
    for routes in SIZES {
        for (kind, route) in KINDS {
            let path = dir.path().join(format!("ws-{kind}-{routes}.ncl"));
            std::fs::write(&path, workspace(routes, route)).expect("write workspace");
            if let Some(keep) = &keep {
                std::fs::create_dir_all(keep).expect("create CONTRACT_BENCH_KEEP");
                std::fs::copy(&path, keep.join(path.file_name().expect("a file name")))
                    .expect("copy the workspace to CONTRACT_BENCH_KEEP");
            }
            let mut peak_rss = 0.0_f64;
            let check = median(runs(routes), || {
                peak_rss = peak_rss.max(check_once(exe, &path).peak_rss_mib);
            });
            files.push((routes, kind, path.clone()));
            checks.push((routes, kind, path, check, peak_rss));
        }
    }

    println!("workspace check cost (median of runs; RSS is the peak of the check process tree)");
    println!(
        "{:>7}  {:>9}  {:>12}  {:>10}  {:>11}  {:>6}  {:>9}  {:>8}  {:>9}  {:>8}  {:>8}",
        "routes",
        "kind",
        "check (wall)",
        "in-process",
        "no contract",
        "ratio",
        "per route",
        "vs plain",
        "contract",
        "vs plain",
        "peak RSS"
    );
    let mut plain = None;
    for (routes, kind, path, check, peak_rss) in checks {
        let in_process = median(runs(routes), || {
            private_ingress::evaluate::contract::evaluate(&path).expect("valid workspace");
        });
        let baseline = median(runs(routes), || evaluate_without_contract(&path));
        let per_route = in_process.as_secs_f64() / routes as f64;
        let contract = (in_process.as_secs_f64() - baseline.as_secs_f64()) / routes as f64;
        if kind == "plain" {
            plain = Some((per_route, contract));
        }
        let (plain_per_route, plain_contract) = plain.expect("plain routes measured first");
        println!(
            "{:>7}  {:>9}  {:>9.1} ms  {:>7.1} ms  {:>8.1} ms  {:>5.2}x  {:>6.1} µs  {:>7.2}x  {:>6.1} µs  {:>7.2}x  {:>4.0} MiB",
            routes,
            kind,
            ms(check),
            ms(in_process),
            ms(baseline),
            in_process.as_secs_f64() / baseline.as_secs_f64(),
            per_route * 1e6,
            per_route / plain_per_route,
            contract * 1e6,
            contract / plain_contract,
            peak_rss
        );
    }
    println!(
        "ratio = in-process evaluation with the contract / the same file evaluated without it"
    );
    println!("per route = in-process / routes; contract = (in-process - no contract) / routes");
    println!("vs plain = the column before it / that of plain routes of the same size");
    if let Some(baseline) = std::env::var_os("CONTRACT_BENCH_BASELINE").filter(|b| !b.is_empty()) {
        against_baseline(exe, Path::new(&baseline), &files);
    }
}

/// `check` of each file by this build (`exe`) and by `baseline`, taking turns: medians of wall
/// and CPU time, and this build's over the baseline's.
fn against_baseline(exe: &str, baseline: &Path, files: &[(usize, &str, std::path::PathBuf)]) {
    println!(
        "\ncheck against the baseline {} (the two taking turns, median of runs; CPU: the process tree's user + system)",
        baseline.display()
    );
    println!(
        "{:>7}  {:>9}  {:>11}  {:>11}  {:>6}  {:>10}  {:>10}  {:>6}",
        "routes", "kind", "wall", "baseline", "ratio", "CPU", "baseline", "ratio"
    );
    let baseline = baseline.to_string_lossy();
    for (routes, kind, path) in files {
        let mut ours = Vec::new();
        let mut theirs = Vec::new();
        for _ in 0..runs(*routes) {
            ours.push(check_once(exe, path));
            theirs.push(check_once(&baseline, path));
        }
        let wall = |v: &[Checked]| middle(v.iter().map(|c| c.wall).collect());
        let cpu = |v: &[Checked]| middle(v.iter().map(|c| c.cpu).collect());
        let (w, bw, c, bc) = (wall(&ours), wall(&theirs), cpu(&ours), cpu(&theirs));
        println!(
            "{:>7}  {:>9}  {:>8.1} ms  {:>8.1} ms  {:>5.2}x  {:>7.1} ms  {:>7.1} ms  {:>5.2}x",
            routes,
            kind,
            ms(w),
            ms(bw),
            w.as_secs_f64() / bw.as_secs_f64(),
            ms(c),
            ms(bc),
            c.as_secs_f64() / bc.as_secs_f64()
        );
    }
}

fn runs(routes: usize) -> usize {
    if routes >= 10_000 {
        3
    } else {
        7
    }
}

/// One `check`: its wall time, and the peak RSS and CPU time of its process tree.
struct Checked {
    wall: Duration,
    cpu: Duration,
    peak_rss_mib: f64,
}

/// Runs `check` on `path`. Its warnings (no `allowed_sources`) are shown only if it fails.
// The child is reaped by `wait4`, which `Child` does not offer (it gives no resource usage).
#[allow(clippy::zombie_processes)]
fn check_once(exe: &str, path: &Path) -> Checked {
    let start = Instant::now();
    let child = Command::new(exe)
        .arg("check")
        .arg(path)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("run private-ingress check");
    let (mut status, mut usage) = (0, std::mem::MaybeUninit::<libc::rusage>::zeroed());
    // SAFETY: `usage` is a valid `rusage` to write to; the child is reaped here, and `child` is
    // not waited for again.
    let pid = unsafe {
        libc::wait4(
            child.id() as libc::pid_t,
            &mut status,
            0,
            usage.as_mut_ptr(),
        )
    };
    let wall = start.elapsed();
    assert_eq!(pid, child.id() as libc::pid_t, "wait4");
    if !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
        let output = Command::new(exe).arg("check").arg(path).output();
        panic!("check failed on {}: {output:?}", path.display());
    }
    // SAFETY: written by `wait4`. Linux gives `ru_maxrss` in KiB and the times, each over the
    // child and the children it waited for.
    let usage = unsafe { usage.assume_init() };
    let time = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec.unsigned_abs())
            + Duration::from_micros(t.tv_usec.unsigned_abs())
    };
    Checked {
        wall,
        cpu: time(usage.ru_utime) + time(usage.ru_stime),
        peak_rss_mib: usage.ru_maxrss as f64 / 1024.0,
    }
}

fn workspace(routes: usize, route: RouteOf) -> String {
    let mut out = String::from(
        "{\n  zone = \"in.example.org\",\n  cluster_issuer = \"internal-ca\",\n  routes = [\n",
    );
    for i in 0..routes {
        out.push_str("    ");
        out.push_str(&route(i));
        out.push_str(",\n");
    }
    out.push_str("  ],\n}\n");
    out
}

/// A route the way an operator writes one: a DNS upstream and a port, default path.
fn plain_route(i: usize) -> String {
    format!(
        "{{ host = \"svc{i}.in.example.org\", upstream = \"svc{i}.team{}.svc.cluster.local\", port = {} }}",
        i % 50,
        1024 + i % 60_000
    )
}

/// A plain route with one of the newer fields, in turn: drained, the recommended HSTS, an HTTP
/// health check of its path, or its upstream in `upstreams`.
fn one_field_route(i: usize) -> String {
    let host = format!("svc{i}.in.example.org");
    let name = format!("svc{i}.team{}.svc.cluster.local", i % 50);
    let port = 1024 + i % 60_000;
    match i % 4 {
        0 => format!("{{ host = \"{host}\", upstream = \"{name}\", port = {port}, drain = true }}"),
        1 => format!("{{ host = \"{host}\", upstream = \"{name}\", port = {port}, hsts = true }}"),
        2 => format!(
            "{{ host = \"{host}\", upstream = \"{name}\", port = {port}, health = {{ path = \"/healthz\" }} }}"
        ),
        _ => format!("{{ host = \"{host}\", upstreams = [{{ upstream = \"{name}\", port = {port} }}] }}"),
    }
}

/// A route using several of the newer fields, in turn: a drained one with the recommended HSTS; two
/// weighted upstreams with an HTTP health check; a tcp health check and a day of HSTS; a canary
/// with a drained IP upstream and no HSTS.
fn new_field_route(i: usize) -> String {
    let host = format!("svc{i}.in.example.org");
    let name = format!("svc{i}.team{}.svc.cluster.local", i % 50);
    let port = 1024 + i % 60_000;
    match i % 4 {
        0 => format!(
            "{{ host = \"{host}\", upstream = \"{name}\", port = {port}, drain = true, hsts = true }}"
        ),
        1 => format!(
            "{{ host = \"{host}\", upstreams = [{{ upstream = \"{name}\", port = {port}, weight = 9 }}, \
             {{ upstream = \"v2-{name}\", port = {port} }}], \
             health = {{ path = \"/healthz\", interval = 5, timeout = 2, accepted_statuses = [204, \"200-299\"] }} }}"
        ),
        2 => format!(
            "{{ host = \"{host}\", upstream = \"{name}\", port = {port}, health = {{ mode = 'tcp }}, \
             hsts = {{ max_age = 86400 }} }}"
        ),
        _ => format!(
            "{{ host = \"{host}\", path_prefix = \"/app/\", upstreams = [{{ upstream = \"{name}\", port = {port}, weight = 3 }}, \
             {{ upstream = \"10.0.{}.{}\", port = 8080, drain = true }}], drain = false, hsts = false }}",
            i / 250 % 250,
            i % 250 + 1
        ),
    }
}

fn evaluate_without_contract(path: &Path) {
    let mut program: Program<CacheImpl> = ProgramBuilder::new()
        .add_path(path)
        .build()
        .expect("build program");
    program
        .eval_full_for_export()
        .map_err(|_| "evaluation failed")
        .expect("evaluate");
}

fn median(runs: usize, mut f: impl FnMut()) -> Duration {
    let times: Vec<Duration> = (0..runs)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed()
        })
        .collect();
    middle(times)
}

/// The median of `times` (the upper one of an even count).
fn middle(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
