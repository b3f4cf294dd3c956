//! Whether anyone but the agent changed a part of sozu's state, told by sozu's main process
//! alone: its census of the requests it received (`CountRequests`).
//!
//! sozu 2.3.3 has no listing of clusters or backends that its main process answers by itself:
//! `QueryClustersHashes` and `QueryClusterById` go through `query_clusters` in
//! `bin/src/command/requests.rs`, which scatters them to every worker, and each worker answers
//! in `Server::notify` (`lib/src/server.rs`), on the thread that serves handshakes (for the
//! hashes, `ConfigState::hash_state` over every cluster). Its event stream says nothing of a
//! backend added or removed (`audit_entry_for` in `requests.rs` has no backend or health-check
//! entry). What the main process does keep is a census: `ConfigState::dispatch`
//! (`command/src/state.rs`) counts every request it dispatches by kind
//! (`increment_request_count`, keyed by `format_request_type`), whatever comes of it, and
//! `CountRequests` answers that map from the main process alone (`count_requests`).
//!
//! The agent counts the requests it sends itself ([`Tally`], by the same names). Between two
//! censuses, when sozu counted exactly as many requests of a part's kinds as the agent sent, nobody
//! else sent one, and the part is as the agent's shadow holds it: it is not read, and the
//! workers are not asked. When sozu counted more, someone else did: the part is read in full
//! (for clusters, with the workers' hashes, then only the clusters that changed). A count the
//! agent cannot be sure of (a request refused, which sozu may have counted or not; one whose
//! answer never came; a census taken while one of the agent's requests was on its way) makes
//! the part read in full too, so a doubt costs a read, never a change unseen.
//!
//! Pure but for [`Tally`], which the agent's connections share.

use std::collections::BTreeMap;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// A part of sozu's state that is read only when someone else may have changed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Part {
    /// Which clusters exist, and the backends, health checks and policies of the agent's.
    Clusters,
    /// The certificates of every HTTPS listener.
    Certificates,
    /// The HTTP, HTTPS, TCP and UDP frontends.
    Frontends,
}

/// How many parts there are.
pub const PARTS: usize = 3;

impl Part {
    pub const ALL: [Part; PARTS] = [Part::Clusters, Part::Certificates, Part::Frontends];

    pub fn index(self) -> usize {
        self as usize
    }
}

/// The parts a request of kind `kind` (sozu's own name for it, `format_request_type`) changes,
/// of those not read at every resync. Only the listeners are read at every resync (a handful of
/// entries). A listener added or removed takes its certificates with it, so those count for
/// the certificates; a cluster removed takes its frontends with it (`ConfigState::remove_cluster`
/// in sozu's `command/src/state.rs`), so it counts for both.
pub fn parts_of(kind: &str) -> &'static [Part] {
    match kind {
        "RemoveCluster" => &[Part::Clusters, Part::Frontends],
        "AddCluster"
        | "AddBackend"
        | "AddUnixBackend"
        | "RemoveBackend"
        | "SetHealthCheck"
        | "SetProtectedHealthCheck"
        | "RemoveHealthCheck" => &[Part::Clusters],
        "AddCertificate"
        | "ReplaceCertificate"
        | "RemoveCertificate"
        | "AddHttpsListener"
        | "AddHttpsListenerWithClientAuth"
        | "RemoveListener" => &[Part::Certificates],
        "AddHttpFrontend"
        | "AddHttpFrontendWithSilentClose"
        | "AddHttpFrontendWithHeaderPredicates"
        | "RemoveHttpFrontend"
        | "RemoveHttpFrontendWithHeaderPredicates"
        | "AddHttpsFrontend"
        | "AddHttpsFrontendWithSilentClose"
        | "AddHttpsFrontendWithHeaderPredicates"
        | "RemoveHttpsFrontend"
        | "RemoveHttpsFrontendWithHeaderPredicates"
        | "AddTcpFrontend"
        | "RemoveTcpFrontend"
        | "AddUdpFrontend"
        | "RemoveUdpFrontend" => &[Part::Frontends],
        _ => &[],
    }
}

/// How many requests of each part sozu's census counts. sozu starts a kind's count at 2 for
/// its first request (`increment_request_count`: `or_insert(1)`, then `+= 1`), so a kind's
/// requests are its count less one.
pub fn counted(census: &BTreeMap<String, i32>) -> [u64; PARTS] {
    let mut parts = [0u64; PARTS];
    for (kind, count) in census {
        for part in parts_of(kind) {
            parts[part.index()] += u64::try_from(count.saturating_sub(1)).unwrap_or(0);
        }
    }
    parts
}

/// The agent's own requests of one part, as the agent counted them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sent {
    /// Requests written to sozu.
    pub began: u64,
    /// Requests whose fate is known: answered, or given up on.
    pub ended: u64,
    /// Of those ended, the ones sozu may or may not have counted: refused (sozu refuses some
    /// before its census counts them, some after), or never answered.
    pub unsure: u64,
}

/// The agent's requests, by part, counted as they go: shared by every connection of the agent
/// to one sozu.
#[derive(Debug, Default)]
pub struct Tally {
    sent: Mutex<[Sent; PARTS]>,
    ended: Condvar,
}

impl Tally {
    fn sent(&self) -> std::sync::MutexGuard<'_, [Sent; PARTS]> {
        self.sent.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A request of kind `kind` is about to be written.
    pub fn begin(&self, kind: &str) {
        let parts = parts_of(kind);
        if !parts.is_empty() {
            let mut sent = self.sent();
            for part in parts {
                sent[part.index()].began += 1;
            }
        }
    }

    /// A request of kind `kind` ended: `sure` when sozu surely counted it (it answered OK).
    pub fn end(&self, kind: &str, sure: bool) {
        let parts = parts_of(kind);
        if parts.is_empty() {
            return;
        }
        let mut sent = self.sent();
        for part in parts {
            let counts = &mut sent[part.index()];
            counts.ended += 1;
            if !sure {
                counts.unsure += 1;
            }
        }
        drop(sent);
        self.ended.notify_all();
    }

    /// What was counted so far.
    pub fn snapshot(&self) -> [Sent; PARTS] {
        *self.sent()
    }

    /// Waits, at most `bound`, until none of the agent's requests is on its way.
    pub fn wait_quiet(&self, bound: Duration) {
        let deadline = Instant::now() + bound;
        let mut sent = self.sent();
        while sent.iter().any(|s| s.began != s.ended) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            sent = match self.ended.wait_timeout(sent, left) {
                Ok((sent, _)) => sent,
                Err(p) => p.into_inner().0,
            };
        }
    }
}

/// The agent's count of a part at the moment of a census, when it is exact: nothing of that
/// part was on its way while sozu counted (`before` was taken just before the census was asked
/// for, `after` just after its answer).
pub fn exact_at(before: Sent, after: Sent) -> Option<Sent> {
    (before.began == before.ended && after.began == before.began).then_some(before)
}

/// A census and the agent's own count at the same moment, for one part: what later censuses
/// are compared with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Anchor {
    pub counted: u64,
    pub sent: Sent,
}

/// What a census says of one part since the anchor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Only the agent's requests: the part is as the agent's shadow holds it.
    Unchanged,
    /// Someone else sent a request of the part, or the agent cannot tell: read it.
    Read,
}

/// Pure: compares a census of one part (`counted` by sozu, `sent` by the agent at the same
/// moment, `None` when not exact) with the anchor.
pub fn judge(anchor: Option<Anchor>, counted: u64, sent: Option<Sent>) -> Verdict {
    let (Some(anchor), Some(sent)) = (anchor, sent) else {
        return Verdict::Read;
    };
    if sent.unsure != anchor.sent.unsure || counted < anchor.counted {
        // A request sozu may not have counted, or a census that went back (a new sozu).
        return Verdict::Read;
    }
    let by_sozu = counted - anchor.counted;
    let by_agent = sent.ended.saturating_sub(anchor.sent.ended);
    if by_sozu == by_agent {
        Verdict::Unchanged
    } else {
        Verdict::Read
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn census(entries: &[(&str, i32)]) -> BTreeMap<String, i32> {
        entries.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect()
    }

    #[test]
    fn sozu_counts_a_kinds_first_request_as_two() {
        let first = census(&[
            ("AddBackend", 2),
            ("ReplaceCertificate", 4),
            ("AddHttpsFrontend", 3),
            ("Status", 9),
        ]);
        assert_eq!(counted(&first), [1, 3, 2]);
        assert_eq!(counted(&BTreeMap::new()), [0, 0, 0]);
        // A cluster removed takes its frontends with it: it counts for both.
        assert_eq!(counted(&census(&[("RemoveCluster", 2)])), [1, 0, 1]);
    }

    fn sure(ended: u64) -> Sent {
        Sent {
            began: ended,
            ended,
            unsure: 0,
        }
    }

    #[test]
    fn only_the_agents_requests_leave_a_part_unread() {
        let anchor = Some(Anchor {
            counted: 10,
            sent: sure(4),
        });
        // sozu counted the agent's two requests, and nothing else.
        assert_eq!(judge(anchor, 12, Some(sure(6))), Verdict::Unchanged);
        assert_eq!(judge(anchor, 10, Some(sure(4))), Verdict::Unchanged);
        // One more than the agent sent: someone else's.
        assert_eq!(judge(anchor, 13, Some(sure(6))), Verdict::Read);
        // Fewer than at the anchor: another sozu.
        assert_eq!(judge(anchor, 3, Some(sure(6))), Verdict::Read);
        // No anchor yet, or a census taken while a request was on its way.
        assert_eq!(judge(None, 12, Some(sure(6))), Verdict::Read);
        assert_eq!(judge(anchor, 12, None), Verdict::Read);
    }

    /// A refused request may or may not be in sozu's count: a foreign request could hide
    /// behind it, so the part is read.
    #[test]
    fn a_request_sozu_may_not_have_counted_makes_the_part_read() {
        let anchor = Some(Anchor {
            counted: 10,
            sent: sure(4),
        });
        let refused = Sent {
            began: 5,
            ended: 5,
            unsure: 1,
        };
        // Refused before the census counted it, and someone else's request counted instead.
        assert_eq!(judge(anchor, 11, Some(refused)), Verdict::Read);
    }

    #[test]
    fn a_census_is_exact_only_when_nothing_was_on_its_way() {
        let quiet = sure(3);
        assert_eq!(exact_at(quiet, quiet), Some(quiet));
        let on_its_way = Sent {
            began: 4,
            ended: 3,
            unsure: 0,
        };
        assert_eq!(exact_at(on_its_way, on_its_way), None);
        // One began while sozu counted.
        assert_eq!(exact_at(quiet, on_its_way), None);
    }

    #[test]
    fn the_tally_counts_by_part_and_ignores_the_rest() {
        let tally = Tally::default();
        tally.begin("AddBackend");
        tally.begin("ReplaceCertificate");
        tally.begin("AddHttpsFrontend");
        tally.end("AddBackend", true);
        tally.end("ReplaceCertificate", false);
        tally.end("AddHttpsFrontend", true);
        tally.begin("ListFrontends");
        tally.end("ListFrontends", true);
        let [clusters, certificates, frontends] = tally.snapshot();
        assert_eq!(clusters, sure(1));
        assert_eq!(frontends, sure(1));
        assert_eq!(
            certificates,
            Sent {
                began: 1,
                ended: 1,
                unsure: 1
            }
        );
        // Nothing on its way: no wait.
        tally.wait_quiet(Duration::from_secs(3600));
    }
}
