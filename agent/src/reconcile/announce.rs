//! What changed between two published statuses, as events for `/v1/events`
//! ([`crate::api::events`]): a route's new certificate, a pair refused or valid again, a backend
//! up or down, a route entering or leaving `error`, readiness, sozu reached or not, the client
//! certificates and an ACME order moving. Pure: `publish` (and the issuer's watcher, wired in
//! `run`) compare the old with the new and emit what this returns, after the pass, so that
//! announcing costs a rotation nothing but a few comparisons once it is served.
//!
//! A route that appears (a start, a workspace edit) announces nothing of its own: the workspace
//! event says how many came, and a start at 10,000 routes does not flood the backlog with
//! routes becoming served. Only what a person watching would act on is announced.

use std::collections::BTreeSet;

use crate::api::Head;
use crate::document::{
    BackendHealth, EventKind, HostStatus, IssuerStatus, RouteState, RouteStatus,
};

/// An event to emit: its kind, its host, whether it is a problem, its message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Announcement {
    pub kind: EventKind,
    pub host: Option<String>,
    pub problem: bool,
    pub message: String,
}

impl Announcement {
    fn new(kind: EventKind, host: Option<&str>, problem: bool, message: String) -> Self {
        Announcement {
            kind,
            host: host.map(str::to_owned),
            problem,
            message,
        }
    }
}

fn short(fingerprint: &str) -> &str {
    fingerprint.get(..12).unwrap_or(fingerprint)
}

/// What changed of one route. `hosts_done` holds the hosts whose certificate was announced in
/// this publish: a host's routes share its pair, which is announced once.
pub fn route(
    old: &RouteStatus,
    new: &RouteStatus,
    hosts_done: &mut BTreeSet<String>,
    out: &mut Vec<Announcement>,
) {
    let host = Some(new.host.as_str());
    let (was, is) = (&old.certificate, &new.certificate);
    if !hosts_done.contains(&new.host) {
        let mut said = false;
        if is.rotations > was.rotations {
            let from = was
                .served_fingerprints
                .first()
                .map(|f| short(f).to_owned())
                .unwrap_or_else(|| "none".into());
            let to = is
                .served_fingerprints
                .first()
                .or(is.disk_fingerprint.as_ref())
                .map(|f| short(f).to_owned())
                .unwrap_or_else(|| "-".into());
            out.push(Announcement::new(
                EventKind::CertificateRotated,
                host,
                false,
                format!("now serving {to} (was {from})"),
            ));
            said = true;
        }
        match (&was.error, &is.error) {
            (old_error, Some(error)) if old_error.as_ref() != Some(error) => {
                out.push(Announcement::new(
                    EventKind::PairRefused,
                    host,
                    true,
                    format!(
                        "pair refused ({}), the last good one keeps serving: {error}",
                        is.error_reason.as_deref().unwrap_or("invalid")
                    ),
                ));
                said = true;
            }
            (Some(_), None) => {
                out.push(Announcement::new(
                    EventKind::PairAccepted,
                    host,
                    false,
                    "the pair on disk is valid again".into(),
                ));
                said = true;
            }
            _ => {}
        }
        if said {
            hosts_done.insert(new.host.clone());
        }
    }
    let health_of = |status: &RouteStatus| {
        status
            .upstreams
            .iter()
            .flat_map(|u| {
                u.backends.iter().map(move |b| {
                    (
                        b.id.clone(),
                        (b.health, u.upstream.clone(), b.address.clone()),
                    )
                })
            })
            .collect::<std::collections::BTreeMap<_, _>>()
    };
    let before = health_of(old);
    for (id, (health, upstream, address)) in health_of(new) {
        let changed = before.get(&id).is_some_and(|(h, _, _)| *h != health);
        if !changed || health == BackendHealth::Unknown {
            continue;
        }
        let (kind, problem) = match health {
            BackendHealth::Down => (EventKind::BackendDown, true),
            // `Unknown` was skipped above: nothing is said of it.
            BackendHealth::Up | BackendHealth::Unknown => (EventKind::BackendUp, false),
        };
        out.push(Announcement::new(
            kind,
            host,
            problem,
            format!(
                "backend {address} of {upstream} is {health}{}",
                route_suffix(new)
            ),
        ));
    }
    let erring = |s: &RouteStatus| s.state == RouteState::Error;
    if erring(old) != erring(new) || (erring(new) && old.last_error != new.last_error) {
        let message = match (&new.state, &new.last_error) {
            (RouteState::Error, Some(e)) => format!("route{} in error: {e}", route_suffix(new)),
            (RouteState::Error, None) => format!("route{} in error", route_suffix(new)),
            (state, _) => format!("route{} is {state} again", route_suffix(new)),
        };
        out.push(Announcement::new(
            EventKind::RouteState,
            host,
            erring(new),
            message,
        ));
    }
}

/// ` /path` (or ` exact /v2 method GET`) for a route that is not its host's root, so that two
/// routes of a host are told apart.
fn route_suffix(route: &RouteStatus) -> String {
    if route.path_prefix == "/" && route.matches.is_empty() {
        String::new()
    } else if route.matches.is_empty() {
        format!(" {}", route.path_prefix)
    } else {
        format!(" {}", route.matches)
    }
}

/// What changed of the agent as a whole: readiness, sozu, the client certificates, the
/// policy files refused.
pub fn head(old: &Head, new: &Head, out: &mut Vec<Announcement>) {
    if old.readiness.ready != new.readiness.ready {
        let message = match (&new.readiness.ready, &new.readiness.reason) {
            (true, _) => "ready".to_owned(),
            (false, Some(reason)) => format!("not ready: {reason}"),
            (false, None) => "not ready".to_owned(),
        };
        out.push(Announcement::new(
            EventKind::Readiness,
            None,
            !new.readiness.ready,
            message,
        ));
    }
    match (&old.sozu.last_error, &new.sozu.last_error) {
        (previous, Some(error)) if previous.as_ref() != Some(error) => out.push(Announcement::new(
            EventKind::Sozu,
            None,
            true,
            format!("sozu unreachable: {error}"),
        )),
        (Some(_), None) => out.push(Announcement::new(
            EventKind::Sozu,
            None,
            false,
            "sozu reached again".into(),
        )),
        _ => {}
    }
    let problems = |head: &Head| -> BTreeSet<String> {
        let Some(auth) = &head.sozu.client_auth else {
            return BTreeSet::new();
        };
        auth.ca
            .iter()
            .filter_map(|ca| Some(format!("{}: {}", ca.file, ca.problem.as_ref()?)))
            .chain(
                auth.crls
                    .iter()
                    .filter_map(|crl| Some(format!("{}: {}", crl.file, crl.problem.as_ref()?))),
            )
            .chain(
                auth.sozu_refused
                    .iter()
                    .map(|reason| format!("sozu refused the CA and CRLs: {reason}")),
            )
            .collect()
    };
    let before = problems(old);
    for problem in problems(new).difference(&before) {
        out.push(Announcement::new(
            EventKind::ClientAuth,
            None,
            true,
            format!("client certificates: {problem}; the last good version stays in force"),
        ));
    }
    traefik(old, new, out);
    let before: BTreeSet<&String> = old.sozu.policy_files_refused.iter().collect();
    for refused in &new.sozu.policy_files_refused {
        if !before.contains(refused) {
            out.push(Announcement::new(
                EventKind::WorkspaceRejected,
                None,
                true,
                format!("policy file refused (its last good version stays): {refused}"),
            ));
        }
    }
}

/// A Traefik file or endpoint whose latest read was refused, or taken again; a router newly
/// refused.
fn traefik(old: &Head, new: &Head, out: &mut Vec<Announcement>) {
    let (Some(was), Some(is)) = (&old.workspace.traefik, &new.workspace.traefik) else {
        return;
    };
    for source in &is.sources {
        let before = was.sources.iter().find(|s| s.source == source.source);
        let before_error = before.and_then(|s| s.error.as_ref());
        match (&source.error, before_error) {
            (Some(error), previous) if previous != Some(error) => out.push(Announcement::new(
                EventKind::WorkspaceRejected,
                None,
                true,
                format!(
                    "traefik {} refused ({}): {error}",
                    source.kind,
                    if source.last_good.is_some() {
                        "its last good version stays"
                    } else {
                        "nothing of it is served"
                    }
                ),
            )),
            (None, Some(_)) if source.state == "ok" => out.push(Announcement::new(
                EventKind::WorkspaceAccepted,
                None,
                false,
                format!("traefik {} {} read again", source.kind, source.source),
            )),
            _ => {}
        }
    }
    let before: BTreeSet<&String> = was.refused.iter().collect();
    for refused in &is.refused {
        if !before.contains(refused) {
            out.push(Announcement::new(
                EventKind::WorkspaceRejected,
                None,
                true,
                format!("traefik: {refused}"),
            ));
        }
    }
}

/// What moved in the ACME issuer's orders, host by host.
pub fn issuer(old: Option<&IssuerStatus>, new: &IssuerStatus, out: &mut Vec<Announcement>) {
    let empty = HostStatus::default();
    for (host, is) in &new.hosts {
        let was = old.and_then(|o| o.hosts.get(host)).unwrap_or(&empty);
        let h = Some(host.as_str());
        if is.certificates_issued > was.certificates_issued {
            let renewal = is
                .renewal_due
                .map(|t| {
                    format!(
                        "; next renewal {}{}",
                        crate::text::date_time(t),
                        is.renewal_basis
                            .map(|b| format!(" ({b})"))
                            .unwrap_or_default()
                    )
                })
                .unwrap_or_default();
            out.push(Announcement::new(
                EventKind::AcmeOrder,
                h,
                false,
                format!(
                    "certificate issued{}{renewal}",
                    is.last_order_seconds
                        .map(|s| format!(" in {s:.1} s"))
                        .unwrap_or_default()
                ),
            ));
        } else if is.state != was.state {
            let (problem, message) = match is.state.as_str() {
                "ordering" => (
                    false,
                    format!("ordering a certificate (order {})", is.orders_placed.max(1)),
                ),
                "backing_off" => (
                    true,
                    format!(
                        "order failed{}; backing off{}",
                        is.last_error
                            .as_ref()
                            .map(|e| format!(": {e}"))
                            .unwrap_or_default(),
                        is.backoff
                            .as_ref()
                            .map(|b| format!(" until {}", crate::text::date_time(b.until)))
                            .unwrap_or_default()
                    ),
                ),
                state => (false, format!("issuer state: {state}")),
            };
            out.push(Announcement::new(EventKind::AcmeOrder, h, problem, message));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::document::{BackendStatus, CertificateStatus, UpstreamStatus};

    fn route(host: &str) -> RouteStatus {
        RouteStatus {
            id: format!("pi-{host}"),
            host: host.into(),
            path_prefix: "/".into(),
            state: RouteState::Ok,
            certificate: CertificateStatus {
                served_fingerprints: vec!["aa".repeat(32).into()],
                ..CertificateStatus::default()
            },
            upstreams: vec![UpstreamStatus {
                upstream: "10.0.0.1:80".into(),
                weight: 1,
                state: "in rotation".into(),
                backends: vec![BackendStatus {
                    id: "b1".into(),
                    address: "10.0.0.1:80".into(),
                    health: BackendHealth::Up,
                    transitions: 0,
                }],
                ..UpstreamStatus::default()
            }],
            ..RouteStatus::default()
        }
    }

    fn announced(old: &RouteStatus, new: &RouteStatus) -> Vec<Announcement> {
        let mut out = Vec::new();
        super::route(old, new, &mut BTreeSet::new(), &mut out);
        out
    }

    #[test]
    fn a_rotation_names_both_fingerprints_and_its_host() {
        let old = route("a.in.example.org");
        let mut new = old.clone();
        new.certificate.rotations = 1;
        new.certificate.served_fingerprints = vec!["bb".repeat(32).into()];
        let out = announced(&old, &new);
        assert_eq!(out.len(), 1, "{out:?}");
        assert_eq!(out[0].kind, EventKind::CertificateRotated);
        assert_eq!(out[0].host.as_deref(), Some("a.in.example.org"));
        assert_eq!(
            out[0].message,
            "now serving bbbbbbbbbbbb (was aaaaaaaaaaaa)"
        );
        // Nothing changed, nothing said.
        assert!(announced(&new, &new).is_empty());
    }

    #[test]
    fn a_refused_pair_a_backend_down_and_the_route_in_error_are_problems() {
        let old = route("a.in.example.org");
        let mut new = old.clone();
        new.certificate.error = Some("tls.crt: expired".into());
        new.certificate.error_reason = Some("expired".into());
        new.upstreams[0].backends[0].health = BackendHealth::Down;
        new.state = RouteState::Error;
        new.last_error = Some("tls.crt: expired".into());
        let out = announced(&old, &new);
        let kinds: Vec<EventKind> = out.iter().map(|a| a.kind).collect();
        assert_eq!(
            kinds,
            [
                EventKind::PairRefused,
                EventKind::BackendDown,
                EventKind::RouteState
            ]
        );
        assert!(out.iter().all(|a| a.problem));
        assert!(out[0].message.contains("(expired)"), "{}", out[0].message);
        // And back: valid again, up, ok again; none a problem.
        let back = announced(&new, &old);
        let kinds: Vec<EventKind> = back.iter().map(|a| a.kind).collect();
        assert_eq!(
            kinds,
            [
                EventKind::PairAccepted,
                EventKind::BackendUp,
                EventKind::RouteState
            ]
        );
        assert!(back.iter().all(|a| !a.problem));
    }

    #[test]
    fn a_hosts_pair_is_announced_once_for_all_its_routes() {
        let old = route("a.in.example.org");
        let mut new = old.clone();
        new.certificate.rotations = 1;
        let mut other_old = old.clone();
        other_old.path_prefix = "/api".into();
        let mut other_new = new.clone();
        other_new.path_prefix = "/api".into();
        let (mut done, mut out) = (BTreeSet::new(), Vec::new());
        super::route(&old, &new, &mut done, &mut out);
        super::route(&other_old, &other_new, &mut done, &mut out);
        assert_eq!(out.len(), 1, "{out:?}");
    }

    #[test]
    fn an_order_issued_and_a_back_off_are_announced_per_host() {
        let mut old = IssuerStatus::default();
        old.hosts.insert(
            "a.in.example.org".into(),
            HostStatus {
                state: "ordering".into(),
                orders_placed: 1,
                ..HostStatus::default()
            },
        );
        let mut new = old.clone();
        if let Some(h) = new.hosts.get_mut("a.in.example.org") {
            h.state = "valid".into();
            h.certificates_issued = 1;
            h.last_order_seconds = Some(2.5);
        }
        new.hosts.insert(
            "b.in.example.org".into(),
            HostStatus {
                state: "backing_off".into(),
                last_error: Some("rate limited".into()),
                ..HostStatus::default()
            },
        );
        let mut out = Vec::new();
        issuer(Some(&old), &new, &mut out);
        assert_eq!(out.len(), 2, "{out:?}");
        assert_eq!(out[0].message, "certificate issued in 2.5 s");
        assert!(!out[0].problem);
        assert_eq!(out[1].host.as_deref(), Some("b.in.example.org"));
        assert!(
            out[1].problem && out[1].message.contains("rate limited"),
            "{out:?}"
        );
    }
}
