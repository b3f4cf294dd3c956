//! The watcher a user would put beside a proxy that does not watch certificate files itself: a
//! shell loop over `inotifywait -m` on the certificate directory that runs a reload action on
//! every rename of `..data` into it (the AtomicWriter's switch). haproxy, nginx and Traefik use it with
//! their own action; the script is the same.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use super::{peer_bin, write_file, Peer};

/// Starts the watcher for `peer`'s certificate directory; `action` is a bash snippet run after
/// each swap, with `$cert_dir` set (and `env` exported). Returns once inotify's watch is in place.
pub fn start(peer: &mut Peer, action: &str, env: &[(&str, &Path)]) -> Result<(), String> {
    let inotifywait =
        peer_bin("BENCH_INOTIFYWAIT", "inotifywait").map_err(|e| format!("no watcher: {e}"))?;
    let script = format!(
        "#!/usr/bin/env bash\n\
         # Reloads on every AtomicWriter swap (a rename of ..data into the certificate directory).\n\
         set -u\n\
         # On SIGTERM, exit once the pipeline (which gets it too) has ended and been reaped.\n\
         trap 'exit 0' TERM\n\
         cert_dir=\"$1\"\n\
         \"$INOTIFYWAIT\" -m -e moved_to --format '%f' \"$cert_dir\" | while read -r name; do\n\
         \x20 [ \"$name\" = \"..data\" ] || continue\n\
         {action}\n\
         done\n"
    );
    let path = write_file(peer.dir(), "watch.sh", &script)?;
    let cert_dir = peer.cert_dir.clone();
    let mut cmd = Command::new("bash");
    cmd.arg(path)
        .arg(cert_dir)
        .env("INOTIFYWAIT", inotifywait)
        .envs(env.iter().map(|(k, v)| (k, v.as_os_str())));
    peer.spawn("watcher", &mut cmd)?
        .wait_for_log("Watches established.", Duration::from_secs(10))
        .map_err(|e| format!("watcher: {e}"))
}
