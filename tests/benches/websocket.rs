//! What sozu adds to a WebSocket: echo round trips and throughput through sozu (wss, the route
//! the agent set up) against the same echo server reached directly, in clear (ws) and over TLS
//! it terminates itself (wss), rounds interleaved in one run. Prints figures and ratios; asserts
//! nothing.
//!
//!     cargo bench -p private-ingress-tests --bench websocket [-- --rounds 3 --messages 2000 --size 64 --connections 8]
//!
//! Each round runs two loads per path: one WebSocket sending a message and waiting for its echo
//! (latency), and `--connections` WebSockets doing the same at once (throughput). The client and
//! the server are Python's `websockets` (`tests/python/protocols.py`), so the absolute figures
//! are theirs as much as sozu's; the ratios are sozu's share, TLS included on the direct wss
//! path. The data path is sozu's release binary and the Python processes: the bench's own build
//! profile changes nothing measured (`--profile dev` skips a release build of the harness).

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use private_ingress_tests::live::{certificate, free_port, Stack};

const HOST: &str = "ws.in.example.org";

struct Args {
    rounds: usize,
    messages: u64,
    size: u64,
    connections: u64,
}

fn args() -> Args {
    let mut args = Args {
        rounds: 3,
        messages: 2000,
        size: 64,
        connections: 8,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| -> u64 {
            it.next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{name} needs a number"))
        };
        match arg.as_str() {
            "--rounds" => args.rounds = value("--rounds") as usize,
            "--messages" => args.messages = value("--messages"),
            "--size" => args.size = value("--size"),
            "--connections" => args.connections = value("--connections"),
            "--bench" => {}
            other => panic!("unknown argument {other}"),
        }
    }
    args
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("python/protocols.py")
}

/// A server of `protocols.py`, killed on drop.
struct Server(Child);

impl Server {
    fn start(args: &[&str]) -> Server {
        let mut child = Command::new("python3")
            .arg(script())
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start protocols.py (python3 with websockets: scripts/test installs it)");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("read the server's first line");
        assert_eq!(line.trim(), "ready", "the echo server did not start");
        Server(child)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[derive(Clone, Copy, Default)]
struct Figures {
    per_second: f64,
    p50_us: f64,
    p99_us: f64,
}

fn bench(port: u16, tls: bool, messages: u64, size: u64, connections: u64) -> Figures {
    let out = Command::new("python3")
        .arg(script())
        .args([
            "ws-bench",
            &port.to_string(),
            HOST,
            if tls { "tls" } else { "plain" },
            &messages.to_string(),
            &size.to_string(),
            &connections.to_string(),
        ])
        .output()
        .expect("run protocols.py ws-bench");
    assert!(
        out.status.success(),
        "ws-bench failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("ws-bench prints one JSON line");
    let f = |k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    Figures {
        per_second: f("messages_per_second"),
        p50_us: f("p50_us"),
        p99_us: f("p99_us"),
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let args = args();
    let mut stack = Stack::new();
    let tls_dir = stack.tls_dir();
    certificate(&tls_dir, HOST);
    let (clear_port, tls_port) = (free_port(), free_port());
    let crt = tls_dir.join(HOST).join("tls.crt");
    let key = tls_dir.join(HOST).join("tls.key");
    let _clear = Server::start(&["ws-server", &clear_port.to_string(), "direct"]);
    let _tls = Server::start(&[
        "ws-server",
        &tls_port.to_string(),
        "direct-tls",
        "127.0.0.1",
        "--tls",
        crt.to_str().expect("a UTF-8 path"),
        key.to_str().expect("a UTF-8 path"),
    ]);
    stack.write_workspace(&stack.workspace_text_of(
        &[format!(
            "{{ host = \"{HOST}\", upstream = \"127.0.0.1\", port = {clear_port} }}"
        )],
        "",
    ));
    stack.start_sozu();
    stack.start_agent();
    stack.wait_ready(std::time::Duration::from_secs(60));
    let sozu = stack.https.port();

    let paths: [(&str, u16, bool); 3] = [
        ("direct ws", clear_port, false),
        ("direct wss", tls_port, true),
        ("through sozu (wss)", sozu, true),
    ];
    // Warm every path once.
    for (_, port, tls) in paths {
        bench(port, tls, 100, args.size, 1);
    }
    let mut latency: Vec<Vec<Figures>> = vec![Vec::new(); paths.len()];
    let mut throughput: Vec<Vec<Figures>> = vec![Vec::new(); paths.len()];
    for round in 0..args.rounds {
        for (i, (name, port, tls)) in paths.iter().enumerate() {
            let one = bench(*port, *tls, args.messages, args.size, 1);
            let many = bench(
                *port,
                *tls,
                args.messages / args.connections.max(1),
                args.size,
                args.connections,
            );
            println!(
                "round {round}: {name:<20} 1 connection: p50 {:>6.0} µs, p99 {:>6.0} µs; \
                 {} connections: {:>7.0} messages/s",
                one.p50_us, one.p99_us, args.connections, many.per_second
            );
            latency[i].push(one);
            throughput[i].push(many);
        }
    }
    println!(
        "\nWebSocket echo, {} B messages, median of {} rounds:",
        args.size, args.rounds
    );
    println!(
        "{:<20} {:>10} {:>10} {:>16}",
        "path",
        "p50 µs",
        "p99 µs",
        format!("msg/s ({} conn)", args.connections)
    );
    let summary: Vec<(f64, f64, f64)> = (0..paths.len())
        .map(|i| {
            (
                median(latency[i].iter().map(|f| f.p50_us).collect()),
                median(latency[i].iter().map(|f| f.p99_us).collect()),
                median(throughput[i].iter().map(|f| f.per_second).collect()),
            )
        })
        .collect();
    for ((name, ..), (p50, p99, rate)) in paths.iter().zip(&summary) {
        println!("{name:<20} {p50:>10.0} {p99:>10.0} {rate:>16.0}");
    }
    let (sozu, direct_tls, direct) = (summary[2], summary[1], summary[0]);
    println!(
        "\nthrough sozu / direct wss: p50 ×{:.2}, p99 ×{:.2}, throughput ×{:.2}",
        sozu.0 / direct_tls.0,
        sozu.1 / direct_tls.1,
        sozu.2 / direct_tls.2
    );
    println!(
        "through sozu / direct ws:  p50 ×{:.2}, p99 ×{:.2}, throughput ×{:.2}",
        sozu.0 / direct.0,
        sozu.1 / direct.1,
        sozu.2 / direct.2
    );
}
