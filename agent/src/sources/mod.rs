//! Sources: the slow inputs, each in a task of its own, publishing facts for the loop.
//!
//! A reconcile pass never waits on DNS, a file or an evaluation: each of those runs here, outside
//! the pass, and what it learns reaches the loop as a [`Fact`], the latest word on one subject.
//! The loop keeps the latest facts and decides; a source never touches sozu.
//!
//! | source | watches | publishes |
//! |---|---|---|
//! | [`workspace`] | the workspace's directory | the evaluated workspace joined with the [`traefik`] routes, or why it was rejected; the last good one on a watch channel the other sources follow |
//! | [`traefik`] (run by [`workspace`]) | the `traefik` record's directory or file, and its endpoint every `poll_interval` | the routes translated from each file's and the endpoint's last good document, and each one's state |
//! | [`dns`] | the workspace's upstream names, each on its own schedule (the answer's TTL, within bounds) | a name's addresses and its latest failure, when either changes |
//! | [`tlsdir`] (a [`CertSource`]) | `<tls dir>/<host>/` of each route host, and the directories of the workspace's `certificates` ([`listed_pairs`]) | each host's pair, read and validated: a pair of `certificates` that covers the host, else its own; a resync reads again only the pairs whose files changed ([`pair_stamps`]) |
//! | [`sozu_socket`] | sozu's socket | that it was created or removed: sozu may have restarted |
//! | [`sozu_events`] | sozu's event stream (`SubscribeEvents`) | backends up and down, drains ended, configuration changes by whoever; a broken stream |
//! | [`client_auth`] (a [`watched_files`] set) | the directories of `listeners.client_auth`'s CA and CRLs | what they hold, or why each is refused |
//! | [`route_policy_files`] (a [`watched_files`] set) | the directories of the route policies' users files and error pages | what they hold, or why each is refused ([`route_policy_files::parse`] checks them) |

pub mod client_auth;
pub mod dir_watch;
pub mod dns;
pub mod listed_pairs;
pub mod pair_stamps;
pub mod resolver;
pub mod route_policy_files;
pub mod sozu_events;
pub mod sozu_socket;
pub mod tlsdir;
pub mod traefik;
pub mod watched_files;
pub mod watcher;
pub mod workspace;

use std::net::IpAddr;
use std::sync::Arc;

use crate::certs::CertError;
use crate::plan::state::Certificate;
use crate::workspace::Workspace;

/// The latest good workspace, for the sources that follow it (DNS names, certificate hosts). An
/// edit that fails leaves the last good one here.
pub type WorkspaceWatch = tokio::sync::watch::Receiver<Option<Arc<Workspace>>>;

/// Hands the current workspace, then each new one, to a source that runs on a thread of its
/// own, through `send`, until `send` says the thread is gone: the task that does it.
fn forward_workspaces(
    mut workspace: WorkspaceWatch,
    send: impl Fn(Option<Arc<Workspace>>) -> bool + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    send(workspace.borrow_and_update().clone());
    tokio::spawn(async move {
        while workspace.changed().await.is_ok() {
            if !send(workspace.borrow_and_update().clone()) {
                return;
            }
        }
    })
}

/// Starts a source's thread, named `name`, holding `guard` for its life (a supervisor learns of
/// its end when the guard drops).
fn spawn_thread(
    name: &str,
    guard: impl Send + 'static,
    run: impl FnOnce() + Send + 'static,
) -> Result<(), WatchError> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let _guard = guard;
            run()
        })
        .map(drop)
        .map_err(|e| WatchError {
            path: std::path::PathBuf::new(),
            error: notify::Error::io(e),
        })
}

/// What a source tells the loop.
#[derive(Debug, Clone)]
pub enum Fact {
    /// The workspace was evaluated: the model, or why it was rejected (the diagnostic).
    Workspace(Result<Arc<Workspace>, String>),
    /// The workspace was evaluated, and what it changes worked out beside the loop
    /// ([`crate::plan::edit`]): what the workspace source sends.
    Edit(Box<crate::plan::edit::Edit>),
    /// A DNS name's answer or failure changed.
    Dns(NameFact),
    /// Certificate pairs read and validated, by host.
    Pairs(Vec<(String, Result<Certificate, CertError>)>),
    /// sozu's socket was created or removed: sozu may have restarted.
    SozuSocket,
    /// What sozu's event stream said.
    Sozu(sozu_events::SozuEvent),
    /// The CA and CRL files of `listeners.client_auth` were read again and say something new.
    ClientAuth(Box<client_auth::ClientAuthFiles>),
    /// The basic-auth users files and error pages were read again and say something new.
    PolicyFiles(Box<route_policy_files::PolicyFileReads>),
    /// A file watcher's queue overflowed and events were lost; its source has read everything
    /// again.
    WatchOverflow,
}

/// One upstream name as its source sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NameFact {
    pub name: String,
    /// The addresses in use: the last good answer, kept when a later lookup fails. `None` until
    /// the name has resolved once.
    pub addresses: Option<Arc<[IpAddr]>>,
    /// Why the latest lookup failed; `None` when it succeeded.
    pub error: Option<String>,
}

/// A source that could not start: no watcher, or none on `path` (empty when the watcher itself
/// could not be made).
#[derive(Debug, thiserror::Error)]
#[error("{}", watch_message(path, error))]
pub struct WatchError {
    pub path: std::path::PathBuf,
    pub error: notify::Error,
}

fn watch_message(path: &std::path::Path, error: &notify::Error) -> String {
    // notify's own message adds the paths in Rust's debug notation; the path is said here.
    let reason = match &error.kind {
        notify::ErrorKind::Io(e) => e.to_string(),
        notify::ErrorKind::PathNotFound => "no such file or directory".into(),
        notify::ErrorKind::Generic(text) => text.clone(),
        notify::ErrorKind::WatchNotFound => "it is not watched".into(),
        notify::ErrorKind::InvalidConfig(_) => "the watcher's configuration is invalid".into(),
        notify::ErrorKind::MaxFilesWatch => {
            "the system's limit of watches is reached (fs.inotify.max_user_watches)".into()
        }
    };
    if path.as_os_str().is_empty() {
        format!("cannot start a file watcher: {reason}")
    } else {
        format!("cannot watch {}: {reason}", path.display())
    }
}

/// Where certificate pairs come from. A source publishes [`Fact::Pairs`] for the route hosts of
/// the latest workspace: at start, whenever a pair may have changed, and when asked to read
/// everything again. Each pair arrives validated ([`crate::certs::parse`]); which one serves,
/// and when it goes to sozu, is the loop's decision.
///
/// The tls dir watcher ([`tlsdir::TlsDir`]) is the one source of pairs (the workspace's
/// `certificates` too, [`listed_pairs`]): the ACME issuer
/// ([`crate::acme`]) does not publish pairs itself, it writes them into the tls dir the way
/// cert-manager does and tells the watcher which host it wrote, so that every pair reaches the
/// loop through the same reading and validation; the loop is generic over this trait for its
/// tests' sake.
pub trait CertSource: Send + Sync + 'static {
    /// Reads every pair again (a periodic resync), as if each had changed.
    fn reread(&self);
}
