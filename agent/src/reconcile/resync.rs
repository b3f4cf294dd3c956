//! A resync that never holds up a rotation: sozu's state is read beside the loop, then compared
//! with the shadow, and only what differs is planned.
//!
//! A resync used to be a pass like the others: the shadow dropped, sozu's whole state read
//! while the loop waited, the desired state rebuilt, every route planned and published. At
//! 10,000 routes that held the loop for 1.1–1.2 s, and a rotation that came meanwhile waited
//! for all of it. Now:
//!
//! 1. The read starts on a connection of its own ([`crate::sozu::Proxy::read_state_beside`])
//!    and the loop goes on: rotations, edits and DNS answers are planned against the shadow
//!    and sent as usual.
//! 2. Every request sozu accepted while the read was under way is noted ([`Reading::journal`]).
//!    sozu answered the read at some moment of that stretch, so each of them may or may not be
//!    in what it listed; applied again to the read (each request's effect on a state is the
//!    same whether or not it is already there), the read becomes what sozu holds once they all
//!    are.
//! 3. That is compared with the shadow ([`differences`]). Equal, as it is when nobody else
//!    touched sozu, the resync is over: nothing rebuilt, planned, published or sent. Otherwise
//!    the read becomes the shadow and the hosts and clusters that differ are planned.
//!
//! A read that fails keeps the shadow: rotations go on from what the agent knows, and the
//! failure shows in `/readyz`'s body, `/v1/state` (`sozu.last_read_error`), the metric
//! `private_ingress_sozu_read_failures_total` and the alert built on it. A read of a sozu other
//! than the one the shadow describes is dropped: a new sozu is read in full anyway.

use crate::plan::state::Actual;
use crate::plan::{Op, Scope};
use crate::sozu::{Generation, SozuError};

/// A read of sozu's state under way beside the loop.
pub struct Reading {
    pub read: crate::sozu::proxy::ReadBeside,
    /// The requests sozu accepted since the read started.
    pub journal: Vec<Op>,
    /// The sozu the read went to.
    pub generation: Option<Generation>,
    pub started: std::time::Instant,
}

impl Reading {
    /// Awaits the read; pending for ever when there is none, so that a `select!` branch on it
    /// can be guarded by `is_some()`.
    pub async fn finished(reading: &mut Option<Reading>) -> Result<Actual, SozuError> {
        match reading {
            Some(reading) => reading.read.as_mut().await,
            None => std::future::pending().await,
        }
    }
}

/// The read with the requests sent during it applied again: what sozu holds once they all are.
pub fn caught_up(mut read: Actual, journal: &[Op]) -> Actual {
    for op in journal {
        crate::plan::apply(&mut read, op);
    }
    read
}

/// What differs between the shadow and a read of sozu, as the scope to plan: the hosts and
/// clusters concerned, or everything when a listener differs. Empty when they are equal.
pub fn differences(shadow: &Actual, read: &Actual) -> Scope {
    let mut scope = Scope::default();
    if shadow == read {
        return scope;
    }
    if shadow.listeners != read.listeners
        || shadow.listener_settings != read.listener_settings
        || shadow.listener_answers != read.listener_answers
        || shadow.hsts != read.hsts
        || shadow.certificates.keys().ne(read.certificates.keys())
    {
        return Scope::everything();
    }
    for id in shadow.clusters.symmetric_difference(&read.clusters) {
        scope.clusters.insert(id.clone());
    }
    let mut cluster_maps_differ = |a: &std::collections::BTreeSet<&String>| {
        scope.clusters.extend(a.iter().map(|id| (*id).clone()));
    };
    cluster_maps_differ(&differing_keys(&shadow.backends, &read.backends));
    cluster_maps_differ(&differing_keys(&shadow.health_checks, &read.health_checks));
    cluster_maps_differ(&differing_keys(
        &shadow.cluster_policies,
        &read.cluster_policies,
    ));
    for frontend in shadow.frontends.symmetric_difference(&read.frontends) {
        scope.hosts.insert(frontend.hostname.clone());
        scope.clusters.extend(frontend.cluster_id.clone());
    }
    for frontend in shadow
        .stream_frontends
        .symmetric_difference(&read.stream_frontends)
    {
        scope.clusters.insert(frontend.cluster_id.clone());
    }
    for (address, held) in &shadow.certificates {
        let Some(listed) = read.certificates.get(address) else {
            continue;
        };
        for (one, other) in [(held, listed), (listed, held)] {
            for (fingerprint, names) in one.iter() {
                if !other.contains(fingerprint) {
                    scope.hosts.extend(names.iter().cloned());
                }
            }
        }
    }
    scope
}

/// The keys whose values differ between two maps, or that one of them lacks.
fn differing_keys<'a, V: PartialEq>(
    a: &'a std::collections::BTreeMap<String, V>,
    b: &'a std::collections::BTreeMap<String, V>,
) -> std::collections::BTreeSet<&'a String> {
    a.iter()
        .filter(|(k, v)| b.get(*k) != Some(*v))
        .map(|(k, _)| k)
        .chain(b.keys().filter(|k| !a.contains_key(*k)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::state::Protocol;
    use crate::plan::tests::cert;
    use std::collections::BTreeSet;
    use std::net::SocketAddr;

    const HTTPS: &str = "127.0.0.1:8443";

    fn with_certificate(serial: u8, host: &str) -> Actual {
        let fingerprint = &cert(host, serial).fingerprint;
        let mut actual = Actual::default();
        let address: SocketAddr = HTTPS.parse().expect("address");
        actual.listeners.insert(address, (Protocol::Https, true));
        actual
            .certificates
            .entry(address)
            .or_default()
            .insert(fingerprint, &BTreeSet::from([host.to_owned()]));
        actual
    }

    fn replace(old: u8, new: u8, host: &str) -> Op {
        Op::ReplaceCertificate {
            address: HTTPS.parse().expect("address"),
            old_fingerprint: cert(host, old).fingerprint,
            certificate: cert(host, new),
        }
    }

    #[test]
    fn an_unchanged_sozu_differs_in_nothing() {
        let shadow = with_certificate(1, "a.example");
        assert!(differences(&shadow, &shadow.clone()).is_empty());
    }

    #[test]
    fn a_rotation_sent_during_the_read_counts_whether_or_not_the_read_saw_it() {
        let before = with_certificate(1, "a.example");
        let rotation = replace(1, 2, "a.example");
        let mut shadow = before.clone();
        crate::plan::apply(&mut shadow, &rotation);
        // sozu listed its state before it took the rotation, or after.
        for read in [before.clone(), shadow.clone()] {
            let read = caught_up(read, std::slice::from_ref(&rotation));
            assert!(differences(&shadow, &read).is_empty());
        }
    }

    #[test]
    fn what_someone_else_changed_is_planned_for_its_host_alone() {
        let shadow = with_certificate(1, "a.example");
        let mut read = shadow.clone();
        let address: SocketAddr = HTTPS.parse().expect("address");
        read.certificates.entry(address).or_default().insert(
            &cert("b.example", 3).fingerprint,
            &BTreeSet::from(["b.example".to_owned()]),
        );
        let scope = differences(&shadow, &read);
        assert!(!scope.everything);
        assert_eq!(scope.hosts, BTreeSet::from(["b.example".to_owned()]));
        // A listener gone is everything.
        read.listeners.clear();
        assert!(differences(&shadow, &read).everything);
    }
}
