//! Monitoring objects, each when asked for: the metrics Service and ServiceMonitor, the
//! PrometheusRule, the Grafana dashboard's ConfigMap.

use super::*;

pub(super) fn metrics_labels() -> Value {
    json!({ "app.kubernetes.io/name": APP, "app.kubernetes.io/component": "metrics" })
}
/// A ClusterIP Service for the ServiceMonitor to select: the load balancer must not expose the
/// admin port.
pub(super) fn metrics_service(workspace: &Workspace) -> Value {
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
pub(super) fn service_monitor(workspace: &Workspace) -> Value {
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
/// The alert rules of [`crate::render::alerts`], for a prometheus-operator Prometheus to load.
pub(super) fn prometheus_rule(workspace: &Workspace, alerts: &AlertSettings) -> Value {
    json!({
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": metadata(workspace, APP),
        "spec": crate::render::alerts::groups(alerts),
    })
}
/// The Grafana dashboard (`deploy/grafana-dashboard.json`), in a ConfigMap carrying the label
/// Grafana's dashboard sidecar looks for (`grafana_dashboard: "1"`, the Grafana and
/// kube-prometheus-stack charts' default).
pub(super) fn grafana_dashboard(workspace: &Workspace) -> Value {
    let mut metadata = metadata(workspace, &format!("{APP}-dashboard"));
    metadata["labels"]["grafana_dashboard"] = json!("1");
    json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata,
        "data": { format!("{APP}.json"): DASHBOARD },
    })
}
