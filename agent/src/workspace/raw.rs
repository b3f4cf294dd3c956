//! The workspace as Nickel evaluates it, before normalisation: what the contract has checked,
//! field for field, in the shapes serde reads it into.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{
    ClientAuthMode, Eab, Http2Offer, LbProvider, Monitoring, PodResources, TlsRotation,
    UpstreamProtocol,
};
use crate::document::ReadinessMode;

/// A workspace as Nickel evaluates it, before normalisation.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawWorkspace {
    pub zone: String,
    pub listeners: RawListeners,
    pub tls_rotation: TlsRotation,
    pub cluster_issuer: String,
    pub tls_dir: String,
    pub routes: Vec<RawRoute>,
    /// Optional in the contract: absent from workspaces that are not deployed by `render`.
    pub lb_ip: Option<String>,
    /// Optional in the contract: absent, any source may connect.
    pub allowed_sources: Option<Vec<String>>,
    pub deploy: RawDeploy,
    /// Optional in the contract: read with `tls_rotation = 'sozu_managed` only.
    pub acme: Option<RawAcme>,
    /// The HSTS policy of every route that does not set its own; absent from a workspace
    /// evaluated by an older contract, which then gets the default.
    #[serde(default)]
    pub hsts: Option<RawHsts>,
    #[serde(default)]
    pub allow_special_upstream_addresses: bool,
    /// Absent from a workspace evaluated by an older contract, which then gets the defaults.
    #[serde(default)]
    pub traffic: Option<RawTraffic>,
    #[serde(default)]
    pub headers: Option<RawHeaders>,
    #[serde(default)]
    pub error_pages: Option<BTreeMap<String, String>>,
    /// Absent from a workspace evaluated by an older contract: none.
    #[serde(default)]
    pub certificates: Vec<RawCertificateFiles>,
    /// Routes in Traefik's dynamic configuration, served beside `routes`.
    #[serde(default)]
    pub traefik: Option<RawTraefik>,
}

/// One of `certificates`: paths as written (relative ones are the workspace directory's).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCertificateFiles {
    pub cert_file: String,
    pub key_file: String,
}

/// `traefik`: where Traefik's dynamic configuration is read from.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTraefik {
    pub directory: Option<String>,
    pub file: Option<String>,
    pub endpoint: Option<String>,
    /// A float for the same reason as [`RawRoute::port`].
    pub poll_interval: f64,
    pub entry_points: BTreeMap<String, RawEntryPoint>,
}

/// An entry point's kind: the contract turns the tags into strings (serde's untagged enums
/// cannot read an enum tag) and leaves ports numbers.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum RawEntryPoint {
    Port(f64),
    Listener(String),
}

/// `traffic`: where sozu's records arrive and where the access log goes.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTraffic {
    pub listen: String,
    pub senders: Vec<String>,
    pub access_log: RawAccessLog,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAccessLog {
    pub enabled: bool,
    pub path: Option<String>,
    pub query_string: bool,
}

/// `false`, or a policy.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum RawHsts {
    Switch(bool),
    Policy(RawHstsPolicy),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHstsPolicy {
    /// A float for the same reason as [`RawRoute::port`].
    pub max_age: f64,
    pub include_subdomains: bool,
    pub preload: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawUpstream {
    pub upstream: String,
    pub port: Option<f64>,
    pub weight: Option<f64>,
    #[serde(default)]
    pub drain: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHealth {
    pub mode: HealthMode,
    pub path: Option<String>,
    /// Floats for the same reason as [`RawRoute::port`].
    pub interval: f64,
    pub timeout: f64,
    pub healthy_threshold: f64,
    pub unhealthy_threshold: f64,
    #[serde(default)]
    pub accepted_statuses: Vec<RawStatus>,
    pub port: Option<f64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HealthMode {
    Http,
    Tcp,
}

/// An HTTP status (`200`) or an inclusive range of them (`"200-399"`).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum RawStatus {
    Code(f64),
    Range(String),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAcme {
    pub directory: String,
    pub email: Option<String>,
    pub profile: Option<String>,
    pub ca_bundle: Option<String>,
    pub eab: Option<Eab>,
    pub dns01: RawDns01,
    pub propagation: RawPropagation,
    pub state_dir: String,
}

/// Both providers' fields, all optional: the contract has already checked that the ones of the
/// chosen provider are there and no others.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDns01 {
    pub provider: Dns01Provider,
    pub server: Option<String>,
    pub zone: Option<String>,
    pub tsig_key_name: Option<String>,
    pub tsig_algorithm: Option<String>,
    pub tsig_secret_file: Option<String>,
    pub api_token_file: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Dns01Provider {
    Rfc2136,
    Cloudflare,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPropagation {
    pub nameservers: Option<Vec<String>>,
    /// A float for the same reason as [`RawRoute::port`].
    pub timeout: f64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDeploy {
    pub namespace: String,
    pub sozu_image: Option<String>,
    pub agent_image: Option<String>,
    #[serde(default)]
    pub readiness: ReadinessMode,
    #[serde(default)]
    pub load_balancer: RawLoadBalancer,
    /// A float for the same reason as [`RawRoute::port`]: the range is checked on the exact value.
    pub replicas: f64,
    pub resources: PodResources,
    pub service_monitor: bool,
    pub prometheus_rule: bool,
    pub grafana_dashboard: bool,
    /// Floats for the same reason as `replicas`.
    pub pre_stop_seconds: f64,
    pub termination_grace_period_seconds: f64,
    pub extra_egress_ports: Vec<f64>,
    pub monitoring: Monitoring,
    #[serde(default = "default_cluster_dns")]
    pub cluster_dns: Monitoring,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLoadBalancer {
    #[serde(default)]
    pub provider: LbProvider,
    pub class: Option<String>,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    pub node_ports: Option<RawNodePorts>,
}

/// Floats for the same reason as [`RawRoute::port`].
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawNodePorts {
    pub https: f64,
    pub http: f64,
}

/// CoreDNS as most distributions label it: what the contract defaults to.
pub(super) fn default_cluster_dns() -> Monitoring {
    Monitoring {
        namespace: "kube-system".to_owned(),
        pod_labels: BTreeMap::from([("k8s-app".to_owned(), "kube-dns".to_owned())]),
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawListeners {
    pub https: String,
    pub http: String,
    #[serde(default)]
    pub interface: Option<String>,
    pub min_tls_version: String,
    pub expect_proxy: bool,
    pub timeouts: RawListenerTimeouts,
    pub client_auth: RawClientAuth,
    /// Absent from a workspace evaluated by an older contract, which then gets the default.
    #[serde(default)]
    pub http2: Http2Offer,
}

/// Floats for the same reason as `replicas`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawListenerTimeouts {
    pub front: f64,
    pub back: f64,
    pub connect: f64,
    pub request: f64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawClientAuth {
    pub mode: ClientAuthMode,
    #[serde(default)]
    pub ca_file: Option<String>,
    pub crl_files: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRoute {
    pub host: String,
    /// One upstream (with `port`), or several in `upstreams`: the contract admits exactly one
    /// of the two forms.
    pub upstream: Option<String>,
    /// A float on purpose: nickel-lang-core's deserializer clamps out-of-range integers
    /// (70000 becomes 65535), so the range is checked here, on the exact value.
    pub port: Option<f64>,
    #[serde(default)]
    pub upstreams: Option<Vec<RawUpstream>>,
    pub path_prefix: String,
    /// The other ways of matching the path; the contract admits at most one path field (and
    /// `path_prefix` then holds its default, `/`).
    #[serde(default)]
    pub path_segment_prefix: Option<String>,
    #[serde(default)]
    pub path_exact: Option<String>,
    #[serde(default)]
    pub path_regex: Option<String>,
    #[serde(default)]
    pub method: Option<String>,
    #[serde(default)]
    pub match_headers: Option<Vec<RawHeaderMatch>>,
    #[serde(default)]
    pub health: Option<RawHealth>,
    #[serde(default)]
    pub drain: bool,
    #[serde(default)]
    pub hsts: Option<RawHsts>,
    #[serde(default)]
    pub redirect: Option<RawRedirect>,
    #[serde(default)]
    pub rewrite: Option<RawRewrite>,
    #[serde(default)]
    pub strip_prefix: bool,
    #[serde(default)]
    pub headers: Option<RawHeaders>,
    #[serde(default)]
    pub basic_auth: Option<RawBasicAuth>,
    #[serde(default)]
    pub limits: Option<RawLimits>,
    #[serde(default)]
    pub error_pages: Option<BTreeMap<String, String>>,
    /// How sozu carries the route's traffic; `'https` when absent.
    #[serde(default)]
    pub protocol: Option<RawProtocol>,
    /// The port of the ingress a route of another protocol listens on. A float for the reason
    /// [`RawRoute::port`] is.
    #[serde(default)]
    pub listen_port: Option<f64>,
    #[serde(default)]
    pub proxy_protocol: Option<bool>,
    /// A 'udp route's largest datagram, in bytes. A float for the reason [`RawRoute::port`] is.
    #[serde(default)]
    pub max_datagram_size: Option<f64>,
    /// A route of its own port open without a client certificate: see
    /// [`crate::workspace::StreamRoute::client_auth_exempt`].
    #[serde(default)]
    pub client_auth_exempt: Option<bool>,
    /// Absent: HTTP/1.1.
    #[serde(default)]
    pub upstream_protocol: Option<UpstreamProtocol>,
    /// Absent: not sticky.
    #[serde(default)]
    pub sticky: Option<bool>,
    /// Absent: round robin.
    #[serde(default)]
    pub balancing: Option<super::Balancing>,
}

/// One of a route's `match_headers`: the contract admits exactly one of the three tests.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHeaderMatch {
    pub name: String,
    #[serde(default)]
    pub exact: Option<String>,
    #[serde(default)]
    pub regex: Option<String>,
    #[serde(default)]
    pub present: Option<bool>,
}

/// A route's `protocol`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RawProtocol {
    Https,
    Tcp,
    TlsPassthrough,
    Udp,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRedirect {
    /// Floats for the same reason as [`RawRoute::port`].
    pub status: f64,
    pub scheme: RedirectScheme,
    pub host: Option<String>,
    pub path: Option<String>,
    pub port: Option<f64>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRewrite {
    /// `host` and `port` are refused by the contract (sozu 2.3.3 cannot rewrite either on a
    /// forwarded request), so only the path reaches the model.
    pub path: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHeaders {
    pub request: Option<RawHeaderEdits>,
    pub response: Option<RawHeaderEdits>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHeaderEdits {
    #[serde(default)]
    pub set: BTreeMap<String, String>,
    #[serde(default)]
    pub remove: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawBasicAuth {
    pub users_file: String,
    pub realm: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLimits {
    pub connections_per_ip: Option<f64>,
    pub connections_per_subnet: Option<f64>,
    pub retry_after: f64,
}

/// The scheme of a redirect's `Location`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RedirectScheme {
    Https,
    Http,
    /// The request's own.
    Same,
}

impl std::fmt::Display for RedirectScheme {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RedirectScheme::Https => "https",
            RedirectScheme::Http => "http",
            RedirectScheme::Same => "same",
        })
    }
}
