//! The rotation benchmark: one workload (AtomicWriter swaps under HTTPS load) put through
//! private-ingress + sozu and, side by side, through peer proxies.
//!
//! Every system is a [`System`]: something that serves [`HOST`] over HTTPS on loopback from the
//! certificate directory it was given (the CSI driver's layout: `tls.crt`/`tls.key` through a
//! `..data` link) and proxies to a loopback [`Backend`]. What a system needs to notice a swap is
//! its own business (the agent's directory watch, envoy's `watched_directory`, a watcher script
//! for haproxy, nginx and Traefik); the workload ([`workload`]) is the same code for all of them: the same
//! certificates, the same [`atomic_write`](crate::live::atomic_write), the same handshake probe
//! and the same load. Dropping a system stops and reaps all its processes, also on a panic.
//!
//! - [`ours`]: private-ingress + sozu, through [`Stack`](crate::live::Stack);
//! - [`envoy`]: file SDS with `watched_directory`, no trigger;
//! - [`haproxy`]: a watcher runs `set ssl cert` + `commit ssl cert` on the admin socket;
//! - [`nginx`]: a watcher runs `nginx -s reload`;
//! - [`traefik`]: a watcher rewrites the dynamic file that names the pair (`tls.certificates`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::live::{atomic_write, free_port, Backend};
use process::Group;

pub mod busy;
pub mod drift;
pub mod envoy;
pub mod floor;
pub mod haproxy;
pub mod hops;
pub mod mass;
pub mod nginx;
pub mod ours;
pub mod process;
pub mod reads;
pub mod report;
pub mod scale;
pub mod top;
pub mod traefik;
pub mod watcher;
pub mod workload;

/// The one host every system serves (SNI and Host header); inside the agent's test zone.
pub const HOST: &str = "app.in.example.org";

/// What every system starts from: the backend to proxy to and the first certificate.
pub struct Start<'a> {
    pub backend: &'a Backend,
    pub first: &'a workload::Pair,
}

/// A running system under test.
pub trait System {
    /// The address its HTTPS listener serves [`HOST`] on.
    fn https(&self) -> SocketAddr;
    /// The AtomicWriter directory of [`HOST`]'s certificate (`..data`, `tls.crt`, `tls.key`).
    fn cert_dir(&self) -> PathBuf;
    /// The tail of its logs, for a failure report.
    fn logs(&self) -> String;
}

/// One contender: how it is named in the table, its version, and how to start it. A system that
/// cannot be installed or started answers `Err(why)` and is reported as skipped.
pub struct Contender {
    pub name: &'static str,
    pub version: fn() -> Result<String, String>,
    pub start: fn(&Start) -> Result<Box<dyn System>, String>,
}

/// Ours first (ratios are to it), then the peers.
pub fn contenders() -> Vec<Contender> {
    vec![
        Contender {
            name: "private-ingress + sozu 2.3.3",
            version: ours::version,
            start: ours::start,
        },
        Contender {
            name: "envoy (file SDS, watched_directory)",
            version: envoy::version,
            start: envoy::start,
        },
        Contender {
            name: "haproxy (runtime API via watcher)",
            version: haproxy::version,
            start: haproxy::start,
        },
        Contender {
            name: "nginx (-s reload via watcher)",
            version: nginx::version,
            start: nginx::start,
        },
        Contender {
            name: "traefik (dynamic file rewritten via watcher)",
            version: traefik::version,
            start: traefik::start,
        },
    ]
}

/// A peer binary named by an environment variable (bench/run-peers sets them), else found on the
/// PATH or in /usr/sbin. `Err` says why it is missing.
pub fn peer_bin(env: &str, name: &str) -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os(env).filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(format!("{env}={} is not a file", path.display()))
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .ok_or_else(|| format!("{name} not installed (run bench/run-peers, or set {env})"))
}

/// Writes `text` to `dir/name` and returns the path.
fn write_file(dir: &Path, name: &str, text: &str) -> Result<PathBuf, String> {
    let path = dir.join(name);
    std::fs::write(&path, text).map_err(|e| format!("write {}: {e}", path.display()))?;
    Ok(path)
}

/// How long a system may take from its start to serving the first certificate.
pub const START_TIMEOUT: Duration = Duration::from_secs(20);

/// A peer proxy: its processes (killed and reaped first on drop), then its directory.
pub struct Peer {
    groups: Vec<Group>,
    https: SocketAddr,
    cert_dir: PathBuf,
    dir: tempfile::TempDir,
    _certs: tempfile::TempDir,
}

/// A fresh directory for certificate directories, on tmpfs (/dev/shm) where there is one: the
/// CSI driver's volume is a tmpfs, and on a disk file system removing the old directory after a
/// swap takes milliseconds (ext4 here), which no system reads but which would slow the writer.
pub fn cert_root() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    let parent = if shm.is_dir() { shm } else { Path::new("/tmp") };
    tempfile::Builder::new()
        .prefix("pi-certs-")
        .tempdir_in(parent)
        .expect("create a certificate directory")
}

impl Peer {
    /// A fresh short directory with `tls/<HOST>/` holding the first pair the AtomicWriter way, and
    /// a free loopback port for the HTTPS listener; no process yet.
    pub fn prepare(start: &Start) -> Peer {
        let dir = crate::short_tempdir();
        let certs = cert_root();
        let cert_dir = certs.path().join(HOST);
        atomic_write(&cert_dir, &start.first.crt, &start.first.key, 0);
        Peer {
            groups: Vec::new(),
            https: SocketAddr::from(([127, 0, 0, 1], free_port())),
            cert_dir,
            dir,
            _certs: certs,
        }
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Starts a process that belongs to this peer; it dies with it.
    pub fn spawn(
        &mut self,
        name: &str,
        cmd: &mut std::process::Command,
    ) -> Result<&mut Group, String> {
        let log = self.dir.path().join(format!("{name}.log"));
        self.groups.push(Group::spawn(cmd, &log)?);
        Ok(self.groups.last_mut().expect("just pushed"))
    }
}

impl System for Peer {
    fn https(&self) -> SocketAddr {
        self.https
    }

    fn cert_dir(&self) -> PathBuf {
        self.cert_dir.clone()
    }

    fn logs(&self) -> String {
        self.groups
            .iter()
            .map(|g| format!("--- {}: {}\n", g.log.display(), g.log_tail(20)))
            .collect()
    }
}
