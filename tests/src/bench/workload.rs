//! The workload every system goes through, one code path for all: N AtomicWriter swaps of the
//! same pre-generated certificates; per swap, handshakes probed back to back until one presents
//! the new certificate, then probed for a while longer to catch the old one coming back; and,
//! around all swaps, HTTPS load on a new connection per request and on kept-alive connections.

use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::{System, HOST};
use crate::live::{atomic_write, client_config, KeepAlive};

/// A certificate and its key (ECDSA P-256, rcgen's default: cheap handshakes), with the leaf's
/// SHA-256 fingerprint.
#[derive(Clone)]
pub struct Pair {
    pub crt: String,
    pub key: String,
    pub fingerprint: String,
}

impl Pair {
    pub fn new(host: &str) -> Pair {
        let certified = rcgen::generate_simple_self_signed(vec![host.to_owned()])
            .expect("generate a certificate");
        let crt = certified.cert.pem();
        Pair {
            fingerprint: crate::live::fingerprint_of_pem(&crt),
            key: certified.signing_key.serialize_pem(),
            crt,
        }
    }
}

/// `n` pairs for `host`, generated before any clock starts.
pub fn pairs(host: &str, n: usize) -> Vec<Pair> {
    (0..n).map(|_| Pair::new(host)).collect()
}

/// One full TLS handshake (SNI `host`, no resumption) on a new connection: the leaf certificate's
/// fingerprint and the moment the handshake completed. No request is sent.
pub fn handshake(address: SocketAddr, host: &str) -> Result<(String, Instant), String> {
    let name =
        rustls::pki_types::ServerName::try_from(host.to_owned()).map_err(|e| e.to_string())?;
    let mut conn =
        rustls::ClientConnection::new(client_config(), name).map_err(|e| e.to_string())?;
    let mut sock = TcpStream::connect_timeout(&address, Duration::from_secs(2))
        .map_err(|e| format!("connect: {e}"))?;
    sock.set_read_timeout(Some(Duration::from_secs(5))).ok();
    sock.set_nodelay(true).ok();
    while conn.is_handshaking() {
        conn.complete_io(&mut sock)
            .map_err(|e| format!("handshake: {e}"))?;
    }
    let done = Instant::now();
    let leaf = conn
        .peer_certificates()
        .and_then(|c| c.first())
        .ok_or("no peer certificate")?;
    let fingerprint = crate::live::fingerprint_of_der(leaf.as_ref());
    conn.send_close_notify();
    let _ = conn.write_tls(&mut sock);
    Ok((fingerprint, done))
}

/// Probes until `fingerprint` is served, or `timeout`.
pub fn wait_serving(
    address: SocketAddr,
    fingerprint: &str,
    timeout: Duration,
) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    let mut last = String::from("no handshake yet");
    while Instant::now() < deadline {
        match handshake(address, HOST) {
            Ok((fp, _)) if fp == fingerprint => return Ok(()),
            Ok((fp, _)) => last = format!("serves another certificate ({})", &fp[..12]),
            Err(e) => last = e,
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(format!(
        "not serving the first certificate after {timeout:?}: {last}"
    ))
}

/// The shape of one run.
#[derive(Debug, Clone)]
pub struct Workload {
    /// How long probing goes on after the switch, counting handshakes that see the old certificate.
    pub after_switch: Duration,
    /// Give up on a rotation after this long (counted, not fatal).
    pub timeout: Duration,
    /// HTTPS load during the rotations (`None`: idle).
    pub load: Option<Load>,
}

/// The load: one thread sending each request on a new connection, `keep_alive` threads each on
/// one kept-alive connection; every thread waits `pause` between requests, so every system gets
/// the same offered load and the probe keeps a share of the two cores.
#[derive(Debug, Clone)]
pub struct Load {
    pub keep_alive: usize,
    pub pause: Duration,
}

/// What one run measured.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// Per completed rotation: from the start of the AtomicWriter swap to the completion of the
    /// first handshake that presented the new certificate.
    pub latencies: Vec<Duration>,
    /// How long the swaps themselves took (writing the files, the rename, the links, removing the
    /// old directory). Latencies count from the start of the swap, which reaches the rename
    /// after a directory, two small files and a link are written; the probes run meanwhile.
    pub swaps: Vec<Duration>,
    /// How long the probe handshakes took: the resolution of every latency.
    pub probe: Vec<Duration>,
    pub timed_out: usize,
    /// Handshakes after a switch that presented the old certificate, of `after_handshakes`.
    pub old_after_switch: usize,
    pub after_handshakes: usize,
    /// Handshakes that presented neither the old nor the new certificate.
    pub third_certificate: usize,
    /// Probe handshakes that failed (refused, reset, timed out).
    pub probe_failures: usize,
    pub new_conn: Requests,
    pub keep_alive: Requests,
}

impl Outcome {
    /// Adds another run's figures to these.
    pub fn merge(&mut self, other: Outcome) {
        self.latencies.extend(other.latencies);
        self.swaps.extend(other.swaps);
        self.probe.extend(other.probe);
        self.timed_out += other.timed_out;
        self.old_after_switch += other.old_after_switch;
        self.after_handshakes += other.after_handshakes;
        self.third_certificate += other.third_certificate;
        self.probe_failures += other.probe_failures;
        self.new_conn.merge(other.new_conn);
        self.keep_alive.merge(other.keep_alive);
    }
}

/// Requests sent by the load.
#[derive(Debug, Clone, Default)]
pub struct Requests {
    pub ok: u64,
    pub failed: u64,
    /// A kept-alive connection the server closed between requests; the request was retried once
    /// on a new connection, as HTTP clients do for idempotent requests (RFC 9110 §9.2.2). Counted
    /// as failed only if the retry failed too.
    pub reconnects: u64,
    pub first_errors: Vec<String>,
}

impl Requests {
    fn record(&mut self, result: Result<(), String>) {
        match result {
            Ok(()) => self.ok += 1,
            Err(e) => {
                self.failed += 1;
                if self.first_errors.len() < 3 {
                    self.first_errors.push(e);
                }
            }
        }
    }

    fn merge(&mut self, other: Requests) {
        self.ok += other.ok;
        self.failed += other.failed;
        self.reconnects += other.reconnects;
        for e in other.first_errors {
            if self.first_errors.len() < 3 {
                self.first_errors.push(e);
            }
        }
    }
}

/// Runs the workload against a serving `system` whose certificate dir holds
/// `pairs[generations.start() - 1]`: `pairs[generations]` are swapped in one after the other
/// (a run can go on where the previous one stopped, so systems can take turns).
pub fn run(
    system: &dyn System,
    pairs: &[Pair],
    generations: std::ops::RangeInclusive<usize>,
    workload: &Workload,
) -> Outcome {
    assert!(
        *generations.start() >= 1 && pairs.len() > *generations.end(),
        "one pair per rotation and the one before"
    );
    let address = system.https();
    let dir = system.cert_dir();
    let stop = Arc::new(AtomicBool::new(false));
    let load = workload
        .load
        .as_ref()
        .map(|load| start_load(address, load, &stop));
    // Let the load reach its pace before the first swap.
    if load.is_some() {
        std::thread::sleep(Duration::from_millis(200));
    }
    let mut outcome = Outcome::default();
    for generation in generations {
        let (old, new) = (&pairs[generation - 1], &pairs[generation]);
        let probing = Instant::now();
        let (swapped, switched) = std::thread::scope(|scope| {
            // The swap runs beside the probes: removing the old directory, after the rename,
            // takes milliseconds on ext4, and the probes must not wait for it.
            let swap = scope.spawn(|| {
                let start = Instant::now();
                atomic_write(&dir, &new.crt, &new.key, generation as u32);
                (start, start.elapsed())
            });
            let mut switched = None;
            while switched.is_none() && probing.elapsed() < workload.timeout {
                let before = Instant::now();
                match handshake(address, HOST) {
                    Ok((fp, done)) => {
                        outcome.probe.push(done - before);
                        if fp == new.fingerprint {
                            switched = Some(done);
                        } else if fp != old.fingerprint {
                            outcome.third_certificate += 1;
                        }
                    }
                    Err(_) => outcome.probe_failures += 1,
                }
            }
            (swap.join().expect("the swap"), switched)
        });
        let (start, swap_took) = swapped;
        outcome.swaps.push(swap_took);
        match switched {
            Some(done) => outcome
                .latencies
                .push(done.saturating_duration_since(start)),
            None => {
                outcome.timed_out += 1;
                // Later rotations would compare against the wrong "old" one: wait it out.
                let _ = wait_serving(address, &new.fingerprint, workload.timeout);
            }
        }
        let until = Instant::now() + workload.after_switch;
        while Instant::now() < until {
            match handshake(address, HOST) {
                Ok((fp, _)) => {
                    outcome.after_handshakes += 1;
                    if fp == old.fingerprint {
                        outcome.old_after_switch += 1;
                    } else if fp != new.fingerprint {
                        outcome.third_certificate += 1;
                    }
                }
                Err(_) => outcome.probe_failures += 1,
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    if let Some((new_conn, keep_alive)) = load {
        outcome.new_conn = new_conn.join().expect("new-connection load thread");
        for thread in keep_alive {
            outcome
                .keep_alive
                .merge(thread.join().expect("keep-alive load thread"));
        }
    }
    outcome
}

type LoadThreads = (JoinHandle<Requests>, Vec<JoinHandle<Requests>>);

fn start_load(address: SocketAddr, load: &Load, stop: &Arc<AtomicBool>) -> LoadThreads {
    let pause = load.pause;
    let running = stop.clone();
    let new_conn = std::thread::spawn(move || {
        let mut requests = Requests::default();
        while !running.load(Ordering::Relaxed) {
            // One request on a new connection, complete once its Content-Length is read; the
            // client closes (waiting for the server's close would time envoy's delayed close).
            requests.record(match connect(address).and_then(|mut c| c.get("/")) {
                Ok((200, body)) if body == "app" => Ok(()),
                Ok((status, body)) => Err(format!("{status} {body:?}")),
                Err(e) => Err(e),
            });
            std::thread::sleep(pause);
        }
        requests
    });
    let keep_alive = (0..load.keep_alive)
        .map(|_| {
            let running = stop.clone();
            std::thread::spawn(move || keep_alive_load(address, pause, &running))
        })
        .collect();
    (new_conn, keep_alive)
}

/// A new HTTPS connection for the load, with TCP_NODELAY like any HTTP client.
fn connect(address: SocketAddr) -> Result<KeepAlive, String> {
    let conn = KeepAlive::connect(address, HOST)?;
    conn.set_nodelay()
        .map_err(|e| format!("TCP_NODELAY: {e}"))?;
    Ok(conn)
}

fn keep_alive_load(address: SocketAddr, pause: Duration, stop: &AtomicBool) -> Requests {
    let mut requests = Requests::default();
    let mut conn = connect(address);
    while !stop.load(Ordering::Relaxed) {
        let result = match conn.as_mut().map(|c| c.get("/")) {
            Ok(Ok((200, body))) if body == "app" => Ok(()),
            Ok(Ok((status, body))) => Err(format!("{status} {body:?}")),
            // Closed by the server between two requests (or never opened): one retry on a new
            // connection, which stays the kept-alive one from then on.
            Ok(Err(_)) | Err(_) => {
                requests.reconnects += 1;
                conn = connect(address);
                match conn.as_mut().map(|c| c.get("/")) {
                    Ok(Ok((200, body))) if body == "app" => Ok(()),
                    other => Err(format!("after reconnecting: {other:?}")),
                }
            }
        };
        requests.record(result);
        std::thread::sleep(pause);
    }
    requests
}

/// Nearest-rank percentile (`p` in 0..=100) of unsorted durations; `None` when empty.
pub fn percentile(values: &[Duration], p: f64) -> Option<Duration> {
    if values.is_empty() {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort();
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    Some(sorted[rank.min(sorted.len()) - 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let ms = |v: u64| Duration::from_millis(v);
        let values: Vec<_> = (1..=100).rev().map(ms).collect();
        assert_eq!(percentile(&values, 50.0), Some(ms(50)));
        assert_eq!(percentile(&values, 99.0), Some(ms(99)));
        assert_eq!(percentile(&values, 100.0), Some(ms(100)));
        assert_eq!(percentile(&[ms(7)], 99.0), Some(ms(7)));
        assert_eq!(percentile(&[], 50.0), None);
    }
}
