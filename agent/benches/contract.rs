//! Cost of checking a workspace: `private-ingress check` on generated workspaces of 10, 1,000 and
//! 10,000 routes, beside the same file evaluated by Nickel without the contract (the floor any
//! contract adds to) in the same run. Prints figures and ratios; asserts nothing.
//!
//!     cargo bench -p private-ingress --bench contract
//!
//! Targets (see docs/benchmarks.md): 1,000 routes ≤ 200 ms; 10,000 routes ≤ 2 s and ≤ 300 MiB.

use std::path::Path;
use std::process::Command;
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
        "{:>7}  {:>12}  {:>14}  {:>16}  {:>9}  {:>10}",
        "routes", "check (wall)", "in-process", "no contract", "ratio", "peak RSS"
    );
    // Sizes run in ascending order: RUSAGE_CHILDREN's max RSS is then the largest size's so far.
    for routes in SIZES {
        let path = dir.path().join(format!("ws-{routes}.ncl"));
        std::fs::write(&path, workspace(routes)).expect("write workspace");
        let runs = if routes >= 10_000 { 3 } else { 7 };

        let check = median(runs, || {
            let status = Command::new(exe)
                .arg("check")
                .arg(&path)
                .stdout(std::process::Stdio::null())
                .status()
                .expect("run private-ingress check");
            assert!(status.success(), "check failed on {}", path.display());
        });
        let peak_rss = children_peak_rss_mib();
        let in_process = median(runs, || {
            private_ingress::contract::evaluate(&path).expect("valid workspace");
        });
        let baseline = median(runs, || evaluate_without_contract(&path));

        println!(
            "{:>7}  {:>9.1} ms  {:>11.1} ms  {:>13.1} ms  {:>8.2}x  {:>6.0} MiB",
            routes,
            ms(check),
            ms(in_process),
            ms(baseline),
            in_process.as_secs_f64() / baseline.as_secs_f64(),
            peak_rss
        );
    }
    println!(
        "ratio = in-process evaluation with the contract / the same file evaluated without it"
    );
}

/// Routes the way an operator writes them: a DNS upstream and a port each, default path.
fn workspace(routes: usize) -> String {
    let mut out = String::from(
        "{\n  zone = \"in.example.org\",\n  cluster_issuer = \"internal-ca\",\n  routes = [\n",
    );
    for i in 0..routes {
        out.push_str(&format!(
            "    {{ host = \"svc{i}.in.example.org\", upstream = \"svc{i}.team{}.svc.cluster.local\", port = {} }},\n",
            i % 50,
            1024 + i % 60_000
        ));
    }
    out.push_str("  ],\n}\n");
    out
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
