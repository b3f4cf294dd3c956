//! The objects of a `render --format k8s` stream that a kubelet acts on: the Deployment's pod
//! template and the ConfigMaps its volumes name. Parsed into the Kubernetes API types
//! (k8s-openapi), so field names and shapes are the API's own.
//!
//! Anything in the pod that this kubelet does not emulate is refused by [`Manifest::parse`]
//! rather than ignored: a constraint silently dropped here would let the pod pass under
//! conditions it never meets in a cluster.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Container, PodSpec, Probe};
use serde::Deserialize;

/// The pod the Deployment would create, and the ConfigMaps of the stream by name.
pub struct Manifest {
    pub name: String,
    pub spec: PodSpec,
    pub config_maps: BTreeMap<String, BTreeMap<String, String>>,
}

impl Manifest {
    /// Parses a multi-document YAML stream. Panics with the reason on anything this kubelet
    /// cannot honour.
    pub fn parse(yaml: &str) -> Manifest {
        let mut deployment = None;
        let mut config_maps = BTreeMap::new();
        for document in serde_norway::Deserializer::from_str(yaml) {
            let value = serde_json::Value::deserialize(document).expect("the stream is YAML");
            match value["kind"].as_str() {
                Some("Deployment") => {
                    assert!(deployment.is_none(), "one Deployment per stream");
                    deployment = Some(
                        serde_json::from_value::<Deployment>(value).expect("a valid Deployment"),
                    );
                }
                Some("ConfigMap") => {
                    let map: ConfigMap = serde_json::from_value(value).expect("a valid ConfigMap");
                    let name = map.metadata.name.clone().expect("a named ConfigMap");
                    config_maps.insert(name, map.data.unwrap_or_default());
                }
                _ => {}
            }
        }
        let deployment = deployment.expect("the stream holds a Deployment");
        let name = deployment
            .metadata
            .name
            .clone()
            .expect("a named Deployment");
        let spec = deployment
            .spec
            .and_then(|spec| spec.template.spec)
            .expect("the Deployment has a pod template");
        refuse_what_is_not_emulated(&spec);
        Manifest {
            name,
            spec,
            config_maps,
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

fn refuse_what_is_not_emulated(spec: &PodSpec) {
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
            && csi_driver != Some("csi.cert-manager.io")
        {
            refuse(&format!(
                "the volume {} (emptyDir, configMap and cert-manager's CSI driver only)",
                volume.name
            ));
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
