//! The code that changes sozu and reads its state over its command socket
//! (sozu-command-lib 2.3.3).
//!
//! - [`client`]: one blocking connection; every request has a deadline. sozu answers a mutation
//!   with `PROCESSING` and then `OK` once every worker applied it, or `FAILURE`; a query answers
//!   `OK` with content. Any channel error drops the connection, and the next request reconnects.
//!   It reads sozu's state back in pieces its main process answers alone, each within sozu's
//!   command buffer, and the clusters, frontends and certificates only when sozu's census says
//!   someone else changed them ([`census`]); `listing` turns each answer into the planner's
//!   terms, and `state_file` writes a bulk change for sozu to load.
//! - [`request`]: a planned operation as sozu's request.
//! - [`phases`]: a plan sent phase after phase; [`lanes`]: over several connections.
//! - [`bulk`]: a bulk change (a cold start, a restarted sozu) as state files that sozu loads
//!   itself (`LoadState`) instead of thousands of round trips.
//! - [`generation`]: which sozu answers, and when its state must be read again; [`socket`]:
//!   whether the socket is one the agent has tried, which ends a back-off early.
//! - [`proxy`]: [`Proxy`], what the loop asks of sozu, over all of it; it alone
//!   decides whether a change goes in bulk, and says how each request went ([`Delivered`]).
//!
//! sozu's event stream is read by [`crate::sources::sozu_events`], on a connection of its own:
//! it only listens. Certificate queries on the main state return private keys: they are dropped
//! in [`client`], on receipt; only fingerprints and names leave this module. No key is ever
//! written to a file: [`SozuClient::load_batch`] refuses certificate operations.

pub mod bulk;
pub mod census;
pub mod client;
pub mod generation;
pub mod lanes;
mod listing;
pub mod phases;
pub mod proxy;
pub mod request;
pub mod socket;
mod state_file;

use std::path::PathBuf;
use std::time::Duration;

pub use client::SozuClient;
pub use generation::Generation;
pub use proxy::Proxy;

use crate::plan::Outcome;
pub use proxy::SozuProxy;

/// Who may answer on sozu's socket: the agent's own user, or the one `--sozu-uid` names. A
/// process of any other user that holds the path (a directory writable by others, a race at
/// start) would be sent private keys; the peer's credentials (`SO_PEERCRED`) are checked on
/// every connection before anything is sent.
#[derive(Debug, Clone, Copy, Default)]
pub struct SozuPeer {
    /// sozu's user, when it is not the agent's.
    pub uid: Option<u32>,
}

impl SozuPeer {
    /// Checks the process at the other end of `socket`.
    pub fn check(&self, socket: impl std::os::fd::AsFd) -> Result<(), String> {
        use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
        let peer = getsockopt(&socket, PeerCredentials)
            .map_err(|e| format!("cannot read the peer's credentials: {e}"))?;
        allowed(
            peer.uid(),
            peer.pid(),
            nix::unistd::geteuid().as_raw(),
            self.uid,
        )
    }
}

/// Pure: whether a peer of `uid` (process `pid`) may be talked to by an agent of `me`.
fn allowed(uid: u32, pid: i32, me: u32, configured: Option<u32>) -> Result<(), String> {
    if uid == me || configured == Some(uid) {
        return Ok(());
    }
    Err(format!(
        "the socket is held by uid {uid} (pid {pid}), neither this agent's uid {me} nor \
         --sozu-uid{}; nothing is sent to it",
        configured.map(|u| format!(" {u}")).unwrap_or_default()
    ))
}

/// What became of a plan sent to sozu, and how it went: sozu reports a request it received
/// (twice: accepted, then applied), and a state file it loaded once, whatever the file holds.
/// The loop tells its own changes from someone else's by that, so it is told, not guessed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Delivered {
    /// Each operation's outcome, in plan order.
    pub outcomes: Vec<Outcome>,
    /// Each operation went inside a state file (true) or as a request of its own.
    pub in_file: Vec<bool>,
    /// State files sozu was asked to load.
    pub files: usize,
}

impl Delivered {
    /// Every operation sent as a request of its own.
    pub fn one_by_one(outcomes: Vec<Outcome>) -> Delivered {
        Delivered {
            in_file: vec![false; outcomes.len()],
            outcomes,
            files: 0,
        }
    }
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum SozuError {
    #[error("cannot connect to sozu at {}: {reason}", path.display())]
    Connect { path: PathBuf, reason: String },
    #[error("sozu connection lost during `{request}`: {reason}")]
    Channel { request: String, reason: String },
    /// sozu closed the connection where an answer was due: what its main process does with an
    /// answer larger than its `max_command_buffer_size`, or sozu going away.
    #[error("sozu closed the connection instead of answering `{request}`: {reason}")]
    Closed { request: String, reason: String },
    #[error("sozu did not answer `{request}` within {} ms", timeout.as_millis())]
    Timeout { request: String, timeout: Duration },
    #[error("sozu refused `{request}`: {message}")]
    Refused { request: String, message: String },
    #[error("sozu answered `{request}` with unexpected content")]
    Unexpected { request: String },
    #[error("cannot write the bulk state file in {}: {reason}", dir.display())]
    BatchFile { dir: PathBuf, reason: String },
    #[error("sozu loaded the bulk state only in part: {message}")]
    BatchIncomplete { message: String },
    #[error("the sozu client task failed: {reason}")]
    Task { reason: String },
}

/// sozu-command-lib's channel error in words: its own message shows a failed connection's cause
/// in Rust's debug notation (`Some(Os { code: 2, .. })`) and drops a read's or a write's.
pub fn channel_reason(error: &sozu_command_lib::channel::ChannelError) -> String {
    use sozu_command_lib::channel::ChannelError;
    match error {
        ChannelError::Connection(Some(e)) => e.to_string(),
        ChannelError::Connection(None) => "the connection failed".into(),
        ChannelError::Read(e) => format!("cannot read: {e}"),
        ChannelError::Write(e) => format!("cannot write: {e}"),
        ChannelError::TimeoutReached(after) => {
            format!("no answer within {} ms", after.as_millis())
        }
        other => other.to_string(),
    }
}

impl SozuError {
    /// sozu answered `request` with content of another kind than asked for.
    pub(crate) fn unexpected(request: &str) -> SozuError {
        SozuError::Unexpected {
            request: request.into(),
        }
    }

    /// A refusal leaves the connection usable; every other error means reconnecting.
    pub fn is_refusal(&self) -> bool {
        matches!(self, SozuError::Refused { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_agents_user_or_the_configured_one_may_answer() {
        assert!(allowed(1000, 7, 1000, None).is_ok());
        assert!(allowed(999, 7, 0, Some(999)).is_ok());
        let refused = allowed(65534, 42, 1000, None).unwrap_err();
        assert!(refused.contains("uid 65534 (pid 42)"), "{refused}");
        assert!(allowed(65534, 42, 1000, Some(999)).is_err());
        // A socket of our own passes the real check.
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        assert!(SozuPeer::default().check(&a).is_ok());
    }
}
