//! The desired sozu state: what a workspace asks for, given the addresses its upstream names
//! resolve to and the certificates found on disk. Pure: the caller brings the DNS answers and the
//! parsed certificates.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};

use crate::state::{Backend, Certificate, Desired, Frontend, Protocol, Tags, OWNER_TAG, ROUTE_TAG};
use crate::workspace::{Upstream, Workspace};

/// A unix backend's address only names it inside its cluster (sozu tells backends apart by
/// address); each route has one unix backend at most, so one fixed identity is enough.
pub const UNIX_BACKEND_IDENTITY: SocketAddr =
    SocketAddr::new(IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 1);

/// Why a route is not (fully) in the desired state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Held {
    /// No valid certificate for the host yet: its frontends wait, so clients never get sozu's
    /// default certificate for it.
    NoCertificate,
}

/// Builds the desired state. `resolved` maps each DNS upstream name to its addresses (absent: not
/// resolved yet, so the cluster has no backends for now); `certificates` maps hosts to their
/// validated certificate. Returns the routes held back, by route id.
pub fn build(
    workspace: &Workspace,
    resolved: &BTreeMap<String, Vec<IpAddr>>,
    certificates: &BTreeMap<String, Certificate>,
) -> (Desired, BTreeMap<String, Held>) {
    let https = workspace.listeners.https;
    let http = workspace.listeners.http;
    let mut desired = Desired {
        listeners: BTreeMap::from([(https, Protocol::Https), (http, Protocol::Http)]),
        https_address: Some(https),
        zone: workspace.zone.clone(),
        ..Desired::default()
    };
    let mut held = BTreeMap::new();

    for route in &workspace.routes {
        let backends: BTreeMap<String, Backend> = match &route.upstream {
            Upstream::Dns { name, port } => resolved
                .get(name)
                .into_iter()
                .flatten()
                .map(|ip| backend(&route.id, SocketAddr::new(*ip, *port), None))
                .collect(),
            Upstream::Ip { address } => [backend(&route.id, *address, None)].into(),
            Upstream::Unix { path } => [backend(
                &route.id,
                UNIX_BACKEND_IDENTITY,
                Some(path.clone()),
            )]
            .into(),
        };
        desired.clusters.insert(route.id.clone(), backends);

        let Some(certificate) = certificates.get(&route.host) else {
            held.insert(route.id.clone(), Held::NoCertificate);
            continue;
        };
        desired
            .certificates
            .insert(route.host.clone(), certificate.clone());
        let tags: Tags = [
            (OWNER_TAG.0.to_owned(), OWNER_TAG.1.to_owned()),
            (ROUTE_TAG.to_owned(), route.id.clone()),
        ]
        .into_iter()
        .collect();
        for (protocol, address) in [(Protocol::Https, https), (Protocol::Http, http)] {
            desired.frontends.insert(Frontend {
                protocol,
                address,
                hostname: route.host.clone(),
                path_prefix: route.path_prefix.clone(),
                cluster_id: Some(route.id.clone()),
                tags: tags.clone(),
            });
        }
    }
    (desired, held)
}

fn backend(
    route_id: &str,
    address: SocketAddr,
    unix_path: Option<std::path::PathBuf>,
) -> (String, Backend) {
    let id = match &unix_path {
        Some(_) => format!("{route_id}-unix"),
        None => format!("{route_id}-{address}"),
    };
    (
        id.clone(),
        Backend {
            id,
            address,
            unix_path,
        },
    )
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
