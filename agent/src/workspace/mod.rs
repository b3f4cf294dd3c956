//! The validated workspace: what an operator declared, normalised and sorted.
//!
//! Pure: no I/O. The Nickel contract has already checked every field when a [`RawWorkspace`]
//! reaches [`Workspace::from_raw`]; the conversion still refuses anything it cannot represent
//! instead of trusting that, because the contract file and this code can drift apart.

mod convert;
mod listener_policy;
mod matching;
mod raw;
mod route;
mod route_policy;
pub mod traefik;

pub use convert::{dns_server, ModelError};
pub use listener_policy::*;
pub use matching::regex_problem;
pub use raw::*;
pub use route::*;
pub use route_policy::*;
pub use traefik::{TraefikLive, TraefikSettings};

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::document::ReadinessMode;

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
    /// Boxed for the reason `deploy` is.
    #[serde(default)]
    pub listener_policy: Box<ListenerPolicy>,
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
    /// Where sozu's per-request records arrive, and the access log made of them. Boxed, as
    /// `deploy` is: the loop never reads it.
    #[serde(default)]
    pub traffic: Box<Traffic>,
    /// Header edits of every route, before each route's own. Boxed for the reason `deploy` is.
    #[serde(default, skip_serializing_if = "HeaderPolicy::is_empty")]
    pub headers: Box<HeaderPolicy>,
    /// Error pages of every route that sets none for a status, and of sozu's own answers (the
    /// 404 of an unknown host): the listeners' answers.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub error_pages: BTreeMap<u16, PathBuf>,
    /// Certificate pairs named by path (`certificates`), each served for every route host its
    /// certificate covers, in place of the host's pair in the tls dir. A list any source of
    /// routes may add to (Traefik's `tls.certificates`), in order: the first pair that names a
    /// host exactly wins, else the first whose wildcard covers it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub certificates: Vec<CertificateFiles>,
    /// The `traefik` record: where routes in Traefik's dynamic configuration are read from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traefik: Option<Box<TraefikSettings>>,
    /// What the Traefik source added to `routes` and what it refused ([`crate::translate::traefik::join::merge`]);
    /// `None` in a workspace as evaluated, before any merge.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traefik_live: Option<Box<TraefikLive>>,
}

/// A certificate pair named by path: the chain (leaf first) and its private key, absolute once
/// the workspace is evaluated (relative paths are the workspace directory's).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct CertificateFiles {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

/// sozu's access-log stream as the agent receives it (see [`crate::traffic`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Traffic {
    /// The UDP address the agent receives records on.
    pub listen: SocketAddr,
    /// Sources accepted besides loopback addresses.
    pub senders: Vec<IpAddr>,
    pub access_log: AccessLog,
}

/// The JSON access log: one object per request.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccessLog {
    pub enabled: bool,
    /// `None`: the agent's standard output.
    pub path: Option<PathBuf>,
    /// Log the query string (off by default: it carries tokens).
    pub query_string: bool,
}

/// The contract's default listen address, repeated for code that builds a workspace without
/// evaluating one; a test keeps the two equal.
pub const DEFAULT_TRAFFIC_LISTEN: SocketAddr =
    SocketAddr::new(IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 9181);

impl Default for Traffic {
    fn default() -> Self {
        Traffic {
            listen: DEFAULT_TRAFFIC_LISTEN,
            senders: Vec::new(),
            access_log: AccessLog {
                enabled: true,
                path: None,
                query_string: false,
            },
        }
    }
}

impl Traffic {
    /// Where sozu is told to send its records: the listen address, with loopback for an
    /// unspecified address (sozu runs beside the agent).
    pub fn target(&self) -> SocketAddr {
        let ip = match self.listen.ip() {
            IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
            IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(std::net::Ipv6Addr::LOCALHOST),
            ip => ip,
        };
        SocketAddr::new(ip, self.listen.port())
    }

    /// Whether a record from `source` is taken: loopback, or a sender the workspace names.
    pub fn accepts(&self, source: IpAddr) -> bool {
        let source = source.to_canonical();
        source.is_loopback() || self.senders.contains(&source)
    }
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
    /// The images as pushed and pinned: `render --format k8s` needs both, since neither is
    /// published under a name it could default to.
    pub sozu_image: Option<String>,
    pub agent_image: Option<String>,
    /// What the pods' readiness waits for (`run --readiness`).
    pub readiness: ReadinessMode,
    pub load_balancer: LoadBalancer,
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

/// How the pods are reached: which load balancer gives the Service `lb_ip`, or a NodePort.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoadBalancer {
    pub provider: LbProvider,
    /// With [`LbProvider::Class`]: the Service's `loadBalancerClass`.
    pub class: Option<String>,
    /// Added to the Service's annotations.
    pub annotations: BTreeMap<String, String>,
    /// With [`LbProvider::NodePort`]: the node ports of the https and http listeners.
    pub node_ports: Option<NodePorts>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LbProvider {
    /// Cilium's LB-IPAM (`lbipam.cilium.io/ips`).
    #[default]
    Cilium,
    /// MetalLB (`metallb.io/loadBalancerIPs`).
    Metallb,
    /// kube-vip (`kube-vip.io/loadbalancerIPs`).
    KubeVip,
    /// A `loadBalancerClass` of the workspace's choosing, with its own annotations.
    Class,
    /// A NodePort Service: the load balancer in front of the nodes is the user's.
    NodePort,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodePorts {
    pub https: u16,
    pub http: u16,
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

impl Default for Deploy {
    fn default() -> Self {
        let quantities = |cpu: &str, memory: &str| Quantities {
            cpu: cpu.to_owned(),
            memory: memory.to_owned(),
        };
        Deploy {
            namespace: "ingress-private".to_owned(),
            sozu_image: None,
            agent_image: None,
            readiness: ReadinessMode::Serving,
            load_balancer: LoadBalancer::default(),
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
            cluster_dns: raw::default_cluster_dns(),
        }
    }
}

impl Workspace {
    /// Makes the relative paths of error pages, users files and certificate pairs absolute
    /// against `dir`, the workspace's directory.
    pub fn anchor_files(&mut self, dir: &std::path::Path) {
        let anchor = |pages: &mut BTreeMap<u16, PathBuf>| {
            for path in pages.values_mut() {
                if path.is_relative() {
                    *path = dir.join(&*path);
                }
            }
        };
        anchor(&mut self.error_pages);
        for pair in &mut self.certificates {
            for path in [&mut pair.cert_file, &mut pair.key_file] {
                if path.is_relative() {
                    *path = dir.join(&*path);
                }
            }
        }
        if let Some(traefik) = self.traefik.as_mut() {
            for path in [&mut traefik.directory, &mut traefik.file]
                .into_iter()
                .flatten()
            {
                if path.is_relative() {
                    *path = dir.join(&*path);
                }
            }
        }
        for route in &mut self.routes {
            let policy = match &mut route.kind {
                RouteKind::Http(http) => http.policy.as_mut(),
                // Forwarded as they are: they name no file.
                RouteKind::Tcp(_) | RouteKind::TlsPassthrough(_) | RouteKind::Udp(_) => None,
            };
            if let Some(policy) = policy {
                anchor(&mut policy.error_pages);
                if let Some(auth) = policy.basic_auth.as_mut() {
                    if auth.users_file.is_relative() {
                        auth.users_file = dir.join(&auth.users_file);
                    }
                }
            }
        }
    }

    /// What `check` and `status` say of `route` when it is a route of its own port exempt from
    /// the https listener's required client certificates (`client_auth_exempt`): sozu checks
    /// none on its port, so any client that reaches the port gets in.
    pub fn client_auth_exemption(&self, route: &Route) -> Option<String> {
        let required = self.listener_policy.client_auth.mode == ClientAuthMode::Required;
        let port = route.listen_port()?;
        (required && route.client_auth_exempt()).then(|| {
            format!(
                "the '{} route `{}` on port {port} is exempt from listeners.client_auth \
                 (client_auth_exempt): sozu checks no client certificate there, so any client \
                 that reaches the port gets in without one",
                route.protocol(),
                route.host
            )
        })
    }

    /// The hosts whose certificate sozu serves (those of the routes that terminate TLS), each
    /// once, sorted: the pairs the agent watches, orders and mounts.
    pub fn tls_hosts(&self) -> BTreeSet<&str> {
        self.routes
            .iter()
            .filter(|route| route.terminates_tls())
            .map(|route| route.host.as_str())
            .collect()
    }

    /// Where the certificate chain and key of `host` live.
    pub fn certificate_paths(&self, host: &str) -> (PathBuf, PathBuf) {
        let dir = self.tls_dir.join(host);
        (dir.join("tls.crt"), dir.join("tls.key"))
    }
}

/// A route at `/` of `host`, for unit tests elsewhere in the crate.
#[cfg(test)]
pub(crate) fn test_route(host: &str, upstream: Upstream) -> Route {
    Route::http(
        host,
        "/",
        vec![RouteUpstream {
            upstream,
            weight: 1,
            drain: false,
        }],
    )
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
        listener_policy: Box::default(),
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
        traffic: Box::default(),
        headers: Box::default(),
        error_pages: BTreeMap::new(),
        certificates: Vec::new(),
        traefik: None,
        traefik_live: None,
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
            path_segment_prefix: None,
            path_exact: None,
            path_regex: None,
            method: None,
            match_headers: None,
            health: None,
            drain: false,
            hsts: None,
            redirect: None,
            rewrite: None,
            strip_prefix: false,
            headers: None,
            basic_auth: None,
            limits: None,
            error_pages: None,
            protocol: None,
            listen_port: None,
            proxy_protocol: None,
            max_datagram_size: None,
            client_auth_exempt: None,
            upstream_protocol: None,
            sticky: None,
            balancing: None,
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
    fn records_come_from_loopback_or_a_named_sender_and_sozu_is_told_a_loopback_target() {
        let mut traffic = Traffic {
            listen: "0.0.0.0:9181".parse().unwrap(),
            ..Traffic::default()
        };
        assert_eq!(traffic.target().to_string(), "127.0.0.1:9181");
        for source in ["127.0.0.1", "127.9.9.9", "::1", "::ffff:127.0.0.1"] {
            assert!(traffic.accepts(source.parse().unwrap()), "{source}");
        }
        let sozu: IpAddr = "10.0.0.7".parse().unwrap();
        assert!(!traffic.accepts(sozu));
        traffic.senders.push(sozu);
        assert!(traffic.accepts(sozu));
        assert!(!traffic.accepts("10.0.0.8".parse().unwrap()));
        traffic.listen = "[::]:9181".parse().unwrap();
        assert_eq!(traffic.target().to_string(), "[::1]:9181");
        traffic.listen = "10.0.0.1:9181".parse().unwrap();
        assert_eq!(traffic.target().to_string(), "10.0.0.1:9181");
    }

    fn header(name: &str, exact: Option<&str>, regex: Option<&str>) -> RawHeaderMatch {
        RawHeaderMatch {
            name: name.into(),
            exact: exact.map(Into::into),
            regex: regex.map(Into::into),
            present: (exact.is_none() && regex.is_none()).then_some(true),
        }
    }

    fn http(route: &Route) -> &HttpRoute {
        match &route.kind {
            RouteKind::Http(http) => http,
            _ => panic!("not an http route"),
        }
    }

    /// Each path field becomes the sozu rule that means it, whatever query string follows the
    /// path (sozu matches the path with it): checked with the crate sozu matches with, anchored
    /// as sozu anchors it.
    #[test]
    fn each_path_field_becomes_the_rule_that_means_it() {
        let anchored = |rule: &PathRule| {
            regex::bytes::Regex::new(&format!("\\A(?:{})\\z", rule.value)).unwrap()
        };
        let mut raw = raw_route("a.z", "svc", Some(80.0), "/");
        raw.path_exact = Some("/v2.0".into());
        let exact = Route::from_raw(raw).unwrap();
        let rule = http(&exact).path.rule();
        assert_eq!(rule.kind, PathKind::Regex);
        let re = anchored(&rule);
        for (path, matches) in [
            ("/v2.0", true),
            ("/v2.0?page=2", true),
            ("/v2x0", false),
            ("/v2.0/", false),
            ("/v2.0/x", false),
        ] {
            assert_eq!(re.is_match(path.as_bytes()), matches, "exact {path}");
        }

        let mut raw = raw_route("a.z", "svc", Some(80.0), "/");
        raw.path_segment_prefix = Some("/v2/".into());
        let segments = Route::from_raw(raw).unwrap();
        let re = anchored(&http(&segments).path.rule());
        for (path, matches) in [
            ("/v2", true),
            ("/v2/", true),
            ("/v2/x/y", true),
            ("/v2?q=1", true),
            ("/v2example", false),
            ("/v", false),
        ] {
            assert_eq!(re.is_match(path.as_bytes()), matches, "segments {path}");
        }
        let mut raw = raw_route("a.z", "svc", Some(80.0), "/");
        raw.path_segment_prefix = Some("/".into());
        let root = Route::from_raw(raw).unwrap();
        assert_eq!(http(&root).path.rule(), PathRule::prefix("/"));

        let mut raw = raw_route("a.z", "svc", Some(80.0), "/");
        raw.path_regex = Some("^/v[0-9]+/.*$".into());
        let regex = Route::from_raw(raw).unwrap();
        assert_eq!(
            http(&regex).path.rule(),
            PathRule {
                kind: PathKind::Regex,
                value: "^/v[0-9]+/.*$".into()
            }
        );
        // Four routes of one host, told apart.
        let ids: BTreeSet<_> = [&exact, &segments, &root, &regex]
            .iter()
            .map(|r| r.id.clone())
            .collect();
        assert_eq!(ids.len(), 4);
        assert_eq!(root.place(), "segments /");
        assert_eq!(exact.place(), "exact /v2.0");
    }

    /// The method and the header matches are part of what tells a route apart (its id), the
    /// header names lowercase and the matches sorted, as sozu files them: two spellings of one
    /// conjunction are one route.
    #[test]
    fn a_method_and_header_matches_tell_routes_apart() {
        let plain = Route::from_raw(raw_route("a.z", "svc", Some(80.0), "/v2")).unwrap();
        assert_eq!(
            plain.id,
            route_id("a.z", "/v2"),
            "a prefix route's id is as it was"
        );
        let mut raw = raw_route("a.z", "svc", Some(80.0), "/v2");
        raw.method = Some("GET".into());
        let get = Route::from_raw(raw.clone()).unwrap();
        raw.method = Some("POST".into());
        let post = Route::from_raw(raw.clone()).unwrap();
        assert_ne!(get.id, plain.id);
        assert_ne!(get.id, post.id);
        assert_eq!(post.place(), "/v2 method POST");

        raw.match_headers = Some(vec![
            header("X-Env", None, Some("stag.*")),
            header("x-canary", Some("1"), None),
            header("x-debug", None, None),
        ]);
        let a = Route::from_raw(raw.clone()).unwrap();
        raw.match_headers = Some(vec![
            header("x-debug", None, None),
            header("x-canary", Some("1"), None),
            header("x-env", None, Some("stag.*")),
        ]);
        let b = Route::from_raw(raw.clone()).unwrap();
        assert_eq!(a, b);
        assert_eq!(
            a.place(),
            "/v2 method POST header x-canary=\"1\" header x-debug header x-env=~\"stag.*\""
        );
        assert_ne!(a.id, post.id);
    }

    #[test]
    fn what_sozu_would_refuse_in_a_match_is_refused() {
        let refused = |edit: &dyn Fn(&mut RawRoute)| {
            let mut raw = raw_route("a.z", "svc", Some(80.0), "/");
            edit(&mut raw);
            Route::from_raw(raw).unwrap_err().to_string()
        };
        assert!(refused(&|r| r.path_regex = Some("a)(b".into())).contains("path_regex"));
        assert!(refused(&|r| {
            r.match_headers = Some(vec![header("x-env", None, Some("stag("))])
        })
        .contains("x-env"));
        assert!(
            refused(&|r| { r.match_headers = Some(vec![header("Cookie", None, None)]) })
                .contains("Cookie")
        );
        assert!(refused(&|r| r.method = Some("GET POST".into())).contains("method"));
        assert!(refused(&|r| {
            r.path_prefix = "/v2".into();
            r.path_exact = Some("/v2".into());
        })
        .contains("one path field"));
        assert!(refused(&|r| {
            r.path_segment_prefix = Some("/app".into());
            r.strip_prefix = true;
        })
        .contains("strip_prefix"));
        // `$PATH[1]` is what follows a prefix, or a regex's first group.
        assert!(refused(&|r| {
            r.path_exact = Some("/old".into());
            r.rewrite = Some(RawRewrite {
                path: Some("/new$PATH[1]".into()),
            });
        })
        .contains("$PATH[1]"));
        let mut raw = raw_route("a.z", "svc", Some(80.0), "/");
        raw.path_regex = Some("^/old/(.*)$".into());
        raw.rewrite = Some(RawRewrite {
            path: Some("/new/$PATH[1]".into()),
        });
        Route::from_raw(raw).unwrap();
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
