//! The client-auth source: the device CA and the CRLs that `listeners.client_auth` names, read and
//! validated ([`crate::certs::client_ca`]) on a thread of its own, and published whenever what
//! they say may have changed: a file written or swapped in (their directories are watched, as a
//! Secret's AtomicWriter swap needs), a new workspace, and once a minute, since a CRL whose
//! `nextUpdate` passes turns invalid without a write.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::Duration;

use notify::{RecommendedWatcher, Watcher};
use tokio::sync::mpsc::UnboundedSender;

use super::{watcher, Fact, WatchError, WorkspaceWatch};
use crate::certs::client_ca::{self, ClientCa, ClientCaError, Crl};
use crate::certs::MAX_FILE_BYTES;
use crate::clock::Clock;
use crate::workspace::{ClientAuthMode, Workspace};

/// How often the files are validated again without a change.
const RECHECK: Duration = Duration::from_secs(60);

/// Each file as last read: its path and what it held, or why it is refused.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ClientAuthFiles {
    pub ca: Option<(PathBuf, Result<ClientCa, ClientCaError>)>,
    pub crls: Vec<(PathBuf, Result<Crl, ClientCaError>)>,
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
    clock: Arc<dyn Clock>,
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
        files: Vec::new(),
        watched: BTreeSet::new(),
        last: None,
        watcher,
        facts,
        clock,
    };
    std::thread::Builder::new()
        .name("client-auth".into())
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
    /// The CA file first, then the CRLs; empty with client certificates off.
    files: Vec<PathBuf>,
    watched: BTreeSet<PathBuf>,
    last: Option<ClientAuthFiles>,
    watcher: RecommendedWatcher,
    facts: UnboundedSender<Fact>,
    clock: Arc<dyn Clock>,
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
                let auth = workspace.map(|w| w.listener_policy.client_auth.clone());
                self.files = match auth {
                    Some(auth) if auth.mode != ClientAuthMode::Off => {
                        auth.ca_file.into_iter().chain(auth.crl_files).collect()
                    }
                    _ => Vec::new(),
                };
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
        let dirs: BTreeSet<PathBuf> = self.files.iter().map(|f| watcher::parent_dir(f)).collect();
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
                    "cannot watch the directory of a client-auth file yet"),
            }
        }
    }

    /// Reads and validates every file; sends what they say when it differs from the last time.
    /// False once nobody listens.
    fn publish(&mut self) -> bool {
        let now = self.clock.unix();
        let mut files = ClientAuthFiles::default();
        let mut paths = self.files.iter();
        if let Some(ca_path) = paths.next() {
            let ca = read(ca_path).and_then(|bytes| client_ca::parse_ca(&bytes, ca_path, now));
            for crl_path in paths {
                let crl = match &ca {
                    Ok(ca) => read(crl_path)
                        .and_then(|bytes| client_ca::parse_crl(&bytes, crl_path, ca, now)),
                    Err(_) => Err(ClientCaError::BadCrl {
                        path: crl_path.clone(),
                        reason: "its CA file is not valid".into(),
                    }),
                };
                files.crls.push((crl_path.clone(), crl));
            }
            files.ca = Some((ca_path.clone(), ca));
        }
        if self.last.as_ref() == Some(&files) {
            return true;
        }
        self.last = Some(files.clone());
        self.facts.send(Fact::ClientAuth(Box::new(files))).is_ok()
    }
}

/// A file's bytes, at most [`MAX_FILE_BYTES`] of them.
fn read(path: &Path) -> Result<Vec<u8>, ClientCaError> {
    let unreadable = |reason: String| ClientCaError::Unreadable {
        path: path.to_owned(),
        reason,
    };
    let file = std::fs::File::open(path).map_err(|e| unreadable(e.to_string()))?;
    let mut bytes = Vec::new();
    use std::io::Read;
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| unreadable(e.to_string()))?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(unreadable(format!("larger than {MAX_FILE_BYTES} bytes")));
    }
    Ok(bytes)
}
