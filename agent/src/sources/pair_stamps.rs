//! What each host's pair files looked like when they were last read and found good, so that
//! reading every pair again (a resync) reads only the pairs whose files changed.
//!
//! A resync's reread is a backstop for changes the watches missed. At 10,000 routes reading and
//! checking every pair again was about 0.4 s of CPU every resync (some 40 µs a pair) and 10,000
//! certificates handed to the loop, on the two cores sozu's handshakes need. Looking at the files
//! is a few microseconds a pair: a pair is read again when either file's device, inode, size,
//! modification or change time differs from its last good read (a rename, a `..data` swap, an
//! in-place write, a `touch`), or when its certificate's validity may have ended since.
//!
//! A file's times have the kernel's clock tick as their grain, so a write within the same tick
//! as the read that stamped it could leave the same stamp with other bytes. A stamp is kept only
//! when both files were last changed a full second or more before the read began (as git does for
//! its "racily clean" entries); a pair written just before its read is read again next time.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

/// One file as the file system describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct FileStamp {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

/// Both files of a pair, looked at through the same links a read follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Look([FileStamp; 2]);

impl Look {
    /// The pair's files in `dir` as they are now; `None` when either cannot be looked at (it is
    /// then read, and its error shown).
    pub fn of(dir: &Path) -> Option<Look> {
        let stamp = |name: &str| {
            let meta = std::fs::metadata(dir.join(name)).ok()?;
            Some(FileStamp {
                dev: meta.dev(),
                ino: meta.ino(),
                len: meta.len(),
                mtime: (meta.mtime(), meta.mtime_nsec()),
                ctime: (meta.ctime(), meta.ctime_nsec()),
            })
        };
        Some(Look([stamp("tls.crt")?, stamp("tls.key")?]))
    }

    /// Whether both files were last changed at least a second before `read_began` (seconds
    /// since the epoch): only then can a read that began then be trusted to have seen their
    /// last bytes.
    fn settled_before(&self, read_began: i64) -> bool {
        self.0.iter().all(|f| f.ctime.0 < read_began - 1)
    }
}

/// The last good read of each host's pair: how its files looked just before, and until when its
/// certificate is valid.
#[derive(Debug, Default)]
pub struct PairStamps {
    good: HashMap<String, (Look, i64)>,
}

impl PairStamps {
    /// Whether `host`'s pair, whose files look like `look` now, is as its last good read found
    /// it, and still valid at `now`: a reread can leave it.
    pub fn unchanged(&self, host: &str, look: Option<&Look>, now: i64) -> bool {
        match (self.good.get(host), look) {
            (Some((last, valid_until)), Some(look)) => last == look && now < *valid_until,
            _ => false,
        }
    }

    /// Notes a read of `host`'s pair: `look` is how its files looked just before the read
    /// began, at `read_began` (seconds since the epoch); `valid_until` the certificate's end of
    /// validity when the read found it good, `None` when it did not.
    pub fn note(
        &mut self,
        host: &str,
        look: Option<Look>,
        read_began: i64,
        valid_until: Option<i64>,
    ) {
        match (look, valid_until) {
            (Some(look), Some(valid_until)) if look.settled_before(read_began) => {
                self.good.insert(host.to_owned(), (look, valid_until));
            }
            _ => {
                self.good.remove(host);
            }
        }
    }

    /// Forgets `host`'s last read: it left the workspace.
    pub fn forget(&mut self, host: &str) {
        self.good.remove(host);
    }

    /// Forgets every read: the pairs now live in another directory.
    pub fn clear(&mut self) {
        self.good.clear();
    }

    /// How many hosts' last reads are kept.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.good.len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.good.is_empty()
    }
}

/// Seconds since the epoch by the system's clock, the one file times are written with.
pub fn wall_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, crt: &str, key: &str) {
        std::fs::write(dir.join("tls.crt"), crt).unwrap();
        std::fs::write(dir.join("tls.key"), key).unwrap();
    }

    #[test]
    fn a_pair_is_left_only_while_its_files_and_validity_are_as_last_read() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "crt", "key");
        let mut stamps = PairStamps::default();
        let look = Look::of(dir.path());
        // Read well after the files were written (a read that began 10 s later).
        let later = wall_now() + 10;
        stamps.note("a", look, later, Some(later + 100));
        assert!(stamps.unchanged("a", Look::of(dir.path()).as_ref(), later));
        // Its certificate expired: read again.
        assert!(!stamps.unchanged("a", Look::of(dir.path()).as_ref(), later + 100));
        // A file rewritten in place.
        write(dir.path(), "crt and more", "key");
        assert!(!stamps.unchanged("a", Look::of(dir.path()).as_ref(), later));
        // Replaced by a rename: another inode.
        std::fs::write(dir.path().join("new.crt"), "crt").unwrap();
        std::fs::rename(dir.path().join("new.crt"), dir.path().join("tls.crt")).unwrap();
        assert!(!stamps.unchanged("a", Look::of(dir.path()).as_ref(), later));
        // Gone: read, so its error shows.
        std::fs::remove_file(dir.path().join("tls.key")).unwrap();
        assert!(!stamps.unchanged("a", Look::of(dir.path()).as_ref(), later));
        // Another host was never read good.
        assert!(!stamps.unchanged("b", look.as_ref(), later));
    }

    #[test]
    fn a_pair_written_just_before_its_read_or_refused_is_read_again() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "crt", "key");
        let mut stamps = PairStamps::default();
        let look = Look::of(dir.path());
        let now = wall_now();
        // Written within the second before the read began: its bytes may not be the last.
        stamps.note("a", look, now, Some(now + 100));
        assert!(!stamps.unchanged("a", look.as_ref(), now));
        // Refused: always read again (a half-written pair, one not valid yet).
        stamps.note("a", look, now + 10, None);
        assert!(!stamps.unchanged("a", look.as_ref(), now + 10));
        // Forgotten with its host.
        stamps.note("a", look, now + 10, Some(now + 100));
        assert!(stamps.unchanged("a", look.as_ref(), now + 10));
        stamps.forget("a");
        assert!(!stamps.unchanged("a", look.as_ref(), now + 10));
    }
}
