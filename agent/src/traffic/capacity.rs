//! How full sozu is: the client connections its workers hold against their `max_connections`,
//! the buffers in use against `max_buffers` (each TCP session takes two at accept, and sozu
//! stops accepting on every listener when none is left: `TcpProxy::create_session`,
//! lib/src/tcp.rs, "Buffer capacity has been reached"), and the UDP flows and datagrams it
//! refused. Idle connections to a route of its own port hold both until `front` times them
//! out, so a saturated sozu is seen here before HTTPS handshakes time out.
//!
//! sozu 2.3.3 counts no TCP connection it closes at a route's `limits`
//! (`TcpSession::connect_to_backend`, lib/src/tcp.rs, logs it and returns
//! `TooManyConnectionsPerIp` with no metric), so those refusals are not counted here; an HTTP
//! route's are its 429 answers, which the access log counts per route. A UDP flow past a
//! route's `limits` is counted (`udp.flows.shed.source_limit`), and so is a datagram larger
//! than the listener forwards (`udp.datagrams.dropped.truncated`).
//!
//! The figures come with the handshake counters ([`super::handshakes::run`]): one small
//! `QueryMetrics` filtered to these names, without cluster metrics. The gauges are each
//! worker's latest, summed; the counters are kept as the handshake counters are, never going
//! down when a worker restarts. Pure but for the lock.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// sozu's gauges read, and what the agent exposes each as.
pub const GAUGES: [&str; 4] = [
    "client.connections",
    "client.connections_max",
    "buffer.in_use",
    "buffer.capacity",
];

/// sozu's counters read: UDP flows refused at a route's per-source limits, and datagrams larger
/// than the listener's `max_rx_datagram_size`.
pub const COUNTERS: [&str; 2] = [
    "udp.flows.shed.source_limit",
    "udp.datagrams.dropped.truncated",
];

/// The figures, shared with `/metrics`.
#[derive(Debug, Clone, Default)]
pub struct Capacity(Arc<Mutex<Figures>>);

/// What `/metrics` shows: the gauges summed over the workers last read (absent before the
/// first reading), and the counters' totals since the agent started.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Figures {
    pub gauges: BTreeMap<&'static str, u64>,
    pub counters: BTreeMap<&'static str, u64>,
    /// Each worker's counters as last read, by worker id.
    last: BTreeMap<String, BTreeMap<String, i64>>,
}

impl Capacity {
    pub fn snapshot(&self) -> Figures {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Takes a reading of every worker's metrics: the gauges are replaced by their sum, and
    /// each counter grows by each worker's increase since its last reading (all of it for a
    /// worker not seen before or whose count went down: it restarted).
    pub fn absorb(&self, reading: &BTreeMap<String, BTreeMap<String, i64>>) {
        let mut figures = self.0.lock().unwrap_or_else(|p| p.into_inner());
        figures.gauges = GAUGES
            .iter()
            .map(|&name| {
                let sum = reading
                    .values()
                    .map(|w| u64::try_from(w.get(name).copied().unwrap_or(0)).unwrap_or(0))
                    .sum();
                (name, sum)
            })
            .collect();
        for (worker, counts) in reading {
            let before = figures.last.get(worker).cloned().unwrap_or_default();
            for name in COUNTERS {
                let now = counts.get(name).copied().unwrap_or(0).max(0);
                let then = before.get(name).copied().unwrap_or(0).max(0);
                let grown = if now >= then { now - then } else { now };
                *figures.counters.entry(name).or_default() += u64::try_from(grown).unwrap_or(0);
            }
        }
        figures.last = reading.clone();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn worker(connections: i64, max: i64, shed: i64) -> BTreeMap<String, i64> {
        BTreeMap::from([
            ("client.connections".to_owned(), connections),
            ("client.connections_max".to_owned(), max),
            ("udp.flows.shed.source_limit".to_owned(), shed),
        ])
    }

    /// The gauges are the workers' sum as last read; the counters never go down, across a
    /// worker's restart.
    #[test]
    fn gauges_are_summed_and_counters_survive_a_worker_restart() {
        let capacity = Capacity::default();
        capacity.absorb(&BTreeMap::from([
            ("0".to_owned(), worker(500, 4096, 2)),
            ("1".to_owned(), worker(20, 4096, 0)),
        ]));
        let figures = capacity.snapshot();
        assert_eq!(figures.gauges["client.connections"], 520);
        assert_eq!(figures.gauges["client.connections_max"], 8192);
        assert_eq!(figures.counters["udp.flows.shed.source_limit"], 2);
        // Worker 0 restarted (its count went down), and its connections went with it.
        capacity.absorb(&BTreeMap::from([
            ("0".to_owned(), worker(1, 4096, 1)),
            ("1".to_owned(), worker(20, 4096, 3)),
        ]));
        let figures = capacity.snapshot();
        assert_eq!(figures.gauges["client.connections"], 21);
        assert_eq!(figures.counters["udp.flows.shed.source_limit"], 6);
    }
}
