//! The objects of a `render --format k8s` stream that a kubelet acts on: the pod template of its
//! workload (a Deployment, or a StatefulSet and its claim templates), and the ConfigMaps its
//! volumes name. Parsed into the Kubernetes API types
//! (k8s-openapi), so field names and shapes are the API's own.
//!
//! Anything in the pod that this kubelet does not emulate is refused by [`Manifest::parse`]
//! rather than ignored: a constraint silently dropped here would let the pod pass under
//! conditions it never meets in a cluster.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{ConfigMap, Container, PersistentVolumeClaim, PodSpec, Probe};
use serde::Deserialize;

/// The pod the workload would create, and the ConfigMaps of the stream by name.
pub struct Manifest {
    /// The workload's name: a StatefulSet's pods are named after it and their ordinal.
    pub name: String,
    pub spec: PodSpec,
    pub config_maps: BTreeMap<String, BTreeMap<String, String>>,
    /// A StatefulSet's claim templates: each of its pods mounts a claim of its own made from
    /// each, by the template's name.
    pub claim_templates: Vec<PersistentVolumeClaim>,
}

impl Manifest {
    /// Parses a multi-document YAML stream. Panics with the reason on anything this kubelet
    /// cannot honour.
    pub fn parse(yaml: &str) -> Manifest {
        let mut workload = None;
        let mut config_maps = BTreeMap::new();
        for document in serde_norway::Deserializer::from_str(yaml) {
            let value = serde_json::Value::deserialize(document).expect("the stream is YAML");
            match value["kind"].as_str() {
                Some("Deployment") => {
                    assert!(workload.is_none(), "one workload per stream");
                    let deployment =
                        serde_json::from_value::<Deployment>(value).expect("a valid Deployment");
                    let spec = deployment.spec.and_then(|spec| spec.template.spec);
                    workload = Some((deployment.metadata.name, spec, Vec::new()));
                }
                Some("StatefulSet") => {
                    assert!(workload.is_none(), "one workload per stream");
                    let set =
                        serde_json::from_value::<StatefulSet>(value).expect("a valid StatefulSet");
                    let (spec, templates) = match set.spec {
                        Some(spec) => (
                            spec.template.spec,
                            spec.volume_claim_templates.unwrap_or_default(),
                        ),
                        None => (None, Vec::new()),
                    };
                    workload = Some((set.metadata.name, spec, templates));
                }
                Some("ConfigMap") => {
                    let map: ConfigMap = serde_json::from_value(value).expect("a valid ConfigMap");
                    let name = map.metadata.name.clone().expect("a named ConfigMap");
                    config_maps.insert(name, map.data.unwrap_or_default());
                }
                _ => {}
            }
        }
        let (name, spec, claim_templates) =
            workload.expect("the stream holds a Deployment or a StatefulSet");
        let name = name.expect("a named workload");
        let spec = spec.expect("the workload has a pod template");
        refuse_what_is_not_emulated(&spec, &claim_templates);
        Manifest {
            name,
            spec,
            config_maps,
            claim_templates,
        }
    }

    /// The pod's native sidecars and regular init containers, in order, then its containers.
    pub fn init_containers(&self) -> &[Container] {
        self.spec.init_containers.as_deref().unwrap_or_default()
    }

    pub fn containers(&self) -> &[Container] {
        &self.spec.containers
    }
}

/// A native sidecar: an init container that keeps running (`restartPolicy: Always`).
pub fn is_sidecar(container: &Container) -> bool {
    container.restart_policy.as_deref() == Some("Always")
}

fn refuse_what_is_not_emulated(spec: &PodSpec, claim_templates: &[PersistentVolumeClaim]) {
    let refuse = |what: &str| panic!("the pod harness does not emulate {what}");
    if spec.host_network == Some(true) || spec.host_pid == Some(true) || spec.host_ipc == Some(true)
    {
        refuse("host namespaces");
    }
    if spec.share_process_namespace == Some(true) {
        refuse("a shared process namespace");
    }
    for sysctl in spec
        .security_context
        .as_ref()
        .and_then(|s| s.sysctls.as_deref())
        .unwrap_or_default()
    {
        if !sysctl.name.starts_with("net.") {
            refuse(&format!("the sysctl {}", sysctl.name));
        }
    }
    for volume in spec.volumes.as_deref().unwrap_or_default() {
        let csi_driver = volume.csi.as_ref().map(|csi| csi.driver.as_str());
        if volume.empty_dir.is_none()
            && volume.config_map.is_none()
            && volume.secret.is_none()
            && csi_driver != Some("csi.cert-manager.io")
        {
            refuse(&format!(
                "the volume {} (emptyDir, configMap, secret and cert-manager's CSI driver only; \
                 claims from a StatefulSet's templates)",
                volume.name
            ));
        }
    }
    for template in claim_templates {
        let spec = template.spec.as_ref();
        let modes = spec
            .and_then(|s| s.access_modes.as_deref())
            .unwrap_or_default();
        if modes != ["ReadWriteOnce"] {
            refuse(&format!("claims with access modes {modes:?}"));
        }
        if spec.is_some_and(|s| s.volume_mode.as_deref().is_some_and(|m| m != "Filesystem")) {
            refuse("block volumes");
        }
    }
    let init = spec.init_containers.as_deref().unwrap_or_default();
    for container in init.iter().chain(&spec.containers) {
        let name = &container.name;
        if container
            .command
            .iter()
            .chain(&container.args)
            .flatten()
            .any(|a| a.contains("$("))
        {
            refuse(&format!("{name}'s $(VAR) references in command or args"));
        }
        if container.env_from.is_some()
            || container
                .env
                .iter()
                .flatten()
                .any(|e| e.value_from.is_some())
        {
            refuse(&format!("{name}'s env taken from other objects"));
        }
        for mount in container.volume_mounts.iter().flatten() {
            if mount.sub_path.is_some() || mount.sub_path_expr.is_some() {
                refuse(&format!("{name}'s subPath mounts"));
            }
        }
        for probe in [
            &container.startup_probe,
            &container.readiness_probe,
            &container.liveness_probe,
        ]
        .into_iter()
        .flatten()
        {
            check_probe(name, probe);
        }
        if let Some(lifecycle) = &container.lifecycle {
            if lifecycle.post_start.is_some() {
                refuse(&format!("{name}'s postStart hook"));
            }
            if let Some(pre_stop) = &lifecycle.pre_stop {
                if pre_stop.sleep.is_none()
                    || pre_stop.exec.is_some()
                    || pre_stop.http_get.is_some()
                    || pre_stop.tcp_socket.is_some()
                {
                    refuse(&format!("{name}'s preStop hook other than sleep"));
                }
            }
        }
        if let Some(security) = &container.security_context {
            if security.privileged == Some(true) {
                refuse(&format!("{name} as privileged"));
            }
            let added = security
                .capabilities
                .as_ref()
                .and_then(|c| c.add.as_deref())
                .unwrap_or_default();
            // Kubernetes grants no ambient capabilities: an added capability does nothing for a
            // non-root process without file capabilities, and this kubelet grants none either.
            if added.iter().any(|c| c != "NET_BIND_SERVICE") {
                refuse(&format!("{name}'s capabilities {added:?}"));
            }
        }
    }
}

fn check_probe(container: &str, probe: &Probe) {
    if probe.http_get.is_none() && probe.tcp_socket.is_none() {
        panic!("the pod harness does not emulate {container}'s exec or gRPC probes");
    }
    if probe
        .http_get
        .as_ref()
        .is_some_and(|get| get.host.is_some() || get.scheme.as_deref().is_some_and(|s| s != "HTTP"))
    {
        panic!(
            "the pod harness does not emulate {container}'s probe to another host or over HTTPS"
        );
    }
}
