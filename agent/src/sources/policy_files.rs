//! The policy-files source: the basic-auth users files and the error pages the workspace's route
//! policies name, read and checked ([`crate::policy_files`]) on a thread of its own, and
//! published whenever what they say may have changed: a file written or swapped in (their
//! directories are watched, as a ConfigMap's or a Secret's AtomicWriter swap needs), a new
//! workspace, and once a minute (a directory that did not exist yet).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::Duration;

use notify::{RecommendedWatcher, Watcher};
use tokio::sync::mpsc::UnboundedSender;

use super::{watcher, Fact, WatchError, WorkspaceWatch};
use crate::policy_files::{parse_page, parse_users, MAX_USERS_BYTES};
use crate::workspace::Workspace;

/// How often the files are read again without a change.
const RECHECK: Duration = Duration::from_secs(60);

/// Each file as last read: what it held, or why it is refused (naming the file, and the line
/// where there is one).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PolicyFileReads {
    pub users: BTreeMap<PathBuf, Result<Arc<[String]>, String>>,
    pub pages: BTreeMap<PathBuf, Result<Arc<str>, String>>,
}

/// Which files to read: users files, and pages with the status each is read for (a page file
/// named for two statuses is read for the first; its status line says which it answers).
#[derive(Debug, Default)]
struct Wanted {
    users: BTreeSet<PathBuf>,
    pages: BTreeMap<PathBuf, u16>,
}

fn wanted(workspace: &Workspace) -> Wanted {
    let mut wanted = Wanted::default();
    let mut page = |status: u16, path: &Path| {
        wanted.pages.entry(path.to_owned()).or_insert(status);
    };
    for (status, path) in &workspace.error_pages {
        page(*status, path);
    }
    for route in &workspace.routes {
        let policy = route.policy();
        for (status, path) in &policy.error_pages {
            page(*status, path);
        }
        if let Some(auth) = &policy.basic_auth {
            wanted.users.insert(auth.users_file.clone());
        }
    }
    wanted
}

enum Input {
    Workspace(Option<Arc<Workspace>>),
    Event(notify::Result<notify::Event>),
}

/// Starts the source: a thread holding `guard` for its life, and the task handing it each new
/// workspace (returned).
pub fn spawn(
    workspace: WorkspaceWatch,
    facts: UnboundedSender<Fact>,
    guard: impl Send + 'static,
) -> Result<tokio::task::JoinHandle<()>, WatchError> {
    let (inputs, received) = channel();
    let events = inputs.clone();
    let watcher = watcher::watch(&[], move |event| {
        let _ = events.send(Input::Event(event));
    })?;
    let forwarder = super::forward_workspaces(workspace, move |latest| {
        inputs.send(Input::Workspace(latest)).is_ok()
    });
    let reader = Reader {
        wanted: Wanted::default(),
        watched: BTreeSet::new(),
        last: None,
        watcher,
        facts,
    };
    std::thread::Builder::new()
        .name("policy-files".into())
        .spawn(move || {
            let _guard = guard;
            reader.run(received)
        })
        .map_err(|e| WatchError {
            path: PathBuf::new(),
            error: notify::Error::io(e),
        })?;
    Ok(forwarder)
}

struct Reader {
    wanted: Wanted,
    watched: BTreeSet<PathBuf>,
    last: Option<PolicyFileReads>,
    watcher: RecommendedWatcher,
    facts: UnboundedSender<Fact>,
}

impl Reader {
    fn run(mut self, inputs: Receiver<Input>) {
        loop {
            let mut changed = match inputs.recv_timeout(RECHECK) {
                Ok(input) => self.absorb(input),
                Err(RecvTimeoutError::Timeout) => {
                    self.watch_dirs();
                    true
                }
                Err(RecvTimeoutError::Disconnected) => return,
            };
            while let Ok(more) = inputs.try_recv() {
                changed |= self.absorb(more);
            }
            if changed && !self.publish() {
                return;
            }
        }
    }

    /// Whether `input` may change what the files say.
    fn absorb(&mut self, input: Input) -> bool {
        match input {
            Input::Workspace(workspace) => {
                self.wanted = workspace.map(|w| wanted(&w)).unwrap_or_default();
                self.watch_dirs();
                true
            }
            Input::Event(Ok(event)) if watcher::is_read(&event) => false,
            Input::Event(Ok(event)) => event
                .paths
                .iter()
                .any(|p| self.watched.contains(&watcher::parent_dir(p))),
            Input::Event(Err(_)) => true,
        }
    }

    /// Watches the directory of every file not watched yet; one that does not exist yet is
    /// tried again at the next recheck, its files reported unreadable meanwhile.
    fn watch_dirs(&mut self) {
        let files = self.wanted.users.iter().chain(self.wanted.pages.keys());
        let dirs: BTreeSet<PathBuf> = files.map(|f| watcher::parent_dir(f)).collect();
        for dir in dirs {
            if self.watched.contains(&dir) {
                continue;
            }
            match self
                .watcher
                .watch(&dir, notify::RecursiveMode::NonRecursive)
            {
                Ok(()) => {
                    self.watched.insert(dir);
                }
                Err(e) => tracing::warn!(dir = %dir.display(), error = %e,
                    "cannot watch the directory of a policy file yet"),
            }
        }
    }

    /// Reads every file; sends what they say when it differs from the last time. False once
    /// nobody listens.
    fn publish(&mut self) -> bool {
        let reads = read_all(&self.wanted);
        if self.last.as_ref() == Some(&reads) {
            return true;
        }
        self.last = Some(reads.clone());
        self.facts.send(Fact::PolicyFiles(Box::new(reads))).is_ok()
    }
}

/// Reads every file the workspace's policies name, as the agent will: the files that cannot be
/// read (one only a deployed agent sees, say), and the reasons of those refused.
pub fn check(workspace: &Workspace) -> (Vec<String>, Vec<String>) {
    let reads = read_all(&wanted(workspace));
    let (mut unreadable, mut refused) = (Vec::new(), Vec::new());
    let reasons = reads
        .users
        .into_iter()
        .filter_map(|(p, r)| Some((p, r.err()?)))
        .chain(
            reads
                .pages
                .into_iter()
                .filter_map(|(p, r)| Some((p, r.err()?))),
        );
    for (path, reason) in reasons {
        if path.exists() {
            refused.push(reason);
        } else {
            unreadable.push(reason);
        }
    }
    (unreadable, refused)
}

fn read_all(wanted: &Wanted) -> PolicyFileReads {
    let users = wanted
        .users
        .iter()
        .map(|path| {
            let read = read(path, MAX_USERS_BYTES).and_then(|b| parse_users(&b, path));
            (path.clone(), read.map(Arc::from))
        })
        .collect();
    let pages = wanted
        .pages
        .iter()
        .map(|(path, status)| {
            let read = read(path, crate::policy_files::MAX_PAGE_BYTES)
                .and_then(|b| parse_page(&b, path, *status));
            (path.clone(), read.map(Arc::from))
        })
        .collect();
    PolicyFileReads { users, pages }
}

/// A file's bytes, one more than `max` at most (the checks then say it is too large).
fn read(path: &Path, max: usize) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let file =
        std::fs::File::open(path).map_err(|e| format!("{}: cannot read: {e}", path.display()))?;
    let mut bytes = Vec::new();
    file.take(max as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("{}: cannot read: {e}", path.display()))?;
    Ok(bytes)
}
