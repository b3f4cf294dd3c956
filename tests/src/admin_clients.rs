//! Clients of the agent's admin address as an attacker and the kubelet are: connections from a
//! chosen loopback address (the whole of 127.0.0.0/8 is this host's, so 127.0.0.2 stands for
//! another machine), held idle and reopened as the agent closes them; probes made as the kubelet
//! makes them, one connection each with its one-second timeout; silent `/v1/events` clients.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A TCP connection to `to` from the address `from` (any port).
pub fn connect_from(from: IpAddr, to: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(to),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )?;
    socket.bind(&SocketAddr::new(from, 0).into())?;
    socket.connect_timeout(&to.into(), Duration::from_secs(5))?;
    Ok(socket.into())
}

/// A probe as the kubelet makes it: a new connection from `from`, `GET path` with
/// `Connection: close`, the whole answer within `timeout` (the kubelet's `timeoutSeconds`, 1 by
/// default). The status code, or what went wrong (a reset, a timeout).
pub fn probe(
    from: IpAddr,
    admin: SocketAddr,
    path: &str,
    timeout: Duration,
) -> Result<u16, String> {
    let deadline = std::time::Instant::now() + timeout;
    let mut stream = connect_from(from, admin).map_err(|e| format!("connect: {e}"))?;
    stream
        .set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {admin}\r\nUser-Agent: kube-probe/1.35\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| format!("send: {e}"))?;
    let mut answer = Vec::new();
    let mut chunk = [0u8; 1024];
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(format!("no whole answer within {timeout:?}"));
        }
        stream
            .set_read_timeout(Some(left))
            .map_err(|e| e.to_string())?;
        match stream.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&chunk[..n]),
            Err(e) => return Err(format!("read: {e}")),
        }
    }
    let text = String::from_utf8_lossy(&answer);
    text.strip_prefix("HTTP/1.1 ")
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| format!("no status line in {text:?}"))
}

/// Connections from one address to the admin address that send nothing, each reopened as soon
/// as the agent closes it (after its header timeout, or to make room): the attack of a client
/// that means to hold every connection. Stopped when dropped.
pub struct IdleFlood {
    stop: Arc<AtomicBool>,
    reopened: Arc<AtomicU64>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl IdleFlood {
    /// `count` connections from `from` to `admin`, on `threads` threads; returns once each is
    /// open (or has been tried).
    pub fn start(from: IpAddr, admin: SocketAddr, count: usize, threads: usize) -> IdleFlood {
        let stop = Arc::new(AtomicBool::new(false));
        let reopened = Arc::new(AtomicU64::new(0));
        let (opened, all_open) = std::sync::mpsc::channel();
        let handles = (0..threads)
            .map(|t| {
                let share = count / threads + usize::from(t < count % threads);
                let (stop, reopened, opened) = (stop.clone(), reopened.clone(), opened.clone());
                std::thread::Builder::new()
                    .name(format!("idle-flood-{t}"))
                    .stack_size(256 * 1024)
                    .spawn(move || {
                        let mut held: Vec<Option<TcpStream>> =
                            (0..share).map(|_| connect_from(from, admin).ok()).collect();
                        let _ = opened.send(());
                        hold(&mut held, from, admin, &stop, &reopened);
                    })
                    .expect("start a flood thread")
            })
            .collect();
        for _ in 0..threads {
            let _ = all_open.recv();
        }
        IdleFlood {
            stop,
            reopened,
            threads: handles,
        }
    }

    /// Connections reopened after the agent closed them, so far.
    pub fn reopened(&self) -> u64 {
        self.reopened.load(Ordering::Relaxed)
    }
}

impl Drop for IdleFlood {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// Waits on every held connection; one the agent closed (readable: an end of stream or a
/// reset) is opened again at once.
fn hold(
    held: &mut [Option<TcpStream>],
    from: IpAddr,
    admin: SocketAddr,
    stop: &AtomicBool,
    reopened: &AtomicU64,
) {
    while !stop.load(Ordering::Relaxed) {
        for slot in held.iter_mut().filter(|s| s.is_none()) {
            *slot = connect_from(from, admin).ok();
        }
        let mut fds: Vec<libc::pollfd> = held
            .iter()
            .map(|s| libc::pollfd {
                fd: s.as_ref().map_or(-1, |s| s.as_raw_fd()),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // SAFETY: `fds` is a valid array of `fds.len()` pollfd, alive for the call.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 100) };
        if ready <= 0 {
            continue;
        }
        for (slot, fd) in held.iter_mut().zip(&fds) {
            if fd.revents == 0 {
                continue;
            }
            let mut sink = [0u8; 512];
            let closed = match slot.as_mut().map(|s| s.read(&mut sink)) {
                Some(Ok(0)) | Some(Err(_)) => true,
                Some(Ok(_)) => false,
                None => false,
            };
            if closed {
                *slot = connect_from(from, admin).ok();
                reopened.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// A `/v1/events` client from `from` that sends its request and never reads.
pub fn silent_events_client(from: IpAddr, admin: SocketAddr) -> TcpStream {
    let mut stream = connect_from(from, admin).expect("connect to the admin address");
    write!(stream, "GET /v1/events HTTP/1.1\r\nHost: {admin}\r\n\r\n").expect("send the request");
    stream
}
