//! HAProxy with the certificate from the directory (`crt .../tls.crt`, key found as `tls.key`)
//! and the [watcher](super::watcher) replacing it through the runtime API after each swap:
//! `set ssl cert <crt> <<` with the new pair as payload, then `commit ssl cert <crt>`, each
//! through socat on the admin socket, as HAProxy's documentation shows. One thread (`nbthread 1`).

use std::process::Command;

use super::process::version_line;
use super::{peer_bin, watcher, write_file, Peer, Start, System};

fn bin() -> Result<std::path::PathBuf, String> {
    peer_bin("BENCH_HAPROXY", "haproxy")
}

pub fn version() -> Result<String, String> {
    let line = version_line(Command::new(bin()?).arg("-v"), "version")?;
    // "HAProxy version 2.6.12-1+deb12u4 2026/10/17 - https://haproxy.org/"
    Ok(line
        .split_whitespace()
        .nth(2)
        .map(|v| format!("haproxy {v}"))
        .unwrap_or(line))
}

/// Replaces the certificate from the files `..data` now points at, then commits the transaction.
/// An empty line ends a payload; the PEM files have none.
const RELOAD: &str = r#"  crt="$cert_dir/tls.crt"
  { printf 'set ssl cert %s <<\n' "$crt"; cat "$cert_dir/..data/tls.crt" "$cert_dir/..data/tls.key"; echo; } \
    | "$SOCAT" -t 5 - "UNIX-CONNECT:$ADMIN_SOCKET"
  echo "commit ssl cert $crt" | "$SOCAT" -t 5 - "UNIX-CONNECT:$ADMIN_SOCKET""#;

pub fn start(start: &Start) -> Result<Box<dyn System>, String> {
    let bin = bin()?;
    let socat = peer_bin("BENCH_SOCAT", "socat")?;
    let mut peer = Peer::prepare(start);
    let admin = peer.dir().join("admin.sock");
    let config = write_file(
        peer.dir(),
        "haproxy.cfg",
        &format!(
            "global\n\
             \x20 nbthread 1\n\
             \x20 maxconn 2000\n\
             \x20 stats socket {admin} mode 600 level admin\n\
             \x20 # With tls.crt, load the key from tls.key (not tls.crt.key).\n\
             \x20 ssl-load-extra-del-ext\n\
             defaults\n\
             \x20 mode http\n\
             \x20 timeout connect 2s\n\
             \x20 timeout client 10s\n\
             \x20 timeout server 10s\n\
             frontend https\n\
             \x20 bind {https} ssl crt {cert_dir}/tls.crt\n\
             \x20 default_backend app\n\
             backend app\n\
             \x20 server app {backend}\n",
            admin = admin.display(),
            https = peer.https,
            cert_dir = peer.cert_dir.display(),
            backend = start.backend.address,
        ),
    )?;
    let mut cmd = Command::new(bin);
    cmd.arg("-db").arg("-f").arg(config);
    peer.spawn("haproxy", &mut cmd)?;
    watcher::start(
        &mut peer,
        RELOAD,
        &[("SOCAT", &socat), ("ADMIN_SOCKET", &admin)],
    )?;
    Ok(Box::new(peer))
}
