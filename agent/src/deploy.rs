//! Deployment outputs of a [`Workspace`]: the Kubernetes manifests that run sozu with the agent
//! beside it (`render --format k8s`), and the split-horizon DNS records of the route hosts
//! (`render --format dns`).
//!
//! One route entry drives everything a new private service needs: its certificate volume (a
//! cert-manager CSI volume, or a Certificate and its Secret), the mount of that volume at
//! `<tls_dir>/<host>`, and its DNS record. With `tls_rotation = 'sozu_managed` there is no
//! per-host volume: the agent orders the certificates itself into a memory-backed tls dir, keeps
//! its ACME state on a PersistentVolumeClaim, and reads its DNS credentials from a Secret. Every per-host name is derived from the host alone,
//! never from a position in a list, and nothing is aligned across lines, so appending one route
//! adds exactly those lines to the rendered output and changes no other.
//!
//! The pod: sozu is the main container; the agent is a native sidecar (an init container with
//! `restartPolicy: Always`, Kubernetes 1.29+), so it starts first and stops last. They share an
//! emptyDir holding sozu's control socket and run as one non-root user, because sozu creates the
//! socket with mode 0600. Deleted, sozu keeps serving through a preStop wait (the load balancer
//! still sends it connections until the pod's endpoint is removed), then stops softly on SIGTERM.
//! The Service and a NetworkPolicy admit clients from `allowed_sources` only, and the admin port
//! from the monitoring namespace only. sozu starts from a bootstrap configuration that holds only its
//! listeners: the agent pushes every cluster, frontend, backend and certificate over the socket,
//! so there is a single writer of sozu's routing state and a DNS failure can never keep sozu from
//! starting (a configuration file's backend names are resolved once, at load).
//!
//! Pure, except [`WorkspaceFiles::read`], which reads the workspace and the files it imports to
//! ship them in the ConfigMap.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Serialize, Serializer};
use serde_json::{json, Value};
use sha2::Digest;

use crate::alerts::AlertSettings;
use crate::imports::{self, normalize, Root, WalkError};
use crate::render::{self, RenderError, SozuSettings};
use crate::workspace::{ContainerResources, Dns01, TlsRotation, Upstream, Workspace};

/// Name of every object, and the `app.kubernetes.io/name` label that selects the pods.
const APP: &str = "private-ingress";
/// The Grafana dashboard over the agent's `/metrics`, as Grafana imports it.
pub const DASHBOARD: &str = include_str!("../../deploy/grafana-dashboard.json");
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
/// The agent's admin server: /healthz, /readyz, /metrics, /v1/state.
const ADMIN_PORT: u16 = 9180;
/// TTL of the rendered DNS records: a changed `lb_ip` is picked up within five minutes.
const DNS_TTL: u32 = 300;
/// Kubernetes refuses a ConfigMap whose keys and values exceed 1 MiB together.
const CONFIGMAP_MAX_BYTES: usize = 1 << 20;
const CSI_DRIVER: &str = "csi.cert-manager.io";
/// Room for sozu's state file, which holds every certificate chain and key: about 5 KB per route
/// with an RSA key, so ten thousand routes take some 50 MB. Memory is used only while a worker
/// starts, and counts against sozu's limit.
const SOZU_TMP_SIZE: &str = "128Mi";
/// `'sozu_managed`: the PersistentVolumeClaim of `acme.state_dir`, and the Secret (created by the
/// operator, never rendered: it holds the credentials) whose keys are mounted as the files the
/// workspace names.
const ACME_STATE_CLAIM: &str = "private-ingress-acme-state";
const ACME_SECRET: &str = "private-ingress-acme";
/// The claim's size: an account and a few KiB per host.
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
        first: &'static str,
        second: &'static str,
        name: String,
    },
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
    #[error(transparent)]
    Render(#[from] RenderError),
}

impl DeployError {
    /// True when the workspace itself must change (as opposed to a file that cannot be read).
    pub fn is_invalid_workspace(&self) -> bool {
        !matches!(self, DeployError::Read { .. } | DeployError::Render(_))
    }
}

/// The split-horizon records of the route hosts: one A or AAAA record per host (routes that
/// share a host share its record), pointing at `lb_ip`. Names are absolute, so the fragment can
/// be `$INCLUDE`d or pasted anywhere in the zone file.
pub fn dns(workspace: &Workspace) -> Result<String, DeployError> {
    let lb_ip = workspace.lb_ip.ok_or(DeployError::NoLbIp)?;
    let kind = match lb_ip {
        IpAddr::V4(_) => "A",
        IpAddr::V6(_) => "AAAA",
    };
    let mut out = format!(
        "; Generated by private-ingress from the workspace (zone {}); do not edit.\n\
         ; Every route host resolves to the load balancer in front of sozu (lb_ip).\n",
        workspace.zone
    );
    for host in hosts(workspace) {
        let _ = writeln!(out, "{host}.\t{DNS_TTL}\tIN\t{kind}\t{lb_ip}");
    }
    Ok(out)
}

/// The workspace file and every file it imports, transitively, as they will sit in the pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkspaceFiles {
    /// The workspace's path relative to the files' common directory, `/`-separated.
    pub entry: String,
    /// Contents by relative path, `/`-separated.
    pub files: BTreeMap<String, String>,
}

impl WorkspaceFiles {
    /// Reads `workspace` and follows its `import "…"`s ([`crate::imports::walk`]: confined to
    /// `root`, the workspace's directory unless wider, as the evaluation is). Imports are found
    /// with Nickel's own lexer rather than by evaluating: this runs in the parent process, after
    /// the sandboxed evaluation has already accepted the workspace, and lexing cannot loop or
    /// recurse. Paths keep their layout relative to the files' deepest common directory, so
    /// relative imports still resolve in the pod.
    pub fn read(workspace: &Path, root: Option<&Path>) -> Result<WorkspaceFiles, DeployError> {
        let read_error = |path: &Path, reason: String| DeployError::Read {
            path: path.to_owned(),
            reason,
        };
        let entry = std::path::absolute(workspace)
            .map(|path| normalize(&path))
            .map_err(|err| read_error(workspace, err.to_string()))?;
        let tree = Root::of(&entry, root)
            .map_err(|err| read_error(root.unwrap_or(&entry), err.to_string()))?;
        let walked = imports::walk(&entry, &tree).map_err(|err| match err {
            WalkError::Read { path, reason } => DeployError::Read { path, reason },
            WalkError::Outside { ref path, .. } => DeployError::Scan {
                path: path.clone(),
                reason: err.to_string(),
            },
            WalkError::Import(error) => DeployError::Scan {
                path: error.file.clone(),
                reason: error.message,
            },
        })?;
        if let Some((path, reason)) = walked.unreadable.into_iter().next() {
            return Err(DeployError::Read { path, reason });
        }
        let contents = walked.files;
        let root = common_dir(contents.keys());
        let relative = |path: &Path| {
            let parts: Vec<_> = path
                .strip_prefix(&root)
                .unwrap_or(path)
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            parts.join("/")
        };
        Ok(WorkspaceFiles {
            entry: relative(&entry),
            files: contents
                .into_iter()
                .map(|(path, text)| (relative(&path), text))
                .collect(),
        })
    }
}

/// The deepest directory holding every path.
fn common_dir<'a>(mut paths: impl Iterator<Item = &'a PathBuf>) -> PathBuf {
    let Some(first) = paths.next() else {
        return PathBuf::from("/");
    };
    let mut root = first.parent().map(Path::to_owned).unwrap_or_default();
    for path in paths {
        while !path.starts_with(&root) {
            if !root.pop() {
                break;
            }
        }
    }
    root
}

/// The Kubernetes manifests of the workspace, as one multi-document YAML stream in apply order:
/// Namespace, ServiceAccount, ConfigMap, Certificates (`'reloader`), the ACME state's
/// PersistentVolumeClaim (`'sozu_managed`), Services, ServiceMonitor, PrometheusRule and the
/// Grafana dashboard's ConfigMap (each when asked for), NetworkPolicy, Deployment,
/// PodDisruptionBudget. Object keys are sorted, like `kubectl get -o yaml` prints them. `alerts`
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
        Some(acme) if workspace.tls_rotation == TlsRotation::SozuManaged => {
            docs.push(acme_state_claim(workspace));
            Some(acme_files(acme)?)
        }
        _ => None,
    };
    docs.push(load_balancer(workspace));
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
    docs.push(deployment(workspace, &pod, acme.as_ref()));
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
        let bootstrap = Workspace {
            routes: Vec::new(),
            ..workspace.clone()
        };
        let settings = SozuSettings {
            command_socket: PathBuf::from(SOZU_SOCKET),
            ..SozuSettings::default()
        };
        Ok(Pod {
            workspace_items,
            workspace_entry,
            sozu_config: render::sozu_toml(&bootstrap, &settings)?,
            hosts: hosts(workspace),
        })
    }
}

/// The distinct route hosts, sorted: routes that share a host share its certificate and record.
fn hosts(workspace: &Workspace) -> Vec<&str> {
    let set: BTreeSet<&str> = workspace.routes.iter().map(|r| r.host.as_str()).collect();
    set.into_iter().collect()
}

/// A ConfigMap key for a workspace file: its relative path with `/` written `--` (keys cannot
/// hold `/`; the volume's `items` put the file back at its path).
fn configmap_key(path: &str) -> Result<String, DeployError> {
    let fail = |reason: &str| DeployError::ConfigMapFile {
        path: path.into(),
        reason: reason.into(),
    };
    if path.split('/').any(|part| part.starts_with("..")) {
        return Err(fail(
            "Kubernetes refuses a path element starting with `..` in a ConfigMap volume",
        ));
    }
    let key = path.replace('/', "--");
    if key.is_empty()
        || key.len() > 253
        || !key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        return Err(fail(
            "a ConfigMap key holds only letters, digits, `-`, `_` and `.` (at most 253)",
        ));
    }
    Ok(key)
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

fn namespace(workspace: &Workspace) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": workspace.deploy.namespace,
            "labels": {
                "app.kubernetes.io/name": APP,
                "app.kubernetes.io/managed-by": APP,
                "app.kubernetes.io/version": env!("CARGO_PKG_VERSION"),
                // The cluster itself then refuses a pod of this namespace that is not "restricted".
                "pod-security.kubernetes.io/enforce": "restricted",
                "pod-security.kubernetes.io/enforce-version": "latest",
            },
        },
    })
}

fn service_account(workspace: &Workspace) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": metadata(workspace, APP),
        // The agent reads files and a socket; it never calls the Kubernetes API.
        "automountServiceAccountToken": false,
    })
}

fn config_map(workspace: &Workspace, pod: &Pod) -> Result<Value, DeployError> {
    let mut data = serde_json::Map::new();
    for (key, (_, text)) in &pod.workspace_items {
        data.insert(key.clone(), json!(text));
    }
    data.insert(SOZU_CONFIG_KEY.into(), json!(pod.sozu_config));
    let size: usize = data
        .iter()
        .map(|(key, value)| key.len() + value.as_str().map_or(0, str::len))
        .sum();
    if size > CONFIGMAP_MAX_BYTES {
        return Err(DeployError::ConfigMapTooLarge { size });
    }
    Ok(json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(workspace, &config_map_name(pod)),
        "immutable": true,
        "data": data,
    }))
}

/// The ConfigMap's name carries a digest of its contents, so a changed workspace is a new
/// ConfigMap and a new pod template: pods of the old template keep the workspace that matches
/// their certificate volumes for as long as they run, instead of receiving routes whose volumes
/// only the new template mounts (and going unready for them mid-rollout).
fn config_map_name(pod: &Pod) -> String {
    use sha2::{Digest, Sha256};
    let mut digest = Sha256::new();
    for (key, (_, text)) in &pod.workspace_items {
        for part in [key.as_bytes(), b"\0", text.as_bytes(), b"\0"] {
            digest.update(part);
        }
    }
    digest.update(pod.sozu_config.as_bytes());
    let hex: String = digest
        .finalize()
        .iter()
        .take(5)
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("{APP}-{hex}")
}

/// `'reloader`: cert-manager keeps the host's certificate in a Secret of the same name, which the
/// pod mounts; the agent picks renewals up from the mount, so no rollout is needed.
fn certificate(workspace: &Workspace, host: &str) -> Value {
    let name = tls_name(host);
    json!({
        "apiVersion": "cert-manager.io/v1",
        "kind": "Certificate",
        "metadata": metadata(workspace, &name),
        "spec": {
            "secretName": name,
            "dnsNames": [host],
            "issuerRef": {
                "group": "cert-manager.io",
                "kind": "ClusterIssuer",
                "name": workspace.cluster_issuer,
            },
        },
    })
}

/// `'sozu_managed`: the account, the certificates and the order state outlive the pod here, so
/// a restarted pod neither creates a second account nor orders again.
fn acme_state_claim(workspace: &Workspace) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": metadata(workspace, ACME_STATE_CLAIM),
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "resources": { "requests": { "storage": ACME_STATE_SIZE } },
        },
    })
}

/// The files `'sozu_managed` reads, each a key of the Secret [`ACME_SECRET`] mounted at the path
/// the workspace names: the DNS provider's secret, the EAB key, the CA bundle.
struct AcmeFiles {
    state_dir: PathBuf,
    /// Directory → (Secret key, file name) of the files in it.
    dirs: BTreeMap<PathBuf, Vec<(&'static str, String)>>,
}

fn acme_files(acme: &crate::workspace::Acme) -> Result<AcmeFiles, DeployError> {
    use crate::workspace::Dns01;
    let mut files: Vec<(&'static str, &Path)> = match &acme.dns01 {
        Dns01::Rfc2136 {
            tsig_secret_file, ..
        } => vec![("tsig-secret", tsig_secret_file)],
        Dns01::Cloudflare { api_token_file } => vec![("cloudflare-api-token", api_token_file)],
    };
    if let Some(eab) = &acme.eab {
        files.push(("eab-hmac-key", &eab.hmac_key_file));
    }
    if let Some(bundle) = &acme.ca_bundle {
        files.push(("ca-bundle", bundle));
    }
    let mut dirs: BTreeMap<PathBuf, Vec<(&'static str, String)>> = BTreeMap::new();
    let mut seen: BTreeMap<&Path, &'static str> = BTreeMap::new();
    for (key, path) in files {
        if let Some(first) = seen.insert(path, key) {
            return Err(DeployError::AcmeFileClash {
                first,
                second: key,
                name: path.display().to_string(),
            });
        }
        let dir = path.parent().unwrap_or(Path::new("/")).to_owned();
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        dirs.entry(dir).or_default().push((key, name));
    }
    Ok(AcmeFiles {
        state_dir: acme.state_dir.clone(),
        dirs,
    })
}

/// A volume name for a directory of ACME files: `acme-files-<8 hex digits of SHA-256(dir)>`.
fn acme_files_volume(dir: &Path) -> String {
    let digest = sha2::Sha256::digest(dir.to_string_lossy().as_bytes());
    let short: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
    format!("acme-files-{short}")
}

fn load_balancer(workspace: &Workspace) -> Value {
    let mut metadata = metadata(workspace, APP);
    let mut spec = json!({
        "type": "LoadBalancer",
        // Straight to a pod on the node that received the connection, without a second hop that
        // would replace the client's address: sozu logs, and the NetworkPolicy matches, the real
        // client. The load balancer's health check skips nodes that run no pod.
        "externalTrafficPolicy": "Local",
        "selector": selector(),
        "ports": [
            {
                "name": "http",
                "port": 80,
                "protocol": "TCP",
                "targetPort": workspace.listeners.http.port(),
            },
            {
                "name": "https",
                "port": 443,
                "protocol": "TCP",
                "targetPort": workspace.listeners.https.port(),
            },
        ],
    });
    if let Some(ip) = workspace.lb_ip {
        // Cilium's LB IPAM assigns exactly this address; the Service's IP family must match it.
        metadata["annotations"] = json!({ "lbipam.cilium.io/ips": ip.to_string() });
        spec["ipFamilyPolicy"] = json!("SingleStack");
        spec["ipFamilies"] = json!([if ip.is_ipv4() { "IPv4" } else { "IPv6" }]);
    }
    if let Some(sources) = &workspace.allowed_sources {
        // Filtered by the load balancer itself, before the traffic reaches a node.
        spec["loadBalancerSourceRanges"] = json!(sources_text(sources));
    }
    json!({ "apiVersion": "v1", "kind": "Service", "metadata": metadata, "spec": spec })
}

fn metrics_labels() -> Value {
    json!({ "app.kubernetes.io/name": APP, "app.kubernetes.io/component": "metrics" })
}

fn sources_text(sources: &[ipnet::IpNet]) -> Vec<String> {
    sources.iter().map(ToString::to_string).collect()
}

/// A ClusterIP Service for the ServiceMonitor to select: the load balancer must not expose the
/// admin port.
fn metrics_service(workspace: &Workspace) -> Value {
    let mut labels = labels();
    labels["app.kubernetes.io/component"] = json!("metrics");
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": format!("{APP}-metrics"),
            "namespace": workspace.deploy.namespace,
            "labels": labels,
        },
        "spec": {
            "type": "ClusterIP",
            "selector": selector(),
            "ports": [{ "name": "admin", "port": ADMIN_PORT, "protocol": "TCP", "targetPort": "admin" }],
        },
    })
}

fn service_monitor(workspace: &Workspace) -> Value {
    json!({
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": metadata(workspace, APP),
        "spec": {
            "selector": { "matchLabels": metrics_labels() },
            "endpoints": [{ "port": "admin", "path": "/metrics" }],
        },
    })
}

/// The alert rules of [`crate::alerts`], for a prometheus-operator Prometheus to load.
fn prometheus_rule(workspace: &Workspace, alerts: &AlertSettings) -> Value {
    json!({
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": metadata(workspace, APP),
        "spec": crate::alerts::groups(alerts),
    })
}

/// The Grafana dashboard (`deploy/grafana-dashboard.json`), in a ConfigMap carrying the label
/// Grafana's dashboard sidecar looks for (`grafana_dashboard: "1"`, the Grafana and
/// kube-prometheus-stack charts' default).
fn grafana_dashboard(workspace: &Workspace) -> Value {
    let mut metadata = metadata(workspace, &format!("{APP}-dashboard"));
    metadata["labels"]["grafana_dashboard"] = json!("1");
    json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata,
        "data": { format!("{APP}.json"): DASHBOARD },
    })
}

/// What may reach the pods and what they may reach: the listeners from `allowed_sources` (from
/// anywhere without it), the admin port from the monitoring pods only (`/v1/state` and
/// `/metrics` name every host), and out only to DNS and the routes' upstream ports. Applied
/// before the Deployment, so no pod ever runs unisolated.
fn network_policy(workspace: &Workspace) -> Value {
    let port = |name: &str| json!({ "port": name, "protocol": "TCP" });
    let mut listeners = json!({ "ports": [port("http"), port("https")] });
    if let Some(sources) = &workspace.allowed_sources {
        listeners["from"] = sources_text(sources)
            .into_iter()
            .map(|cidr| json!({ "ipBlock": { "cidr": cidr } }))
            .collect();
    }
    let monitoring = &workspace.deploy.monitoring;
    let mut scraper = json!({
        "namespaceSelector": {
            "matchLabels": { "kubernetes.io/metadata.name": monitoring.namespace },
        },
    });
    if !monitoring.pod_labels.is_empty() {
        scraper["podSelector"] = json!({ "matchLabels": monitoring.pod_labels });
    }
    let admin = json!({ "from": [scraper], "ports": [port("admin")] });
    // The agent resolves upstream names, through the cluster's DNS pods alone; sozu connects to
    // the backends.
    let dns_ports = |port: u16| {
        json!([
            { "port": port, "protocol": "UDP" },
            { "port": port, "protocol": "TCP" },
        ])
    };
    let cluster_dns = &workspace.deploy.cluster_dns;
    let mut dns_pods = json!({
        "namespaceSelector": {
            "matchLabels": { "kubernetes.io/metadata.name": cluster_dns.namespace },
        },
    });
    if !cluster_dns.pod_labels.is_empty() {
        dns_pods["podSelector"] = json!({ "matchLabels": cluster_dns.pod_labels });
    }
    let mut egress = vec![json!({ "to": [dns_pods], "ports": dns_ports(53) })];
    // Plus the ports named in the workspace: a Service that maps its port to another target
    // port is reached on the target port once the network plugin has translated it, which is
    // where Cilium and Calico apply the policy.
    let upstream_ports: BTreeSet<u16> = workspace
        .routes
        .iter()
        .flat_map(|route| &route.upstreams)
        .filter_map(|u| match &u.upstream {
            Upstream::Dns { port, .. } => Some(*port),
            Upstream::Ip { address } => Some(address.port()),
            Upstream::Unix { .. } => None,
        })
        // A health check on another port than the backend's is sozu dialling that port.
        .chain(
            workspace
                .routes
                .iter()
                .filter_map(|route| route.health.as_ref()?.port),
        )
        .chain(workspace.deploy.extra_egress_ports.iter().copied())
        .collect();
    // 'sozu_managed: the agent talks to the ACME directory and to Cloudflare's API over HTTPS
    // (names whose addresses change, so any address), updates the DNS server `dns01.server`
    // and asks `propagation.nameservers`, by address; without the latter, the zone's
    // authoritative servers are found at run time, anywhere: port 53 to any address then.
    if let Some(acme) = &workspace.acme {
        let directory_port = acme_directory_port(&acme.directory);
        let https: BTreeSet<u16> = BTreeSet::from([443, directory_port]);
        egress.push(json!({
            "ports": https
                .iter()
                .map(|port| json!({ "port": port, "protocol": "TCP" }))
                .collect::<Vec<_>>(),
        }));
        let mut servers: Vec<SocketAddr> = Vec::new();
        if let Dns01::Rfc2136 { server, .. } = &acme.dns01 {
            servers.push(*server);
        }
        servers.extend(acme.propagation.nameservers.iter().flatten().copied());
        for server in &servers {
            let cidr = match server.ip() {
                IpAddr::V4(ip) => format!("{ip}/32"),
                IpAddr::V6(ip) => format!("{ip}/128"),
            };
            egress.push(json!({
                "to": [{ "ipBlock": { "cidr": cidr } }],
                "ports": dns_ports(server.port()),
            }));
        }
        if acme.propagation.nameservers.is_none() {
            egress.push(json!({ "ports": dns_ports(53) }));
        }
    }
    // A rule without ports would allow every port.
    if !upstream_ports.is_empty() {
        let ports: Vec<Value> = upstream_ports
            .iter()
            .map(|port| json!({ "port": port, "protocol": "TCP" }))
            .collect();
        egress.push(json!({ "ports": ports }));
    }
    json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(workspace, APP),
        "spec": {
            "podSelector": { "matchLabels": selector() },
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [listeners, admin],
            "egress": egress,
        },
    })
}

/// The port of the ACME directory URL (`https://host[:port]/…`): 443 unless it names another.
fn acme_directory_port(directory: &str) -> u16 {
    directory
        .strip_prefix("https://")
        .and_then(|rest| rest.split('/').next())
        .and_then(|authority| authority.rsplit_once(':'))
        .and_then(|(_, port)| port.parse().ok())
        .unwrap_or(443)
}

fn pod_disruption_budget(workspace: &Workspace) -> Value {
    json!({
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": metadata(workspace, APP),
        "spec": {
            // At most one proxy down at a time; unlike `minAvailable`, this never blocks a node
            // drain when a single replica runs.
            "maxUnavailable": 1,
            // A pod that is not Ready serves nothing: evicting it costs nothing, and keeping it
            // would block the drain of its node for as long as it stays unready.
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
            "selector": { "matchLabels": selector() },
        },
    })
}

fn resources(r: &ContainerResources) -> Value {
    json!({
        "requests": { "cpu": r.requests.cpu, "memory": r.requests.memory },
        "limits": { "cpu": r.limits.cpu, "memory": r.limits.memory },
    })
}

/// Pod Security "restricted" for one container. `bind_low_ports` adds NET_BIND_SERVICE, the one
/// capability "restricted" allows.
fn security_context(bind_low_ports: bool) -> Value {
    let mut capabilities = json!({ "drop": ["ALL"] });
    if bind_low_ports {
        capabilities["add"] = json!(["NET_BIND_SERVICE"]);
    }
    json!({
        "allowPrivilegeEscalation": false,
        "capabilities": capabilities,
        "readOnlyRootFilesystem": true,
        "runAsNonRoot": true,
    })
}

fn deployment(workspace: &Workspace, pod: &Pod, acme: Option<&AcmeFiles>) -> Value {
    let https = workspace.listeners.https.port();
    let http = workspace.listeners.http.port();
    let low_port = https.min(http);
    let bind_low_ports = low_port < 1024;

    // `'sozu_managed`: one writable tls dir the agent fills itself; otherwise a volume per host.
    let per_host = if acme.is_some() {
        &[][..]
    } else {
        &pod.hosts[..]
    };
    let tls_mounts: Vec<Value> = per_host
        .iter()
        .map(|host| {
            json!({
                "name": tls_name(host),
                "mountPath": workspace.tls_dir.join(host).to_string_lossy(),
                "readOnly": true,
            })
        })
        .collect();
    let tls_volumes = per_host.iter().map(|host| {
        let name = tls_name(host);
        match workspace.tls_rotation {
            TlsRotation::Reloader => json!({
                "name": name,
                // 0440: the key is readable by the pod's group (fsGroup) only.
                "secret": { "secretName": name, "defaultMode": 0o440 },
            }),
            _ => json!({
                "name": name,
                "csi": {
                    "driver": CSI_DRIVER,
                    "readOnly": true,
                    "volumeAttributes": {
                        "csi.cert-manager.io/issuer-name": workspace.cluster_issuer,
                        "csi.cert-manager.io/issuer-kind": "ClusterIssuer",
                        "csi.cert-manager.io/dns-names": host,
                        // The driver writes the files 0440 root-owned unless given a group.
                        "csi.cert-manager.io/fs-group": RUN_AS.to_string(),
                    },
                },
            }),
        }
    });
    let workspace_items: Vec<Value> = pod
        .workspace_items
        .iter()
        .map(|(key, (path, _))| json!({ "key": key, "path": path }))
        .collect();
    let mut volumes = vec![
        // The socket, and the agent's bulk state files while sozu loads them (about 2 KB per
        // route, gone once loaded): room for ten thousand routes.
        json!({ "name": "run", "emptyDir": { "medium": "Memory", "sizeLimit": "32Mi" } }),
        json!({
            "name": "sozu-config",
            "configMap": { "name": config_map_name(pod), "items": [{ "key": SOZU_CONFIG_KEY, "path": SOZU_CONFIG_FILE }] },
        }),
        // sozu's temporary directory: it hands its state, certificates and private keys
        // included, to each worker it forks through a file there, and cannot start without it.
        // In memory, so the keys never reach a disk, and sozu's alone.
        json!({ "name": "sozu-tmp", "emptyDir": { "medium": "Memory", "sizeLimit": SOZU_TMP_SIZE } }),
        json!({ "name": "tmp", "emptyDir": { "sizeLimit": "64Mi" } }),
        json!({ "name": "workspace", "configMap": { "name": config_map_name(pod), "items": workspace_items } }),
    ];
    volumes.extend(tls_volumes);
    let mut acme_mounts = Vec::new();
    if let Some(acme) = acme {
        volumes.push(
            json!({ "name": "tls", "emptyDir": { "medium": "Memory", "sizeLimit": TLS_DIR_SIZE } }),
        );
        acme_mounts
            .push(json!({ "name": "tls", "mountPath": workspace.tls_dir.to_string_lossy() }));
        volumes.push(json!({ "name": "acme-state", "persistentVolumeClaim": { "claimName": ACME_STATE_CLAIM } }));
        acme_mounts
            .push(json!({ "name": "acme-state", "mountPath": acme.state_dir.to_string_lossy() }));
        for (dir, files) in &acme.dirs {
            let name = acme_files_volume(dir);
            let items: Vec<Value> = files
                .iter()
                .map(|(key, file)| json!({ "key": key, "path": file }))
                .collect();
            volumes.push(json!({
                "name": name,
                // 0440: readable by the pod's group (fsGroup) only.
                "secret": { "secretName": ACME_SECRET, "defaultMode": 0o440, "items": items },
            }));
            acme_mounts.push(
                json!({ "name": name, "mountPath": dir.to_string_lossy(), "readOnly": true }),
            );
        }
    }

    let mut agent_mounts = vec![
        json!({ "name": "run", "mountPath": RUN_DIR }),
        json!({ "name": "tmp", "mountPath": "/tmp" }),
        json!({ "name": "workspace", "mountPath": WORKSPACE_DIR, "readOnly": true }),
    ];
    agent_mounts.extend(tls_mounts);
    agent_mounts.extend(acme_mounts);
    let http_probe = |path: &str, period: u32, failures: u32| {
        json!({
            "httpGet": { "path": path, "port": "admin" },
            "periodSeconds": period,
            "failureThreshold": failures,
        })
    };
    let agent = json!({
        "name": "agent",
        "image": workspace.deploy.agent_image,
        "args": [
            "run",
            "--workspace", format!("{WORKSPACE_DIR}/{}", pod.workspace_entry),
            "--sozu-socket", SOZU_SOCKET,
            "--admin-address", format!("0.0.0.0:{ADMIN_PORT}"),
            // One JSON object per line, for `kubectl logs` and log collectors.
            "--log-format", "json",
        ],
        "ports": [{ "name": "admin", "containerPort": ADMIN_PORT, "protocol": "TCP" }],
        // A native sidecar: started before sozu, stopped after it, restarted on its own.
        "restartPolicy": "Always",
        // /healthz, not /readyz: sozu starts only once this probe passes, and the agent cannot be
        // ready before sozu runs.
        "startupProbe": http_probe("/healthz", 1, 30),
        "livenessProbe": http_probe("/healthz", 10, 3),
        // Ready once sozu holds every route with its certificate: gates the pod's endpoints.
        // Probed every second: a pod joins the Service that much sooner after it can serve,
        // which a rollout pays once per pod (the first probe runs before sozu has started).
        "readinessProbe": http_probe("/readyz", 1, 3),
        "resources": resources(&workspace.deploy.resources.agent),
        "securityContext": security_context(false),
        "volumeMounts": agent_mounts,
    });
    let tcp_probe = |period: u32| json!({ "tcpSocket": { "port": "https" }, "periodSeconds": period, "failureThreshold": 3 });
    let mut sozu = json!({
        "name": "sozu",
        "image": workspace.deploy.sozu_image,
        "args": ["start", "-c", format!("{SOZU_CONFIG_DIR}/{SOZU_CONFIG_FILE}")],
        "ports": [
            { "name": "http", "containerPort": http, "protocol": "TCP" },
            { "name": "https", "containerPort": https, "protocol": "TCP" },
        ],
        "readinessProbe": tcp_probe(1),
        "livenessProbe": tcp_probe(10),
        "resources": resources(&workspace.deploy.resources.sozu),
        "securityContext": security_context(bind_low_ports),
        "volumeMounts": [
            { "name": "run", "mountPath": RUN_DIR },
            { "name": "sozu-config", "mountPath": SOZU_CONFIG_DIR, "readOnly": true },
            { "name": "sozu-tmp", "mountPath": "/tmp" },
        ],
    });
    if workspace.deploy.pre_stop_seconds > 0 {
        // The load balancer keeps sending new connections until the pod's endpoint is removed,
        // which takes seconds after the deletion: sozu keeps accepting until then. The SIGTERM
        // that follows is sozu's soft stop: it stops accepting and finishes the requests in
        // flight. The sleep action is the kubelet's own, so the image needs no shell.
        sozu["lifecycle"] = json!({
            "preStop": { "sleep": { "seconds": workspace.deploy.pre_stop_seconds } },
        });
    }

    let mut pod_security = json!({
        "runAsNonRoot": true,
        "runAsUser": RUN_AS,
        "runAsGroup": RUN_AS,
        "fsGroup": RUN_AS,
        "seccompProfile": { "type": "RuntimeDefault" },
    });
    if bind_low_ports {
        // A capability added for a non-root user takes effect only through file capabilities on
        // the binary (Kubernetes grants no ambient capabilities). This "safe" sysctl, scoped to
        // the pod's network namespace, lets sozu bind the low port whatever its image carries.
        pod_security["sysctls"] = json!([
            { "name": "net.ipv4.ip_unprivileged_port_start", "value": low_port.to_string() },
        ]);
    }
    let mut annotations = json!({ "kubectl.kubernetes.io/default-container": "sozu" });
    if !workspace.deploy.service_monitor {
        annotations["prometheus.io/scrape"] = json!("true");
        annotations["prometheus.io/port"] = json!(ADMIN_PORT.to_string());
        annotations["prometheus.io/path"] = json!("/metrics");
    }
    let strategy = if acme.is_some() {
        // The one pod holds the ACME state's claim (ReadWriteOnce) and its lock: a new pod can
        // only start once the old one is gone.
        json!({ "type": "Recreate" })
    } else {
        // A new pod serves before an old one stops: adding a route adds a volume, which rolls
        // the pods.
        json!({ "type": "RollingUpdate", "rollingUpdate": { "maxSurge": 1, "maxUnavailable": 0 } })
    };
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(workspace, APP),
        "spec": {
            "replicas": workspace.deploy.replicas,
            "selector": { "matchLabels": selector() },
            "strategy": strategy,
            "template": {
                "metadata": { "labels": labels(), "annotations": annotations },
                "spec": {
                    "serviceAccountName": APP,
                    // From the deletion to the kill: the preStop wait, then the soft stop. The
                    // agent, a sidecar, is stopped once sozu has exited.
                    "terminationGracePeriodSeconds": workspace.deploy.termination_grace_period_seconds,
                    "automountServiceAccountToken": false,
                    "enableServiceLinks": false,
                    "securityContext": pod_security,
                    "topologySpreadConstraints": [{
                        "maxSkew": 1,
                        "topologyKey": "kubernetes.io/hostname",
                        "whenUnsatisfiable": "ScheduleAnyway",
                        "labelSelector": { "matchLabels": selector() },
                        // Spread the pods of one revision: during a rollout, the old pods
                        // leaving must not skew where the new ones go.
                        "matchLabelKeys": ["pod-template-hash"],
                    }],
                    "initContainers": [agent],
                    "containers": [sozu],
                    "volumes": volumes,
                },
            },
        },
    })
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
