//! A long soak: `cargo bench -p private-ingress-tests --bench soak -- [--seed N]... [--minutes M]
//! [--hosts H] [--resync S]`. Runs each seed in turn for M minutes (default 10) and prints what
//! each did and found, and how long after each sozu restart every route was served again; exits
//! non-zero when a checkpoint failed. `--resync S` gives the agent `--resync-interval S` (off by
//! default, so that a lost event shows). See `private_ingress_tests::soak`.

use std::time::Duration;

use private_ingress_tests::bench::workload::percentile;
use private_ingress_tests::soak::{run, SoakConfig};

fn main() {
    let mut seeds = Vec::new();
    let mut minutes = 10.0_f64;
    let mut hosts = 20;
    let mut resync = 0;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().unwrap_or_else(|| panic!("{arg} needs a value"));
        match arg.as_str() {
            "--seed" => seeds.push(value().parse().expect("--seed takes a number")),
            "--minutes" => minutes = value().parse().expect("--minutes takes a number"),
            "--hosts" => hosts = value().parse().expect("--hosts takes a number"),
            "--resync" => resync = value().parse().expect("--resync takes seconds"),
            // cargo bench passes --bench.
            _ => {}
        }
    }
    if seeds.is_empty() {
        seeds.push(1);
    }
    let mut failed = false;
    for seed in seeds {
        let report = run(&SoakConfig {
            seed,
            duration: Duration::from_secs_f64(minutes * 60.0),
            hosts,
            resync,
        });
        println!(
            "seed {seed}: {minutes} min, {hosts} hosts, resync every {resync} s (0: off), {} checkpoints, slowest convergence {:?}",
            report.checkpoints, report.slowest_convergence
        );
        let mut waits = report.convergences.clone();
        waits.sort();
        let at = |q: f64| {
            let i = ((waits.len() as f64 * q) as usize).min(waits.len().saturating_sub(1));
            waits.get(i).map_or(0.0, |d| d.as_secs_f64() * 1e3)
        };
        println!(
            "  convergence p50 {:.0} ms, p90 {:.0} ms, p99 {:.0} ms",
            at(0.5),
            at(0.9),
            at(0.99)
        );
        let after = &report.after_sozu_restart;
        let ms = |q| percentile(after, q).map_or(f64::NAN, |d| d.as_secs_f64() * 1e3);
        println!(
            "  after a sozu restart, every route served again: {} times, p50 {:.0} ms, max {:.0} ms",
            after.len(),
            ms(50.0),
            ms(100.0)
        );
        println!("  actions: {:?}", report.actions);
        println!(
            "  tcp stream: {} bytes echoed whole, opened {} time(s) (once, and after each sozu kill)",
            report.stream_bytes, report.stream_opened
        );
        println!(
            "  websockets: {} messages echoed, opened {} time(s) (once, and after each sozu kill)",
            report.websocket_messages, report.websockets_opened
        );
        if let Some((after, actions, log)) = &report.slowest_restart {
            println!(
                "  the slowest sozu restart ({:.0} ms) after: {}",
                after.as_secs_f64() * 1e3,
                actions.join("\n                     ")
            );
            println!("  the agent's log from that restart to the checkpoint:\n{log}");
        }
        println!(
            "  the slowest after: {}",
            report.slowest_after.join("\n                     ")
        );
        for failure in &report.failures {
            println!("  FAILED: {failure}");
        }
        failed |= !report.failures.is_empty();
    }
    if failed {
        std::process::exit(1);
    }
}
