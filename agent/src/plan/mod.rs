//! `plan(actual, desired)`: the requests that turn what sozu holds into what the workspace asks
//! for, and nothing else. Pure: no I/O, deterministic order.
//!
//! Order is what keeps traffic safe: a frontend is added only after its cluster, its backends and
//! its certificate exist, and removed before them; new backends go in before stale ones go out, so
//! a cluster never drops to zero backends during a change; a certificate is replaced (sozu adds
//! the new one before removing the old) rather than removed and added.
//!
//! Error pages cannot be taken back from sozu's workers: a cluster sent again without a page
//! keeps it, and so does a listener. A page the workspace no longer names is replaced instead, by
//! the workspace's page for that status (a route's) or by a plain page of the status
//! ([`crate::sozu_policy::plain_answer`]).
//!
//! Frontend swaps. sozu keys a frontend by its address, hostname and path: a frontend whose
//! policy (or cluster, or HSTS) changes must be removed and added again, and a request between
//! the two would find none (a 404). sozu matches a hostname's exact spelling before a spelling
//! whose first label is a pattern (`/app/.in.example.org` for `app.in.example.org`), and passes a
//! request on when none of a spelling's rules matches its path. So a host whose frontends change
//! moves them all to its other spelling: the new ones are added first, the old ones removed
//! after, in an order that routes every request as the workspace says at each step. Towards
//! the pattern spelling, the exact spelling's frontends go least specific first (a shorter prefix
//! left there would take the requests of a longer one already moved); towards the exact
//! spelling, the new frontends come most specific first.
//!
//! Ownership: the agent changes only clusters whose id starts with [`ID_PREFIX`], frontends tagged
//! [`crate::sozu_state::OWNER_TAG`], and certificates on its HTTPS listener whose names all lie in
//! the workspace zone ([`crate::sozu_state::owned_certificate`]).

use std::collections::{BTreeMap, BTreeSet};

use std::net::SocketAddr;
use std::sync::Arc;

use crate::sozu_policy::{plain_answer, ClusterPolicy};
use crate::sozu_state::{
    frontends_of, owned_certificate, Actual, ClientAuthState, Desired, Frontend,
    ListenerCertificates, Protocol,
};
use crate::workspace::ID_PREFIX;

mod ops;
mod order;
mod shadow;

pub use ops::{scope_of, summary, Op, Outcome, Scope};
pub use order::{depends_on, phase};
pub use shadow::apply;

/// Every request that turns `actual` into `desired`.
pub fn plan(actual: &Actual, desired: &Desired) -> Vec<Op> {
    plan_scope(actual, desired, &Scope::everything())
}

/// The listener settings `desired` asks for that sozu holds otherwise and can change only by
/// making the listener again (its interface, TLS versions, client certificates), as
/// `<address>: <setting>`. The agent does not remove a serving listener for them.
pub fn listeners_need_restart(actual: &Actual, desired: &Desired) -> Vec<String> {
    let mut fixed = Vec::new();
    for (address, &protocol) in &desired.listeners {
        if let Some(current) = actual.listener_settings.get(address) {
            for setting in current.fixed_differences(&desired.listener_settings, protocol) {
                fixed.push(format!("{address}: {setting}"));
            }
        }
    }
    fixed
}

/// The requests that turn `actual` into `desired` within `scope`.
pub fn plan_scope(actual: &Actual, desired: &Desired, scope: &Scope) -> Vec<Op> {
    let mut ops = Vec::new();
    let none = ListenerCertificates::default();
    let present = desired
        .https_address
        .and_then(|address| actual.certificates.get(&address))
        .unwrap_or(&none);
    let mut certificates = CertificatePlan {
        present,
        sent: BTreeSet::new(),
        removed: BTreeSet::new(),
    };
    if scope.everything {
        // 1. Listeners.
        for (&address, &protocol) in &desired.listeners {
            let settings = || Box::new(desired.listener_settings.clone());
            match actual.listeners.get(&address) {
                None => {
                    ops.push(Op::AddListener {
                        protocol,
                        address,
                        settings: settings(),
                    });
                    ops.push(Op::ActivateListener {
                        protocol,
                        address,
                        interface: desired.listener_settings.interface.clone(),
                    });
                }
                Some(&(_, false)) => ops.push(Op::ActivateListener {
                    protocol,
                    address,
                    interface: actual
                        .listener_settings
                        .get(&address)
                        .and_then(|s| s.interface.clone()),
                }),
                Some(&(_, true)) => {}
            }
            let current = actual.listener_settings.get(&address);
            if current.is_some_and(|c| c.patchable_differs(&desired.listener_settings)) {
                ops.push(Op::PatchListener {
                    protocol,
                    address,
                    settings: settings(),
                });
            }
            // Client certificates, replaced whole once their files are known; until then sozu's
            // are left as they are (a revocation list is never dropped for want of a read).
            let wanted = &desired.listener_settings.client_auth;
            let differs = |held: &Option<_>| match (held, wanted) {
                (None, None) => false,
                (Some(held), Some(wanted)) => !ClientAuthState::same_as(held, wanted),
                _ => true,
            };
            if protocol == Protocol::Https
                && desired.client_auth_known
                && current.is_some_and(|c| differs(&c.client_auth))
            {
                ops.push(Op::SetClientAuth {
                    address,
                    client_auth: wanted.clone().map(Box::new),
                });
            }
            // Error pages, on a new listener as on one sozu holds (phase 2 comes after the
            // listener is added).
            let none = BTreeMap::new();
            let held = actual.listener_answers.get(&address).unwrap_or(&none);
            let wanted = answers_to_hold(&desired.listener_answers, held, &BTreeMap::new());
            if &wanted != held {
                ops.push(Op::SetListenerAnswers {
                    protocol,
                    address,
                    answers: wanted,
                });
            }
            if protocol == Protocol::Https && actual.hsts.get(&address) != desired.hsts.as_ref() {
                ops.push(Op::SetListenerHsts {
                    address,
                    hsts: desired.hsts,
                });
            }
        }
        // Every cluster and every host either side knows of.
        let clusters: BTreeSet<&str> = desired
            .clusters
            .keys()
            .map(String::as_str)
            .chain(actual.clusters.iter().map(String::as_str))
            .chain(actual.backends.keys().map(String::as_str))
            .collect();
        for id in clusters {
            plan_cluster(actual, desired, id, &mut ops);
        }
        let hosts: BTreeSet<&str> = desired
            .frontends
            .iter()
            .chain(actual.frontends.iter().filter(|f| f.is_owned()))
            .map(|f| f.hostname.as_str())
            .chain(desired.hosts_with_certificates())
            .chain(present.names())
            .collect();
        for host in hosts {
            certificates.plan_host(desired, host, &mut ops);
            plan_frontends(actual, desired, host, &mut ops);
        }
    } else {
        for id in &scope.clusters {
            plan_cluster(actual, desired, id, &mut ops);
        }
        for host in &scope.hosts {
            certificates.plan_host(desired, host, &mut ops);
            plan_frontends(actual, desired, host, &mut ops);
        }
    }
    // Group by phase (stable, so the order above holds within each): every operation of a
    // phase can then be sent concurrently, see `crate::sozu::phases::send_in_phases`.
    ops.sort_by_key(phase);
    ops
}

/// A cluster: created with its new backends before anything routes to it; its stale backends
/// removed after the new ones are in (a cluster never drops to zero backends during a change);
/// removed, with its backends, when no route wants it any more (the agent's clusters only).
fn plan_cluster(actual: &Actual, desired: &Desired, id: &str, ops: &mut Vec<Op>) {
    let present = actual.backends.get(id);
    match desired.clusters.get(id) {
        Some(wanted) => {
            let held = actual.cluster_policies.get(id);
            let policy = cluster_policy_to_hold(desired, id, held.map(Arc::as_ref));
            if !actual.clusters.contains(id) || policy.as_deref() != held.map(Arc::as_ref) {
                ops.push(Op::AddCluster {
                    id: id.to_owned(),
                    policy,
                });
            }
            for backend in wanted.values() {
                if present.and_then(|p| p.get(&backend.id)) != Some(backend) {
                    ops.push(Op::AddBackend {
                        cluster_id: id.to_owned(),
                        backend: backend.clone(),
                    });
                }
            }
            // A removed backend's sessions are closed, so keep-alive clients move on now; not
            // where sozu adds HSTS to the responses (see `Desired::hsts_clusters`).
            let close_sessions = !desired.hsts_clusters.contains(id);
            for backend in present.into_iter().flat_map(BTreeMap::values) {
                if !wanted.contains_key(&backend.id) {
                    ops.push(Op::RemoveBackend {
                        cluster_id: id.to_owned(),
                        backend: backend.clone(),
                    });
                    if close_sessions {
                        ops.push(Op::CloseSessions {
                            cluster_id: id.to_owned(),
                            backend: backend.clone(),
                        });
                    }
                }
            }
            let check = desired.health_checks.get(id);
            if actual.health_checks.get(id) != check {
                ops.push(match check {
                    Some(check) => Op::SetHealthCheck {
                        cluster_id: id.to_owned(),
                        check: check.clone(),
                    },
                    None => Op::RemoveHealthCheck {
                        cluster_id: id.to_owned(),
                    },
                });
            }
        }
        None => {
            if id.starts_with(ID_PREFIX) && actual.clusters.contains(id) {
                ops.push(Op::RemoveCluster { id: id.to_owned() });
            }
        }
    }
}

/// The error pages to hold where sozu holds `held`: the wanted ones, and in place of each page
/// held that is no longer wanted, `fallback`'s page for its status or a plain one (see the
/// module).
fn answers_to_hold(
    wanted: &BTreeMap<String, Arc<str>>,
    held: &BTreeMap<String, Arc<str>>,
    fallback: &BTreeMap<String, Arc<str>>,
) -> BTreeMap<String, Arc<str>> {
    let mut answers = wanted.clone();
    for status in held.keys() {
        if !answers.contains_key(status) {
            let page = match fallback.get(status) {
                Some(page) => page.clone(),
                None => Arc::from(plain_answer(status.parse().unwrap_or(0))),
            };
            answers.insert(status.clone(), page);
        }
    }
    answers
}

/// The policy cluster `id` must hold, given what sozu holds: the desired one, with the pages
/// sozu holds that it no longer names replaced (see the module); `None` for none.
fn cluster_policy_to_hold(
    desired: &Desired,
    id: &str,
    held: Option<&ClusterPolicy>,
) -> Option<Arc<ClusterPolicy>> {
    let wanted = desired.cluster_policies.get(id);
    let stale = held.is_some_and(|h| {
        h.answers
            .keys()
            .any(|s| !wanted.is_some_and(|w| w.answers.contains_key(s)))
    });
    if !stale {
        return wanted.cloned();
    }
    let mut policy = wanted.map(|w| (**w).clone()).unwrap_or_default();
    let none = BTreeMap::new();
    policy.answers = answers_to_hold(
        &policy.answers,
        held.map_or(&none, |h| &h.answers),
        &desired.listener_answers,
    );
    Some(Arc::new(policy))
}

/// A host's frontends on each listener: the agent's that are no longer wanted go, the wanted
/// ones that are missing come; where one changes, the host's frontends on that listener swap
/// spellings (see the module).
fn plan_frontends(actual: &Actual, desired: &Desired, host: &str, ops: &mut Vec<Op>) {
    // Per listener: (the agent's frontends in sozu, the wanted ones).
    type Sides<'a> = (Vec<&'a Frontend>, Vec<&'a Frontend>);
    let mut listeners: BTreeMap<(Protocol, SocketAddr), Sides> = BTreeMap::new();
    for frontend in frontends_of(&actual.frontends, host).filter(|f| f.is_owned()) {
        let key = (frontend.protocol, frontend.address);
        listeners.entry(key).or_default().0.push(frontend);
    }
    for frontend in frontends_of(&desired.frontends, host) {
        let key = (frontend.protocol, frontend.address);
        listeners.entry(key).or_default().1.push(frontend);
    }
    for (present, wanted) in listeners.values() {
        plan_listener_frontends(present, wanted, ops);
    }
}

/// One host's frontends on one listener: `present` (the agent's, in sozu) becomes `wanted`
/// (spelled exactly).
fn plan_listener_frontends(present: &[&Frontend], wanted: &[&Frontend], ops: &mut Vec<Op>) {
    let spelling = match present.first() {
        Some(first) if present.iter().all(|f| f.alias == first.alias) => Some(first.alias),
        Some(_) => None,
        None => Some(false),
    };
    let same_path = |f: &Frontend, g: &Frontend| f.path_prefix == g.path_prefix;
    // A path both hold, with another frontend in sozu than the workspace asks for.
    let changed = present.iter().any(|p| {
        wanted
            .iter()
            .any(|w| same_path(p, w) && p.spelled(false) != **w)
    });
    if let (Some(alias), false) = (spelling, changed) {
        // Routes added or removed, none changed: no swap.
        for p in present {
            if !wanted.iter().any(|w| same_path(p, w)) {
                ops.push(Op::RemoveFrontend((*p).clone()));
            }
        }
        for w in wanted {
            if !present.iter().any(|p| same_path(p, w)) {
                ops.push(Op::AddFrontend(w.spelled(alias)));
            }
        }
        return;
    }
    // A swap, to the other spelling (to the exact one from a mixed state).
    let alias = spelling.is_some_and(|s| !s);
    let mut new: Vec<Frontend> = wanted
        .iter()
        .map(|w| w.spelled(alias))
        .filter(|w| !present.contains(&w))
        .collect();
    let mut old: Vec<Frontend> = present
        .iter()
        .filter(|p| !new.contains(p) && !wanted.iter().any(|w| w.spelled(alias) == ***p))
        .map(|p| (*p).clone())
        .collect();
    let specificity = |f: &Frontend| f.path_prefix.len();
    if alias {
        // The exact spelling empties least specific first.
        old.sort_by_key(specificity);
    } else {
        // The exact spelling fills most specific first.
        new.sort_by_key(|f| std::cmp::Reverse(specificity(f)));
    }
    let steps = |list: &[Frontend], ordered: bool| -> Vec<u16> {
        let mut steps = Vec::with_capacity(list.len());
        let mut step = 0u16;
        for (i, f) in list.iter().enumerate() {
            if ordered && i > 0 && specificity(&list[i - 1]) != specificity(f) {
                step = step.saturating_add(1);
            }
            steps.push(step);
        }
        steps
    };
    let last_add = steps(&new, !alias).last().copied().unwrap_or(0);
    for (frontend, step) in new.iter().zip(steps(&new, !alias)) {
        ops.push(Op::SwapFrontend {
            frontend: frontend.clone(),
            add: true,
            step,
        });
    }
    for (frontend, step) in old.iter().zip(steps(&old, alias)) {
        ops.push(Op::SwapFrontend {
            frontend: frontend.clone(),
            add: false,
            step: last_add.saturating_add(1).saturating_add(step),
        });
    }
}

/// The certificates of a plan. Exactly one certificate per host on the HTTPS listener: SNI
/// serves the longest-lived of several, so a stale certificate left beside a renewed one could
/// keep serving.
struct CertificatePlan<'a> {
    present: &'a ListenerCertificates,
    /// Fingerprints added or replacing another in this plan (a certificate naming two hosts
    /// goes once).
    sent: BTreeSet<String>,
    /// Fingerprints replaced or removed in this plan.
    removed: BTreeSet<String>,
}

impl CertificatePlan<'_> {
    fn plan_host(&mut self, desired: &Desired, host: &str, ops: &mut Vec<Op>) {
        let Some(address) = desired.https_address else {
            return;
        };
        let owned = |names: &[String]| owned_certificate(names, &desired.zone);
        if let Some(certificate) = desired.certificates().get(host) {
            let fingerprint = certificate.fingerprint.as_str();
            let names_differ = self
                .present
                .names_of(fingerprint)
                .is_some_and(|names| !names.iter().eq(certificate.names.iter()));
            if names_differ && !self.sent.contains(fingerprint) {
                // Held under other names (sent by an older agent with every SAN): replaced by
                // itself under the host's name alone, which sozu 2.3.3 does in one step.
                ops.push(Op::ReplaceCertificate {
                    address,
                    old_fingerprint: fingerprint.to_owned(),
                    certificate: certificate.clone(),
                });
                self.sent.insert(fingerprint.to_owned());
            } else if !self.present.contains(fingerprint) && !self.sent.contains(fingerprint) {
                // Replace one of ours when there is one, so the switch has no gap.
                let old = self.present.named(host).find(|(old, names)| {
                    owned(names) && !desired.is_wanted(old) && !self.removed.contains(*old)
                });
                match old {
                    Some((old, _)) => {
                        ops.push(Op::ReplaceCertificate {
                            address,
                            old_fingerprint: old.to_owned(),
                            certificate: certificate.clone(),
                        });
                        self.removed.insert(old.to_owned());
                    }
                    None => ops.push(Op::AddCertificate {
                        address,
                        certificate: certificate.clone(),
                    }),
                }
                self.sent.insert(fingerprint.to_owned());
            }
        }
        // Every other certificate of ours naming the host: it has another, or left the workspace.
        for (fingerprint, names) in self.present.named(host) {
            if owned(names)
                && !desired.is_wanted(fingerprint)
                && !self.removed.contains(fingerprint)
            {
                ops.push(Op::RemoveCertificate {
                    address,
                    fingerprint: fingerprint.to_owned(),
                });
                self.removed.insert(fingerprint.to_owned());
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::sozu_state::{Certificate, Frontend};
    use crate::sozu_state::{KeyPem, OWNER_TAG};
    use crate::workspace::{Route, Upstream, Workspace};
    use std::net::SocketAddr;

    pub(crate) fn workspace(routes: &[(&str, &str, &str)]) -> Workspace {
        let routes = routes
            .iter()
            .map(|(host, path, upstream)| Route {
                id: crate::workspace::route_id(host, path),
                host: (*host).into(),
                path_prefix: (*path).into(),
                upstreams: vec![crate::workspace::RouteUpstream {
                    upstream: Upstream::Ip {
                        address: upstream.parse().unwrap(),
                    },
                    weight: 1,
                    drain: false,
                }],
                health: None,
                hsts: None,
                policy: None,
            })
            .collect();
        crate::workspace::test_workspace(std::path::Path::new("/tls"), routes)
    }

    pub(crate) fn cert(host: &str, serial: u8) -> Certificate {
        Certificate {
            other_names: std::sync::Arc::from([]),
            fingerprint: format!("{serial:02x}{}", "ab".repeat(31)),
            chain: vec![format!("PEM {host} {serial}")].into(),
            key: KeyPem::new("key".into()),
            not_before: 1_700_000_000,
            not_after: 2_000_000_000,
            names: BTreeSet::from([host.to_owned()]).into(),
        }
    }

    pub(crate) fn desired(ws: &Workspace, certs: &[Certificate]) -> Desired {
        let certificates = certs
            .iter()
            .map(|c| (c.names.iter().next().unwrap().clone(), c.clone()))
            .collect();
        crate::desired::build(
            ws,
            &BTreeMap::new(),
            &certificates,
            &Default::default(),
            None,
        )
        .0
    }

    fn converge(actual: &mut Actual, desired: &Desired) -> Vec<Op> {
        let ops = plan(actual, desired);
        for op in &ops {
            apply(actual, op);
        }
        ops
    }

    fn position(ops: &[Op], pred: impl Fn(&Op) -> bool) -> usize {
        ops.iter().position(pred).expect("op present")
    }

    /// A pair that names another host too is served for its own host only: one held under
    /// every SAN (as an older agent sent it) is replaced by itself under its host's name, in one
    /// request, and then left alone.
    #[test]
    fn a_certificate_held_under_other_names_is_replaced_by_itself() {
        let ws = workspace(&[
            ("a.in.example.org", "/", "10.0.0.1:80"),
            ("b.in.example.org", "/", "10.0.0.2:80"),
        ]);
        let (a, b) = (cert("a.in.example.org", 1), cert("b.in.example.org", 2));
        let want = desired(&ws, &[a.clone(), b.clone()]);
        let mut actual = Actual::default();
        for op in plan(&Actual::default(), &want) {
            apply(&mut actual, &op);
        }
        let https = want.https_address.unwrap();
        let held = actual.certificates.get_mut(&https).unwrap();
        held.remove(&a.fingerprint);
        held.insert(
            &a.fingerprint,
            &BTreeSet::from(["a.in.example.org".to_owned(), "b.in.example.org".to_owned()]),
        );
        let ops = plan(&actual, &want);
        assert_eq!(
            ops,
            [Op::ReplaceCertificate {
                address: https,
                old_fingerprint: a.fingerprint.clone(),
                certificate: a.clone(),
            }]
        );
        apply(&mut actual, &ops[0]);
        let held = &actual.certificates[&https];
        assert_eq!(
            held.names_of(&a.fingerprint),
            Some(&["a.in.example.org".to_owned()][..])
        );
        let b_served: Vec<&str> = held.named("b.in.example.org").map(|(f, _)| f).collect();
        assert_eq!(b_served, [b.fingerprint.as_str()]);
        assert_eq!(plan(&actual, &want), []);
    }

    #[test]
    fn cold_start_builds_each_route_before_routing_to_it() {
        let ws = workspace(&[("a.in.example.org", "/", "10.0.0.1:80")]);
        let mut actual = Actual::default();
        let ops = converge(&mut actual, &desired(&ws, &[cert("a.in.example.org", 1)]));
        let cluster = position(&ops, |o| matches!(o, Op::AddCluster { .. }));
        let backend = position(&ops, |o| matches!(o, Op::AddBackend { .. }));
        let certificate = position(&ops, |o| matches!(o, Op::AddCertificate { .. }));
        let frontend = position(&ops, |o| matches!(o, Op::AddFrontend(_)));
        let listener = position(&ops, |o| matches!(o, Op::ActivateListener { .. }));
        assert!(
            listener < cluster
                && cluster < backend
                && backend < certificate
                && certificate < frontend
        );
        assert_eq!(
            ops.iter()
                .filter(|o| matches!(o, Op::AddFrontend(_)))
                .count(),
            2
        );
    }

    #[test]
    fn a_converged_state_plans_nothing() {
        let ws = workspace(&[
            ("a.in.example.org", "/", "10.0.0.1:80"),
            ("a.in.example.org", "/api", "10.0.0.2:80"),
            ("b.in.example.org", "/", "[fd00::1]:80"),
        ]);
        let want = desired(
            &ws,
            &[cert("a.in.example.org", 1), cert("b.in.example.org", 2)],
        );
        let mut actual = Actual::default();
        assert!(!converge(&mut actual, &want).is_empty());
        assert_eq!(plan(&actual, &want), []);
    }

    #[test]
    fn what_the_agent_does_not_own_is_left_alone() {
        let ws = workspace(&[("a.in.example.org", "/", "10.0.0.1:80")]);
        let want = desired(&ws, &[cert("a.in.example.org", 1)]);
        let https: SocketAddr = "127.0.0.1:8443".parse().unwrap();
        let mut actual = Actual::default();
        actual.clusters.insert("operator-app".into());
        actual.frontends.insert(Frontend {
            protocol: Protocol::Https,
            address: https,
            hostname: "app.example.org".into(),
            path_prefix: "/".into(),
            cluster_id: Some("operator-app".into()),
            tags: Default::default(),
            hsts: None,
            policy: None,
            alias: false,
        });
        actual.certificates.entry(https).or_default().insert(
            &"ff".repeat(32),
            &BTreeSet::from(["app.example.org".to_owned()]),
        );
        let ops = converge(&mut actual, &want);
        assert!(
            ops.iter().all(|o| !o.describe().contains("operator-app")
                && !o.describe().contains("app.example.org")
                && !o.describe().contains("ffffffff")),
            "{ops:?}"
        );
    }

    #[test]
    fn a_renewed_certificate_replaces_the_old_one_and_leaves_exactly_one() {
        let ws = workspace(&[("a.in.example.org", "/", "10.0.0.1:80")]);
        let https: SocketAddr = "127.0.0.1:8443".parse().unwrap();
        let mut actual = Actual::default();
        converge(&mut actual, &desired(&ws, &[cert("a.in.example.org", 1)]));
        // A stale duplicate left behind by someone else's add.
        actual.certificates.get_mut(&https).unwrap().insert(
            &cert("a.in.example.org", 9).fingerprint,
            &BTreeSet::from(["a.in.example.org".to_owned()]),
        );
        let renewed = cert("a.in.example.org", 2);
        let ops = converge(&mut actual, &desired(&ws, std::slice::from_ref(&renewed)));
        let old = [1, 9].map(|serial| cert("a.in.example.org", serial).fingerprint);
        assert!(
            matches!(&ops[0], Op::ReplaceCertificate { old_fingerprint, .. } if old.contains(old_fingerprint)),
            "{ops:?}"
        );
        let left: Vec<_> = actual.certificates[&https]
            .iter()
            .map(|(fingerprint, _)| fingerprint.to_owned())
            .collect();
        assert_eq!(left, [renewed.fingerprint]);
    }

    #[test]
    fn a_changed_upstream_adds_the_new_backend_before_removing_the_old() {
        let c = cert("a.in.example.org", 1);
        let mut actual = Actual::default();
        converge(
            &mut actual,
            &desired(
                &workspace(&[("a.in.example.org", "/", "10.0.0.1:80")]),
                std::slice::from_ref(&c),
            ),
        );
        let ops = converge(
            &mut actual,
            &desired(
                &workspace(&[("a.in.example.org", "/", "10.0.0.2:80")]),
                std::slice::from_ref(&c),
            ),
        );
        assert_eq!(ops.len(), 3, "{ops:?}");
        assert!(
            matches!(&ops[0], Op::AddBackend { backend, .. } if backend.address.to_string() == "10.0.0.2:80")
        );
        assert!(
            matches!(&ops[1], Op::RemoveBackend { backend, .. } if backend.address.to_string() == "10.0.0.1:80")
        );
        // Keep-alive clients of the old backend move on at once.
        assert!(
            matches!(&ops[2], Op::CloseSessions { backend, .. } if backend.address.to_string() == "10.0.0.1:80")
        );

        // With HSTS the old backend's sessions are left to end: sozu would break a response in
        // flight on a session it closes while adding the header.
        let mut with_hsts = workspace(&[("a.in.example.org", "/", "10.0.0.3:80")]);
        with_hsts.hsts = crate::workspace::recommended_hsts();
        let ops = converge(&mut actual, &desired(&with_hsts, &[c]));
        assert!(
            matches!(
                &ops[..],
                [Op::SetListenerHsts { hsts: Some(_), .. }, Op::AddBackend { .. }, Op::RemoveBackend { backend, .. }]
                    if backend.address.to_string() == "10.0.0.2:80"
            ),
            "{ops:?}"
        );
    }

    /// One route of `a.in.example.org` over two IP upstreams with these weights and drains.
    fn two_upstreams(upstreams: [(u32, bool); 2]) -> Workspace {
        let mut ws = workspace(&[("a.in.example.org", "/", "10.0.0.1:80")]);
        ws.routes[0].upstreams = upstreams
            .iter()
            .enumerate()
            .map(|(i, &(weight, drain))| crate::workspace::RouteUpstream {
                upstream: Upstream::Ip {
                    address: format!("10.0.0.{}:80", i + 1).parse().unwrap(),
                },
                weight,
                drain,
            })
            .collect();
        ws
    }

    #[test]
    fn a_drain_takes_the_backend_out_and_closes_its_sessions_and_an_undrain_puts_it_back() {
        let c = cert("a.in.example.org", 1);
        let mut actual = Actual::default();
        converge(
            &mut actual,
            &desired(
                &two_upstreams([(9, false), (1, false)]),
                std::slice::from_ref(&c),
            ),
        );
        let weights: Vec<u32> = actual.backends["pi-a.in.example.org"]
            .values()
            .map(|b| b.weight)
            .collect();
        assert_eq!(weights, [9, 1]);
        let drain = converge(
            &mut actual,
            &desired(
                &two_upstreams([(9, true), (1, false)]),
                std::slice::from_ref(&c),
            ),
        );
        assert!(
            matches!(&drain[..], [Op::RemoveBackend { backend: a, .. }, Op::CloseSessions { backend: b, .. }]
                if a.address.to_string() == "10.0.0.1:80" && a == b),
            "{drain:?}"
        );
        let undrain = converge(
            &mut actual,
            &desired(
                &two_upstreams([(9, false), (1, false)]),
                std::slice::from_ref(&c),
            ),
        );
        assert!(
            matches!(&undrain[..], [Op::AddBackend { backend, .. }] if backend.weight == 9),
            "{undrain:?}"
        );
        // A new weight is the same backend added again (sozu replaces it), never removed.
        let reweigh = converge(
            &mut actual,
            &desired(&two_upstreams([(5, false), (1, false)]), &[c]),
        );
        assert!(
            matches!(&reweigh[..], [Op::AddBackend { backend, .. }] if backend.weight == 5),
            "{reweigh:?}"
        );
    }

    #[test]
    fn health_checks_and_hsts_follow_the_workspace() {
        let c = cert("a.in.example.org", 1);
        let mut ws = workspace(&[("a.in.example.org", "/", "10.0.0.1:80")]);
        ws.hsts = crate::workspace::recommended_hsts();
        let mut actual = Actual::default();
        let first = converge(&mut actual, &desired(&ws, std::slice::from_ref(&c)));
        let hsts = position(&first, |o| {
            matches!(o, Op::SetListenerHsts { hsts: Some(_), .. })
        });
        let listener = position(&first, |o| matches!(o, Op::ActivateListener { .. }));
        assert!(
            listener < hsts,
            "the listener exists before its policy is set"
        );
        assert!(!first.iter().any(|o| matches!(o, Op::SetHealthCheck { .. })));

        let check = crate::sozu_state::HealthCheck {
            probe: crate::sozu_state::Probe::Http {
                path: "/health".into(),
                accepted_statuses: vec![(200, 299)],
            },
            interval: 1,
            timeout: 1,
            healthy_threshold: 1,
            unhealthy_threshold: 2,
            port: None,
        };
        ws.routes[0].health = Some(check.clone());
        ws.routes[0].hsts = Some(crate::sozu_state::Hsts::OFF);
        let ops = converge(&mut actual, &desired(&ws, std::slice::from_ref(&c)));
        assert!(ops.contains(&Op::SetHealthCheck {
            cluster_id: "pi-a.in.example.org".into(),
            check
        }));
        // The HTTPS frontend's policy changed: its successor comes under the host's other
        // spelling, then it goes.
        let added = ops.iter().find_map(|o| match o {
            Op::SwapFrontend {
                frontend: f,
                add: true,
                ..
            } if f.protocol == Protocol::Https => Some(f),
            _ => None,
        });
        assert_eq!(
            added.and_then(|f| f.hsts),
            Some(crate::sozu_state::Hsts::OFF)
        );
        assert!(added.is_some_and(|f| f.alias));
        let removed = position(
            &ops,
            |o| matches!(o, Op::SwapFrontend { add: false, frontend, .. } if !frontend.alias),
        );
        let swapped_in = position(&ops, |o| matches!(o, Op::SwapFrontend { add: true, .. }));
        assert!(swapped_in < removed, "added before the old one goes");
        assert!(
            plan(&actual, &desired(&ws, std::slice::from_ref(&c))).is_empty(),
            "converged"
        );

        ws.routes[0].health = None;
        ws.hsts = None;
        let ops = converge(&mut actual, &desired(&ws, &[c]));
        assert!(ops.contains(&Op::RemoveHealthCheck {
            cluster_id: "pi-a.in.example.org".into()
        }));
        assert!(ops
            .iter()
            .any(|o| matches!(o, Op::SetListenerHsts { hsts: None, .. })));
    }

    #[test]
    fn a_removed_route_loses_its_frontends_before_its_cluster_and_its_certificate() {
        let a = cert("a.in.example.org", 1);
        let b = cert("b.in.example.org", 2);
        let mut actual = Actual::default();
        converge(
            &mut actual,
            &desired(
                &workspace(&[
                    ("a.in.example.org", "/", "10.0.0.1:80"),
                    ("b.in.example.org", "/", "10.0.0.2:80"),
                ]),
                &[a.clone(), b],
            ),
        );
        let ops = converge(
            &mut actual,
            &desired(
                &workspace(&[("a.in.example.org", "/", "10.0.0.1:80")]),
                &[a],
            ),
        );
        let frontend = position(&ops, |o| matches!(o, Op::RemoveFrontend(_)));
        let cluster = position(
            &ops,
            |o| matches!(o, Op::RemoveCluster { id } if id == "pi-b.in.example.org"),
        );
        assert!(frontend < cluster);
        assert!(ops
            .iter()
            .any(|o| matches!(o, Op::RemoveCertificate { .. })));
        assert!(actual
            .frontends
            .iter()
            .all(|f| f.hostname == "a.in.example.org" && f.tags.get(OWNER_TAG.0).is_some()));
    }

    #[test]
    fn a_route_without_a_certificate_gets_no_frontend_yet() {
        let ws = workspace(&[("a.in.example.org", "/", "10.0.0.1:80")]);
        let (want, held) = crate::desired::build(
            &ws,
            &BTreeMap::new(),
            &BTreeMap::new(),
            &Default::default(),
            None,
        );
        assert!(want.frontends.is_empty());
        assert_eq!(held.len(), 1);
        assert!(want.clusters.contains_key("pi-a.in.example.org"));
    }

    /// Listener settings: a new listener is made with them; on a running one, the PROXY
    /// protocol and the timeouts are patched in place, and what sozu takes on a new listener
    /// only (TLS versions, interface) is reported, not applied.
    #[test]
    fn listener_settings_are_patched_where_sozu_can_and_reported_where_it_cannot() {
        let c = cert("a.in.example.org", 1);
        let mut ws = workspace(&[("a.in.example.org", "/", "10.0.0.1:80")]);
        let mut actual = Actual::default();
        let ops = converge(&mut actual, &desired(&ws, std::slice::from_ref(&c)));
        assert!(ops
            .iter()
            .any(|o| matches!(o, Op::AddListener { settings, .. } if settings.timeouts == [60, 30, 3, 10])));
        assert!(converge(&mut actual, &desired(&ws, std::slice::from_ref(&c))).is_empty());

        ws.listener_policy.expect_proxy = true;
        ws.listener_policy.timeouts.front = 120;
        ws.listener_policy.min_tls_version = crate::workspace::TlsVersion::V1_3;
        let want = desired(&ws, std::slice::from_ref(&c));
        let ops = converge(&mut actual, &want);
        let patched: Vec<_> = ops
            .iter()
            .filter_map(|o| match o {
                Op::PatchListener { settings, .. } => {
                    Some((settings.expect_proxy, settings.timeouts[0]))
                }
                _ => None,
            })
            .collect();
        assert_eq!(patched, [(true, 120), (true, 120)], "{ops:?}");
        assert!(converge(&mut actual, &want).is_empty());
        let https = ws.listeners.https;
        assert_eq!(
            listeners_need_restart(&actual, &want),
            [format!("{https}: min_tls_version")]
        );
    }

    /// A host with nested routes swaps spellings in an order that routes every request as the
    /// workspace says at each step: to the pattern spelling, the exact one empties least specific
    /// first; back, the exact one fills most specific first.
    #[test]
    fn a_changed_frontend_swaps_its_hosts_spelling_in_a_safe_order() {
        let routes = [
            ("a.in.example.org", "/", "10.0.0.1:80"),
            ("a.in.example.org", "/api", "10.0.0.2:80"),
            ("a.in.example.org", "/api/v2", "10.0.0.3:80"),
        ];
        let mut ws = workspace(&routes);
        let c = cert("a.in.example.org", 1);
        let mut actual = Actual::default();
        converge(&mut actual, &desired(&ws, std::slice::from_ref(&c)));
        let https_steps = |ops: &[Op]| -> Vec<(bool, String, bool)> {
            ops.iter()
                .filter_map(|o| match o {
                    Op::SwapFrontend { frontend, add, .. }
                        if frontend.protocol == Protocol::Https =>
                    {
                        Some((*add, frontend.path_prefix.clone(), frontend.alias))
                    }
                    _ => None,
                })
                .collect()
        };
        ws.headers.response.set.insert("X-A".into(), "1".into());
        let ops = converge(&mut actual, &desired(&ws, std::slice::from_ref(&c)));
        let removals: Vec<String> = https_steps(&ops)
            .into_iter()
            .filter(|(add, _, _)| !add)
            .map(|(_, path, _)| path)
            .collect();
        assert_eq!(removals, ["/", "/api", "/api/v2"]);
        assert!(actual
            .frontends
            .iter()
            .filter(|f| f.protocol == Protocol::Https)
            .all(|f| f.alias));
        // Phases are strictly ordered: each removal is a phase after the one before.
        let phases: Vec<u32> = ops
            .iter()
            .filter(|o| matches!(o, Op::SwapFrontend { add: false, .. }))
            .map(phase)
            .collect();
        assert!(phases.windows(2).all(|w| w[0] < w[1]), "{phases:?}");

        ws.headers.response.set.insert("X-A".into(), "2".into());
        let ops = converge(&mut actual, &desired(&ws, std::slice::from_ref(&c)));
        let additions: Vec<String> = https_steps(&ops)
            .into_iter()
            .filter(|(add, _, alias)| *add && !alias)
            .map(|(_, path, _)| path)
            .collect();
        assert_eq!(additions, ["/api/v2", "/api", "/"]);
        assert!(plan(&actual, &desired(&ws, &[c])).is_empty(), "converged");
    }
}
