//! The validated workspace: what an operator declared, normalised and sorted.
//!
//! Pure: no I/O. The Nickel contract has already checked every field when a [`RawWorkspace`]
//! reaches [`Workspace::from_raw`]; the conversion still refuses anything it cannot represent
//! instead of trusting that, because the contract file and this code can drift apart.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::state::{HealthCheck, Hsts, Probe};

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
    pub sozu_image: String,
    pub agent_image: Option<String>,
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

/// CoreDNS as most distributions label it: what the contract defaults to.
fn default_cluster_dns() -> Monitoring {
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
    #[serde(default)]
    pub health: Option<RawHealth>,
    #[serde(default)]
    pub drain: bool,
    #[serde(default)]
    pub hsts: Option<RawHsts>,
}

/// How certificates reach `<tls_dir>/<host>/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TlsRotation {
    /// cert-manager's CSI driver mounts one volume per route.
    CsiDriver,
    /// cert-manager writes a Secret per route, mounted as a volume.
    Reloader,
    /// The agent obtains certificates itself, from an ACME CA over DNS-01 (the `acme` record).
    SozuManaged,
}

impl fmt::Display for TlsRotation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TlsRotation::CsiDriver => "csi_driver",
            TlsRotation::Reloader => "reloader",
            TlsRotation::SozuManaged => "sozu_managed",
        })
    }
}

/// The normalised workspace. Routes are sorted by (host, path_prefix), so every output derived
/// from it is deterministic whatever order the operator wrote them in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Workspace {
    pub zone: String,
    pub listeners: Listeners,
    pub tls_rotation: TlsRotation,
    pub cluster_issuer: String,
    pub tls_dir: PathBuf,
    pub routes: Vec<Route>,
    /// The address the load balancer announces, which every route host resolves to.
    pub lb_ip: Option<IpAddr>,
    /// The networks that may connect to the listeners; `None`: any address may.
    pub allowed_sources: Option<Vec<IpNet>>,
    /// Boxed: a workspace travels by value (in the sandbox's report, for one), and the deploy
    /// settings would more than double its size for code that never reads them.
    pub deploy: Box<Deploy>,
    /// How certificates are ordered, with `tls_rotation = 'sozu_managed` (and only then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acme: Option<Box<Acme>>,
    /// The HSTS policy of the HTTPS listener, which every route without its own follows;
    /// `None` (a workspace that sets none): no header. Off unless asked for, because sozu 2.3.3
    /// breaks the responses in flight on a session it closes while it adds the header: every
    /// soft stop (each pod deletion) and every drain that closes sessions would fail them.
    #[serde(default)]
    pub hsts: Option<Hsts>,
    /// Keep loopback, link-local, unspecified and multicast addresses in DNS answers for
    /// upstream names (dropped otherwise).
    #[serde(default)]
    pub allow_special_upstream_addresses: bool,
}

/// The policy `hsts = true` stands for, as the contract documents it: a year, this host only
/// (the zone may hold names this ingress does not serve over HTTPS), never preloaded (a private
/// zone cannot be on the public preload list).
pub fn recommended_hsts() -> Option<Hsts> {
    Some(Hsts {
        enabled: true,
        max_age: 31_536_000,
        include_subdomains: false,
        preload: false,
    })
}

/// The ACME client's settings. Secrets are paths: the agent reads them when it uses them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Acme {
    pub directory: String,
    pub email: Option<String>,
    pub profile: Option<String>,
    /// Roots that sign the ACME server's TLS certificate; the system's when absent.
    pub ca_bundle: Option<PathBuf>,
    pub eab: Option<Eab>,
    pub dns01: Dns01,
    pub propagation: Propagation,
    pub state_dir: PathBuf,
}

/// External account binding: the key id and the file holding the base64url HMAC key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Eab {
    pub kid: String,
    pub hmac_key_file: PathBuf,
}

/// Where DNS-01 TXT records are published.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "provider", rename_all = "snake_case")]
pub enum Dns01 {
    /// RFC 2136 dynamic updates signed with TSIG.
    Rfc2136 {
        server: SocketAddr,
        zone: String,
        tsig_key_name: String,
        tsig_algorithm: TsigAlgorithm,
        tsig_secret_file: PathBuf,
    },
    /// Cloudflare's v4 API, with an API token.
    Cloudflare { api_token_file: PathBuf },
}

/// The HMACs a TSIG key may use (the older ones are refused by the contract).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TsigAlgorithm {
    #[serde(rename = "hmac-sha256")]
    HmacSha256,
    #[serde(rename = "hmac-sha384")]
    HmacSha384,
    #[serde(rename = "hmac-sha512")]
    HmacSha512,
}

/// How long to wait for a TXT record to be visible, and on which servers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Propagation {
    /// Asked instead of the zone's authoritative servers, when set.
    pub nameservers: Option<Vec<SocketAddr>>,
    pub timeout_secs: u64,
}

/// How `render --format k8s` deploys the workspace. The defaults live in the contract, where
/// operators read them; [`Deploy::default`] repeats them for code that builds a workspace without
/// evaluating one, and a test keeps the two equal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Deploy {
    pub namespace: String,
    pub sozu_image: String,
    pub agent_image: String,
    pub replicas: u16,
    pub resources: PodResources,
    /// A prometheus-operator ServiceMonitor instead of `prometheus.io/*` scrape annotations.
    pub service_monitor: bool,
    /// A prometheus-operator PrometheusRule with the agent's alert rules.
    pub prometheus_rule: bool,
    /// A ConfigMap holding the Grafana dashboard, labelled for Grafana's dashboard sidecar.
    pub grafana_dashboard: bool,
    /// How long sozu keeps accepting once the pod is deleted, before it is asked to stop: the
    /// time the load balancer takes to stop sending it connections.
    pub pre_stop_seconds: u32,
    /// From the deletion to the kill: the preStop wait, then sozu's soft stop.
    pub termination_grace_period_seconds: u32,
    /// Ports the pods may connect to besides the routes' upstream ports.
    pub extra_egress_ports: Vec<u16>,
    /// Who may reach the admin port.
    pub monitoring: Monitoring,
    /// The cluster's DNS pods, which the pods may ask names of.
    pub cluster_dns: Monitoring,
}

/// Pods by namespace and labels: those allowed to reach the admin port (`/metrics`,
/// `/v1/state`, which name every host), and the cluster's DNS pods.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Monitoring {
    pub namespace: String,
    /// Empty: every pod of the namespace.
    #[serde(default)]
    pub pod_labels: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PodResources {
    pub sozu: ContainerResources,
    pub agent: ContainerResources,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContainerResources {
    pub requests: Quantities,
    pub limits: Quantities,
}

/// Kubernetes quantities, as written (`250m`, `128Mi`): the contract checked their syntax.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Quantities {
    pub cpu: String,
    pub memory: String,
}

/// The agent image when the workspace names none: the version that renders the manifests is the
/// version that runs them.
pub fn default_agent_image() -> String {
    format!("private-ingress:{}", env!("CARGO_PKG_VERSION"))
}

impl Default for Deploy {
    fn default() -> Self {
        let quantities = |cpu: &str, memory: &str| Quantities {
            cpu: cpu.to_owned(),
            memory: memory.to_owned(),
        };
        Deploy {
            namespace: "ingress-private".to_owned(),
            sozu_image: "docker.io/clevercloud/sozu:2.3.3".to_owned(),
            agent_image: default_agent_image(),
            replicas: 2,
            resources: PodResources {
                sozu: ContainerResources {
                    requests: quantities("100m", "128Mi"),
                    limits: quantities("1", "512Mi"),
                },
                agent: ContainerResources {
                    requests: quantities("50m", "128Mi"),
                    limits: quantities("1", "512Mi"),
                },
            },
            service_monitor: false,
            prometheus_rule: false,
            grafana_dashboard: false,
            pre_stop_seconds: 10,
            termination_grace_period_seconds: 40,
            extra_egress_ports: Vec::new(),
            monitoring: Monitoring {
                namespace: "monitoring".to_owned(),
                pod_labels: BTreeMap::new(),
            },
            cluster_dns: default_cluster_dns(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Listeners {
    pub https: SocketAddr,
    pub http: SocketAddr,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Route {
    /// Stable identifier of the route, used as sozu's cluster id. Derived from (host, path_prefix)
    /// only, so editing a route's upstream updates the cluster in place.
    pub id: String,
    pub host: String,
    pub path_prefix: String,
    /// At least one; a route written with `upstream` and `port` has exactly one, of weight 1.
    pub upstreams: Vec<RouteUpstream>,
    /// sozu's active health check on the route's backends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<HealthCheck>,
    /// The route's own HSTS policy, overriding the workspace's; `None` follows the workspace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hsts: Option<Hsts>,
}

/// One upstream of a route, with its share of the traffic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteUpstream {
    pub upstream: Upstream,
    pub weight: u32,
    /// Out of rotation: no new request goes to it, the ones in flight finish. The route's own
    /// `drain` drains every upstream.
    pub drain: bool,
}

impl Route {
    /// The route's upstreams that are names to resolve.
    pub fn upstream_names(&self) -> impl Iterator<Item = &str> {
        self.upstreams.iter().filter_map(|u| match &u.upstream {
            Upstream::Dns { name, .. } => Some(name.as_str()),
            _ => None,
        })
    }

    /// How the route's upstreams read in status: `a:80`, or `a:80 (×9), b:80 (×1, drained)`.
    pub fn upstreams_label(&self) -> String {
        if let [only] = &self.upstreams[..] {
            if only.weight == 1 && !only.drain {
                return only.upstream.to_string();
            }
        }
        self.upstreams
            .iter()
            .map(|u| {
                let drain = if u.drain { ", drained" } else { "" };
                format!("{} (×{}{drain})", u.upstream, u.weight)
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Where a route's traffic goes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Upstream {
    /// A DNS name, resolved (and re-resolved) to every A and AAAA address.
    Dns { name: String, port: u16 },
    /// An IP literal.
    Ip { address: SocketAddr },
    /// A UNIX socket; the path is absolute.
    Unix { path: PathBuf },
}

impl fmt::Display for Upstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Upstream::Dns { name, port } => write!(f, "{name}:{port}"),
            Upstream::Ip { address } => write!(f, "{address}"),
            Upstream::Unix { path } => write!(f, "unix://{}", path.display()),
        }
    }
}

/// Prefix of every cluster id the agent creates: the mark of what it owns in sozu.
pub const ID_PREFIX: &str = "pi-";

/// A value the contract let through but the model cannot represent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelError {
    #[error("listener `{field}`: `{value}` is not a socket address")]
    Listener { field: &'static str, value: String },
    #[error("route `{host}`: {reason}")]
    Route { host: String, reason: String },
    #[error("tls_dir `{0}` is not an absolute path")]
    TlsDir(String),
    #[error("lb_ip `{0}` is not an IP address")]
    LbIp(String),
    #[error("deploy.replicas {0} is not a whole number from 1 to 1000")]
    Replicas(String),
    #[error("deploy.{field} {value} is not a whole number of seconds from 0 to 3600")]
    Seconds { field: &'static str, value: String },
    #[error("deploy.extra_egress_ports: {0} is not a whole number from 1 to 65535")]
    EgressPort(String),
    #[error("allowed_sources: `{0}` is not a network in canonical CIDR form")]
    Cidr(String),
    #[error(
        "deploy.termination_grace_period_seconds {grace} must be longer than \
         deploy.pre_stop_seconds {pre_stop}"
    )]
    GracePeriod { grace: u32, pre_stop: u32 },
    #[error("acme.{field}: {reason}")]
    Acme { field: &'static str, reason: String },
    #[error("hsts: {0}")]
    Hsts(String),
}

impl Workspace {
    pub fn from_raw(raw: RawWorkspace) -> Result<Workspace, ModelError> {
        let listener = |field: &'static str, value: &str| {
            value
                .parse::<SocketAddr>()
                .map_err(|_| ModelError::Listener {
                    field,
                    value: value.to_owned(),
                })
        };
        let listeners = Listeners {
            https: listener("https", &raw.listeners.https)?,
            http: listener("http", &raw.listeners.http)?,
        };
        let tls_dir = PathBuf::from(&raw.tls_dir);
        if !tls_dir.is_absolute() {
            return Err(ModelError::TlsDir(raw.tls_dir));
        }
        let mut routes = raw
            .routes
            .into_iter()
            .map(Route::from_raw)
            .collect::<Result<Vec<_>, _>>()?;
        routes.sort_by(|a, b| (&a.host, &a.path_prefix).cmp(&(&b.host, &b.path_prefix)));
        let lb_ip = raw
            .lb_ip
            .map(|ip| ip.parse::<IpAddr>().map_err(|_| ModelError::LbIp(ip)))
            .transpose()?;
        let replicas = match raw.deploy.replicas {
            n if n.fract() == 0.0 && (1.0..=1000.0).contains(&n) => n as u16,
            n => return Err(ModelError::Replicas(n.to_string())),
        };
        let seconds = |field: &'static str, n: f64| match n {
            n if n.fract() == 0.0 && (0.0..=3600.0).contains(&n) => Ok(n as u32),
            n => Err(ModelError::Seconds {
                field,
                value: n.to_string(),
            }),
        };
        let allowed_sources = raw
            .allowed_sources
            .map(|sources| {
                sources
                    .into_iter()
                    .map(|cidr| match cidr.parse::<IpNet>() {
                        Ok(net) if net.trunc() == net => Ok(net),
                        _ => Err(ModelError::Cidr(cidr)),
                    })
                    .collect::<Result<Vec<_>, _>>()
            })
            .transpose()?;
        let deploy = Box::new(Deploy {
            namespace: raw.deploy.namespace,
            sozu_image: raw.deploy.sozu_image,
            agent_image: raw.deploy.agent_image.unwrap_or_else(default_agent_image),
            replicas,
            resources: raw.deploy.resources,
            service_monitor: raw.deploy.service_monitor,
            prometheus_rule: raw.deploy.prometheus_rule,
            grafana_dashboard: raw.deploy.grafana_dashboard,
            pre_stop_seconds: seconds("pre_stop_seconds", raw.deploy.pre_stop_seconds)?,
            termination_grace_period_seconds: seconds(
                "termination_grace_period_seconds",
                raw.deploy.termination_grace_period_seconds,
            )?,
            extra_egress_ports: raw
                .deploy
                .extra_egress_ports
                .into_iter()
                .map(|p| match p {
                    p if p.fract() == 0.0 && (1.0..=65535.0).contains(&p) => Ok(p as u16),
                    p => Err(ModelError::EgressPort(p.to_string())),
                })
                .collect::<Result<_, _>>()?,
            monitoring: raw.deploy.monitoring,
            cluster_dns: raw.deploy.cluster_dns,
        });
        if deploy.termination_grace_period_seconds <= deploy.pre_stop_seconds {
            return Err(ModelError::GracePeriod {
                grace: deploy.termination_grace_period_seconds,
                pre_stop: deploy.pre_stop_seconds,
            });
        }
        let acme = raw.acme.map(Acme::from_raw).transpose()?.map(Box::new);
        let hsts = match raw.hsts {
            None => None,
            Some(hsts) => hsts_from_raw(hsts).map_err(ModelError::Hsts)?,
        };
        Ok(Workspace {
            zone: raw.zone,
            listeners,
            tls_rotation: raw.tls_rotation,
            cluster_issuer: raw.cluster_issuer,
            tls_dir,
            routes,
            lb_ip,
            allowed_sources,
            deploy,
            acme,
            hsts,
            allow_special_upstream_addresses: raw.allow_special_upstream_addresses,
        })
    }

    /// Where the certificate chain and key of `host` live.
    pub fn certificate_paths(&self, host: &str) -> (PathBuf, PathBuf) {
        let dir = self.tls_dir.join(host);
        (dir.join("tls.crt"), dir.join("tls.key"))
    }
}

/// A DNS server as the contract admits it: an IP address, with a port unless it is 53.
pub fn dns_server(s: &str) -> Option<SocketAddr> {
    s.parse::<SocketAddr>()
        .ok()
        .or_else(|| s.parse::<IpAddr>().ok().map(|ip| SocketAddr::new(ip, 53)))
}

impl Acme {
    fn from_raw(raw: RawAcme) -> Result<Acme, ModelError> {
        let fail = |field: &'static str, reason: &str| ModelError::Acme {
            field,
            reason: reason.to_owned(),
        };
        let absolute = |field: &'static str, path: String| {
            let path = PathBuf::from(path);
            if path.is_absolute() {
                Ok(path)
            } else {
                Err(fail(field, "not an absolute path"))
            }
        };
        let d = raw.dns01;
        let dns01 = match d.provider {
            Dns01Provider::Rfc2136 => {
                let server = d.server.as_deref().unwrap_or_default();
                Dns01::Rfc2136 {
                    server: dns_server(server)
                        .ok_or_else(|| fail("dns01.server", "not a DNS server address"))?,
                    zone: d.zone.ok_or_else(|| fail("dns01.zone", "missing"))?,
                    tsig_key_name: d
                        .tsig_key_name
                        .ok_or_else(|| fail("dns01.tsig_key_name", "missing"))?,
                    tsig_algorithm: match d.tsig_algorithm.as_deref() {
                        None | Some("hmac-sha256") => TsigAlgorithm::HmacSha256,
                        Some("hmac-sha384") => TsigAlgorithm::HmacSha384,
                        Some("hmac-sha512") => TsigAlgorithm::HmacSha512,
                        Some(_) => return Err(fail("dns01.tsig_algorithm", "unsupported")),
                    },
                    tsig_secret_file: absolute(
                        "dns01.tsig_secret_file",
                        d.tsig_secret_file.unwrap_or_default(),
                    )?,
                }
            }
            Dns01Provider::Cloudflare => Dns01::Cloudflare {
                api_token_file: absolute(
                    "dns01.api_token_file",
                    d.api_token_file.unwrap_or_default(),
                )?,
            },
        };
        let nameservers = raw
            .propagation
            .nameservers
            .map(|servers| {
                servers
                    .iter()
                    .map(|s| {
                        dns_server(s).ok_or_else(|| {
                            fail("propagation.nameservers", "not a DNS server address")
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()
            })
            .transpose()?;
        let timeout = raw.propagation.timeout;
        if timeout.fract() != 0.0 || !(1.0..=3600.0).contains(&timeout) {
            return Err(fail(
                "propagation.timeout",
                "not a whole number of seconds from 1 to 3600",
            ));
        }
        Ok(Acme {
            directory: raw.directory,
            email: raw.email,
            profile: raw.profile,
            ca_bundle: raw
                .ca_bundle
                .map(|p| absolute("ca_bundle", p))
                .transpose()?,
            eab: raw.eab,
            dns01,
            propagation: Propagation {
                nameservers,
                timeout_secs: timeout as u64,
            },
            state_dir: absolute("state_dir", raw.state_dir)?,
        })
    }
}

impl Route {
    fn from_raw(raw: RawRoute) -> Result<Route, ModelError> {
        let fail = |reason: String| ModelError::Route {
            host: raw.host.clone(),
            reason,
        };
        let upstreams = match (&raw.upstream, &raw.upstreams) {
            (Some(upstream), None) => vec![RouteUpstream {
                upstream: upstream_from_raw(upstream, raw.port).map_err(fail)?,
                weight: 1,
                drain: raw.drain,
            }],
            (None, Some(list)) if !list.is_empty() => {
                if raw.port.is_some() {
                    return Err(fail("`port` goes inside each of `upstreams`".into()));
                }
                list.iter()
                    .map(|u| {
                        let weight = match u.weight {
                            None => 1,
                            // sozu's configuration file holds a weight in a byte.
                            Some(w) if w.fract() == 0.0 && (1.0..=255.0).contains(&w) => w as u32,
                            Some(w) => {
                                return Err(fail(format!(
                                    "weight {w} of upstream `{}` is not a whole number from 1 to \
                                     255 (drain an upstream with `drain = true`)",
                                    u.upstream
                                )))
                            }
                        };
                        Ok(RouteUpstream {
                            upstream: upstream_from_raw(&u.upstream, u.port).map_err(fail)?,
                            weight,
                            drain: u.drain || raw.drain,
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()?
            }
            (None, Some(_)) => return Err(fail("`upstreams` is empty".into())),
            (Some(_), Some(_)) => {
                return Err(fail("give `upstream` or `upstreams`, not both".into()))
            }
            (None, None) => return Err(fail("missing `upstream` (or `upstreams`)".into())),
        };
        let mut seen = std::collections::BTreeSet::new();
        for u in &upstreams {
            if !seen.insert(u.upstream.to_string()) {
                return Err(fail(format!("upstream `{}` is given twice", u.upstream)));
            }
        }
        if upstreams
            .iter()
            .filter(|u| matches!(u.upstream, Upstream::Unix { .. }))
            .count()
            > 1
        {
            return Err(fail("at most one `unix://` upstream per route".into()));
        }
        let health = raw
            .health
            .map(health_from_raw)
            .transpose()
            .map_err(|e| fail(format!("health: {e}")))?;
        let hsts = match raw.hsts {
            None => None,
            Some(hsts) => Some(
                hsts_from_raw(hsts)
                    .map_err(|e| fail(format!("hsts: {e}")))?
                    .unwrap_or(Hsts::OFF),
            ),
        };
        Ok(Route {
            id: route_id(&raw.host, &raw.path_prefix),
            host: raw.host,
            path_prefix: raw.path_prefix,
            upstreams,
            health,
            hsts,
        })
    }
}

/// One upstream as written: a DNS name or an IP literal with a port, or a `unix://` path.
fn upstream_from_raw(upstream: &str, port: Option<f64>) -> Result<Upstream, String> {
    let port = match port {
        None => None,
        Some(p) if p.fract() == 0.0 && (1.0..=65535.0).contains(&p) => Some(p as u16),
        Some(p) => return Err(format!("port {p} is not a whole number from 1 to 65535")),
    };
    Ok(match (upstream.strip_prefix("unix://"), port) {
        (Some(path), None) if path.starts_with('/') => Upstream::Unix {
            path: PathBuf::from(path),
        },
        (Some(_), None) => return Err("a unix upstream needs an absolute path".into()),
        (Some(_), Some(_)) => return Err("a unix upstream takes no port".into()),
        (None, None) => return Err(format!("upstream `{upstream}` needs a port")),
        (None, Some(port)) => match upstream.parse::<IpAddr>() {
            Ok(ip) => Upstream::Ip {
                address: SocketAddr::new(ip, port),
            },
            Err(_) => Upstream::Dns {
                name: upstream.to_owned(),
                port,
            },
        },
    })
}

/// A whole number within `range`, or why not.
fn whole(field: &str, n: f64, range: std::ops::RangeInclusive<f64>) -> Result<u32, String> {
    if n.fract() == 0.0 && range.contains(&n) {
        Ok(n as u32)
    } else {
        Err(format!(
            "{field} {n} is not a whole number from {} to {}",
            range.start(),
            range.end()
        ))
    }
}

fn health_from_raw(raw: RawHealth) -> Result<HealthCheck, String> {
    let probe = match raw.mode {
        HealthMode::Http => {
            let path = raw.path.unwrap_or_else(|| "/".to_owned());
            if !path.starts_with('/') {
                return Err(format!("path `{path}` does not start with `/`"));
            }
            let accepted_statuses = raw
                .accepted_statuses
                .iter()
                .map(|s| {
                    let (start, end) = match s {
                        RawStatus::Code(code) => (*code, *code),
                        RawStatus::Range(range) => {
                            let parsed = range.split_once('-').and_then(|(a, b)| {
                                Some((a.trim().parse::<f64>().ok()?, b.trim().parse::<f64>().ok()?))
                            });
                            parsed.ok_or_else(|| {
                                format!("accepted status `{range}` is not a range like `200-399`")
                            })?
                        }
                    };
                    let start = whole("accepted status", start, 100.0..=599.0)?;
                    let end = whole("accepted status", end, 100.0..=599.0)?;
                    if start > end {
                        return Err(format!("accepted statuses {start}-{end} are backwards"));
                    }
                    Ok((start as u16, end as u16))
                })
                .collect::<Result<Vec<_>, _>>()?;
            Probe::Http {
                path,
                accepted_statuses,
            }
        }
        HealthMode::Tcp => {
            if raw.path.is_some() || !raw.accepted_statuses.is_empty() {
                return Err("a tcp health check takes no `path` or `accepted_statuses`".into());
            }
            Probe::Tcp
        }
    };
    let interval = whole("interval", raw.interval, 1.0..=3600.0)?;
    let timeout = whole("timeout", raw.timeout, 1.0..=3600.0)?;
    if timeout > interval {
        return Err(format!(
            "timeout {timeout} is longer than interval {interval}"
        ));
    }
    Ok(HealthCheck {
        probe,
        interval,
        timeout,
        healthy_threshold: whole("healthy_threshold", raw.healthy_threshold, 1.0..=100.0)?,
        unhealthy_threshold: whole("unhealthy_threshold", raw.unhealthy_threshold, 1.0..=100.0)?,
        port: raw
            .port
            .map(|p| whole("port", p, 1.0..=65535.0).map(|p| p as u16))
            .transpose()?,
    })
}

/// A policy, or `None` for `false`. `true` is the default policy.
fn hsts_from_raw(raw: RawHsts) -> Result<Option<Hsts>, String> {
    match raw {
        RawHsts::Switch(false) => Ok(None),
        RawHsts::Switch(true) => Ok(recommended_hsts()),
        RawHsts::Policy(p) => Ok(Some(Hsts {
            enabled: true,
            max_age: whole("max_age", p.max_age, 0.0..=4_294_967_295.0)?,
            include_subdomains: p.include_subdomains,
            preload: p.preload,
        })),
    }
}

/// `pi-<host>` for the root path, `pi-<host>-<8 hex digits of SHA-256(path)>` otherwise: readable
/// in `sozu` listings, and free of the characters a path may hold.
pub fn route_id(host: &str, path_prefix: &str) -> String {
    if path_prefix == "/" {
        format!("{ID_PREFIX}{host}")
    } else {
        use sha2::Digest;
        let digest = sha2::Sha256::digest(path_prefix.as_bytes());
        let short: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
        format!("{ID_PREFIX}{host}-{short}")
    }
}

/// A route at `/` of `host`, for unit tests elsewhere in the crate.
#[cfg(test)]
pub(crate) fn test_route(host: &str, upstream: Upstream) -> Route {
    Route {
        id: route_id(host, "/"),
        host: host.into(),
        path_prefix: "/".into(),
        upstreams: vec![RouteUpstream {
            upstream,
            weight: 1,
            drain: false,
        }],
        health: None,
        hsts: None,
    }
}

/// A workspace for unit tests elsewhere in the crate: zone `in.example.org`, loopback listeners
/// 8443/8080, the given tls dir and routes.
#[cfg(test)]
pub(crate) fn test_workspace(tls_dir: &std::path::Path, routes: Vec<Route>) -> Workspace {
    Workspace {
        zone: "in.example.org".into(),
        listeners: Listeners {
            https: SocketAddr::from(([127, 0, 0, 1], 8443)),
            http: SocketAddr::from(([127, 0, 0, 1], 8080)),
        },
        tls_rotation: TlsRotation::CsiDriver,
        cluster_issuer: "ca".into(),
        tls_dir: tls_dir.to_owned(),
        routes,
        lb_ip: None,
        allowed_sources: None,
        deploy: Default::default(),
        acme: None,
        hsts: None,
        allow_special_upstream_addresses: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw_route(host: &str, upstream: &str, port: Option<f64>, path: &str) -> RawRoute {
        RawRoute {
            host: host.into(),
            upstream: Some(upstream.into()),
            port,
            upstreams: None,
            path_prefix: path.into(),
            health: None,
            drain: false,
            hsts: None,
        }
    }

    #[test]
    fn upstream_kinds_are_told_apart() {
        let dns = Route::from_raw(raw_route("a.z", "svc.ns.svc", Some(80.0), "/")).unwrap();
        assert_eq!(
            dns.upstreams[0].upstream,
            Upstream::Dns {
                name: "svc.ns.svc".into(),
                port: 80
            }
        );
        let v6 = Route::from_raw(raw_route("a.z", "fd00::1", Some(8080.0), "/")).unwrap();
        assert_eq!(v6.upstreams[0].upstream.to_string(), "[fd00::1]:8080");
        let unix = Route::from_raw(raw_route("a.z", "unix:///run/a.sock", None, "/")).unwrap();
        assert_eq!(unix.upstreams[0].upstream.to_string(), "unix:///run/a.sock");
    }

    #[test]
    fn out_of_range_ports_are_refused_not_clamped() {
        for port in [0.0, 65536.0, 70000.0, -5.0, 3000.5] {
            let err = Route::from_raw(raw_route("a.z", "svc", Some(port), "/")).unwrap_err();
            assert!(err.to_string().contains("port"), "{port}: {err}");
        }
    }

    #[test]
    fn route_ids_are_stable_and_distinct_per_path() {
        assert_eq!(route_id("a.z", "/"), "pi-a.z");
        let api = route_id("a.z", "/api");
        assert!(api.starts_with("pi-a.z-") && api.len() == "pi-a.z-".len() + 8);
        assert_ne!(route_id("a.z", "/a-b"), route_id("a.z", "/a/b"));
        assert_eq!(api, route_id("a.z", "/api"));
    }
}
