//! What a `'tcp` route costs a stream: round trips of small messages and bulk throughput over
//! one connection to an echo server, through sozu (a `'tcp` route the agent set up) against the
//! same server directly, rounds interleaved in one run so that the machine's load falls on both.
//! Prints figures and ratios; asserts nothing.
//!
//!     cargo bench -p private-ingress-tests --bench tcp_stream [-- --rounds 3 --messages 5000 --mib 64]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use private_ingress_tests::live::{eventually, free_port, Stack};

struct Args {
    rounds: usize,
    messages: usize,
    mib: usize,
}

fn args() -> Args {
    let mut args = Args {
        rounds: 3,
        messages: 5_000,
        mib: 64,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| -> usize {
            it.next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{name} needs a number"))
        };
        match arg.as_str() {
            "--rounds" => args.rounds = value("--rounds"),
            "--messages" => args.messages = value("--messages"),
            "--mib" => args.mib = value("--mib"),
            // cargo bench passes --bench.
            _ => {}
        }
    }
    args
}

/// An echo server on loopback.
fn echo() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let address = listener.local_addr().expect("address");
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let _ = stream.set_nodelay(true);
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 64 * 1024];
                while let Ok(n) = stream.read(&mut buf) {
                    if n == 0 || stream.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            });
        }
    });
    address
}

/// Each round trip of a 64-byte message, in µs.
fn round_trips(address: SocketAddr, messages: usize) -> Vec<f64> {
    let mut conn = TcpStream::connect(address).expect("connect");
    conn.set_nodelay(true).expect("nodelay");
    let message = [7u8; 64];
    let mut back = [0u8; 64];
    (0..messages)
        .map(|_| {
            let started = Instant::now();
            conn.write_all(&message).expect("write");
            conn.read_exact(&mut back).expect("read");
            started.elapsed().as_secs_f64() * 1e6
        })
        .collect()
}

/// MiB/s echoed: `mib` MiB written in 64 KiB chunks by one thread, read back by another.
fn throughput(address: SocketAddr, mib: usize) -> f64 {
    let conn = TcpStream::connect(address).expect("connect");
    let mut reader = conn.try_clone().expect("clone");
    let total = mib * 1024 * 1024;
    let started = Instant::now();
    let writer = std::thread::spawn(move || {
        let mut conn = conn;
        let chunk = vec![3u8; 64 * 1024];
        for _ in 0..total / chunk.len() {
            conn.write_all(&chunk).expect("write");
        }
    });
    let mut buf = vec![0u8; 64 * 1024];
    let mut read = 0;
    while read < total {
        let n = reader.read(&mut buf).expect("read");
        assert!(n > 0, "the stream ended after {read} bytes");
        read += n;
    }
    writer.join().expect("the writer");
    mib as f64 / started.elapsed().as_secs_f64()
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    let i = ((sorted.len() as f64 * q) as usize).min(sorted.len().saturating_sub(1));
    sorted[i]
}

fn main() {
    let args = args();
    let backend = echo();
    let mut stack = Stack::new();
    let listen = free_port();
    let route = format!(
        "{{ host = \"stream.in.example.org\", protocol = 'tcp, listen_port = {listen}, upstream = \"{}\", port = {} }}",
        backend.ip(),
        backend.port()
    );
    stack.write_workspace(&stack.workspace_text_of(&[route], ""));
    stack.start_sozu();
    stack.start_agent();
    stack.wait_ready(Duration::from_secs(60));
    let through: SocketAddr = format!("127.0.0.1:{listen}").parse().expect("address");
    eventually(Duration::from_secs(30), "the route echoing", || {
        std::panic::catch_unwind(|| round_trips(through, 1)).ok()
    });
    println!(
        "tcp stream through sozu 2.3.3 ('tcp route) against direct, {} rounds interleaved, {} round trips of 64 bytes and {} MiB echoed per round",
        args.rounds, args.messages, args.mib
    );
    let (mut rtt_direct, mut rtt_sozu) = (Vec::new(), Vec::new());
    let (mut mib_direct, mut mib_sozu) = (Vec::new(), Vec::new());
    for _ in 0..args.rounds {
        rtt_direct.extend(round_trips(backend, args.messages));
        rtt_sozu.extend(round_trips(through, args.messages));
        mib_direct.push(throughput(backend, args.mib));
        mib_sozu.push(throughput(through, args.mib));
    }
    for list in [&mut rtt_direct, &mut rtt_sozu] {
        list.sort_by(f64::total_cmp);
    }
    println!("| path | round trip p50 | p99 | throughput (MiB/s, best of rounds) |");
    println!("|---|---:|---:|---:|");
    let best = |v: &[f64]| v.iter().cloned().fold(0.0, f64::max);
    for (name, rtt, mib) in [
        ("direct", &rtt_direct, &mib_direct),
        ("through sozu", &rtt_sozu, &mib_sozu),
    ] {
        println!(
            "| {name} | {:.0} µs | {:.0} µs | {:.0} |",
            percentile(rtt, 0.5),
            percentile(rtt, 0.99),
            best(mib)
        );
    }
    println!(
        "ratio through sozu / direct: round trip p50 {:.2}x, p99 {:.2}x, throughput {:.2}x",
        percentile(&rtt_sozu, 0.5) / percentile(&rtt_direct, 0.5),
        percentile(&rtt_sozu, 0.99) / percentile(&rtt_direct, 0.99),
        best(&mib_sozu) / best(&mib_direct)
    );
    if let Ok(pressure) = std::fs::read_to_string("/proc/pressure/cpu") {
        println!(
            "cpu pressure: {}",
            pressure.lines().next().unwrap_or_default()
        );
    }
}
