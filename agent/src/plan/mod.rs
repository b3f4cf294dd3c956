//! From the workspace to the requests sozu is sent. [`desired`] says, in sozu's vocabulary
//! ([`crate::plan::state`]), what the workspace asks sozu to hold; `plan(actual, desired)` gives
//! the requests that turn what sozu holds into that, and nothing else. Pure: no I/O,
//! deterministic order.
//!
//! Order is what keeps traffic safe: a frontend is added only after its cluster, its backends and
//! its certificate exist, and removed before them; new backends go in before stale ones go out, so
//! a cluster never drops to zero backends during a change; a certificate is replaced (sozu adds
//! the new one before removing the old) rather than removed and added.
//!
//! Error pages cannot be taken back from sozu's workers: a cluster sent again without a page
//! keeps it, and so does a listener. A page the workspace no longer names is replaced instead, by
//! the workspace's page for that status (a route's) or by a plain page of the status
//! ([`crate::plan::route_policy::plain_answer`]).
//!
//! Frontend swaps. sozu keys a frontend by its address, hostname, path rule, method and header
//! predicates: a frontend whose policy (or cluster, or HSTS) changes must be removed and added
//! again, and a request between the two would find none (a 404). sozu matches a hostname's exact spelling before a spelling
//! whose first label is a pattern (`/app/.in.example.org` for `app.in.example.org`), and passes a
//! request on when none of a spelling's rules matches its path. So a host whose frontends change
//! moves them all to its other spelling: the new ones are added first, the old ones removed
//! after, in an order that routes every request as the workspace says at each step. Towards
//! the pattern spelling, the exact spelling's frontends go least specific first (a shorter prefix
//! left there would take the requests of a longer one already moved); towards the exact
//! spelling, the new frontends come most specific first.
//!
//! Frontend order. sozu 2.3.3 holds a host's frontends in the order it was given them, and
//! where two tie for a request (the same prefix with and without a method, two regexes that
//! both match, a regex and a prefix as long as the path) it serves the later one
//! (`select_tree_rule` in sozu-lib's `router/mod.rs`). A restarted worker is given them again in
//! the order of sozu's keys for them (`ConfigState`'s map, [`Frontend::match_key`]). So the agent
//! gives them in that same order: a host whose frontends all match by prefix alone never ties
//! (the longer prefix wins) and is planned as it always was; any other host's new frontends go
//! one after the other in key order, and a new one that files before one sozu holds makes the
//! host swap spellings, which adds all of them again in order. During such a swap towards the
//! exact spelling a request may, for one step, be served by a frontend of its route's host that
//! is added before the one that wins it (docs/agent.md, "Frontends").
//!
//! Ownership: the agent changes only clusters whose id starts with [`ID_PREFIX`], frontends tagged
//! [`crate::plan::state::OWNER_TAG`], and certificates on its HTTPS listener whose names all lie in
//! the workspace zone ([`crate::plan::state::owned_certificate`]).

use std::collections::{BTreeMap, BTreeSet};

use std::net::SocketAddr;
use std::sync::Arc;

use crate::plan::route_policy::{plain_answer, ClusterPolicy};
use crate::plan::state::{
    frontends_of, owned_certificate, Actual, Backends, ClientAuthState, Desired, Frontend,
    ListenerCertificates, Protocol, StreamFrontend,
};
use crate::workspace::ID_PREFIX;

pub mod desired;
pub mod edit;
mod ops;
mod order;
pub mod route_policy;
mod shadow;
pub mod state;

pub use ops::{listener_routes, scope_of, summary, Op, Outcome, Scope};
pub use order::{depends_on, overtakes, phase};
pub use shadow::{apply, refusal};

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
            let wanted_settings = desired.listener_settings_at(address, protocol);
            let settings = || Box::new(wanted_settings.clone());
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
            if current.is_some_and(|c| c.patchable_differs(&wanted_settings, protocol)) {
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
            // listener is added): HTTP listeners only.
            let none = BTreeMap::new();
            let held = actual.listener_answers.get(&address).unwrap_or(&none);
            let wanted = match protocol {
                Protocol::Https | Protocol::Http => {
                    answers_to_hold(&desired.listener_answers, held, &BTreeMap::new())
                }
                Protocol::Tcp | Protocol::Udp => BTreeMap::new(),
            };
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
        plan_stream_frontends(actual, desired, &mut ops);
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

/// The frontends of the routes of their own port: added once their cluster and listener are
/// in, the agent's stale ones removed (sozu changes none in place), and a TCP or UDP listener
/// that no route wants any more removed with its last frontend. A listener goes only when every
/// frontend it holds is the agent's: one an operator added beside the agent's is left alone.
fn plan_stream_frontends(actual: &Actual, desired: &Desired, ops: &mut Vec<Op>) {
    for frontend in desired
        .stream_frontends
        .difference(&actual.stream_frontends)
    {
        ops.push(Op::AddStreamFrontend(frontend.clone()));
    }
    for frontend in actual
        .stream_frontends
        .difference(&desired.stream_frontends)
    {
        if frontend.is_owned() {
            ops.push(Op::RemoveStreamFrontend(frontend.clone()));
        }
    }
    for (&address, &(protocol, active)) in &actual.listeners {
        if !matches!(protocol, Protocol::Tcp | Protocol::Udp)
            || desired.listeners.contains_key(&address)
        {
            continue;
        }
        let mut on = actual
            .stream_frontends
            .iter()
            .filter(|f| f.address == address && f.protocol == protocol)
            .peekable();
        if on.peek().is_some() && on.all(StreamFrontend::is_owned) {
            if active {
                ops.push(Op::DeactivateListener { protocol, address });
            }
            ops.push(Op::RemoveListener { protocol, address });
        }
    }
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
            // A drained backend's sessions are closed, so its idle keep-alive connections go now
            // and the drain ends; not where sozu adds HSTS to the responses (see
            // `Desired::hsts_clusters`). A backend removed for another reason keeps its sessions
            // (see `Desired::drained_backends`): its WebSockets go on.
            let drained = desired.drained_backends.get(id);
            let close_sessions = !desired.hsts_clusters.contains(id);
            for backend in present.into_iter().flat_map(Backends::values) {
                if !wanted.contains_key(&backend.id) {
                    let close_sessions =
                        close_sessions && drained.is_some_and(|d| d.contains(&backend.id));
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
    type Sides<'a> = (Vec<&'a Arc<Frontend>>, Vec<&'a Arc<Frontend>>);
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
fn plan_listener_frontends(
    present: &[&Arc<Frontend>],
    wanted: &[&Arc<Frontend>],
    ops: &mut Vec<Op>,
) {
    let spelling = match present.first() {
        Some(first) if present.iter().all(|f| f.alias == first.alias) => Some(first.alias),
        Some(_) => None,
        None => Some(false),
    };
    let same = |f: &Frontend, g: &Frontend| f.same_match(g);
    // A match both hold, with another frontend in sozu than the workspace asks for.
    let changed = present.iter().any(|p| {
        wanted
            .iter()
            .any(|w| same(p, w) && p.spelled(false) != ***w)
    });
    // Whether the order sozu holds the host's frontends in can decide a request (see the
    // module, "Frontend order").
    let ordered = present
        .iter()
        .chain(wanted.iter())
        .any(|f| !f.prefix_only());
    if let (Some(alias), false) = (spelling, changed) {
        let kept: Vec<&Arc<Frontend>> = present
            .iter()
            .filter(|p| wanted.iter().any(|w| same(p, w)))
            .copied()
            .collect();
        let mut added: Vec<&Arc<Frontend>> = wanted
            .iter()
            .filter(|w| !present.iter().any(|p| same(p, w)))
            .copied()
            .collect();
        // A frontend sozu would hold after one it files after: the host's frontends are all
        // added again, in order, under the other spelling.
        let out_of_order = ordered
            && added.iter().any(|w| {
                kept.iter()
                    .any(|p| !(w.prefix_only() && p.prefix_only()) && w.match_key() < p.match_key())
            });
        if !out_of_order {
            // Routes added or removed, none changed: no swap.
            for p in present {
                if !wanted.iter().any(|w| same(p, w)) {
                    ops.push(Op::RemoveFrontend(Arc::clone(p)));
                }
            }
            if added.len() > 1 && added.iter().any(|f| !f.prefix_only()) {
                // One after the other, in sozu's order: the requests of one phase go
                // concurrently.
                added.sort_by_key(|f| f.match_key());
                for (step, w) in added.iter().enumerate() {
                    ops.push(Op::SwapFrontend {
                        frontend: Frontend::spelled_shared(w, alias),
                        add: true,
                        step: u16::try_from(step).unwrap_or(u16::MAX),
                    });
                }
            } else {
                for w in added {
                    ops.push(Op::AddFrontend(Frontend::spelled_shared(w, alias)));
                }
            }
            return;
        }
    }
    // A swap, to the other spelling; from a mixed state, to the spelling with fewest frontends
    // in the way (see `swap_target`).
    let (alias, blockers) = match spelling {
        Some(from) => (!from, Vec::new()),
        None => swap_target(present, wanted),
    };
    let mut new: Vec<Arc<Frontend>> = wanted
        .iter()
        .map(|w| Frontend::spelled_shared(w, alias))
        .filter(|w| !present.contains(&w))
        .collect();
    let mut old: Vec<Arc<Frontend>> = present
        .iter()
        .filter(|p| !new.contains(p) && !wanted.iter().any(|w| w.spelled(alias) == ****p))
        .filter(|p| !blockers.contains(p))
        .map(|p| Arc::clone(p))
        .collect();
    // What stands in the way goes first: sozu refuses a frontend under a key it holds.
    let first = u16::from(!blockers.is_empty());
    for frontend in blockers {
        ops.push(Op::SwapFrontend {
            frontend,
            add: false,
            step: 0,
        });
    }
    let specificity = |f: &Frontend| f.path.value.len();
    if ordered {
        // Added in sozu's order, each after the one before; removed from the least likely to
        // win a request to the most (see the module, "Frontend order").
        new.sort_by_key(|f| f.match_key());
        old.sort_by(|a, b| precedence(a, b));
    } else if alias {
        // The exact spelling empties least specific first.
        old.sort_by_key(|f| specificity(f));
    } else {
        // The exact spelling fills most specific first.
        new.sort_by_key(|f| std::cmp::Reverse(specificity(f)));
    }
    let steps = |list: &[Arc<Frontend>], grouped: bool| -> Vec<u16> {
        let mut steps = Vec::with_capacity(list.len());
        let mut step = 0u16;
        for (i, f) in list.iter().enumerate() {
            let next = if ordered {
                i > 0
            } else {
                grouped && i > 0 && specificity(&list[i - 1]) != specificity(f)
            };
            if next {
                step = step.saturating_add(1);
            }
            steps.push(step);
        }
        steps
    };
    let last_add = first + steps(&new, !alias).last().copied().unwrap_or(0);
    for (frontend, step) in new.iter().zip(steps(&new, !alias)) {
        ops.push(Op::SwapFrontend {
            frontend: frontend.clone(),
            add: true,
            step: first + step,
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

/// The order of a host's frontends from the least likely to win a request in sozu 2.3.3 to
/// the most (`select_tree_rule` in sozu-lib's `router/mod.rs`): those with header predicates
/// outrank those without; within each, a regex or exact rule with a method wins outright (the
/// first sozu holds, so the later key ranks lower); then a regex without a method (the last
/// sozu holds); then prefixes, a longer one above a shorter, one with a method above one
/// without.
fn precedence(a: &Frontend, b: &Frontend) -> std::cmp::Ordering {
    use crate::plan::state::PathKind;
    let class = |f: &Frontend| {
        let decisive = f.path.kind != PathKind::Prefix && f.method.is_some();
        let regex = f.path.kind != PathKind::Prefix;
        (!f.header_predicates.is_empty(), decisive, regex)
    };
    class(a).cmp(&class(b)).then_with(|| {
        let (_, decisive, regex) = class(a);
        if decisive {
            b.match_key().cmp(&a.match_key())
        } else if regex {
            a.match_key().cmp(&b.match_key())
        } else {
            (a.path.value.len(), a.method.is_some(), a.match_key()).cmp(&(
                b.path.value.len(),
                b.method.is_some(),
                b.match_key(),
            ))
        }
    })
}

/// Where a host's frontends on one listener go from a mixed state, some under each spelling:
/// a swap cut short (the agent killed between its additions and its removals) leaves one. sozu
/// keys a frontend by its spelling and path and refuses a second under the same key, so a
/// present frontend of the target spelling whose path is wanted with other settings stands in
/// the way of its successor and must go before it comes, leaving a moment in which that path is
/// served by the other spelling's frontend, if any. The spelling with fewest such blockers is
/// the target (an interrupted swap's own target has none), then the one already holding most of
/// what is wanted, then the exact one. Returns whether the target is the pattern spelling, and
/// the blockers.
fn swap_target(
    present: &[&Arc<Frontend>],
    wanted: &[&Arc<Frontend>],
) -> (bool, Vec<Arc<Frontend>>) {
    let judge = |alias: bool| {
        let blockers: Vec<Arc<Frontend>> = present
            .iter()
            .filter(|p| p.alias == alias)
            .filter(|p| {
                wanted
                    .iter()
                    .any(|w| w.same_match(p) && w.spelled(alias) != ****p)
            })
            .map(|p| Arc::clone(p))
            .collect();
        let held = wanted
            .iter()
            .filter(|w| {
                let spelled = w.spelled(alias);
                present.iter().any(|p| ***p == spelled)
            })
            .count();
        (blockers, held)
    };
    let (exact, exact_held) = judge(false);
    let (pattern, pattern_held) = judge(true);
    if (pattern.len(), std::cmp::Reverse(pattern_held))
        < (exact.len(), std::cmp::Reverse(exact_held))
    {
        (true, pattern)
    } else {
        (false, exact)
    }
}

/// The certificates of a plan. Exactly one certificate per host on the HTTPS listener: SNI
/// serves the longest-lived of several, so a stale certificate left beside a renewed one could
/// keep serving.
struct CertificatePlan<'a> {
    present: &'a ListenerCertificates,
    /// Fingerprints added or replacing another in this plan (a certificate naming two hosts
    /// goes once).
    sent: BTreeSet<Arc<str>>,
    /// Fingerprints replaced or removed in this plan.
    removed: BTreeSet<Arc<str>>,
}

impl CertificatePlan<'_> {
    fn plan_host(&mut self, desired: &Desired, host: &str, ops: &mut Vec<Op>) {
        let Some(address) = desired.https_address else {
            return;
        };
        let owned = |names: &[String]| owned_certificate(names, &desired.zone);
        if let Some(certificate) = desired.certificates().get(host) {
            let fingerprint = &certificate.fingerprint;
            let names_differ = self
                .present
                .names_of(fingerprint)
                .is_some_and(|names| names != &certificate.names);
            if names_differ && !self.sent.contains(fingerprint) {
                // Held under other names (sent by an older agent with every SAN): replaced by
                // itself under the host's name alone, which sozu 2.3.3 does in one step.
                ops.push(Op::ReplaceCertificate {
                    address,
                    old_fingerprint: Arc::clone(fingerprint),
                    certificate: certificate.clone(),
                });
                self.sent.insert(Arc::clone(fingerprint));
            } else if !self.present.contains(fingerprint) && !self.sent.contains(fingerprint) {
                // Replace one of ours when there is one, so the switch has no gap.
                let old = self.present.named(host).find(|(old, names)| {
                    owned(names) && !desired.is_wanted(old) && !self.removed.contains(*old)
                });
                match old {
                    Some((old, _)) => {
                        ops.push(Op::ReplaceCertificate {
                            address,
                            old_fingerprint: Arc::clone(old),
                            certificate: certificate.clone(),
                        });
                        self.removed.insert(Arc::clone(old));
                    }
                    None => ops.push(Op::AddCertificate {
                        address,
                        certificate: certificate.clone(),
                    }),
                }
                self.sent.insert(Arc::clone(fingerprint));
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
                    fingerprint: Arc::clone(fingerprint),
                });
                self.removed.insert(Arc::clone(fingerprint));
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests;
