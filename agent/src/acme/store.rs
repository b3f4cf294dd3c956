//! The ACME state directory (`acme.state_dir`): what must survive a restart so that a restarted
//! agent neither creates a second account nor orders a certificate it already has.
//!
//! ```text
//! <state_dir>/lock                       held (flock) for the agent's life: one agent per directory
//! <state_dir>/accounts/<directory>.json  the account's credentials (its private key), per CA
//! <state_dir>/hosts/<host>.json          the host's certificate and key, renewal schedule, rate
//!                                        limit ledger, back-off, and the order in flight
//! ```
//!
//! Every file is written to a temporary file in the same directory with mode 0600, synced, and
//! renamed over the old one, so a crash leaves the old version or the new one, never half of one.
//! Directories are 0700. The key material in these files never leaves them but to
//! `<tls_dir>/<host>/tls.key`.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use sha2::Digest;

use super::renewal_policy::{Basis, Ledger};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(
        "the ACME state directory {} is not private: {reason} (it holds the account's key and \
         every certificate's; give the agent a directory of its own)",
        dir.display()
    )]
    NotPrivate { dir: PathBuf, reason: String },
    #[error(
        "the ACME state directory {} is in use by another agent (its lock is held); two agents \
         sharing it would order the same certificates twice",
        dir.display()
    )]
    Locked { dir: PathBuf },
    #[error("ACME state {}: {reason}", path.display())]
    Io { path: PathBuf, reason: String },
    #[error("ACME state {}: unreadable ({reason}); move it away to start that host afresh", path.display())]
    Corrupt { path: PathBuf, reason: String },
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> StoreError + '_ {
    move |e| StoreError::Io {
        path: path.to_owned(),
        reason: e.to_string(),
    }
}

/// The state directory, locked for as long as this value lives.
pub struct Store {
    dir: PathBuf,
    /// Holds the exclusive lock; released when dropped (or when the process ends).
    _lock: nix::fcntl::Flock<File>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("dir", &self.dir).finish()
    }
}

/// A host's certificate and key as issued, with what is known about its renewal.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Issued {
    /// The chain, leaf first, as the CA sent it.
    pub chain_pem: String,
    /// The private key, PKCS#8 PEM; wiped from memory when dropped.
    pub key_pem: zeroize::Zeroizing<String>,
    pub fingerprint: String,
    pub not_before: i64,
    pub not_after: i64,
    /// The directory URL of the CA that issued it.
    pub directory: String,
    /// When it is to be renewed, and on what basis (fixed per certificate, with its jitter).
    pub renew_at: i64,
    pub basis: Basis,
    /// The ARI window last received, if any.
    pub ari_window: Option<(i64, i64)>,
    /// When to ask the CA for renewal information again (its Retry-After).
    pub ari_next_poll: Option<i64>,
}

/// Key material stays out of `{:?}`: a debug log of a record must not leak it.
impl std::fmt::Debug for Issued {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Issued")
            .field("fingerprint", &self.fingerprint)
            .field("not_before", &self.not_before)
            .field("not_after", &self.not_after)
            .field("directory", &self.directory)
            .field("renew_at", &self.renew_at)
            .field("basis", &self.basis)
            .finish_non_exhaustive()
    }
}

/// An order placed and not finished: resumed after a restart instead of placing another.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingOrder {
    pub url: String,
    pub directory: String,
    /// The key the CSR is made from, generated before the order is finalised so that an order
    /// the CA completes while the agent is down is still usable. Wiped from memory when dropped.
    pub key_pem: zeroize::Zeroizing<String>,
    pub placed_at: i64,
}

impl std::fmt::Debug for PendingOrder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingOrder")
            .field("url", &self.url)
            .field("placed_at", &self.placed_at)
            .finish_non_exhaustive()
    }
}

/// Everything kept about one host.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostRecord {
    pub issued: Option<Issued>,
    pub pending: Option<PendingOrder>,
    #[serde(default)]
    pub ledger: Ledger,
    /// Consecutive failed attempts since the last success.
    #[serde(default)]
    pub failures: u32,
    /// No attempt before this (Unix seconds), and why.
    pub backoff_until: Option<i64>,
    pub backoff_reason: Option<String>,
}

impl Store {
    /// Creates the directory if needed (0700) and takes its lock, or fails at once if another
    /// process holds it.
    pub fn open(dir: &Path) -> Result<Store, StoreError> {
        for sub in ["", "accounts", "hosts"] {
            let path = dir.join(sub);
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&path)
                .map_err(io(&path))?;
            // A directory that existed (a volume's mount point) keeps its mode otherwise.
            let _ = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o700));
            check_private(&path, sub.is_empty())?;
        }
        let lock_path = dir.join("lock");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&lock_path)
            .map_err(io(&lock_path))?;
        let lock = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock)
            .map_err(|(_, errno)| match errno {
                nix::errno::Errno::EWOULDBLOCK => StoreError::Locked {
                    dir: dir.to_owned(),
                },
                other => StoreError::Io {
                    path: lock_path.clone(),
                    reason: other.desc().to_owned(),
                },
            })?;
        Ok(Store {
            dir: dir.to_owned(),
            _lock: lock,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where the account of the CA at `directory` is kept: one file per CA, so that switching
    /// between staging and production keeps both accounts.
    fn account_path(&self, directory: &str) -> PathBuf {
        let digest = sha2::Sha256::digest(directory.as_bytes());
        let short: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
        self.dir.join("accounts").join(format!("{short}.json"))
    }

    pub fn load_account<T: DeserializeOwned>(
        &self,
        directory: &str,
    ) -> Result<Option<T>, StoreError> {
        read_json(&self.account_path(directory))
    }

    pub fn save_account<T: Serialize>(
        &self,
        directory: &str,
        account: &T,
    ) -> Result<(), StoreError> {
        write_json(&self.account_path(directory), account)
    }

    /// Forgets the account of the CA at `directory` (the CA no longer knows it): the next one
    /// is created afresh.
    pub fn forget_account(&self, directory: &str) -> Result<(), StoreError> {
        let path = self.account_path(directory);
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io(&path)(e)),
            _ => Ok(()),
        }
    }

    fn host_path(&self, host: &str) -> PathBuf {
        self.dir.join("hosts").join(format!("{host}.json"))
    }

    pub fn load_host(&self, host: &str) -> Result<HostRecord, StoreError> {
        Ok(read_json(&self.host_path(host))?.unwrap_or_default())
    }

    pub fn save_host(&self, host: &str, record: &HostRecord) -> Result<(), StoreError> {
        write_json(&self.host_path(host), record)
    }
}

/// Runs store I/O (reads, fsyncs) on tokio's blocking pool, off the async workers.
pub async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| StoreError::Io {
            path: PathBuf::from("the ACME state directory"),
            reason: format!("the I/O task failed: {e}"),
        })?
}

/// The state directory must be the agent's alone. Its `accounts/` and `hosts/` (made by the agent)
/// must be owned by the agent's user and closed to everyone else. The directory itself may be a
/// volume's mount point, owned by root and writable by a group (a Kubernetes `fsGroup`), but
/// never by anyone: another user could then swap the agent's files for their own.
fn check_private(path: &Path, top: bool) -> Result<(), StoreError> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).map_err(io(path))?;
    let me = nix::unistd::geteuid().as_raw();
    let mode = meta.mode() & 0o777;
    let refuse = |reason: String| {
        Err(StoreError::NotPrivate {
            dir: path.to_owned(),
            reason,
        })
    };
    if top {
        if meta.uid() != me && meta.uid() != 0 {
            return refuse(format!(
                "it is owned by uid {}, not this agent's uid {me}",
                meta.uid()
            ));
        }
        if mode & 0o002 != 0 {
            return refuse(format!("anyone may write to it (mode {mode:o})"));
        }
    } else {
        if meta.uid() != me {
            return refuse(format!(
                "it is owned by uid {}, not this agent's uid {me}",
                meta.uid()
            ));
        }
        if mode & 0o077 != 0 {
            return refuse(format!("others may read or enter it (mode {mode:o})"));
        }
    }
    Ok(())
}

fn read_json<T: DeserializeOwned>(path: &Path) -> Result<Option<T>, StoreError> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(path)(e)),
    };
    // serde_json's message names a position and what was expected, never the text itself.
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| StoreError::Corrupt {
            path: path.to_owned(),
            reason: format!(
                "line {}, column {}: {}",
                e.line(),
                e.column(),
                json_failure(&e)
            ),
        })
}

/// What went wrong with a JSON document, in words. serde_json's own message can quote the
/// document, which here may hold key material: only its category is said.
pub fn json_failure(error: &serde_json::Error) -> &'static str {
    match error.classify() {
        serde_json::error::Category::Io => "it cannot be read or written",
        serde_json::error::Category::Syntax => "it is not valid JSON",
        serde_json::error::Category::Data => "it does not have the expected fields",
        serde_json::error::Category::Eof => "it ends early",
    }
}

fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<(), StoreError> {
    let bytes = serde_json::to_vec_pretty(value).map_err(|e| StoreError::Io {
        path: path.to_owned(),
        reason: format!("cannot serialise: {}", json_failure(&e)),
    })?;
    write_private(path, &bytes)
}

/// Writes `bytes` to `path` atomically with mode 0600: a temporary file beside it, synced,
/// renamed over it, and the directory synced.
pub fn write_private(path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let fail = io(path);
    let mut tmp = tempfile::Builder::new()
        .prefix(".tmp-")
        .permissions(std::fs::Permissions::from_mode(0o600))
        .tempfile_in(dir)
        .map_err(&fail)?;
    tmp.write_all(bytes).map_err(&fail)?;
    tmp.as_file().sync_all().map_err(&fail)?;
    tmp.persist(path).map_err(|e| fail(e.error))?;
    File::open(dir).and_then(|d| d.sync_all()).map_err(fail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_store_on_the_same_directory_is_refused_until_the_first_goes() {
        let dir = tempfile::tempdir().unwrap();
        let first = Store::open(dir.path()).unwrap();
        let err = Store::open(dir.path()).unwrap_err();
        assert!(matches!(err, StoreError::Locked { .. }), "{err}");
        assert!(err.to_string().contains("in use by another agent"), "{err}");
        drop(first);
        Store::open(dir.path()).unwrap();
    }

    #[test]
    fn records_round_trip_with_mode_0600_and_no_leftover_files() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let mut record = HostRecord::default();
        record.ledger.record_issued(1_800_000_000);
        record.failures = 2;
        store.save_host("a.in.example.org", &record).unwrap();
        store.save_host("a.in.example.org", &record).unwrap();
        assert_eq!(store.load_host("a.in.example.org").unwrap(), record);
        assert_eq!(
            store.load_host("b.in.example.org").unwrap(),
            HostRecord::default()
        );
        let hosts: Vec<_> = std::fs::read_dir(dir.path().join("hosts"))
            .unwrap()
            .map(|e| e.unwrap())
            .collect();
        assert_eq!(hosts.len(), 1, "a temporary file was left behind");
        let mode = hosts[0].metadata().unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let mode = std::fs::metadata(dir.path()).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
    }

    #[test]
    fn debug_output_of_a_record_holds_no_key() {
        let issued = Issued {
            chain_pem: "-----BEGIN CERTIFICATE-----\nchain\n".into(),
            key_pem: String::from("-----BEGIN PRIVATE KEY-----\nsecret-bytes\n").into(),
            fingerprint: "ab".into(),
            not_before: 0,
            not_after: 1,
            directory: "https://ca/dir".into(),
            renew_at: 1,
            basis: Basis::Lifetime,
            ari_window: None,
            ari_next_poll: None,
        };
        let record = HostRecord {
            issued: Some(issued),
            pending: Some(PendingOrder {
                url: "https://ca/order/1".into(),
                directory: "https://ca/dir".into(),
                key_pem: String::from("-----BEGIN PRIVATE KEY-----\nother-secret\n").into(),
                placed_at: 0,
            }),
            ..HostRecord::default()
        };
        let text = format!("{record:?}");
        assert!(
            !text.contains("secret") && !text.contains("PRIVATE KEY"),
            "{text}"
        );
    }

    #[test]
    fn a_corrupt_record_is_reported_without_its_content() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        std::fs::write(
            dir.path().join("hosts/a.json"),
            "{\"issued\": \"secret-bytes",
        )
        .unwrap();
        let err = store.load_host("a").unwrap_err().to_string();
        assert!(
            err.contains("unreadable") && !err.contains("secret-bytes"),
            "{err}"
        );
    }

    /// The directory must be the agent's alone: world-writable, or a sub-directory others may
    /// enter, is refused with why; what `open` makes is accepted.
    #[test]
    fn a_state_directory_others_can_write_or_read_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let top = dir.path().join("state");
        std::fs::create_dir(&top).unwrap();
        std::fs::set_permissions(&top, std::fs::Permissions::from_mode(0o777)).unwrap();
        let refused = check_private(&top, true).unwrap_err().to_string();
        assert!(
            refused.contains("anyone may write to it (mode 777)"),
            "{refused}"
        );
        std::fs::set_permissions(&top, std::fs::Permissions::from_mode(0o2775)).unwrap();
        assert!(
            check_private(&top, true).is_ok(),
            "a group-writable mount point"
        );
        let hosts = top.join("hosts");
        std::fs::create_dir(&hosts).unwrap();
        std::fs::set_permissions(&hosts, std::fs::Permissions::from_mode(0o755)).unwrap();
        let refused = check_private(&hosts, false).unwrap_err().to_string();
        assert!(refused.contains("others may read or enter it"), "{refused}");
        // `open` closes what it owns, and then accepts it.
        let store = Store::open(&top).unwrap();
        let mode = std::fs::metadata(&hosts).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        drop(store);
    }
}
