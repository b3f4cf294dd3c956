//! A seeded, randomised soak of the live agent and a real sozu: rotations, bad pairs (refused
//! while the last good one serves), workspace edits (written in place, so sometimes read half
//! written), sozu killed, the agent killed or stopped and started again, in an order drawn from a
//! seed; every other host has a spare upstream, and a drain moves its traffic between the two.
//! Every few actions a checkpoint waits for the agent to converge and checks what clients see:
//! each routed host presents its latest good certificate and reaches the backend in rotation; a
//! host removed from the workspace no longer presents its certificate. A TCP stream is held open
//! through a `'tcp` route all along: each checkpoint sends it bytes and reads them back, so a
//! byte lost, or a connection the agent's work broke (a rotation, an edit, the agent's own
//! restart), shows; only sozu's death ends it, and it is opened again then. Two WebSockets are
//! held open the same way through an HTTPS route whose certificate and policy the soak rotates
//! and edits with the others' (Python's `websockets`, echoing a message every 100 ms each): a
//! message lost or a WebSocket closed without sozu's death is a failure.
//!
//! Periodic resyncs are off by default, so a lost event shows as a failure instead of being
//! repaired a minute later; `resync` turns them on, every few seconds, to put the resync's read
//! beside the loop through the same kills and edits. The same seed replays the same actions
//! (their timing still varies).
//!
//! Every other sozu restart is followed at once by a checkpoint, which records how long after
//! sozu answered again every route was served again (`after_sozu_restart`; the agent not
//! restarted since): a sozu back must mean routes back within a second, whatever back-off the
//! agent was in. The other restarts meet the actions that follow them before a checkpoint.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use crate::live::{
    atomic_write, fingerprint_of_pem, free_port, https_get, https_get_with_headers, Backend, Stack,
};

#[derive(Debug, Clone)]
pub struct SoakConfig {
    pub seed: u64,
    pub duration: Duration,
    pub hosts: usize,
    /// The agent's `--resync-interval` in seconds; 0 turns resyncs off.
    pub resync: u64,
}

#[derive(Debug, Default)]
pub struct SoakReport {
    /// Actions taken, by kind.
    pub actions: BTreeMap<&'static str, u32>,
    pub checkpoints: u32,
    /// What a checkpoint found wrong, with the actions that led there.
    pub failures: Vec<String>,
    /// The slowest checkpoint's wait for convergence.
    pub slowest_convergence: Duration,
    /// The actions before the slowest checkpoint (up to eight), for a figure to explain.
    pub slowest_after: Vec<String>,
    /// Every checkpoint's wait for convergence, in order.
    pub convergences: Vec<Duration>,
    /// Bytes echoed back whole over the TCP stream held open through the `'tcp` route.
    pub stream_bytes: u64,
    /// Times the stream was opened: once, then again after each time sozu was killed.
    pub stream_opened: u32,
    /// Messages echoed over the WebSockets held open through the HTTPS route `ws.in.example.org`.
    pub websocket_messages: u64,
    /// Times the WebSockets were opened: once, then again after each time sozu was killed.
    pub websockets_opened: u32,
    /// For each sozu restart checked at once (every other one; the agent not restarted since):
    /// from sozu answering again to every route served again.
    pub after_sozu_restart: Vec<Duration>,
    /// The slowest of those: the actions before it, and what the agent logged from sozu's
    /// restart to that checkpoint.
    pub slowest_restart: Option<(Duration, Vec<String>, String)>,
}

/// The stream held open through the `'tcp` route, and where it goes.
struct TcpProbe {
    listen_port: u16,
    backend: SocketAddr,
    conn: Option<TcpStream>,
}

/// The WebSocket route's host, its backend and clients (`tests/python/protocols.py`).
const WS_HOST: &str = "ws.in.example.org";
const WS_CONNECTIONS: usize = 2;

/// A `protocols.py` process, killed on drop; its standard output read line by line.
struct Python {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
}

impl Python {
    fn spawn(args: &[&str]) -> Result<Python, String> {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/python/protocols.py");
        let mut child = Command::new("python3")
            .arg(script)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("python3 {script}: {e}"))?;
        let stdout = child.stdout.take().ok_or("no standard output")?;
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let stdin = child.stdin.take();
        Ok(Python {
            child,
            stdin,
            lines,
        })
    }

    /// The next line, or why there is none within `timeout`.
    fn line(&mut self, timeout: Duration) -> Result<String, String> {
        self.lines.recv_timeout(timeout).map_err(|_| {
            let status = self.child.try_wait().ok().flatten();
            format!("no line from protocols.py within {timeout:?} (exited: {status:?})")
        })
    }

    fn send(&mut self, command: &str) -> Result<(), String> {
        let stdin = self.stdin.as_mut().ok_or("standard input closed")?;
        writeln!(stdin, "{command}").map_err(|e| format!("protocols.py's input: {e}"))
    }
}

impl Drop for Python {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The WebSockets held open through the HTTPS route of [`WS_HOST`].
struct WsProbe {
    port: u16,
    _server: Python,
    clients: Option<Python>,
    /// The messages echoed as of the clients' last report.
    echoed: u64,
    /// The route's certificate and policy version, rotated and edited with host 0's.
    latest: String,
    generation: u32,
    policy: u32,
}

/// xorshift64*: small, seeded, the same sequence everywhere.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// How a pair can be bad on disk, each refused by the agent while the last good one serves.
const BAD: [&str; 4] = ["truncated", "mismatched key", "expired", "wrong name"];

struct Soak {
    stack: Stack,
    _backends: Vec<Backend>,
    hosts: Vec<String>,
    ports: Vec<std::net::SocketAddr>,
    /// The spare upstream of each even host (`backend-<i>-spare`).
    spares: BTreeMap<usize, Backend>,
    /// Even hosts whose primary upstream is drained, their spare in rotation.
    on_spare: BTreeSet<usize>,
    routed: BTreeSet<usize>,
    /// Each host's policy version: its route sets the response header `X-Soak` to it (none at
    /// 0), so each edit swaps the host's frontend.
    policy: Vec<u32>,
    /// The latest good certificate written for each host.
    latest: Vec<String>,
    generation: Vec<u32>,
    rng: Rng,
    log: VecDeque<String>,
    report: SoakReport,
    /// The workspace's `traffic` field: sozu sends its records to the agent throughout.
    traffic: String,
    /// The agent's record count at the last checkpoint of this agent's run: it must never go
    /// down while the agent runs, whatever sozu does (`None` after the agent restarts).
    records_floor: Option<f64>,
    stream: TcpProbe,
    websockets: WsProbe,
    /// When sozu was last started, while no restart of the agent has come since, and how much
    /// the agent had logged then.
    sozu_started: Option<(Instant, usize)>,
    /// The agent's `--resync-interval`.
    resync: String,
}

pub fn run(config: &SoakConfig) -> SoakReport {
    let stack = Stack::new();
    let traffic = stack.send_traffic();
    let hosts: Vec<String> = (0..config.hosts)
        .map(|i| format!("soak{i}.in.example.org"))
        .collect();
    let backends: Vec<Backend> = (0..config.hosts)
        .map(|i| Backend::start(&format!("backend-{i}")))
        .collect();
    let ports = backends.iter().map(|b| b.address).collect();
    let spares = (0..config.hosts)
        .step_by(2)
        .map(|i| (i, Backend::start(&format!("backend-{i}-spare"))))
        .collect();
    let ws_port = free_port();
    let mut ws_server = Python::spawn(&["ws-server", &ws_port.to_string(), "ws-backend"])
        .unwrap_or_else(|e| panic!("the WebSocket backend: {e}"));
    match ws_server.line(Duration::from_secs(60)) {
        Ok(line) if line == "ready" => {}
        other => panic!(
            "the WebSocket backend did not start (python3 with websockets is needed; \
             scripts/test installs it): {other:?}"
        ),
    }
    let mut soak = Soak {
        stack,
        _backends: backends,
        hosts,
        ports,
        spares,
        on_spare: BTreeSet::new(),
        routed: (0..config.hosts).collect(),
        policy: vec![0; config.hosts],
        latest: Vec::new(),
        generation: vec![0; config.hosts],
        rng: Rng(config.seed.max(1)),
        log: VecDeque::new(),
        report: SoakReport::default(),
        traffic,
        records_floor: None,
        stream: TcpProbe {
            listen_port: free_port(),
            backend: crate::live::echo_backend(),
            conn: None,
        },
        websockets: WsProbe {
            port: ws_port,
            _server: ws_server,
            clients: None,
            echoed: 0,
            latest: String::new(),
            generation: 0,
            policy: 0,
        },
        sozu_started: None,
        resync: config.resync.to_string(),
    };
    for host in 0..config.hosts {
        let fingerprint = soak.write_good(host);
        soak.latest.push(fingerprint);
    }
    soak.rotate_websocket_host();
    soak.write_workspace();
    soak.stack.start_sozu();
    soak.start_agent();
    soak.checkpoint();
    let deadline = Instant::now() + config.duration;
    let mut actions = 0u32;
    while Instant::now() < deadline {
        soak.act();
        actions += 1;
        std::thread::sleep(Duration::from_millis(soak.rng.below(250) as u64));
        if actions.is_multiple_of(8) {
            soak.checkpoint();
        }
    }
    soak.checkpoint();
    if !soak.report.failures.is_empty() {
        eprintln!("{}", soak.stack.logs());
    }
    soak.report
}

impl Soak {
    /// The agent started (again): a convergence after it is the agent's start, not sozu's.
    fn start_agent(&mut self) {
        self.sozu_started = None;
        self.stack.start_agent_with(
            &["--resync-interval", &self.resync],
            &[("RUST_LOG", "info")],
        );
    }

    fn note(&mut self, action: &'static str, detail: String) {
        *self.report.actions.entry(action).or_default() += 1;
        self.log.push_back(format!("{action}: {detail}"));
        if self.log.len() > 24 {
            self.log.pop_front();
        }
    }

    fn act(&mut self) {
        let roll = self.rng.below(100);
        let host = self.rng.below(self.hosts.len());
        match roll {
            0..=29 => {
                let fingerprint = self.write_good(host);
                self.latest[host] = fingerprint;
                self.note("rotate", self.hosts[host].clone());
                if host == 0 {
                    self.rotate_websocket_host();
                    self.note("rotate", WS_HOST.into());
                }
            }
            30..=34 => {
                // Drain one upstream of an even host and put the other back.
                let host = host & !1;
                let to = if self.on_spare.remove(&host) {
                    "primary"
                } else {
                    self.on_spare.insert(host);
                    "spare"
                };
                self.note("drain", format!("{} to its {to}", self.hosts[host]));
                self.write_workspace();
            }
            35..=49 => self.bad_then_fixed(host),
            50..=59 => {
                // Every host in turn in a burst, as a mass renewal does.
                for h in 0..self.hosts.len() {
                    self.latest[h] = self.write_good(h);
                }
                self.rotate_websocket_host();
                self.note("renew all", String::new());
            }
            60..=64 => {
                // A route's policy edited: its frontend swaps to the host's other spelling.
                self.policy[host] += 1;
                self.note(
                    "policy edit",
                    format!("{} X-Soak {}", self.hosts[host], self.policy[host]),
                );
                if host == 0 {
                    self.websockets.policy += 1;
                    let v = self.websockets.policy;
                    self.note("policy edit", format!("{WS_HOST} X-Soak {v}"));
                }
                self.write_workspace();
            }
            65..=71 => {
                if self.routed.remove(&host) {
                    self.note("remove route", self.hosts[host].clone());
                } else {
                    self.routed.insert(host);
                    self.note("add route", self.hosts[host].clone());
                }
                self.write_workspace();
            }
            72..=79 => {
                self.stack.kill_sozu();
                self.stack.start_sozu();
                self.sozu_started = Some((Instant::now(), self.stack.current_agent_log().len()));
                // sozu's workers died with it, and the connections they held.
                self.stream.conn = None;
                self.websockets.clients = None;
                self.note("kill sozu", String::new());
                // Every other restart is checked at once, so that the time until every route is
                // served again is the agent's alone, not also that of the actions the soak takes
                // meanwhile (two renewals of every pair took a second); the others meet the
                // actions that follow.
                if self.rng.below(2) == 0 {
                    self.checkpoint();
                } else {
                    self.sozu_started = None;
                }
            }
            80..=89 => {
                self.records_floor = None;
                self.stack.kill_agent();
                self.start_agent();
                self.note("kill agent", String::new());
            }
            _ => {
                self.records_floor = None;
                let stopped = self.stack.stop_agent();
                self.start_agent();
                self.note("restart agent", format!("stopped cleanly: {stopped}"));
            }
        }
    }

    /// A bad pair, left on disk a moment, during which the last good one must keep serving,
    /// then a good one. From a converged state, so that the last good one is known to serve: a
    /// good pair overwritten before the agent read it (its host just added, the agent just
    /// restarted) was never the agent's to serve.
    fn bad_then_fixed(&mut self, host: usize) {
        self.checkpoint();
        let kind = BAD[self.rng.below(BAD.len())];
        self.write_bad(host, kind);
        self.note("bad pair", format!("{} ({kind})", self.hosts[host]));
        std::thread::sleep(Duration::from_millis(50 + self.rng.below(200) as u64));
        if self.routed.contains(&host) {
            if let Ok(seen) = https_get(self.stack.https, &self.hosts[host], "/") {
                if seen.fingerprint != self.latest[host] {
                    self.fail(format!(
                        "{} served {} while its bad pair was on disk; the last good was {}",
                        self.hosts[host], seen.fingerprint, self.latest[host]
                    ));
                }
            }
        }
        self.latest[host] = self.write_good(host);
    }

    fn write_good(&mut self, host: usize) -> String {
        let pair = rcgen::generate_simple_self_signed(vec![self.hosts[host].clone()])
            .expect("a certificate");
        let (crt, key) = (pair.cert.pem(), pair.signing_key.serialize_pem());
        self.swap(host, &crt, &key);
        fingerprint_of_pem(&crt)
    }

    /// A new good pair for the WebSocket route's host.
    fn rotate_websocket_host(&mut self) {
        let pair = rcgen::generate_simple_self_signed(vec![WS_HOST.into()]).expect("a certificate");
        let (crt, key) = (pair.cert.pem(), pair.signing_key.serialize_pem());
        self.websockets.generation += 1;
        atomic_write(
            &self.stack.tls_dir().join(WS_HOST),
            &crt,
            &key,
            self.websockets.generation,
        );
        self.websockets.latest = fingerprint_of_pem(&crt);
    }

    fn write_bad(&mut self, host: usize, kind: &str) {
        let name = self.hosts[host].clone();
        let good = rcgen::generate_simple_self_signed(vec![name.clone()]).expect("a certificate");
        let (crt, key) = (good.cert.pem(), good.signing_key.serialize_pem());
        let (crt, key) = match kind {
            "truncated" => (crt[..crt.len() / 2].to_owned(), key),
            "mismatched key" => {
                let other = rcgen::KeyPair::generate().expect("a key");
                (crt, other.serialize_pem())
            }
            "expired" => {
                let key_pair = rcgen::KeyPair::generate().expect("a key");
                let mut params =
                    rcgen::CertificateParams::new(vec![name]).expect("certificate parameters");
                params.not_before = rcgen::date_time_ymd(2000, 1, 1);
                params.not_after = rcgen::date_time_ymd(2001, 1, 1);
                let crt = params.self_signed(&key_pair).expect("self-signed").pem();
                (crt, key_pair.serialize_pem())
            }
            _ => {
                let other = rcgen::generate_simple_self_signed(vec!["other.in.example.org".into()])
                    .expect("a certificate");
                (other.cert.pem(), other.signing_key.serialize_pem())
            }
        };
        self.swap(host, &crt, &key);
    }

    fn swap(&mut self, host: usize, crt: &str, key: &str) {
        self.generation[host] += 1;
        atomic_write(
            &self.stack.tls_dir().join(&self.hosts[host]),
            crt,
            key,
            self.generation[host],
        );
    }

    /// The workspace: odd hosts in the one-upstream form, even ones with their spare.
    fn write_workspace(&mut self) {
        let upstream = |address: std::net::SocketAddr, drain: bool| {
            format!(
                "{{ upstream = \"{}\", port = {}, drain = {drain} }}",
                address.ip(),
                address.port()
            )
        };
        let policy = |i: usize| match self.policy[i] {
            0 => String::new(),
            v => format!(", headers.response.set = {{ \"X-Soak\" = \"{v}\" }}"),
        };
        let routes: Vec<String> = self
            .routed
            .iter()
            .map(|&i| match self.spares.get(&i) {
                Some(spare) => {
                    let on_spare = self.on_spare.contains(&i);
                    format!(
                        "{{ host = \"{}\", upstreams = [{}, {}]{} }}",
                        self.hosts[i],
                        upstream(self.ports[i], on_spare),
                        upstream(spare.address, !on_spare),
                        policy(i)
                    )
                }
                None => format!(
                    "{{ host = \"{}\", upstream = \"{}\", port = {}{} }}",
                    self.hosts[i],
                    self.ports[i].ip(),
                    self.ports[i].port(),
                    policy(i)
                ),
            })
            .collect();
        let mut routes = routes;
        routes.push(format!(
            "{{ host = \"{WS_HOST}\", upstream = \"127.0.0.1\", port = {}{} }}",
            self.websockets.port,
            match self.websockets.policy {
                0 => String::new(),
                v => format!(", headers.response.set = {{ \"X-Soak\" = \"{v}\" }}"),
            }
        ));
        routes.push(format!(
            "{{ host = \"stream.in.example.org\", protocol = 'tcp, listen_port = {}, upstream = \"{}\", port = {} }}",
            self.stream.listen_port,
            self.stream.backend.ip(),
            self.stream.backend.port()
        ));
        let text = self.stack.workspace_text_of(&routes, &self.traffic);
        self.stack.write_workspace(&text);
    }

    /// The body the backend in rotation for host `i` answers with.
    fn expected_body(&self, i: usize) -> String {
        if self.on_spare.contains(&i) {
            format!("backend-{i}-spare")
        } else {
            format!("backend-{i}")
        }
    }

    /// Waits for what clients see to match the model; records a failure if it does not within
    /// the bound.
    fn checkpoint(&mut self) {
        self.report.checkpoints += 1;
        let started = Instant::now();
        let bound = Duration::from_secs(15);
        loop {
            let wrong = self.mismatches();
            if wrong.is_empty() {
                let took = started.elapsed();
                self.report.convergences.push(took);
                if let Some((sozu, logged)) = self.sozu_started.take() {
                    let after = sozu.elapsed();
                    self.report.after_sozu_restart.push(after);
                    if self
                        .report
                        .slowest_restart
                        .as_ref()
                        .is_none_or(|(slowest, _, _)| after > *slowest)
                    {
                        let recent = self.log.len().saturating_sub(8);
                        let log = self.stack.current_agent_log();
                        self.report.slowest_restart = Some((
                            after,
                            self.log.iter().skip(recent).cloned().collect(),
                            log.get(logged..).unwrap_or_default().to_owned(),
                        ));
                    }
                }
                if took > self.report.slowest_convergence {
                    self.report.slowest_convergence = took;
                    let recent = self.log.len().saturating_sub(8);
                    self.report.slowest_after = self.log.iter().skip(recent).cloned().collect();
                }
                self.check_traffic();
                self.check_stream();
                self.check_websockets();
                return;
            }
            if started.elapsed() > bound {
                self.fail(format!(
                    "not converged {bound:?} after the last action: {}",
                    wrong.join("; ")
                ));
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The stream through the `'tcp` route echoes what is sent, whole: opened if sozu was killed
    /// (or at the first checkpoint), else the same connection as before.
    fn check_stream(&mut self) {
        if self.stream.conn.is_none() {
            let port = self.stream.listen_port;
            let started = Instant::now();
            let conn = loop {
                match TcpStream::connect(("127.0.0.1", port)) {
                    Ok(conn) => break Some(conn),
                    Err(_) if started.elapsed() < Duration::from_secs(15) => {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    Err(e) => {
                        self.fail(format!(
                            "the 'tcp route's port {port} takes no connection: {e}"
                        ));
                        break None;
                    }
                }
            };
            let Some(conn) = conn else { return };
            let _ = conn.set_read_timeout(Some(Duration::from_secs(15)));
            self.stream.conn = Some(conn);
            self.report.stream_opened += 1;
        }
        let message: Vec<u8> = (0..256).map(|_| self.rng.next() as u8).collect();
        let Some(conn) = self.stream.conn.as_mut() else {
            return;
        };
        let mut back = vec![0u8; message.len()];
        let echoed = conn
            .write_all(&message)
            .and_then(|()| conn.read_exact(&mut back));
        match echoed {
            Ok(()) if back == message => self.report.stream_bytes += message.len() as u64,
            Ok(()) => {
                self.stream.conn = None;
                self.fail("the TCP stream through the 'tcp route echoed other bytes".into());
            }
            Err(e) => {
                self.stream.conn = None;
                self.fail(format!(
                    "the TCP stream through the 'tcp route broke without sozu's death: {e}"
                ));
            }
        }
    }

    /// The WebSockets through the HTTPS route echo every message: opened if sozu was killed (or
    /// at the first checkpoint), else the same two as before, none closed or failed since, and
    /// messages echoed since the last checkpoint.
    fn check_websockets(&mut self) {
        let Some(clients) = self.websockets.clients.as_mut() else {
            let port = self.stack.https.port().to_string();
            let count = WS_CONNECTIONS.to_string();
            let opened =
                Python::spawn(&["ws-client", &port, WS_HOST, &count, "100"]).and_then(|mut p| {
                    match p.line(Duration::from_secs(30))? {
                        line if line == "ready" => Ok(p),
                        other => Err(format!("ws-client: {other}")),
                    }
                });
            match opened {
                Ok(clients) => {
                    self.websockets.clients = Some(clients);
                    self.websockets.echoed = 0;
                    self.report.websockets_opened += 1;
                }
                Err(e) => self.fail(format!("no WebSocket opens through {WS_HOST}: {e}")),
            }
            return;
        };
        // Messages go every 100 ms: two checkpoints back to back may see none in between, so
        // the report is asked again until one more is echoed (a failure ends the wait).
        let waited = std::time::Instant::now();
        let echoed = loop {
            let report = clients
                .send("report")
                .and_then(|()| clients.line(Duration::from_secs(15)))
                .and_then(|line| {
                    serde_json::from_str::<serde_json::Value>(&line)
                        .map_err(|e| format!("{e}: {line}"))
                });
            let report = match report {
                Ok(report) => report,
                Err(e) => {
                    self.websockets.clients = None;
                    return self.fail(format!("the WebSocket clients gave no report: {e}"));
                }
            };
            let segments = report["segments"].as_array().cloned().unwrap_or_default();
            let sum = |key: &str| segments.iter().filter_map(|s| s[key].as_u64()).sum::<u64>();
            let (echoed, failed) = (sum("echoed"), sum("failed"));
            let alive = report["alive"].as_u64().unwrap_or(0);
            if failed > 0 || alive != WS_CONNECTIONS as u64 {
                let errors: Vec<String> = segments
                    .iter()
                    .flat_map(|s| s["errors"].as_array().cloned().unwrap_or_default())
                    .map(|e| e.to_string())
                    .collect();
                self.websockets.clients = None;
                return self.fail(format!(
                    "a WebSocket through {WS_HOST} failed without sozu's death ({alive} of \
                     {WS_CONNECTIONS} open, {failed} failed): {}",
                    errors.join("; ")
                ));
            }
            if echoed > self.websockets.echoed {
                break echoed;
            }
            if waited.elapsed() > Duration::from_secs(15) {
                return self.fail(format!(
                    "no message echoed over the WebSockets through {WS_HOST} for 15 s \
                     ({echoed} in all)"
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        self.report.websocket_messages += echoed.saturating_sub(self.websockets.echoed);
        self.websockets.echoed = echoed;
    }

    /// The agent's count of sozu's records never goes down while it runs: not when sozu is
    /// killed, not when the workspace changes.
    fn check_traffic(&mut self) {
        // An agent just started may not listen yet while sozu already serves: nothing to check.
        let Ok(metrics) = ureq::get(&format!("http://{}/metrics", self.stack.admin))
            .call()
            .and_then(|mut r| r.body_mut().read_to_string())
        else {
            return;
        };
        let records = metrics.lines().find_map(|l| {
            l.strip_prefix("private_ingress_traffic_records_total ")?
                .parse::<f64>()
                .ok()
        });
        match (records, self.records_floor) {
            (Some(now), Some(floor)) if now < floor => {
                self.fail(format!("the record count went down from {floor} to {now}"));
            }
            (Some(now), _) => self.records_floor = Some(now),
            (None, _) => self.fail("no private_ingress_traffic_records_total in /metrics".into()),
        }
    }

    fn mismatches(&self) -> Vec<String> {
        let mut wrong = Vec::new();
        let version = |headers: &[(String, String)]| {
            headers
                .iter()
                .find(|(n, _)| n == "x-soak")
                .map_or(0, |(_, v)| v.parse().unwrap_or(u32::MAX))
        };
        for (i, host) in self.hosts.iter().enumerate() {
            let seen = https_get_with_headers(self.stack.https, host, "/");
            if self.routed.contains(&i) {
                match seen {
                    Ok((s, h))
                        if s.fingerprint == self.latest[i]
                            && s.body == self.expected_body(i)
                            && version(&h) == self.policy[i] => {}
                    other => wrong.push(format!("{host}: {other:?}")),
                }
            } else if let Ok((s, _)) = seen {
                if s.fingerprint == self.latest[i] {
                    wrong.push(format!("{host} is out of the workspace but still served"));
                }
            }
        }
        // The WebSocket backend answers a plain GET with 426: the certificate and the policy's
        // header are what is checked.
        match https_get_with_headers(self.stack.https, WS_HOST, "/") {
            Ok((s, h))
                if s.fingerprint == self.websockets.latest
                    && version(&h) == self.websockets.policy => {}
            other => wrong.push(format!("{WS_HOST}: {other:?}")),
        }
        wrong
    }

    fn fail(&mut self, what: String) {
        let history: Vec<&str> = self.log.iter().map(String::as_str).collect();
        self.report
            .failures
            .push(format!("{what}\n  after: {}", history.join("\n         ")));
    }
}
