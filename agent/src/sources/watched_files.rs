//! The thread shared by the sources that read small files a workspace names (the client-auth CA
//! and CRLs, the basic-auth users files, the error pages): it watches the files' directories,
//! follows the workspace, reads the files again whenever what they say may have changed (a file
//! written or swapped in, a new workspace, and once a minute, for a directory that did not exist
//! yet or a file that expires without a write), and publishes what they say when it differs from
//! the last time.
//!
//! Directories are watched, not files, as a ConfigMap's or a Secret's AtomicWriter swap needs
//! ([`super::watcher`]).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::Duration;

use notify::{RecommendedWatcher, Watcher};
use tokio::sync::mpsc::UnboundedSender;

use super::{watcher, Fact, WatchError, WorkspaceWatch};
use crate::workspace::Workspace;

/// How often the files are read again without a change.
const RECHECK: Duration = Duration::from_secs(60);

/// One kind of files: which the workspace names, and what reading them says.
pub trait FileSet: Send + 'static {
    /// What the files say: published when it differs from the last reading.
    type Reads: PartialEq + Clone + Send;
    /// The thread's name, and what the log calls these files.
    const NAME: &'static str;

    /// Takes a new workspace (`None` before the first good one); returns the files it names.
    fn follow(&mut self, workspace: Option<&Workspace>) -> Vec<PathBuf>;
    /// Reads every file named.
    fn read(&self) -> Self::Reads;
    /// The fact telling the loop what the files say.
    fn fact(reads: Self::Reads) -> Fact;
}

enum Input {
    Workspace(Option<Arc<Workspace>>),
    Event(notify::Result<notify::Event>),
}

/// Starts the source: a thread holding `guard` for its life, and the task handing it each new
/// workspace (returned).
pub fn spawn<F: FileSet>(
    files: F,
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
        files,
        named: Vec::new(),
        watched: BTreeSet::new(),
        last: None,
        watcher,
        facts,
    };
    super::spawn_thread(F::NAME, guard, move || reader.run(received))?;
    Ok(forwarder)
}

struct Reader<F: FileSet> {
    files: F,
    named: Vec<PathBuf>,
    watched: BTreeSet<PathBuf>,
    last: Option<F::Reads>,
    watcher: RecommendedWatcher,
    facts: UnboundedSender<Fact>,
}

impl<F: FileSet> Reader<F> {
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
                self.named = self.files.follow(workspace.as_deref());
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

    /// Watches the directory of every file not watched yet. One that does not exist yet is
    /// tried again at the next recheck; meanwhile its files are reported unreadable.
    fn watch_dirs(&mut self) {
        let dirs: BTreeSet<PathBuf> = self.named.iter().map(|f| watcher::parent_dir(f)).collect();
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
                Err(e) => tracing::warn!(dir = %dir.display(), error = %e, files = F::NAME,
                    "cannot watch a directory of these files yet"),
            }
        }
    }

    /// Reads every file; sends what they say when it differs from the last time. False once
    /// nobody listens.
    fn publish(&mut self) -> bool {
        let reads = self.files.read();
        if self.last.as_ref() == Some(&reads) {
            return true;
        }
        self.last = Some(reads.clone());
        self.facts.send(F::fact(reads)).is_ok()
    }
}

/// A file's bytes, `max + 1` of them at most: more than `max` says the file is too large
/// without reading all of a file that may be huge.
pub fn read_capped(path: &Path, max: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(max + 1)
        .read_to_end(&mut bytes)?;
    Ok(bytes)
}
