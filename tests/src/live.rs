//! Processes for live tests: a real sozu, the real agent, loopback HTTP backends and an HTTPS
//! client that reports the certificate a handshake received. Every process is killed on drop; on
//! a failed test, [`Stack::logs`] gives both processes' logs.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::{agent_bin, short_tempdir, sozu_bin};

/// A loopback port nothing listens on. sozu binds with SO_REUSEPORT, so "bind succeeded" proves
/// nothing about a port sozu holds; a plain bind without that option does fail there. Ports are
/// never handed out twice in one test run.
pub fn free_port() -> u16 {
    static GIVEN: OnceLock<Mutex<BTreeSet<u16>>> = OnceLock::new();
    let given = GIVEN.get_or_init(Default::default);
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("bind an ephemeral port")
            .port();
        let mut given = given.lock().unwrap_or_else(|p| p.into_inner());
        if given.insert(port) && TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// Polls `f` every 20 ms until it returns `Some`, or panics with `what` after `timeout`.
pub fn eventually<T>(timeout: Duration, what: &str, f: impl FnMut() -> Option<T>) -> T {
    eventually_every(Duration::from_millis(20), timeout, what, f)
}

/// [`eventually`], polling every `period`.
pub fn eventually_every<T>(
    period: Duration,
    timeout: Duration,
    what: &str,
    mut f: impl FnMut() -> Option<T>,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(period);
    }
}

/// The route of `host` in a `/v1/state` document.
pub fn route_of<'a>(state: &'a serde_json::Value, host: &str) -> Option<&'a serde_json::Value> {
    state["routes"]
        .as_array()?
        .iter()
        .find(|r| r["host"] == host)
}

/// A child process whose output goes to a log file, killed on drop.
pub struct Process {
    child: Child,
}

impl Process {
    pub fn spawn(cmd: &mut Command, log: &Path) -> Process {
        let out = std::fs::File::create(log).expect("create a log file");
        let err = out.try_clone().expect("clone the log file");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
        Process { child }
    }

    /// Its process id (for `/proc`).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    fn signal(&self, signal: &str) {
        let _ = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.pid().to_string())
            .status();
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The exit status, if the process has ended.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Sends SIGTERM and waits for the exit status. A process that has ended, its main thread
    /// gone, while the kernel still tears down one of its threads (seen here: the agent's
    /// inotify thread in `__flush_work`, the kernel destroying its watches, for over 10 s on a
    /// busy machine) is waited for longer: the program has done its part, and the machine is
    /// slow. It is said, with where each thread waits.
    fn terminate(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        self.signal("TERM");
        let sent = Instant::now();
        let mut deadline = sent + timeout;
        let mut said = false;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                if said {
                    eprintln!(
                        "pid {} exited {:?} after SIGTERM",
                        self.child.id(),
                        sent.elapsed()
                    );
                }
                return Some(status);
            }
            if Instant::now() >= deadline {
                let pid = self.child.id();
                let ended = leader_state(pid) == Some('Z');
                if !said {
                    eprintln!(
                        "pid {pid} has not exited {:?} after SIGTERM ({}); its threads:\n{}",
                        sent.elapsed(),
                        if ended {
                            "its main thread has ended: the kernel is tearing it down"
                        } else {
                            "its main thread still runs"
                        },
                        threads_of(pid)
                    );
                    said = true;
                }
                if !ended || sent.elapsed() >= TEARDOWN {
                    self.kill();
                    return None;
                }
                deadline = Instant::now() + Duration::from_millis(100);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// How long a process whose program has ended may take the kernel to tear down.
const TEARDOWN: Duration = Duration::from_secs(120);

/// The state letter of `pid`'s main thread (`Z`: it has exited).
fn leader_state(pid: u32) -> Option<char> {
    state_in(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// The state letter in a `/proc` `stat` line: after the name, which is in parentheses and may
/// hold spaces.
fn state_in(stat: &str) -> Option<char> {
    stat.rsplit_once(") ")?.1.chars().next()
}

/// Each thread of `pid`: its name, its state and where it waits in the kernel, and with gdb on
/// the PATH its stack: what a process that does not exit is stuck on.
fn threads_of(pid: u32) -> String {
    let mut out = String::new();
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten();
    for task in tasks.flatten() {
        let path = task.path();
        let read = |f: &str| std::fs::read_to_string(path.join(f)).unwrap_or_default();
        let state = state_in(&read("stat")).unwrap_or('?');
        out.push_str(&format!(
            "  {} {:<16} {state} {}\n",
            task.file_name().to_string_lossy(),
            read("comm").trim(),
            read("wchan")
        ));
    }
    let gdb = Command::new("gdb")
        .args([
            "-p",
            &pid.to_string(),
            "-batch",
            "-ex",
            "thread apply all bt 12",
        ])
        .stdin(Stdio::null())
        .output();
    if let Ok(gdb) = gdb {
        out.push_str(&String::from_utf8_lossy(&gdb.stdout));
    }
    out
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The child processes of `pid` (sozu's workers, for its main process).
fn children(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|c| c.parse().ok())
        .collect()
}

/// Whether `pid` still runs (a zombie waiting for its reaper does not).
fn alive(pid: u32) -> bool {
    leader_state(pid).is_some_and(|state| state != 'Z')
}

/// A loopback HTTP/1.1 server that answers every request with its own name (after a pause for
/// `/delay/<milliseconds>`, with the status asked for `/status/<code>`), and `/healthz` with
/// 200, or 503 once [`Backend::set_healthy`] said it is not.
pub struct Backend {
    pub name: String,
    pub address: SocketAddr,
    stop: Arc<AtomicBool>,
    healthy: Arc<AtomicBool>,
    delayed: Arc<AtomicUsize>,
}

impl Backend {
    pub fn start(name: &str) -> Backend {
        let listener = TcpListener::bind(("127.0.0.1", free_port())).expect("bind a backend");
        Backend::serve_on(name, listener)
    }

    /// Backends named `names`, one per loopback address from 127.0.0.2 on, all on one port: what
    /// a name resolving to several addresses, or to new ones, points at.
    pub fn start_on_one_port(names: &[&str]) -> Vec<Backend> {
        loop {
            let port = free_port();
            let listeners: Vec<TcpListener> = (0..names.len())
                .map_while(|i| {
                    TcpListener::bind((Ipv4Addr::new(127, 0, 0, 2 + i as u8), port)).ok()
                })
                .collect();
            if listeners.len() == names.len() {
                return names
                    .iter()
                    .zip(listeners)
                    .map(|(name, listener)| Backend::serve_on(name, listener))
                    .collect();
            }
        }
    }

    /// A backend at `ip` (an address of the calling thread's network), on a free port.
    pub fn start_at(name: &str, ip: Ipv4Addr) -> Backend {
        let listener = TcpListener::bind((ip, free_port())).expect("bind a backend");
        Backend::serve_on(name, listener)
    }

    fn serve_on(name: &str, listener: TcpListener) -> Backend {
        let address = listener.local_addr().expect("backend address");
        let stop = Arc::new(AtomicBool::new(false));
        let healthy = Arc::new(AtomicBool::new(true));
        let delayed = Arc::new(AtomicUsize::new(0));
        let (body, stopped, health) = (name.to_owned(), stop.clone(), healthy.clone());
        let counted = delayed.clone();
        // A blocking accept, woken by a connection of its own when the backend is dropped: a
        // soak of a thousand hosts keeps fifteen hundred of them, and a polling accept each
        // took the machine's two cores.
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if stopped.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(stream) = stream else {
                    std::thread::sleep(Duration::from_millis(2));
                    continue;
                };
                let (body, health, counted) = (body.clone(), health.clone(), counted.clone());
                std::thread::spawn(move || serve(stream, &body, &health, &counted));
            }
        });
        Backend {
            name: name.to_owned(),
            address,
            stop,
            healthy,
            delayed,
        }
    }

    /// Whether `/healthz` answers 200 (healthy) or 503; every other path still answers 200.
    pub fn set_healthy(&self, healthy: bool) {
        self.healthy.store(healthy, Ordering::Relaxed);
    }

    /// `/delay/` requests this backend has received so far: a test waits for its slow
    /// requests to be in flight on this side of the proxy.
    pub fn delayed_requests(&self) -> usize {
        self.delayed.load(Ordering::Relaxed)
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wakes the accept, which then sees the flag and ends, closing the listener.
        let _ = TcpStream::connect_timeout(&self.address, Duration::from_secs(1));
    }
}

/// The name of a backend that echoes every request ([`Backend::start_echo`]) starts with this.
const ECHO_EVERY_REQUEST: &str = "echo:";

impl Backend {
    /// A backend that answers every request with `echo:NAME`, a blank line and the request head
    /// it got (request line, host, headers), as the Gateway API conformance suite's echo server
    /// reports which Service answered and what the request was. [`Echoed::of`] reads it.
    pub fn start_echo(name: &str) -> Backend {
        Backend::start(&format!("{ECHO_EVERY_REQUEST}{name}"))
    }
}

/// What an echo backend ([`Backend::start_echo`]) says it got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Echoed {
    /// The backend's name.
    pub backend: String,
    pub method: String,
    /// The request target, as the backend got it.
    pub path: String,
    /// Each header line, name lowercased.
    pub headers: Vec<(String, String)>,
}

impl Echoed {
    /// The echo in a response's body, `None` when the body is no echo.
    pub fn of(body: &str) -> Option<Echoed> {
        let rest = body.strip_prefix(ECHO_EVERY_REQUEST)?;
        let (name, head) = rest.split_once('\n')?;
        let mut lines = head.lines();
        let request_line = lines.next()?;
        let mut parts = request_line.split_whitespace();
        let method = parts.next()?.to_owned();
        let path = parts.next()?.to_owned();
        let headers = lines
            .filter_map(|l| {
                let (n, v) = l.split_once(':')?;
                Some((n.trim().to_ascii_lowercase(), v.trim().to_owned()))
            })
            .collect();
        Some(Echoed {
            backend: name.to_owned(),
            method,
            path,
            headers,
        })
    }
}

/// Answers requests on one connection until the client closes it (keep-alive).
fn serve(mut stream: TcpStream, body: &str, healthy: &AtomicBool, delayed: &AtomicUsize) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
            match stream.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        let end = buf.windows(4).position(|w| w == b"\r\n\r\n").unwrap_or(0) + 4;
        // `GET /delay/<ms>` answers after that many milliseconds: a request in flight for as
        // long as a test needs.
        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
        let path = head.split_whitespace().nth(1).unwrap_or("/");
        let delay = path.strip_prefix("/delay/").and_then(|ms| ms.parse().ok());
        // `GET /status/<code>` answers with that status: a failing backend, for as many
        // requests as a test sends it.
        let asked = path
            .strip_prefix("/status/")
            .and_then(|code| code.parse::<u16>().ok())
            .map(|code| format!("{code} Asked"));
        let status = if path == "/healthz" && !healthy.load(Ordering::Relaxed) {
            "503 Service Unavailable".to_owned()
        } else {
            asked.unwrap_or_else(|| "200 OK".to_owned())
        };
        buf.drain(..end);
        if let Some(ms) = delay {
            delayed.fetch_add(1, Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(ms));
        }
        // `GET /headers` (with a query string or not), and any path with the query `?echo`,
        // answer with the request head it got: what sozu sent the backend.
        let echo = path.split('?').next() == Some("/headers")
            || path.ends_with("?echo")
            || body.starts_with(ECHO_EVERY_REQUEST);
        // An echo backend's answer names it first: which Service answered.
        let named;
        let body = if body.starts_with(ECHO_EVERY_REQUEST) {
            named = format!("{body}\n{head}");
            named.as_str()
        } else if echo {
            head.as_str()
        } else {
            body
        };
        // `GET /respond/<name>/<value>` answers with that header besides: a backend's own
        // header, for a policy to replace.
        let extra = path
            .strip_prefix("/respond/")
            .and_then(|rest| rest.split('?').next()?.split_once('/'))
            .map(|(name, value)| format!("{name}: {value}\r\n"))
            .unwrap_or_default();
        let response = format!(
            "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\n{extra}Content-Length: {}\r\n\r\n{body}",
            body.len()
        );
        if stream.write_all(response.as_bytes()).is_err() {
            return;
        }
    }
}

/// What an HTTPS request through sozu saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    /// SHA-256 of the leaf certificate's DER, lowercase hex.
    pub fingerprint: String,
    pub status: u16,
    pub body: String,
}

#[derive(Debug)]
struct AcceptAny;

impl rustls::client::danger::ServerCertVerifier for AcceptAny {
    fn verify_server_cert(
        &self,
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &[rustls::pki_types::CertificateDer<'_>],
        _: &rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }
    fn verify_tls13_signature(
        &self,
        _: &[u8],
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        rustls::crypto::ring::default_provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}

fn tls_config() -> Arc<rustls::ClientConfig> {
    static CONFIG: OnceLock<Arc<rustls::ClientConfig>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let mut config = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .expect("protocol versions")
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AcceptAny))
                .with_no_client_auth();
            // A resumed session reports the certificate of the session it resumes, not the one
            // the server would present now: every probe must be a full handshake.
            config.resumption = rustls::client::Resumption::disabled();
            Arc::new(config)
        })
        .clone()
}

/// One HTTPS GET to `host` through `address` on a new connection: the certificate the handshake
/// presented, and the response. Errors are strings: a test asserts on them or retries.
pub fn https_get(address: SocketAddr, host: &str, path: &str) -> Result<Seen, String> {
    https_get_with(tls_config(), address, host, path)
}

/// [`https_get`], accepting only a certificate chain that leads to `root_pem` and names `host`.
pub fn https_get_verified(
    address: SocketAddr,
    host: &str,
    path: &str,
    root_pem: &str,
) -> Result<Seen, String> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for der in rustls::pki_types::CertificateDer::pem_slice_iter(root_pem.as_bytes()) {
        roots
            .add(der.map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.resumption = rustls::client::Resumption::disabled();
    https_get_with(Arc::new(config), address, host, path)
}

/// A device's certificate chain and key (PEM), as a client presents them.
#[derive(Debug, Clone)]
pub struct ClientIdentity {
    pub chain_pem: String,
    pub key_pem: String,
}

/// [`https_get`] by a client that offers only `versions` of TLS and presents `identity`, if
/// any.
pub fn https_get_as(
    address: SocketAddr,
    host: &str,
    path: &str,
    versions: &[&'static rustls::SupportedProtocolVersion],
    identity: Option<&ClientIdentity>,
) -> Result<Seen, String> {
    https_get_with(client_config_as(versions, identity)?, address, host, path)
}

/// [`https_get_as`], sending `headers` (name, value) with the request.
pub fn https_get_as_sending(
    address: SocketAddr,
    host: &str,
    path: &str,
    identity: &ClientIdentity,
    headers: &[(&str, &str)],
) -> Result<Seen, String> {
    let config = client_config_as(
        &[&rustls::version::TLS13, &rustls::version::TLS12],
        Some(identity),
    )?;
    let lines: String = headers
        .iter()
        .map(|(name, value)| format!("{name}: {value}\r\n"))
        .collect();
    https_exchange_full(config, address, host, path, &[], &lines).map(|(seen, _)| seen)
}

/// A client's TLS configuration: `versions` offered, `identity` presented if any, any server
/// certificate taken.
fn client_config_as(
    versions: &[&'static rustls::SupportedProtocolVersion],
    identity: Option<&ClientIdentity>,
) -> Result<Arc<rustls::ClientConfig>, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(versions)
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAny));
    let mut config = match identity {
        Some(identity) => {
            let chain = CertificateDer::pem_slice_iter(identity.chain_pem.as_bytes())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| e.to_string())?;
            let key = PrivateKeyDer::from_pem_slice(identity.key_pem.as_bytes())
                .map_err(|e| e.to_string())?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| e.to_string())?
        }
        None => builder.with_no_client_auth(),
    };
    config.resumption = rustls::client::Resumption::disabled();
    Ok(Arc::new(config))
}

/// [`https_get`], with the response's header fields (names lowercase) beside what it saw.
pub fn https_get_with_headers(
    address: SocketAddr,
    host: &str,
    path: &str,
) -> Result<(Seen, Vec<(String, String)>), String> {
    https_exchange(tls_config(), address, host, path)
}

/// One HTTPS GET of `/` to `host`: what it saw, and the `Strict-Transport-Security` values of
/// the response.
pub fn strict_transport_security(
    address: SocketAddr,
    host: &str,
) -> Result<(Seen, Vec<String>), String> {
    let (seen, headers) = https_get_with_headers(address, host, "/")?;
    let values = headers
        .into_iter()
        .filter(|(name, _)| name == "strict-transport-security")
        .map(|(_, value)| value)
        .collect();
    Ok((seen, values))
}

fn https_get_with(
    config: Arc<rustls::ClientConfig>,
    address: SocketAddr,
    host: &str,
    path: &str,
) -> Result<Seen, String> {
    https_exchange(config, address, host, path).map(|(seen, _)| seen)
}

/// [`https_get`] through a load balancer that speaks the PROXY protocol (v2): the connection
/// starts with a header saying it comes from `client`.
pub fn https_get_behind_proxy(
    address: SocketAddr,
    host: &str,
    path: &str,
    client: std::net::SocketAddrV4,
) -> Result<Seen, String> {
    let SocketAddr::V4(server) = address else {
        return Err("an IPv4 listener only".into());
    };
    let mut header = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
    // Version 2, PROXY; TCP over IPv4; 12 bytes of addresses and ports.
    header.extend_from_slice(&[0x21, 0x11, 0x00, 0x0c]);
    header.extend_from_slice(&client.ip().octets());
    header.extend_from_slice(&server.ip().octets());
    header.extend_from_slice(&client.port().to_be_bytes());
    header.extend_from_slice(&server.port().to_be_bytes());
    https_exchange_after(tls_config(), address, host, path, &header).map(|(seen, _)| seen)
}

/// The `Authorization` value of HTTP basic auth for `user` and `password`.
pub fn basic_auth(user: &str, password: &str) -> String {
    use base64::Engine;
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
    )
}

/// A users file's line for `user` and `password`: `user:` and the password's SHA-256 in
/// lowercase hex, as sozu compares it (and `just basic-auth-user` writes it).
pub fn users_line(user: &str, password: &str) -> String {
    use sha2::Digest;
    let hash: String = sha2::Sha256::digest(password.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("{user}:{hash}\n")
}

/// [`https_get_with_headers`], sending `headers` (name, value) with the request.
pub fn https_get_sending(
    address: SocketAddr,
    host: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<(Seen, Vec<(String, String)>), String> {
    let lines: String = headers
        .iter()
        .map(|(name, value)| format!("{name}: {value}\r\n"))
        .collect();
    https_exchange_full(tls_config(), address, host, path, &[], &lines)
}

/// One HTTPS request of `method` (an empty body) to `host` on a new connection, sending
/// `headers` (name, value): what it saw, and the response's header fields.
pub fn https_request(
    address: SocketAddr,
    host: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<(Seen, Vec<(String, String)>), String> {
    let lines: String = headers
        .iter()
        .map(|(name, value)| format!("{name}: {value}\r\n"))
        .collect();
    https_exchange_method(tls_config(), address, host, method, path, &[], &lines)
}

/// How long a one-off request waits for the server to answer. Not a measure of speed: on a
/// loaded machine the host can stall a proxy for seconds (two pods' handshakes once waited over
/// 5 s together), and a test that needs an answer should not fail for that.
const SERVER_PATIENCE: Duration = Duration::from_secs(30);

/// For an error: how long the request had waited, and what the kernel says of stalls
/// (`/proc/pressure`), to tell a stalled machine from a proxy that does not answer.
fn stalled(started: Instant) -> String {
    let pressure: Vec<String> = ["cpu", "io", "memory"]
        .iter()
        .filter_map(|what| {
            let text = std::fs::read_to_string(format!("/proc/pressure/{what}")).ok()?;
            Some(format!("{what}: {}", text.trim().replace('\n', "; ")))
        })
        .collect();
    format!(
        " (after {:.1} s; pressure {})",
        started.elapsed().as_secs_f64(),
        if pressure.is_empty() {
            "unknown".to_owned()
        } else {
            pressure.join(" | ")
        }
    )
}

fn https_exchange(
    config: Arc<rustls::ClientConfig>,
    address: SocketAddr,
    host: &str,
    path: &str,
) -> Result<(Seen, Vec<(String, String)>), String> {
    https_exchange_after(config, address, host, path, &[])
}

/// [`https_exchange`], with `prefix` written on the connection before TLS starts.
fn https_exchange_after(
    config: Arc<rustls::ClientConfig>,
    address: SocketAddr,
    host: &str,
    path: &str,
    prefix: &[u8],
) -> Result<(Seen, Vec<(String, String)>), String> {
    https_exchange_full(config, address, host, path, prefix, "")
}

/// [`https_exchange_after`], with `headers` (whole header lines) in the request.
fn https_exchange_full(
    config: Arc<rustls::ClientConfig>,
    address: SocketAddr,
    host: &str,
    path: &str,
    prefix: &[u8],
    headers: &str,
) -> Result<(Seen, Vec<(String, String)>), String> {
    https_exchange_method(config, address, host, "GET", path, prefix, headers)
}

/// [`https_exchange_full`] with `method` (a request without a body).
fn https_exchange_method(
    config: Arc<rustls::ClientConfig>,
    address: SocketAddr,
    host: &str,
    method: &str,
    path: &str,
    prefix: &[u8],
    headers: &str,
) -> Result<(Seen, Vec<(String, String)>), String> {
    let server_name =
        rustls::pki_types::ServerName::try_from(host.to_owned()).map_err(|e| e.to_string())?;
    let mut conn = rustls::ClientConnection::new(config, server_name).map_err(|e| e.to_string())?;
    let mut sock = TcpStream::connect_timeout(&address, Duration::from_secs(2))
        .map_err(|e| format!("connect: {e}"))?;
    sock.set_read_timeout(Some(SERVER_PATIENCE)).ok();
    let started = Instant::now();
    if !prefix.is_empty() {
        sock.write_all(prefix)
            .map_err(|e| format!("write the PROXY header: {e}"))?;
    }
    let mut tls = rustls::Stream::new(&mut conn, &mut sock);
    // A method other than GET and HEAD says it sends no body.
    let length = if matches!(method, "GET" | "HEAD") {
        ""
    } else {
        "Content-Length: 0\r\n"
    };
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\n{headers}{length}Connection: close\r\n\r\n"
    );
    tls.write_all(request.as_bytes())
        .map_err(|e| format!("handshake or write: {e}{}", stalled(started)))?;
    let mut response = Vec::new();
    let read = tls.read_to_end(&mut response);
    let leaf = conn
        .peer_certificates()
        .and_then(|c| c.first())
        .ok_or("no peer certificate")?;
    let fingerprint = fingerprint_of_der(leaf.as_ref());
    if response.is_empty() {
        return Err(format!("empty response ({read:?}){}", stalled(started)));
    }
    let text = String::from_utf8_lossy(&response);
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("not HTTP: {text}"))?;
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let headers = head
        .lines()
        .skip(1)
        .filter_map(|line| {
            let (name, value) = line.split_once(':')?;
            Some((name.trim().to_ascii_lowercase(), value.trim().to_owned()))
        })
        .collect();
    Ok((
        Seen {
            fingerprint,
            status,
            body: body.to_owned(),
        },
        headers,
    ))
}

/// One TLS connection kept open for many HTTP/1.1 requests (keep-alive).
pub struct KeepAlive {
    tls: rustls::StreamOwned<rustls::ClientConnection, TcpStream>,
    host: String,
    buffer: Vec<u8>,
}

impl KeepAlive {
    pub fn connect(address: SocketAddr, host: &str) -> Result<KeepAlive, String> {
        let server_name =
            rustls::pki_types::ServerName::try_from(host.to_owned()).map_err(|e| e.to_string())?;
        let conn =
            rustls::ClientConnection::new(tls_config(), server_name).map_err(|e| e.to_string())?;
        let sock = TcpStream::connect_timeout(&address, Duration::from_secs(2))
            .map_err(|e| format!("connect: {e}"))?;
        sock.set_read_timeout(Some(Duration::from_secs(5))).ok();
        Ok(KeepAlive {
            tls: rustls::StreamOwned::new(conn, sock),
            host: host.to_owned(),
            buffer: Vec::new(),
        })
    }

    /// How long a read waits for the server (5 s from [`KeepAlive::connect`]).
    pub fn set_read_timeout(&mut self, timeout: Duration) -> Result<(), String> {
        self.tls
            .sock
            .set_read_timeout(Some(timeout))
            .map_err(|e| format!("read timeout: {e}"))
    }

    /// Whether part of a response has arrived that [`KeepAlive::get`] has not returned: after an
    /// error, false means the server sent nothing for the request.
    pub fn is_response_started(&self) -> bool {
        !self.buffer.is_empty()
    }

    /// One GET on the open connection: (status, body).
    pub fn get(&mut self, path: &str) -> Result<(u16, String), String> {
        self.send(path)?;
        self.receive()
    }

    /// Sends a GET (completing the handshake first, on a new connection) without waiting for
    /// the response: the request is in flight when this returns.
    pub fn send(&mut self, path: &str) -> Result<(), String> {
        let request = format!("GET {path} HTTP/1.1\r\nHost: {}\r\n\r\n", self.host);
        self.tls
            .write_all(request.as_bytes())
            .and_then(|()| self.tls.flush())
            .map_err(|e| format!("write: {e}"))
    }

    /// Sends the first part of a request head and never the rest: a client too slow to send
    /// its request.
    pub fn send_partial_head(&mut self) -> Result<(), String> {
        let partial = format!("GET / HTTP/1.1\r\nHost: {}\r\n", self.host);
        self.tls
            .write_all(partial.as_bytes())
            .and_then(|()| self.tls.flush())
            .map_err(|e| format!("write: {e}"))
    }

    /// Reads until the server closes the connection (or `patience` passes): what it sent.
    pub fn read_until_closed(&mut self, patience: Duration) -> Result<String, String> {
        self.set_read_timeout(patience)?;
        let mut all = Vec::new();
        match self.tls.read_to_end(&mut all) {
            Ok(_) => Ok(String::from_utf8_lossy(&all).into_owned()),
            Err(e)
                if e.kind() == std::io::ErrorKind::UnexpectedEof
                    || e.kind() == std::io::ErrorKind::ConnectionReset =>
            {
                Ok(String::from_utf8_lossy(&all).into_owned())
            }
            Err(e) => Err(format!("read: {e}")),
        }
    }

    /// The response to the request [`KeepAlive::send`] sent: (status, body).
    pub fn receive(&mut self) -> Result<(u16, String), String> {
        let mut chunk = [0u8; 4096];
        loop {
            if let Some(end) = self.buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&self.buffer[..end]).into_owned();
                let length: usize = head
                    .lines()
                    .find_map(|l| {
                        let (name, value) = l.split_once(':')?;
                        name.eq_ignore_ascii_case("content-length")
                            .then(|| value.trim().parse().ok())?
                    })
                    .ok_or_else(|| format!("no Content-Length in {head}"))?;
                if self.buffer.len() >= end + 4 + length {
                    let body = String::from_utf8_lossy(&self.buffer[end + 4..end + 4 + length])
                        .into_owned();
                    self.buffer.drain(..end + 4 + length);
                    let status = head
                        .split_whitespace()
                        .nth(1)
                        .and_then(|s| s.parse().ok())
                        .ok_or_else(|| format!("not HTTP: {head}"))?;
                    return Ok((status, body));
                }
            }
            match self.tls.read(&mut chunk) {
                Ok(0) => return Err("connection closed".into()),
                Ok(n) => self.buffer.extend_from_slice(&chunk[..n]),
                Err(e) => return Err(format!("read: {e}")),
            }
        }
    }
}

/// The value of one series in a scrape (`name{labels}` exactly as rendered), if it has it.
pub fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|line| {
        let (key, value) = line.rsplit_once(' ')?;
        (key == series).then(|| value.parse().ok()).flatten()
    })
}

/// `promtool check metrics` on a scrape (scripts/test installs Debian's prometheus package).
pub fn promtool_check(metrics: &str) -> Result<(), String> {
    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (scripts/test installs Debian's prometheus package)");
    let written = promtool
        .stdin
        .take()
        .expect("promtool's stdin")
        .write_all(metrics.as_bytes());
    let out = promtool.wait_with_output().map_err(|e| e.to_string())?;
    written.map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "promtool: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// A certificate written under the tls dir, and its fingerprint.
pub fn certificate(tls_dir: &Path, host: &str) -> String {
    fingerprint_of_pem(&crate::write_certificate(tls_dir, host))
}

fn pem_to_der(pem: &str) -> Vec<u8> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::from_pem_slice(pem.as_bytes())
        .expect("a PEM certificate")
        .to_vec()
}

/// A route for [`Stack::workspace_text`].
pub struct RouteSpec {
    pub host: String,
    pub upstream: String,
    pub port: Option<u16>,
}

/// A TCP echo server on loopback, each connection on a thread of its own: the backend of a
/// `'tcp` route whose bytes a test checks.
pub fn echo_backend() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind the echo backend");
    let address = listener.local_addr().expect("the echo backend's address");
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
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

/// sozu, the agent and their files in one short temporary directory.
pub struct Stack {
    pub dir: tempfile::TempDir,
    pub https: SocketAddr,
    pub http: SocketAddr,
    pub admin: SocketAddr,
    /// Where this stack's agent receives sozu's records: a port of its own, so that agents of
    /// tests run side by side never contend for the default one.
    traffic: SocketAddr,
    sozu: Option<Process>,
    agent: Option<Process>,
    agent_runs: usize,
}

impl Stack {
    pub fn new() -> Stack {
        let dir = short_tempdir();
        std::fs::create_dir_all(dir.path().join("run")).expect("run dir");
        std::fs::create_dir_all(dir.path().join("tls")).expect("tls dir");
        std::fs::create_dir_all(dir.path().join("ws")).expect("workspace dir");
        let https = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let http = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let admin = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let traffic = SocketAddr::from(([127, 0, 0, 1], free_port()));
        std::fs::write(
            dir.path().join("sozu.toml"),
            format!(
                "command_socket = \"{run}/sozu.sock\"\nlog_level = \"info\"\nlog_target = \"stdout\"\n\
                 worker_count = 1\nworker_automatic_restart = true\npid_file_path = \"{run}/sozu.pid\"\n\
                 ctl_command_timeout = 5000\nmax_command_buffer_size = {buffer}\n",
                run = dir.path().join("run").display(),
                // As a rendered configuration has it for the largest workspace the benches run
                // (10,000 routes, 16 KiB each): room to read back the whole state.
                buffer = 10_000 * 16 * 1024
            ),
        )
        .expect("write sozu.toml");
        Stack {
            dir,
            https,
            http,
            admin,
            traffic,
            sozu: None,
            agent: None,
            agent_runs: 0,
        }
    }

    /// Leaves `max_command_buffer_size` out of sozu's configuration from its next start: sozu's
    /// own default (2,000,000 bytes), as a sozu configured without the rendered file has it.
    pub fn use_default_command_buffer(&self) {
        let path = self.dir.path().join("sozu.toml");
        let config = std::fs::read_to_string(&path).expect("read sozu.toml");
        let config: String = config
            .lines()
            .filter(|l| !l.starts_with("max_command_buffer_size"))
            .map(|l| format!("{l}\n"))
            .collect();
        std::fs::write(&path, config).expect("write sozu.toml");
    }

    /// sozu's log level from its next start (`info` by default; `debug` logs each request its
    /// worker applies, with a timestamp).
    pub fn set_sozu_log_level(&self, level: &str) {
        let path = self.dir.path().join("sozu.toml");
        let config = std::fs::read_to_string(&path).expect("read sozu.toml");
        let config = config.replace("log_level = \"info\"", &format!("log_level = \"{level}\""));
        std::fs::write(&path, config).expect("write sozu.toml");
    }

    /// Has sozu (from its next start) send its access-log records to a loopback UDP port, as a
    /// rendered configuration does; returns the workspace field that has the agent receive them
    /// there (`extra` for [`Stack::workspace_text_with`]).
    pub fn send_traffic(&self) -> String {
        let path = self.dir.path().join("sozu.toml");
        let mut config = std::fs::read_to_string(&path).expect("read sozu.toml");
        config.push_str(&format!(
            "access_logs_target = \"udp://{}\"\naccess_logs_format = \"protobuf\"\n",
            self.traffic
        ));
        std::fs::write(&path, config).expect("write sozu.toml");
        self.traffic_field()
    }

    /// The workspace field that has the agent receive sozu's records on this stack's port.
    fn traffic_field(&self) -> String {
        format!("  traffic = {{ listen = \"{}\" }},\n", self.traffic)
    }

    pub fn tls_dir(&self) -> PathBuf {
        self.dir.path().join("tls")
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("run/sozu.sock")
    }

    pub fn workspace_path(&self) -> PathBuf {
        self.dir.path().join("ws/workspace.ncl")
    }

    pub fn workspace_text(&self, routes: &[RouteSpec]) -> String {
        self.workspace_text_with(routes, "")
    }

    /// [`Stack::workspace_text`] with more workspace fields (`extra`: Nickel field definitions,
    /// each ending in a comma).
    pub fn workspace_text_with(&self, routes: &[RouteSpec], extra: &str) -> String {
        let routes: Vec<String> = routes
            .iter()
            .map(|r| match r.port {
                Some(port) => format!(
                    "{{ host = \"{}\", upstream = \"{}\", port = {port} }}",
                    r.host, r.upstream
                ),
                None => format!("{{ host = \"{}\", upstream = \"{}\" }}", r.host, r.upstream),
            })
            .collect();
        self.workspace_text_of(&routes, extra)
    }

    /// A workspace of routes written as Nickel records (`routes`), with more workspace fields
    /// (`extra`, as for [`Stack::workspace_text_with`]).
    /// Unless `extra` sets `traffic` (or a field of it), the agent receives sozu's records on
    /// this stack's port.
    pub fn workspace_text_of(&self, routes: &[String], extra: &str) -> String {
        let extra = if extra.contains("traffic =") || extra.contains("traffic.") {
            extra.to_owned()
        } else {
            format!("{extra}{}", self.traffic_field())
        };
        let mut text = format!(
            "{{\n  zone = \"in.example.org\",\n  cluster_issuer = \"internal-ca\",\n  tls_dir = \"{}\",\n  \
             listeners = {{ https = \"{}\", http = \"{}\" }},\n{extra}\n  routes = [\n",
            self.tls_dir().display(),
            self.https,
            self.http
        );
        for route in routes {
            text.push_str(&format!("    {route},\n"));
        }
        text.push_str("  ],\n}\n");
        text
    }

    /// Writes the workspace in place.
    pub fn write_workspace(&self, text: &str) {
        std::fs::write(self.workspace_path(), text).expect("write the workspace");
    }

    pub fn start_sozu(&mut self) {
        let log = self.dir.path().join("sozu.log");
        let mut cmd = Command::new(sozu_bin());
        cmd.arg("start")
            .arg("-c")
            .arg(self.dir.path().join("sozu.toml"));
        // Append, so a restarted sozu does not erase the first one's log.
        let previous = std::fs::read_to_string(&log).unwrap_or_default();
        std::fs::write(self.dir.path().join("sozu.previous.log"), previous).ok();
        self.sozu = Some(Process::spawn(&mut cmd, &log));
        let socket = self.socket();
        eventually(Duration::from_secs(60), "sozu's answer to Status", || {
            sozu_status(&socket).ok()
        });
    }

    /// Kills sozu's main process and its workers, and waits until the workers are gone: left to
    /// themselves they notice the lost main process only later, and serve until then.
    pub fn kill_sozu(&mut self) {
        if let Some(mut p) = self.sozu.take() {
            let workers = children(p.pid());
            p.kill();
            for &worker in &workers {
                let _ = Command::new("kill")
                    .args(["-KILL", &worker.to_string()])
                    .status();
            }
            let deadline = Instant::now() + Duration::from_secs(5);
            while workers.iter().any(|&w| alive(w)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }

    /// Serves one route, `host` → `backend`, whose certificate is already under the tls dir:
    /// writes the workspace, starts sozu and the agent, and waits until the agent is ready.
    pub fn serve_one(&mut self, host: &str, backend: &Backend) {
        self.write_workspace(&self.workspace_text(&[RouteSpec {
            host: host.into(),
            upstream: backend.address.ip().to_string(),
            port: Some(backend.address.port()),
        }]));
        self.start_sozu();
        self.start_agent();
        self.wait_ready(Duration::from_secs(20));
    }

    /// Starts the agent with the default flags; `AGENT_LOG` (a `RUST_LOG` filter, `info` when
    /// unset) sets its log level.
    pub fn start_agent(&mut self) {
        self.start_agent_args(&[]);
    }

    /// [`Self::start_agent`] with `args` added to the agent's command line.
    pub fn start_agent_args(&mut self, args: &[&str]) {
        self.start_agent_with(
            args,
            &[(
                "RUST_LOG",
                &std::env::var("AGENT_LOG").unwrap_or_else(|_| "info".into()),
            )],
        );
    }

    /// The agent's process id, while it runs.
    /// sozu's main process (its workers are its children).
    pub fn sozu_pid(&self) -> Option<u32> {
        self.sozu.as_ref().map(Process::pid)
    }

    /// sozu's workers (the children of its main process).
    pub fn sozu_worker_pids(&self) -> Vec<u32> {
        self.sozu_pid().map(children).unwrap_or_default()
    }

    pub fn agent_pid(&self) -> Option<u32> {
        self.agent.as_ref().map(Process::pid)
    }

    /// Starts sozu with another configuration file (for baselines that load state from a file).
    pub fn start_sozu_with_config(&mut self, config: &Path) {
        let log = self.dir.path().join("sozu.log");
        let mut cmd = Command::new(sozu_bin());
        cmd.arg("start").arg("-c").arg(config);
        self.sozu = Some(Process::spawn(&mut cmd, &log));
    }

    /// Starts the agent with extra arguments and environment variables.
    pub fn start_agent_with(&mut self, args: &[&str], env: &[(&str, &str)]) {
        let cmd = Command::new(agent_bin());
        self.start_agent_as(cmd, args, env);
    }

    /// Starts another build of the agent (a baseline a benchmark compares with).
    pub fn start_agent_from(&mut self, bin: &Path, args: &[&str], env: &[(&str, &str)]) {
        self.start_agent_as(Command::new(bin), args, env);
    }

    /// Starts the agent in a mount namespace of its own in which `hosts` is its `/etc/hosts` and
    /// `resolv_conf` its `/etc/resolv.conf`: the system's resolver configuration, which the agent
    /// reads, says only what the test writes. Needs `unshare` and the right to mount (root, as in
    /// CI); panics without them rather than testing nothing.
    pub fn start_agent_with_resolver(&mut self, hosts: &Path, resolv_conf: &Path, args: &[&str]) {
        let allowed = Command::new("unshare")
            .args(["--mount", "sh", "-c", "mount --bind /etc/hosts /etc/hosts"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        assert!(
            allowed,
            "this test gives the agent its own /etc/hosts and /etc/resolv.conf: it needs unshare \
             and the right to mount (root)"
        );
        let mut cmd = Command::new("unshare");
        cmd.args([
            "--mount",
            "sh",
            "-c",
            "mount --bind \"$1\" /etc/hosts && mount --bind \"$2\" /etc/resolv.conf \
             && shift 2 && exec \"$@\"",
            "sh",
        ])
        .arg(hosts)
        .arg(resolv_conf)
        .arg(agent_bin());
        self.start_agent_as(cmd, args, &[("RUST_LOG", "info")]);
    }

    /// Waits until the running agent has logged a line containing `needle`.
    pub fn wait_agent_log(&self, needle: &str, timeout: Duration) {
        let log = self
            .dir
            .path()
            .join(format!("agent.{}.log", self.agent_runs));
        eventually_every(Duration::from_millis(1), timeout, needle, || {
            std::fs::read_to_string(&log)
                .ok()
                .filter(|text| text.contains(needle))
                .map(|_| ())
        });
    }

    /// Runs `cmd` (the agent, or a wrapper that ends by running it) with the usual flags.
    fn start_agent_as(&mut self, mut cmd: Command, args: &[&str], env: &[(&str, &str)]) {
        self.agent_runs += 1;
        let log = self
            .dir
            .path()
            .join(format!("agent.{}.log", self.agent_runs));
        cmd.arg("run")
            .arg("--workspace")
            .arg(self.workspace_path())
            .arg("--sozu-socket")
            .arg(self.socket())
            .arg("--admin-address")
            .arg(self.admin.to_string())
            .args(args)
            .envs(env.iter().copied());
        self.agent = Some(Process::spawn(&mut cmd, &log));
    }

    /// SIGTERM to the agent; returns whether it exited successfully in time.
    pub fn stop_agent(&mut self) -> bool {
        self.stop_agent_status().is_some_and(|s| s.success())
    }

    /// SIGTERM to the agent: its exit status, or `None` when it had to be killed (or none ran):
    /// its program still ran 10 s after, or the kernel had not torn it down 120 s after. For a
    /// failure's message to say which.
    pub fn stop_agent_status(&mut self) -> Option<std::process::ExitStatus> {
        self.agent.take()?.terminate(Duration::from_secs(10))
    }

    /// Sends `signal` (`USR1`, `TERM`, …) to the running agent.
    pub fn signal_agent(&self, signal: &str) {
        if let Some(p) = &self.agent {
            p.signal(signal);
        }
    }

    /// Waits for the running agent to exit on its own; its exit status, or `None` if it still
    /// runs after `timeout`.
    pub fn wait_agent_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let agent = self.agent.as_mut()?;
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(status) = agent.exited() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }

    /// SIGKILL to the agent, as a crash or an OOM kill would end it.
    pub fn kill_agent(&mut self) {
        if let Some(mut p) = self.agent.take() {
            p.kill();
        }
    }

    pub fn state(&self) -> Option<serde_json::Value> {
        let body = ureq::get(&format!("http://{}/v1/state", self.admin))
            .call()
            .ok()?
            .body_mut()
            .read_to_string()
            .ok()?;
        serde_json::from_str(&body).ok()
    }

    /// The agent's `/metrics` text.
    /// `private-ingress status` against the running agent, which must answer (exit 0).
    pub fn status_text(&self) -> String {
        let (code, out, err) = crate::run(
            Command::new(agent_bin())
                .arg("status")
                .arg("--admin-address")
                .arg(self.admin.to_string()),
        );
        assert_eq!(code, 0, "status: {out}{err}");
        out
    }

    pub fn metrics(&self) -> String {
        // No size limit: at 10,000 routes the text is larger than ureq's default of 10 MiB.
        ureq::get(&format!("http://{}/metrics", self.admin))
            .call()
            .and_then(|mut r| r.body_mut().with_config().limit(u64::MAX).read_to_string())
            .expect("GET /metrics")
    }

    pub fn ready(&self) -> bool {
        ureq::get(&format!("http://{}/readyz", self.admin))
            .call()
            .is_ok()
    }

    /// `/readyz`'s status code and body, whatever the status (`None` while nothing answers).
    pub fn readyz(&self) -> Option<(u16, String)> {
        let mut response = ureq::get(&format!("http://{}/readyz", self.admin))
            .config()
            .http_status_as_error(false)
            .build()
            .call()
            .ok()?;
        let status = response.status().as_u16();
        let body = response.body_mut().read_to_string().ok()?;
        Some((status, body))
    }

    pub fn wait_ready(&self, timeout: Duration) {
        eventually(timeout, "the agent's /readyz", || {
            self.ready().then_some(())
        })
    }

    /// What the agent running now (the last one started) has logged so far.
    pub fn current_agent_log(&self) -> String {
        std::fs::read_to_string(
            self.dir
                .path()
                .join(format!("agent.{}.log", self.agent_runs)),
        )
        .unwrap_or_default()
    }

    /// Everything every agent run of this stack logged.
    pub fn agent_logs(&self) -> String {
        (1..=self.agent_runs)
            .map(|i| {
                std::fs::read_to_string(self.dir.path().join(format!("agent.{i}.log")))
                    .unwrap_or_default()
            })
            .collect()
    }

    /// Both processes' logs, for failure messages.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        let mut names: Vec<_> = std::fs::read_dir(self.dir.path())
            .map(|d| d.filter_map(Result::ok).map(|e| e.path()).collect())
            .unwrap_or_default();
        names.sort();
        for path in names {
            if path.extension().is_some_and(|e| e == "log") {
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                let tail: Vec<_> = text.lines().rev().take(60).collect();
                out.push_str(&format!("--- {} (last 60 lines)\n", path.display()));
                for line in tail.into_iter().rev() {
                    out.push_str(line);
                    out.push('\n');
                }
            }
        }
        out
    }
}

/// A name server that never answers: it takes every query on UDP and TCP port 53 of a loopback
/// address of its own and drops it, as a cluster DNS does while it restarts or when a
/// NetworkPolicy drops DNS. Binding port 53 needs root.
pub struct SilentNameServer {
    pub address: std::net::Ipv4Addr,
    stop: Arc<AtomicBool>,
    _tcp: TcpListener,
}

impl SilentNameServer {
    pub fn start() -> SilentNameServer {
        let (udp, tcp, address) = (1..=250u8)
            .find_map(|last| {
                let address = Ipv4Addr::new(127, 53, 53, last);
                let udp = std::net::UdpSocket::bind((address, 53)).ok()?;
                let tcp = TcpListener::bind((address, 53)).ok()?;
                Some((udp, tcp, address))
            })
            .expect("a loopback address with port 53 free (binding port 53 needs root)");
        udp.set_read_timeout(Some(Duration::from_millis(100)))
            .expect("read timeout");
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while !stopped.load(Ordering::Relaxed) {
                // Swallowed.
                let _ = udp.recv_from(&mut buf);
            }
        });
        SilentNameServer {
            address,
            stop,
            _tcp: tcp,
        }
    }

    /// A resolv.conf naming only this server, with glibc's default timing spelled out.
    pub fn resolv_conf(&self) -> String {
        format!(
            "nameserver {}\noptions timeout:5 attempts:2\n",
            self.address
        )
    }
}

impl Drop for SilentNameServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl Default for Stack {
    fn default() -> Self {
        Stack::new()
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", self.logs());
        }
        // sozu's workers with it, not just its main process.
        self.kill_sozu();
    }
}

/// A certificate pair written the way cert-manager's CSI driver and kubelet Secret volumes
/// write it ([`crate::kubelet::volumes::atomic_write`]): the key first here, as the writer's
/// order is undefined.
/// Returns when the `..data` link was renamed into place: the moment a watcher can see the swap.
pub fn atomic_write(dir: &Path, crt: &str, key: &str, generation: u32) -> std::time::SystemTime {
    crate::kubelet::volumes::atomic_write(
        dir,
        &[
            ("tls.key".into(), key.as_bytes().to_vec(), 0o644),
            ("tls.crt".into(), crt.as_bytes().to_vec(), 0o644),
        ],
        None,
        generation,
    )
}

/// The SHA-256 fingerprint (lower-case hex) of the first certificate in `pem`.
pub fn fingerprint_of_pem(pem: &str) -> String {
    fingerprint_of_der(&pem_to_der(pem))
}

/// The SHA-256 fingerprint (lower-case hex) of a DER certificate: how sozu and the agent name it.
pub fn fingerprint_of_der(der: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(der)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The client configuration [`https_get`] uses: any server certificate accepted, session
/// resumption disabled so every handshake presents the certificate served now. For probes that
/// drive handshakes themselves (the rotation benchmark).
pub fn client_config() -> Arc<rustls::ClientConfig> {
    tls_config()
}

impl KeepAlive {
    /// Turns Nagle's algorithm off, as HTTP clients do; call it before the first request (the
    /// handshake happens then). Without it, a new connection's first request can wait for a
    /// delayed ACK (40 ms) after the client's Finished.
    pub fn set_nodelay(&self) -> std::io::Result<()> {
        self.tls.sock.set_nodelay(true)
    }
}

/// Adds (or replaces: sozu upserts) backend `backend_id` of `cluster_id` at `address` with
/// `weight`, straight on sozu's command socket, as an operator's tool would: for requests the
/// agent never sends.
/// Asks sozu at `socket` for its `Status` (its workers' states): `Ok` once it answers that,
/// which is when it can take requests, and not merely when its socket file exists.
pub fn sozu_status(socket: &Path) -> Result<(), String> {
    sozu_request(
        socket,
        sozu_command_lib::proto::command::request::RequestType::Status(
            sozu_command_lib::proto::command::Status {},
        ),
    )
}

/// One request to sozu at `socket`, and its final answer.
fn sozu_request(
    socket: &Path,
    request: sozu_command_lib::proto::command::request::RequestType,
) -> Result<(), String> {
    let mut sozu = SozuConnection::connect(socket)?;
    sozu.write(request)?;
    sozu.answer(Duration::from_secs(5))
}

/// A connection to sozu's socket, kept open as an agent keeps its own: requests written, and
/// each one's final answer read apart, so that a caller may do something in between.
pub struct SozuConnection(
    sozu_command_lib::channel::Channel<
        sozu_command_lib::proto::command::Request,
        sozu_command_lib::proto::command::Response,
    >,
);

impl SozuConnection {
    pub fn connect(socket: &Path) -> Result<SozuConnection, String> {
        let mut channel = sozu_command_lib::channel::Channel::from_path(
            &socket.to_string_lossy(),
            1_000_000,
            2_000_000,
        )
        .map_err(|e| format!("connect to {}: {e}", socket.display()))?;
        channel.blocking().map_err(|e| e.to_string())?;
        Ok(SozuConnection(channel))
    }

    pub fn write(
        &mut self,
        request: sozu_command_lib::proto::command::request::RequestType,
    ) -> Result<(), String> {
        self.0
            .write_message(&sozu_command_lib::proto::command::Request::from(request))
            .map_err(|e| e.to_string())
    }

    /// The final answer to the request written last, waited for at most `wait` a message.
    pub fn answer(&mut self, wait: Duration) -> Result<(), String> {
        use sozu_command_lib::proto::command::ResponseStatus;
        loop {
            let response = self
                .0
                .read_message_blocking_timeout(Some(wait))
                .map_err(|e| e.to_string())?;
            match response.status() {
                ResponseStatus::Processing => continue,
                ResponseStatus::Ok => return Ok(()),
                ResponseStatus::Failure => return Err(response.message),
            }
        }
    }
}

/// Replaces the certificate of fingerprint `old` on the listener at `address` with `chain` and
/// `key`, as someone else with access to sozu's socket would.
pub fn sozu_replace_certificate(
    socket: &Path,
    address: SocketAddr,
    old: &str,
    chain: &str,
    key: &str,
) -> Result<(), String> {
    use sozu_command_lib::proto::command::{
        request::RequestType, CertificateAndKey, ReplaceCertificate,
    };
    let request = RequestType::ReplaceCertificate(ReplaceCertificate {
        address: address.into(),
        new_certificate: CertificateAndKey {
            certificate: chain.to_owned(),
            key: key.to_owned(),
            ..Default::default()
        },
        old_fingerprint: old.to_owned(),
        new_expired_at: None,
    });
    sozu_request(socket, request)
}

pub fn sozu_add_backend(
    socket: &Path,
    cluster_id: &str,
    backend_id: &str,
    address: SocketAddr,
    weight: i32,
) -> Result<(), String> {
    use sozu_command_lib::proto::command::{request::RequestType, AddBackend, LoadBalancingParams};
    let request = RequestType::AddBackend(AddBackend {
        cluster_id: cluster_id.to_owned(),
        backend_id: backend_id.to_owned(),
        address: address.into(),
        load_balancing_parameters: Some(LoadBalancingParams { weight }),
        ..Default::default()
    });
    sozu_request(socket, request)
}
