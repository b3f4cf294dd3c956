//! HTTPS load on pods through an emulated load balancer, for testing how a pod drains and how a
//! rollout replaces pods.
//!
//! The load balancer sends new connections to the registered endpoints in turn. With one pod, it
//! sends them to the pod until [`Load::remove_endpoint`] is called, and to other pods after
//! (those are not sent at all here); with several ([`Load::start_balanced`]), endpoints come and
//! go with [`Load::add`] and [`Load::remove`], and clients stop only when none is left. What it
//! already forwards, it keeps forwarding: keep-alive connections stay with the pod until the pod
//! closes them. A keep-alive client whose reused connection is closed before any byte of the
//! response arrives sends the request again on a new connection, as HTTP clients do for
//! idempotent requests: to the pod while its endpoint is registered, to another pod after
//! (counted as handed over; the client is done with this pod).
//!
//! Every other error is a failed request: a refused or reset new connection, a TLS failure, a
//! status other than 200, a body from the wrong backend, a response cut short.
//!
//! Each client sends at most one request every [`PACE`], so that a client failing fast (a
//! refused connection) counts the requests a real one would have sent, not a busy loop's.
//!
//! Threads start in the network namespace of the thread that calls [`Load::start`].

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::live::{https_get, KeepAlive};

/// The shortest interval between two requests of one client: 100 requests a second at most.
pub const PACE: Duration = Duration::from_millis(10);

/// Sleeps until `PACE` after `since`.
fn pace(since: Instant) {
    if let Some(rest) = PACE.checked_sub(since.elapsed()) {
        std::thread::sleep(rest);
    }
}

/// What one kind of client saw.
#[derive(Debug, Default, Clone)]
pub struct Tally {
    pub ok: u64,
    pub failed: Vec<String>,
    /// Keep-alive clients that moved to another pod after this one closed their connection.
    pub handed_over: u64,
}

impl Tally {
    fn add(&mut self, other: Tally) {
        self.ok += other.ok;
        self.failed.extend(other.failed);
        self.handed_over += other.handed_over;
    }
}

/// The totals of a run, by kind of client.
#[derive(Debug, Default, Clone)]
pub struct Report {
    /// A new TLS connection per request.
    pub new_connections: Tally,
    /// Many requests per connection.
    pub keep_alive: Tally,
    /// Slow requests started just before the endpoint was removed, in flight when the pod is
    /// told to stop.
    pub in_flight: Tally,
}

impl Report {
    pub fn failed(&self) -> usize {
        self.new_connections.failed.len()
            + self.keep_alive.failed.len()
            + self.in_flight.failed.len()
    }
}

/// A host served by the pod, and the body its backend answers with.
#[derive(Debug, Clone)]
pub struct Target {
    pub host: String,
    pub body: String,
}

/// The endpoints the load balancer sends new connections to.
#[derive(Clone, Default)]
struct Endpoints(Arc<Mutex<Vec<SocketAddr>>>);

impl Endpoints {
    fn list(&self) -> std::sync::MutexGuard<'_, Vec<SocketAddr>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The endpoint for the `turn`-th new connection, if any is registered.
    fn pick(&self, turn: usize) -> Option<SocketAddr> {
        let list = self.list();
        (!list.is_empty()).then(|| list[turn % list.len()])
    }

    fn contains(&self, address: SocketAddr) -> bool {
        self.list().contains(&address)
    }
}

pub struct Load {
    targets: Arc<Vec<Target>>,
    endpoints: Endpoints,
    stop: Arc<AtomicBool>,
    new_connections: Vec<JoinHandle<Tally>>,
    keep_alive: Vec<JoinHandle<Tally>>,
    in_flight: Vec<JoinHandle<Tally>>,
}

impl Load {
    /// `new_connections` clients opening a connection per request and `keep_alive` clients
    /// keeping theirs, all sending to `address` for every target in turn.
    pub fn start(
        address: SocketAddr,
        targets: Vec<Target>,
        new_connections: usize,
        keep_alive: usize,
    ) -> Load {
        Load::start_balanced(&[address], targets, new_connections, keep_alive)
    }

    /// [`Load::start`] through a load balancer that sends new connections to `endpoints` in turn.
    pub fn start_balanced(
        endpoints: &[SocketAddr],
        targets: Vec<Target>,
        new_connections: usize,
        keep_alive: usize,
    ) -> Load {
        let mut load = Load {
            targets: Arc::new(targets),
            endpoints: Endpoints(Arc::new(Mutex::new(endpoints.to_vec()))),
            stop: Arc::new(AtomicBool::new(false)),
            new_connections: Vec::new(),
            keep_alive: Vec::new(),
            in_flight: Vec::new(),
        };
        for i in 0..new_connections {
            let (targets, endpoints, stop) = (
                load.targets.clone(),
                load.endpoints.clone(),
                load.stop.clone(),
            );
            load.new_connections.push(std::thread::spawn(move || {
                let mut tally = Tally::default();
                let mut turn = i;
                while !stop.load(Ordering::SeqCst) {
                    let Some(address) = endpoints.pick(turn) else {
                        break;
                    };
                    let sent = Instant::now();
                    let target = &targets[turn % targets.len()];
                    turn += 1;
                    match check(
                        https_get(address, &target.host, "/").map(|s| (s.status, s.body)),
                        target,
                    ) {
                        Ok(()) => tally.ok += 1,
                        Err(e) => tally
                            .failed
                            .push(format!("new connection to {}: {e}", target.host)),
                    }
                    pace(sent);
                }
                tally
            }));
        }
        for i in 0..keep_alive {
            let (targets, endpoints, stop) = (
                load.targets.clone(),
                load.endpoints.clone(),
                load.stop.clone(),
            );
            let target = targets[i % targets.len()].clone();
            load.keep_alive.push(std::thread::spawn(move || {
                keep_alive_client(i, &target, &endpoints, &stop)
            }));
        }
        load
    }

    /// `count` requests whose backend takes `duration` to answer, each on a new connection,
    /// sent now through the load balancer: to the pod, unless its endpoint is already removed.
    /// Each request has been sent when this returns; the responses are awaited in the background,
    /// each for up to `patience` (a request answered later has failed).
    pub fn send_slow_requests(&mut self, count: usize, duration: Duration, patience: Duration) {
        let path = format!("/delay/{}", duration.as_millis());
        for i in 0..count {
            let Some(address) = self.endpoints.pick(i) else {
                return;
            };
            let target = self.targets[i % self.targets.len()].clone();
            let sent = KeepAlive::connect(address, &target.host).and_then(|mut conn| {
                conn.set_read_timeout(patience)?;
                conn.send(&path)?;
                Ok(conn)
            });
            self.in_flight.push(std::thread::spawn(move || {
                let mut tally = Tally::default();
                {
                    let response = sent.and_then(|mut conn| conn.receive());
                    match check(response, &target) {
                        Ok(()) => tally.ok += 1,
                        Err(e) => tally
                            .failed
                            .push(format!("slow request to {}: {e}", target.host)),
                    }
                }
                tally
            }));
        }
    }

    /// The load balancer stops sending new connections to the pod (to every endpoint).
    pub fn remove_endpoint(&self) {
        self.endpoints.list().clear();
    }

    /// The load balancer stops sending new connections to `address`.
    pub fn remove(&self, address: SocketAddr) {
        self.endpoints.list().retain(|a| *a != address);
    }

    /// The load balancer sends new connections to `address` too.
    pub fn add(&self, address: SocketAddr) {
        self.endpoints.list().push(address);
    }

    /// Stops every client and returns what they saw.
    pub fn stop(self) -> Report {
        self.stop.store(true, Ordering::SeqCst);
        let total = |threads: Vec<JoinHandle<Tally>>| {
            let mut tally = Tally::default();
            for thread in threads {
                tally.add(thread.join().expect("a load thread"));
            }
            tally
        };
        Report {
            new_connections: total(self.new_connections),
            keep_alive: total(self.keep_alive),
            in_flight: total(self.in_flight),
        }
    }
}

fn check(response: Result<(u16, String), String>, target: &Target) -> Result<(), String> {
    match response? {
        (200, body) if body == target.body => Ok(()),
        (status, body) => Err(format!("{status} {body:?}")),
    }
}

/// A client keeping its connection. Closed by the server between two requests, it connects
/// again through the load balancer; when the endpoint it was on has been removed, that counts as
/// handed over, and with no endpoint left the client is done.
fn keep_alive_client(
    first_turn: usize,
    target: &Target,
    endpoints: &Endpoints,
    stop: &AtomicBool,
) -> Tally {
    let mut tally = Tally::default();
    let mut connection: Option<(KeepAlive, u64)> = None;
    let mut on: Option<SocketAddr> = None;
    let mut turn = first_turn;
    while !stop.load(Ordering::SeqCst) {
        let sent = Instant::now();
        let (conn, served) = match connection.as_mut() {
            Some(open) => open,
            None => {
                if on.is_some_and(|a| !endpoints.contains(a)) {
                    tally.handed_over += 1;
                }
                let Some(address) = endpoints.pick(turn) else {
                    if on.is_none() {
                        tally.handed_over += 1;
                    }
                    return tally;
                };
                turn += 1;
                on = Some(address);
                match KeepAlive::connect(address, &target.host) {
                    Ok(conn) => connection.insert((conn, 0)),
                    Err(e) => {
                        tally
                            .failed
                            .push(format!("keep-alive connect to {}: {e}", target.host));
                        pace(sent);
                        continue;
                    }
                }
            }
        };
        match check(conn.get("/"), target) {
            Ok(()) => {
                tally.ok += 1;
                *served += 1;
            }
            // Closed by the server between two requests: sent again on a new connection.
            Err(_) if *served > 0 && !conn.is_response_started() => connection = None,
            Err(e) => {
                tally
                    .failed
                    .push(format!("keep-alive request to {}: {e}", target.host));
                connection = None;
            }
        }
        pace(sent);
    }
    tally
}
