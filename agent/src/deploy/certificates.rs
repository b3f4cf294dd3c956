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
/// Files a Secret's keys are mounted as, at the paths the workspace names: one volume per
/// directory (a Secret volume is a directory), its items the Secret keys of the files in it.
#[derive(Default)]
pub(super) struct SecretFiles {
    /// Directory → (Secret key, file name) of the files in it.
    pub(super) dirs: BTreeMap<PathBuf, Vec<(String, String)>>,
}

/// Two keys that would be mounted at the same path: (first key, second key, the path).
pub(super) struct Clash(pub(super) String, pub(super) String, pub(super) String);

impl SecretFiles {
    /// Groups `files` (Secret key, path) by directory.
    pub(super) fn group<'a>(
        files: impl IntoIterator<Item = (String, &'a Path)>,
    ) -> Result<SecretFiles, Clash> {
        let mut grouped = SecretFiles::default();
        let mut seen: BTreeMap<&Path, String> = BTreeMap::new();
        for (key, path) in files {
            if let Some(first) = seen.insert(path, key.clone()) {
                return Err(Clash(first, key, path.display().to_string()));
            }
            let dir = path.parent().unwrap_or(Path::new("/")).to_owned();
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            grouped.dirs.entry(dir).or_default().push((key, name));
        }
        Ok(grouped)
    }

    /// The volumes of the Secret `secret` (named `<prefix>-<8 hex digits of SHA-256(dir)>`, its
    /// files with `mode`) and their read-only mounts.
    pub(super) fn volumes(
        &self,
        secret: &str,
        prefix: &str,
        mode: u32,
    ) -> (Vec<Value>, Vec<Value>) {
        self.dirs
            .iter()
            .map(|(dir, files)| {
                let digest = sha2::Sha256::digest(dir.to_string_lossy().as_bytes());
                let short: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
                let name = format!("{prefix}-{short}");
                let items: Vec<Value> = files
                    .iter()
                    .map(|(key, file)| json!({ "key": key, "path": file }))
                    .collect();
                (
                    json!({
                        "name": name,
                        "secret": { "secretName": secret, "defaultMode": mode, "items": items },
                    }),
                    json!({ "name": name, "mountPath": dir.to_string_lossy(), "readOnly": true }),
                )
            })
            .unzip()
    }
}

/// The files `'sozu_managed` reads, each a key of the Secret [`ACME_SECRET`] mounted at the path
/// the workspace names: the DNS provider's secret, the EAB key, the CA bundle.
pub(super) struct AcmeFiles {
    pub(super) state_dir: PathBuf,
    pub(super) files: SecretFiles,
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
    let files = SecretFiles::group(files.into_iter().map(|(k, p)| (k.to_owned(), p))).map_err(
        |Clash(first, second, name)| DeployError::AcmeFileClash {
            first,
            second,
            name,
        },
    )?;
    Ok(AcmeFiles {
        state_dir: acme.state_dir.clone(),
        files,
    })
}

/// `listeners.client_auth`: the device CA and its CRLs, keys of the Secret [`CLIENT_AUTH_SECRET`]
/// (created by the operator: `client-ca`, and `client-crl-<n>` for the n-th of `crl_files`),
/// mounted at the paths the workspace names, in sozu (which reads them when it starts) and in
/// the agent. None with mode 'off.
pub(super) fn client_auth_files(workspace: &Workspace) -> Result<SecretFiles, DeployError> {
    let auth = &workspace.listener_policy.client_auth;
    if auth.mode == crate::workspace::ClientAuthMode::Off {
        return Ok(SecretFiles::default());
    }
    let files = auth
        .ca_file
        .iter()
        .map(|p| ("client-ca".to_owned(), p.as_path()))
        .chain(
            auth.crl_files
                .iter()
                .enumerate()
                .map(|(i, p)| (format!("client-crl-{i}"), p.as_path())),
        );
    SecretFiles::group(files).map_err(|Clash(first, second, name)| {
        DeployError::ClientAuthFileClash {
            first,
            second,
            name,
        }
    })
}
