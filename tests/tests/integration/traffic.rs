//! Traffic seen through sozu's own access-log stream: every request counted once per route,
//! method and status (sozu's own answers included), slow ones in the right buckets, clients that
//! cannot grow a series, counters that survive sozu's death, and JSON access-log lines.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use private_ingress_tests::live::{
    certificate, eventually, https_get, promtool_check, sample, Backend, Stack,
};

const READY: Duration = Duration::from_secs(30);
/// How long records may take to be counted: a busy machine's scheduling, never a product delay
/// (a record is sent when its response ends).
const COUNTED: Duration = Duration::from_secs(30);
const A: &str = "a.in.example.org";
const D: &str = "drained.in.example.org";

fn requests(route: &str, host: &str, method: &str, code: u16) -> String {
    format!(
        "private_ingress_http_requests_total{{code=\"{code}\",host=\"{host}\",method=\"{method}\",protocol=\"http/1.1\",route=\"{route}\"}}"
    )
}

fn route_id(host: &str) -> String {
    format!("pi-{host}")
}

/// Waits until every series has exactly its count, and returns the scrape.
fn wait_counts(stack: &Stack, expected: &BTreeMap<String, f64>) -> String {
    eventually(
        COUNTED,
        "the traffic counters to reach their counts",
        || {
            let metrics = stack.metrics();
            expected
                .iter()
                .all(|(series, n)| sample(&metrics, series) == Some(*n))
                .then_some(metrics)
        },
    )
}

/// A plain HTTP/1.1 request with its own `Host`, on a connection of its own; the status.
fn http_get(address: SocketAddr, host: &str, path: &str) -> u16 {
    let mut stream = TcpStream::connect(address).expect("connect to sozu's http listener");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("read timeout");
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .expect("send a request");
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    response
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status in {response:?}"))
}

/// Two routes, `a` to a live backend and `drained` with its only upstream drained (sozu answers
/// 503 itself), with sozu sending its records to the agent.
/// Returns the port sozu sends to; `extra` is given it, for more workspace fields.
fn serving(stack: &mut Stack, backend: &Backend, extra: impl Fn(u16) -> String) -> u16 {
    certificate(&stack.tls_dir(), A);
    certificate(&stack.tls_dir(), D);
    let traffic = stack.send_traffic();
    let port: u16 = traffic
        .rsplit(':')
        .next()
        .and_then(|p| p.split('"').next()?.parse().ok())
        .expect("the traffic port");
    let upstream = |drain: bool| {
        format!(
            "upstreams = [{{ upstream = \"{}\", port = {}, drain = {drain} }}]",
            backend.address.ip(),
            backend.address.port()
        )
    };
    let routes = [
        format!("{{ host = \"{A}\", {} }}", upstream(false)),
        format!("{{ host = \"{D}\", {} }}", upstream(true)),
    ];
    let extra = format!("{traffic}{}", extra(port));
    stack.write_workspace(&stack.workspace_text_of(&routes, &extra));
    stack.start_sozu();
    stack.start_agent();
    stack.wait_ready(READY);
    port
}

fn get(stack: &Stack, host: &str, path: &str) -> u16 {
    https_get(stack.https, host, path)
        .unwrap_or_else(|e| panic!("{host}{path}: {e}\n{}", stack.logs()))
        .status
}

#[test]
fn every_request_is_counted_once_by_route_method_and_status() {
    let backend = Backend::start("a");
    let mut stack = Stack::new();
    serving(&mut stack, &backend, |_| String::new());
    for _ in 0..5 {
        assert_eq!(get(&stack, A, "/"), 200);
    }
    for _ in 0..3 {
        assert_eq!(get(&stack, A, "/status/500"), 500);
    }
    for _ in 0..4 {
        assert_eq!(
            get(&stack, D, "/"),
            503,
            "sozu's own answer for a drained route"
        );
    }
    for _ in 0..2 {
        assert_eq!(http_get(stack.http, "nowhere.in.example.org", "/"), 404);
    }
    // sozu's redirect of plain HTTP to HTTPS is the route's answer too.
    assert_eq!(http_get(stack.http, A, "/"), 301);
    let (a, d) = (route_id(A), route_id(D));
    let expected = BTreeMap::from([
        (requests(&a, A, "GET", 200), 5.0),
        (requests(&a, A, "GET", 500), 3.0),
        (requests(&a, A, "GET", 301), 1.0),
        (requests(&d, D, "GET", 503), 4.0),
        (requests("unmatched", "unmatched", "GET", 404), 2.0),
        ("private_ingress_traffic_records_total".to_owned(), 15.0),
    ]);
    let metrics = wait_counts(&stack, &expected);
    promtool_check(&metrics).unwrap_or_else(|e| panic!("{e}\n{metrics}"));
    let count = |series: &str| sample(&metrics, series).unwrap_or(-1.0);
    let labels = format!("host=\"{A}\",route=\"{a}\"");
    assert_eq!(
        count(&format!(
            "private_ingress_http_request_duration_seconds_count{{{labels}}}"
        )),
        9.0
    );
    assert!(
        count(&format!(
            "private_ingress_http_response_bytes_total{{{labels}}}"
        )) > 0.0
    );
    assert!(
        count(&format!(
            "private_ingress_http_request_bytes_total{{{labels}}}"
        )) > 0.0
    );
    assert_eq!(
        count("private_ingress_traffic_records_malformed_total"),
        0.0
    );
    assert_eq!(count("private_ingress_traffic_records_lost_total"), 0.0);

    // status shows the window: requests per second, the share of 5xx and p99 (published each
    // second while records arrive).
    let state = eventually(COUNTED, "the window in /v1/state", || {
        stack
            .state()
            .filter(|s| s["traffic"]["routes"][route_id(A).as_str()]["requests"] == 9)
    });
    let traffic = &state["traffic"];
    assert_eq!(traffic["window_seconds"], 60, "{traffic}");
    assert!(traffic["problem"].is_null(), "{traffic}");
    let route = &traffic["routes"][a.as_str()];
    assert_eq!(route["requests"], 9, "{traffic}");
    let ratio = route["error_ratio"].as_f64().expect("error_ratio");
    assert!((ratio - 3.0 / 9.0).abs() < 1e-9, "{traffic}");
    let out = stack.status_text();
    assert!(out.contains("traffic over the last 60 s"), "{out}");
    let row = out
        .lines()
        .find(|l| l.starts_with(A) && l.contains('%'))
        .unwrap_or_else(|| panic!("no traffic row for {A}:\n{out}"));
    assert!(row.contains("33.3%"), "{row}");
}

#[test]
fn slow_requests_land_in_their_buckets() {
    let backend = Backend::start("a");
    let mut stack = Stack::new();
    serving(&mut stack, &backend, |_| String::new());
    // 300 ms: above the 0.25 s bound, within 0.5 s (the backend's pause is a floor).
    for _ in 0..2 {
        assert_eq!(get(&stack, A, "/delay/300"), 200);
    }
    let a = route_id(A);
    let bucket = |le: &str| {
        format!(
            "private_ingress_http_request_duration_seconds_bucket{{host=\"{A}\",route=\"{a}\",le=\"{le}\"}}"
        )
    };
    let metrics = wait_counts(&stack, &BTreeMap::from([(bucket("+Inf"), 2.0)]));
    assert_eq!(sample(&metrics, &bucket("0.25")), Some(0.0), "{metrics}");
    let backend_bucket = format!(
        "private_ingress_http_backend_response_duration_seconds_bucket{{host=\"{A}\",route=\"{a}\",le=\"0.25\"}}"
    );
    assert_eq!(sample(&metrics, &backend_bucket), Some(0.0), "{metrics}");
    // Up to 10 s: a busy machine may stretch a 300 ms pause, not shorten it.
    assert_eq!(sample(&metrics, &bucket("10")), Some(2.0), "{metrics}");
}

#[test]
fn hosts_a_client_invents_grow_no_series() {
    let backend = Backend::start("a");
    let mut stack = Stack::new();
    serving(&mut stack, &backend, |_| String::new());
    for i in 0..25 {
        let host = format!("random-{i}-{}.example.com", std::process::id());
        assert_eq!(http_get(stack.http, &host, &format!("/p{i}")), 404);
    }
    let expected = BTreeMap::from([(requests("unmatched", "unmatched", "GET", 404), 25.0)]);
    let metrics = wait_counts(&stack, &expected);
    assert!(!metrics.contains("random-"), "{metrics}");
    let series = metrics
        .lines()
        .filter(|l| l.starts_with("private_ingress_http_requests_total{"))
        .count();
    assert_eq!(series, 1, "{metrics}");
}

#[test]
fn counters_never_go_down_when_sozu_is_killed_and_started_again() {
    let backend = Backend::start("a");
    let mut stack = Stack::new();
    serving(&mut stack, &backend, |_| String::new());
    for _ in 0..3 {
        assert_eq!(get(&stack, A, "/"), 200);
    }
    let a = route_id(A);
    let series = requests(&a, A, "GET", 200);
    wait_counts(&stack, &BTreeMap::from([(series.clone(), 3.0)]));
    stack.kill_sozu();
    stack.start_sozu();
    // Served again once the agent has programmed the new sozu.
    eventually(READY, "the route served by the new sozu", || {
        https_get(stack.https, A, "/")
            .ok()
            .filter(|seen| seen.status == 200)
    });
    // The request that found it served, plus two more.
    for _ in 0..2 {
        assert_eq!(get(&stack, A, "/"), 200);
    }
    let metrics = wait_counts(&stack, &BTreeMap::from([(series.clone(), 6.0)]));
    assert!(sample(&metrics, &series) >= Some(6.0));
}

#[test]
fn access_log_lines_are_json_without_the_query_string() {
    let backend = Backend::start("a");
    let mut stack = Stack::new();
    let log = stack.dir.path().join("access.log");
    let extra = format!("  traffic.access_log.path = \"{}\",\n", log.display());
    serving(&mut stack, &backend, |_| extra.clone());
    assert_eq!(get(&stack, A, "/hello?token=s3cr3t"), 200);
    assert_eq!(
        http_get(stack.http, "nowhere.in.example.org", "/x?k=v"),
        404
    );
    let lines = eventually(COUNTED, "two access-log lines", || {
        let text = std::fs::read_to_string(&log).ok()?;
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect();
        (lines.len() >= 2).then_some((text, lines))
    });
    let (text, lines) = lines;
    assert_eq!(lines.len(), 2, "{text}");
    assert!(!text.contains("s3cr3t") && !text.contains("k=v"), "{text}");
    let routed = lines
        .iter()
        .find(|l| l["route"] == route_id(A))
        .unwrap_or_else(|| panic!("no line for {A}: {text}"));
    for field in [
        "time",
        "route",
        "host",
        "method",
        "path",
        "status",
        "duration_ms",
        "backend_ms",
        "bytes_in",
        "bytes_out",
        "client",
        "backend",
        "request_id",
        "tls_version",
    ] {
        assert!(!routed[field].is_null(), "{field} missing: {routed}");
    }
    assert_eq!(routed["path"], "/hello");
    assert_eq!(routed["host"], A);
    assert_eq!(routed["status"], 200);
    assert_eq!(routed["backend"], backend.address.to_string());
    let unmatched = lines
        .iter()
        .find(|l| l["route"].is_null())
        .unwrap_or_else(|| panic!("no line for the unknown host: {text}"));
    assert_eq!(unmatched["status"], 404);
    assert_eq!(unmatched["path"], "/x");
}

/// A non-loopback IPv4 address of this machine, to send from.
fn global_address() -> std::net::IpAddr {
    let out = std::process::Command::new("ip")
        .args(["-4", "-o", "addr", "show", "scope", "global"])
        .output()
        .expect("ip (iproute2, which scripts/test installs)");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .skip_while(|w| *w != "inet")
        .nth(1)
        .and_then(|cidr| cidr.split('/').next()?.parse().ok())
        .expect("this test needs a non-loopback IPv4 address on the machine")
}

#[test]
fn garbage_and_strangers_are_counted_and_skipped() {
    let backend = Backend::start("a");
    let mut stack = Stack::new();
    // Listening on every address: loopback (sozu) and a stranger can both reach it.
    let port = serving(&mut stack, &backend, |port| {
        format!("  traffic.listen | force = \"0.0.0.0:{port}\",\n")
    });
    let loopback = std::net::UdpSocket::bind("127.0.0.1:0").expect("a loopback socket");
    for garbage in [&b""[..], b"\x05abc", &[0xff; 64]] {
        loopback
            .send_to(garbage, ("127.0.0.1", port))
            .expect("send garbage");
    }
    let stranger = std::net::UdpSocket::bind((global_address(), 0)).expect("a global socket");
    stranger
        .send_to(b"\x02\x08\x01\x00\x00", (global_address(), port))
        .expect("send from a stranger");
    assert_eq!(get(&stack, A, "/"), 200);
    let expected = BTreeMap::from([
        (
            "private_ingress_traffic_records_malformed_total".to_owned(),
            3.0,
        ),
        (
            "private_ingress_traffic_records_rejected_total".to_owned(),
            1.0,
        ),
        ("private_ingress_traffic_records_total".to_owned(), 1.0),
        (requests(&route_id(A), A, "GET", 200), 1.0),
    ]);
    wait_counts(&stack, &expected);
    assert!(stack.ready(), "{}", stack.logs());
}

/// A hand-written sozu configuration without the two lines: requests are served, and the agent
/// says, on `/v1/state` and in `status`, that no record arrives and which lines are missing.
#[test]
fn without_the_two_lines_the_agent_says_it_receives_no_records() {
    let backend = Backend::start("a");
    let mut stack = Stack::new();
    certificate(&stack.tls_dir(), A);
    let port = private_ingress_tests::live::free_port();
    let routes = [format!(
        "{{ host = \"{A}\", upstream = \"{}\", port = {} }}",
        backend.address.ip(),
        backend.address.port()
    )];
    let extra = format!("  traffic.listen = \"127.0.0.1:{port}\",\n");
    stack.write_workspace(&stack.workspace_text_of(&routes, &extra));
    stack.start_sozu();
    stack.start_agent();
    stack.wait_ready(READY);
    assert_eq!(get(&stack, A, "/"), 200);
    let state = eventually(COUNTED, "the traffic status", || {
        stack.state().filter(|s| s["traffic"]["listen"].is_string())
    });
    let problem = state["traffic"]["problem"].as_str().unwrap_or_default();
    let expected = format!("access_logs_target = \"udp://127.0.0.1:{port}\"");
    assert!(problem.contains(&expected), "{problem}");
    assert!(
        problem.contains("access_logs_format = \"protobuf\""),
        "{problem}"
    );
    assert_eq!(state["traffic"]["records"], 0);
    let out = stack.status_text();
    assert!(out.contains("traffic: no record received yet"), "{out}");
}

/// The traffic address taken by something else: the agent serves all the same, says why it
/// receives nothing, and takes the address once it is free, without a restart.
#[test]
fn an_address_in_use_is_shown_and_taken_once_free() {
    let backend = Backend::start("a");
    let mut stack = Stack::new();
    let squatter = std::net::UdpSocket::bind("127.0.0.1:0").expect("a UDP socket");
    let taken = squatter.local_addr().expect("its address");
    let port = serving(&mut stack, &backend, |_| {
        format!("  traffic.listen | force = \"{taken}\",\n")
    });
    assert_ne!(port, taken.port());
    assert_eq!(get(&stack, A, "/"), 200);
    let state = eventually(COUNTED, "the bind failure in /v1/state", || {
        stack.state().filter(|s| {
            s["traffic"]["problem"]
                .as_str()
                .is_some_and(|p| p.starts_with(&format!("cannot receive on {taken}")))
        })
    });
    assert!(state["traffic"]["listen"].is_null(), "{state}");
    drop(squatter);
    eventually(
        Duration::from_secs(60),
        "the address taken once free",
        || {
            stack
                .state()
                .filter(|s| s["traffic"]["listen"] == taken.to_string())
        },
    );
}
