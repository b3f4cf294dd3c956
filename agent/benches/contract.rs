//! Cost of checking a workspace: `private-ingress check` on generated workspaces of 10, 1,000 and
//! 10,000 routes, beside the same file evaluated by Nickel without the contract (the floor any
//! contract adds to) in the same run. Each size is measured three times: routes written with
//! `upstream` and `port` only ("plain"); the same with one of the newer fields `drain`, `hsts`,
//! `health` and `upstreams` in turn ("one field"); and routes using several of them, with weighted
//! upstreams, health checks of both modes and HSTS policies ("fields"). The per-route cost of each
//! is compared with the plain one measured just before. Prints figures and ratios; asserts nothing.
//!
//!     cargo bench -p private-ingress --bench contract
//!
//! Targets (see docs/benchmarks.md): 1,000 routes ≤ 200 ms; 10,000 routes ≤ 2 s and ≤ 300 MiB;
//! a route using the newer fields within 1.5× the in-process cost of a plain one.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nickel_lang_core::eval::cache::CacheImpl;
use nickel_lang_core::program::{Program, ProgramBuilder};

const SIZES: [usize; 3] = [10, 1_000, 10_000];

fn main() {
    // `cargo bench` passes `--bench`; a filter argument is not meaningful here.
    let dir = tempfile::tempdir().expect("temporary directory");
    let exe = env!("CARGO_BIN_EXE_private-ingress");
    println!("workspace check cost (median of runs; RSS is the peak of the check process tree)");
    println!(
        "{:>7}  {:>9}  {:>12}  {:>12}  {:>12}  {:>7}  {:>9}  {:>8}  {:>8}",
        "routes",
        "kind",
        "check (wall)",
        "in-process",
        "no contract",
        "ratio",
        "per route",
        "vs plain",
        "peak RSS"
    );
    // Sizes run in ascending order, plain first: RUSAGE_CHILDREN's max RSS is the largest run's
    // so far, so a row's figure is only its own where it exceeds every row above it.
    for routes in SIZES {
        let mut plain_per_route = None;
        for (kind, route) in [
            ("plain", plain_route as fn(usize) -> String),
            ("one field", one_field_route),
            ("fields", new_field_route),
        ] {
            let path = dir.path().join(format!("ws-{kind}-{routes}.ncl"));
            std::fs::write(&path, workspace(routes, route)).expect("write workspace");
            let runs = if routes >= 10_000 { 3 } else { 7 };

            // `check`'s warnings (no `allowed_sources`) are shown only if it fails. Its output is
            // not captured: captured, its peak RSS came out as this process's (305 MiB where the
            // same check alone peaks at 209 MiB).
            let check = median(runs, || {
                let status = Command::new(exe)
                    .arg("check")
                    .arg(&path)
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .expect("run private-ingress check");
                if !status.success() {
                    let output = Command::new(exe).arg("check").arg(&path).output();
                    panic!("check failed on {}: {output:?}", path.display());
                }
            });
            let peak_rss = children_peak_rss_mib();
            let in_process = median(runs, || {
                private_ingress::contract::evaluate(&path).expect("valid workspace");
            });
            let baseline = median(runs, || evaluate_without_contract(&path));
            let per_route = in_process.as_secs_f64() / routes as f64;
            let vs_plain = *plain_per_route.get_or_insert(per_route);

            println!(
                "{:>7}  {:>9}  {:>9.1} ms  {:>9.1} ms  {:>9.1} ms  {:>6.2}x  {:>6.1} µs  {:>7.2}x  {:>4.0} MiB",
                routes,
                kind,
                ms(check),
                ms(in_process),
                ms(baseline),
                in_process.as_secs_f64() / baseline.as_secs_f64(),
                per_route * 1e6,
                per_route / vs_plain,
                peak_rss
            );
        }
    }
    println!(
        "ratio = in-process evaluation with the contract / the same file evaluated without it"
    );
    println!("vs plain = in-process cost per route / that of plain routes of the same size");
}

fn workspace(routes: usize, route: fn(usize) -> String) -> String {
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
    let mut times: Vec<Duration> = (0..runs)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed()
        })
        .collect();
    times.sort();
    times[runs / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn children_peak_rss_mib() -> f64 {
    let usage = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN)
        .expect("getrusage");
    usage.max_rss() as f64 / 1024.0
}
