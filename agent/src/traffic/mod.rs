//! What sozu carries, seen: sozu's per-request access-log records, received over UDP, turned
//! into request metrics per route (`/metrics`), each route's last minute (`/v1/state`,
//! `status`), and a JSON access log.
//!
//! Why this stream and not sozu's `QueryMetrics`: a worker answers that verb by walking its
//! whole metric store in its event loop, and a reply larger than its command buffer wedges it
//! (it stops serving); its counts also restart with every worker. The access-log stream costs
//! sozu one `sendto` per request, and over UDP a datagram that finds the agent's socket full is
//! dropped by the kernel instead of making sozu wait: nothing the agent does, or fails to do,
//! can stall sozu. What is dropped is counted ([`receiver`]), and the counters the agent keeps
//! never go down while it runs, whatever happens to sozu's workers.
//!
//! - [`record`]: a datagram decoded (pure);
//! - [`stats`]: the counts per route, which `api::metrics` renders with the other families (pure);
//! - [`window`]: each route's last minute for `status` (pure);
//! - [`access_log`]: the JSON lines and the thread that writes them;
//! - [`receiver`]: the socket and the task that reads it.

pub mod access_log;
pub mod capacity;
pub mod handshakes;
pub mod receiver;
pub mod record;
pub mod stats;
pub mod window;

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use crate::document::TrafficStatus;

/// What the receiver shares with the admin endpoints.
#[derive(Clone, Default)]
pub struct TrafficHandle(Arc<Shared>);

#[derive(Default)]
struct Shared {
    table: RwLock<Arc<stats::Table>>,
    records: AtomicU64,
    malformed: AtomicU64,
    rejected: AtomicU64,
    lost: AtomicU64,
    access_log_dropped: Arc<AtomicU64>,
    /// Unix seconds of the latest record; 0 before the first.
    last_record: AtomicI64,
    /// The last status the receiver published (each [`window::SLOT`]); `None` until it runs.
    status: RwLock<Option<Arc<TrafficStatus>>>,
    version: AtomicU64,
    /// TLS handshakes sozu refused, which no record tells of.
    handshakes: handshakes::HandshakeFailures,
    /// How full sozu is, and the UDP flows and datagrams it refused.
    capacity: capacity::Capacity,
}

impl TrafficHandle {
    /// The table records are counted in.
    pub fn table(&self) -> Arc<stats::Table> {
        self.0
            .table
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn set_table(&self, table: stats::Table) {
        *self.0.table.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(table);
    }

    /// The stream's counters now.
    pub fn figures(&self) -> stats::StreamFigures {
        let last = self.0.last_record.load(Ordering::Relaxed);
        stats::StreamFigures {
            records: self.0.records.load(Ordering::Relaxed),
            malformed: self.0.malformed.load(Ordering::Relaxed),
            rejected: self.0.rejected.load(Ordering::Relaxed),
            lost: self.0.lost.load(Ordering::Relaxed),
            access_log_dropped: self.0.access_log_dropped.load(Ordering::Relaxed),
            last_record: (last > 0).then_some(last),
        }
    }

    /// The handshakes sozu refused, by reason.
    pub fn handshakes(&self) -> &handshakes::HandshakeFailures {
        &self.0.handshakes
    }

    /// How full sozu is.
    pub fn capacity(&self) -> &capacity::Capacity {
        &self.0.capacity
    }

    /// The status last published; `None` before the receiver first ran.
    pub fn status(&self) -> Option<Arc<TrafficStatus>> {
        self.0
            .status
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// A status equal to the one published changes nothing: its version stays, so that the
    /// bodies rendered from it (`/v1/state`, whose entity tag `top` sends back) stay current
    /// while no request comes.
    fn publish(&self, status: TrafficStatus) {
        let mut slot = self.0.status.write().unwrap_or_else(|p| p.into_inner());
        if slot.as_deref() == Some(&status) {
            return;
        }
        *slot = Some(Arc::new(status));
        self.0.version.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts the publications: a body rendered from the status is rendered again when it moved.
    pub fn version(&self) -> u64 {
        self.0.version.load(Ordering::Relaxed)
    }
}
