//! Directory watches straight on inotify, for the tls dir source: each added with one system
//! call by the thread that reads what it guards, and every event read on a thread of its own.
//!
//! Why not notify: it adds a watch by a round trip to its own thread (about 19 µs each, 189 ms
//! for 10,000 host directories). A watch must come before its directory's pair is read, or a
//! change between the read and the watch is lost; at notify's cost that means reading every
//! pair twice at a cold start. With a watch that costs one `inotify_add_watch`, a directory is
//! watched first and its pair read once: whatever changes after the watch is an event.
//!
//! inotify gives one watch per inode: two paths to one directory (a host directory that is a
//! symlink to another's) share a watch descriptor, which the caller keeps in mind.

use std::ffi::OsString;
use std::io;
use std::path::Path;

use inotify::{EventMask, Inotify, WatchMask};

/// One event, as the reader classifies it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEvent {
    /// The watch it came from (the kernel's number; `-1` for a queue overflow).
    pub wd: i32,
    pub mask: EventMask,
    /// The entry of the watched directory it concerns; `None` for the directory itself.
    pub name: Option<OsString>,
}

impl DirEvent {
    /// Events were dropped: the kernel's queue was full.
    pub fn overflowed(&self) -> bool {
        self.mask.contains(EventMask::Q_OVERFLOW)
    }

    /// The watch is gone: its directory was removed, unmounted, or the watch taken off.
    pub fn watch_gone(&self) -> bool {
        self.mask
            .intersects(EventMask::IGNORED | EventMask::DELETE_SELF | EventMask::MOVE_SELF)
    }
}

/// What a watched directory reports: entries created, removed, renamed, written and closed, or
/// whose permissions changed, and the directory itself removed or moved. Never opens or reads
/// (the source's own reads would wake it), and never a write still under way (`MODIFY`): a
/// file written in place is read once it is closed.
fn mask() -> WatchMask {
    WatchMask::CREATE
        | WatchMask::DELETE
        | WatchMask::MOVED_FROM
        | WatchMask::MOVED_TO
        | WatchMask::CLOSE_WRITE
        | WatchMask::ATTRIB
        | WatchMask::DELETE_SELF
        | WatchMask::MOVE_SELF
        | WatchMask::ONLYDIR
}

/// The handle that adds and removes watches. Events go to the sink given to [`start`].
pub struct DirWatches {
    watches: inotify::Watches,
}

/// How many bytes of events one read takes at most (the kernel's own queue holds 16,384 events
/// by default; this is a batch of them, not a limit).
const READ_BUFFER: usize = 64 * 1024;

/// Starts watching: `sink` gets each batch of events read together, on a thread named `name`,
/// until it returns false. The thread notices that only at its next event; dropping the last
/// watch makes one (`IGNORED`), which is how the caller ends it.
pub fn start(
    name: &str,
    sink: impl Fn(Result<Vec<DirEvent>, io::Error>) -> bool + Send + 'static,
) -> io::Result<DirWatches> {
    let mut inotify = Inotify::init()?;
    let watches = inotify.watches();
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let mut buffer = vec![0u8; READ_BUFFER];
            loop {
                let batch = inotify.read_events_blocking(&mut buffer).map(|events| {
                    events
                        .map(|e| DirEvent {
                            wd: e.wd.get_watch_descriptor_id(),
                            mask: e.mask,
                            name: e.name.map(ToOwned::to_owned),
                        })
                        .collect::<Vec<_>>()
                });
                let failed = batch.is_err();
                if !sink(batch) || failed {
                    return;
                }
            }
        })?;
    Ok(DirWatches { watches })
}

impl DirWatches {
    /// Watches `dir` (following a symlink to it). A path that is no directory, or none at all,
    /// is an error of kind `NotFound` or `NotADirectory`.
    pub fn add(&mut self, dir: &Path) -> io::Result<Watch> {
        self.watches.add(dir, mask()).map(Watch)
    }

    /// Takes a watch off. One that is already gone (its directory removed) is no error.
    pub fn remove(&mut self, watch: Watch) {
        let _ = self.watches.remove(watch.0);
    }
}

/// One added watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Watch(inotify::WatchDescriptor);

impl Watch {
    /// The number its events carry ([`DirEvent::wd`]).
    pub fn id(&self) -> i32 {
        self.0.get_watch_descriptor_id()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::channel;
    use std::time::Duration;

    /// The events a swap and a write in place make reach the sink, a read makes none, and the
    /// thread ends once the sink says so and the last watch goes.
    #[test]
    fn changes_are_reported_and_reads_are_not() {
        let dir = tempfile::tempdir().unwrap();
        let (tx, rx) = channel();
        let mut watches = start("dir-watch-test", move |batch| tx.send(batch).is_ok()).unwrap();
        let watch = watches.add(dir.path()).unwrap();
        let wait = || {
            rx.recv_timeout(Duration::from_secs(60))
                .expect("an event within a minute")
                .unwrap()
        };
        std::fs::write(dir.path().join("tls.crt"), "x").unwrap();
        let mut seen = Vec::new();
        while !seen
            .iter()
            .any(|e: &DirEvent| e.mask.contains(EventMask::CLOSE_WRITE))
        {
            seen.extend(wait());
        }
        assert!(seen.iter().all(|e| e.wd == watch.id()));
        assert!(seen
            .iter()
            .all(|e| e.name.as_deref() == Some("tls.crt".as_ref())));
        // A read (open, read, close) is not an event; the rename that follows is the next one.
        let _ = std::fs::read(dir.path().join("tls.crt")).unwrap();
        std::fs::rename(dir.path().join("tls.crt"), dir.path().join("..data")).unwrap();
        let next = wait();
        assert!(next[0].mask.contains(EventMask::MOVED_FROM), "{next:?}");
        assert!(watches.add(&dir.path().join("..data")).is_err(), "a file");
        assert!(watches.add(&dir.path().join("absent")).is_err());
        watches.remove(watch);
        let gone = wait();
        assert!(gone.iter().any(DirEvent::watch_gone), "{gone:?}");
    }
}
