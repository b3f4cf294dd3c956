//! The workspace source: evaluates the workspace (in the sandbox) at start and whenever its
//! directory changes, and publishes the result. The directory is watched, not the file: a
//! ConfigMap mount swaps its `..data` link at the root of the volume.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::mpsc::{unbounded_channel, UnboundedSender};
use tokio::sync::watch;

use super::{traefik, watcher, Fact, WatchError};
use crate::evaluate::sandbox::{self, Limits, SandboxError};
use crate::plan::edit::Edit;
use crate::translate::traefik::join::merge;
use crate::workspace::Workspace;

/// Evaluating the workspace with the contract, isolated.
pub trait LoadWorkspace: Send + Sync + 'static {
    fn load(&self) -> impl Future<Output = Result<Workspace, SandboxError>> + Send;

    /// The agent's admin port, which the routes evaluated (and those read from Traefik) may
    /// not take.
    fn admin_port(&self) -> u16 {
        crate::evaluate::contract::DEFAULT_ADMIN_PORT
    }
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

    fn admin_port(&self) -> u16 {
        self.limits.admin_port
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
///
/// With a `traefik` record, the Traefik source ([`super::traefik`]) runs beside it: the
/// workspace published is the last one evaluated with the last routes read from Traefik's
/// configuration ([`crate::translate::traefik::join::merge`]), published again whenever either
/// changes, so that everything downstream sees one workspace.
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
    let (traefik_settings, settings_rx) = watch::channel(None);
    let (updates_tx, mut updates) = unbounded_channel();
    let traefik_task = traefik::spawn(settings_rx, updates_tx);
    Ok(tokio::spawn(async move {
        // Kept alive as long as the task: dropping it ends the watch.
        let _watcher = watcher;
        let _traefik = AbortOnDrop(traefik_task);
        let mut change = Change::Evaluate;
        let mut last_error = None;
        let mut state = Joined {
            admin_port: loader.admin_port(),
            ..Joined::default()
        };
        let mut first_read: Option<tokio::time::Instant> = None;
        // How the directory looked before the last evaluation that succeeded.
        let mut evaluated: Option<DirLook> = None;
        loop {
            if change == Change::Rescan {
                tracing::warn!("the workspace watcher lost events; evaluating again");
                if facts.send(Fact::WatchOverflow).is_err() {
                    return;
                }
            }
            if change != Change::None {
                // Before the evaluation reads anything: what changes after this is seen again.
                let looked = DirLook::taken(&dir).await;
                match evaluate(&path, &loader, &mut last_error).await {
                    Ok(own) => {
                        evaluated = looked;
                        let settings = own.traefik.as_ref().map(|t| {
                            Arc::new(traefik::Settings {
                                traefik: (**t).clone(),
                                zone: own.zone.clone(),
                            })
                        });
                        if *traefik_settings.borrow() != settings {
                            // The routes read by the previous settings serve until the new
                            // ones' first read (a file's, at once): an edit of the record does
                            // not take them down meanwhile.
                            if settings.is_none() {
                                state.traefik = None;
                            }
                            traefik_settings.send_replace(settings);
                        }
                        state.own = Some(Arc::new(own));
                        if state.waiting_for_traefik() {
                            // The first read of the Traefik sources is waited for, so that the
                            // first workspace served (and readiness) has their routes; not
                            // longer than an endpoint's deadline.
                            first_read = Some(tokio::time::Instant::now() + FIRST_READ);
                        } else if !publish(&state, &facts, &latest) {
                            return;
                        }
                    }
                    Err(text) => {
                        // A failure may not be the text's (a deadline, a killed child): any
                        // event evaluates again.
                        evaluated = None;
                        if facts.send(Fact::Workspace(Err(text))).is_err() {
                            return;
                        }
                    }
                }
            }
            change = Change::None;
            tokio::select! {
                event = events.recv() => {
                    let Some(event) = event else { return };
                    change = classify(&event, &dir);
                    // Coalesce a burst (a swap is several events): one evaluation for all of them.
                    while let Ok(event) = events.try_recv() {
                        change = change.max(classify(&event, &dir));
                    }
                    if change == Change::Evaluate && evaluated.is_some() {
                        change = still(change, &evaluated, DirLook::taken(&dir).await);
                    }
                }
                () = async {
                    match first_read {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                } => {
                    tracing::warn!("the traefik sources have not answered yet; the workspace is served without their routes meanwhile");
                    first_read = None;
                    state.traefik = Some(traefik::Update::default());
                    if !publish(&state, &facts, &latest) {
                        return;
                    }
                }
                // The Traefik source ends only with this task (or by a panic, which the
                // workspace's own routes outlive: the branch is then off).
                Some(mut update) = updates.recv() => {
                    first_read = None;
                    // Only the newest of several counts.
                    while let Ok(newer) = updates.try_recv() {
                        update = newer;
                    }
                    state.traefik = Some(update);
                    if !publish(&state, &facts, &latest) {
                        return;
                    }
                }
            }
        }
    }))
}

/// What the workspace's directory holds, as far as its watch can tell: each entry's name, where
/// a link points, and a hash of each file's content (read through links). Taken before each
/// evaluation; a burst of events after which the directory looks the same asks for nothing.
/// An atomic write (a temporary file created, written, renamed over the workspace) wakes the
/// source at its first event, the evaluation reads the finished file, and the rest of the
/// burst, queued meanwhile, had the same text evaluated again: twice the CPU of each edit, most
/// of a second each at 10,000 routes, on a core a rotation may want.
#[derive(Debug, PartialEq, Eq)]
struct DirLook(Vec<(std::ffi::OsString, Option<PathBuf>, Option<u64>)>);

/// A directory holding more than this is not looked at (every event evaluates): a workspace's
/// directory holds text.
const LOOK_MAX_BYTES: u64 = 64 << 20;

impl DirLook {
    /// `None` when the directory or one of its files cannot be read, or it holds too much.
    fn of(dir: &Path) -> Option<DirLook> {
        use std::hash::{Hash, Hasher};
        let mut entries = Vec::new();
        let mut total = 0u64;
        for entry in std::fs::read_dir(dir).ok()? {
            let path = entry.ok()?.path();
            let link = std::fs::read_link(&path).ok();
            let content = match std::fs::metadata(&path) {
                Ok(meta) if meta.is_file() => {
                    total = total.saturating_add(meta.len());
                    if total > LOOK_MAX_BYTES {
                        return None;
                    }
                    let mut hasher = std::collections::hash_map::DefaultHasher::new();
                    std::fs::read(&path).ok()?.hash(&mut hasher);
                    Some(hasher.finish())
                }
                // A directory, a link to nothing: its name and target say it.
                _ => None,
            };
            entries.push((path.file_name()?.to_owned(), link, content));
        }
        entries.sort();
        Some(DirLook(entries))
    }

    /// [`Self::of`], off the runtime's threads.
    async fn taken(dir: &Path) -> Option<DirLook> {
        let dir = dir.to_owned();
        tokio::task::spawn_blocking(move || DirLook::of(&dir))
            .await
            .ok()
            .flatten()
    }
}

/// What `change` still asks for once the directory looks `now`: nothing when it holds what the
/// last successful evaluation read (`evaluated`). Lost events, and a directory that could not be
/// looked at, evaluate.
fn still(change: Change, evaluated: &Option<DirLook>, now: Option<DirLook>) -> Change {
    if change == Change::Evaluate && now.is_some() && now == *evaluated {
        tracing::debug!("the workspace's directory holds what was evaluated; not evaluated again");
        return Change::None;
    }
    change
}

/// The last workspace evaluated and the last routes read from Traefik.
#[derive(Default)]
struct Joined {
    admin_port: u16,
    /// Shared with what is published when it has no Traefik routes to join: a copy of 10,000
    /// routes was milliseconds of CPU on a runtime thread at each edit, and 3–4 MiB more held
    /// at rest (docs/benchmarks.md).
    own: Option<Arc<Workspace>>,
    traefik: Option<traefik::Update>,
}

/// How long the first workspace waits for the Traefik sources' first read: an endpoint's
/// deadline, and a second.
const FIRST_READ: std::time::Duration =
    traefik::ENDPOINT_DEADLINE.saturating_add(std::time::Duration::from_secs(1));

impl Joined {
    /// A workspace with a `traefik` record whose sources have not been read yet.
    fn waiting_for_traefik(&self) -> bool {
        self.traefik.is_none() && self.own.as_ref().is_some_and(|w| w.traefik.is_some())
    }

    /// The workspace to serve: the evaluated one, with the Traefik routes when it has a
    /// `traefik` record (none read yet: its sources shown pending).
    fn workspace(&self) -> Option<Arc<Workspace>> {
        let own = self.own.as_ref()?;
        if own.traefik.is_none() {
            return Some(Arc::clone(own));
        }
        let update = self.traefik.clone().unwrap_or_default();
        Some(Arc::new(merge(
            own,
            &update.routes,
            &update.certificates,
            update.refused,
            update.status,
            self.admin_port,
        )))
    }
}

/// Publishes the joined workspace with what it changes. Returns false once nobody listens.
fn publish(
    state: &Joined,
    facts: &UnboundedSender<Fact>,
    latest: &watch::Sender<Option<Arc<Workspace>>>,
) -> bool {
    let Some(workspace) = state.workspace() else {
        return true;
    };
    // Worked out here rather than in the loop, which a rotation may be waiting for.
    let previous = latest.borrow().clone();
    let edit = Edit::prepare(previous, workspace.clone());
    if !edit.same {
        tracing::info!(routes = workspace.routes.len(), zone = %workspace.zone, "workspace loaded");
        latest.send_replace(Some(workspace));
    }
    // Sent when nothing changed too: a workspace evaluated again after a rejected edit clears
    // the rejection.
    facts.send(Fact::Edit(Box::new(edit))).is_ok()
}

/// Ends the Traefik source with the workspace source.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// One evaluation: the workspace, or the diagnostic. A failure is logged once for as long as
/// it stays the same (every event in the directory evaluates again).
async fn evaluate<L: LoadWorkspace>(
    path: &Path,
    loader: &L,
    last_error: &mut Option<String>,
) -> Result<Workspace, String> {
    let started = std::time::Instant::now();
    let loaded = loader.load().await;
    tracing::debug!(
        elapsed_ms = started.elapsed().as_secs_f64() * 1e3,
        workspace = %path.display(),
        "workspace evaluated"
    );
    match loaded {
        Ok(workspace) => {
            *last_error = None;
            Ok(workspace)
        }
        Err(e) => {
            let text = e.to_string();
            if last_error.as_deref() == Some(text.as_str()) {
                tracing::debug!("the workspace still fails the same way");
            } else {
                tracing::error!(diagnostic = %text,
                    "workspace rejected; the last good one stays live, if any");
            }
            *last_error = Some(text.clone());
            Err(text)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use notify::event::{AccessKind, CreateKind, EventKind, Flag, ModifyKind, RenameMode};

    fn event(kind: EventKind, path: &str) -> notify::Result<notify::Event> {
        Ok(notify::Event::new(kind).add_path(PathBuf::from(path)))
    }

    #[test]
    fn a_directory_looks_different_when_what_an_evaluation_reads_changed() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws.ncl");
        std::fs::write(&ws, "{ routes = [] }").unwrap();
        let first = DirLook::of(dir.path()).expect("looked");
        // Written again with the same text, through a temporary file renamed over it.
        let tmp = dir.path().join(".ws.ncl.tmp");
        std::fs::write(&tmp, "{ routes = [] }").unwrap();
        std::fs::rename(&tmp, &ws).unwrap();
        assert_eq!(DirLook::of(dir.path()), Some(first));
        let before = DirLook::of(dir.path());
        std::fs::write(&ws, "{ routes = [ ] }").unwrap();
        assert_ne!(DirLook::of(dir.path()), before, "the text changed");
        // A ConfigMap's swap: `..data` points at another directory.
        let (a, b) = (dir.path().join("..a"), dir.path().join("..b"));
        std::fs::create_dir(&a).unwrap();
        std::fs::create_dir(&b).unwrap();
        std::os::unix::fs::symlink("..a", dir.path().join("..data")).unwrap();
        let before = DirLook::of(dir.path());
        std::fs::remove_file(dir.path().join("..data")).unwrap();
        std::os::unix::fs::symlink("..b", dir.path().join("..data")).unwrap();
        assert_ne!(DirLook::of(dir.path()), before, "the link was swapped");
        let before = DirLook::of(dir.path());
        std::fs::write(dir.path().join("lib.ncl"), "1").unwrap();
        assert_ne!(DirLook::of(dir.path()), before, "a file was added");
    }

    #[test]
    fn a_burst_after_which_the_directory_holds_what_was_evaluated_asks_for_nothing() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ws.ncl"), "edited").unwrap();
        let evaluated = DirLook::of(dir.path());
        let same = DirLook::of(dir.path());
        assert_eq!(still(Change::Evaluate, &evaluated, same), Change::None);
        std::fs::write(dir.path().join("ws.ncl"), "edited again").unwrap();
        let changed = DirLook::of(dir.path());
        assert_eq!(
            still(Change::Evaluate, &evaluated, changed),
            Change::Evaluate
        );
        // Lost events, a failed evaluation (nothing evaluated), a directory not looked at:
        // evaluate.
        let same = || DirLook::of(dir.path());
        assert_eq!(still(Change::Rescan, &same(), same()), Change::Rescan);
        assert_eq!(still(Change::Evaluate, &None, same()), Change::Evaluate);
        assert_eq!(still(Change::Evaluate, &same(), None), Change::Evaluate);
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
