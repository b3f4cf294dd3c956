//! HTTPS load on a pod through an emulated load balancer, for testing how a pod drains.
//!
//! The load balancer sends new connections to the pod while its endpoint is registered, and to
//! other pods once [`Load::remove_endpoint`] is called (those are not sent at all here). What it
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
use std::sync::Arc;
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

pub struct Load {
    address: SocketAddr,
    targets: Arc<Vec<Target>>,
    registered: Arc<AtomicBool>,
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
        let mut load = Load {
            address,
            targets: Arc::new(targets),
            registered: Arc::new(AtomicBool::new(true)),
            stop: Arc::new(AtomicBool::new(false)),
            new_connections: Vec::new(),
            keep_alive: Vec::new(),
            in_flight: Vec::new(),
        };
        for i in 0..new_connections {
            let (targets, registered, stop) = (
                load.targets.clone(),
                load.registered.clone(),
                load.stop.clone(),
            );
            load.new_connections.push(std::thread::spawn(move || {
                let mut tally = Tally::default();
                let mut turn = i;
                while !stop.load(Ordering::SeqCst) && registered.load(Ordering::SeqCst) {
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
            let (targets, registered, stop) = (
                load.targets.clone(),
                load.registered.clone(),
                load.stop.clone(),
            );
            let target = targets[i % targets.len()].clone();
            load.keep_alive.push(std::thread::spawn(move || {
                keep_alive_client(address, &target, &registered, &stop)
            }));
        }
        load
    }

    /// `count` requests whose backend takes `duration` to answer, each on a new connection,
    /// sent now through the load balancer: to the pod, unless its endpoint is already removed.
    /// Each request has been sent when this returns; the responses are awaited in the background,
    /// each for up to `patience` (a request answered later has failed).
    pub fn send_slow_requests(&mut self, count: usize, duration: Duration, patience: Duration) {
        if !self.registered.load(Ordering::SeqCst) {
            return;
        }
        let path = format!("/delay/{}", duration.as_millis());
        for i in 0..count {
            let target = self.targets[i % self.targets.len()].clone();
            let sent = KeepAlive::connect(self.address, &target.host).and_then(|mut conn| {
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

    /// The load balancer stops sending new connections to the pod.
    pub fn remove_endpoint(&self) {
        self.registered.store(false, Ordering::SeqCst);
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

fn keep_alive_client(
    address: SocketAddr,
    target: &Target,
    registered: &AtomicBool,
    stop: &AtomicBool,
) -> Tally {
    let mut tally = Tally::default();
    let mut connection: Option<(KeepAlive, u64)> = None;
    while !stop.load(Ordering::SeqCst) {
        let sent = Instant::now();
        let (conn, served) = match connection.as_mut() {
            Some(open) => open,
            None => {
                if !registered.load(Ordering::SeqCst) {
                    tally.handed_over += 1;
                    return tally;
                }
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
