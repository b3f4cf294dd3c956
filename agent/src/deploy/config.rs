//! The Namespace, the ServiceAccount and the ConfigMap (the workspace's files and sozu's bootstrap
//! configuration).

use super::*;

pub(super) fn namespace(workspace: &Workspace) -> Value {
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
pub(super) fn service_account(workspace: &Workspace) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": metadata(workspace, APP),
        // The agent reads files and a socket; it never calls the Kubernetes API.
        "automountServiceAccountToken": false,
    })
}
pub(super) fn config_map(workspace: &Workspace, pod: &Pod) -> Result<Value, DeployError> {
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
pub(super) fn config_map_name(pod: &Pod) -> String {
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
/// A ConfigMap key for a workspace file: its relative path with `/` written `--` (keys cannot
/// hold `/`; the volume's `items` put the file back at its path).
pub(super) fn configmap_key(path: &str) -> Result<String, DeployError> {
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
