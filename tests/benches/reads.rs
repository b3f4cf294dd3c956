//! Reads that fit any buffer: sozu's listings whole and in pieces, and the agent's resync reads
//! against a sozu whose command buffer is sized for the workspace and one with sozu's default.
//! Prints figures; asserts nothing.
//!
//! For each size: the agent serving that many routes (each with its own certificate) with a
//! resync every 2 s; first what each of sozu's listings costs (its answer on the wire, the p50
//! of its time from a client of sozu's socket, and how many pieces a whole read needs); then,
//! for this build and, with `PRIVATE_INGRESS_BASELINE_BIN`, another in the same run, the agent's
//! reads of sozu's state over `--seconds` (p50 and max, from its debug log), with each buffer.
//!
//! With `--scrapes`, only what `/metrics` scrapes cost each build at each size (20 plain, then 20
//! gzip, one after the other, a resync every 2 s meanwhile): p50 and max of their wall time, the
//! agent's CPU per scrape, and the body's size.
//!
//!     cargo bench -p private-ingress-tests --bench reads -- 1000 10000 [--seconds 20]
//!     cargo bench -p private-ingress-tests --bench reads -- --scrapes 10000
//!     PRIVATE_INGRESS_BASELINE_BIN=old/private-ingress cargo bench -p private-ingress-tests \
//!         --bench reads -- 1000 10000

use std::time::Duration;

use private_ingress_tests::bench::reads::{self, host};
use private_ingress_tests::bench::{ours, workload::Pair};
use private_ingress_tests::live::Backend;

fn main() {
    let mut sizes = Vec::new();
    let mut seconds = 20u64;
    let mut scrapes_only = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--seconds" => {
                seconds = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .expect("--seconds S")
            }
            "--scrapes" => scrapes_only = true,
            "--bench" => {}
            other => sizes.push(other.parse::<usize>().expect("a number of routes")),
        }
    }
    if sizes.is_empty() {
        sizes = vec![1_000, 10_000];
    }
    let baseline = ours::baseline_bin();
    let backend = Backend::start("app");
    for n in sizes {
        let pairs: Vec<Pair> = (0..n).map(|i| Pair::new(&host(i))).collect();
        let hosts: Vec<(String, &Pair)> = pairs
            .iter()
            .enumerate()
            .map(|(i, p)| (host(i), p))
            .collect();
        if scrapes_only {
            scrapes(n, &hosts, baseline.as_deref(), backend.address);
            continue;
        }

        println!("\n{n} routes: sozu's listings (its buffer sized for the workspace)\n");
        println!(
            "| listing | answer | p50 | pieces for a whole read | if read one after the other |"
        );
        println!("|---|---:|---:|---:|---:|");
        let served = reads::serve(None, &hosts, backend.address, false).expect("serve");
        for l in reads::listings(&served, n, &pairs).expect("listings") {
            let p50 = l.p50.as_secs_f64() * 1e3;
            println!(
                "| {} | {:.2} MB | {p50:.2} ms | {} | {:.0} ms |{}",
                l.name,
                l.bytes as f64 / 1e6,
                l.pieces,
                p50 * l.pieces as f64,
                l.error.map(|e| format!(" failed: {e}")).unwrap_or_default()
            );
        }
        drop(served);

        println!("\n{n} routes: the agent's reads of sozu's state, a resync every 2 s over {seconds} s\n");
        println!(
            "| agent | sozu's buffer | reads | p50 | max | resyncs begun | error shown | pieces |"
        );
        println!("|---|---|---:|---:|---:|---:|---|---|");
        let builds = std::iter::once(("this build", None))
            .chain(baseline.as_deref().map(|b| ("baseline", Some(b))));
        for (name, bin) in builds {
            for (buffer, default_buffer) in [("sized (rendered)", false), ("default, 2 MB", true)] {
                let served = match reads::serve(bin, &hosts, backend.address, default_buffer) {
                    Ok(served) => served,
                    Err(e) => {
                        println!("| {name} | {buffer} | did not start: {e} |");
                        continue;
                    }
                };
                let r = reads::resyncs(&served, Duration::from_secs(seconds));
                let mut ms = r.reads.clone();
                ms.sort_by(f64::total_cmp);
                let p50 = ms.get(ms.len().saturating_sub(1) / 2).copied();
                let show = |v: Option<f64>| v.map_or("–".into(), |v| format!("{v:.0} ms"));
                println!(
                    "| {name} | {buffer} | {} | {} | {} | {} | {} | {} |",
                    ms.len(),
                    show(p50),
                    show(ms.last().copied()),
                    r.resyncs,
                    r.last_error
                        .map(|e| e.chars().take(90).collect::<String>())
                        .unwrap_or_else(|| "none".into()),
                    if r.pieces.is_empty() {
                        "none".into()
                    } else {
                        r.pieces.join("; ")
                    },
                );
            }
        }
    }
}

/// The scrapes table at `n` routes: the baseline first (when given), then this build.
fn scrapes(
    n: usize,
    hosts: &[(String, &Pair)],
    baseline: Option<&std::path::Path>,
    backend: std::net::SocketAddr,
) {
    const COUNT: usize = 20;
    println!("\n{n} routes: /metrics, {COUNT} scrapes each way, one after the other\n");
    println!("| agent | plain p50 / max | CPU per scrape | bytes | gzip p50 / max | CPU per scrape | bytes |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let builds = baseline
        .map(|b| ("baseline", Some(b)))
        .into_iter()
        .chain(std::iter::once(("this build", None)));
    for (name, bin) in builds {
        let measured = reads::serve(bin, hosts, backend, false)
            .and_then(|served| reads::scrapes(&served, COUNT));
        let s = match measured {
            Ok(s) => s,
            Err(e) => {
                println!("| {name} | failed: {e} |");
                continue;
            }
        };
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let cells: Vec<String> = (0..2)
            .map(|k| {
                let mut took = s.took[k].clone();
                took.sort();
                format!(
                    "{:.1} / {:.1} ms | {:.1} ms | {:.2} MB",
                    ms(took[took.len().saturating_sub(1) / 2]),
                    ms(took[took.len() - 1]),
                    ms(s.cpu[k]),
                    s.bytes[k] as f64 / 1e6
                )
            })
            .collect();
        println!("| {name} | {} | {} |", cells[0], cells[1]);
    }
}
