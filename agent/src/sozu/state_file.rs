//! A bulk change written as a state file that sozu loads itself (`LoadState`), in sozu's own
//! format: one JSON `WorkerRequest` per entry, each ended by a newline and a NUL. The file never
//! holds a certificate, whose key would then sit on a disk: a certificate operation is refused
//! before anything is written.

use std::io::Write;
use std::path::Path;

use sozu_command_lib::proto::command::{Request, WorkerRequest};
use tempfile::NamedTempFile;

use super::request::to_request;
use super::SozuError;
use crate::plan::Op;

/// Writes `ops` into a new file in `dir` (made private to this user first), removed when the
/// returned handle is dropped.
pub(super) fn write(ops: &[Op], dir: &Path) -> Result<NamedTempFile, SozuError> {
    let file_error = |reason: String| SozuError::BatchFile {
        dir: dir.to_owned(),
        reason,
    };
    if let Some(op) = ops.iter().find(|op| {
        matches!(
            op,
            Op::AddCertificate { .. }
                | Op::ReplaceCertificate { .. }
                | Op::RemoveCertificate { .. }
        )
    }) {
        return Err(file_error(format!(
            "`{}` is a certificate operation: a state file never carries one (its key would \
             be written to disk)",
            op.describe()
        )));
    }
    private_dir(dir).map_err(file_error)?;
    let mut file = tempfile::Builder::new()
        .prefix(".private-ingress-")
        .suffix(".state")
        .tempfile_in(dir)
        .map_err(|e| file_error(e.to_string()))?;
    {
        let mut out = std::io::BufWriter::new(file.as_file_mut());
        for (i, op) in ops.iter().enumerate() {
            let entry = WorkerRequest::new(format!("pi-{i}"), Request::from(to_request(op)?));
            serde_json::to_writer(&mut out, &entry).map_err(|e| file_error(e.to_string()))?;
            out.write_all(b"\n\0")
                .map_err(|e| file_error(e.to_string()))?;
        }
        out.flush().map_err(|e| file_error(e.to_string()))?;
    }
    tracing::debug!(
        entries = ops.len(),
        bytes = file.as_file().metadata().map(|m| m.len()).unwrap_or(0),
        "bulk state file written"
    );
    Ok(file)
}

/// Makes `dir` if it is not there, private to this user (0700), and checks that it is: a state
/// file describes every route, and nobody else may read it or put one there in its place.
fn private_dir(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e.to_string()),
    }
    let meta = std::fs::symlink_metadata(dir).map_err(|e| e.to_string())?;
    let me = nix::unistd::geteuid().as_raw();
    if !meta.is_dir() || meta.uid() != me || meta.mode() & 0o077 != 0 {
        return Err(format!(
            "it must be a directory of this agent's uid {me} with mode 0700 (it is uid {}, \
             mode {:o})",
            meta.uid(),
            meta.mode() & 0o7777
        ));
    }
    Ok(())
}

/// (acknowledged, failed) from sozu 2.3.3's answer to a state load: "Successfully loaded state
/// from path P, N ok messages, M errors".
pub(super) fn acknowledged(message: &str) -> Option<(usize, usize)> {
    let mut parts = message.rsplit(", ");
    let errors = parts.next()?.strip_suffix(" errors")?.parse().ok()?;
    let ok = parts.next()?.strip_suffix(" ok messages")?.parse().ok()?;
    Some((ok, errors))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bulk files' directory is made private, and one that others may read is refused.
    #[test]
    fn state_files_go_in_a_directory_private_to_the_agent() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let private = dir.path().join(".private-ingress");
        private_dir(&private).unwrap();
        let mode = std::fs::metadata(&private).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o755)).unwrap();
        let refused = private_dir(&private).unwrap_err();
        assert!(refused.contains("mode 0700"), "{refused}");
    }

    #[test]
    fn a_state_load_answer_gives_its_counts() {
        let message = "Successfully loaded state from path /run/sozu/.private-ingress-x.state, \
                       4000 ok messages, 0 errors";
        assert_eq!(acknowledged(message), Some((4000, 0)));
        assert_eq!(
            acknowledged("loading state: 3 ok messages, 1 errors, timed out: false"),
            None,
            "a failure's wording is not a success's"
        );
    }
}
