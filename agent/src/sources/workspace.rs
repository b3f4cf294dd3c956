//! The workspace source: evaluates the workspace (in the sandbox) at start and whenever its
//! directory changes, and publishes the result. The directory is watched, not the file: a
//! ConfigMap mount swaps its `..data` link at the root of the volume.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::mpsc::{unbounded_channel, UnboundedSender};
use tokio::sync::watch;

use super::{watcher, Fact, WatchError};
use crate::evaluate::sandbox::{self, Limits, SandboxError};
use crate::plan::edit::Edit;
use crate::workspace::Workspace;

/// Evaluating the workspace with the contract, isolated.
pub trait LoadWorkspace: Send + Sync + 'static {
    fn load(&self) -> impl Future<Output = Result<Workspace, SandboxError>> + Send;
}

/// [`LoadWorkspace`] through the sandbox ([`crate::evaluate::sandbox::evaluate`], a blocking call that
/// waits for a child process), on tokio's blocking pool.
pub struct SandboxLoader {
    pub exe: PathBuf,
    pub path: PathBuf,
    pub limits: Limits,
}

impl LoadWorkspace for SandboxLoader {
    async fn load(&self) -> Result<Workspace, SandboxError> {
        let (exe, path, limits) = (self.exe.clone(), self.path.clone(), self.limits.clone());
        tokio::task::spawn_blocking(move || sandbox::evaluate(&exe, &path, &limits))
            .await
            .map_err(|e| SandboxError::Crashed {
                path: self.path.clone(),
                cause: format!("could not be waited for: {e}"),
            })?
    }
}

/// What an event in the workspace's directory asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Change {
    None,
    /// Something in the directory changed: evaluate again.
    Evaluate,
    /// The watcher lost events: evaluate again, and count the loss.
    Rescan,
}

/// Pure: what `event` means for the workspace in `dir`.
pub fn classify(event: &notify::Result<notify::Event>, dir: &Path) -> Change {
    match event {
        // A watch error: evaluating again costs little and loses nothing.
        Err(_) => Change::Evaluate,
        Ok(event) if event.need_rescan() => Change::Rescan,
        Ok(event) if watcher::is_read(event) => Change::None,
        Ok(event) if event.paths.iter().any(|p| p.parent() == Some(dir)) => Change::Evaluate,
        Ok(_) => Change::None,
    }
}

/// Starts the source: evaluates `path` now and after every change of its directory, publishing
/// each result on `facts` and each accepted workspace on `latest`. Ends when `facts` closes.
pub fn spawn<L: LoadWorkspace>(
    path: &Path,
    loader: L,
    facts: UnboundedSender<Fact>,
    latest: watch::Sender<Option<Arc<Workspace>>>,
) -> Result<tokio::task::JoinHandle<()>, WatchError> {
    let dir = watcher::parent_dir(path);
    let (events_tx, mut events) = unbounded_channel();
    let watcher = watcher::watch(&[&dir], move |event| {
        let _ = events_tx.send(event);
    })?;
    let path: PathBuf = path.to_owned();
    Ok(tokio::spawn(async move {
        // Kept alive as long as the task: dropping it ends the watch.
        let _watcher = watcher;
        let mut change = Change::Evaluate;
        let mut last_error = None;
        loop {
            if change == Change::Rescan {
                tracing::warn!("the workspace watcher lost events; evaluating again");
                if facts.send(Fact::WatchOverflow).is_err() {
                    return;
                }
            }
            if change != Change::None
                && !evaluate(&path, &loader, &facts, &latest, &mut last_error).await
            {
                return;
            }
            let Some(event) = events.recv().await else {
                return;
            };
            change = classify(&event, &dir);
            // Coalesce a burst (a swap is several events): one evaluation for all of them.
            while let Ok(event) = events.try_recv() {
                change = change.max(classify(&event, &dir));
            }
        }
    }))
}

/// One evaluation, published. Returns false once nobody listens. A failure is logged once for
/// as long as it stays the same (every event in the directory evaluates again), and says
/// whether a workspace serves meanwhile.
async fn evaluate<L: LoadWorkspace>(
    path: &Path,
    loader: &L,
    facts: &UnboundedSender<Fact>,
    latest: &watch::Sender<Option<Arc<Workspace>>>,
    last_error: &mut Option<String>,
) -> bool {
    let started = std::time::Instant::now();
    let loaded = loader.load().await;
    tracing::debug!(
        elapsed_ms = started.elapsed().as_secs_f64() * 1e3,
        "workspace evaluated"
    );
    let fact = match loaded {
        Ok(workspace) => {
            let workspace = Arc::new(workspace);
            // Worked out here rather than in the loop, which a rotation may be waiting for.
            let previous = latest.borrow().clone();
            let edit = Edit::prepare(previous, workspace.clone());
            if !edit.same {
                tracing::info!(routes = workspace.routes.len(), zone = %workspace.zone,
                    workspace = %path.display(), "workspace loaded");
                latest.send_replace(Some(workspace));
            }
            *last_error = None;
            return facts.send(Fact::Edit(Box::new(edit))).is_ok();
        }
        Err(e) => {
            let text = e.to_string();
            if last_error.as_deref() == Some(text.as_str()) {
                tracing::debug!("the workspace still fails the same way");
            } else if latest.borrow().is_some() {
                tracing::error!(diagnostic = %text, "workspace rejected; the last good one stays live");
            } else {
                tracing::error!(diagnostic = %text,
                    "workspace rejected; nothing is configured until a valid one is loaded");
            }
            *last_error = Some(text.clone());
            Err(text)
        }
    };
    facts.send(Fact::Workspace(fact)).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use notify::event::{AccessKind, CreateKind, EventKind, Flag, ModifyKind, RenameMode};

    fn event(kind: EventKind, path: &str) -> notify::Result<notify::Event> {
        Ok(notify::Event::new(kind).add_path(PathBuf::from(path)))
    }

    #[test]
    fn events_in_the_workspace_directory_ask_for_an_evaluation() {
        let dir = Path::new("/etc/ws");
        let rename = EventKind::Modify(ModifyKind::Name(RenameMode::Both));
        let cases = [
            (
                event(EventKind::Create(CreateKind::File), "/etc/ws/ws.ncl"),
                Change::Evaluate,
            ),
            (event(rename, "/etc/ws/..data"), Change::Evaluate),
            (
                event(EventKind::Access(AccessKind::Any), "/etc/ws/ws.ncl"),
                Change::None,
            ),
            (
                event(EventKind::Create(CreateKind::File), "/etc/other/ws.ncl"),
                Change::None,
            ),
            (
                Ok(notify::Event::new(EventKind::Other).set_flag(Flag::Rescan)),
                Change::Rescan,
            ),
            (
                Err(notify::Error::generic("inotify gone")),
                Change::Evaluate,
            ),
        ];
        for (event, expected) in cases {
            assert_eq!(classify(&event, dir), expected, "{event:?}");
        }
    }
}
