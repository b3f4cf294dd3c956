//! Turns file-system events into loop triggers. Directories are watched, never files: a
//! ConfigMap or Secret volume swaps a `..data` symlink by rename, which a watch on the file itself
//! never sees. Every event in a watched directory is a trigger; the loop coalesces them and reads
//! the latest state, so a burst of events costs one reconcile.

use std::path::{Path, PathBuf};

use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc::UnboundedSender;

use crate::reconcile::Trigger;

#[derive(Debug, thiserror::Error)]
#[error("cannot watch {}: {source}", path.display())]
pub struct WatchError {
    path: PathBuf,
    source: notify::Error,
}

/// Keeps the watches alive; dropping it stops them.
pub struct Watches {
    _watcher: notify::RecommendedWatcher,
}

/// Watches each directory, non-recursively, and sends its trigger on any event in it.
pub fn watch(
    dirs: Vec<(PathBuf, Trigger)>,
    triggers: UnboundedSender<Trigger>,
) -> Result<Watches, WatchError> {
    let routes: Vec<(PathBuf, Trigger)> = dirs.clone();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        match event {
            // Reads are not changes, and the agent's own reads of the workspace would otherwise
            // trigger the reload that reads it again, forever.
            Ok(event) if matches!(event.kind, notify::EventKind::Access(_)) => {}
            Ok(event) => {
                for (dir, trigger) in &routes {
                    if event
                        .paths
                        .iter()
                        .any(|p| p.parent() == Some(dir.as_path()) || p == dir)
                    {
                        let _ = triggers.send(*trigger);
                    }
                }
            }
            // A queue overflow or a watch error: recompute everything.
            Err(_) => {
                let _ = triggers.send(Trigger::Resync);
            }
        }
    })
    .map_err(|source| WatchError {
        path: PathBuf::new(),
        source,
    })?;
    for (dir, _) in &dirs {
        watcher
            .watch(dir, RecursiveMode::NonRecursive)
            .map_err(|source| WatchError {
                path: dir.clone(),
                source,
            })?;
    }
    Ok(Watches { _watcher: watcher })
}

/// The directory holding `path`, absolute.
pub fn parent_dir(path: &Path) -> PathBuf {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_owned());
    absolute
        .parent()
        .map(Path::to_owned)
        .unwrap_or_else(|| PathBuf::from("/"))
}
