//! The task that reads sozu's records: binds `traffic.listen`, takes each datagram from loopback
//! (or a `traffic.senders` address), counts it, and hands its line to the access log; every
//! [`SLOT`] it turns the routes' windows and publishes the status.
//!
//! Loss is counted, not guessed: the socket asks the kernel for `SO_RXQ_OVFL`, which tells, with
//! each datagram, how many the socket dropped since it was made because the agent had not read
//! them in time (a frozen or overloaded agent). sozu itself never waits: its send is a `sendto`
//! on a datagram socket, which does not block on a full receiver.
//!
//! The socket is asked for a large receive buffer, to ride out a pause of the agent; without
//! `CAP_NET_ADMIN` the kernel caps it at `net.core.rmem_max` (docs/agent.md says what to raise).
//! An address that cannot be bound (in use, not local) is not fatal: the status says why, and
//! the receiver tries again every slot and on every workspace edit. The proxy keeps serving
//! either way.

use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use nix::sys::socket::{
    recvmsg, setsockopt, sockopt, ControlMessageOwned, MsgFlags, SockaddrStorage,
};
use tokio::io::Interest;

use super::access_log::{self, Sink};
use super::record;
use super::stats::{Table, UNMATCHED};
use super::window::{Windows, SLOT, WINDOW};
use super::TrafficHandle;
use crate::document::TrafficStatus;
use crate::sources::dns::DnsTable;
use crate::sources::WorkspaceWatch;
use crate::workspace::{Traffic, Workspace};

/// The receive buffer asked for, to ride out a pause of the agent (a scheduling hiccup, a
/// long scrape): the kernel charges each datagram its bookkeeping besides its few hundred bytes,
/// so this holds a few thousand records; the traffic bench measures what a freeze loses.
pub const RECEIVE_BUFFER: usize = 8 << 20;

/// Datagrams read in one go before the task yields to the others.
const BATCH: usize = 512;

/// How long records gather on the socket between two reads while they arrive: 1 ms holds a few
/// dozen at sozu's fastest, far within the socket's buffer.
const GATHER: std::time::Duration = std::time::Duration::from_millis(1);

/// How often the status is published while records arrive (and every [`SLOT`] regardless).
const PUBLISH: std::time::Duration = std::time::Duration::from_secs(1);

/// Runs until the workspace source ends.
pub async fn run(mut workspaces: WorkspaceWatch, handle: TrafficHandle, dns: DnsTable) {
    let mut receiver = Receiver::new(handle, dns);
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + PUBLISH, PUBLISH);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut buffer = vec![0u8; 65_536];
    let mut control = nix::cmsg_space!(u32);
    let workspace = workspaces.borrow_and_update().clone();
    if let Some(workspace) = workspace {
        receiver.follow(&workspace);
    }
    receiver.publish();
    loop {
        tokio::select! {
            changed = workspaces.changed() => {
                if changed.is_err() {
                    return;
                }
                let workspace = workspaces.borrow_and_update().clone();
                if let Some(workspace) = workspace {
                    receiver.follow(&workspace);
                    receiver.publish();
                }
            }
            _ = tick.tick() => receiver.tick(),
            readable = readable(receiver.socket.as_ref()) => match readable {
                Ok(()) => {
                    if receiver.drain(&mut buffer, &mut control) > 0 {
                        // Let the next records gather: one wake-up reads many of them, instead
                        // of one each (a wake-up costs several times what a record does).
                        tokio::time::sleep(GATHER).await;
                    }
                }
                Err(e) => receiver.unbind(e),
            },
        }
    }
}

async fn readable(socket: Option<&tokio::net::UdpSocket>) -> std::io::Result<()> {
    match socket {
        Some(socket) => socket.readable().await,
        None => std::future::pending().await,
    }
}

struct Receiver {
    handle: TrafficHandle,
    dns: DnsTable,
    settings: Option<Traffic>,
    /// Bound to `settings.listen`, when binding it succeeded.
    socket: Option<tokio::net::UdpSocket>,
    /// Why `settings.listen` is not bound.
    bind_error: Option<String>,
    table: Arc<Table>,
    windows: Windows,
    slot_started: Instant,
    sink: Option<Sink>,
    sink_error: Option<String>,
    /// Drops of the sockets closed before this one, and this one's latest count.
    lost_before: u64,
    lost_here: u32,
    /// Records counted when the status was last published.
    published_records: u64,
}

impl Receiver {
    fn new(handle: TrafficHandle, dns: DnsTable) -> Receiver {
        Receiver {
            table: handle.table(),
            handle,
            dns,
            settings: None,
            socket: None,
            bind_error: None,
            windows: Windows::default(),
            slot_started: Instant::now(),
            sink: None,
            sink_error: None,
            lost_before: 0,
            lost_here: 0,
            published_records: 0,
        }
    }

    /// Follows a workspace: its routes, its address, its access log.
    fn follow(&mut self, workspace: &Workspace) {
        let table = self.table.follow(workspace);
        self.handle.set_table(table);
        self.table = self.handle.table();
        let settings = Traffic::clone(&workspace.traffic);
        let listen = self.settings.as_ref().map(|s| s.listen);
        if self.socket.is_none() || listen != Some(settings.listen) {
            self.bind(settings.listen);
        }
        let log = &settings.access_log;
        let current = self.sink.as_ref().map(|s| &s.settings);
        if log.enabled && current != Some(log) {
            self.start_sink(log.clone());
        } else if !log.enabled {
            self.sink = None;
            self.sink_error = None;
        }
        self.settings = Some(settings);
    }

    fn start_sink(&mut self, settings: crate::workspace::AccessLog) {
        self.sink = None;
        match Sink::start(settings.clone(), self.handle.0.access_log_dropped.clone()) {
            Ok(sink) => {
                self.sink = Some(sink);
                self.sink_error = None;
            }
            Err(e) => {
                let target = settings
                    .path
                    .as_ref()
                    .map_or("stdout".to_owned(), |p| p.display().to_string());
                tracing::error!(target = %target, error = %e, "cannot open the access log; its lines are dropped");
                self.sink_error = Some(format!("cannot open {target}: {e}"));
            }
        }
    }

    fn bind(&mut self, address: SocketAddr) {
        self.close();
        match bind(address) {
            Ok(socket) => {
                tracing::info!(address = %address, "receiving sozu's access-log records");
                self.socket = Some(socket);
                self.bind_error = None;
            }
            Err(e) => {
                if self.bind_error.as_deref() != Some(&e.to_string()) {
                    tracing::warn!(address = %address, error = %e,
                        "cannot receive sozu's access-log records; trying again every {}s", SLOT.as_secs());
                }
                self.bind_error = Some(e.to_string());
            }
        }
    }

    fn close(&mut self) {
        if self.socket.take().is_some() {
            self.lost_before += u64::from(self.lost_here);
            self.lost_here = 0;
        }
    }

    fn unbind(&mut self, error: std::io::Error) {
        tracing::warn!(error = %error, "the traffic socket failed; binding it again");
        self.close();
        self.bind_error = Some(error.to_string());
    }

    /// Every [`PUBLISH`]: the status is published if records arrived, and every slot the
    /// windows turn.
    fn tick(&mut self) {
        if self.slot_started.elapsed() + PUBLISH / 2 >= SLOT {
            self.turn();
        } else if self.handle.figures().records != self.published_records {
            self.publish();
        }
    }

    /// Every slot: the windows turn, a failed bind or access log is tried again, and the status
    /// is published.
    fn turn(&mut self) {
        let table = self.table.clone();
        self.windows.turn(|id| table.contains(id));
        self.slot_started = Instant::now();
        if let Some(settings) = self.settings.clone() {
            if self.socket.is_none() {
                self.bind(settings.listen);
            }
            let log = settings.access_log.clone();
            if log.enabled && self.sink.as_ref().is_none_or(Sink::is_closed) {
                self.start_sink(log);
            }
        }
        self.publish();
    }

    /// Reads what is queued on the socket, up to [`BATCH`] datagrams; how many it read.
    fn drain(&mut self, buffer: &mut [u8], control: &mut [u8]) -> usize {
        let Some(socket) = self.socket.take() else {
            return 0;
        };
        let read = self.drain_from(&socket, buffer, control);
        self.socket = Some(socket);
        read
    }

    fn drain_from(
        &mut self,
        socket: &tokio::net::UdpSocket,
        buffer: &mut [u8],
        control: &mut [u8],
    ) -> usize {
        let fd = socket.as_raw_fd();
        let mut lines = Vec::new();
        let mut count = 0;
        let mut read = 0;
        for _ in 0..BATCH {
            let datagram = socket.try_io(Interest::READABLE, || receive(fd, buffer, control));
            match datagram {
                Ok(d) => {
                    if let Some(drops) = d.drops {
                        self.lost_here = drops;
                        self.handle
                            .0
                            .lost
                            .store(self.lost_before + u64::from(drops), Ordering::Relaxed);
                    }
                    read += 1;
                    count +=
                        u64::from(self.take(&buffer[..d.len], d.from, d.truncated, &mut lines));
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // ICMP errors and the like are the socket's, not the stream's: skip.
                    tracing::debug!(error = %e, "traffic socket");
                    break;
                }
            }
        }
        match &self.sink {
            Some(sink) => sink.send(lines, count),
            // Enabled, but its output could not be opened: the lines are lost, and counted.
            None if count > 0 => {
                self.handle
                    .0
                    .access_log_dropped
                    .fetch_add(count, Ordering::Relaxed);
            }
            None => {}
        }
        read
    }

    /// Counts one datagram; appends its access-log line to `lines` when the log is on. Whether
    /// it made a line (or would have, for an access log that cannot be written).
    fn take(
        &mut self,
        datagram: &[u8],
        from: Option<SocketAddr>,
        truncated: bool,
        lines: &mut Vec<u8>,
    ) -> bool {
        let shared = &self.handle.0;
        let accepted = match (&self.settings, from) {
            (Some(settings), Some(from)) => settings.accepts(from.ip()),
            _ => false,
        };
        if !accepted {
            shared.rejected.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        let record = match (truncated, record::decode(datagram)) {
            (false, Ok(record)) => record,
            _ => {
                shared.malformed.fetch_add(1, Ordering::Relaxed);
                return false;
            }
        };
        shared.records.fetch_add(1, Ordering::Relaxed);
        shared.last_record.store(
            crate::clock::unix_seconds(std::time::SystemTime::now()),
            Ordering::Relaxed,
        );
        let route = self.table.of(&record).clone();
        let dns = &self.dns;
        route.observe(&record, &|name| resolved(dns, name));
        // A connection's end (a WebSocket's, a TCP route's) is no request of the last minute:
        // its duration is the connection's.
        if record.app_protocol().is_request() {
            self.windows
                .observe(&route.id, record.status(), record.duration_us());
        }
        match &self.settings {
            Some(settings) if settings.access_log.enabled => {
                let labels =
                    (route.id != UNMATCHED).then(|| (route.id.as_str(), route.host.as_str()));
                access_log::append(lines, &record, labels, settings.access_log.query_string);
                true
            }
            _ => false,
        }
    }

    fn publish(&mut self) {
        let figures = self.handle.figures();
        self.published_records = figures.records;
        let listen = self.settings.as_ref().map(|s| s.listen);
        let problem = match (&self.bind_error, listen) {
            (Some(e), Some(listen)) => Some(format!("cannot receive on {listen}: {e}")),
            _ if figures.records == 0 => listen.map(|_| {
                let target = self.settings.as_ref().map(Traffic::target);
                format!(
                    "no record received yet: sozu sends them only with access_logs_target = \"udp://{}\" and access_logs_format = \"protobuf\" in its configuration (or nothing was requested yet)",
                    target.map_or_else(String::new, |t| t.to_string())
                )
            }),
            _ => None,
        };
        let access_log = match self.settings.as_ref().map(|s| &s.access_log) {
            Some(log) if !log.enabled => "off".to_owned(),
            Some(log) => match (&self.sink_error, &log.path) {
                (Some(e), _) => e.clone(),
                (None, Some(path)) => path.display().to_string(),
                (None, None) => "stdout".to_owned(),
            },
            None => "stdout".to_owned(),
        };
        self.handle.publish(TrafficStatus {
            listen: self
                .socket
                .is_some()
                .then(|| listen.map(|a| a.to_string()))
                .flatten(),
            problem,
            records: figures.records,
            malformed: figures.malformed,
            rejected: figures.rejected,
            lost: figures.lost,
            last_record: figures.last_record,
            access_log,
            access_log_dropped: figures.access_log_dropped,
            window_seconds: WINDOW.as_secs(),
            routes: self.windows.figures(self.slot_started.elapsed()),
        });
    }
}

/// The addresses an upstream name resolves to now, from the DNS source's table.
fn resolved(dns: &DnsTable, name: &str) -> Vec<IpAddr> {
    let table = dns.lock().unwrap_or_else(|p| p.into_inner());
    table
        .names
        .get(name)
        .map(|n| n.addresses.iter().filter_map(|a| a.parse().ok()).collect())
        .unwrap_or_default()
}

/// The socket, non-blocking, with its large buffer and the kernel's drop count.
fn bind(address: SocketAddr) -> std::io::Result<tokio::net::UdpSocket> {
    let socket = std::net::UdpSocket::bind(address)?;
    socket.set_nonblocking(true)?;
    let fd = socket.as_fd();
    // Past `net.core.rmem_max` only with CAP_NET_ADMIN; the smaller buffer otherwise.
    if setsockopt(&fd, sockopt::RcvBufForce, &RECEIVE_BUFFER).is_err() {
        setsockopt(&fd, sockopt::RcvBuf, &RECEIVE_BUFFER).map_err(std::io::Error::from)?;
    }
    setsockopt(&fd, sockopt::RxqOvfl, &1).map_err(std::io::Error::from)?;
    tokio::net::UdpSocket::from_std(socket)
}

struct Datagram {
    len: usize,
    from: Option<SocketAddr>,
    truncated: bool,
    /// The socket's drops since it was made, when the kernel said.
    drops: Option<u32>,
}

fn receive(fd: i32, buffer: &mut [u8], control: &mut [u8]) -> std::io::Result<Datagram> {
    let capacity = buffer.len();
    let mut iov = [std::io::IoSliceMut::new(buffer)];
    let msg = recvmsg::<SockaddrStorage>(fd, &mut iov, Some(control), MsgFlags::MSG_TRUNC)
        .map_err(std::io::Error::from)?;
    let mut drops = None;
    if let Ok(cmsgs) = msg.cmsgs() {
        for cmsg in cmsgs {
            if let ControlMessageOwned::RxqOvfl(n) = cmsg {
                drops = Some(n);
            }
        }
    }
    let from = msg.address.as_ref().and_then(|a| {
        a.as_sockaddr_in()
            .map(|v4| SocketAddr::from(std::net::SocketAddrV4::from(*v4)))
            .or_else(|| {
                a.as_sockaddr_in6()
                    .map(|v6| SocketAddr::from(std::net::SocketAddrV6::from(*v6)))
            })
    });
    // With MSG_TRUNC, `bytes` is the datagram's length even when it did not fit.
    Ok(Datagram {
        len: msg.bytes.min(capacity),
        from,
        truncated: msg.flags.contains(MsgFlags::MSG_TRUNC),
        drops,
    })
}
