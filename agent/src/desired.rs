//! The one mapping from a workspace to sozu's state: listeners, one cluster per route with its
//! backends, an HTTPS frontend and an HTTP frontend (redirecting) per route, and the hosts'
//! certificates. Both the live agent and `render --format sozu-toml` start from [`routes`], so a
//! route field is mapped once, whichever way it reaches sozu.
//!
//! Pure: the caller brings the DNS answers and the validated certificates.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};

use crate::plan;
use crate::state::{
    Actual, Address, Backend, Certificate, Desired, Frontend, Protocol, Tags, OWNER_TAG, ROUTE_TAG,
};
use crate::workspace::{Route, Upstream, Workspace};

/// How a route's DNS upstream becomes backends.
#[derive(Clone, Copy)]
pub enum Names<'a> {
    /// One backend per address the name resolved to; none while it has never resolved.
    Resolved(&'a BTreeMap<String, Vec<IpAddr>>),
    /// One backend naming the host and port as written, for a configuration file that sozu
    /// resolves itself when it loads it.
    AsWritten,
}

/// Why a route is not (fully) in the desired state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Held {
    /// No valid certificate for the host yet: its frontends wait, so clients never get sozu's
    /// default certificate for it.
    NoCertificate,
}

/// Everything the workspace routes, every route with its frontends: listeners, clusters and
/// their backends, frontends. No certificates: the live path attaches the validated ones
/// ([`build`]); a rendered file names the files sozu loads.
pub fn routes(workspace: &Workspace, names: Names<'_>) -> Desired {
    let https = workspace.listeners.https;
    let http = workspace.listeners.http;
    let mut desired = Desired {
        listeners: BTreeMap::from([(https, Protocol::Https), (http, Protocol::Http)]),
        https_address: Some(https),
        zone: workspace.zone.clone(),
        ..Desired::default()
    };
    for route in &workspace.routes {
        desired
            .clusters
            .insert(route.id.clone(), backends(route, names));
        desired.frontends.extend(frontends(route, https, http));
    }
    desired
}

/// The live desired state: [`routes`] with the resolved addresses, each host's validated
/// certificate, and the frontends of hosts without one held back. Returns the routes held back,
/// by route id.
pub fn build(
    workspace: &Workspace,
    resolved: &BTreeMap<String, Vec<IpAddr>>,
    certificates: &BTreeMap<String, Certificate>,
) -> (Desired, BTreeMap<String, Held>) {
    let mut desired = routes(workspace, Names::Resolved(resolved));
    let mut held = BTreeMap::new();
    for route in &workspace.routes {
        match certificates.get(&route.host) {
            Some(certificate) => {
                desired
                    .certificates
                    .insert(route.host.clone(), certificate.clone());
            }
            None => {
                held.insert(route.id.clone(), Held::NoCertificate);
            }
        }
    }
    desired
        .frontends
        .retain(|f| certificates.contains_key(&f.hostname));
    (desired, held)
}

/// Keeps what sozu already holds for the routes whose facts the agent does not have yet, instead
/// of tearing it down: the backends of a route whose DNS name has not resolved yet, and the
/// certificate (with the route's frontends) of a host without a validated pair. A restarted
/// agent finds a serving sozu, and its first pass comes before its first lookups and reads.
/// Once the fact arrives, the route follows it like any other.
pub fn adopt(
    desired: &mut Desired,
    held: &mut BTreeMap<String, Held>,
    workspace: &Workspace,
    actual: &Actual,
) {
    for route in &workspace.routes {
        if !matches!(route.upstream, Upstream::Dns { .. }) {
            continue;
        }
        let unresolved = desired
            .clusters
            .get(&route.id)
            .is_some_and(BTreeMap::is_empty);
        if let Some(present) = actual.backends.get(&route.id).filter(|_| unresolved) {
            desired.clusters.insert(route.id.clone(), present.clone());
        }
    }
    let Some(https) = desired.https_address else {
        return;
    };
    let Some(present) = actual.certificates.get(&https) else {
        return;
    };
    let by_name = present.by_name();
    for route in &workspace.routes {
        if held.get(&route.id) != Some(&Held::NoCertificate) {
            continue;
        }
        let kept = by_name
            .named(&route.host)
            .find(|(_, names)| plan::owned_certificate(names, &desired.zone));
        if let Some((fingerprint, _)) = kept {
            desired.kept_certificates.insert(fingerprint.to_owned());
            desired
                .frontends
                .extend(frontends(route, https, workspace.listeners.http));
            held.remove(&route.id);
        }
    }
}

/// A route's frontends: HTTPS (hostname + path prefix) and HTTP, which the cluster's
/// `https_redirect` turns into a redirect. Tagged so the agent knows its own.
fn frontends(route: &Route, https: SocketAddr, http: SocketAddr) -> [Frontend; 2] {
    let tags: Tags = [
        (OWNER_TAG.0.to_owned(), OWNER_TAG.1.to_owned()),
        (ROUTE_TAG.to_owned(), route.id.clone()),
    ]
    .into_iter()
    .collect();
    [(Protocol::Https, https), (Protocol::Http, http)].map(|(protocol, address)| Frontend {
        protocol,
        address,
        hostname: route.host.clone(),
        path_prefix: route.path_prefix.clone(),
        cluster_id: Some(route.id.clone()),
        tags: tags.clone(),
    })
}

/// A route's backends by id. A backend's id is its route's id and its address, so a changed
/// address is a new backend added before the old one goes.
fn backends(route: &Route, names: Names<'_>) -> BTreeMap<String, Backend> {
    let addresses: Vec<Address> = match (&route.upstream, names) {
        (Upstream::Dns { name, port }, Names::Resolved(resolved)) => resolved
            .get(name)
            .into_iter()
            .flatten()
            .map(|ip| Address::Ip(SocketAddr::new(*ip, *port)))
            .collect(),
        (Upstream::Dns { name, port }, Names::AsWritten) => vec![Address::Name {
            name: name.clone(),
            port: *port,
        }],
        (Upstream::Ip { address }, _) => vec![Address::Ip(*address)],
        (Upstream::Unix { path }, _) => vec![Address::Unix(path.clone())],
    };
    addresses
        .into_iter()
        .map(|address| {
            let id = match &address {
                Address::Unix(_) => format!("{}-unix", route.id),
                other => format!("{}-{other}", route.id),
            };
            (id.clone(), Backend { id, address })
        })
        .collect()
}

/// The DNS names among the workspace's upstreams, each once.
pub fn upstream_names(workspace: &Workspace) -> BTreeSet<String> {
    workspace
        .routes
        .iter()
        .filter_map(|r| match &r.upstream {
            Upstream::Dns { name, .. } => Some(name.clone()),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(host: &str, upstream: Upstream) -> Route {
        Route {
            id: crate::workspace::route_id(host, "/"),
            host: host.into(),
            path_prefix: "/".into(),
            upstream,
        }
    }

    #[test]
    fn a_dns_upstream_is_one_backend_per_address_live_and_its_name_in_a_file() {
        let ws = crate::workspace::test_workspace(
            std::path::Path::new("/tls"),
            vec![route(
                "a.in.example.org",
                Upstream::Dns {
                    name: "svc.ns".into(),
                    port: 80,
                },
            )],
        );
        let resolved = BTreeMap::from([(
            "svc.ns".to_owned(),
            vec!["10.0.0.1".parse().unwrap(), "fd00::1".parse().unwrap()],
        )]);
        let live = routes(&ws, Names::Resolved(&resolved));
        let ids: Vec<&String> = live.clusters["pi-a.in.example.org"].keys().collect();
        assert_eq!(
            ids,
            [
                "pi-a.in.example.org-10.0.0.1:80",
                "pi-a.in.example.org-[fd00::1]:80"
            ]
        );
        let file = routes(&ws, Names::AsWritten);
        let addresses: Vec<String> = file.clusters["pi-a.in.example.org"]
            .values()
            .map(|b| b.address.to_string())
            .collect();
        assert_eq!(addresses, ["svc.ns:80"]);
        assert_eq!(
            live.frontends, file.frontends,
            "the same frontends either way"
        );
        let unresolved = routes(&ws, Names::Resolved(&BTreeMap::new()));
        assert!(unresolved.clusters["pi-a.in.example.org"].is_empty());
    }
}
