//! sozu's own configuration file, made from the same desired state the live agent applies
//! ([`crate::plan::desired`]): listeners, one cluster per route with its frontends and backends,
//! its policies, the listeners' pages. Pure.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Serialize;
use sozu_command_lib::config::FileHealthCheckConfig;
use sozu_command_lib::proto::command::HealthCheckMode;

use crate::plan::desired::{self, DnsUpstreams, PolicyFiles};
use crate::plan::state::{
    Address, FrontendPolicy, HeaderTest, HealthCheck, Hsts, PathKind, Protocol,
    UNIX_BACKEND_IDENTITY,
};
use crate::workspace::{
    ClientAuthMode, Http2Offer, ListenerPolicy, ListenerTimeouts, RedirectScheme, TlsVersion,
    Workspace,
};

use super::RenderError;

/// What a sozu configuration file rendered from `workspace` leaves out, for the operator.
pub fn sozu_toml_warnings(workspace: &Workspace) -> Vec<String> {
    workspace
        .routes
        .iter()
        .filter(|r| r.policy().basic_auth.is_some())
        .map(|r| {
            format!(
                "route `{}{}`: its basic-auth users are not written into sozu's file (secrets \
                 stay in their file): sozu loading this file alone answers every request of the \
                 route 401 until the agent sets them",
                r.host,
                r.match_label()
            )
        })
        .collect()
}

/// Process settings of the rendered sozu configuration that the workspace does not carry.
#[derive(Debug, Clone)]
pub struct SozuSettings {
    pub command_socket: PathBuf,
    pub worker_count: u16,
    /// The routes sozu's control socket must answer for, when the workspace rendered is not the
    /// one the agent will push (the pod's bootstrap has no routes); the rendered workspace's own
    /// routes count too. See [`max_command_buffer_size`].
    pub routes: usize,
}

impl Default for SozuSettings {
    fn default() -> Self {
        SozuSettings {
            command_socket: PathBuf::from("/var/run/sozu/sozu.sock"),
            worker_count: 1,
            routes: 0,
        }
    }
}

/// What sozu's control socket may buffer for one answer (`max_command_buffer_size`), for a
/// workspace of `routes` routes.
///
/// The agent reads sozu's whole state back at each resync: every frontend in one answer (about
/// 270 bytes a route) and every certificate with its chain and key in another (1 to 8 KiB a
/// route, by key type and chain). sozu's main process cannot write an answer larger than this
/// buffer: it logs an error and closes the connection, so at sozu's default of 2,000,000 bytes
/// an agent of 10,000 routes could never read its state again. 16 KiB a route leaves room for
/// RSA chains and for a workspace that grows before sozu restarts with a new file; the buffer
/// grows only as an answer needs it, so the bound costs nothing until it is used.
pub fn max_command_buffer_size(routes: usize) -> u64 {
    const FLOOR: u64 = 64 << 20;
    const PER_ROUTE: u64 = 16 << 10;
    FLOOR.max((routes as u64).saturating_mul(PER_ROUTE))
}

/// Client connections each sozu worker accepts at once (`max_connections`), on every listener
/// together. sozu 2.3.3's own default is 10,000, but its default `max_buffers` (1,000, two per
/// TCP session, taken at accept: `TcpProxy::create_session`, lib/src/tcp.rs) stopped it at
/// about 500 connections: 520 idle connections to a `'tcp` route made HTTPS handshakes time out.
/// 4,096 covers a team's VPN clients with their browsers' connections and a few SSH sessions
/// and database pools each; a route's `limits` keep one client from taking them.
pub const MAX_CONNECTIONS: u64 = 4096;

/// Buffers each worker may hold (`max_buffers`): two per connection, so that the buffers never
/// run out before the connections do. Each is `buffer_size` (sozu's 16,393 bytes) and allocated
/// only as connections need it: 8,192 is at most 128 MiB, within the pod's memory limit.
pub const MAX_BUFFERS: u64 = 2 * MAX_CONNECTIONS;
// Two buffers a TCP session: the buffers never run out before the connections.
const _: () = assert!(MAX_BUFFERS >= 2 * MAX_CONNECTIONS);

/// A complete sozu 2.3.3 configuration: listeners, one cluster per route with its HTTPS frontend
/// (and the host's certificate, from `<tls_dir>/<host>/`), an HTTP frontend that redirects to
/// HTTPS, and its backends. DNS upstreams are written as `name:port`, which sozu resolves once
/// when it loads the file; the live agent re-resolves them instead. Error pages are written in
/// the file, as the agent sends them (`pages`, read and checked by
/// [`crate::sources::route_policy_files::pages`]), so the file works from whichever directory sozu
/// starts in; users files never are (see [`sozu_toml_warnings`]).
pub fn sozu_toml(
    workspace: &Workspace,
    pages: &PolicyFiles,
    settings: &SozuSettings,
) -> Result<String, RenderError> {
    let config = SozuConfig::from_workspace(workspace, pages, settings)?;
    let body = toml::to_string(&config).map_err(|err| RenderError::Serialise {
        format: "sozu-toml",
        reason: err.to_string(),
    })?;
    Ok(format!(
        "# Generated by private-ingress from the workspace (zone {}); do not edit.\n{body}",
        workspace.zone
    ))
}

// The structs below mirror sozu's configuration file one to one; field order is output order.

#[derive(Serialize)]
struct SozuConfig {
    command_socket: String,
    command_socket_mode: &'static str,
    log_level: &'static str,
    log_target: &'static str,
    /// Each request's record, sent to the agent (`traffic.listen`) over UDP: a datagram that
    /// finds no room is dropped, so sozu never waits for the agent. `log_level` must stay `info`
    /// or lower for sozu to write them.
    access_logs_target: String,
    access_logs_format: &'static str,
    worker_count: u16,
    worker_automatic_restart: bool,
    /// Large enough for the agent to read every frontend and certificate back in one answer
    /// ([`max_command_buffer_size`]).
    max_command_buffer_size: u64,
    /// Written rather than left to sozu's defaults, whose buffers run out first
    /// ([`MAX_CONNECTIONS`], [`MAX_BUFFERS`]).
    max_connections: u64,
    max_buffers: u64,
    activate_listeners: bool,
    listeners: Vec<SozuListener>,
    clusters: BTreeMap<String, SozuCluster>,
}

#[derive(Serialize)]
struct SozuListener {
    protocol: &'static str,
    address: SocketAddr,
    #[serde(skip_serializing_if = "Option::is_none")]
    interface: Option<String>,
    #[serde(skip_serializing_if = "is_false")]
    expect_proxy: bool,
    // The timeouts are written when they differ from sozu's defaults: `front` and `back` do by
    // default (the contract's are longer than sozu's).
    #[serde(skip_serializing_if = "Option::is_none")]
    front_timeout: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    back_timeout: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    connect_timeout: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    request_timeout: Option<u32>,
    /// HTTPS: TLS 1.3 alone when the workspace asks for it; sozu's default is 1.2 and 1.3.
    #[serde(skip_serializing_if = "Option::is_none")]
    tls_versions: Option<Vec<&'static str>>,
    /// HTTPS: sozu reads the CA and CRL files when it starts; the agent replaces their contents
    /// in sozu as the files change.
    #[serde(skip_serializing_if = "Option::is_none")]
    client_auth: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    client_ca_certificates: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    client_ca_crls: Option<Vec<String>>,
    /// HTTPS: the protocols offered in ALPN, when not sozu's default (`h2`, then `http/1.1`).
    #[serde(skip_serializing_if = "Option::is_none")]
    alpn_protocols: Option<Vec<&'static str>>,
    /// HTTPS: `true` with `listeners.http2 = 'only`.
    #[serde(skip_serializing_if = "is_false")]
    disable_http11: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    hsts: Option<SozuHsts>,
    /// The workspace's error pages, whole.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    answers: BTreeMap<String, String>,
    /// UDP: the largest datagram forwarded, when the route sets it.
    #[serde(skip_serializing_if = "Option::is_none")]
    max_rx_datagram_size: Option<u32>,
}

fn is_false(b: &bool) -> bool {
    !b
}

impl SozuListener {
    fn new(protocol: Protocol, address: SocketAddr, policy: &ListenerPolicy) -> SozuListener {
        let defaults = ListenerTimeouts::SOZU;
        let differs = |value: u32, default: u32| (value != default).then_some(value);
        let https = protocol == Protocol::Https;
        let auth = &policy.client_auth;
        let client_auth = https && auth.mode != ClientAuthMode::Off;
        // What a listener of each protocol takes of the listener policy: a UDP listener keeps
        // sozu's own flow timeouts, and only HTTP(S) reads a request.
        let (connections, requests) = match protocol {
            Protocol::Http | Protocol::Https => (true, true),
            Protocol::Tcp => (true, false),
            Protocol::Udp => (false, false),
        };
        SozuListener {
            protocol: match protocol {
                Protocol::Https => "https",
                Protocol::Http => "http",
                Protocol::Tcp => "tcp",
                Protocol::Udp => "udp",
            },
            address,
            interface: policy.interface.clone(),
            expect_proxy: connections && policy.expect_proxy,
            front_timeout: differs(policy.timeouts.front, defaults.front).filter(|_| connections),
            back_timeout: differs(policy.timeouts.back, defaults.back).filter(|_| connections),
            connect_timeout: differs(policy.timeouts.connect, defaults.connect)
                .filter(|_| connections),
            request_timeout: differs(policy.timeouts.request, defaults.request)
                .filter(|_| requests),
            tls_versions: (https && policy.min_tls_version == TlsVersion::V1_3)
                .then(|| vec!["TLS_V13"]),
            client_auth: client_auth.then_some(match auth.mode {
                ClientAuthMode::Required => "required",
                _ => "optional",
            }),
            client_ca_certificates: client_auth
                .then(|| auth.ca_file.iter().map(|p| path_string(p)).collect()),
            client_ca_crls: (client_auth && !auth.crl_files.is_empty())
                .then(|| auth.crl_files.iter().map(|p| path_string(p)).collect()),
            alpn_protocols: (https && policy.http2 != Http2Offer::Offered)
                .then(|| policy.http2.alpn().to_vec()),
            disable_http11: https && policy.http2 == Http2Offer::Only,
            hsts: None,
            answers: BTreeMap::new(),
            max_rx_datagram_size: None,
        }
    }
}

#[derive(Serialize)]
struct SozuHsts {
    enabled: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_age: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    include_subdomains: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    preload: Option<bool>,
}

impl SozuHsts {
    fn of(hsts: &Hsts) -> SozuHsts {
        if !hsts.enabled {
            return SozuHsts {
                enabled: false,
                max_age: None,
                include_subdomains: None,
                preload: None,
            };
        }
        SozuHsts {
            enabled: true,
            max_age: Some(hsts.max_age),
            include_subdomains: Some(hsts.include_subdomains),
            preload: Some(hsts.preload),
        }
    }
}

#[derive(Serialize)]
struct SozuCluster {
    protocol: &'static str,
    #[serde(skip_serializing_if = "is_false")]
    https_redirect: bool,
    /// A TCP cluster's backends get a PROXY protocol v2 header first.
    #[serde(skip_serializing_if = "is_false")]
    send_proxy: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    health_check: Option<FileHealthCheckConfig>,
    #[serde(skip_serializing_if = "Option::is_none")]
    www_authenticate: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_connections_per_ip: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_connections_per_subnet: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    retry_after: Option<u32>,
    /// Error pages, whole: a `file://` path would be read from sozu's working directory, and
    /// sozu sends a page as the file has it, unframed if the file gives no `Content-Length`.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    answers: BTreeMap<String, String>,
    /// The backends speak h2c (`upstream_protocol = 'h2c`).
    #[serde(skip_serializing_if = "is_false")]
    http2: bool,
    /// `sticky = true`: sozu's sticky-session cookie pins a client to its backend.
    #[serde(skip_serializing_if = "is_false")]
    sticky_session: bool,
    /// The route's `balancing`, as sozu's file names it; absent for round robin, its default.
    #[serde(skip_serializing_if = "Option::is_none")]
    load_balancing: Option<&'static str>,
    frontends: Vec<SozuAnyFrontend>,
    backends: Vec<SozuBackend>,
}

/// A `balancing` as sozu's configuration file writes it (`LoadBalancingAlgorithms`, read in
/// SCREAMING_SNAKE_CASE by `FileClusterConfig`).
fn file_load_balancing(balancing: crate::workspace::Balancing) -> &'static str {
    use crate::workspace::Balancing;
    match balancing {
        Balancing::RoundRobin => "ROUND_ROBIN",
        Balancing::Random => "RANDOM",
        Balancing::LeastLoaded => "LEAST_LOADED",
        Balancing::PowerOfTwo => "POWER_OF_TWO",
        Balancing::Hrw => "HRW",
        Balancing::Maglev => "MAGLEV",
    }
}

/// A cluster's frontend: an HTTP(S) one, or one of a route of its own port.
#[derive(Serialize)]
#[serde(untagged)]
enum SozuAnyFrontend {
    Http(Box<SozuFrontend>),
    Stream(SozuStreamFrontend),
}

/// A TCP or UDP frontend: its listener's address (the listener says which protocol) and, for TLS
/// passed through, the host the ClientHello must name.
#[derive(Serialize)]
struct SozuStreamFrontend {
    address: SocketAddr,
    #[serde(skip_serializing_if = "Option::is_none")]
    hostname: Option<String>,
    tags: BTreeMap<String, String>,
}

/// A health check as sozu's configuration file writes it: sozu's own file type, made from the
/// one mapping of a health check to sozu's terms ([`crate::sozu::request::health_check_config`]),
/// which the live requests use too, so that the file and the socket cannot differ.
fn file_health_check(check: &HealthCheck) -> FileHealthCheckConfig {
    let config = crate::sozu::request::health_check_config(check);
    FileHealthCheckConfig {
        uri: config.uri,
        interval: config.interval,
        timeout: config.timeout,
        healthy_threshold: config.healthy_threshold,
        unhealthy_threshold: config.unhealthy_threshold,
        expected_status: config.expected_status,
        mode: HealthCheckMode::try_from(config.mode).ok(),
        accepted_statuses: config
            .accepted_statuses
            .iter()
            .map(|range| {
                if range.start == range.end {
                    range.start.to_string()
                } else {
                    format!("{}-{}", range.start, range.end)
                }
            })
            .collect(),
        port: config.port,
        headers: Vec::new(),
    }
}

#[derive(Serialize)]
struct SozuFrontend {
    address: SocketAddr,
    hostname: String,
    path: String,
    path_type: &'static str,
    /// `method` and `header_predicates`, as sozu 2.3.3's file loader reads them
    /// (`FileClusterFrontendConfig` in sozu-command-lib's `config.rs`).
    #[serde(skip_serializing_if = "Option::is_none")]
    method: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    header_predicates: Vec<SozuHeaderPredicate>,
    #[serde(skip_serializing_if = "Option::is_none")]
    certificate: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    certificate_chain: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    key: Option<String>,
    tags: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    hsts: Option<SozuHsts>,
    #[serde(skip_serializing_if = "Option::is_none")]
    redirect: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    redirect_scheme: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rewrite_host: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rewrite_path: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rewrite_port: Option<u16>,
    #[serde(skip_serializing_if = "is_false")]
    required_auth: bool,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    headers: Vec<SozuHeader>,
}

/// A header predicate as sozu's file writes it: `match` is `exact`, `regex` or `present`, and
/// `value` is absent for `present` (`HeaderPredicateConfig`).
#[derive(Serialize)]
struct SozuHeaderPredicate {
    name: String,
    #[serde(rename = "match")]
    kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    value: Option<String>,
}

/// A header edit as sozu's file writes it (`value`; empty removes the header).
#[derive(Serialize)]
struct SozuHeader {
    position: &'static str,
    key: String,
    value: String,
}

#[derive(Serialize)]
struct SozuBackend {
    address: String,
    /// Always written: a backend without one weighs 100 in sozu 2.3.3, not 1.
    weight: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    unix_path: Option<String>,
    /// What sozu's sticky cookie names the backend by, as the live agent sends it
    /// ([`crate::plan::state::Backend::sticky_id`]); without one sozu's cookie pins nothing.
    /// Written for a sticky cluster's backends given by address; a DNS name that sozu resolves
    /// to several addresses would give each the same one, and every cookie would pin to the
    /// first, so a name gets none (its clients are not pinned: docs/contract.md).
    #[serde(skip_serializing_if = "Option::is_none")]
    sticky_id: Option<String>,
}

impl SozuConfig {
    /// From the same desired state the live agent applies ([`desired::routes`]), with DNS names
    /// left for sozu to resolve and each HTTPS frontend naming its host's certificate files.
    fn from_workspace(
        workspace: &Workspace,
        pages: &PolicyFiles,
        settings: &SozuSettings,
    ) -> Result<SozuConfig, RenderError> {
        let mut desired = desired::routes(workspace, DnsUpstreams::AsWritten);
        desired::policies(&mut desired, workspace, pages);
        let mut clusters: BTreeMap<String, SozuCluster> = desired
            .clusters
            .iter()
            .map(|(id, backends)| {
                let sticky = desired
                    .cluster_policies
                    .get(id)
                    .is_some_and(|p| p.sticky_session);
                let backends = backends
                    .values()
                    .map(|backend| {
                        let weight = backend.weight;
                        let sticky_id = (sticky
                            && !matches!(backend.address, Address::Name { .. }))
                        .then(|| backend.sticky_id());
                        match &backend.address {
                            Address::Unix(path) => SozuBackend {
                                address: UNIX_BACKEND_IDENTITY.to_string(),
                                weight,
                                unix_path: Some(path_string(path)),
                                sticky_id,
                            },
                            other => SozuBackend {
                                address: other.to_string(),
                                weight,
                                unix_path: None,
                                sticky_id,
                            },
                        }
                    })
                    .collect();
                let policy = desired.cluster_policies.get(id);
                // A route of its own port has a cluster of sozu's `tcp` kind (UDP included: the
                // listener makes the frontend a UDP one).
                let stream = desired.stream_frontends.iter().any(|f| f.cluster_id == *id);
                let cluster = SozuCluster {
                    protocol: if stream { "tcp" } else { "http" },
                    https_redirect: !stream,
                    send_proxy: policy.is_some_and(|p| p.proxy_protocol),
                    health_check: desired.health_checks.get(id).map(file_health_check),
                    www_authenticate: policy.and_then(|p| p.www_authenticate.clone()),
                    max_connections_per_ip: policy.and_then(|p| p.max_connections_per_ip),
                    max_connections_per_subnet: policy.and_then(|p| p.max_connections_per_subnet),
                    retry_after: policy.and_then(|p| p.retry_after),
                    answers: policy
                        .map(|p| {
                            p.answers
                                .iter()
                                .map(|(s, page)| (s.clone(), page.to_string()))
                                .collect()
                        })
                        .unwrap_or_default(),
                    http2: policy.is_some_and(|p| p.http2),
                    sticky_session: policy.is_some_and(|p| p.sticky_session),
                    load_balancing: policy
                        .map(|p| p.load_balancing)
                        .filter(|b| !b.is_default())
                        .map(file_load_balancing),
                    frontends: Vec::new(),
                    backends,
                };
                (id.clone(), cluster)
            })
            .collect();
        // HTTPS before HTTP within a cluster, as an operator would write them.
        let mut frontends: Vec<_> = desired.frontends.iter().collect();
        frontends.sort_by_key(|f| std::cmp::Reverse(f.protocol));
        for frontend in frontends {
            let Some(cluster) = frontend
                .cluster_id
                .as_ref()
                .and_then(|id| clusters.get_mut(id))
            else {
                continue;
            };
            // sozu's file loader refuses an HTTPS frontend without a certificate, so every route
            // of a host names the host's files; sozu loads the identical certificate once.
            // tls.crt holds the chain, leaf first; sozu drops the duplicated leaf.
            let (certificate, key) = match frontend.protocol {
                Protocol::Https => {
                    let (crt, key) = workspace.certificate_paths(&frontend.hostname);
                    (Some(path_string(&crt)), Some(path_string(&key)))
                }
                Protocol::Http | Protocol::Tcp | Protocol::Udp => (None, None),
            };
            // Every field of the policy is named: a new one fails to compile until it is
            // written here too (or said to have no place in sozu's file).
            let none = FrontendPolicy::default();
            let FrontendPolicy {
                redirect,
                rewrite_host,
                rewrite_path,
                rewrite_port,
                headers,
                required_auth,
            } = frontend.policy.as_deref().unwrap_or(&none);
            let redirect = match *redirect {
                None => None,
                Some((301, scheme)) => Some(scheme),
                Some((status, _)) => {
                    return Err(RenderError::Unexpressible {
                        route: format!("{}{}", frontend.hostname, frontend.match_label()),
                        what: format!(
                            "redirect.status {status} (sozu's file knows the 301 redirect only)"
                        ),
                    })
                }
            };
            cluster
                .frontends
                .push(SozuAnyFrontend::Http(Box::new(SozuFrontend {
                    address: frontend.address,
                    hostname: frontend.hostname.clone(),
                    path: frontend.path.value.clone(),
                    path_type: match frontend.path.kind {
                        PathKind::Prefix => "PREFIX",
                        PathKind::Regex => "REGEX",
                        PathKind::Equals => "EQUALS",
                    },
                    method: frontend.method.clone(),
                    header_predicates: frontend
                        .header_predicates
                        .iter()
                        .map(|h| {
                            let (kind, value) = match &h.test {
                                HeaderTest::Exact(v) => ("exact", Some(v.clone())),
                                HeaderTest::Regex(v) => ("regex", Some(v.clone())),
                                HeaderTest::Present => ("present", None),
                            };
                            SozuHeaderPredicate {
                                name: h.name.clone(),
                                kind,
                                value,
                            }
                        })
                        .collect(),
                    certificate_chain: certificate.clone(),
                    certificate,
                    key,
                    tags: frontend
                        .tags
                        .iter()
                        .map(|(n, v)| (n.to_owned(), v.to_owned()))
                        .collect(),
                    hsts: frontend.hsts.as_ref().map(SozuHsts::of),
                    redirect: redirect.map(|_| "permanent"),
                    redirect_scheme: redirect.map(|scheme| match scheme {
                        RedirectScheme::Https => "use-https",
                        RedirectScheme::Http => "use-http",
                        RedirectScheme::Same => "use-same",
                    }),
                    rewrite_host: rewrite_host.clone(),
                    rewrite_path: rewrite_path.clone(),
                    rewrite_port: *rewrite_port,
                    required_auth: *required_auth,
                    headers: headers
                        .iter()
                        .map(|h| SozuHeader {
                            position: if h.response { "response" } else { "request" },
                            key: h.name.clone(),
                            value: h.value.clone(),
                        })
                        .collect(),
                })));
        }
        for frontend in &desired.stream_frontends {
            if let Some(cluster) = clusters.get_mut(&frontend.cluster_id) {
                cluster
                    .frontends
                    .push(SozuAnyFrontend::Stream(SozuStreamFrontend {
                        address: frontend.address,
                        hostname: frontend.sni.clone(),
                        tags: frontend
                            .tags
                            .iter()
                            .map(|(n, v)| (n.to_owned(), v.to_owned()))
                            .collect(),
                    }));
            }
        }
        let listener = |address: &SocketAddr| {
            desired
                .listeners
                .get(address)
                .map(|&protocol| SozuListener {
                    hsts: match protocol {
                        Protocol::Https => desired.hsts.as_ref().map(SozuHsts::of),
                        Protocol::Http | Protocol::Tcp | Protocol::Udp => None,
                    },
                    answers: match protocol {
                        Protocol::Https | Protocol::Http => desired
                            .listener_answers
                            .iter()
                            .map(|(s, page)| (s.clone(), page.to_string()))
                            .collect(),
                        Protocol::Tcp | Protocol::Udp => BTreeMap::new(),
                    },
                    max_rx_datagram_size: desired.datagram_sizes.get(address).copied(),
                    ..SozuListener::new(protocol, *address, &workspace.listener_policy)
                })
        };
        Ok(SozuConfig {
            command_socket: path_string(&settings.command_socket),
            command_socket_mode: "0600",
            log_level: "info",
            log_target: "stdout",
            access_logs_target: format!("udp://{}", workspace.traffic.target()),
            access_logs_format: "protobuf",
            worker_count: settings.worker_count,
            worker_automatic_restart: true,
            max_command_buffer_size: max_command_buffer_size(
                settings.routes.max(workspace.routes.len()),
            ),
            max_connections: MAX_CONNECTIONS,
            max_buffers: MAX_BUFFERS,
            activate_listeners: true,
            // The HTTPS and HTTP listeners first, then those of the routes of their own port.
            listeners: [workspace.listeners.https, workspace.listeners.http]
                .iter()
                .chain(
                    desired.listeners.keys().filter(|a| {
                        ![workspace.listeners.https, workspace.listeners.http].contains(a)
                    }),
                )
                .filter_map(listener)
                .collect(),
            clusters,
        })
    }
}

fn path_string(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

#[cfg(test)]
mod tests {
    use crate::plan::state::Probe;

    /// One mapping of a health check, read back: the file's block, as sozu parses it from the
    /// TOML text, is the request the agent sends, field for field.
    #[test]
    fn a_health_check_in_the_file_is_the_one_the_agent_sends() {
        let checks = [
            HealthCheck {
                probe: Probe::Http {
                    path: "/healthz".into(),
                    accepted_statuses: vec![(200, 299), (304, 304)],
                },
                interval: 5,
                timeout: 2,
                healthy_threshold: 3,
                unhealthy_threshold: 4,
                port: Some(9000),
            },
            HealthCheck {
                probe: Probe::Tcp,
                interval: 1,
                timeout: 1,
                healthy_threshold: 1,
                unhealthy_threshold: 2,
                port: None,
            },
        ];
        #[derive(serde::Deserialize, Serialize)]
        struct Block {
            health_check: FileHealthCheckConfig,
        }
        for check in checks {
            let text = toml::to_string(&Block {
                health_check: file_health_check(&check),
            })
            .unwrap();
            let read: Block = toml::from_str(&text).unwrap();
            assert_eq!(
                read.health_check.to_proto(),
                Ok(crate::sozu::request::health_check_config(&check)),
                "{text}"
            );
        }
    }
    use super::*;
    use crate::workspace::{Route, Upstream};

    fn workspace(routes: Vec<Route>) -> Workspace {
        crate::workspace::test_workspace(Path::new("/tls"), routes)
    }

    fn route(host: &str, path: &str, upstream: Upstream) -> Route {
        Route::http(
            host,
            path,
            crate::workspace::test_route(host, upstream).upstreams,
        )
    }

    #[test]
    fn https_frontends_name_their_host_certificate_and_http_redirects() {
        let up = Upstream::Ip {
            address: "10.0.0.1:80".parse().unwrap(),
        };
        let ws = workspace(vec![
            route("a.in.example.org", "/", up.clone()),
            route("a.in.example.org", "/api", up),
        ]);
        let out = sozu_toml(&ws, &PolicyFiles::default(), &SozuSettings::default()).unwrap();
        let doc: toml::Table = out.parse().unwrap();
        let clusters = doc["clusters"].as_table().unwrap();
        assert_eq!(clusters.len(), 2);
        let keys = out
            .matches("key = \"/tls/a.in.example.org/tls.key\"")
            .count();
        assert_eq!(keys, 2, "one per HTTPS frontend, none on HTTP ones: {out}");
        for cluster in clusters.values() {
            assert_eq!(cluster["https_redirect"].as_bool(), Some(true));
            let addresses: Vec<_> = cluster["frontends"]
                .as_array()
                .unwrap()
                .iter()
                .map(|f| f["address"].as_str().unwrap().to_owned())
                .collect();
            assert_eq!(addresses, ["127.0.0.1:8443", "127.0.0.1:8080"]);
        }
    }

    /// sozu's main process closes a connection whose answer is larger than its
    /// `max_command_buffer_size`, and the agent reads every frontend and every certificate back
    /// in one answer each. The file, as sozu reads it, leaves room for that at the routes the
    /// agent will push: the workspace's own, or those given for a bootstrap without any.
    #[test]
    fn the_control_socket_has_room_to_read_the_state_back() {
        let up = Upstream::Ip {
            address: "10.0.0.1:80".parse().unwrap(),
        };
        let ws = workspace(vec![route("a.in.example.org", "/", up)]);
        let bootstrap = workspace(Vec::new());
        // Two frontends of about 270 bytes and a certificate with an RSA chain and key, at most
        // about 8 KiB, per route.
        let needed = |routes: u64| routes * 8 * 1024;
        for (ws, routes) in [(&ws, 0), (&bootstrap, 10_000), (&bootstrap, 100_000)] {
            let settings = SozuSettings {
                routes,
                ..SozuSettings::default()
            };
            let text = sozu_toml(ws, &PolicyFiles::default(), &settings).unwrap();
            let file: sozu_command_lib::config::FileConfig = toml::from_str(&text).unwrap();
            let max = file.max_command_buffer_size.unwrap_or(2_000_000);
            assert!(
                max >= needed(routes as u64) && max > 2_000_000,
                "{max} bytes for {routes} routes"
            );
        }
    }

    #[test]
    fn upstream_kinds_become_backends() {
        let ws = workspace(vec![
            route(
                "d.in.example.org",
                "/",
                Upstream::Dns {
                    name: "svc.ns".into(),
                    port: 3000,
                },
            ),
            route(
                "u.in.example.org",
                "/",
                Upstream::Unix {
                    path: "/run/u.sock".into(),
                },
            ),
            route(
                "v.in.example.org",
                "/",
                Upstream::Ip {
                    address: "[fd00::1]:9090".parse().unwrap(),
                },
            ),
        ]);
        let doc: toml::Table = sozu_toml(&ws, &PolicyFiles::default(), &SozuSettings::default())
            .unwrap()
            .parse()
            .unwrap();
        let backend = |id: &str| doc["clusters"][id]["backends"][0].clone();
        assert_eq!(
            backend("pi-d.in.example.org")["address"].as_str(),
            Some("svc.ns:3000")
        );
        assert_eq!(
            backend("pi-u.in.example.org")["unix_path"].as_str(),
            Some("/run/u.sock")
        );
        assert_eq!(
            backend("pi-v.in.example.org")["address"].as_str(),
            Some("[fd00::1]:9090")
        );
    }

    /// One mapping of every route policy, read back: each cluster of the rendered file, as
    /// sozu's own loader turns it into requests, asks for the frontend policy and the cluster
    /// policy the agent sends over the socket, field for field. (The credentials aside: they
    /// stay in their file, see [`sozu_toml_warnings`].)
    #[test]
    fn every_route_policy_in_the_file_is_the_one_the_agent_sends() {
        use sozu_command_lib::config::{ClusterConfig, FileClusterConfig};
        use sozu_command_lib::proto::command::request::RequestType;

        let dir = tempfile::tempdir().unwrap();
        let page = dir.path().join("503.http");
        let page_text =
            "HTTP/1.1 503 Service Unavailable\nContent-Type: text/html\n\n<h1>%ROUTE</h1>\n";
        std::fs::write(&page, page_text).unwrap();
        let text = format!(
            r#"{{
  zone = "in.example.org",
  cluster_issuer = "ca",
  tls_dir = "{tls}",
  headers = {{ response.set = {{ "X-Frame-Options" = "DENY" }}, request.remove = ["X-Debug"] }},
  routes = [
    {{ host = "a.in.example.org", path_prefix = "/app/", upstream = "10.0.0.1", port = 80,
       strip_prefix = true, headers.response = {{ set = {{ "X-Frame-Options" = "SAMEORIGIN" }}, remove = ["Server"] }},
       basic_auth = {{ users_file = "/etc/users", realm = "Admin" }},
       limits = {{ connections_per_ip = 5, connections_per_subnet = 50, retry_after = 30 }},
       error_pages."503" = "{page}" }},
    {{ host = "b.in.example.org", upstream = "10.0.0.1", port = 80,
       rewrite = {{ path = "/v2$PATH[0]" }}, sticky = true, balancing = 'least_loaded }},
    {{ host = "b.in.example.org", path_prefix = "/m", upstream = "10.0.0.1", port = 80,
       balancing = 'maglev }},
    {{ host = "old.in.example.org", redirect = {{ scheme = 'http, host = "new.in.example.org", path = "/x$PATH[0]", port = 8080 }} }},
    {{ host = "c.in.example.org", path_exact = "/v2", method = "GET", upstream = "10.0.0.1", port = 80,
       match_headers = [
         {{ name = "X-Canary", exact = "1" }},
         {{ name = "x-env", regex = "stag.*" }},
         {{ name = "x-debug", present = true }},
       ] }},
    {{ host = "c.in.example.org", path_segment_prefix = "/v2", upstream = "10.0.0.1", port = 80 }},
    {{ host = "c.in.example.org", path_regex = "^/v[0-9]+/(.*)$", upstream = "10.0.0.1", port = 80,
       rewrite = {{ path = "/$PATH[1]" }} }},
  ],
}}"#,
            tls = dir.path().join("tls").display(),
            page = page.display(),
        );
        let ws_path = dir.path().join("workspace.ncl");
        std::fs::write(&ws_path, text).unwrap();
        let ws = crate::evaluate::contract::evaluate(&ws_path).unwrap();
        for route in &ws.routes {
            let (crt, key) = ws.certificate_paths(&route.host);
            std::fs::create_dir_all(crt.parent().unwrap()).unwrap();
            std::fs::write(&crt, "certificate").unwrap();
            std::fs::write(&key, "key").unwrap();
        }
        let tree = crate::evaluate::imports::Root::of(&ws_path, None).unwrap();
        let pages = crate::sources::route_policy_files::pages(&ws, &tree).unwrap();
        let doc: toml::Table = sozu_toml(&ws, &pages, &SozuSettings::default())
            .unwrap()
            .parse()
            .unwrap();

        // What the live agent sends, with the files read as the agent reads them.
        let mut files = desired::PolicyFiles::default();
        files.pages.insert(
            page.clone(),
            crate::sources::route_policy_files::parse::parse_page(page_text.as_bytes(), &page, 503)
                .unwrap()
                .into(),
        );
        let mut live = desired::routes(&ws, DnsUpstreams::AsWritten);
        desired::policies(&mut live, &ws, &files);

        let mut checked = 0;
        let mut balanced = Vec::new();
        for (id, cluster) in doc["clusters"].as_table().unwrap() {
            let file: FileClusterConfig = cluster.clone().try_into().unwrap();
            let ClusterConfig::Http(config) = file
                .to_cluster_config_with(id, &Default::default(), None)
                .unwrap()
            else {
                panic!("{id}: not an HTTP cluster");
            };
            let requests: Vec<RequestType> = config
                .generate_requests()
                .unwrap()
                .into_iter()
                .filter_map(|r| r.request_type)
                .collect();
            let from_file = requests
                .iter()
                .find_map(|r| match r {
                    RequestType::AddCluster(c) => Some(c.clone()),
                    _ => None,
                })
                .unwrap();
            let policy = live.cluster_policies.get(id).cloned();
            let sent = crate::sozu::request::cluster(id, policy.as_deref());
            assert_eq!(from_file.www_authenticate, sent.www_authenticate, "{id}");
            assert_eq!(
                from_file.max_connections_per_ip, sent.max_connections_per_ip,
                "{id}"
            );
            assert_eq!(
                from_file.max_connections_per_subnet, sent.max_connections_per_subnet,
                "{id}"
            );
            assert_eq!(from_file.retry_after, sent.retry_after, "{id}");
            assert_eq!(from_file.answers, sent.answers, "{id}");
            assert_eq!(from_file.sticky_session, sent.sticky_session, "{id}");
            assert_eq!(from_file.load_balancing, sent.load_balancing, "{id}");
            balanced.push((sent.sticky_session, sent.load_balancing));
            if sent.sticky_session {
                // The cookie follows the backend's sticky id: the same in the file as live.
                let from_file: Vec<_> = requests
                    .iter()
                    .filter_map(|r| match r {
                        RequestType::AddBackend(b) => b.sticky_id.clone(),
                        _ => None,
                    })
                    .collect();
                let live_ids: Vec<_> = live.clusters[id].values().map(|b| b.sticky_id()).collect();
                assert_eq!(from_file, live_ids, "{id}");
            }

            let https = live
                .frontends
                .iter()
                .find(|f| f.cluster_id.as_deref() == Some(id) && f.protocol == Protocol::Https)
                .unwrap();
            // A frontend with header predicates goes by a verb of its own, in the file as on
            // the socket.
            let sent_request =
                crate::sozu::request::to_request(&crate::plan::Op::AddFrontend(https.clone()))
                    .unwrap();
            let (RequestType::AddHttpsFrontend(sent)
            | RequestType::AddHttpsFrontendWithHeaderPredicates(sent)) = sent_request.clone()
            else {
                panic!("{id}: not an HTTPS frontend request");
            };
            let from_file = requests
                .iter()
                .find(|r| {
                    matches!(
                        r,
                        RequestType::AddHttpsFrontend(_)
                            | RequestType::AddHttpsFrontendWithHeaderPredicates(_)
                    )
                })
                .unwrap_or_else(|| panic!("{id}: {requests:#?}"));
            assert_eq!(
                std::mem::discriminant(from_file),
                std::mem::discriminant(&sent_request),
                "{id}: the same verb"
            );
            let (RequestType::AddHttpsFrontend(from_file)
            | RequestType::AddHttpsFrontendWithHeaderPredicates(from_file)) = from_file.clone()
            else {
                unreachable!()
            };
            assert_eq!(
                from_file.redirect.unwrap_or(0),
                sent.redirect.unwrap_or(0),
                "{id}"
            );
            assert_eq!(
                from_file.redirect_scheme.unwrap_or(0),
                sent.redirect_scheme.unwrap_or(0),
                "{id}"
            );
            assert_eq!(from_file.rewrite_host, sent.rewrite_host, "{id}");
            assert_eq!(from_file.rewrite_path, sent.rewrite_path, "{id}");
            assert_eq!(from_file.rewrite_port, sent.rewrite_port, "{id}");
            assert_eq!(
                from_file.required_auth.unwrap_or(false),
                sent.required_auth.unwrap_or(false),
                "{id}"
            );
            assert_eq!(from_file.headers, sent.headers, "{id}");
            // What the frontend matches: its path rule, method and header predicates.
            assert_eq!(from_file.path, sent.path, "{id}");
            assert_eq!(from_file.method, sent.method, "{id}");
            assert_eq!(from_file.header_predicates, sent.header_predicates, "{id}");
            checked += 1;
        }
        assert_eq!(checked, 7);
        use sozu_command_lib::proto::command::LoadBalancingAlgorithms as Lb;
        for wanted in [
            (true, Lb::LeastLoaded as i32),
            (false, Lb::Maglev as i32),
            (false, Lb::RoundRobin as i32),
        ] {
            assert!(balanced.contains(&wanted), "{wanted:?} in {balanced:?}");
        }
        let file = doc.to_string();
        assert!(file.contains("path_type = \"REGEX\""), "{file}");
        assert!(file.contains("method = \"GET\""), "{file}");
    }

    /// The protocols and timeouts in the file are the ones the agent sends: sozu's own loader
    /// reads the HTTPS listener's ALPN, `disable_http11` and timeouts, and an h2c route's
    /// `http2`, as the agent's requests set them.
    #[test]
    fn the_protocols_in_the_file_are_the_ones_the_agent_sends() {
        use sozu_command_lib::config::{ClusterConfig, FileClusterConfig, ListenerBuilder};
        use sozu_command_lib::proto::command::request::RequestType;

        let dir = tempfile::tempdir().unwrap();
        let ws_path = dir.path().join("workspace.ncl");
        for (http2, timeouts) in [
            ("'only", "front = 900"),
            ("'off", "back = 45"),
            ("'offered", ""),
        ] {
            std::fs::write(
                &ws_path,
                format!(
                    r#"{{
  zone = "in.example.org",
  cluster_issuer = "ca",
  tls_dir = "{tls}",
  listeners = {{ http2 = {http2}, timeouts = {{ {timeouts} }} }},
  routes = [
    {{ host = "grpc.in.example.org", upstream = "10.0.0.1", port = 50051, upstream_protocol = 'h2c }},
    {{ host = "web.in.example.org", upstream = "10.0.0.2", port = 80 }},
  ],
}}"#,
                    tls = dir.path().join("tls").display(),
                ),
            )
            .unwrap();
            let ws = crate::evaluate::contract::evaluate(&ws_path).unwrap();
            for route in &ws.routes {
                let (crt, key) = ws.certificate_paths(&route.host);
                std::fs::create_dir_all(crt.parent().unwrap()).unwrap();
                std::fs::write(&crt, "certificate").unwrap();
                std::fs::write(&key, "key").unwrap();
            }
            let doc: toml::Table = sozu_toml(
                &ws,
                &desired::PolicyFiles::default(),
                &SozuSettings::default(),
            )
            .unwrap()
            .parse()
            .unwrap();
            let live = desired::routes(&ws, DnsUpstreams::AsWritten);
            let mut https_listeners = 0;
            for listener in doc["listeners"].as_array().unwrap() {
                let mut file: ListenerBuilder = listener.clone().try_into().unwrap();
                if file.protocol != Some(sozu_command_lib::config::ListenerProtocol::Https) {
                    continue;
                }
                let from_file = file.to_tls(None).unwrap();
                let op = crate::plan::Op::AddListener {
                    protocol: Protocol::Https,
                    address: ws.listeners.https,
                    settings: Box::new(live.listener_settings.clone()),
                };
                let Ok(RequestType::AddHttpsListener(sent)) = crate::sozu::request::to_request(&op)
                else {
                    panic!("not an HTTPS listener request");
                };
                assert_eq!(from_file.alpn_protocols, sent.alpn_protocols, "{http2}");
                assert_eq!(
                    from_file.disable_http11.unwrap_or(false),
                    sent.disable_http11.unwrap_or(false),
                    "{http2}"
                );
                assert_eq!(from_file.front_timeout, sent.front_timeout, "{timeouts}");
                assert_eq!(from_file.back_timeout, sent.back_timeout, "{timeouts}");
                https_listeners += 1;
            }
            assert_eq!(https_listeners, 1);
            let mut policies = live.clone();
            desired::policies(&mut policies, &ws, &desired::PolicyFiles::default());
            for (id, cluster) in doc["clusters"].as_table().unwrap() {
                let file: FileClusterConfig = cluster.clone().try_into().unwrap();
                let ClusterConfig::Http(config) = file
                    .to_cluster_config_with(id, &Default::default(), None)
                    .unwrap()
                else {
                    panic!("{id}: not an HTTP cluster");
                };
                let from_file = config
                    .generate_requests()
                    .unwrap()
                    .into_iter()
                    .find_map(|r| match r.request_type {
                        Some(RequestType::AddCluster(c)) => Some(c),
                        _ => None,
                    })
                    .unwrap();
                let sent = crate::sozu::request::cluster(
                    id,
                    policies.cluster_policies.get(id).map(|p| p.as_ref()),
                );
                assert_eq!(
                    from_file.http2.unwrap_or(false),
                    sent.http2.unwrap_or(false),
                    "{id}"
                );
                assert_eq!(sent.http2 == Some(true), id.starts_with("pi-grpc"), "{id}");
            }
        }
    }

    /// sozu's file knows one redirect status: a workspace with another is refused, not
    /// rendered as a 301.
    #[test]
    fn a_redirect_the_file_cannot_hold_is_refused() {
        let mut route = crate::workspace::test_route(
            "a.in.example.org",
            Upstream::Ip {
                address: "10.0.0.1:80".parse().unwrap(),
            },
        );
        route.upstreams.clear();
        route.http_mut().policy = Some(Box::new(crate::workspace::RoutePolicy {
            redirect: Some(crate::workspace::Redirect {
                status: 308,
                scheme: RedirectScheme::Https,
                host: None,
                path: None,
                port: None,
            }),
            ..Default::default()
        }));
        let err = sozu_toml(
            &workspace(vec![route]),
            &PolicyFiles::default(),
            &SozuSettings::default(),
        )
        .unwrap_err();
        assert!(err.is_invalid_workspace());
        assert!(err.to_string().contains("redirect.status 308"), "{err}");
    }

    /// Routes of their own port, as sozu's own loader reads the file: the connection and buffer
    /// maximums the agent writes (not sozu's defaults, whose 1,000 buffers stop it at about 500
    /// TCP connections), a TCP and a UDP route's per-client limits on their clusters without a
    /// `Retry-After`, and the UDP listener's largest datagram and its route's TCP health check.
    #[test]
    fn stream_limits_and_the_datagram_size_reach_sozus_loader() {
        use sozu_command_lib::config::{ClusterConfig, ConfigBuilder, FileConfig};

        let dir = tempfile::tempdir().unwrap();
        let ws_path = dir.path().join("workspace.ncl");
        std::fs::write(
            &ws_path,
            format!(
                r#"{{
  zone = "in.example.org",
  cluster_issuer = "ca",
  tls_dir = "{tls}",
  routes = [
    {{ host = "db.in.example.org", protocol = 'tcp, listen_port = 5432, upstream = "10.0.0.1", port = 5432,
       limits = {{ connections_per_ip = 8, connections_per_subnet = 64 }} }},
    {{ host = "dns.in.example.org", protocol = 'udp, listen_port = 5353, upstream = "10.0.0.2", port = 53,
       limits.connections_per_ip = 4, max_datagram_size = 4096, health = {{ mode = 'tcp, interval = 2, timeout = 1 }} }},
  ],
}}"#,
                tls = dir.path().join("tls").display()
            ),
        )
        .unwrap();
        let ws = crate::evaluate::contract::evaluate(&ws_path).unwrap();
        let text = sozu_toml(&ws, &PolicyFiles::default(), &SozuSettings::default()).unwrap();
        let file: FileConfig = toml::from_str(&text).unwrap();
        let config = ConfigBuilder::new(file, "sozu.toml").into_config().unwrap();
        assert_eq!(
            (config.max_connections as u64, config.max_buffers),
            (MAX_CONNECTIONS, MAX_BUFFERS)
        );
        let udp: Vec<u32> = config
            .udp_listeners
            .iter()
            .map(|l| l.max_rx_datagram_size)
            .collect();
        assert_eq!(udp, [4096]);
        let ClusterConfig::Tcp(udp) = &config.clusters["pi-dns.in.example.org-udp-5353"] else {
            panic!("the UDP route's cluster is not sozu's tcp kind");
        };
        let check = udp
            .health_check
            .as_ref()
            .expect("the UDP route's health check");
        assert_eq!(
            (check.mode, check.interval),
            (
                sozu_command_lib::proto::command::HealthCheckMode::Tcp as i32,
                2
            )
        );
        let limits = |id: &str| match &config.clusters[id] {
            ClusterConfig::Tcp(c) => (
                c.max_connections_per_ip,
                c.max_connections_per_subnet,
                c.retry_after,
            ),
            ClusterConfig::Http(_) => panic!("{id}: an HTTP cluster"),
        };
        assert_eq!(
            limits("pi-db.in.example.org-tcp-5432"),
            (Some(8), Some(64), None)
        );
        assert_eq!(
            limits("pi-dns.in.example.org-udp-5353"),
            (Some(4), None, None)
        );
    }
}
