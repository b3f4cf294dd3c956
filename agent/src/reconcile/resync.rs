//! A resync that never holds up a rotation: sozu's state is read beside the loop, then compared
//! with the shadow, and only what differs is planned.
//!
//! Reading sozu's whole state takes long at scale: done as a pass (the shadow dropped, the
//! state read while the loop waits, the desired state rebuilt, every route planned and
//! published), it held the loop for 1.1–1.2 s at 10,000 routes, and a rotation that came
//! meanwhile waited for all of it. So a resync goes in three steps, the slow one beside the
//! loop:
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
use crate::sozu::census::Part;
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
    pub async fn finished(
        reading: &mut Option<Reading>,
    ) -> Result<crate::sozu::proxy::StateRead, SozuError> {
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

/// The parts a read left `unread`, taken from the shadow: sozu's census said only the agent
/// changed them since they were last read (see [`crate::sozu::census`]), and the shadow holds
/// every request the agent sent, those sent during the read included.
pub fn fill_unread(read: &mut Actual, unread: &[Part], shadow: &Actual) {
    for part in unread {
        match part {
            Part::Clusters => {
                read.clusters.clone_from(&shadow.clusters);
                read.backends.clone_from(&shadow.backends);
                read.health_checks.clone_from(&shadow.health_checks);
                read.cluster_policies.clone_from(&shadow.cluster_policies);
            }
            Part::Certificates => read.certificates.clone_from(&shadow.certificates),
            Part::Frontends => {
                read.frontends.clone_from(&shadow.frontends);
                read.stream_frontends.clone_from(&shadow.stream_frontends);
            }
        }
    }
}

/// What differs between the shadow and a read of sozu, as the scope to plan: the hosts and
/// clusters concerned, or everything when a listener differs. Empty when they are equal. The
/// parts the read left `unread` are not compared: they are the shadow's (see [`fill_unread`],
/// for a read that replaces the shadow). Comparing them to a copy of themselves cost the loop
/// about 100 ms per resync at 10,000 routes, the copy included.
pub fn differences(shadow: &Actual, read: &Actual, unread: &[Part]) -> Scope {
    let clusters_read = !unread.contains(&Part::Clusters);
    let certificates_read = !unread.contains(&Part::Certificates);
    let frontends_read = !unread.contains(&Part::Frontends);
    let mut scope = Scope::default();
    if shadow.listeners != read.listeners
        || shadow.listener_settings != read.listener_settings
        || shadow.listener_answers != read.listener_answers
        || shadow.hsts != read.hsts
        || (certificates_read && shadow.certificates.keys().ne(read.certificates.keys()))
    {
        return Scope::everything();
    }
    if clusters_read {
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
    }
    if frontends_read {
        if shadow.frontends != read.frontends {
            for frontend in shadow.frontends.symmetric_difference(&read.frontends) {
                scope.hosts.insert(frontend.hostname.clone());
                scope.clusters.extend(frontend.cluster_id.clone());
            }
        }
        for frontend in shadow
            .stream_frontends
            .symmetric_difference(&read.stream_frontends)
        {
            scope.clusters.insert(frontend.cluster_id.clone());
        }
    }
    if certificates_read && shadow.certificates != read.certificates {
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
    use std::sync::Arc;

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
            .insert(Arc::clone(fingerprint), BTreeSet::from([host.to_owned()]));
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
        assert!(differences(&shadow, &shadow.clone(), &[]).is_empty());
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
            assert!(differences(&shadow, &read, &[]).is_empty());
        }
    }

    #[test]
    fn what_someone_else_changed_is_planned_for_its_host_alone() {
        let shadow = with_certificate(1, "a.example");
        let mut read = shadow.clone();
        let address: SocketAddr = HTTPS.parse().expect("address");
        read.certificates.entry(address).or_default().insert(
            cert("b.example", 3).fingerprint,
            BTreeSet::from(["b.example".to_owned()]),
        );
        let scope = differences(&shadow, &read, &[]);
        assert!(!scope.everything);
        assert_eq!(scope.hosts, BTreeSet::from(["b.example".to_owned()]));
        // A listener gone is everything.
        read.listeners.clear();
        assert!(differences(&shadow, &read, &[]).everything);
    }

    /// sozu's state after each of `journal`'s requests in turn, from `start`.
    fn moments(start: &Actual, journal: &[Op]) -> Vec<Actual> {
        let mut states = vec![start.clone()];
        for op in journal {
            let mut next = states.last().expect("a state").clone();
            crate::plan::apply(&mut next, op);
            states.push(next);
        }
        states
    }

    /// A read whose pieces were each listed at another moment: the listeners at `at[0]`, the
    /// clusters at `at[1]`, the frontends at `at[2]`, the certificates at `at[3]`.
    fn pieced(states: &[Actual], at: [usize; 4]) -> Actual {
        let mut read = Actual::default();
        let listeners = &states[at[0]];
        read.listeners.clone_from(&listeners.listeners);
        read.listener_settings
            .clone_from(&listeners.listener_settings);
        read.listener_answers
            .clone_from(&listeners.listener_answers);
        read.hsts.clone_from(&listeners.hsts);
        let clusters = &states[at[1]];
        read.clusters.clone_from(&clusters.clusters);
        read.backends.clone_from(&clusters.backends);
        read.health_checks.clone_from(&clusters.health_checks);
        read.cluster_policies.clone_from(&clusters.cluster_policies);
        let frontends = &states[at[2]];
        read.frontends.clone_from(&frontends.frontends);
        read.stream_frontends
            .clone_from(&frontends.stream_frontends);
        read.certificates.clone_from(&states[at[3]].certificates);
        read
    }

    /// An edit and a rotation sent while the read's pieces were listed one after the other:
    /// whichever piece saw whichever request, the read caught up is sozu once they all are.
    #[test]
    fn pieces_listed_at_different_moments_catch_up_with_the_requests_sent_meanwhile() {
        use crate::plan::tests::{desired, workspace};
        let (a, b) = ("a.in.example.org", "b.in.example.org");
        let before = workspace(&[(a, "/", "10.0.0.1:80"), (b, "/", "10.0.0.2:80")]);
        let mut start = Actual::default();
        for op in crate::plan::plan(&start.clone(), &desired(&before, &[cert(a, 1), cert(b, 2)])) {
            crate::plan::apply(&mut start, &op);
        }
        // b's route moves to another backend and a's certificate is renewed, meanwhile.
        let after = workspace(&[(a, "/", "10.0.0.1:80"), (b, "/", "10.0.0.3:80")]);
        let journal = crate::plan::plan(&start, &desired(&after, &[cert(a, 3), cert(b, 2)]));
        assert!(journal.len() >= 3, "{journal:#?}");
        let states = moments(&start, &journal);
        let sozu = states.last().expect("the end").clone();
        let n = states.len();
        let mut checked = 0;
        for l in 0..n {
            for c in 0..n {
                for f in 0..n {
                    for t in [0, n / 2, n - 1] {
                        let read = caught_up(pieced(&states, [l, c, f, t]), &journal);
                        assert!(
                            differences(&sozu, &read, &[]).is_empty(),
                            "pieces at {:?}: {:?}",
                            [l, c, f, t],
                            differences(&sozu, &read, &[])
                        );
                        checked += 1;
                    }
                }
            }
        }
        assert!(checked > 50);
    }

    /// A part the census left unread is the shadow's; a part read shows what someone else
    /// changed in it.
    #[test]
    fn an_unread_part_is_the_shadows_and_a_read_one_shows_what_changed() {
        use crate::plan::tests::{desired, workspace};
        let a = "a.in.example.org";
        let mut shadow = Actual::default();
        let ws = workspace(&[(a, "/", "10.0.0.1:80")]);
        for op in crate::plan::plan(&shadow.clone(), &desired(&ws, &[cert(a, 1)])) {
            crate::plan::apply(&mut shadow, &op);
        }
        let (id, _) = shadow
            .backends
            .iter()
            .find(|(_, b)| !b.is_empty())
            .expect("a cluster with a backend");
        let id = id.clone();
        // Someone else removed the backend: a read of the clusters shows it, for that cluster.
        let mut sozu = shadow.clone();
        sozu.backends.insert(id.clone(), Default::default());
        let read = Actual {
            certificates: Default::default(),
            ..sozu.clone()
        };
        let scope = differences(&shadow, &read, &[Part::Certificates]);
        assert_eq!(scope.clusters, BTreeSet::from([id.clone()]));
        // Only the listeners and frontends read: nothing differs, and the read, filled from
        // the shadow, is the shadow.
        let mut read = Actual {
            listeners: sozu.listeners.clone(),
            listener_settings: sozu.listener_settings.clone(),
            frontends: sozu.frontends.clone(),
            ..Actual::default()
        };
        let unread = [Part::Clusters, Part::Certificates];
        assert!(differences(&shadow, &read, &unread).is_empty());
        fill_unread(&mut read, &unread, &shadow);
        assert_eq!(read, shadow);
        // Only the listeners read (nobody else changed anything): nothing differs, nothing is
        // lost, and a frontend someone removed is shown once its part is read.
        let listeners_only = || Actual {
            listeners: sozu.listeners.clone(),
            listener_settings: sozu.listener_settings.clone(),
            ..Actual::default()
        };
        let unread = [Part::Clusters, Part::Certificates, Part::Frontends];
        let mut read = listeners_only();
        assert!(differences(&shadow, &read, &unread).is_empty());
        fill_unread(&mut read, &unread, &shadow);
        assert_eq!(read, shadow);
        let removed = shadow.frontends.iter().next().expect("a frontend").clone();
        let mut read = listeners_only();
        fill_unread(&mut read, &[Part::Clusters, Part::Certificates], &shadow);
        read.frontends = shadow.frontends.clone();
        read.frontends.remove(&removed);
        let scope = differences(&shadow, &read, &[Part::Clusters, Part::Certificates]);
        assert_eq!(scope.hosts, BTreeSet::from([a.to_owned()]));
    }

    /// sozu removes a cluster's frontends with the cluster: so does the shadow, which a resync
    /// that leaves the frontends unread takes them from.
    #[test]
    fn a_cluster_removed_takes_its_frontends_from_the_shadow_as_from_sozu() {
        use crate::plan::tests::{desired, workspace};
        let a = "a.in.example.org";
        let mut shadow = Actual::default();
        let ws = workspace(&[(a, "/", "10.0.0.1:80")]);
        for op in crate::plan::plan(&shadow.clone(), &desired(&ws, &[cert(a, 1)])) {
            crate::plan::apply(&mut shadow, &op);
        }
        let id = shadow.clusters.iter().next().expect("a cluster").clone();
        assert!(shadow
            .frontends
            .iter()
            .any(|f| f.cluster_id.as_deref() == Some(id.as_str())));
        crate::plan::apply(&mut shadow, &Op::RemoveCluster { id: id.clone() });
        assert!(shadow
            .frontends
            .iter()
            .all(|f| f.cluster_id.as_deref() != Some(id.as_str())));
    }
}
