//! When the agent says it is ready (`/readyz`), and why not. Pure: decided from the model and
//! the latest facts at each publish.
//!
//! Readiness is what a load balancer and a rollout act on, so it must not let one route hold
//! the others hostage. In the default mode ([`ReadinessMode::Serving`]) the agent is ready once
//! sozu holds the latest workspace's listeners and every route that *can* be served: a route
//! whose pair was read and refused (or is missing), or whose every upstream name failed to
//! resolve, or one of whose requests sozu refused, is reported (its status, the
//! `private_ingress_route_ok` metric and its alert) and not waited for. What is not known yet is
//! waited for in both modes: a pair not read yet, a name not looked up yet, a users file or an
//! error page not read yet (until then a route with basic auth refuses everyone). A workspace
//! with routes of which none can be served is not ready: another pod may serve some.
//!
//! With `tls_rotation = 'sozu_managed` the agent's own issuer writes the pairs, so a pair missing
//! from the tls dir is one the issuer is still getting: waited for, until the issuer gives up
//! on that host for now (a back-off, a rate limit, an issuer that cannot run), when the route is
//! reported like any other.
//!
//! [`ReadinessMode::Strict`] waits for every route, as a deployment that would rather not take
//! traffic than serve part of its routes asks for.

use std::collections::BTreeSet;
use std::sync::Arc;

use crate::document::{Readiness, ReadinessMode};

use super::model::Model;
use super::retry_policy::Refusals;
use super::route_policy_files::PolicyFilesTracker;
use super::trackers::{CertTracker, DnsTracker};

/// What the ACME issuer says of its hosts (`tls_rotation = 'sozu_managed`), as readiness needs
/// it. A trait, so that the loop knows nothing of the issuer's workings.
pub trait IssuerProgress: Send + Sync {
    /// Moves whenever [`IssuerProgress::stalled`] may answer differently.
    fn version(&self) -> u64;
    /// The hosts the issuer has given up on for now.
    fn stalled(&self) -> Stalled;
}

/// Hosts whose first pair the issuer is not getting now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stalled {
    /// The issuer cannot order at all (its account, its state directory).
    pub all: bool,
    /// Backing off after a failure, or held back by a rate limit.
    pub hosts: BTreeSet<String>,
}

impl Stalled {
    fn includes(&self, host: &str) -> bool {
        self.all || self.hosts.contains(host)
    }
}

/// The issuer's progress, for the loop to hold.
pub type SharedIssuerProgress = Arc<dyn IssuerProgress>;

/// What readiness is decided from.
pub struct Facts<'a> {
    /// The desired state of the workspace last applied; `None` before the first pass.
    pub model: Option<&'a Model>,
    /// The model is of the latest valid workspace.
    pub latest_applied: bool,
    /// Why sozu cannot be used: unreachable, or not known yet.
    pub sozu_problem: Option<&'a str>,
    pub certs: &'a CertTracker,
    pub dns: &'a DnsTracker,
    pub policy_files: &'a PolicyFilesTracker,
    pub refusals: &'a Refusals,
    /// With `tls_rotation = 'sozu_managed`: what the issuer has given up on.
    pub issuer: Option<&'a Stalled>,
    /// A bulk pass was just applied and the loop has not yet taken up what queued during it
    /// (sozu's reports of its changes): a rotation now would wait behind that.
    pub settling: bool,
}

pub fn decide(mode: ReadinessMode, facts: &Facts<'_>) -> Readiness {
    let not_ready = |reason: String, routes_not_served: usize| Readiness {
        mode,
        ready: false,
        routes_not_served,
        reason: Some(reason),
    };
    let Some(model) = facts.model else {
        return not_ready("no workspace has been applied yet".to_owned(), 0);
    };
    if let Some(problem) = facts.sozu_problem {
        return not_ready(format!("sozu: {problem}"), 0);
    }
    if !facts.latest_applied {
        return not_ready("the latest workspace is not applied yet".to_owned(), 0);
    }

    // Routes not served, each for a reason known for certain.
    let mut not_served: BTreeSet<&str> = BTreeSet::new();
    let mut waiting_for_pairs = 0usize;
    for id in model.held().keys() {
        let Some(route) = model.route_by_id(id) else {
            continue;
        };
        match facts.certs.failure(&route.host) {
            // The issuer has not written it yet, and is still getting it.
            Some((_, "unreadable"))
                if facts
                    .issuer
                    .is_some_and(|stalled| !stalled.includes(&route.host)) =>
            {
                waiting_for_pairs += 1
            }
            Some(_) => {
                not_served.insert(&route.id);
            }
            None => waiting_for_pairs += 1,
        }
    }
    let mut waiting_for_names = 0usize;
    for name in model.unresolved() {
        if facts.dns.error(name).is_none() {
            waiting_for_names += 1;
            continue;
        }
        // A route is not served when none of its upstream names resolves; strictly, when one
        // of them does not.
        for route in model.routes_of_name(name) {
            if mode == ReadinessMode::Strict
                || route
                    .upstream_names()
                    .all(|n| !facts.dns.resolved().contains_key(n))
            {
                not_served.insert(&route.id);
            }
        }
    }
    let mut refused_elsewhere = None;
    for refusal in facts.refusals.iter() {
        // The listener keeps serving with the client certificates sozu held, as it does with
        // the last good version of a file the agent refused: reported, not waited for.
        if refusal.client_auth {
            continue;
        }
        // A route port's listener sozu could not bind is its routes' problem alone.
        if !refusal.routes.is_empty() {
            not_served.extend(
                refusal
                    .routes
                    .iter()
                    .filter_map(|id| model.route_by_id(id))
                    .map(|r| r.id.as_str()),
            );
            continue;
        }
        let scope = &refusal.scope;
        if scope.everything || (scope.hosts.is_empty() && scope.clusters.is_empty()) {
            refused_elsewhere = Some(refusal.message.as_str());
            continue;
        }
        for host in &scope.hosts {
            not_served.extend(model.routes_of_host(host).map(|r| r.id.as_str()));
        }
        for id in &scope.clusters {
            not_served.extend(model.route_by_id(id).map(|r| r.id.as_str()));
        }
    }
    let count = not_served.len();

    if waiting_for_pairs > 0 {
        return not_ready(
            format!(
                "{waiting_for_pairs} route(s) wait for their certificate pair to be read or issued"
            ),
            count,
        );
    }
    if waiting_for_names > 0 {
        return not_ready(
            format!("{waiting_for_names} upstream name(s) wait for their first lookup"),
            count,
        );
    }
    let unread = model
        .policy_files()
        .iter()
        .filter(|path| !facts.policy_files.has_read(path))
        .count();
    if unread > 0 {
        return not_ready(
            format!("{unread} policy file(s) wait for their first read"),
            count,
        );
    }
    if let Some(message) = refused_elsewhere {
        return not_ready(format!("sozu refused a request: {message}"), count);
    }
    let routes = model.workspace().routes.len();
    if count > 0 && (mode == ReadinessMode::Strict || count == routes) {
        let which = if count == routes { "none" } else { "not all" };
        return not_ready(
            format!("{which} of the {routes} routes can be served ({count} not served)"),
            count,
        );
    }
    if facts.settling {
        return not_ready(
            "taking up sozu's reports of the changes just applied".to_owned(),
            count,
        );
    }
    Readiness {
        mode,
        ready: true,
        routes_not_served: count,
        reason: None,
    }
}
