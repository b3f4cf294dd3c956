//! `private-ingress top` on a pseudo-terminal against a real agent and sozu, as a person sees it:
//! a rotation, a backend that breaks and a rejected edit appear on the screen within bounds;
//! the screen follows a resize; the agent killed and started again is said and picked up; the
//! terminal is given back (alternate screen left, cursor shown, raw mode off) on `q`, Ctrl-C,
//! SIGTERM and a panic. And `/v1/events` on its own: the backlog to a client that joins late,
//! resumption after `Last-Event-ID`, a clean end when the agent stops, and a client that never
//! reads costing the agent a bounded amount of memory.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use private_ingress_tests::agent_bin;
use private_ingress_tests::bench::mass::rss_mib;
use private_ingress_tests::live::{certificate, eventually, sample, Backend, Stack};
use private_ingress_tests::tui::Tui;

const APP: &str = "app.in.example.org";
const WEB: &str = "web.in.example.org";

/// How long a change may take to reach the screen: the agent's own reaction (a health check's
/// two failed probes 1 s apart, an evaluation), then `top`'s next read or the event stream.
const ON_SCREEN: Duration = Duration::from_secs(20);

struct Serving {
    stack: Stack,
    app: Backend,
    _web: Backend,
}

/// Two routes, `app` with a health check (1 s, two failures make it down).
fn workspace(stack: &Stack, app_port: u16, web: &Backend) -> String {
    let routes = [
        format!(
            "{{ host = \"{APP}\", upstream = \"127.0.0.1\", port = {app_port}, \
             health = {{ path = \"/healthz\", interval = 1, timeout = 1, unhealthy_threshold = 2, healthy_threshold = 2 }} }}"
        ),
        format!(
            "{{ host = \"{WEB}\", upstream = \"127.0.0.1\", port = {} }}",
            web.address.port()
        ),
    ];
    stack.workspace_text_of(&routes, "")
}

fn serving() -> Serving {
    let mut stack = Stack::new();
    let app = Backend::start("app");
    let web = Backend::start("web");
    certificate(&stack.tls_dir(), APP);
    certificate(&stack.tls_dir(), WEB);
    stack.write_workspace(&workspace(&stack, app.address.port(), &web));
    stack.start_sozu();
    stack.start_agent();
    stack.wait_ready(Duration::from_secs(60));
    Serving {
        stack,
        app,
        _web: web,
    }
}

fn top(stack: &Stack, rows: u16, cols: u16, env: &[(&str, &str)]) -> Tui {
    let mut command = Command::new(agent_bin());
    command
        .args(["top", "--refresh", "0.5", "--admin-address"])
        .arg(stack.admin.to_string())
        .env_remove("NO_COLOR")
        .envs(env.iter().copied());
    Tui::start(&mut command, rows, cols)
}

/// The screen's row that mentions every one of `needles`, if one does.
fn row_with(screen: &str, needles: &[&str]) -> Option<String> {
    screen
        .lines()
        .find(|l| needles.iter().all(|n| l.contains(n)))
        .map(str::to_owned)
}

fn wait_row(tui: &Tui, needles: &[&str], timeout: Duration) -> String {
    let mut last = String::new();
    let found = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        eventually(timeout, &format!("a row with {needles:?}"), || {
            last = tui.screen();
            row_with(&last, needles)
        })
    }));
    found.unwrap_or_else(|_| {
        panic!(
            "no row with {needles:?} within {timeout:?}:\n{}",
            tui.screen()
        )
    })
}

#[test]
fn top_shows_a_rotation_a_broken_backend_and_a_rejected_edit_and_outlives_the_agent() {
    let mut s = serving();
    let mut tui = top(&s.stack, 30, 110, &[]);
    tui.wait_for(
        &["private-ingress top", "ready yes", "sozu in sync", APP, WEB],
        ON_SCREEN,
    );
    let screen = tui.screen();
    assert!(
        row_with(&screen, &[APP, "ok"]).is_some() && row_with(&screen, &[WEB, "ok"]).is_some(),
        "{screen}"
    );

    // The events pane: a rotation, named by its host.
    tui.send(b"4");
    tui.wait_for(&["TIME", "KIND", "HOST"], ON_SCREEN);
    let rotated = Instant::now();
    certificate(&s.stack.tls_dir(), APP);
    wait_row(
        &tui,
        &["certificate_rotated", APP, "now serving"],
        ON_SCREEN,
    );
    eprintln!("rotation on screen after {:?}", rotated.elapsed());

    // A backend whose health check fails: down, in the events and on the route.
    s.app.set_healthy(false);
    let broke = Instant::now();
    wait_row(&tui, &["backend_down", APP], ON_SCREEN);
    eprintln!("backend down on screen after {:?}", broke.elapsed());
    tui.send(b"1");
    wait_row(&tui, &[APP, "error"], ON_SCREEN);
    // Its page: the backend down, the certificate's issuer, the last errors.
    tui.send(b"/app\r");
    wait_row(&tui, &[APP], ON_SCREEN);
    tui.send(b"\r");
    tui.wait_for(
        &[
            "Upstreams",
            "down",
            "Certificate",
            "issuer",
            "Last errors",
            "backend_down",
        ],
        ON_SCREEN,
    );
    // Back to the table, then the filter cleared (two keys, not one Alt-Esc).
    tui.send(b"\x1b");
    tui.wait_for(&["HOST", "/app"], ON_SCREEN);
    tui.send(b"\x1b");
    tui.wait_for(&[WEB], ON_SCREEN);
    s.app.set_healthy(true);

    // A workspace edit the contract refuses: said at the top, the last good one kept.
    let good = std::fs::read_to_string(s.stack.workspace_path()).expect("the workspace");
    s.stack
        .write_workspace(&good.replace(&format!("port = {}", s.app.address.port()), "port = 0"));
    let edited = Instant::now();
    tui.wait_for(
        &["workspace edit rejected", "last edit rejected"],
        ON_SCREEN,
    );
    eprintln!("rejected edit on screen after {:?}", edited.elapsed());
    s.stack.write_workspace(&good);
    tui.wait_until("the rejection cleared", ON_SCREEN, |screen| {
        !screen.contents().contains("edit rejected")
    });

    // A smaller terminal: the screen is drawn again at its size.
    tui.resize(24, 80);
    tui.wait_until("the screen redrawn at 80x24", ON_SCREEN, |screen| {
        let rows: Vec<String> = screen.rows(0, 80).collect();
        rows.len() == 24
            && rows[0].contains("private-ingress top")
            && rows[23].contains("?:help")
            && rows.iter().any(|r| r.contains(APP))
    });

    // The agent goes away: said, what it last said kept; it comes back: picked up.
    s.stack.kill_agent();
    tui.wait_for(&["agent unreachable", APP], ON_SCREEN);
    s.stack.start_agent();
    s.stack.wait_ready(Duration::from_secs(60));
    tui.wait_until("the agent picked up again", ON_SCREEN, |screen| {
        let text = screen.contents();
        !text.contains("unreachable") && text.contains("ready yes") && text.contains("events: live")
    });

    tui.send(b"q");
    let status = tui.wait_exit(Duration::from_secs(10));
    assert!(status.success(), "{status:?}");
    tui.restored().unwrap_or_else(|e| panic!("after q: {e}"));
}

/// Ctrl-C (a key, in raw mode), SIGTERM and a panic each give the terminal back.
#[test]
fn the_terminal_is_given_back_after_ctrl_c_sigterm_and_a_panic() {
    let s = serving();
    let mut tui = top(&s.stack, 24, 80, &[]);
    tui.wait_for(&["ready yes", APP], ON_SCREEN);
    tui.send(b"\x03");
    assert!(tui.wait_exit(Duration::from_secs(10)).success());
    tui.restored()
        .unwrap_or_else(|e| panic!("after Ctrl-C: {e}"));

    let mut tui = top(&s.stack, 24, 80, &[]);
    tui.wait_for(&["ready yes", APP], ON_SCREEN);
    tui.signal(nix::sys::signal::Signal::SIGTERM);
    tui.wait_exit(Duration::from_secs(10));
    tui.restored()
        .unwrap_or_else(|e| panic!("after SIGTERM: {e}"));

    let mut tui = top(&s.stack, 24, 80, &[("PRIVATE_INGRESS_TEST_TOP_PANIC", "1")]);
    let status = tui.wait_exit(ON_SCREEN);
    assert_eq!(status.code(), Some(101), "a panic's exit");
    tui.restored()
        .unwrap_or_else(|e| panic!("after a panic: {e}"));
    // The panic is reported on the normal screen, where it stays.
    tui.wait_for(&["test hook: top panics"], Duration::from_secs(5));
}

/// Exit codes at the start, as `status` has them; the terminal is not touched.
#[test]
fn top_exits_as_status_does_when_it_cannot_start() {
    let port = private_ingress_tests::live::free_port();
    let mut tui = Tui::start(
        Command::new(agent_bin()).args(["top", "--admin-address", &format!("127.0.0.1:{port}")]),
        24,
        80,
    );
    assert_eq!(tui.wait_exit(Duration::from_secs(10)).code(), Some(2));
    tui.wait_for(
        &["error: cannot reach the agent at"],
        Duration::from_secs(5),
    );
    tui.restored().unwrap_or_else(|e| panic!("{e}"));

    // A port that takes the connection and never answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let address = silent.local_addr().expect("its address").to_string();
    let mut tui = Tui::start(
        Command::new(agent_bin()).args(["top", "--timeout", "1", "--admin-address", &address]),
        24,
        80,
    );
    assert_eq!(tui.wait_exit(Duration::from_secs(20)).code(), Some(3));
    tui.wait_for(
        &["error: no answer from", "within 1 s"],
        Duration::from_secs(5),
    );
}

/// `--once`: one frame as text, the exit code of `status`.
#[test]
fn top_once_prints_one_frame() {
    let s = serving();
    let once = |pane: &str| {
        let out = Command::new(agent_bin())
            .args([
                "top",
                "--once",
                "--size",
                "100x30",
                "--pane",
                pane,
                "--admin-address",
            ])
            .arg(s.stack.admin.to_string())
            .output()
            .expect("run top --once");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (code, text) = once("routes");
    assert_eq!(code, Some(0), "{text}");
    assert_eq!(text.lines().count(), 30, "{text}");
    assert!(text.lines().all(|l| l.chars().count() <= 100), "{text}");
    assert!(row_with(&text, &[APP, "ok"]).is_some(), "{text}");
    assert!(
        !text.contains('\u{1b}'),
        "no escape in a frame as text: {text:?}"
    );
    let (_, events) = once("events");
    assert!(
        row_with(
            &events,
            &["workspace_accepted", "workspace applied: 2 routes"]
        )
        .is_some(),
        "{events}"
    );
}

/// A raw `GET /v1/events` with `headers`: what arrived by the time `until` is in it, or the
/// connection closed.
fn events_until(admin: SocketAddr, headers: &str, until: &str) -> (TcpStream, String) {
    let mut stream = TcpStream::connect(admin).expect("connect to the admin address");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("read timeout");
    write!(
        stream,
        "GET /v1/events HTTP/1.1\r\nHost: {admin}\r\n{headers}\r\n"
    )
    .expect("send the request");
    let mut got = Vec::new();
    let mut chunk = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains(until) {
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&chunk[..n]),
        }
    }
    (stream, String::from_utf8_lossy(&got).into_owned())
}

/// The `id:` lines of a stream, in order.
fn ids(stream: &str) -> Vec<String> {
    stream
        .lines()
        .filter_map(|l| l.strip_prefix("id: "))
        .map(str::to_owned)
        .collect()
}

#[test]
fn a_late_client_gets_the_backlog_and_one_that_resumes_only_what_it_missed() {
    let s = serving();
    certificate(&s.stack.tls_dir(), APP);
    let admin = s.stack.admin;
    // Joining late: what happened before, oldest first, then `: live`.
    let (_, first) = eventually(ON_SCREEN, "the rotation in the backlog", || {
        let (conn, text) = events_until(admin, "", ": live");
        text.contains("event: certificate_rotated")
            .then_some((conn, text))
    });
    assert!(first.contains("content-type: text/event-stream"), "{first}");
    let accepted = first
        .find("event: workspace_accepted")
        .expect("the workspace's event");
    let rotated = first
        .find("event: certificate_rotated")
        .expect("the rotation");
    assert!(accepted < rotated, "{first}");
    let data = first
        .lines()
        .skip_while(|l| *l != "event: certificate_rotated")
        .nth(1)
        .expect("its data line");
    assert!(
        data.starts_with("data: {") && data.contains(&format!("\"host\":\"{APP}\"")),
        "{data}"
    );
    let seen = ids(&first);
    assert!(seen.len() >= 2, "{first}");

    // Resuming after the first event: everything but it.
    let (_, resumed) = events_until(admin, &format!("Last-Event-ID: {}\r\n", seen[0]), ": live");
    // (Events that came since follow: the ones seen must be there, in order, and no other
    // before them.)
    let resumed_ids = ids(&resumed);
    assert_eq!(
        resumed_ids.get(..seen.len() - 1),
        Some(&seen[1..]),
        "{resumed}"
    );
    // An id of another agent (another instance): the whole backlog.
    let (_, other) = events_until(admin, "Last-Event-ID: 1-1\r\n", ": live");
    assert_eq!(ids(&other).get(..seen.len()), Some(&seen[..]), "{other}");
}

#[test]
fn the_event_stream_ends_cleanly_when_the_agent_stops() {
    let mut s = serving();
    let (mut stream, _) = events_until(s.stack.admin, "", ": live");
    let stopped = Instant::now();
    s.stack.signal_agent("TERM");
    let mut rest = Vec::new();
    let _ = stream.read_to_end(&mut rest);
    let rest = String::from_utf8_lossy(&rest);
    assert!(rest.contains("event: stopping"), "{rest}");
    // The chunked body's last chunk: the response ended, not the connection cut.
    assert!(rest.ends_with("0\r\n\r\n"), "{rest:?}");
    let status = s.stack.wait_agent_exit(Duration::from_secs(10));
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
    assert!(
        !s.stack
            .agent_logs()
            .contains("stopping without waiting any longer"),
        "the stream held the shutdown for its whole grace: {}",
        s.stack.agent_logs()
    );
    eprintln!(
        "stream ended and agent exited {:?} after SIGTERM",
        stopped.elapsed()
    );
}

/// A client that never reads while the agent emits 200,000 events (some 60 MB of frames): the
/// agent's memory grows by the broadcast ring and a few frames, not by what the client did not
/// read, and what it skipped is counted.
#[test]
fn a_client_that_never_reads_cannot_grow_the_agents_memory() {
    const FLOOD: usize = 200_000;
    let mut stack = Stack::new();
    let app = Backend::start("app");
    certificate(&stack.tls_dir(), APP);
    stack.write_workspace(
        &stack.workspace_text(&[private_ingress_tests::live::RouteSpec {
            host: APP.into(),
            upstream: "127.0.0.1".into(),
            port: Some(app.address.port()),
        }]),
    );
    let go = stack.dir.path().join("flood");
    stack.start_sozu();
    stack.start_agent_with(
        &[],
        &[
            ("RUST_LOG", "info"),
            ("PRIVATE_INGRESS_TEST_EVENT_FLOOD", &FLOOD.to_string()),
            (
                "PRIVATE_INGRESS_TEST_EVENT_FLOOD_FILE",
                &go.to_string_lossy(),
            ),
        ],
    );
    stack.wait_ready(Duration::from_secs(60));
    let pid = stack.agent_pid();
    // The slow client: the backlog read, then nothing more.
    let (stalled, _) = events_until(stack.admin, "", ": live");
    std::thread::sleep(Duration::from_millis(200));
    let before = rss_mib(pid);
    std::fs::write(&go, "").expect("start the flood");
    stack.wait_agent_log("test flood of events emitted", Duration::from_secs(120));
    let dropped = eventually(Duration::from_secs(30), "skipped events counted", || {
        sample(&stack.metrics(), "private_ingress_events_dropped_total").filter(|n| *n > 0.0)
    });
    let after = rss_mib(pid);
    eprintln!(
        "{FLOOD} events (about {} MB of frames) past a client that never reads: the agent's RSS \
         {before:.1} MiB before, {after:.1} MiB after ({:+.1} MiB); {dropped} skipped",
        FLOOD * 300 / 1_000_000,
        after - before
    );
    assert!(
        after - before < 16.0,
        "the agent grew by {:.1} MiB",
        after - before
    );
    drop(stalled);
}

/// What one reader of `/v1/events` has seen so far, read on a thread of its own at its own pace.
struct Reader {
    seen: std::sync::Arc<std::sync::Mutex<String>>,
    ended: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Reader {
    /// A client from `from` that reads `chunk` bytes every `pause` (all it can when `pause` is
    /// zero), until its stream ends.
    fn start(from: std::net::IpAddr, admin: SocketAddr, chunk: usize, pause: Duration) -> Reader {
        let mut stream =
            private_ingress_tests::admin_clients::connect_from(from, admin).expect("connect");
        write!(stream, "GET /v1/events HTTP/1.1\r\nHost: {admin}\r\n\r\n").expect("send");
        let seen = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let ended = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (s, e) = (seen.clone(), ended.clone());
        std::thread::spawn(move || {
            let mut buffer = vec![0u8; chunk];
            loop {
                match stream.read(&mut buffer) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        let text = String::from_utf8_lossy(&buffer[..n]);
                        // Kept: what a test looks for, not the flood's bodies.
                        let mut seen = s.lock().unwrap();
                        for line in text.split_inclusive('\n') {
                            if !line.contains("test flood") {
                                seen.push_str(line);
                            }
                        }
                    }
                }
                if !pause.is_zero() {
                    std::thread::sleep(pause);
                }
            }
            e.store(true, std::sync::atomic::Ordering::Relaxed);
        });
        Reader { seen, ended }
    }

    fn seen(&self) -> String {
        self.seen.lock().unwrap().clone()
    }

    fn ended(&self) -> bool {
        self.ended.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// Forty clients from one address ask for `/v1/events` and never read. A client from another
/// address still gets its stream (32 slots, but at most 8 per address), and so does a later one
/// from the silent clients' own address (their oldest gives way). When events come, the silent
/// ones left fill their buffers and are dropped within 30 s of taking nothing more; a client
/// that reads slowly but steadily keeps its stream, told what it skipped.
#[test]
fn silent_event_clients_neither_take_every_stream_nor_keep_theirs() {
    use private_ingress_tests::admin_clients::silent_events_client;
    use std::net::{IpAddr, Ipv4Addr};
    const SILENT: usize = 40;
    const FLOOD: usize = 100_000;
    let silent_address = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1));
    let mut stack = Stack::new();
    let app = Backend::start("app");
    certificate(&stack.tls_dir(), APP);
    stack.write_workspace(
        &stack.workspace_text(&[private_ingress_tests::live::RouteSpec {
            host: APP.into(),
            upstream: "127.0.0.1".into(),
            port: Some(app.address.port()),
        }]),
    );
    let go = stack.dir.path().join("flood");
    stack.start_sozu();
    stack.start_agent_with(
        &[],
        &[
            ("RUST_LOG", "info"),
            ("PRIVATE_INGRESS_TEST_EVENT_FLOOD", &FLOOD.to_string()),
            (
                "PRIVATE_INGRESS_TEST_EVENT_FLOOD_FILE",
                &go.to_string_lossy(),
            ),
        ],
    );
    stack.wait_ready(Duration::from_secs(60));
    let admin = stack.admin;
    let silent: Vec<TcpStream> = (0..SILENT)
        .map(|_| {
            let stream = silent_events_client(silent_address, admin);
            // Until its answer begins, without taking a byte of it.
            stream
                .set_read_timeout(Some(ON_SCREEN))
                .expect("read timeout");
            stream.peek(&mut [0u8; 1]).expect("the answer begins");
            stream
        })
        .collect();

    // Another address: its stream, at once.
    let other = Reader::start(
        IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)),
        admin,
        64 * 1024,
        Duration::ZERO,
    );
    let answer = eventually(ON_SCREEN, "the other client's answer", || {
        let seen = other.seen();
        (seen.contains(": live") || seen.contains("HTTP/1.1 503") || other.ended()).then_some(seen)
    });
    assert!(
        answer.starts_with("HTTP/1.1 200") && answer.contains(": live"),
        "{answer}"
    );
    // The silent clients' own address: its stream too.
    let same = Reader::start(silent_address, admin, 64 * 1024, Duration::ZERO);
    eventually(
        ON_SCREEN,
        "a stream from the silent clients' address",
        || same.seen().contains(": live").then_some(()),
    );
    // A slow reader from a third address: 16 KiB every 50 ms, far slower than the flood.
    let slow = Reader::start(
        IpAddr::V4(Ipv4Addr::new(127, 0, 0, 3)),
        admin,
        16 * 1024,
        Duration::from_millis(50),
    );
    eventually(ON_SCREEN, "the slow reader's stream", || {
        slow.seen().contains(": live").then_some(())
    });

    // Events come: the silent clients' buffers fill, and they are dropped.
    let flooded = Instant::now();
    std::fs::write(&go, "").expect("start the flood");
    stack.wait_agent_log("test flood of events emitted", Duration::from_secs(120));
    let stalled = eventually(
        Duration::from_secs(120),
        "the silent clients dropped",
        || {
            let metrics = stack.metrics();
            let open = sample(&metrics, "private_ingress_events_streams")?;
            let stalled = sample(
                &metrics,
                "private_ingress_events_streams_closed_total{reason=\"stalled\"}",
            )?;
            (open == 3.0).then_some(stalled)
        },
    );
    let dropped_after = flooded.elapsed();
    eprintln!(
        "{SILENT} silent /v1/events clients: 8 held at most, the others replaced; after a flood \
         of {FLOOD} events, {stalled} silent streams dropped {dropped_after:?} after it began"
    );
    assert!(stalled >= 1.0, "no stream was dropped for stalling");
    // Each silent client, reading at last, finds its stream ended.
    for (i, mut stream) in silent.into_iter().enumerate() {
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .expect("read timeout");
        let began = Instant::now();
        let mut sink = vec![0u8; 1 << 16];
        let ended = loop {
            match stream.read(&mut sink) {
                Ok(0) | Err(_) => break true,
                Ok(_) if began.elapsed() > Duration::from_secs(60) => break false,
                Ok(_) => {}
            }
        };
        assert!(ended, "silent client {i}: its stream still goes on");
    }

    // The readers kept their streams: a rotation reaches each (the slow one once it has read
    // what its connection's buffers still hold of the flood, megabytes at its pace).
    certificate(&stack.tls_dir(), APP);
    for (who, reader) in [("other", &other), ("same", &same), ("slow", &slow)] {
        eventually(
            Duration::from_secs(120),
            &format!("the rotation at the {who} reader"),
            || {
                reader
                    .seen()
                    .contains("event: certificate_rotated")
                    .then_some(())
            },
        );
        assert!(!reader.ended(), "the {who} reader's stream ended");
    }
    assert!(
        slow.seen().contains("event: dropped"),
        "the slow reader was not told what it skipped"
    );
}
