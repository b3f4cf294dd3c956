//! What `top` costs the agent: the agent's CPU over a while with sozu's traffic flowing and no
//! client, then the same with one `top` attached (on a pseudo-terminal, `--refresh` 2 s by
//! default), at 10 and 10,000 routes in one run; beside it, the reference the target is stated
//! in, one Prometheus scrape (gzip), and what one `/v1/state` costs the agent answered whole and
//! answered `304 Not Modified`. Prints figures; asserts nothing.
//!
//!     cargo bench -p private-ingress-tests --bench top [-- 10 10000] [--seconds 60] [--refresh 2]

use std::time::{Duration, Instant};

use private_ingress_tests::bench::top::cost;

fn main() {
    let mut sizes = Vec::new();
    let mut seconds = 60u64;
    let mut refresh = 2.0f64;
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().unwrap_or_else(|| panic!("{name} needs a value"));
        match arg.as_str() {
            "--seconds" => seconds = value("--seconds").parse().expect("--seconds N"),
            "--refresh" => refresh = value("--refresh").parse().expect("--refresh S"),
            "--bench" => {}
            size if size.parse::<usize>().is_ok() => sizes.push(size.parse().unwrap_or(10)),
            other => panic!("unknown argument {other}; use sizes, --seconds N, --refresh S"),
        }
    }
    if sizes.is_empty() {
        sizes = vec![10, 10_000];
    }
    let _ = private_ingress_tests::agent_bin();
    let measured = Duration::from_secs(seconds);
    let refresh = Duration::from_secs_f64(refresh);
    let mut rows = Vec::new();
    for n in sizes {
        let started = Instant::now();
        let row = cost(n, measured, refresh).unwrap_or_else(|e| panic!("{n} routes: {e}"));
        println!("{n} routes measured in {:.0?}", started.elapsed());
        rows.push(row);
    }
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let per_minute = |d: Duration, over: Duration| ms(d) * 60.0 / over.as_secs_f64();
    println!(
        "\n{:>7}  {:>14}  {:>14}  {:>12}  {:>13}  {:>11}  {:>16}  {:>11}  {:>12}",
        "routes",
        "agent, no top",
        "agent, top",
        "top adds",
        "per refresh",
        "a scrape",
        "/v1/state whole",
        "/v1/state 304",
        "top itself"
    );
    for r in &rows {
        let added = per_minute(r.attached, r.measured) - per_minute(r.idle, r.measured);
        let refreshes = r.measured.as_secs_f64() / r.refresh.as_secs_f64();
        println!(
            "{:>7}  {:>8.0} ms/min  {:>8.0} ms/min  {:>6.0} ms/min  {:>10.2} ms  {:>8.2} ms  {:>7.2} ms ({:>4.1} MB)  {:>8.2} ms  {:>6.0} ms/min",
            r.routes,
            per_minute(r.idle, r.measured),
            per_minute(r.attached, r.measured),
            added,
            added / 60.0 * r.measured.as_secs_f64() / refreshes,
            ms(r.scrape),
            ms(r.state_full),
            r.state_bytes as f64 / 1e6,
            ms(r.state_304),
            per_minute(r.top_itself, r.measured),
        );
    }
    // (A ratio only when the smaller size's cost stood out of its 10 ms ticks.)
    if let (Some(first), Some(last)) = (rows.first(), rows.last()) {
        if per_minute(first.attached, first.measured) <= per_minute(first.idle, first.measured) {
            println!(
                "at {} routes, top's cost is within the measure's noise",
                first.routes
            );
        } else {
            println!(
                "the agent's cost of top at {} routes / at {}: {:.2}x",
                last.routes,
                first.routes,
                (per_minute(last.attached, last.measured) - per_minute(last.idle, last.measured))
                    / (per_minute(first.attached, first.measured)
                        - per_minute(first.idle, first.measured))
                    .max(1e-9)
            );
        }
    }
    println!(
        "agent: its CPU (user + system, 10 ms ticks) over {seconds} s with sozu's traffic flowing \
         (about {:.0} requests a second spread over the routes, so that the state changes at every \
         read), then {seconds} s more with one top attached (refresh {:.1} s, on a 120x40 \
         pseudo-terminal); per refresh: what top adds divided by its reads; a scrape: /metrics \
         gzip, averaged over 20; /v1/state whole: after a change, averaged over 10; 304: with the \
         entity tag sent back, averaged over 500; top itself: top's own CPU while attached",
        rows.first().map_or(0.0, |r| r.load_rate),
        refresh.as_secs_f64()
    );
}
