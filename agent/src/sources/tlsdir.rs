//! The tls dir source ([`CertSource`]): each route host's pair, `<tls dir>/<host>/{tls.crt,tls.key}`
//! (the layout of cert-manager's CSI driver and of Secret volumes), read and validated on a
//! thread of its own and published whenever it may have changed.
//!
//! Watched, non-recursively, straight on inotify ([`dir_watch`]): the tls dir (a host directory
//! that appears or goes) and each route host's directory. Within a host directory only the names
//! a pair is read through count (`..data`, `tls.crt`, `tls.key`): an AtomicWriter swap first
//! creates a timestamped directory and a `..data_tmp` link and last removes the old directory,
//! and none of those change what a read returns, so one swap costs one read, started by the
//! rename itself.
//!
//! No change goes unseen: a host directory is watched before its pair is read, so anything
//! written after the read began is an event, and each pair is read once.
//!
//! The pairs the workspace names by path (`certificates`, [`ListedPairs`]) are read here too, so
//! that every pair reaches the loop by one reading and validation: their directories watched on
//! an inotify of their own, each pair read when a file of its name changes there (or the
//! directory's `..data` link), and a host one of them covers served that pair instead of the
//! one in its directory.
//!
//! Reading every pair again (a resync, lost events, a tls dir that came back) is owed, not done
//! in one go: the hosts go into a backlog read [`REREAD_SLICE`] at a time, and the inputs are
//! looked at between slices, so a rotation that arrives meanwhile is read and published before
//! the rest of the backlog. At 10,000 routes one pass took 0.8–1.4 s, and a rotation waited for
//! all of it. A pair of the backlog whose files look as they did at its last good read, and
//! whose certificate is still valid, is not read again ([`PairStamps`]); looking at the files
//! is cheaper than reading them but not free, so the inputs are looked at every
//! [`LOOK_SLICE`] pairs looked at too.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Receiver, Sender, TryRecvError};
use std::sync::Arc;

use tokio::sync::mpsc::UnboundedSender;

use super::dir_watch::{self, DirEvent, DirWatches, Watch};
use super::listed_pairs::ListedPairs;
use super::pair_stamps::{self, Look, PairStamps};
use super::{watcher, CertSource, Fact, WatchError, WorkspaceWatch};
use crate::certs::{self, CertError};
use crate::clock::Clock;
use crate::plan::state::Certificate;
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
    Events(Vec<DirEvent>),
    /// Events of the directories of the pairs named by path (`certificates`), watched apart.
    ListedEvents(Vec<DirEvent>),
    /// Reading the watches' events failed: none will come again.
    WatchBroken(std::io::Error),
}

/// What a file-system event means for the pairs.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Change {
    /// This host's pair may have changed.
    Host(String),
    /// This host's directory came, went, or lost its watch: watch it again, and read its pair.
    Dir(String),
    /// The tls dir itself was removed, moved or unmounted: watch it again and read every pair.
    TlsDir,
    /// Events were lost: read every pair again.
    Rescan,
}

/// What the watches are on: the tls dir's, and each host directory's, by the number events
/// carry. Two hosts whose directories are one inode share a watch.
#[derive(Debug, Default)]
pub struct Watched {
    tls_dir: Option<Watch>,
    hosts: BTreeMap<String, Watch>,
    by_id: HashMap<i32, BTreeSet<String>>,
}

impl Watched {
    fn insert(&mut self, host: String, watch: Watch) {
        self.by_id
            .entry(watch.id())
            .or_default()
            .insert(host.clone());
        self.hosts.insert(host, watch);
    }

    /// Forgets `host`'s watch; returns it when no other host shares it (to take it off).
    fn remove(&mut self, host: &str) -> Option<Watch> {
        let watch = self.hosts.remove(host)?;
        let id = watch.id();
        let shared = self.by_id.get_mut(&id).is_some_and(|hosts| {
            hosts.remove(host);
            !hosts.is_empty()
        });
        if shared {
            return None;
        }
        self.by_id.remove(&id);
        Some(watch)
    }

    fn hosts_of(&self, id: i32) -> impl Iterator<Item = &String> {
        self.by_id.get(&id).into_iter().flatten()
    }
}

/// Pure: what `event` means, given what is watched.
pub fn classify(event: &DirEvent, watched: &Watched) -> Vec<Change> {
    if event.overflowed() {
        return vec![Change::Rescan];
    }
    if watched.tls_dir.as_ref().is_some_and(|w| w.id() == event.wd) {
        if event.watch_gone() {
            return vec![Change::TlsDir];
        }
        // An entry of the tls dir: a host directory came, went or changed its permissions.
        return event
            .name
            .as_deref()
            .and_then(OsStr::to_str)
            .map(|host| vec![Change::Dir(host.to_owned())])
            .unwrap_or_default();
    }
    let hosts = watched.hosts_of(event.wd);
    if event.watch_gone() {
        return hosts.cloned().map(Change::Dir).collect();
    }
    if event.name.as_deref().is_some_and(changes_pair) {
        return hosts.cloned().map(Change::Host).collect();
    }
    Vec::new()
}

/// Whether a change to `name`, in a host directory, can change the pair read from it.
fn changes_pair(name: &OsStr) -> bool {
    name == "..data" || name == "tls.crt" || name == "tls.key"
}

/// Starts the source: a thread of its own, which holds `guard` for its life (a supervisor
/// learns of its end), the thread that reads its watches' events, and the task that hands it
/// each new workspace (returned). Pairs live under `tls_dir` when given (the `--tls-dir` flag),
/// else under the workspace's `tls_dir`.
pub fn spawn(
    tls_dir: Option<PathBuf>,
    workspace: WorkspaceWatch,
    facts: UnboundedSender<Fact>,
    clock: Arc<dyn Clock>,
    guard: impl Send + 'static,
) -> Result<(TlsDir, tokio::task::JoinHandle<()>), WatchError> {
    let (inputs, received) = channel();
    let events = inputs.clone();
    let watches = dir_watch::start("tls-dir-events", move |batch| {
        let input = match batch {
            Ok(batch) => Input::Events(batch),
            Err(e) => Input::WatchBroken(e),
        };
        events.send(input).is_ok()
    })
    .map_err(|e| WatchError {
        path: PathBuf::new(),
        error: notify::Error::io(e),
    })?;
    let listed_events = inputs.clone();
    // The pairs named by path are watched on an inotify of their own: a directory of theirs
    // may be a host directory of the tls dir too, and inotify gives one inode one watch per
    // instance, which the two sets would otherwise share and take off under each other.
    let listed_watches = dir_watch::start("listed-pair-events", move |batch| {
        let input = match batch {
            Ok(batch) => Input::ListedEvents(batch),
            Err(e) => Input::WatchBroken(e),
        };
        listed_events.send(input).is_ok()
    })
    .map_err(|e| WatchError {
        path: PathBuf::new(),
        error: notify::Error::io(e),
    })?;
    let forward = inputs.clone();
    let forwarder = super::forward_workspaces(workspace, move |latest| {
        forward.send(Input::Workspace(latest)).is_ok()
    });
    let reader = Reader {
        override_dir: tls_dir.map(|d| watcher::absolute(&d)),
        tls_dir: None,
        hosts: BTreeSet::new(),
        backlog: BTreeSet::new(),
        stamps: PairStamps::default(),
        watched: Watched::default(),
        watches,
        listed: Listed::new(listed_watches),
        facts,
        clock,
        parse: Arc::new(|host, raw, now| raw.parse(host, now)),
    };
    super::spawn_thread("tls-dir", guard, move || reader.run(received))?;
    Ok((TlsDir { inputs }, forwarder))
}

struct Reader {
    override_dir: Option<PathBuf>,
    tls_dir: Option<PathBuf>,
    /// The route hosts of the latest workspace.
    hosts: BTreeSet<String>,
    /// Hosts whose pair is owed a read because everything is read again; taken a slice at a
    /// time, after whatever changed meanwhile.
    backlog: BTreeSet<String>,
    /// How each host's pair files looked at its last good read: the backlog leaves those that
    /// still look so.
    stamps: PairStamps,
    watched: Watched,
    watches: DirWatches,
    /// The pairs named by path and their directories' watches.
    listed: Listed,
    facts: UnboundedSender<Fact>,
    clock: Arc<dyn Clock>,
    parse: Parse,
}

/// The pairs named by path (`certificates`, see [`ListedPairs`]) and the watches on their
/// directories, by the number their events carry.
struct Listed {
    pairs: ListedPairs,
    watches: DirWatches,
    dirs: BTreeMap<PathBuf, Watch>,
    by_id: HashMap<i32, PathBuf>,
}

impl Listed {
    fn new(watches: DirWatches) -> Listed {
        Listed {
            pairs: ListedPairs::default(),
            watches,
            dirs: BTreeMap::new(),
            by_id: HashMap::new(),
        }
    }

    /// Watches each directory of the pairs that has no watch, and takes off those no pair is in
    /// any more. A directory that does not exist yet is read again at each resync.
    fn watch(&mut self) {
        let wanted = self.pairs.dirs();
        let gone: Vec<PathBuf> = self
            .dirs
            .keys()
            .filter(|d| !wanted.contains(*d))
            .cloned()
            .collect();
        for dir in gone {
            self.unwatch(&dir);
        }
        for dir in wanted {
            if self.dirs.contains_key(&dir) {
                continue;
            }
            match self.watches.add(&dir) {
                Ok(watch) => {
                    self.by_id.insert(watch.id(), dir.clone());
                    self.dirs.insert(dir, watch);
                }
                Err(e) => tracing::warn!(dir = %dir.display(), error = %e,
                    "cannot watch the directory of a pair of `certificates`; it is read again at each resync"),
            }
        }
    }

    fn unwatch(&mut self, dir: &Path) {
        if let Some(watch) = self.dirs.remove(dir) {
            self.by_id.remove(&watch.id());
            self.watches.remove(watch);
        }
    }

    /// Takes off every watch (the source ends).
    fn close(&mut self) {
        for dir in self.dirs.keys().cloned().collect::<Vec<_>>() {
            self.unwatch(&dir);
        }
    }
}

/// Validates a pair's bytes as `host`'s at a time: [`certs::RawPair::parse`], or in tests one
/// that holds a read where the test wants the reader to be.
type Parse = Arc<dyn Fn(&str, &certs::RawPair, i64) -> PairRead + Send + Sync>;

/// What following a workspace found.
#[derive(Default)]
struct Followed {
    /// The hosts it routes that the last did not: their pairs are read.
    new: BTreeSet<String>,
    /// The tls dir moved: every host is new, and lacks its watch.
    moved: bool,
}

/// What the inputs taken in one round said changed: the reader acts on them together, so a
/// burst of events for one host reads its pair once.
#[derive(Default)]
struct ChangesSeen {
    workspace: Option<Option<Arc<Workspace>>>,
    everything: bool,
    overflow: bool,
    hosts: BTreeSet<String>,
    /// Host directories that came or went: their watch is made again.
    rewatch: BTreeSet<String>,
    /// Watch the tls dir again (it may have been created, moved or removed since).
    tls_dir: bool,
    /// Pairs named by path to read again, by index; and whether their directories are to be
    /// watched again.
    listed: BTreeSet<usize>,
    rewatch_listed: bool,
}

impl Reader {
    fn run(mut self, inputs: Receiver<Input>) {
        loop {
            // With a backlog, only what is already queued: the backlog goes on when nothing is.
            let first = if self.backlog.is_empty() {
                match inputs.recv() {
                    Ok(input) => Some(input),
                    Err(_) => break,
                }
            } else {
                match inputs.try_recv() {
                    Ok(input) => Some(input),
                    Err(TryRecvError::Empty) => None,
                    Err(TryRecvError::Disconnected) => break,
                }
            };
            let mut changes = ChangesSeen::default();
            let mut broken = false;
            if let Some(first) = first {
                broken = self.absorb(first, &mut changes);
                // Coalesce whatever else is already queued: one read for a burst of events.
                while let Ok(more) = inputs.try_recv() {
                    broken |= self.absorb(more, &mut changes);
                }
            }
            if broken || !self.work(changes) || !self.work_backlog() {
                break;
            }
        }
        // Taking the last watch off wakes the events' thread, which then finds nobody listening.
        if let Some(watch) = self.watched.tls_dir.take() {
            self.watches.remove(watch);
        }
        for host in std::mem::take(&mut self.watched).hosts.into_keys() {
            self.unwatch(&host);
        }
        self.listed.close();
    }

    /// Takes one input into `changes`; returns true when the watches broke (the source ends, and
    /// its supervisor learns it).
    fn absorb(&mut self, input: Input, changes: &mut ChangesSeen) -> bool {
        match input {
            Input::Workspace(workspace) => changes.workspace = Some(workspace),
            Input::Reread => changes.everything = true,
            Input::Host(host) => {
                // A directory the issuer just made needs its watch (and the tls dir its own); a
                // renewal of a watched one is a read, nothing more.
                if !self.watched.hosts.contains_key(&host) {
                    changes.rewatch.insert(host.clone());
                }
                changes.tls_dir |= self.watched.tls_dir.is_none();
                changes.hosts.insert(host);
            }
            Input::Events(events) => {
                for event in &events {
                    for change in classify(event, &self.watched) {
                        match change {
                            Change::Rescan => {
                                changes.everything = true;
                                changes.overflow = true;
                            }
                            Change::TlsDir => {
                                self.watched.tls_dir = None;
                                changes.tls_dir = true;
                                changes.everything = true;
                            }
                            Change::Dir(host) => {
                                changes.rewatch.insert(host.clone());
                                changes.hosts.insert(host);
                            }
                            Change::Host(host) => {
                                changes.hosts.insert(host);
                            }
                        }
                    }
                }
            }
            Input::ListedEvents(events) => {
                for event in &events {
                    if event.overflowed() {
                        changes.everything = true;
                        changes.overflow = true;
                        continue;
                    }
                    let Some(dir) = self.listed.by_id.get(&event.wd).cloned() else {
                        continue;
                    };
                    if event.watch_gone() {
                        // Removed or moved: watched again (when it is back), its pairs read.
                        self.listed.unwatch(&dir);
                        changes.rewatch_listed = true;
                        changes.listed.extend(self.listed.pairs.in_dir(&dir));
                    } else if let Some(name) = &event.name {
                        changes
                            .listed
                            .extend(self.listed.pairs.changed_by(&dir, name));
                    }
                }
            }
            Input::WatchBroken(e) => {
                tracing::error!(error = %e, "the certificate watcher broke; the tls dir source ends");
                return true;
            }
        }
        false
    }

    /// Does `changes`; returns false once nobody listens.
    fn work(&mut self, mut changes: ChangesSeen) -> bool {
        if !changes.hosts.is_empty() {
            // The moment a change was taken up: the first hop of a rotation's timing.
            tracing::debug!(hosts = changes.hosts.len(), "pair changes seen");
        }
        // Which hosts lack a watch changes only with the hosts, the directories that came or
        // went, or a fresh start; working it out costs a pass over every host, too much to pay
        // for each of the events a single swap makes (at 10,000 hosts it delayed the rename's
        // event by half a millisecond).
        let rewatch = changes.workspace.is_some()
            || changes.everything
            || changes.tls_dir
            || !changes.rewatch.is_empty();
        // Which hosts may lack a watch: all of them, or (an edit, a directory that came) those
        // that came.
        let mut came = BTreeSet::new();
        let mut moved = false;
        if let Some(workspace) = changes.workspace.take() {
            let started = std::time::Instant::now();
            let followed = self.follow(workspace.as_deref());
            tracing::debug!(
                new = followed.new.len(),
                elapsed_ms = started.elapsed().as_secs_f64() * 1e3,
                "workspace followed"
            );
            moved = followed.moved;
            came.clone_from(&followed.new);
            changes.hosts.extend(followed.new);
            if let Some(workspace) = workspace.as_deref() {
                let new = self.listed.pairs.set(&workspace.certificates);
                changes.listed.extend(new);
                changes.rewatch_listed = true;
            }
        }
        if changes.everything {
            changes.listed.extend(0..self.listed.pairs.len());
            changes.rewatch_listed = true;
        }
        // Watches first, then the reads they guard.
        if changes.rewatch_listed {
            self.listed.watch();
        }
        let served_before: BTreeSet<String> = changes
            .listed
            .iter()
            .flat_map(|&i| self.listed.pairs.hosts_of(i).cloned().collect::<Vec<_>>())
            .collect();
        let now = self.clock.unix();
        let mut renewed = BTreeSet::new();
        for &index in &changes.listed {
            let Some(files) = self.listed.pairs.files(index).cloned() else {
                continue;
            };
            let read = certs::read_files(&files.cert_file, &files.key_file)
                .and_then(|raw| raw.parse_named(now));
            if self.listed.pairs.read(index, read) {
                renewed.insert(index);
            }
        }
        // Who serves which host may change with the hosts, or with a pair's names.
        if !renewed.is_empty() || !changes.listed.is_empty() || rewatch {
            changes.hosts.extend(self.listed.pairs.assign(&self.hosts));
        }
        for index in renewed {
            changes
                .hosts
                .extend(self.listed.pairs.hosts_of(index).cloned());
        }
        changes.hosts.extend(served_before);
        if changes.overflow {
            tracing::warn!("the certificate watcher lost events; reading every pair again");
            if self.facts.send(Fact::WatchOverflow).is_err() {
                return false;
            }
        }
        if changes.everything || changes.tls_dir {
            self.watch_tls_dir();
        }
        if changes.everything {
            // Owed, read a slice at a time after what changed meanwhile (`work_backlog`).
            self.backlog.extend(self.hosts.iter().cloned());
        }
        for host in &changes.rewatch {
            self.unwatch(host);
        }
        // Watches first, then the one read they guard.
        if rewatch {
            // Without the tls dir's watch, a directory that came may have gone unseen.
            if moved || changes.everything || changes.tls_dir || self.watched.tls_dir.is_none() {
                self.watch_hosts(None);
            } else {
                came.extend(changes.rewatch.iter().cloned());
                self.watch_hosts(Some(&came));
            }
        }
        let hosts: Vec<String> = changes
            .hosts
            .into_iter()
            .filter(|h| self.hosts.contains(h))
            .collect();
        // Read now: no longer owed.
        for host in &hosts {
            self.backlog.remove(host);
        }
        hosts.is_empty() || self.publish(&hosts, ReadThreads::OverCores)
    }

    /// Reads and publishes the next slice of the backlog: the pairs whose files changed since
    /// their last good read, or whose certificate's validity may have ended. Returns false once
    /// nobody listens.
    fn work_backlog(&mut self) -> bool {
        let now = self.clock.unix();
        let (hosts, tls_dir, listed, stamps) =
            (&self.hosts, &self.tls_dir, &self.listed, &self.stamps);
        let slice = next_slice(
            &mut self.backlog,
            // A pair of `certificates` is always read again; the others' files are looked at.
            |host| {
                listed.pairs.serves(host) || {
                    let look = tls_dir.as_ref().and_then(|d| Look::of(&d.join(host)));
                    !stamps.unchanged(host, look.as_ref(), now)
                }
            },
            hosts,
        );
        slice.is_empty() || self.publish(&slice, ReadThreads::ThisThread)
    }

    /// Takes the latest workspace: the hosts to read, and whether every host needs its watch
    /// again (the tls dir moved).
    ///
    /// An edit changes a host or two of thousands: the routed hosts are kept and changed in
    /// place, found by one walk over the old and the new in order, not built again. Built
    /// again (1.2–1.4 ms at 10,000 routes), with a pass over every host for its watch after it
    /// (1.6 ms), this held the thread for each edit, 8–19 ms of wall time beside the edit's
    /// evaluation, and a rotation's event that came meanwhile waited for all of it. Now 0.5 ms,
    /// most of it the workspace's own list of hosts.
    fn follow(&mut self, workspace: Option<&Workspace>) -> Followed {
        let Some(workspace) = workspace else {
            return Followed::default();
        };
        let dir = self
            .override_dir
            .clone()
            .unwrap_or_else(|| watcher::absolute(&workspace.tls_dir));
        let routed = workspace.tls_hosts();
        if self.tls_dir.as_ref() != Some(&dir) {
            if let Some(old) = self.watched.tls_dir.take() {
                self.watches.remove(old);
            }
            let old_hosts: Vec<String> = self.watched.hosts.keys().cloned().collect();
            for host in old_hosts {
                self.unwatch(&host);
            }
            self.tls_dir = Some(dir);
            self.stamps.clear();
            self.watch_tls_dir();
            self.hosts = routed.into_iter().map(str::to_owned).collect();
            return Followed {
                new: self.hosts.clone(),
                moved: true,
            };
        }
        // A host that leaves is forgotten here, once: forgetting stamps of hosts gone by a pass
        // over all of them after each input cost every rotation's event 2–3 ms at 10,000 routes.
        // Both in order: one walk over the two finds what left and what came.
        let (mut gone, mut new) = (Vec::new(), BTreeSet::new());
        let mut kept = self.hosts.iter().peekable();
        for host in routed {
            while let Some(left) = kept.next_if(|k| k.as_str() < host) {
                gone.push(left.clone());
            }
            if kept.next_if(|k| k.as_str() == host).is_none() {
                new.insert(host.to_owned());
            }
        }
        gone.extend(kept.cloned());
        for host in gone {
            self.unwatch(&host);
            self.stamps.forget(&host);
            self.hosts.remove(&host);
        }
        self.hosts.extend(new.iter().cloned());
        Followed { new, moved: false }
    }

    fn watch_tls_dir(&mut self) {
        let Some(dir) = self.tls_dir.clone() else {
            return;
        };
        if self.watched.tls_dir.is_some() {
            return;
        }
        match self.watches.add(&dir) {
            Ok(watch) => {
                self.watched.tls_dir = Some(watch);
                tracing::debug!(dir = %dir.display(), "watching the tls dir");
            }
            Err(e) => tracing::warn!(dir = %dir.display(), error = %e,
                "cannot watch the tls dir; a host directory that appears is read at the next resync"),
        }
    }

    fn unwatch(&mut self, host: &str) {
        if let Some(watch) = self.watched.remove(host) {
            self.watches.remove(watch);
        }
    }

    /// Adds a watch on each route host's directory that has none, of `only` when given (the
    /// hosts that came), else of every host. A directory that does not exist yet is watched
    /// when the tls dir's watch sees it come.
    fn watch_hosts(&mut self, only: Option<&BTreeSet<String>>) {
        let Some(dir) = self.tls_dir.clone() else {
            return;
        };
        let started = std::time::Instant::now();
        let lacks = |h: &&String| self.hosts.contains(*h) && !self.watched.hosts.contains_key(*h);
        let missing: Vec<String> = match only {
            Some(only) => only.iter().filter(lacks).cloned().collect(),
            None => self.hosts.iter().filter(lacks).cloned().collect(),
        };
        let mut added = 0usize;
        for host in missing {
            match self.watches.add(&dir.join(&host)) {
                Ok(watch) => {
                    self.watched.insert(host, watch);
                    added += 1;
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
                    ) => {}
                Err(e) => tracing::warn!(host, error = %e,
                    "cannot watch a host directory; its pair is read again at each resync"),
            }
        }
        if added > 0 {
            tracing::debug!(
                added,
                elapsed_ms = started.elapsed().as_secs_f64() * 1e3,
                "host directories watched"
            );
        }
    }

    /// Reads and publishes the pairs of `hosts`. Returns false once nobody listens.
    fn publish(&mut self, hosts: &[String], spread: ReadThreads) -> bool {
        let Some(dir) = self.tls_dir.clone() else {
            return true;
        };
        let started = std::time::Instant::now();
        // This thread's CPU alone (a large batch's helper threads are not counted), asked of the
        // kernel only when the line is logged: it is a system call each time.
        let timed = tracing::enabled!(tracing::Level::DEBUG);
        let cpu = timed.then(crate::clock::thread_cpu_time);
        let now = self.clock.unix();
        let parse = &self.parse;
        // A host a pair of `certificates` serves is served that pair, whatever its tls dir holds.
        let (listed, from_dir): (Vec<String>, Vec<String>) = hosts
            .iter()
            .cloned()
            .partition(|h| self.listed.pairs.serves(h));
        // Looked at before the read: a write after the look changes the look next time.
        let read_began = pair_stamps::wall_now();
        let looks: Vec<Option<Look>> = from_dir.iter().map(|h| Look::of(&dir.join(h))).collect();
        let mut batch = read_pairs(&dir, &from_dir, spread, |host, raw| parse(host, raw, now));
        for ((host, read), look) in batch.iter().zip(looks) {
            let valid_until = read.as_ref().ok().map(|c| c.not_after);
            self.stamps.note(host, look, read_began, valid_until);
        }
        batch.extend(
            listed
                .into_iter()
                .filter_map(|h| Some((h.clone(), self.listed.pairs.pair_of(&h)?))),
        );
        if let Some(cpu) = cpu {
            tracing::debug!(
                hosts = hosts.len(),
                elapsed_ms = started.elapsed().as_secs_f64() * 1e3,
                cpu_ms = crate::clock::thread_cpu_time()
                    .saturating_sub(cpu)
                    .as_secs_f64()
                    * 1e3,
                "certificate pairs read"
            );
        }
        self.facts.send(Fact::Pairs(batch)).is_ok()
    }
}

type PairRead = Result<Certificate, CertError>;

/// How many pairs of a backlog are read between two looks at the inputs: about 40 µs of CPU
/// each, so a rotation waits a millisecond or two behind a slice, and the loop takes up each
/// slice in a fraction of a millisecond. At 128 pairs, read over both cores, a slice took 17–40
/// ms of wall time at 10,000 routes beside a resync and an edit's evaluation, and a rotation
/// waited for it.
const REREAD_SLICE: usize = 32;

/// How many pairs of a backlog are looked at (two file statuses each) between two looks at the
/// inputs, however few of them are owed a read. A look costs 10–15 µs at 10,000 routes beside
/// sozu and an evaluation: a resync's backlog of 10,000 unchanged pairs, looked at in one go,
/// held a rotation's event 127 ms, and a slice of 256 looks 3–4 ms. At 64, under a millisecond;
/// the look at the inputs between two slices is a channel's `try_recv`.
const LOOK_SLICE: usize = 64;

/// Takes the next slice of `backlog`: up to [`REREAD_SLICE`] hosts that `owed` says are owed a
/// read, after looking at no more than [`LOOK_SLICE`] hosts. A host `routed` no longer has is
/// owed nothing and passed over without a look.
fn next_slice(
    backlog: &mut BTreeSet<String>,
    mut owed: impl FnMut(&str) -> bool,
    routed: &BTreeSet<String>,
) -> Vec<String> {
    let mut slice = Vec::with_capacity(REREAD_SLICE.min(backlog.len()));
    let mut looked = 0;
    while slice.len() < REREAD_SLICE && looked < LOOK_SLICE {
        let Some(host) = backlog.pop_first() else {
            break;
        };
        if routed.contains(&host) {
            looked += 1;
            if owed(&host) {
                slice.push(host);
            }
        }
    }
    slice
}

/// Whether a batch is read over every core or on the source's thread alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReadThreads {
    /// What the agent waits for (a start, the hosts an edit adds, a rotation): as fast as the
    /// machine allows.
    OverCores,
    /// A backlog's slice, which nothing waits for: it leaves the other cores to sozu and the
    /// loop, which serve rotations meanwhile.
    ThisThread,
}

/// From this many pairs on, reading is spread over threads: parsing and checking a pair is CPU
/// work (about 40 µs), and a cold start reads every route's pair before anything is served.
const PARALLEL_READ_MIN: usize = 64;

/// Reads each host's pair and hands its bytes to `parse`, in order. Many pairs (a cold start)
/// are read on one thread per core, unless `spread` says this thread alone.
fn read_pairs<F>(
    dir: &Path,
    hosts: &[String],
    spread: ReadThreads,
    parse: F,
) -> Vec<(String, PairRead)>
where
    F: Fn(&str, &certs::RawPair) -> PairRead + Sync,
{
    let load = |host: &String| {
        let result = certs::read_pair(&dir.join(host)).and_then(|raw| parse(host, &raw));
        (host.clone(), result)
    };
    if hosts.len() < PARALLEL_READ_MIN || spread == ReadThreads::ThisThread {
        return hosts.iter().map(load).collect();
    }
    // Asked once: the standard library reads the cgroup's CPU quota from /proc and /sys at each
    // call, which was a quarter of a single rotation's read when asked every time.
    static THREADS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let threads =
        *THREADS.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    if threads < 2 {
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
    use inotify::EventMask;

    fn event(wd: i32, mask: EventMask, name: Option<&str>) -> DirEvent {
        DirEvent {
            wd,
            mask,
            name: name.map(Into::into),
        }
    }

    fn host(name: &str) -> Change {
        Change::Host(name.into())
    }

    fn dir(name: &str) -> Change {
        Change::Dir(name.into())
    }

    /// Real watches (their numbers are the kernel's): the tls dir, `a.z`, and `b.z` and `c.z`
    /// that are one directory (`c.z` a symlink to `b.z`).
    #[test]
    fn events_are_classified_by_where_they_happen() {
        let tls = tempfile::tempdir().unwrap();
        for d in ["a.z", "b.z"] {
            std::fs::create_dir(tls.path().join(d)).unwrap();
        }
        std::os::unix::fs::symlink(tls.path().join("b.z"), tls.path().join("c.z")).unwrap();
        let mut watches = dir_watch::start("classify-test", |_| true).unwrap();
        let mut watched = Watched {
            tls_dir: Some(watches.add(tls.path()).unwrap()),
            ..Watched::default()
        };
        for h in ["a.z", "b.z", "c.z"] {
            watched.insert(h.into(), watches.add(&tls.path().join(h)).unwrap());
        }
        let [t, a, b] = [
            watched.tls_dir.as_ref().unwrap().id(),
            watched.hosts["a.z"].id(),
            watched.hosts["b.z"].id(),
        ];
        assert_eq!(watched.hosts["c.z"].id(), b, "one inode, one watch");
        let cases = vec![
            // The AtomicWriter swap: only the rename of `..data` counts.
            (
                event(
                    a,
                    EventMask::CREATE | EventMask::ISDIR,
                    Some("..2026_11_30.1"),
                ),
                vec![],
            ),
            (event(a, EventMask::CREATE, Some("..data_tmp")), vec![]),
            (event(a, EventMask::MOVED_FROM, Some("..data_tmp")), vec![]),
            (
                event(a, EventMask::MOVED_TO, Some("..data")),
                vec![host("a.z")],
            ),
            (
                event(
                    a,
                    EventMask::DELETE | EventMask::ISDIR,
                    Some("..2026_11_30.0"),
                ),
                vec![],
            ),
            // Plain files written in place, or made unreadable.
            (
                event(a, EventMask::CLOSE_WRITE, Some("tls.key")),
                vec![host("a.z")],
            ),
            (
                event(a, EventMask::ATTRIB, Some("tls.crt")),
                vec![host("a.z")],
            ),
            // One directory, two hosts.
            (
                event(b, EventMask::MOVED_TO, Some("..data")),
                vec![host("b.z"), host("c.z")],
            ),
            // A host directory that came or went, watched or not; the watch of one removed.
            (
                event(t, EventMask::CREATE | EventMask::ISDIR, Some("d.z")),
                vec![dir("d.z")],
            ),
            (
                event(t, EventMask::DELETE | EventMask::ISDIR, Some("a.z")),
                vec![dir("a.z")],
            ),
            (event(a, EventMask::IGNORED, None), vec![dir("a.z")]),
            // The tls dir itself gone; events lost.
            (event(t, EventMask::DELETE_SELF, None), vec![Change::TlsDir]),
            (event(-1, EventMask::Q_OVERFLOW, None), vec![Change::Rescan]),
            // A watch taken off before its last events came.
            (event(9_999, EventMask::MOVED_TO, Some("..data")), vec![]),
        ];
        for (event, expected) in cases {
            assert_eq!(classify(&event, &watched), expected, "{event:?}");
        }
        // `c.z` goes: the watch stays for `b.z`; then `b.z` goes and it is taken off.
        assert!(watched.remove("c.z").is_none());
        assert_eq!(
            classify(&event(b, EventMask::MOVED_TO, Some("..data")), &watched),
            vec![host("b.z")]
        );
        assert!(watched.remove("b.z").is_some());
    }

    /// Writes a self-signed pair for `host` under `tls/<host>/`; returns its certificate.
    fn write_pair(tls: &Path, host: &str, key: &rcgen::KeyPair, serial: u64) -> String {
        let mut params = rcgen::CertificateParams::new(vec![host.to_owned()]).unwrap();
        params.serial_number = Some(serial.into());
        let crt = params.self_signed(key).unwrap().pem();
        let dir = tls.join(host);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("tls.key"), key.serialize_pem()).unwrap();
        std::fs::write(dir.join("tls.crt"), &crt).unwrap();
        crt
    }

    fn hosts(n: usize) -> BTreeSet<String> {
        (0..n).map(|i| format!("h{i:04}.in.example.org")).collect()
    }

    /// A backlog of pairs that all look as at their last read (a resync at rest) is looked at
    /// a slice at a time, each slice empty: the inputs (a rotation) come between slices.
    #[test]
    fn a_backlog_of_unchanged_pairs_is_looked_at_a_slice_at_a_time() {
        let routed = hosts(2 * LOOK_SLICE + 10);
        let mut backlog = routed.clone();
        let mut looked = 0;
        for left in [LOOK_SLICE + 10, 10, 0] {
            let slice = next_slice(
                &mut backlog,
                |_| {
                    looked += 1;
                    false
                },
                &routed,
            );
            assert!(slice.is_empty());
            assert_eq!(backlog.len(), left);
        }
        assert_eq!(looked, routed.len(), "each looked at once");
    }

    /// Pairs owed a read fill a slice of [`REREAD_SLICE`]; hosts no longer routed are passed
    /// over without a look and count for nothing.
    #[test]
    fn a_slice_holds_the_owed_pairs_and_passes_over_hosts_no_longer_routed() {
        let all = hosts(4 * REREAD_SLICE);
        let routed: BTreeSet<String> = all.iter().skip(REREAD_SLICE).cloned().collect();
        let mut backlog = all.clone();
        let mut looked = Vec::new();
        let slice = next_slice(
            &mut backlog,
            |h| {
                looked.push(h.to_owned());
                true
            },
            &routed,
        );
        let expected: Vec<String> = routed.iter().take(REREAD_SLICE).cloned().collect();
        assert_eq!(slice, expected);
        assert_eq!(looked, expected, "the unrouted hosts were not looked at");
        assert_eq!(backlog.len(), 2 * REREAD_SLICE);
    }

    /// Everything read again goes a slice at a time, and a pair that changes meanwhile is read
    /// and published before the rest: held inside the second slice, the reader takes up a
    /// rotation queued meanwhile right after that slice, not after the whole backlog.
    #[test]
    fn a_rotation_is_read_between_the_slices_of_a_reread() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let tls = tempfile::tempdir().unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let hosts: Vec<String> = (0..3 * REREAD_SLICE)
            .map(|i| format!("h{i:04}.in.example.org"))
            .collect();
        for host in &hosts {
            write_pair(tls.path(), host, &key, 1);
        }
        // The first host of the second slice holds its read until the test lets it go.
        let held = hosts[REREAD_SLICE].clone();
        let (entered_tx, entered) = channel::<()>();
        let (release, released) = channel::<()>();
        let (entered_tx, released) = (
            std::sync::Mutex::new(entered_tx),
            std::sync::Mutex::new(released),
        );
        let holding = Arc::new(AtomicBool::new(false));
        let hold = holding.clone();
        let parse: Parse = Arc::new(move |host, raw, now| {
            if host == held && hold.swap(false, Ordering::SeqCst) {
                entered_tx.lock().unwrap().send(()).unwrap();
                released.lock().unwrap().recv().unwrap();
            }
            raw.parse(host, now)
        });
        let (reader, mut published) = reader(tls.path(), parse);
        let (inputs, received) = channel();
        let thread = std::thread::spawn(move || reader.run(received));
        let mut next = || match published.blocking_recv() {
            Some(Fact::Pairs(batch)) => batch,
            Some(_) => panic!("a fact other than pairs"),
            None => panic!("the reader ended"),
        };
        inputs
            .send(Input::Workspace(Some(Arc::new(routing(
                tls.path(),
                &hosts,
            )))))
            .unwrap();
        assert_eq!(
            next().len(),
            hosts.len(),
            "a start reads every pair at once"
        );

        holding.store(true, Ordering::SeqCst);
        inputs.send(Input::Reread).unwrap();
        let first = next();
        assert_eq!(first.len(), REREAD_SLICE);
        assert_eq!(first[0].0, hosts[0]);
        entered.recv().unwrap();
        // Rotated while the reader is inside the second slice: the last host, owed by the third.
        let rotated = hosts.last().unwrap().clone();
        let new_crt = write_pair(tls.path(), &rotated, &key, 2);
        inputs.send(Input::Host(rotated.clone())).unwrap();
        release.send(()).unwrap();

        let second = next();
        assert_eq!(second.len(), REREAD_SLICE);
        assert_eq!(second[0].0, hosts[REREAD_SLICE]);
        let rotation = next();
        assert_eq!(
            rotation.len(),
            1,
            "the rotation comes before the rest of the backlog"
        );
        assert_eq!(rotation[0].0, rotated);
        let served = rotation[0].1.as_ref().expect("the rotated pair is valid");
        assert_eq!(served.chain[0].trim(), new_crt.trim());
        let third = next();
        assert_eq!(
            third.len(),
            REREAD_SLICE - 1,
            "a host read for its rotation is not read again"
        );
        assert!(third.iter().all(|(h, _)| *h != rotated));

        drop(inputs);
        thread.join().unwrap();
    }

    /// A reader of pairs under `tls`, validating them with `parse`, and what it publishes.
    fn reader(tls: &Path, parse: Parse) -> (Reader, tokio::sync::mpsc::UnboundedReceiver<Fact>) {
        let (facts, published) = tokio::sync::mpsc::unbounded_channel();
        let reader = Reader {
            override_dir: Some(tls.to_owned()),
            tls_dir: None,
            hosts: BTreeSet::new(),
            backlog: BTreeSet::new(),
            stamps: PairStamps::default(),
            watched: Watched::default(),
            watches: dir_watch::start("reader-test", |_| true).unwrap(),
            listed: Listed::new(dir_watch::start("reader-listed-test", |_| true).unwrap()),
            facts,
            clock: Arc::new(crate::clock::SystemClock),
            parse,
        };
        (reader, published)
    }

    /// A workspace routing each of `hosts`, its pairs under `tls`.
    fn routing(tls: &Path, hosts: &[String]) -> Workspace {
        let routes = hosts
            .iter()
            .map(|h| {
                crate::workspace::test_route(
                    h,
                    crate::workspace::Upstream::Ip {
                        address: "127.0.0.1:80".parse().unwrap(),
                    },
                )
            })
            .collect();
        crate::workspace::test_workspace(tls, routes)
    }

    /// An edit makes the reader look for watches only among the hosts it brings in: those are
    /// watched, a host that leaves is not, and a host whose directory comes after the edit is
    /// watched when the tls dir's watch sees it come.
    #[test]
    fn an_edit_watches_the_hosts_it_brings_in_and_none_that_left() {
        let tls = tempfile::tempdir().unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let hosts: Vec<String> = (0..4).map(|i| format!("h{i}.in.example.org")).collect();
        for host in [&hosts[0], &hosts[1], &hosts[3]] {
            write_pair(tls.path(), host, &key, 1);
        }
        let (mut reader, _published) =
            reader(tls.path(), Arc::new(|h, raw, now| raw.parse(h, now)));
        let edit = |reader: &mut Reader, routed: &[String]| {
            let ws = Arc::new(routing(tls.path(), routed));
            assert!(reader.work(ChangesSeen {
                workspace: Some(Some(ws)),
                ..ChangesSeen::default()
            }));
        };
        fn watched(reader: &Reader) -> Vec<&str> {
            reader.watched.hosts.keys().map(String::as_str).collect()
        }
        edit(&mut reader, &hosts[..3]);
        assert_eq!(
            watched(&reader),
            [&*hosts[0], &*hosts[1]],
            "h2 has no directory yet"
        );
        edit(&mut reader, &hosts);
        assert_eq!(watched(&reader), [&*hosts[0], &*hosts[1], &*hosts[3]]);
        edit(
            &mut reader,
            &[hosts[0].clone(), hosts[2].clone(), hosts[3].clone()],
        );
        assert_eq!(watched(&reader), [&*hosts[0], &*hosts[3]], "h1 left");
        // h2's directory comes: the tls dir's watch says so.
        write_pair(tls.path(), &hosts[2], &key, 1);
        assert!(reader.work(ChangesSeen {
            rewatch: [hosts[2].clone()].into(),
            hosts: [hosts[2].clone()].into(),
            ..ChangesSeen::default()
        }));
        assert_eq!(watched(&reader), [&*hosts[0], &*hosts[2], &*hosts[3]]);
    }

    /// An edit's hosts that came and left, found by one walk over both in order: before, after,
    /// between and beside the hosts kept.
    #[test]
    fn an_edit_finds_the_hosts_that_came_and_left() {
        let tls = tempfile::tempdir().unwrap();
        let (mut reader, _published) =
            reader(tls.path(), Arc::new(|h, raw, now| raw.parse(h, now)));
        let names = |v: &[&str]| -> Vec<String> {
            v.iter().map(|h| format!("{h}.in.example.org")).collect()
        };
        let first = reader.follow(Some(&routing(tls.path(), &names(&["c", "e", "g"]))));
        assert!(first.moved);
        let followed = reader.follow(Some(&routing(
            tls.path(),
            &names(&["a", "c", "d", "f", "g", "h"]),
        )));
        assert!(!followed.moved);
        assert_eq!(
            followed.new.into_iter().collect::<Vec<_>>(),
            names(&["a", "d", "f", "h"])
        );
        assert_eq!(
            reader.hosts.iter().cloned().collect::<Vec<_>>(),
            names(&["a", "c", "d", "f", "g", "h"]),
            "e left"
        );
        let followed = reader.follow(Some(&routing(tls.path(), &names(&["b"]))));
        assert_eq!(followed.new.into_iter().collect::<Vec<_>>(), names(&["b"]));
        assert_eq!(
            reader.hosts.iter().cloned().collect::<Vec<_>>(),
            names(&["b"])
        );
    }

    /// What the reader keeps of each pair's last read goes with the host: a host the workspace
    /// no longer routes is forgotten when it leaves, and all of them when the pairs move to
    /// another directory, so that the reader holds nothing for hosts long gone.
    #[test]
    fn the_last_reads_of_hosts_that_leave_are_forgotten() {
        let tls = tempfile::tempdir().unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let hosts: Vec<String> = (0..4).map(|i| format!("h{i}.in.example.org")).collect();
        for host in &hosts {
            write_pair(tls.path(), host, &key, 1);
        }
        let (mut reader, _published) =
            reader(tls.path(), Arc::new(|h, raw, now| raw.parse(h, now)));
        let all = routing(tls.path(), &hosts);
        let new = reader.follow(Some(&all));
        let new: Vec<String> = new.new.into_iter().collect();
        // Looked at long enough after the write for the read to be trusted.
        let later = pair_stamps::wall_now() + 5;
        for host in &new {
            let look = Look::of(&tls.path().join(host));
            reader.stamps.note(host, look, later, Some(later + 3600));
        }
        assert_eq!(reader.stamps.len(), 4);

        reader.follow(Some(&routing(tls.path(), &hosts[..1])));
        assert_eq!(
            reader.stamps.len(),
            1,
            "the three hosts that left are forgotten"
        );
        let look = Look::of(&tls.path().join(&hosts[0]));
        assert!(reader.stamps.unchanged(&hosts[0], look.as_ref(), later));

        reader.override_dir = Some(tls.path().join("elsewhere"));
        reader.follow(Some(&all));
        assert!(
            reader.stamps.is_empty(),
            "another directory: nothing is as it was"
        );
    }
}
