//! The tls dir source ([`CertSource`]): each route host's pair, `<tls dir>/<host>/{tls.crt,tls.key}`
//! (the layout of cert-manager's CSI driver and of Secret volumes), read and validated on a
//! thread of its own and published whenever it may have changed.
//!
//! Watched, non-recursively: the tls dir (a host directory that appears or goes) and each route
//! host's directory. Within a host directory only the names a pair is read through count
//! (`..data`, `tls.crt`, `tls.key`): an AtomicWriter swap first creates a timestamped directory
//! and a `..data_tmp` link and last removes the old directory, and none of those change what a
//! read returns, so one swap costs one read, started by the rename itself.
//!
//! No change goes unseen between a read and the watch that guards it: a host directory's watch
//! is added after its first read (so a cold start publishes without waiting for thousands of
//! watches), and its pair is then read again and published if its bytes changed in between.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;

use notify::{RecommendedWatcher, Watcher};
use tokio::sync::mpsc::UnboundedSender;

use super::{watcher, CertSource, Fact, WatchError, WorkspaceWatch};
use crate::certs::{self, CertError};
use crate::clock::Clock;
use crate::sozu_state::Certificate;
use crate::workspace::Workspace;

/// The handle of a running tls dir source.
#[derive(Clone)]
pub struct TlsDir {
    inputs: Sender<Input>,
}

impl CertSource for TlsDir {
    fn reread(&self) {
        let _ = self.inputs.send(Input::Reread);
    }
}

impl TlsDir {
    /// `host`'s pair was just written by this process (the ACME issuer): read it now, and watch
    /// its directory if it is new, whatever the watches saw.
    pub fn changed(&self, host: &str) {
        let _ = self.inputs.send(Input::Host(host.to_owned()));
    }
}

enum Input {
    Workspace(Option<Arc<Workspace>>),
    Reread,
    Host(String),
    Event(notify::Result<notify::Event>),
}

/// What a file-system event means for the pairs.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Change {
    /// This host's pair may have changed, or its directory came or went.
    Host(String),
    /// Events were lost: read every pair again.
    Rescan,
}

/// Pure: what `event` means, for a tls dir whose host directories in `watched` are watched.
pub fn classify(
    event: &notify::Result<notify::Event>,
    tls_dir: &Path,
    watched: &BTreeSet<String>,
) -> Vec<Change> {
    let event = match event {
        Ok(event) => event,
        // A watch error: what it lost is unknown.
        Err(_) => return vec![Change::Rescan],
    };
    if event.need_rescan() {
        return vec![Change::Rescan];
    }
    if watcher::is_read(event) {
        return vec![];
    }
    let name = |p: &Path| p.file_name().and_then(|n| n.to_str()).map(str::to_owned);
    let mut changes = BTreeSet::new();
    for path in &event.paths {
        let Some(parent) = path.parent() else {
            continue;
        };
        if parent == tls_dir {
            // A host directory came or went.
            changes.extend(name(path).map(Change::Host));
        } else if parent.parent() == Some(tls_dir) && changes_pair(path) {
            changes.extend(
                name(parent)
                    .filter(|h| watched.contains(h))
                    .map(Change::Host),
            );
        }
    }
    changes.into_iter().collect()
}

/// Whether a change to `path`, in a host directory, can change the pair read from it.
fn changes_pair(path: &Path) -> bool {
    path.file_name()
        .is_some_and(|n| n == "..data" || n == "tls.crt" || n == "tls.key")
}

/// Starts the source: a thread of its own, which holds `guard` for its life (a supervisor
/// learns of its end), and the task that hands it each new workspace (returned). Pairs live
/// under `tls_dir` when given (the `--tls-dir` flag), else under the workspace's `tls_dir`.
pub fn spawn(
    tls_dir: Option<PathBuf>,
    workspace: WorkspaceWatch,
    facts: UnboundedSender<Fact>,
    clock: Arc<dyn Clock>,
    guard: impl Send + 'static,
) -> Result<(TlsDir, tokio::task::JoinHandle<()>), WatchError> {
    let (inputs, received) = channel();
    let events = inputs.clone();
    let watcher = watcher::watch(&[], move |event| {
        let _ = events.send(Input::Event(event));
    })?;
    let forward = inputs.clone();
    let forwarder = super::forward_workspaces(workspace, move |latest| {
        forward.send(Input::Workspace(latest)).is_ok()
    });
    let reader = Reader {
        override_dir: tls_dir.map(|d| watcher::absolute(&d)),
        tls_dir: None,
        tls_dir_watched: false,
        hosts: BTreeSet::new(),
        watched: BTreeSet::new(),
        digests: BTreeMap::new(),
        watcher,
        facts,
        clock,
    };
    super::spawn_thread("tls-dir", guard, move || reader.run(received))?;
    Ok((TlsDir { inputs }, forwarder))
}

struct Reader {
    override_dir: Option<PathBuf>,
    tls_dir: Option<PathBuf>,
    tls_dir_watched: bool,
    /// The route hosts of the latest workspace.
    hosts: BTreeSet<String>,
    /// Host directories with a watch.
    watched: BTreeSet<String>,
    /// A digest of each host's pair as last read, to tell a change from a repeat.
    digests: BTreeMap<String, [u8; 32]>,
    watcher: RecommendedWatcher,
    facts: UnboundedSender<Fact>,
    clock: Arc<dyn Clock>,
}

#[derive(Default)]
struct Todo {
    workspace: Option<Option<Arc<Workspace>>>,
    everything: bool,
    overflow: bool,
    hosts: BTreeSet<String>,
    /// Host directories that came or went: their watch is made again.
    rewatch: BTreeSet<String>,
    /// Watch the tls dir if it is not yet (it may have been created since).
    tls_dir: bool,
}

impl Reader {
    fn run(mut self, inputs: Receiver<Input>) {
        while let Ok(first) = inputs.recv() {
            let mut todo = Todo::default();
            self.absorb(first, &mut todo);
            // Coalesce whatever else is already queued: one read for a burst of events.
            while let Ok(more) = inputs.try_recv() {
                self.absorb(more, &mut todo);
            }
            if !self.work(todo) {
                return;
            }
        }
    }

    fn absorb(&self, input: Input, todo: &mut Todo) {
        match input {
            Input::Workspace(workspace) => todo.workspace = Some(workspace),
            Input::Reread => todo.everything = true,
            Input::Host(host) => {
                // A directory the issuer just made needs its watch (and the tls dir its own); a
                // renewal of a watched one is a read, nothing more.
                if !self.watched.contains(&host) {
                    todo.rewatch.insert(host.clone());
                }
                todo.tls_dir |= !self.tls_dir_watched;
                todo.hosts.insert(host);
            }
            Input::Event(event) => {
                let Some(tls_dir) = &self.tls_dir else { return };
                for change in classify(&event, tls_dir, &self.watched) {
                    match change {
                        Change::Rescan => {
                            todo.everything = true;
                            todo.overflow = true;
                        }
                        Change::Host(host) => {
                            if event.as_ref().is_ok_and(|e| {
                                e.paths
                                    .iter()
                                    .any(|p| p.parent() == Some(tls_dir.as_path()))
                            }) {
                                todo.rewatch.insert(host.clone());
                            }
                            todo.hosts.insert(host);
                        }
                    }
                }
            }
        }
    }

    /// Does `todo`; returns false once nobody listens.
    fn work(&mut self, mut todo: Todo) -> bool {
        if !todo.hosts.is_empty() {
            // The moment a change was taken up: the first hop of a rotation's timing.
            tracing::debug!(hosts = todo.hosts.len(), "pair changes seen");
        }
        // Which hosts lack a watch changes only with the hosts, the directories that came or
        // went, or a fresh start; working it out costs a pass over every host, too much to pay
        // for each of the events a single swap makes (at 10,000 hosts it delayed the rename's
        // event by half a millisecond).
        let rewatch =
            todo.workspace.is_some() || todo.everything || todo.tls_dir || !todo.rewatch.is_empty();
        if let Some(workspace) = todo.workspace.take() {
            let new = self.follow(workspace.as_deref());
            todo.hosts.extend(new);
        }
        if todo.overflow {
            tracing::warn!("the certificate watcher lost events; reading every pair again");
            if self.facts.send(Fact::WatchOverflow).is_err() {
                return false;
            }
        }
        if todo.everything || todo.tls_dir {
            self.watch_tls_dir();
        }
        if todo.everything {
            todo.hosts = self.hosts.clone();
        }
        for host in &todo.rewatch {
            if self.watched.remove(host) {
                self.unwatch(host);
            }
        }
        let hosts: Vec<String> = todo
            .hosts
            .into_iter()
            .filter(|h| self.hosts.contains(h))
            .collect();
        if !hosts.is_empty() && !self.publish(&hosts, false) {
            return false;
        }
        if !rewatch {
            return true;
        }
        // Watches for hosts read without one, then a second look at those.
        let unguarded = self.watch_hosts();
        unguarded.is_empty() || self.publish(&unguarded, true)
    }

    /// Takes the latest workspace; returns the hosts to read (all of them when the tls dir
    /// moved).
    fn follow(&mut self, workspace: Option<&Workspace>) -> BTreeSet<String> {
        let Some(workspace) = workspace else {
            return BTreeSet::new();
        };
        let dir = self
            .override_dir
            .clone()
            .unwrap_or_else(|| watcher::absolute(&workspace.tls_dir));
        let hosts: BTreeSet<String> = workspace.routes.iter().map(|r| r.host.clone()).collect();
        if self.tls_dir.as_ref() != Some(&dir) {
            if let Some(old) = self.tls_dir.take() {
                let _ = self.watcher.unwatch(&old);
                for host in std::mem::take(&mut self.watched) {
                    let _ = self.watcher.unwatch(&old.join(host));
                }
            }
            self.tls_dir = Some(dir);
            self.tls_dir_watched = false;
            self.digests.clear();
            self.watch_tls_dir();
            self.hosts = hosts;
            return self.hosts.clone();
        }
        let gone: Vec<String> = self.hosts.difference(&hosts).cloned().collect();
        for host in gone {
            if self.watched.remove(&host) {
                self.unwatch(&host);
            }
            self.digests.remove(&host);
        }
        let new = hosts.difference(&self.hosts).cloned().collect();
        self.hosts = hosts;
        new
    }

    fn watch_tls_dir(&mut self) {
        let Some(dir) = self.tls_dir.clone() else {
            return;
        };
        if self.tls_dir_watched {
            return;
        }
        match watcher::add(&mut self.watcher, &dir) {
            Ok(()) => {
                self.tls_dir_watched = true;
                tracing::debug!(dir = %dir.display(), "watching the tls dir");
            }
            Err(e) => tracing::warn!(error = %e,
                "cannot watch the tls dir; a host directory that appears is read at the next resync"),
        }
    }

    fn unwatch(&mut self, host: &str) {
        if let Some(dir) = &self.tls_dir {
            let _ = self.watcher.unwatch(&dir.join(host));
        }
    }

    /// Adds a watch on each route host's directory that has none; returns the hosts it was
    /// added for.
    fn watch_hosts(&mut self) -> Vec<String> {
        let Some(dir) = self.tls_dir.clone() else {
            return Vec::new();
        };
        let started = std::time::Instant::now();
        let mut added = Vec::new();
        let missing: Vec<String> = self.hosts.difference(&self.watched).cloned().collect();
        for host in missing {
            let path = dir.join(&host);
            if !path.is_dir() {
                continue;
            }
            match watcher::add(&mut self.watcher, &path) {
                Ok(()) => {
                    self.watched.insert(host.clone());
                    added.push(host);
                }
                Err(e) => tracing::warn!(error = %e,
                    "cannot watch a host directory; its pair is read again at each resync"),
            }
        }
        if !added.is_empty() {
            // One round trip to notify's thread per directory: at a cold start, thousands.
            tracing::debug!(
                added = added.len(),
                elapsed_ms = started.elapsed().as_secs_f64() * 1e3,
                "host directories watched"
            );
        }
        added
    }

    /// Reads and publishes the pairs of `hosts`; with `only_changed`, only those whose bytes
    /// differ from the last read. Returns false once nobody listens.
    fn publish(&mut self, hosts: &[String], only_changed: bool) -> bool {
        let Some(dir) = self.tls_dir.clone() else {
            return true;
        };
        let started = std::time::Instant::now();
        let now = self.clock.unix();
        let previous = &self.digests;
        let read = read_pairs(&dir, hosts, |host, raw| {
            let digest = raw.digest();
            let changed = previous.get(host) != Some(&digest);
            (
                digest,
                (changed || !only_changed).then(|| raw.parse(host, now)),
            )
        });
        tracing::debug!(
            hosts = hosts.len(),
            elapsed_ms = started.elapsed().as_secs_f64() * 1e3,
            "certificate pairs read"
        );
        let mut batch = Vec::new();
        for (host, result) in read {
            match result {
                Ok((digest, parsed)) => {
                    self.digests.insert(host.clone(), digest);
                    if let Some(parsed) = parsed {
                        batch.push((host, parsed));
                    }
                }
                Err(e) => {
                    let was_readable = self.digests.remove(&host).is_some();
                    if !only_changed || was_readable {
                        batch.push((host, Err(e)));
                    }
                }
            }
        }
        batch.is_empty() || self.facts.send(Fact::Pairs(batch)).is_ok()
    }
}

type Parsed = ([u8; 32], Option<Result<Certificate, CertError>>);

/// From this many pairs on, reading is spread over threads: parsing and checking a pair is CPU
/// work (about 40 µs), and a cold start reads every route's pair before anything is served.
const PARALLEL_READ_MIN: usize = 64;

/// Reads each host's pair and hands its bytes to `parse`, in order. Many pairs (a cold start, a
/// resync) are read on one thread per core.
fn read_pairs<F>(dir: &Path, hosts: &[String], parse: F) -> Vec<(String, Result<Parsed, CertError>)>
where
    F: Fn(&str, &certs::RawPair) -> Parsed + Sync,
{
    let load = |host: &String| {
        let result = certs::read_pair(&dir.join(host)).map(|raw| parse(host, &raw));
        (host.clone(), result)
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    if hosts.len() < PARALLEL_READ_MIN || threads < 2 {
        return hosts.iter().map(load).collect();
    }
    let chunk = hosts.len().div_ceil(threads);
    std::thread::scope(|scope| {
        let handles: Vec<_> = hosts
            .chunks(chunk)
            .map(|part| scope.spawn(|| part.iter().map(load).collect::<Vec<_>>()))
            .collect();
        handles
            .into_iter()
            .zip(hosts.chunks(chunk))
            // A thread that panicked (it should not: reading returns errors) loses nothing:
            // its hosts are read again here.
            .flat_map(|(h, part)| h.join().unwrap_or_else(|_| part.iter().map(load).collect()))
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use notify::event::{
        AccessKind, CreateKind, EventKind, Flag, ModifyKind, RemoveKind, RenameMode,
    };

    fn event(kind: EventKind, paths: &[&str]) -> notify::Result<notify::Event> {
        let mut event = notify::Event::new(kind);
        for p in paths {
            event = event.add_path(PathBuf::from(p));
        }
        Ok(event)
    }

    fn host(name: &str) -> Change {
        Change::Host(name.into())
    }

    #[test]
    fn events_are_classified_by_where_they_happen() {
        let tls = Path::new("/tls");
        let watched = BTreeSet::from(["a.z".to_owned()]);
        let rename = EventKind::Modify(ModifyKind::Name(RenameMode::Both));
        let create = EventKind::Create(CreateKind::Any);
        let cases: Vec<(notify::Result<notify::Event>, Vec<Change>)> = vec![
            // The AtomicWriter swap: only the rename of `..data` counts.
            (event(create, &["/tls/a.z/..2026_11_30_00_00_01.1"]), vec![]),
            (event(create, &["/tls/a.z/..data_tmp"]), vec![]),
            (
                event(rename, &["/tls/a.z/..data_tmp", "/tls/a.z/..data"]),
                vec![host("a.z")],
            ),
            (
                event(
                    EventKind::Remove(RemoveKind::Folder),
                    &["/tls/a.z/..2026_11_30_00_00_00.0"],
                ),
                vec![],
            ),
            // Plain files written in place.
            (
                event(EventKind::Modify(ModifyKind::Any), &["/tls/a.z/tls.key"]),
                vec![host("a.z")],
            ),
            (event(create, &["/tls/a.z/tls.crt"]), vec![host("a.z")]),
            // A host directory that came or went, watched or not.
            (event(create, &["/tls/b.z"]), vec![host("b.z")]),
            (
                event(EventKind::Remove(RemoveKind::Folder), &["/tls/a.z"]),
                vec![host("a.z")],
            ),
            // An unwatched host's files, reads, and what lies elsewhere are nothing.
            (event(create, &["/tls/b.z/tls.crt"]), vec![]),
            (
                event(EventKind::Access(AccessKind::Any), &["/tls/a.z/tls.crt"]),
                vec![],
            ),
            (event(create, &["/elsewhere/a.z/tls.crt"]), vec![]),
            // Lost events, a broken watch.
            (
                Ok(notify::Event::new(EventKind::Other).set_flag(Flag::Rescan)),
                vec![Change::Rescan],
            ),
            (
                Err(notify::Error::generic("queue overflow")),
                vec![Change::Rescan],
            ),
        ];
        for (event, expected) in cases {
            assert_eq!(classify(&event, tls, &watched), expected, "{event:?}");
        }
    }
}
