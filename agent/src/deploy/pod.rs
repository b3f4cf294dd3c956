//! The workload (sozu with the agent as a native sidecar) and its PodDisruptionBudget.
//!
//! Without ACME, a Deployment: every replica is alike, and a rollout starts a new pod before an
//! old one stops. With `'sozu_managed`, a StatefulSet: each replica is an ACME client with its
//! own account and state on a claim of its own, which follows it through restarts and
//! rescheduling. A StatefulSet cannot start a replica's new pod before its old one has stopped
//! (one claim, one pod), so a rollout replaces one replica at a time while the others serve.

use super::*;

pub(super) fn pod_disruption_budget(workspace: &Workspace) -> Value {
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
pub(super) fn resources(r: &ContainerResources) -> Value {
    json!({
        "requests": { "cpu": r.requests.cpu, "memory": r.requests.memory },
        "limits": { "cpu": r.limits.cpu, "memory": r.limits.memory },
    })
}
/// Pod Security "restricted" for one container. `bind_low_ports` adds NET_BIND_SERVICE, the one
/// capability "restricted" allows.
pub(super) fn security_context(bind_low_ports: bool) -> Value {
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
pub(super) fn workload(
    workspace: &Workspace,
    pod: &Pod,
    acme: Option<&AcmeFiles>,
    client_auth: &SecretFiles,
    policy_files: &PolicyFiles,
) -> Value {
    let https = workspace.listeners.https.port();
    let http = workspace.listeners.http.port();
    let route_ports = route_ports(workspace);
    let low_port = route_ports
        .iter()
        .map(|p| p.port)
        .fold(https.min(http), u16::min);
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
                // 0440: the key is readable by the pod's group (fsGroup) only. Optional: a
                // Secret cert-manager has not issued yet is mounted empty instead of keeping the
                // whole pod from starting; the agent reports that host's pair missing, serves
                // the others, and picks the pair up once the kubelet fills the volume in.
                "secret": { "secretName": name, "defaultMode": 0o440, "optional": true },
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
        // The volume itself comes from the StatefulSet's claim template.
        acme_mounts.push(
            json!({ "name": ACME_STATE_VOLUME, "mountPath": acme.state_dir.to_string_lossy() }),
        );
        // 0440: readable by the pod's group (fsGroup) only.
        let (secret_volumes, mounts) = acme.files.volumes(ACME_SECRET, "acme-files", 0o440);
        volumes.extend(secret_volumes);
        acme_mounts.extend(mounts);
    }

    // The device CA and its CRLs: sozu reads them when it starts, the agent as they change. Not
    // secret, but kept beside the other credentials; 0444: both containers read them.
    let (client_auth_volumes, client_auth_mounts) =
        client_auth.volumes(CLIENT_AUTH_SECRET, "client-auth", 0o444);
    volumes.extend(client_auth_volumes);
    let mut agent_mounts = vec![
        json!({ "name": "run", "mountPath": RUN_DIR }),
        json!({ "name": "tmp", "mountPath": "/tmp" }),
        json!({ "name": "workspace", "mountPath": WORKSPACE_DIR, "readOnly": true }),
    ];
    agent_mounts.extend(tls_mounts);
    agent_mounts.extend(acme_mounts);
    agent_mounts.extend(client_auth_mounts.iter().cloned());
    // Users files, for the agent alone (it sends them to sozu), readable by the pod's group
    // only. Pages are in the workspace's ConfigMap.
    let (users_volumes, users_mounts) =
        policy_files
            .users
            .volumes(BASIC_AUTH_SECRET, "basic-auth", 0o440);
    volumes.extend(users_volumes);
    agent_mounts.extend(users_mounts);
    let http_probe = |path: &str, period: u32, failures: u32| {
        json!({
            "httpGet": { "path": path, "port": "admin" },
            "periodSeconds": period,
            "failureThreshold": failures,
        })
    };
    let mut agent_args = vec![
        "run".to_owned(),
        "--workspace".to_owned(),
        format!("{WORKSPACE_DIR}/{}", pod.workspace_entry),
        "--sozu-socket".to_owned(),
        SOZU_SOCKET.to_owned(),
        "--admin-address".to_owned(),
        format!("0.0.0.0:{ADMIN_PORT}"),
        // One JSON object per line, for `kubectl logs` and log collectors.
        "--log-format".to_owned(),
        "json".to_owned(),
    ];
    if workspace.deploy.readiness == ReadinessMode::Strict {
        agent_args.extend(["--readiness".to_owned(), "strict".to_owned()]);
    }
    let agent = json!({
        "name": "agent",
        "image": workspace.deploy.agent_image,
        "args": agent_args,
        "ports": [{ "name": "admin", "containerPort": ADMIN_PORT, "protocol": "TCP" }],
        // A native sidecar: started before sozu, stopped after it, restarted on its own.
        "restartPolicy": "Always",
        // /healthz, not /readyz: sozu starts only once this probe passes, and the agent cannot be
        // ready before sozu runs.
        "startupProbe": http_probe("/healthz", 1, 30),
        "livenessProbe": http_probe("/healthz", 10, 3),
        // Ready once sozu holds every route that can be served (`deploy.readiness = 'strict`:
        // every route), each with its certificate: gates the pod's endpoints. A route whose
        // certificate or upstream is missing is reported and does not keep the others from
        // serving, in this pod or in the next one a rollout or a node loss starts. Probed every
        // second: a pod joins the Service that much sooner after it can serve,
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
    if let Some(ports) = sozu["ports"].as_array_mut() {
        for port in &route_ports {
            ports.push(json!({
                "name": port.name(),
                "containerPort": port.port,
                "protocol": port.protocol,
            }));
        }
    }
    if let Some(mounts) = sozu["volumeMounts"].as_array_mut() {
        mounts.extend(client_auth_mounts);
    }
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
    // Replicas on different nodes, or not scheduled: two replicas on one node are one node loss
    // from none. Only nodes the pods may run on count (taints honoured), so a cluster of one
    // schedulable node still runs them all.
    let mut spread = json!({
        "maxSkew": 1,
        "topologyKey": "kubernetes.io/hostname",
        "whenUnsatisfiable": "DoNotSchedule",
        "nodeTaintsPolicy": "Honor",
        "labelSelector": { "matchLabels": selector() },
    });
    if acme.is_none() {
        // Spread the pods of one revision: during a rollout, the old pods leaving must not skew
        // where the new ones go. A StatefulSet has no surge: its new pod replaces an old one,
        // and is spread against the replicas that stay.
        spread["matchLabelKeys"] = json!(["pod-template-hash"]);
    }
    let template = json!({
        "metadata": { "labels": labels(), "annotations": annotations },
        "spec": {
            "serviceAccountName": APP,
            // From the deletion to the kill: the preStop wait, then the soft stop. The agent, a
            // sidecar, is stopped once sozu has exited.
            "terminationGracePeriodSeconds": workspace.deploy.termination_grace_period_seconds,
            "automountServiceAccountToken": false,
            "enableServiceLinks": false,
            "securityContext": pod_security,
            "topologySpreadConstraints": [spread],
            "initContainers": [agent],
            "containers": [sozu],
            "volumes": volumes,
        },
    });
    if acme.is_some() {
        return json!({
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": metadata(workspace, APP),
            "spec": {
                "replicas": workspace.deploy.replicas,
                "selector": { "matchLabels": selector() },
                "serviceName": REPLICAS_SERVICE,
                // The replicas start, and first order, together; a rollout still replaces one
                // at a time.
                "podManagementPolicy": "Parallel",
                // One replica at a time (a StatefulSet cannot take 0): the others serve
                // meanwhile, and the PodDisruptionBudget keeps evictions to one as well.
                "updateStrategy": { "type": "RollingUpdate", "rollingUpdate": { "maxUnavailable": 1 } },
                // A new pod is Ready before the load balancer sends it anything, which takes
                // about as long as its removal takes after a deletion (what the preStop wait is
                // sized for): the next replica is replaced only once the new one is in.
                "minReadySeconds": workspace.deploy.pre_stop_seconds,
                "persistentVolumeClaimRetentionPolicy": { "whenDeleted": "Retain", "whenScaled": "Retain" },
                "volumeClaimTemplates": [acme_state_claim_template()],
                "template": template,
            },
        });
    }
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(workspace, APP),
        "spec": {
            "replicas": workspace.deploy.replicas,
            "selector": { "matchLabels": selector() },
            // A new pod serves before an old one stops: adding a route adds a volume, which
            // rolls the pods.
            "strategy": { "type": "RollingUpdate", "rollingUpdate": { "maxSurge": 1, "maxUnavailable": 0 } },
            "template": template,
        },
    })
}
