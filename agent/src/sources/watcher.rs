//! File-system watching, shared by the sources: directories, never files, and never recursively.
//!
//! A ConfigMap, a Secret or cert-manager's CSI driver swaps a `..data` symlink to a new
//! timestamped directory by rename and removes the old one at once, which a watch on a file
//! itself never sees again; a watch on its directory sees the rename.

use std::path::{Path, PathBuf};

use notify::{EventKind, RecommendedWatcher, RecursiveMode, Watcher};

use super::WatchError;

/// A watcher calling `sink` with every event, watching `dirs` (more can be added later).
pub fn watch(
    dirs: &[&Path],
    sink: impl Fn(notify::Result<notify::Event>) + Send + 'static,
) -> Result<RecommendedWatcher, WatchError> {
    let mut watcher = notify::recommended_watcher(sink).map_err(|error| WatchError {
        path: PathBuf::new(),
        error,
    })?;
    for dir in dirs {
        add(&mut watcher, dir)?;
    }
    Ok(watcher)
}

pub fn add(watcher: &mut RecommendedWatcher, dir: &Path) -> Result<(), WatchError> {
    watcher
        .watch(dir, RecursiveMode::NonRecursive)
        .map_err(|error| WatchError {
            path: dir.to_owned(),
            error,
        })
}

/// Reads are not changes: the agent's own reads of a file it watches would otherwise trigger
/// the reload that reads it again, forever.
pub fn is_read(event: &notify::Event) -> bool {
    matches!(event.kind, EventKind::Access(_))
}

/// The directory holding `path`, absolute.
pub fn parent_dir(path: &Path) -> PathBuf {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_owned());
    absolute
        .parent()
        .map(Path::to_owned)
        .unwrap_or_else(|| PathBuf::from("/"))
}

/// `path`, absolute (as the watcher reports paths under a directory given absolute).
pub fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_owned())
}
