//! Certificates per host: cert-manager Certificates (`'reloader`), or with `'sozu_managed` the
//! claim template of each replica's ACME state and the files its Secret is mounted as.

use super::*;

/// `'reloader`: cert-manager keeps the host's certificate in a Secret of the same name, which the
/// pod mounts; the agent picks renewals up from the mount, so no rollout is needed.
pub(super) fn certificate(workspace: &Workspace, host: &str) -> Value {
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
/// `'sozu_managed`: the claim template of the StatefulSet, one claim per replica. The account,
/// the certificates and the order state outlive the pod there, so a replica restarted or
/// rescheduled neither creates a second account nor orders again; the claims stay when the
/// StatefulSet is scaled down or deleted (Kubernetes' default, written out), so scaling back up
/// costs no order either.
pub(super) fn acme_state_claim_template() -> Value {
    json!({
        "metadata": { "name": ACME_STATE_VOLUME, "labels": labels() },
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "resources": { "requests": { "storage": ACME_STATE_SIZE } },
        },
    })
}
/// The files `'sozu_managed` reads, each a key of the Secret [`ACME_SECRET`] mounted at the path
/// the workspace names: the DNS provider's secret, the EAB key, the CA bundle.
pub(super) struct AcmeFiles {
    pub(super) state_dir: PathBuf,
    /// Directory → (Secret key, file name) of the files in it.
    pub(super) dirs: BTreeMap<PathBuf, Vec<(&'static str, String)>>,
}
pub(super) fn acme_files(acme: &crate::workspace::Acme) -> Result<AcmeFiles, DeployError> {
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
pub(super) fn acme_files_volume(dir: &Path) -> String {
    let digest = sha2::Sha256::digest(dir.to_string_lossy().as_bytes());
    let short: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
    format!("acme-files-{short}")
}

/// `listeners.client_auth`: the device CA and its CRLs, keys of the Secret [`CLIENT_AUTH_SECRET`]
/// (created by the operator: `client-ca`, and `client-crl-<n>` for the n-th of `crl_files`),
/// mounted at the paths the workspace names, in sozu (which reads them when it starts) and in
/// the agent. Directory → (Secret key, file name) of the files in it; empty with mode 'off.
pub(super) fn client_auth_files(
    workspace: &Workspace,
) -> Result<BTreeMap<PathBuf, Vec<(String, String)>>, DeployError> {
    let auth = &workspace.listener_policy.client_auth;
    let mut dirs: BTreeMap<PathBuf, Vec<(String, String)>> = BTreeMap::new();
    if auth.mode == crate::workspace::ClientAuthMode::Off {
        return Ok(dirs);
    }
    let files = auth
        .ca_file
        .iter()
        .map(|p| ("client-ca".to_owned(), p))
        .chain(
            auth.crl_files
                .iter()
                .enumerate()
                .map(|(i, p)| (format!("client-crl-{i}"), p)),
        );
    let mut seen: BTreeMap<&Path, String> = BTreeMap::new();
    for (key, path) in files {
        if let Some(first) = seen.insert(path, key.clone()) {
            return Err(DeployError::ClientAuthFileClash {
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
    Ok(dirs)
}

/// A volume name for a directory of client-auth files: `client-auth-<8 hex digits>`.
pub(super) fn client_auth_volume(dir: &Path) -> String {
    let digest = sha2::Sha256::digest(dir.to_string_lossy().as_bytes());
    let short: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
    format!("client-auth-{short}")
}
