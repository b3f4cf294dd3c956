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
//!     cargo bench -p private-ingress-tests --bench reads -- 1000 10000 [--seconds 20]
//!     PRIVATE_INGRESS_BASELINE_BIN=old/private-ingress cargo bench -p private-ingress-tests \
//!         --bench reads -- 1000 10000

use std::time::Duration;

use private_ingress_tests::bench::reads::{self, host};
use private_ingress_tests::bench::{ours, workload::Pair};
use private_ingress_tests::live::Backend;

fn main() {
    let mut sizes = Vec::new();
    let mut seconds = 20u64;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--seconds" => {
                seconds = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .expect("--seconds S")
            }
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
