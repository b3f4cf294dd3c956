//! What sozu's events say: each backend's health, the clusters left without a backend, the
//! drains in progress; and which of sozu's configuration changes the agent did not make
//! ([`Ledger`]), so that drift is repaired at once rather than at the next periodic resync.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use tokio::time::Instant;

use crate::document::BackendHealth;
use crate::plan::{Op, Outcome};
use crate::sources::sozu_events::{Change, ChangeKind};
use crate::workspace::ID_PREFIX;

/// A backend taken out of its cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drain {
    /// Out of rotation, with the sessions sozu said were still finishing (when it said).
    Draining(Option<u64>),
    /// sozu said its last connection ended.
    Drained,
}

#[derive(Debug, Default)]
pub struct BackendTracker {
    /// By backend id (which names its cluster): the health sozu last reported, and how many
    /// times it changed.
    health: BTreeMap<String, (BackendHealth, u64)>,
    /// Clusters sozu said have no backend up.
    no_available: BTreeSet<String>,
    /// Backends taken out, by backend id, until they are added again.
    drains: BTreeMap<String, Drain>,
}

impl BackendTracker {
    /// A backend's health changed. Returns whether it did.
    pub fn health(&mut self, backend_id: &str, up: bool) -> bool {
        let now = if up {
            BackendHealth::Up
        } else {
            BackendHealth::Down
        };
        let entry = self
            .health
            .entry(backend_id.to_owned())
            .or_insert((BackendHealth::Unknown, 0));
        if entry.0 == now {
            return false;
        }
        if entry.0 != BackendHealth::Unknown || !up {
            entry.1 += 1;
        }
        entry.0 = now;
        true
    }

    pub fn cluster_available(&mut self, cluster_id: &str, available: bool) {
        if available {
            self.no_available.remove(cluster_id);
        } else {
            self.no_available.insert(cluster_id.to_owned());
        }
    }

    /// sozu said the removed backend has no connection left.
    pub fn drained(&mut self, backend_id: &str) -> bool {
        self.drains.insert(backend_id.to_owned(), Drain::Drained) != Some(Drain::Drained)
    }

    /// Takes what became of a request sozu was sent.
    pub fn applied(&mut self, op: &Op, outcome: &Outcome) {
        if !outcome.is_applied() {
            return;
        }
        match (op, outcome) {
            (Op::AddBackend { backend, .. }, _) => {
                self.drains.remove(&backend.id);
            }
            (Op::RemoveBackend { backend, .. }, _) => {
                // The event may have come first: a backend without connections is drained at once.
                self.drains
                    .entry(backend.id.clone())
                    .or_insert(Drain::Draining(None));
            }
            (Op::CloseSessions { backend, .. }, Outcome::Closing(sessions)) => {
                if let Some(drain @ Drain::Draining(_)) = self.drains.get_mut(&backend.id) {
                    *drain = Drain::Draining(Some(*sessions));
                }
            }
            (Op::RemoveCluster { id }, _) => {
                self.no_available.remove(id);
            }
            // Sessions closed with no count back (sozu gave none, or the request went nowhere),
            // and every request that neither adds, removes or drains a backend nor removes a
            // cluster: nothing the events' maps hold changes.
            (
                Op::CloseSessions { .. }
                | Op::AddListener { .. }
                | Op::PatchListener { .. }
                | Op::ActivateListener { .. }
                | Op::SetClientAuth { .. }
                | Op::SetListenerHsts { .. }
                | Op::AddCluster { .. }
                | Op::SetListenerAnswers { .. }
                | Op::SwapFrontend { .. }
                | Op::SetHealthCheck { .. }
                | Op::RemoveHealthCheck { .. }
                | Op::AddCertificate { .. }
                | Op::ReplaceCertificate { .. }
                | Op::RemoveCertificate { .. }
                | Op::RemoveFrontend(_)
                | Op::AddFrontend(_)
                | Op::AddStreamFrontend(_)
                | Op::RemoveStreamFrontend(_)
                | Op::DeactivateListener { .. }
                | Op::RemoveListener { .. },
                _,
            ) => {}
        }
    }

    /// A new sozu holds no connection and has checked nothing yet.
    pub fn sozu_restarted(&mut self) {
        for drain in self.drains.values_mut() {
            *drain = Drain::Drained;
        }
        self.health.clear();
        self.no_available.clear();
    }

    /// Forgets the backends `keep` says are gone (an answer that moved, a route removed) and the
    /// clusters that went with them: as answers churn, the maps hold what is, not what was.
    pub fn retain(&mut self, keep: impl Fn(&str) -> bool, keep_cluster: impl Fn(&str) -> bool) {
        self.health.retain(|id, _| keep(id));
        self.drains.retain(|id, _| keep(id));
        self.no_available.retain(|id| keep_cluster(id));
    }

    pub fn health_of(&self, backend_id: &str) -> (BackendHealth, u64) {
        self.health
            .get(backend_id)
            .copied()
            .unwrap_or((BackendHealth::Unknown, 0))
    }

    pub fn drain_of(&self, backend_id: &str) -> Option<Drain> {
        self.drains.get(backend_id).copied()
    }

    pub fn no_available(&self, cluster_id: &str) -> bool {
        self.no_available.contains(cluster_id)
    }
}

/// How long an expected event is waited for: sozu sends it within milliseconds of its answer,
/// but the loop may take it up only after a long pass.
const EXPECTED_FOR: Duration = Duration::from_secs(30);

/// Times sozu reports one change it applied: accepted, then applied by the workers.
const REPORTS: usize = 2;

/// The configuration changes the agent made and sozu has not reported yet. Any other change to
/// what the agent owns is drift: someone else changed sozu.
///
/// sozu 2.3.3 reports a change twice, with nothing to tell the two apart: once when its main
/// process accepts the request and again when every worker has applied it (a request the main
/// process refuses outright is reported once). So each request the agent sends is expected
/// twice, and a change it did not make is taken as drift once, its second report expected.
/// An expectation that never comes true (a refused request) lapses after `EXPECTED_FOR`.
///
/// Certificates are expected under one key (sozu's report names no host), so a cold start at
/// 10,000 routes expects 20,000 reports there: each key's times are a queue, oldest first (they
/// are pushed as they come, and `Instant` does not go back), so that taking one report up,
/// lapsed ones included, costs no walk over the others. A walk per report was quadratic: at
/// 10,000 routes it held the loop for over a second after `/readyz` said 200.
#[derive(Debug, Default)]
pub struct Ledger {
    expected: BTreeMap<(ChangeKind, Option<String>), VecDeque<Instant>>,
}

/// What a change that the agent did not make asks of the loop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Drift {
    /// Not the agent's: nothing to do.
    None,
    /// One of the agent's clusters, or its frontends, changed: check that cluster.
    Cluster(String),
    /// Certificates or a whole state changed: read everything again.
    Everything,
}

impl Ledger {
    /// Notes the change a request sozu received will be reported as. Refused requests are
    /// reported too.
    pub fn sent(&mut self, op: &Op, now: Instant) {
        if let Some(key) = expected_change(op) {
            self.expected.entry(key).or_default().extend([now; REPORTS]);
        }
    }

    /// A state file the agent had sozu load.
    pub fn loaded(&mut self, now: Instant) {
        self.expected
            .entry((ChangeKind::Loaded, None))
            .or_default()
            .push_back(now);
    }

    /// Takes one reported change: the agent's own (expected) or drift.
    pub fn reported(&mut self, change: &Change, now: Instant) -> Drift {
        let key = match change.kind {
            ChangeKind::CertificateAdded
            | ChangeKind::CertificateRemoved
            | ChangeKind::CertificateReplaced
            | ChangeKind::Loaded => (change.kind, None),
            ChangeKind::ClusterAdded
            | ChangeKind::ClusterRemoved
            | ChangeKind::FrontendAdded
            | ChangeKind::FrontendRemoved => (change.kind, change.cluster_id.clone()),
        };
        if let Some(times) = self.expected.get_mut(&key) {
            while times
                .front()
                .is_some_and(|t| now.duration_since(*t) >= EXPECTED_FOR)
            {
                times.pop_front();
            }
            let expected = times.pop_front().is_some();
            if times.is_empty() {
                self.expected.remove(&key);
            }
            if expected {
                return Drift::None;
            }
        }
        // The same change's second report is not a second drift.
        self.expected
            .entry(key)
            .or_default()
            .extend([now; REPORTS - 1]);
        match change.kind {
            ChangeKind::CertificateAdded
            | ChangeKind::CertificateRemoved
            | ChangeKind::CertificateReplaced
            | ChangeKind::Loaded => Drift::Everything,
            ChangeKind::ClusterAdded
            | ChangeKind::ClusterRemoved
            | ChangeKind::FrontendAdded
            | ChangeKind::FrontendRemoved => match &change.cluster_id {
                Some(id) if id.starts_with(ID_PREFIX) => Drift::Cluster(id.clone()),
                _ => Drift::None,
            },
        }
    }
}

fn expected_change(op: &Op) -> Option<(ChangeKind, Option<String>)> {
    let cluster = |id: &Option<String>| id.clone();
    Some(match op {
        Op::AddCluster { id, .. } => (ChangeKind::ClusterAdded, Some(id.clone())),
        Op::SwapFrontend {
            frontend: f,
            add: true,
            ..
        } => (ChangeKind::FrontendAdded, cluster(&f.cluster_id)),
        Op::SwapFrontend {
            frontend: f,
            add: false,
            ..
        } => (ChangeKind::FrontendRemoved, cluster(&f.cluster_id)),
        Op::RemoveCluster { id } => (ChangeKind::ClusterRemoved, Some(id.clone())),
        Op::AddFrontend(f) => (ChangeKind::FrontendAdded, cluster(&f.cluster_id)),
        Op::RemoveFrontend(f) => (ChangeKind::FrontendRemoved, cluster(&f.cluster_id)),
        Op::AddStreamFrontend(f) => (ChangeKind::FrontendAdded, Some(f.cluster_id.clone())),
        Op::RemoveStreamFrontend(f) => (ChangeKind::FrontendRemoved, Some(f.cluster_id.clone())),
        Op::AddCertificate { .. } => (ChangeKind::CertificateAdded, None),
        Op::ReplaceCertificate { .. } => (ChangeKind::CertificateReplaced, None),
        Op::RemoveCertificate { .. } => (ChangeKind::CertificateRemoved, None),
        // sozu's event stream reports none of these (`SubscribeEvents` speaks of clusters,
        // frontends, certificates and loads only): nothing to expect.
        Op::AddListener { .. }
        | Op::PatchListener { .. }
        | Op::ActivateListener { .. }
        | Op::SetClientAuth { .. }
        | Op::SetListenerHsts { .. }
        | Op::SetListenerAnswers { .. }
        | Op::SetHealthCheck { .. }
        | Op::RemoveHealthCheck { .. }
        | Op::AddBackend { .. }
        | Op::DeactivateListener { .. }
        | Op::RemoveListener { .. }
        | Op::RemoveBackend { .. }
        | Op::CloseSessions { .. } => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(kind: ChangeKind, cluster: &str) -> Change {
        Change {
            kind,
            cluster_id: Some(cluster.into()),
            address: None,
        }
    }

    #[test]
    fn the_agents_own_changes_are_not_drift_and_others_are() {
        let now = Instant::now();
        let mut ledger = Ledger::default();
        ledger.sent(
            &Op::AddCluster {
                id: "pi-a".into(),
                policy: None,
            },
            now,
        );
        let added = change(ChangeKind::ClusterAdded, "pi-a");
        // Reported when accepted, and when applied.
        assert_eq!(ledger.reported(&added, now), Drift::None);
        assert_eq!(ledger.reported(&added, now), Drift::None);
        // The same change again was not the agent's, and its second report is the same drift.
        assert_eq!(ledger.reported(&added, now), Drift::Cluster("pi-a".into()));
        assert_eq!(ledger.reported(&added, now), Drift::None);
        assert_eq!(ledger.reported(&added, now), Drift::Cluster("pi-a".into()));
        // An operator's cluster is not the agent's business.
        let theirs = change(ChangeKind::FrontendRemoved, "app");
        assert_eq!(ledger.reported(&theirs, now), Drift::None);
        let cert = Change {
            kind: ChangeKind::CertificateRemoved,
            cluster_id: None,
            address: None,
        };
        assert_eq!(ledger.reported(&cert, now), Drift::Everything);
        assert_eq!(ledger.reported(&cert, now), Drift::None);
        // An expectation older than its window no longer hides a change.
        ledger.sent(&Op::RemoveCluster { id: "pi-b".into() }, now);
        let later = now + EXPECTED_FOR + Duration::from_secs(1);
        assert_eq!(
            ledger.reported(&change(ChangeKind::ClusterRemoved, "pi-b"), later),
            Drift::Cluster("pi-b".into())
        );
    }

    /// A cold start's thousands of certificates are all expected under one key: every report
    /// of them is the agent's own, lapsed ones are dropped oldest first, and the next report
    /// is drift.
    #[test]
    fn thousands_of_certificate_reports_under_one_key_are_all_expected() {
        let now = Instant::now();
        let mut ledger = Ledger::default();
        let cert = |fingerprint: &str| Op::RemoveCertificate {
            address: "127.0.0.1:443".parse().unwrap(),
            fingerprint: fingerprint.into(),
        };
        let report = Change {
            kind: ChangeKind::CertificateRemoved,
            cluster_id: None,
            address: None,
        };
        // Two that lapse, then 10,000 sent later.
        ledger.sent(&cert("old"), now);
        let later = now + EXPECTED_FOR + Duration::from_secs(1);
        for i in 0..10_000 {
            ledger.sent(&cert(&i.to_string()), later);
        }
        for _ in 0..2 * 10_000 {
            assert_eq!(ledger.reported(&report, later), Drift::None);
        }
        assert_eq!(ledger.reported(&report, later), Drift::Everything);
    }

    #[test]
    fn a_drain_ends_when_sozu_says_so_whichever_comes_first() {
        let backend = crate::plan::state::Backend {
            id: "pi-a-10.0.0.1:80".into(),
            address: crate::plan::state::Address::Ip("10.0.0.1:80".parse().unwrap()),
            weight: 1,
        };
        let remove = Op::RemoveBackend {
            cluster_id: "pi-a".into(),
            backend: backend.clone(),
        };
        let close = Op::CloseSessions {
            cluster_id: "pi-a".into(),
            backend: backend.clone(),
        };
        let mut tracker = BackendTracker::default();
        tracker.applied(&remove, &Outcome::Applied);
        tracker.applied(&close, &Outcome::Closing(3));
        assert_eq!(
            tracker.drain_of(&backend.id),
            Some(Drain::Draining(Some(3)))
        );
        tracker.drained(&backend.id);
        assert_eq!(tracker.drain_of(&backend.id), Some(Drain::Drained));
        // Put back: serving again.
        let add = Op::AddBackend {
            cluster_id: "pi-a".into(),
            backend: backend.clone(),
        };
        tracker.applied(&add, &Outcome::Applied);
        assert_eq!(tracker.drain_of(&backend.id), None);
        // The event before the answer: drained, and it stays so.
        tracker.drained(&backend.id);
        tracker.applied(&remove, &Outcome::Applied);
        tracker.applied(&close, &Outcome::Closing(0));
        assert_eq!(tracker.drain_of(&backend.id), Some(Drain::Drained));
    }
}
