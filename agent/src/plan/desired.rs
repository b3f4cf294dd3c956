//! The one mapping from a workspace to sozu's state: listeners, one cluster per route with its
//! backends, an HTTPS frontend and an HTTP frontend (redirecting) per route, and the hosts'
//! certificates. Both the live agent and `render --format sozu-toml` start from [`routes`], so a
//! route field is mapped once, whichever way it reaches sozu. The live state is built whole
//! ([`build`]) and then kept up to date one host ([`host`]) or one route's cluster ([`cluster`])
//! at a time, by the same functions: a new pair, a DNS answer, or an edit of some routes.
//!
//! What the agent does not know yet, it keeps: a restarted agent finds a serving sozu, and its
//! first pass comes before its first reads and lookups. So a route whose DNS name has not
//! resolved yet keeps the backends sozu has for it, and a host without a validated pair keeps
//! the agent's certificate sozu serves for it, with its frontends. Once the fact arrives, the
//! route follows it like any other.
//!
//! Pure: the caller brings the DNS answers, the validated certificates and sozu's state.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};

use crate::plan::route_policy::{ClusterPolicy, FrontendPolicy, HeaderEdit};
use crate::plan::state::{
    frontends_of, owned_certificate, Actual, Address, Backend, Backends, Certificate, Desired,
    Frontend, Protocol, StreamFrontend, Tags, OWNER_TAG, ROUTE_TAG,
};
use crate::plan::state::{ClientAuthState, ListenerSettings};
use crate::workspace::{
    ClientAuthMode, HeaderPolicy, HttpRoute, ListenerPolicy, Route, RouteKind, RoutePolicy,
    TlsVersion, Upstream, UpstreamProtocol, Workspace,
};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What the files route policies name held when last read good: basic-auth users (their
/// `user:hash` lines) and error pages (whole HTTP responses, as sozu is sent them), by path. A
/// file not read good yet contributes nothing: a route with basic auth and no users refuses
/// every request. A rendered configuration file holds the pages and never the users (sozu's
/// file would hold them in clear).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PolicyFiles {
    pub users: BTreeMap<PathBuf, Arc<[String]>>,
    pub pages: BTreeMap<PathBuf, Arc<str>>,
}

/// The listeners' settings the workspace asks for.
fn listener_settings(policy: &ListenerPolicy) -> ListenerSettings {
    let t = policy.timeouts;
    ListenerSettings {
        interface: policy.interface.clone(),
        tls13_only: policy.min_tls_version == TlsVersion::V1_3,
        expect_proxy: policy.expect_proxy,
        timeouts: [t.front, t.back, t.connect, t.request],
        // The mode only: the CA's and CRLs' contents come from their files, through the
        // client-auth source (see `Desired::client_auth_known`).
        client_auth: (policy.client_auth.mode != ClientAuthMode::Off).then(|| ClientAuthState {
            required: policy.client_auth.mode == ClientAuthMode::Required,
            ..ClientAuthState::default()
        }),
        http2: policy.http2,
        // Per UDP listener, from its route: `Desired::listener_settings_at`.
        max_datagram_size: 0,
    }
}

/// How a route's DNS upstream becomes backends.
#[derive(Clone, Copy)]
pub enum DnsUpstreams<'a> {
    /// One backend per address the name resolved to; none while it has never resolved.
    Resolved(&'a BTreeMap<String, Vec<IpAddr>>),
    /// One backend naming the host and port as written, for a configuration file that sozu
    /// resolves itself when it loads it.
    AsWritten,
}

/// Why a route is not (fully) in the desired state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeldBack {
    /// No valid certificate for the host yet: its frontends wait, so clients never get sozu's
    /// default certificate for it.
    NoCertificate,
}

/// Everything the workspace routes, every route with its frontends: listeners, clusters and
/// their backends, frontends. No certificates: the live path attaches the validated ones
/// ([`build`]); a rendered file names the files sozu loads.
pub fn routes(workspace: &Workspace, names: DnsUpstreams<'_>) -> Desired {
    let https = workspace.listeners.https;
    let http = workspace.listeners.http;
    let mut desired = Desired::default();
    desired.listeners = BTreeMap::from([(https, Protocol::Https), (http, Protocol::Http)]);
    desired.https_address = Some(https);
    desired.zone = workspace.zone.clone();
    desired.hsts = workspace.hsts;
    desired.listener_settings = listener_settings(&workspace.listener_policy);
    desired.client_auth_known = desired.listener_settings.client_auth.is_none();
    for route in &workspace.routes {
        desired
            .clusters
            .insert(route.id.clone(), backends(route, names));
        mark_drained(&mut desired, route, names);
        if let Some(check) = &route.health {
            desired
                .health_checks
                .insert(route.id.clone(), check.clone());
        }
        mark_hsts(&mut desired, route);
        let ip = https.ip();
        match &route.kind {
            RouteKind::Http(kind) => desired
                .frontends
                .extend(frontends(route, kind, &workspace.headers, https, http).map(Arc::new)),
            RouteKind::Tcp(stream) => {
                let address = SocketAddr::new(ip, stream.listen_port);
                stream_frontend(&mut desired, route, Protocol::Tcp, address, None);
            }
            RouteKind::TlsPassthrough(stream) => {
                let address = SocketAddr::new(ip, stream.listen_port);
                let sni = Some(route.host.clone());
                stream_frontend(&mut desired, route, Protocol::Tcp, address, sni);
            }
            RouteKind::Udp(udp) => {
                let address = SocketAddr::new(ip, udp.listen_port);
                stream_frontend(&mut desired, route, Protocol::Udp, address, None);
                if let Some(size) = udp.max_datagram_size {
                    desired.datagram_sizes.insert(address, size);
                }
            }
        }
    }
    desired
}

/// The frontend of a route of its own port, and its listener: at the https listener's address
/// and the route's port, taking every connection, or for TLS passed through (`sni`), those
/// whose ClientHello names the route's host.
fn stream_frontend(
    desired: &mut Desired,
    route: &Route,
    protocol: Protocol,
    address: SocketAddr,
    sni: Option<String>,
) {
    desired.listeners.insert(address, protocol);
    desired.stream_frontends.insert(StreamFrontend {
        protocol,
        address,
        sni,
        cluster_id: route.id.clone(),
        tags: route_tags(route),
    });
}

/// The tags of a route's frontends: the agent's mark and the route's id.
fn route_tags(route: &Route) -> Tags {
    [
        (OWNER_TAG.0.to_owned(), OWNER_TAG.1.to_owned()),
        (ROUTE_TAG.to_owned(), route.id.clone()),
    ]
    .into_iter()
    .collect()
}

/// Sets the clusters' and the listeners' policies: each route's credentials, limits and error
/// pages, and the workspace's error pages.
pub fn policies(desired: &mut Desired, workspace: &Workspace, files: &PolicyFiles) {
    desired.cluster_policies.clear();
    for route in &workspace.routes {
        let policy = cluster_policy(route, files);
        if !policy.is_empty() {
            desired
                .cluster_policies
                .insert(route.id.clone(), Arc::new(policy));
        }
    }
    desired.listener_answers = answers(&workspace.error_pages, files);
}

/// A route's cluster policy.
pub fn cluster_policy(route: &Route, files: &PolicyFiles) -> ClusterPolicy {
    // Each field of a route's policy goes to the cluster or to the frontend
    // ([`frontend_policy`]): a new one fails to compile until it is placed.
    let RoutePolicy {
        basic_auth,
        // Read through `route.limits()`, which every kind has (below).
        limits: _,
        error_pages,
        redirect: _,
        rewrite: _,
        headers: _,
    } = route.policy();
    let mut cluster = ClusterPolicy::default();
    if let Some(auth) = basic_auth {
        if let Some(users) = files.users.get(&auth.users_file) {
            cluster.authorized_hashes = users.to_vec();
        }
        cluster.www_authenticate = Some(format!("Basic realm=\"{}\"", auth.realm));
    }
    // On every kind: sozu 2.3.3 applies a cluster's limits to HTTP requests (a 429), to TCP
    // connections (closed: `TcpSession::connect_to_backend`, lib/src/tcp.rs) and to UDP flows
    // (a new flow dropped: `UdpProxy::cluster_config_for`, lib/src/udp.rs). Only HTTP has an
    // answer to carry `Retry-After`.
    if let Some(limits) = route.limits() {
        cluster.max_connections_per_ip = limits.connections_per_ip;
        cluster.max_connections_per_subnet = limits.connections_per_subnet;
        cluster.retry_after = match &route.kind {
            RouteKind::Http(_) => Some(limits.retry_after),
            RouteKind::Tcp(_) | RouteKind::TlsPassthrough(_) | RouteKind::Udp(_) => None,
        };
    }
    cluster.answers = answers(error_pages, files);
    cluster.proxy_protocol = match &route.kind {
        RouteKind::Tcp(stream) | RouteKind::TlsPassthrough(stream) => stream.proxy_protocol,
        RouteKind::Http(_) | RouteKind::Udp(_) => false,
    };
    cluster.http2 = route.upstream_protocol() == UpstreamProtocol::H2c;
    cluster.sticky_session = match &route.kind {
        RouteKind::Http(http) => http.sticky,
        RouteKind::Tcp(_) | RouteKind::TlsPassthrough(_) | RouteKind::Udp(_) => false,
    };
    cluster.load_balancing = route.balancing;
    cluster
}

/// Error pages by status, as sozu is given them.
fn answers(pages: &BTreeMap<u16, PathBuf>, files: &PolicyFiles) -> BTreeMap<String, Arc<str>> {
    pages
        .iter()
        .filter_map(|(status, path)| Some((status.to_string(), files.pages.get(path)?.clone())))
        .collect()
}

/// Every file the workspace's policies name: users files, then pages.
pub fn policy_file_paths(workspace: &Workspace) -> (Vec<&Path>, Vec<&Path>) {
    let mut users = Vec::new();
    let mut pages: Vec<&Path> = workspace
        .error_pages
        .values()
        .map(PathBuf::as_path)
        .collect();
    for route in &workspace.routes {
        let policy = route.policy();
        if let Some(auth) = &policy.basic_auth {
            users.push(auth.users_file.as_path());
        }
        pages.extend(policy.error_pages.values().map(PathBuf::as_path));
    }
    users.sort();
    users.dedup();
    pages.sort();
    pages.dedup();
    (users, pages)
}

/// What a route's HTTPS frontend does besides routing: the workspace's header edits, then the
/// route's, its redirect, rewrites, and credentials; `None` when nothing.
fn frontend_policy(route: &Route, workspace_headers: &HeaderPolicy) -> Option<Arc<FrontendPolicy>> {
    // The frontend's share of the route's policy; the rest is the cluster's
    // ([`cluster_policy`]). Credentials are in both: the frontend requires them, the cluster
    // holds them.
    let RoutePolicy {
        redirect,
        rewrite,
        headers,
        basic_auth,
        limits: _,
        error_pages: _,
    } = route.policy();
    let headers = workspace_headers.then(headers);
    let mut edits = Vec::new();
    for (response, side) in [(false, &headers.request), (true, &headers.response)] {
        let remove = |name: &String| HeaderEdit {
            response,
            name: name.clone(),
            value: String::new(),
        };
        edits.extend(side.remove.iter().map(remove));
        // sozu appends an edit with a value beside any header of that name the message already
        // holds; a `set` replaces, so it is sent as the removal of the name, then the value
        // (sozu removes before it adds, whatever the order of the edits).
        for (name, value) in &side.set {
            edits.push(remove(name));
            edits.push(HeaderEdit {
                response,
                name: name.clone(),
                value: value.clone(),
            });
        }
    }
    // sozu builds a redirect's `Location` from the frontend's rewrites.
    let (rewrite_host, rewrite_path, rewrite_port) = match redirect {
        Some(r) => (r.host.clone(), r.path.clone(), r.port),
        None => (None, rewrite.path.clone(), None),
    };
    let frontend = FrontendPolicy {
        redirect: redirect.as_ref().map(|r| (r.status, r.scheme)),
        rewrite_host,
        rewrite_path,
        rewrite_port,
        headers: edits,
        required_auth: basic_auth.is_some(),
    };
    (!frontend.is_empty()).then(|| Arc::new(frontend))
}

/// The live desired state: [`routes`] with the resolved addresses, each host's validated
/// certificate, and the frontends of hosts without one held back; with `actual`, what sozu
/// already serves for the routes whose facts are not known yet is kept ([`host`], [`cluster`]).
/// Returns the routes held back, by route id.
pub fn build(
    workspace: &Workspace,
    resolved: &BTreeMap<String, Vec<IpAddr>>,
    certificates: &BTreeMap<String, Certificate>,
    files: &PolicyFiles,
    actual: Option<&Actual>,
) -> (Desired, BTreeMap<String, HeldBack>) {
    let mut desired = routes(workspace, DnsUpstreams::Resolved(resolved));
    policies(&mut desired, workspace, files);
    let mut held = BTreeMap::new();
    if let Some(actual) = actual {
        for route in &workspace.routes {
            cluster(&mut desired, route, resolved, Some(actual));
        }
    }
    let mut by_host: BTreeMap<&str, Vec<&Route>> = BTreeMap::new();
    for route in workspace.routes.iter().filter(|r| r.terminates_tls()) {
        by_host.entry(&route.host).or_default().push(route);
    }
    for (name, routes) in by_host {
        let certificate = certificates.get(name);
        host(
            &mut desired,
            &mut held,
            name,
            &routes,
            workspace,
            certificate,
            actual,
        );
    }
    (desired, held)
}

/// Sets what `host` serves: its certificate and its routes' frontends. Without a validated
/// certificate, the routes' frontends wait (clients would otherwise get sozu's default
/// certificate), unless sozu already serves one of the agent's for the host: a restarted agent
/// keeps it until the host's pair is read (see the module).
pub fn host(
    desired: &mut Desired,
    held: &mut BTreeMap<String, HeldBack>,
    name: &str,
    routes: &[&Route],
    workspace: &Workspace,
    certificate: Option<&Certificate>,
    actual: Option<&Actual>,
) {
    let (listeners, headers) = (workspace.listeners, &workspace.headers);
    let kept = || {
        let https = desired.https_address?;
        actual?
            .certificates
            .get(&https)?
            .named(name)
            .find(|(_, names)| owned_certificate(names, &desired.zone))
            .map(|(fingerprint, _)| Arc::clone(fingerprint))
    };
    // sozu's certificate is looked up only for a host without a validated pair of its own.
    let served = match certificate {
        Some(certificate) => {
            desired.set_certificate(name, certificate.clone());
            true
        }
        None => match kept() {
            Some(fingerprint) => {
                desired.keep_certificate(name, &fingerprint);
                true
            }
            None => {
                desired.clear_certificate(name);
                false
            }
        },
    };
    for route in routes {
        let kind = match &route.kind {
            RouteKind::Http(kind) => kind,
            // Routes of their own port hold no certificate: `build` hands `host` none of them.
            RouteKind::Tcp(_) | RouteKind::TlsPassthrough(_) | RouteKind::Udp(_) => continue,
        };
        let [https, http] =
            frontends(route, kind, headers, listeners.https, listeners.http).map(Arc::new);
        if served {
            held.remove(&route.id);
            desired.frontends.insert(https);
            desired.frontends.insert(http);
        } else {
            held.insert(route.id.clone(), HeldBack::NoCertificate);
            desired.frontends.remove(&https);
            desired.frontends.remove(&http);
        }
    }
}

/// Sets a route's cluster, its backends from what its upstreams resolve to, and its health
/// check. A route whose upstreams in rotation are all DNS names that have not resolved yet
/// keeps the backends sozu already has for the cluster, if any (see the module).
pub fn cluster(
    desired: &mut Desired,
    route: &Route,
    resolved: &BTreeMap<String, Vec<IpAddr>>,
    actual: Option<&Actual>,
) {
    let mut wanted = backends(route, DnsUpstreams::Resolved(resolved));
    let in_rotation = || route.upstreams.iter().filter(|u| !u.drain);
    let all_names = in_rotation().next().is_some()
        && in_rotation().all(|u| matches!(u.upstream, Upstream::Dns { .. }));
    if wanted.is_empty() && all_names {
        if let Some(present) = actual.and_then(|a| a.backends.get(&route.id)) {
            wanted = present.clone();
        }
    }
    desired.clusters.insert(route.id.clone(), wanted);
    mark_drained(desired, route, DnsUpstreams::Resolved(resolved));
    match &route.health {
        Some(check) => {
            desired
                .health_checks
                .insert(route.id.clone(), check.clone());
        }
        None => {
            desired.health_checks.remove(&route.id);
        }
    }
    mark_hsts(desired, route);
}

/// Removes cluster `id` from the desired state, with everything kept by cluster (its health
/// check, policy, HSTS mark and drained backends): its route left the workspace.
pub fn forget_cluster(desired: &mut Desired, id: &str) {
    desired.clusters.remove(id);
    desired.health_checks.remove(id);
    desired.cluster_policies.remove(id);
    desired.hsts_clusters.remove(id);
    desired.drained_backends.remove(id);
}

/// Removes every HTTP and HTTPS frontend of `host` from the desired state, before [`host`]
/// sets those of its routes as the workspace has them now.
pub fn forget_frontends(desired: &mut Desired, host: &str) {
    let stale: Vec<Arc<Frontend>> = frontends_of(&desired.frontends, host).cloned().collect();
    for frontend in &stale {
        desired.frontends.remove(frontend);
    }
}

/// Notes the backends of an HTTP route's drained upstreams (see [`Desired::drained_backends`]).
///
/// A route of its own port notes none: its drained backends leave the cluster (no new
/// connection goes to them) and their sessions go on until they close, as the contract says.
/// sozu's `CloseSessions` closes a TCP session at once whatever it is doing
/// (`Server::close_sessions`, `lib/src/server.rs`: a TCP session is always ready to shut
/// down), which would cut an SSH session or a database's connections on a drain.
fn mark_drained(desired: &mut Desired, route: &Route, names: DnsUpstreams<'_>) {
    let closes_sessions = match &route.kind {
        RouteKind::Http(_) => true,
        RouteKind::Tcp(_) | RouteKind::TlsPassthrough(_) | RouteKind::Udp(_) => false,
    };
    let drained: BTreeSet<String> = route
        .upstreams
        .iter()
        .filter(|u| u.drain && closes_sessions)
        .flat_map(|u| addresses(&u.upstream, names))
        .map(|address| backend_id(&route.id, &address))
        .collect();
    if drained.is_empty() {
        desired.drained_backends.remove(&route.id);
    } else {
        desired.drained_backends.insert(route.id.clone(), drained);
    }
}

/// Notes whether sozu adds an HSTS header to the route's responses: its own policy, else the
/// listener's (see [`Desired::hsts_clusters`]).
fn mark_hsts(desired: &mut Desired, route: &Route) {
    let hsts = match &route.kind {
        RouteKind::Http(http) => http.hsts.or(desired.hsts),
        // sozu sends these no HTTP response of its own.
        RouteKind::Tcp(_) | RouteKind::TlsPassthrough(_) | RouteKind::Udp(_) => None,
    };
    if hsts.is_some_and(|h| h.enabled) {
        desired.hsts_clusters.insert(route.id.clone());
    } else {
        desired.hsts_clusters.remove(&route.id);
    }
}

/// A route's frontends: HTTPS (hostname, path rule, method, header predicates) and HTTP, which the cluster's
/// `https_redirect` turns into a redirect. Tagged so the agent knows its own.
fn frontends(
    route: &Route,
    kind: &HttpRoute,
    headers: &HeaderPolicy,
    https: SocketAddr,
    http: SocketAddr,
) -> [Frontend; 2] {
    let policy = frontend_policy(route, headers);
    let tags = route_tags(route);
    let frontend = |protocol, address| Frontend {
        protocol,
        address,
        hostname: route.host.clone(),
        path: kind.path.rule(),
        method: kind.method.clone(),
        header_predicates: kind.match_headers.clone(),
        cluster_id: Some(route.id.clone()),
        tags: tags.clone(),
        hsts: None,
        policy: None,
        alias: false,
    };
    [
        Frontend {
            hsts: kind.hsts,
            policy,
            ..frontend(Protocol::Https, https)
        },
        // The HTTP frontend redirects to HTTPS (the cluster's `https_redirect`), where the
        // route's policy applies; HSTS is for HTTPS responses only (RFC 6797 §7.2): sozu
        // refuses it on HTTP.
        frontend(Protocol::Http, http),
    ]
}

/// A route's backends by id: those of its upstreams in rotation (a drained upstream has none),
/// each with its upstream's weight. A backend's id is its route's id and its address, so a
/// changed address is a new backend added before the old one goes; an address two upstreams
/// share is one backend, with the first one's weight.
pub fn backends(route: &Route, names: DnsUpstreams<'_>) -> Backends {
    let mut backends = Backends::default();
    for upstream in route.upstreams.iter().filter(|u| !u.drain) {
        for address in addresses(&upstream.upstream, names) {
            let id = backend_id(&route.id, &address);
            // The first upstream to name an address gives its weight.
            if !backends.contains_key(&id) {
                backends.insert(Backend {
                    id,
                    address,
                    weight: upstream.weight,
                });
            }
        }
    }
    backends
}

/// The addresses an upstream stands for.
pub fn addresses(upstream: &Upstream, names: DnsUpstreams<'_>) -> Vec<Address> {
    match (upstream, names) {
        (Upstream::Dns { name, port }, DnsUpstreams::Resolved(resolved)) => resolved
            .get(name)
            .into_iter()
            .flatten()
            .map(|ip| Address::Ip(SocketAddr::new(*ip, *port)))
            .collect(),
        (Upstream::Dns { name, port }, DnsUpstreams::AsWritten) => vec![Address::Name {
            name: name.clone(),
            port: *port,
        }],
        (Upstream::Ip { address }, _) => vec![Address::Ip(*address)],
        (Upstream::Unix { path }, _) => vec![Address::Unix(path.clone())],
    }
}

/// The id of the backend at `address` in cluster `cluster_id`.
pub fn backend_id(cluster_id: &str, address: &Address) -> String {
    match address {
        Address::Unix(_) => format!("{cluster_id}-unix"),
        other => format!("{cluster_id}-{other}"),
    }
}

/// The DNS names among the workspace's upstreams, each once.
pub fn upstream_names(workspace: &Workspace) -> BTreeSet<String> {
    workspace
        .routes
        .iter()
        .flat_map(Route::upstream_names)
        .map(str::to_owned)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::workspace::test_route as route;

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
        let live = routes(&ws, DnsUpstreams::Resolved(&resolved));
        let ids: Vec<&String> = live.clusters["pi-a.in.example.org"].keys().collect();
        assert_eq!(
            ids,
            [
                "pi-a.in.example.org-10.0.0.1:80",
                "pi-a.in.example.org-[fd00::1]:80"
            ]
        );
        let file = routes(&ws, DnsUpstreams::AsWritten);
        let addresses: Vec<String> = file.clusters["pi-a.in.example.org"]
            .values()
            .map(|b| b.address.to_string())
            .collect();
        assert_eq!(addresses, ["svc.ns:80"]);
        assert_eq!(
            live.frontends, file.frontends,
            "the same frontends either way"
        );
        let unresolved = routes(&ws, DnsUpstreams::Resolved(&BTreeMap::new()));
        assert!(unresolved.clusters["pi-a.in.example.org"].is_empty());
    }
}
