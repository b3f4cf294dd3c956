//! The files route policies name, in the pod. Error pages are files of the workspace's directory
//! (the contract refuses a page outside the workspace's tree, and the pod's tree is that
//! directory): they ship in the workspace's ConfigMap, where a relative path finds them in the
//! pod as it does here. Basic-auth users files are keys of a Secret ([`BASIC_AUTH_SECRET`]),
//! each mounted in the agent at the path the workspace names. A users file is a credential: one
//! in the workspace's directory would ship in the ConfigMap, and is refused.

use super::*;

/// The pages and users files of the workspace's policies, as the pod holds them.
#[derive(Default)]
pub(super) struct PolicyFiles {
    /// ConfigMap path (relative to the workspace's mount) → the page's text.
    pub(super) shipped_pages: BTreeMap<String, String>,
    /// Users files, from the operator's Secret.
    pub(super) users: SecretFiles,
}

pub(super) fn policy_files(
    workspace: &Workspace,
    files: &WorkspaceFiles,
) -> Result<PolicyFiles, DeployError> {
    let (users, pages) = crate::plan::desired::policy_file_paths(workspace);
    let inside = |path: &Path| -> Option<String> {
        let rel = path.strip_prefix(files.dir.as_deref()?).ok()?;
        Some(
            rel.components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join("/"),
        )
    };
    let mut out = PolicyFiles::default();
    for page in pages {
        let rel = inside(page).ok_or_else(|| DeployError::PageOutsideWorkspace {
            path: page.to_owned(),
        })?;
        let text = std::fs::read_to_string(page).map_err(|e| DeployError::Read {
            path: page.to_owned(),
            reason: e.to_string(),
        })?;
        out.shipped_pages.insert(rel, text);
    }
    if let Some(inside) = users.iter().find(|u| inside(u).is_some()) {
        return Err(DeployError::UsersFileInWorkspace {
            path: inside.to_path_buf(),
        });
    }
    out.users = SecretFiles::group(users.into_iter().map(|p| {
        let key = p
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        (key, p)
    }))
    .map_err(|Clash(first, second, name)| DeployError::PolicyFileClash {
        what: "basic-auth users files",
        store: BASIC_AUTH_SECRET,
        detail: format!("{first} and {second} ({name})"),
    })?;
    Ok(out)
}
