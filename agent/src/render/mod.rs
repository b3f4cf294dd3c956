//! Files made from a [`Workspace`] for others to read: the normalised model as JSON ([`json`]),
//! a complete sozu configuration ([`sozu_toml`]) and the alert rules on the agent's metrics
//! (`alerts`). Formatting is pure and deterministic (routes are sorted, maps are ordered);
//! [`write_atomic`] is the only I/O here. The Kubernetes manifests and DNS records are
//! [`crate::deploy`]'s.

pub mod alerts;
mod sozu_toml;

pub use sozu_toml::{max_command_buffer_size, sozu_toml, sozu_toml_warnings, SozuSettings};

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::workspace::Workspace;

#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error("cannot serialise the {format} output: {reason}")]
    Serialise {
        format: &'static str,
        reason: String,
    },
    #[error("cannot write {}: {error}", path.display())]
    Write {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error(
        "route `{route}`: {what} cannot be written in sozu's configuration file; the agent \
         applies it over sozu's socket (run the agent beside sozu, or render --format k8s)"
    )]
    Unexpressible { route: String, what: String },
}

impl RenderError {
    /// Whether the workspace asks for what the output cannot hold (not an I/O failure).
    pub fn is_invalid_workspace(&self) -> bool {
        matches!(self, RenderError::Unexpressible { .. })
    }
}

/// The normalised model, pretty-printed, with a trailing newline.
pub fn json(workspace: &Workspace) -> Result<String, RenderError> {
    let mut out =
        serde_json::to_string_pretty(workspace).map_err(|err| RenderError::Serialise {
            format: "json",
            reason: err.to_string(),
        })?;
    out.push('\n');
    Ok(out)
}

/// Replaces `path` with `contents` so that a reader sees the old file or the new one, never a
/// mix, and a failure leaves the old file untouched: write a temporary file in the same
/// directory, fsync it, rename it over `path`, fsync the directory. A new file gets mode 0644; an
/// existing one keeps its mode.
pub fn write_atomic(path: &Path, contents: &[u8]) -> Result<(), RenderError> {
    use std::os::unix::fs::PermissionsExt;

    let fail = |error| RenderError::Write {
        path: path.to_owned(),
        error: without_temporary_name(error),
    };
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let mode = match std::fs::metadata(path) {
        Ok(meta) => meta.permissions().mode() & 0o7777,
        Err(_) => 0o644,
    };
    let mut tmp = tempfile::Builder::new()
        .prefix(".private-ingress-")
        .tempfile_in(dir)
        .map_err(fail)?;
    tmp.write_all(contents).map_err(fail)?;
    tmp.as_file()
        .set_permissions(std::fs::Permissions::from_mode(mode))
        .map_err(fail)?;
    tmp.as_file().sync_all().map_err(fail)?;
    tmp.persist(path).map_err(|err| fail(err.error))?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(fail)
}

/// tempfile's errors end in the temporary file's name (`… at path "/dir/.private-ingress-x1"`),
/// a file the user never asked for; the path they gave is named already. tempfile keeps the
/// system's error only as text, so the text is cut.
fn without_temporary_name(error: std::io::Error) -> std::io::Error {
    let text = error.to_string();
    match text.rfind(" at path \"") {
        Some(at) if error.get_ref().is_some() => std::io::Error::new(error.kind(), &text[..at]),
        _ => error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_atomic_replaces_and_keeps_the_old_file_on_failure() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("out.toml");
        write_atomic(&target, b"one").unwrap();
        write_atomic(&target, b"two").unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"two");
        // A target whose directory does not exist fails and creates nothing.
        let missing = dir.path().join("nope/out.toml");
        assert!(write_atomic(&missing, b"x").is_err());
        let leftovers: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(leftovers.len(), 1, "no temporary file is left behind");
    }
}
