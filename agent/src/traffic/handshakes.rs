//! TLS handshakes sozu refused, by reason: a client without a certificate when one is required
//! (`no_certificates_present`), one whose certificate is not the device CA's or is revoked
//! (`invalid_certificate`), and the other reasons rustls gives. A refused handshake has no
//! request, so no access-log record: the counts come from sozu's own counters
//! (`tls.handshake.failed.<reason>`), asked for over the command socket every few seconds,
//! filtered to those names and without cluster metrics.
//!
//! Each worker counts from its own start, and a restarted worker (or sozu) starts again from
//! zero: the agent adds each worker's increase to its own totals, which never go down.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::sozu::SozuClient;

/// How often sozu is asked.
const EVERY: Duration = Duration::from_secs(5);

/// sozu 2.3.3's reasons (`sozu-lib`, `protocol/rustls.rs`), each counted as
/// `tls.handshake.failed.<reason>`.
pub const REASONS: [&str; 12] = [
    "alert_received",
    "peer_incompatible",
    "peer_misbehaved",
    "invalid_message",
    "inappropriate_message",
    "inappropriate_handshake_message",
    "oversized_record",
    "no_alpn",
    "invalid_certificate",
    "decrypt_error",
    "no_certificates_present",
    "other",
];

/// The totals since the agent started, by reason, shared with `/metrics`.
#[derive(Debug, Clone, Default)]
pub struct HandshakeFailures(Arc<Mutex<Totals>>);

#[derive(Debug, Default)]
struct Totals {
    by_reason: BTreeMap<&'static str, u64>,
    /// Each worker's counts as last read, by worker id.
    last: BTreeMap<String, BTreeMap<String, i64>>,
}

impl HandshakeFailures {
    /// The totals by reason; reasons never seen are absent.
    pub fn snapshot(&self) -> BTreeMap<&'static str, u64> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .by_reason
            .clone()
    }

    /// Takes a reading of every worker's counters: what each counter grew by since the last
    /// reading of that worker (all of it for a worker not seen before, or one whose count went
    /// down: it restarted) is added to the totals.
    pub fn absorb(&self, reading: BTreeMap<String, BTreeMap<String, i64>>) {
        let mut totals = self.0.lock().unwrap_or_else(|p| p.into_inner());
        for (worker, counts) in &reading {
            let before = totals.last.get(worker).cloned().unwrap_or_default();
            for reason in REASONS {
                let name = format!("tls.handshake.failed.{reason}");
                let now = counts.get(&name).copied().unwrap_or(0).max(0);
                let then = before.get(&name).copied().unwrap_or(0).max(0);
                let grown = if now >= then { now - then } else { now };
                if grown > 0 {
                    *totals.by_reason.entry(reason).or_default() +=
                        u64::try_from(grown).unwrap_or(0);
                }
            }
        }
        totals.last = reading;
    }
}

/// Asks sozu for its counters every [`EVERY`], for the life of the agent, with the figures of
/// how full it is ([`super::capacity`]) in the same small answer. sozu unreachable is not an
/// error here: the loop reports that; the next reading counts what happened meanwhile (of the
/// workers that lived through it).
pub async fn run(
    socket: PathBuf,
    timeout: Duration,
    counts: HandshakeFailures,
    capacity: super::capacity::Capacity,
) {
    let names: Vec<String> = REASONS
        .iter()
        .map(|r| format!("tls.handshake.failed.{r}"))
        .chain(super::capacity::GAUGES.iter().map(|n| (*n).to_owned()))
        .chain(super::capacity::COUNTERS.iter().map(|n| (*n).to_owned()))
        .collect();
    let client = Arc::new(Mutex::new(SozuClient::new(&socket, timeout)));
    let mut tick = tokio::time::interval(EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let (client, names) = (client.clone(), names.clone());
        let reading = tokio::task::spawn_blocking(move || {
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            client
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .worker_counters(&names)
        })
        .await;
        match reading {
            Ok(Ok(reading)) => {
                capacity.absorb(&reading);
                counts.absorb(reading);
            }
            Ok(Err(e)) => tracing::debug!(error = %e, "sozu's handshake counters not read"),
            Err(e) => tracing::warn!(error = %e, "the handshake counter read failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(workers: &[(&str, i64, i64)]) -> BTreeMap<String, BTreeMap<String, i64>> {
        workers
            .iter()
            .map(|(id, missing, invalid)| {
                (
                    (*id).to_owned(),
                    BTreeMap::from([
                        (
                            "tls.handshake.failed.no_certificates_present".to_owned(),
                            *missing,
                        ),
                        (
                            "tls.handshake.failed.invalid_certificate".to_owned(),
                            *invalid,
                        ),
                    ]),
                )
            })
            .collect()
    }

    /// Totals grow by each worker's increase; a worker that restarts (its count goes down, or a
    /// new id) adds what it counted since, and the totals never go down.
    #[test]
    fn totals_never_go_down_across_worker_restarts() {
        let counts = HandshakeFailures::default();
        counts.absorb(reading(&[("0", 3, 1)]));
        counts.absorb(reading(&[("0", 5, 1)]));
        assert_eq!(counts.snapshot()["no_certificates_present"], 5);
        // The worker restarted: its counters start again.
        counts.absorb(reading(&[("0", 2, 0)]));
        assert_eq!(counts.snapshot()["no_certificates_present"], 7);
        // A new worker beside it.
        counts.absorb(reading(&[("0", 2, 0), ("1", 4, 2)]));
        let totals = counts.snapshot();
        assert_eq!(
            (
                totals["no_certificates_present"],
                totals["invalid_certificate"]
            ),
            (11, 3)
        );
    }
}
