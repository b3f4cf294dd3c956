//! Which socket the agent last connected to, or tried to: what ends a back-off as soon as a sozu
//! listens again.
//!
//! A restarted sozu removes its socket and binds a new one. The socket's directory is watched
//! ([`crate::sources::sozu_socket`]), and a new socket ends the loop's wait at once; but when sozu
//! is restarted several times within a second, the last new socket can appear before the agent
//! has seen its connection to the previous sozu break. The loop then starts its wait after the
//! last event it will get, and without this a sozu already listening would serve no route until
//! the back-off ended (9.5 s was seen). So the loop asks, at a short period during a wait (the
//! back-off's, kept with its other numbers in the loop), whether the socket at the path is one
//! it has not tried yet (a `stat`: microseconds), or, after a refused connection, whether a
//! connection is now taken.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// What tells one socket file from its replacement at the same path: a new inode, or the same
/// inode number reused with a new change time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SocketIdentity {
    dev: u64,
    ino: u64,
    ctime: i64,
    ctime_nsec: i64,
}

impl SocketIdentity {
    /// The socket at `path` now; `None` when there is none.
    pub fn of(path: &Path) -> Option<SocketIdentity> {
        let meta = std::fs::metadata(path).ok()?;
        Some(SocketIdentity {
            dev: meta.dev(),
            ino: meta.ino(),
            ctime: meta.ctime(),
            ctime_nsec: meta.ctime_nsec(),
        })
    }
}

/// The socket the last connection was made or tried to, and how that went.
#[derive(Debug, Clone)]
pub struct SocketWatch {
    path: PathBuf,
    /// The socket at the path when the last connection was made or tried.
    tried: Option<SocketIdentity>,
    /// The last try could not connect.
    refused: bool,
    /// A socket whose connection the probe found taken after a refusal: one early retry per
    /// socket, so that a socket that takes connections and then fails (another user's, say)
    /// does not turn the back-off into a retry at each of its looks at the socket.
    probed: Option<SocketIdentity>,
}

impl SocketWatch {
    pub fn new(path: &Path) -> SocketWatch {
        SocketWatch {
            path: path.to_owned(),
            tried: None,
            refused: false,
            probed: None,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Before a connection is tried: the socket it goes to.
    pub fn trying(&mut self) -> Option<SocketIdentity> {
        SocketIdentity::of(&self.path)
    }

    /// A connection was made (`refused` false) or could not be (`refused` true) to `socket`.
    pub fn tried(&mut self, socket: Option<SocketIdentity>, refused: bool) {
        self.tried = socket;
        self.refused = refused;
        if !refused {
            self.probed = None;
        }
    }

    /// Whether a wait should end now, given the socket at the path (`now`) and, only asked
    /// after a refusal, whether a connection to it is taken. Pure but for `connects`.
    pub fn listening_again(
        &mut self,
        now: Option<SocketIdentity>,
        connects: impl FnOnce() -> bool,
    ) -> bool {
        let Some(now) = now else {
            return false;
        };
        if Some(now) != self.tried {
            return true;
        }
        if self.refused && self.probed != Some(now) && connects() {
            self.probed = Some(now);
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(ino: u64) -> Option<SocketIdentity> {
        Some(SocketIdentity {
            dev: 1,
            ino,
            ctime: 0,
            ctime_nsec: 0,
        })
    }

    #[test]
    fn a_socket_not_tried_yet_ends_the_wait() {
        let mut watch = SocketWatch::new(Path::new("/run/sozu.sock"));
        watch.tried(id(7), false);
        // The connection to socket 7 broke; sozu came back as socket 8 before the agent saw it.
        assert!(watch.listening_again(id(8), || panic!("no connect needed")));
        // No socket at all: nothing to try.
        assert!(!watch.listening_again(None, || true));
        // The same socket whose connection broke is not a new sozu.
        assert!(!watch.listening_again(id(7), || true));
    }

    #[test]
    fn after_a_refusal_a_taken_connection_ends_the_wait_once_per_socket() {
        let mut watch = SocketWatch::new(Path::new("/run/sozu.sock"));
        // Bound but not listening yet: refused.
        watch.tried(id(9), true);
        assert!(!watch.listening_again(id(9), || false));
        assert!(watch.listening_again(id(9), || true));
        // The retry failed again on the same socket: the back-off runs its course.
        watch.tried(id(9), true);
        assert!(!watch.listening_again(id(9), || true));
        // A connection made forgets the probe.
        watch.tried(id(9), false);
        watch.tried(id(9), true);
        assert!(watch.listening_again(id(9), || true));
    }

    #[test]
    fn a_replaced_file_is_a_new_socket() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("sozu.sock");
        assert_eq!(SocketIdentity::of(&path), None);
        let first = std::os::unix::net::UnixListener::bind(&path).expect("bind");
        let before = SocketIdentity::of(&path);
        drop(first);
        std::fs::remove_file(&path).expect("remove");
        let _second = std::os::unix::net::UnixListener::bind(&path).expect("bind again");
        assert!(before.is_some());
        assert_ne!(SocketIdentity::of(&path), before);
    }
}
