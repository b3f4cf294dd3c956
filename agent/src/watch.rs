//! Turns file-system events into loop triggers.
//!
//! Directories are watched, never files, and never recursively: a ConfigMap, a Secret or
//! cert-manager's CSI driver swaps a `..data` symlink to a new timestamped directory by rename and
//! removes the old one at once, which a watch on `tls.crt` itself never sees again. Watched:
//! - the workspace's directory → [`Trigger::Workspace`];
//! - sozu's socket directory, for the socket itself (a restarted sozu re-creates it) →
//!   [`Trigger::Resync`];
//! - the tls dir, so a host directory that appears later is picked up, and every host directory
//!   in it → [`Trigger::Host`] for that host.
//!
//! Each event is only a hint: the loop coalesces them and reads the latest state. Within a host
//! directory only the names a pair is read through count (`..data`, `tls.crt`, `tls.key`): an
//! AtomicWriter swap first creates a timestamped directory and a `..data_tmp` link and last
//! removes the old directory, and none of those change what a read returns, so one swap costs one
//! pass, started by the rename itself and not by a fixed wait.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use notify::{EventKind, RecursiveMode, Watcher};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

use crate::reconcile::Trigger;

#[derive(Debug, thiserror::Error)]
#[error("cannot watch {}: {source}", path.display())]
pub struct WatchError {
    path: PathBuf,
    source: notify::Error,
}

/// What to watch.
#[derive(Debug, Clone)]
pub struct Dirs {
    pub workspace: PathBuf,
    /// The directory of sozu's socket.
    pub socket: PathBuf,
    /// The socket itself: only its events count (the agent writes its bulk state files beside
    /// it, and their coming and going is no restart).
    pub socket_file: PathBuf,
}

/// Starts watching. The returned sender sets (or changes) the tls dir whose host directories are
/// watched, as soon as it is known (it may come from the workspace). The watches live as long as
/// the returned task; abort it to stop them (it holds a sender of `triggers`).
pub fn spawn(
    dirs: Dirs,
    triggers: UnboundedSender<Trigger>,
) -> Result<(UnboundedSender<PathBuf>, tokio::task::JoinHandle<()>), WatchError> {
    let (raw_tx, raw_rx) = unbounded_channel();
    let mut watcher = notify::recommended_watcher(move |event| {
        let _ = raw_tx.send(event);
    })
    .map_err(|source| WatchError {
        path: PathBuf::new(),
        source,
    })?;
    for dir in [&dirs.workspace, &dirs.socket] {
        watcher
            .watch(dir, RecursiveMode::NonRecursive)
            .map_err(|source| WatchError {
                path: dir.clone(),
                source,
            })?;
    }
    let (tls_tx, tls_rx) = unbounded_channel();
    let task = tokio::spawn(route(watcher, dirs, raw_rx, tls_rx, triggers));
    Ok((tls_tx, task))
}

async fn route(
    mut watcher: notify::RecommendedWatcher,
    dirs: Dirs,
    mut raw: UnboundedReceiver<notify::Result<notify::Event>>,
    mut tls_updates: UnboundedReceiver<PathBuf>,
    triggers: UnboundedSender<Trigger>,
) {
    let mut tls_dir: Option<PathBuf> = None;
    let mut hosts: BTreeSet<PathBuf> = BTreeSet::new();
    loop {
        tokio::select! {
            Some(dir) = tls_updates.recv() => {
                if tls_dir.as_ref() == Some(&dir) {
                    continue;
                }
                if let Some(old) = tls_dir.take() {
                    let _ = watcher.unwatch(&old);
                }
                for host in std::mem::take(&mut hosts) {
                    let _ = watcher.unwatch(&host);
                }
                match watcher.watch(&dir, RecursiveMode::NonRecursive) {
                    Ok(()) => tracing::debug!(dir = %dir.display(), "watching the tls dir"),
                    Err(e) => tracing::warn!(dir = %dir.display(), error = %e,
                        "cannot watch the tls dir; certificates are re-read on every resync"),
                }
                tls_dir = Some(dir);
                sync_hosts(&mut watcher, tls_dir.as_deref(), &mut hosts);
            }
            event = raw.recv() => {
                let Some(event) = event else { return };
                let event = match event {
                    Ok(event) => event,
                    // A queue overflow or a watch error: recompute everything.
                    Err(e) => {
                        tracing::warn!(error = %e, "file watch error; resyncing");
                        if triggers.send(Trigger::Resync).is_err() { return }
                        continue;
                    }
                };
                // Reads are not changes, and the agent's own reads of the workspace would
                // otherwise trigger the reload that reads it again, forever.
                if matches!(event.kind, EventKind::Access(_)) {
                    continue;
                }
                if event.need_rescan() {
                    tracing::warn!("the file watcher lost events; re-reading everything");
                    sync_hosts(&mut watcher, tls_dir.as_deref(), &mut hosts);
                    if triggers.send(Trigger::Overflow).is_err() { return }
                    continue;
                }
                let mut fired = BTreeSet::new();
                for path in &event.paths {
                    let parent = path.parent();
                    if parent == Some(dirs.workspace.as_path()) {
                        fired.insert(Trigger::Workspace);
                    }
                    if path == &dirs.socket_file {
                        fired.insert(Trigger::Resync);
                    }
                    if let Some(tls) = tls_dir.as_deref() {
                        if parent == Some(tls) {
                            // A host directory came or went.
                            sync_hosts(&mut watcher, Some(tls), &mut hosts);
                            fired.extend(host_of(path));
                        } else if parent.is_some_and(|p| hosts.contains(p)) && changes_pair(path) {
                            fired.extend(parent.and_then(host_of));
                        }
                    }
                }
                for trigger in fired {
                    if triggers.send(trigger).is_err() {
                        return;
                    }
                }
            }
        }
    }
}

/// Watches every directory directly under `tls_dir`, and stops watching those that are gone.
fn sync_hosts(
    watcher: &mut notify::RecommendedWatcher,
    tls_dir: Option<&Path>,
    hosts: &mut BTreeSet<PathBuf>,
) {
    let present: BTreeSet<PathBuf> = tls_dir
        .and_then(|d| std::fs::read_dir(d).ok())
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .collect();
    for gone in hosts.difference(&present).cloned().collect::<Vec<_>>() {
        let _ = watcher.unwatch(&gone);
        hosts.remove(&gone);
    }
    let started = std::time::Instant::now();
    let new: Vec<PathBuf> = present.difference(hosts).cloned().collect();
    for dir in &new {
        match watcher.watch(dir, RecursiveMode::NonRecursive) {
            Ok(()) => {
                hosts.insert(dir.clone());
            }
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e, "cannot watch a host directory")
            }
        }
    }
    if !new.is_empty() {
        // One round trip to notify's thread per directory: at a cold start, thousands.
        tracing::debug!(
            added = new.len(),
            elapsed_ms = started.elapsed().as_secs_f64() * 1e3,
            "host directories watched"
        );
    }
}

/// The host a directory under the tls dir serves: its name.
fn host_of(dir: &Path) -> Option<Trigger> {
    dir.file_name()
        .and_then(|n| n.to_str())
        .map(|n| Trigger::Host(n.to_owned()))
}

/// Whether a change to `path`, in a host directory, can change the pair read from it.
fn changes_pair(path: &Path) -> bool {
    path.file_name()
        .is_some_and(|n| n == "..data" || n == "tls.crt" || n == "tls.key")
}

/// The directory holding `path`, absolute.
pub fn parent_dir(path: &Path) -> PathBuf {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_owned());
    absolute
        .parent()
        .map(Path::to_owned)
        .unwrap_or_else(|| PathBuf::from("/"))
}
