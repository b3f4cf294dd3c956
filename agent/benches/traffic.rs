//! The agent's own cost per traffic record, and a scrape's cost as routes with traffic grow:
//! decoding a datagram, counting it, and formatting its access-log line, per record; rendering
//! the traffic families of 10, 1,000 and 10,000 routes that each had requests, against
//! rendering one route's (the baseline, in the same run). Prints figures; asserts nothing.
//!
//!     cargo bench -p private-ingress --bench traffic
//!
//! The end-to-end cost (through sozu, with the agent pinned to a core) is the integration
//! crate's `traffic` bench.

use std::hint::black_box;
use std::time::{Duration, Instant};

use private_ingress::api::metrics::write_traffic;
use private_ingress::traffic::{access_log, record, stats};
use private_ingress::workspace::{route_id, Route, RouteUpstream, Upstream, Workspace};
use prost::Message;
use sozu_command_lib::proto::command::{
    protobuf_endpoint, HttpEndpoint, ProtobufAccessLog, ProtobufEndpoint, Uint128,
};

const SIZES: [usize; 3] = [10, 1_000, 10_000];

fn host(i: usize) -> String {
    format!("svc{i}.in.example.org")
}

/// A record as sozu sends it for a request to route `i`.
fn datagram(i: usize, status: u32) -> Vec<u8> {
    let log = ProtobufAccessLog {
        request_id: Uint128 {
            low: 1,
            high: i as u64,
        },
        cluster_id: Some(route_id(&host(i), "/")),
        backend_id: Some(format!("{}-10.0.0.1:8080", route_id(&host(i), "/"))),
        protocol: "HTTPS".into(),
        endpoint: ProtobufEndpoint {
            inner: Some(protobuf_endpoint::Inner::Http(HttpEndpoint {
                method: Some("GET".into()),
                authority: Some(host(i)),
                path: Some("/api/v1/query?query=up&token=abc".into()),
                status: Some(status),
                reason: None,
            })),
        },
        service_time: 400,
        request_time: Some(1_800 + (i as u64 % 7) * 10_000),
        response_time: Some(1_200),
        bytes_in: 420,
        bytes_out: 9_000,
        user_agent: Some("Mozilla/5.0 (X11; Linux x86_64)".into()),
        tag: "WRK-00".into(),
        time: Uint128::from(1_800_000_000_000_000_000u128),
        tls_version: Some("TLSv1.3".into()),
        tls_cipher: Some("TLS13_AES_128_GCM_SHA256".into()),
        tls_sni: Some(host(i)),
        x_request_id: Some("01KB0000000000000000000000".into()),
        ..Default::default()
    };
    let mut d = log.encode_length_delimited_to_vec();
    d.extend_from_slice(&[0, 0]);
    d
}

fn workspace(routes: usize) -> Workspace {
    let mut ws: Workspace = serde_json::from_value(serde_json::json!({
        "zone": "in.example.org",
        "listeners": { "https": "0.0.0.0:443", "http": "0.0.0.0:80" },
        "tls_rotation": "csi_driver",
        "cluster_issuer": "ca",
        "tls_dir": "/etc/sozu/tls",
        "routes": [],
        "lb_ip": null,
        "allowed_sources": null,
        "deploy": serde_json::to_value(private_ingress::workspace::Deploy::default()).expect("deploy"),
    }))
    .expect("a workspace");
    ws.routes = (0..routes)
        .map(|i| {
            Route::http(
                &host(i),
                "/",
                vec![RouteUpstream {
                    upstream: Upstream::Ip {
                        address: "10.0.0.1:8080".parse().expect("an address"),
                    },
                    weight: 1,
                    drain: false,
                }],
            )
        })
        .collect();
    ws
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    println!("traffic: the agent's part per record, and a scrape as routes with traffic grow");
    let table = stats::Table::default().follow(&workspace(1_000));
    let datagrams: Vec<Vec<u8>> = (0..1_000).map(|i| datagram(i, 200)).collect();
    let n = 200_000;
    let none = |_: &str| Vec::new();
    let mut decode = Vec::new();
    let mut count = Vec::new();
    let mut line = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        for i in 0..n {
            black_box(record::decode(&datagrams[i % 1_000]).ok());
        }
        decode.push(t.elapsed() / n as u32);
        let records: Vec<_> = datagrams
            .iter()
            .map(|d| record::decode(d).expect("a record"))
            .collect();
        let t = Instant::now();
        for i in 0..n {
            let r = &records[i % 1_000];
            table.of(r).observe(r, &none);
        }
        count.push(t.elapsed() / n as u32);
        let t = Instant::now();
        for i in 0..n {
            let r = &records[i % 1_000];
            black_box(access_log::line(
                r,
                Some(("pi-x", "x.in.example.org")),
                false,
            ));
        }
        line.push(t.elapsed() / n as u32);
    }
    let (decode, count, line) = (median(decode), median(count), median(line));
    println!(
        "  per record: decode {decode:?}, count {count:?}, access-log line {line:?}; total {:?} \
         (one core takes {:.0} records/s)",
        decode + count + line,
        1.0 / (decode + count + line).as_secs_f64()
    );

    println!(
        "  {:>7}  {:>12}  {:>10}  {:>14}",
        "routes", "scrape", "bytes", "per route"
    );
    let mut base = None;
    for routes in [1].into_iter().chain(SIZES) {
        let table = stats::Table::default().follow(&workspace(routes));
        for i in 0..routes {
            for status in [200, 404, 500] {
                let d = datagram(i, status);
                let r = record::decode(&d).expect("a record");
                table.of(&r).observe(&r, &none);
            }
        }
        let figures = stats::StreamFigures::default();
        let mut bytes = 0;
        let runs = if routes >= 10_000 { 5 } else { 21 };
        let took = median(
            (0..runs)
                .map(|_| {
                    let t = Instant::now();
                    let mut out = String::new();
                    write_traffic(&mut out, &table.snapshot(), &figures);
                    bytes = out.len();
                    t.elapsed()
                })
                .collect(),
        );
        let per_route = took / routes as u32;
        let base = *base.get_or_insert(per_route);
        println!(
            "  {routes:>7}  {took:>12?}  {bytes:>10}  {per_route:>10?} ({:.2}× one route's)",
            per_route.as_secs_f64() / base.as_secs_f64()
        );
    }
}
