//! Which sozu the agent talks to, and when what it knew of sozu no longer holds. Pure.

use std::collections::BTreeSet;

use serde::Serialize;

/// Which sozu the agent talks to: the connection it was read through and its worker processes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Generation {
    /// Counts the connections the agent opened: a new one may reach a new sozu.
    pub connection: u64,
    /// The PIDs of sozu's workers.
    pub workers: BTreeSet<i32>,
}

impl std::fmt::Display for Generation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let workers: Vec<String> = self.workers.iter().map(i32::to_string).collect();
        write!(
            f,
            "connection {} workers {}",
            self.connection,
            workers.join(",")
        )
    }
}

/// Whether sozu's state must be read again before anything is planned against the shadow: the
/// first time, after a new connection (it may lead to another sozu, or a request may have been
/// cut off mid-way), and when the workers changed (a restarted sozu, or a worker restarted).
pub fn should_resync(previous: Option<&Generation>, now: &Generation) -> bool {
    previous != Some(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_connection_or_new_workers_mean_reading_sozu_again() {
        let g = |connection, workers: &[i32]| Generation {
            connection,
            workers: workers.iter().copied().collect(),
        };
        assert!(should_resync(None, &g(1, &[10])));
        assert!(!should_resync(Some(&g(1, &[10])), &g(1, &[10])));
        assert!(
            should_resync(Some(&g(1, &[10])), &g(2, &[10])),
            "reconnected"
        );
        assert!(
            should_resync(Some(&g(1, &[10])), &g(1, &[11])),
            "a worker restarted"
        );
        assert_eq!(g(3, &[10, 11]).to_string(), "connection 3 workers 10,11");
    }
}
