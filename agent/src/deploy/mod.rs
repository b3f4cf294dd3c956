//! Deployment outputs of a [`Workspace`]: the Kubernetes manifests that run sozu with the agent
//! beside it (`render --format k8s`), and the split-horizon DNS records of the route hosts
//! (`render --format dns`).
//!
//! | module | makes |
//! |---|---|
//! | here | the manifest list in its order, and what every object shares (names, labels) |
//! | `pod` | the Deployment or, with ACME, StatefulSet (sozu, the agent as a native sidecar), its PodDisruptionBudget |
//! | `certificates` | per host: a CSI volume or a Certificate; with ACME, its state and Secret |
//! | `config` | the Namespace, the ServiceAccount, the ConfigMap |
//! | `network` | the LoadBalancer Service, the replicas' headless Service, the NetworkPolicy |
//! | `monitoring` | the metrics Service, ServiceMonitor, PrometheusRule, dashboard |
//! | `files` | the workspace and its imports, as the ConfigMap ships them (the only I/O) |
//! | `dns` | the DNS records |
//!
//! One route entry drives everything a new private service needs: its certificate volume (a
//! cert-manager CSI volume, or a Certificate and its Secret), the mount of that volume at
//! `<tls_dir>/<host>`, and its DNS record. With `tls_rotation = 'sozu_managed` there is no
//! per-host volume: each replica orders the certificates itself into a memory-backed tls dir,
//! keeps its ACME state on a claim of its own (a StatefulSet), and reads its DNS credentials
//! from a Secret. Every
//! per-host name is derived from the host alone, never from a position in a list, and nothing is
//! aligned across lines, so appending one route adds exactly those lines to the rendered output
//! and changes no other.
//!
//! The pod: sozu is the main container; the agent is a native sidecar (an init container with
//! `restartPolicy: Always`, Kubernetes 1.29+), so it starts first and stops last. They share an
//! emptyDir holding sozu's control socket and run as one non-root user, because sozu creates the
//! socket with mode 0600. Deleted, sozu keeps serving through a preStop wait (the load balancer
//! still sends it connections until the pod's endpoint is removed), then stops softly on SIGTERM.
//! The Service and a NetworkPolicy admit clients from `allowed_sources` only, and the admin port
//! from the monitoring namespace only. sozu starts from a bootstrap configuration that holds only
//! its listeners: the agent pushes every cluster, frontend, backend and certificate over the
//! socket, so there is a single writer of sozu's routing state and a DNS failure can never keep
//! sozu from starting (a configuration file's backend names are resolved once, at load).

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Serialize, Serializer};
use serde_json::{json, Value};
use sha2::Digest;

use crate::document::ReadinessMode;
use crate::evaluate::imports::{self, normalize, Root, WalkError};
use crate::render::alerts::AlertSettings;
use crate::render::{self, RenderError, SozuSettings};
use crate::workspace::{
    ContainerResources, Dns01, LbProvider, RouteKind, TlsRotation, Upstream, Workspace,
};

/// Name of every object, and the `app.kubernetes.io/name` label that selects the pods.
const APP: &str = "private-ingress";
/// `'sozu_managed`: the headless Service that governs the StatefulSet, which names each replica
/// `private-ingress-<ordinal>.private-ingress-replicas.<namespace>.svc`.
const REPLICAS_SERVICE: &str = "private-ingress-replicas";
/// The Grafana dashboard over the agent's `/metrics`, as Grafana imports it.
pub const DASHBOARD: &str = include_str!("../../../deploy/grafana-dashboard.json");
/// The user and group both containers run as: the `nonroot` user of distroless images. sozu
/// creates its control socket with mode 0600, so the agent must be the same user to open it.
const RUN_AS: u32 = 65532;
/// Where the shared emptyDir holding sozu's control socket is mounted in both containers.
const RUN_DIR: &str = "/run/sozu";
const SOZU_SOCKET: &str = "/run/sozu/sozu.sock";
const SOZU_CONFIG_DIR: &str = "/etc/sozu/bootstrap";
const SOZU_CONFIG_FILE: &str = "config.toml";
/// The ConfigMap key of sozu's bootstrap configuration.
const SOZU_CONFIG_KEY: &str = "sozu.toml";
/// Where the workspace and its imports are mounted in the agent, at their relative paths.
const WORKSPACE_DIR: &str = "/etc/private-ingress/workspace";
/// The generated file at the root of the workspace volume when the workspace sits deeper.
const ROOT_ENTRY: &str = "private-ingress-workspace.ncl";
/// The agent's admin server: /healthz, /readyz, /metrics, /v1/state. The default, which the
/// contract refuses a route on when rendering for Kubernetes.
const ADMIN_PORT: u16 = crate::evaluate::contract::DEFAULT_ADMIN_PORT;
/// TTL of the rendered DNS records: a changed `lb_ip` is picked up within five minutes.
const DNS_TTL: u32 = 300;
/// Kubernetes refuses a ConfigMap whose keys and values exceed 1 MiB together.
const CONFIGMAP_MAX_BYTES: usize = 1 << 20;
const CSI_DRIVER: &str = "csi.cert-manager.io";
/// Room for sozu's state file, which holds every certificate chain and key: about 5 KB per route
/// with an RSA key, so ten thousand routes take some 50 MB. Memory is used only while a worker
/// starts, and counts against sozu's limit.
const SOZU_TMP_SIZE: &str = "128Mi";
/// `'sozu_managed`: the claim template of `acme.state_dir` (each replica's claim is
/// `acme-state-private-ingress-<ordinal>`), and the Secret (created by the operator, never
/// rendered: it holds the credentials) whose keys are mounted as the files the workspace names.
const ACME_STATE_VOLUME: &str = "acme-state";
const ACME_SECRET: &str = "private-ingress-acme";
/// `listeners.client_auth`: the Secret (created by the operator) holding the device CA and its
/// CRLs, mounted as the files the workspace names.
const CLIENT_AUTH_SECRET: &str = "private-ingress-client-auth";
/// Route policies: the Secret (created by the operator) holding the basic-auth users files, one
/// key per file name, mounted in the agent as the files the workspace names.
const BASIC_AUTH_SECRET: &str = "private-ingress-basic-auth";
/// Each claim's size: an account and a few KiB per host.
const ACME_STATE_SIZE: &str = "1Gi";
/// The memory-backed tls dir: a pair is about 5 KiB, so room for ten thousand hosts.
const TLS_DIR_SIZE: &str = "64Mi";

#[derive(Debug, thiserror::Error)]
pub enum DeployError {
    #[error(
        "--format dns needs `lb_ip` in the workspace: the load-balancer address every route host \
         resolves to (e.g. lb_ip = \"10.200.3.6\")"
    )]
    NoLbIp,
    #[error(
        "the {name} listener {address} is a loopback address: the Service cannot reach it \
         (listen on 0.0.0.0 or [::] in a pod)"
    )]
    LoopbackListener {
        name: &'static str,
        address: SocketAddr,
    },
    #[error(
        "acme: {first} and {second} are both mounted from the Secret {ACME_SECRET} as {name}: give \
         them different file names or directories"
    )]
    AcmeFileClash {
        first: String,
        second: String,
        name: String,
    },
    #[error(
        "listeners.client_auth: {first} and {second} are both mounted from the Secret \
         {CLIENT_AUTH_SECRET} as {name}: give them different file names or directories"
    )]
    ClientAuthFileClash {
        first: String,
        second: String,
        name: String,
    },
    #[error(
        "{what}: {detail} are both mounted from {store} under one key or path: give them \
         different file names"
    )]
    PolicyFileClash {
        what: &'static str,
        store: &'static str,
        detail: String,
    },
    #[error(
        "basic_auth.users_file {} lies in the workspace's directory, which ships in a ConfigMap: \
         give it an absolute path elsewhere and put the file in the Secret {BASIC_AUTH_SECRET} \
         (its file name as the key)", path.display()
    )]
    UsersFileInWorkspace { path: PathBuf },
    #[error(
        "error page {} is not in the workspace's directory, the one tree the pod's agent reads          pages from: move it beside the workspace", path.display()
    )]
    PageOutsideWorkspace { path: PathBuf },
    #[error(
        "listeners.interface `{0}` names an interface of the host, which a pod does not have: \
         in Kubernetes, choose the listeners' addresses (and the Service's) instead"
    )]
    InterfaceInPod(String),
    #[error("cannot read {}: {reason}", path.display())]
    Read { path: PathBuf, reason: String },
    #[error("{}: cannot find the imports: {reason}", path.display())]
    Scan { path: PathBuf, reason: String },
    #[error("cannot ship {} in the ConfigMap: {reason}", path.display())]
    ConfigMapFile { path: PathBuf, reason: String },
    #[error(
        "the ConfigMap would hold {size} bytes, over Kubernetes' limit of {CONFIGMAP_MAX_BYTES} \
         bytes for keys and values together"
    )]
    ConfigMapTooLarge { size: usize },
    #[error(
        "deploy.{field} is not set: no registry publishes the {what} image under a name to default \
         to. Build the images (`just image`), push them (`just push-images REGISTRY`), and set \
         deploy.sozu_image and deploy.agent_image to the references it prints (docs/deploy.md, \
         \"Images\")"
    )]
    NoImage {
        field: &'static str,
        what: &'static str,
    },
    #[error(transparent)]
    Render(#[from] RenderError),
}

/// What `check` and `render` say about a workspace that renders, but not as its author probably
/// meant: listeners open to any address, images a registry can change under the same name.
pub fn warnings(workspace: &Workspace) -> Vec<String> {
    let mut warnings = Vec::new();
    if workspace.listener_policy.expect_proxy {
        warnings.push(
            "listeners.expect_proxy is on: every connection must start with a PROXY protocol v2 \
             header, so the load balancer in front must send one (v2: sozu reads no v1), or no \
             client gets in"
                .to_owned(),
        );
    }
    warnings.extend(
        workspace
            .routes
            .iter()
            .filter_map(|route| workspace.client_auth_exemption(route)),
    );
    if workspace.allowed_sources.is_none() {
        warnings.push(
            "allowed_sources is not set: deployed, the listeners accept connections from any \
             address (list the networks that may connect, e.g. the VPN's)"
                .to_owned(),
        );
    }
    for (field, image) in [
        ("sozu_image", &workspace.deploy.sozu_image),
        ("agent_image", &workspace.deploy.agent_image),
    ] {
        if let Some(image) = image.as_deref().filter(|i| !i.contains("@sha256:")) {
            warnings.push(format!(
                "deploy.{field} `{image}` is not pinned by digest: the registry can serve \
                 another image under that tag; name it as `{image}@sha256:…` (`just push-images` \
                 prints it)"
            ));
        }
    }
    warnings
}

impl DeployError {
    /// True when the workspace itself must change (as opposed to a file that cannot be read).
    pub fn is_invalid_workspace(&self) -> bool {
        !matches!(self, DeployError::Read { .. } | DeployError::Render(_))
    }
}

mod certificates;
mod config;
mod dns;
mod files;
mod monitoring;
mod network;
mod pod;
mod route_policy_files;

pub use dns::dns;
pub use files::WorkspaceFiles;

use certificates::*;
use config::*;
use monitoring::*;
use network::*;
use pod::*;
use route_policy_files::*;

/// The Kubernetes manifests of the workspace, as one multi-document YAML stream in apply order:
/// Namespace, ServiceAccount, ConfigMap, Certificates (`'reloader`), Services (with
/// `'sozu_managed`, the replicas' headless one too), ServiceMonitor, PrometheusRule and the
/// Grafana dashboard's ConfigMap (each when asked for), NetworkPolicy, the Deployment (with
/// `'sozu_managed`, a StatefulSet), PodDisruptionBudget. Object keys are sorted, like `kubectl get -o yaml` prints them. `alerts`
/// renders the PrometheusRule's rules.
pub fn k8s(
    workspace: &Workspace,
    files: &WorkspaceFiles,
    alerts: &AlertSettings,
) -> Result<String, DeployError> {
    for (name, address) in [
        ("https", workspace.listeners.https),
        ("http", workspace.listeners.http),
    ] {
        if address.ip().is_loopback() {
            return Err(DeployError::LoopbackListener { name, address });
        }
    }
    for (field, what, image) in [
        ("sozu_image", "sozu", &workspace.deploy.sozu_image),
        ("agent_image", "agent", &workspace.deploy.agent_image),
    ] {
        if image.is_none() {
            return Err(DeployError::NoImage { field, what });
        }
    }
    if let Some(interface) = &workspace.listener_policy.interface {
        return Err(DeployError::InterfaceInPod(interface.clone()));
    }
    let pod = Pod::new(workspace, files)?;
    let mut docs = vec![
        namespace(workspace),
        service_account(workspace),
        config_map(workspace, &pod)?,
    ];
    if workspace.tls_rotation == TlsRotation::Reloader {
        docs.extend(pod.hosts.iter().map(|host| certificate(workspace, host)));
    }
    let acme = match workspace.acme.as_deref() {
        Some(acme) if workspace.tls_rotation == TlsRotation::SozuManaged => Some(acme_files(acme)?),
        _ => None,
    };
    docs.push(load_balancer(workspace));
    if acme.is_some() {
        docs.push(replicas_service(workspace));
    }
    if workspace.deploy.service_monitor {
        docs.push(metrics_service(workspace));
        docs.push(service_monitor(workspace));
    }
    if workspace.deploy.prometheus_rule {
        docs.push(prometheus_rule(workspace, alerts));
    }
    if workspace.deploy.grafana_dashboard {
        docs.push(grafana_dashboard(workspace));
    }
    docs.push(network_policy(workspace));
    let client_auth = client_auth_files(workspace)?;
    docs.push(workload(
        workspace,
        &pod,
        acme.as_ref(),
        &client_auth,
        &pod.policy_files,
    ));
    docs.push(pod_disruption_budget(workspace));

    let mut out = format!(
        "# Generated by private-ingress from the workspace (zone {}); do not edit.\n",
        workspace.zone
    );
    for doc in &docs {
        let yaml = serde_norway::to_string(&Sorted(doc)).map_err(|err| {
            DeployError::Render(RenderError::Serialise {
                format: "k8s",
                reason: err.to_string(),
            })
        })?;
        out.push_str("---\n");
        out.push_str(&yaml);
    }
    Ok(out)
}
/// What the pod needs beyond the workspace model: the ConfigMap's contents and the hosts.
struct Pod<'a> {
    /// ConfigMap key → (path under the mount, contents) for each workspace file.
    workspace_items: BTreeMap<String, (String, Cow<'a, str>)>,
    /// The file the agent is given, relative to the mount.
    workspace_entry: String,
    sozu_config: String,
    hosts: Vec<&'a str>,
    /// The files the route policies name.
    policy_files: PolicyFiles,
}

impl<'a> Pod<'a> {
    fn new(workspace: &'a Workspace, files: &'a WorkspaceFiles) -> Result<Pod<'a>, DeployError> {
        let mut workspace_items = BTreeMap::new();
        for (path, text) in &files.files {
            let key = configmap_key(path)?;
            if key == SOZU_CONFIG_KEY || workspace_items.contains_key(&key) {
                return Err(DeployError::ConfigMapFile {
                    path: path.into(),
                    reason: format!("its ConfigMap key `{key}` is already taken; rename the file"),
                });
            }
            workspace_items.insert(key, (path.clone(), Cow::Borrowed(text.as_str())));
        }
        let mut policy_files = policy_files(workspace, files)?;
        for (path, text) in std::mem::take(&mut policy_files.shipped_pages) {
            let key = configmap_key(&path)?;
            if key == SOZU_CONFIG_KEY || workspace_items.contains_key(&key) {
                return Err(DeployError::ConfigMapFile {
                    path: path.into(),
                    reason: format!("its ConfigMap key `{key}` is already taken; rename the file"),
                });
            }
            workspace_items.insert(key, (path, Cow::Owned(text)));
        }
        // The agent watches its workspace's directory for the kubelet's `..data` swap, which
        // happens at the root of the volume; a subdirectory is reached through a link into the
        // swapped-out tree, whose watch dies with it. So the agent is given a file at the root
        // that imports the real workspace.
        let mut workspace_entry = files.entry.clone();
        if workspace_entry.contains('/') {
            if workspace_items.contains_key(ROOT_ENTRY) {
                return Err(DeployError::ConfigMapFile {
                    path: ROOT_ENTRY.into(),
                    reason: "the name is reserved for the generated entry point; rename the file"
                        .into(),
                });
            }
            let text = format!(
                "# Generated by private-ingress: the workspace is {0}. The agent is given this\n\
                 # file because ConfigMap updates are swapped in at the volume's root.\n\
                 import \"{0}\"\n",
                files.entry
            );
            workspace_items.insert(ROOT_ENTRY.into(), (ROOT_ENTRY.into(), Cow::Owned(text)));
            workspace_entry = ROOT_ENTRY.into();
        }
        // Listeners and the control socket only: the agent pushes the routes (see the module doc).
        // The agent sets the listeners' error pages too: sozu's container does not mount them.
        let bootstrap = Workspace {
            routes: Vec::new(),
            error_pages: BTreeMap::new(),
            ..workspace.clone()
        };
        let settings = SozuSettings {
            command_socket: PathBuf::from(SOZU_SOCKET),
            // Sized for the routes the agent will push, not the bootstrap's none.
            routes: workspace.routes.len(),
            ..SozuSettings::default()
        };
        Ok(Pod {
            workspace_items,
            workspace_entry,
            sozu_config: render::sozu_toml(&bootstrap, &Default::default(), &settings)?,
            hosts: hosts(workspace),
            policy_files,
        })
    }
}
/// A port a route of its own port listens on: on the Service (clients reach it at the same
/// number), the sozu container and the NetworkPolicy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct RoutePort {
    pub(super) port: u16,
    /// `TCP` or `UDP`, as Kubernetes writes it.
    pub(super) protocol: &'static str,
}

impl RoutePort {
    /// The port's name: `tcp-2222`, `udp-5514` (a DNS label of at most 15 characters).
    pub(super) fn name(&self) -> String {
        format!("{}-{}", self.protocol.to_lowercase(), self.port)
    }
}

/// Every port the routes of their own port listen on, once each, sorted.
pub(super) fn route_ports(workspace: &Workspace) -> Vec<RoutePort> {
    let ports: BTreeSet<RoutePort> = workspace
        .routes
        .iter()
        .filter_map(|route| match &route.kind {
            RouteKind::Http(_) => None,
            RouteKind::Tcp(stream) | RouteKind::TlsPassthrough(stream) => Some(RoutePort {
                port: stream.listen_port,
                protocol: "TCP",
            }),
            RouteKind::Udp(udp) => Some(RoutePort {
                port: udp.listen_port,
                protocol: "UDP",
            }),
        })
        .collect();
    ports.into_iter().collect()
}

/// The hosts whose certificate sozu serves, sorted: routes that share a host share its
/// certificate volume.
fn hosts(workspace: &Workspace) -> Vec<&str> {
    workspace.tls_hosts().into_iter().collect()
}
/// The name of a host's certificate volume (and, in `'reloader` mode, of its Certificate and
/// Secret): `tls-<first label>-<8 hex digits of SHA-256(host)>`. A DNS-1123 label of at most 53
/// characters whatever the host's length, readable, and unique per host.
fn tls_name(host: &str) -> String {
    let label = host.split('.').next().unwrap_or(host);
    let label = label[..label.len().min(40)].trim_end_matches('-');
    let digest = sha2::Sha256::digest(host.as_bytes());
    let short: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
    format!("tls-{label}-{short}")
}
/// What selects the pods. Never changes: a Deployment's selector is immutable.
fn selector() -> Value {
    json!({ "app.kubernetes.io/name": APP })
}
/// The labels of every object: the selector's, plus what made it and which version did.
fn labels() -> Value {
    let mut labels = selector();
    labels["app.kubernetes.io/managed-by"] = json!(APP);
    labels["app.kubernetes.io/version"] = json!(env!("CARGO_PKG_VERSION"));
    labels
}
fn metadata(workspace: &Workspace, name: &str) -> Value {
    json!({ "name": name, "namespace": workspace.deploy.namespace, "labels": labels() })
}
/// Serialises a JSON value with every object's keys in sorted order, whatever order the map
/// keeps (serde_json's `preserve_order` feature may be switched on by another crate).
struct Sorted<'a>(&'a Value);

impl Serialize for Sorted<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Value::Object(map) => {
                let mut entries: Vec<_> = map.iter().collect();
                entries.sort_by(|a, b| a.0.cmp(b.0));
                let mut out = serializer.serialize_map(Some(entries.len()))?;
                for (key, value) in entries {
                    out.serialize_entry(key, &Sorted(value))?;
                }
                out.end()
            }
            Value::Array(items) => {
                let mut out = serializer.serialize_seq(Some(items.len()))?;
                for item in items {
                    out.serialize_element(&Sorted(item))?;
                }
                out.end()
            }
            other => other.serialize(serializer),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::files::common_dir;
    use super::*;

    #[test]
    fn the_acme_directory_port_is_read_from_its_url() {
        for (url, port) in [
            ("https://acme-v02.api.letsencrypt.org/directory", 443),
            ("https://ca.internal:9000/acme/acme/directory", 9000),
            ("https://[fd00::1]:8443/dir", 8443),
            ("https://[fd00::1]/dir", 443),
        ] {
            assert_eq!(acme_directory_port(url), port, "{url}");
        }
    }

    #[test]
    fn tls_names_are_dns_labels_and_distinct() {
        let long = format!("{}.in.example.org", "a".repeat(63));
        for host in ["grafana.in.example.org", "in.example.org", long.as_str()] {
            let name = tls_name(host);
            assert!(name.len() <= 63, "{name}");
            assert!(
                name.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'),
                "{name}"
            );
        }
        assert_ne!(tls_name("a-b.c.org"), tls_name("a-b.d.org"));
        assert!(tls_name("grafana.in.example.org").starts_with("tls-grafana-"));
    }

    #[test]
    fn configmap_keys_flatten_paths_and_refuse_what_kubernetes_refuses() {
        assert_eq!(
            configmap_key("examples/modular/routes.ncl").unwrap(),
            "examples--modular--routes.ncl"
        );
        assert!(configmap_key("my routes.ncl").is_err());
        assert!(configmap_key("..hidden/x.ncl").is_err());
    }

    #[test]
    fn common_dir_is_the_deepest_shared_directory() {
        let paths = [
            PathBuf::from("/r/schema/examples/modular/workspace.ncl"),
            PathBuf::from("/r/schema/examples/modular/routes.ncl"),
            PathBuf::from("/r/schema/private_ingress.ncl"),
        ];
        assert_eq!(common_dir(paths.iter()), Path::new("/r/schema"));
        assert_eq!(
            normalize(Path::new("/r/a/../b/./c.ncl")),
            Path::new("/r/b/c.ncl")
        );
    }
}
