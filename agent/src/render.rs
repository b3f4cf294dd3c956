//! Outputs derived from a [`Workspace`]: the normalised model as JSON, and a complete sozu
//! configuration file. Formatting is pure and deterministic (routes are sorted, maps are ordered);
//! [`write_atomic`] is the only I/O here.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Serialize;
use sozu_command_lib::config::FileHealthCheckConfig;
use sozu_command_lib::proto::command::HealthCheckMode;

use crate::desired::{self, Names, PolicyFiles};
use crate::sozu_state::{Address, HealthCheck, Hsts, Protocol, UNIX_BACKEND_IDENTITY};
use crate::workspace::{
    ClientAuthMode, ListenerPolicy, ListenerTimeouts, RedirectScheme, TlsVersion, Workspace,
};

#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error("cannot serialise the {format} output: {reason}")]
    Serialise {
        format: &'static str,
        reason: String,
    },
    #[error("cannot write {}: {error}", path.display())]
    Write {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error(
        "route `{route}`: {what} cannot be written in sozu's configuration file; the agent \
         applies it over sozu's socket (run the agent beside sozu, or render --format k8s)"
    )]
    Unexpressible { route: String, what: String },
}

impl RenderError {
    /// Whether the workspace asks for what the output cannot hold (not an I/O failure).
    pub fn is_invalid_workspace(&self) -> bool {
        matches!(self, RenderError::Unexpressible { .. })
    }
}

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
                r.host, r.path_prefix
            )
        })
        .collect()
}

/// The normalised model, pretty-printed, with a trailing newline.
pub fn json(workspace: &Workspace) -> Result<String, RenderError> {
    let mut out =
        serde_json::to_string_pretty(workspace).map_err(|err| RenderError::Serialise {
            format: "json",
            reason: err.to_string(),
        })?;
    out.push('\n');
    Ok(out)
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

/// A complete sozu 2.3.3 configuration: listeners, one cluster per route with its HTTPS frontend
/// (and the host's certificate, from `<tls_dir>/<host>/`), an HTTP frontend that redirects to
/// HTTPS, and its backends. DNS upstreams are written as `name:port`, which sozu resolves once
/// when it loads the file; the live agent re-resolves them instead. Error pages are written in
/// the file, as the agent sends them (`pages`, read and checked by
/// [`crate::sources::policy_files::pages`]), so the file works from whichever directory sozu
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
    // The timeouts are written when they differ from sozu's defaults, which are the workspace's.
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
    #[serde(skip_serializing_if = "Option::is_none")]
    hsts: Option<SozuHsts>,
    /// The workspace's error pages, whole.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    answers: BTreeMap<String, String>,
}

fn is_false(b: &bool) -> bool {
    !b
}

impl SozuListener {
    fn new(protocol: Protocol, address: SocketAddr, policy: &ListenerPolicy) -> SozuListener {
        let defaults = ListenerTimeouts::default();
        let differs = |value: u32, default: u32| (value != default).then_some(value);
        let https = protocol == Protocol::Https;
        let auth = &policy.client_auth;
        let client_auth = https && auth.mode != ClientAuthMode::Off;
        SozuListener {
            protocol: match protocol {
                Protocol::Https => "https",
                Protocol::Http => "http",
            },
            address,
            interface: policy.interface.clone(),
            expect_proxy: policy.expect_proxy,
            front_timeout: differs(policy.timeouts.front, defaults.front),
            back_timeout: differs(policy.timeouts.back, defaults.back),
            connect_timeout: differs(policy.timeouts.connect, defaults.connect),
            request_timeout: differs(policy.timeouts.request, defaults.request),
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
            hsts: None,
            answers: BTreeMap::new(),
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
    https_redirect: bool,
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
    frontends: Vec<SozuFrontend>,
    backends: Vec<SozuBackend>,
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
}

impl SozuConfig {
    /// From the same desired state the live agent applies ([`desired::routes`]), with DNS names
    /// left for sozu to resolve and each HTTPS frontend naming its host's certificate files.
    fn from_workspace(
        workspace: &Workspace,
        pages: &PolicyFiles,
        settings: &SozuSettings,
    ) -> Result<SozuConfig, RenderError> {
        let mut desired = desired::routes(workspace, Names::AsWritten);
        desired::policies(&mut desired, workspace, pages);
        let mut clusters: BTreeMap<String, SozuCluster> = desired
            .clusters
            .iter()
            .map(|(id, backends)| {
                let backends = backends
                    .values()
                    .map(|backend| {
                        let weight = backend.weight;
                        match &backend.address {
                            Address::Unix(path) => SozuBackend {
                                address: UNIX_BACKEND_IDENTITY.to_string(),
                                weight,
                                unix_path: Some(path_string(path)),
                            },
                            other => SozuBackend {
                                address: other.to_string(),
                                weight,
                                unix_path: None,
                            },
                        }
                    })
                    .collect();
                let policy = desired.cluster_policies.get(id);
                let cluster = SozuCluster {
                    protocol: "http",
                    https_redirect: true,
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
                Protocol::Http => (None, None),
            };
            let policy = frontend.policy.as_deref();
            let redirect = match policy.and_then(|p| p.redirect) {
                None => None,
                Some((301, scheme)) => Some(scheme),
                Some((status, _)) => {
                    return Err(RenderError::Unexpressible {
                        route: format!("{}{}", frontend.hostname, frontend.path_prefix),
                        what: format!(
                            "redirect.status {status} (sozu's file knows the 301 redirect only)"
                        ),
                    })
                }
            };
            cluster.frontends.push(SozuFrontend {
                address: frontend.address,
                hostname: frontend.hostname.clone(),
                path: frontend.path_prefix.clone(),
                path_type: "PREFIX",
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
                rewrite_host: policy.and_then(|p| p.rewrite_host.clone()),
                rewrite_path: policy.and_then(|p| p.rewrite_path.clone()),
                rewrite_port: policy.and_then(|p| p.rewrite_port),
                required_auth: policy.is_some_and(|p| p.required_auth),
                headers: policy
                    .map(|p| {
                        p.headers
                            .iter()
                            .map(|h| SozuHeader {
                                position: if h.response { "response" } else { "request" },
                                key: h.name.clone(),
                                value: h.value.clone(),
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
            });
        }
        let listener = |address: &SocketAddr| {
            desired
                .listeners
                .get(address)
                .map(|&protocol| SozuListener {
                    hsts: match protocol {
                        Protocol::Https => desired.hsts.as_ref().map(SozuHsts::of),
                        Protocol::Http => None,
                    },
                    answers: desired
                        .listener_answers
                        .iter()
                        .map(|(s, page)| (s.clone(), page.to_string()))
                        .collect(),
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
            activate_listeners: true,
            listeners: [workspace.listeners.https, workspace.listeners.http]
                .iter()
                .filter_map(listener)
                .collect(),
            clusters,
        })
    }
}

fn path_string(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

/// Replaces `path` with `contents` so that a reader sees the old file or the new one, never a
/// mix, and a failure leaves the old file untouched: write a temporary file in the same
/// directory, fsync it, rename it over `path`, fsync the directory. A new file gets mode 0644; an
/// existing one keeps its mode.
pub fn write_atomic(path: &Path, contents: &[u8]) -> Result<(), RenderError> {
    use std::os::unix::fs::PermissionsExt;

    let fail = |error| RenderError::Write {
        path: path.to_owned(),
        error: without_temporary_name(error),
    };
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let mode = match std::fs::metadata(path) {
        Ok(meta) => meta.permissions().mode() & 0o7777,
        Err(_) => 0o644,
    };
    let mut tmp = tempfile::Builder::new()
        .prefix(".private-ingress-")
        .tempfile_in(dir)
        .map_err(fail)?;
    tmp.write_all(contents).map_err(fail)?;
    tmp.as_file()
        .set_permissions(std::fs::Permissions::from_mode(mode))
        .map_err(fail)?;
    tmp.as_file().sync_all().map_err(fail)?;
    tmp.persist(path).map_err(|err| fail(err.error))?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(fail)
}

/// tempfile's errors end in the temporary file's name (`… at path "/dir/.private-ingress-x1"`),
/// a file the user never asked for; the path they gave is named already. tempfile keeps the
/// system's error only as text, so the text is cut.
fn without_temporary_name(error: std::io::Error) -> std::io::Error {
    let text = error.to_string();
    match text.rfind(" at path \"") {
        Some(at) if error.get_ref().is_some() => std::io::Error::new(error.kind(), &text[..at]),
        _ => error,
    }
}

#[cfg(test)]
mod tests {
    use crate::sozu_state::Probe;

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
        Route {
            id: crate::workspace::route_id(host, path),
            host: host.into(),
            path_prefix: path.into(),
            ..crate::workspace::test_route(host, upstream)
        }
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
       rewrite = {{ path = "/v2$PATH[0]" }} }},
    {{ host = "old.in.example.org", redirect = {{ scheme = 'http, host = "new.in.example.org", path = "/x$PATH[0]", port = 8080 }} }},
  ],
}}"#,
            tls = dir.path().join("tls").display(),
            page = page.display(),
        );
        let ws_path = dir.path().join("workspace.ncl");
        std::fs::write(&ws_path, text).unwrap();
        let ws = crate::contract::evaluate(&ws_path).unwrap();
        for route in &ws.routes {
            let (crt, key) = ws.certificate_paths(&route.host);
            std::fs::create_dir_all(crt.parent().unwrap()).unwrap();
            std::fs::write(&crt, "certificate").unwrap();
            std::fs::write(&key, "key").unwrap();
        }
        let tree = crate::imports::Root::of(&ws_path, None).unwrap();
        let pages = crate::sources::policy_files::pages(&ws, &tree).unwrap();
        let doc: toml::Table = sozu_toml(&ws, &pages, &SozuSettings::default())
            .unwrap()
            .parse()
            .unwrap();

        // What the live agent sends, with the files read as the agent reads them.
        let mut files = desired::PolicyFiles::default();
        files.pages.insert(
            page.clone(),
            crate::policy_files::parse_page(page_text.as_bytes(), &page, 503)
                .unwrap()
                .into(),
        );
        let mut live = desired::routes(&ws, Names::AsWritten);
        desired::policies(&mut live, &ws, &files);

        let mut checked = 0;
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

            let https = live
                .frontends
                .iter()
                .find(|f| f.cluster_id.as_deref() == Some(id) && f.protocol == Protocol::Https)
                .unwrap();
            let RequestType::AddHttpsFrontend(sent) =
                crate::sozu::request::to_request(&crate::plan::Op::AddFrontend(https.clone()))
                    .unwrap()
            else {
                panic!("{id}: not an HTTPS frontend request");
            };
            let from_file = requests
                .iter()
                .find_map(|r| match r {
                    RequestType::AddHttpsFrontend(f) => Some(f.clone()),
                    _ => None,
                })
                .unwrap();
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
            checked += 1;
        }
        assert_eq!(checked, 3);
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
        route.policy = Some(Box::new(crate::workspace::RoutePolicy {
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

    #[test]
    fn write_atomic_replaces_and_keeps_the_old_file_on_failure() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("out.toml");
        write_atomic(&target, b"one").unwrap();
        write_atomic(&target, b"two").unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"two");
        // A target whose directory does not exist fails and creates nothing.
        let missing = dir.path().join("nope/out.toml");
        assert!(write_atomic(&missing, b"x").is_err());
        let leftovers: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(leftovers.len(), 1, "no temporary file is left behind");
    }
}
