//! Traefik 3 with the certificate named in a dynamic configuration file (`tls.certificates`),
//! and the [watcher](super::watcher) rewriting that file after each swap to name the new pair.
//!
//! Traefik reads a certificate's files when its configuration changes, not when the files do
//! (a pair rewritten in place under the same paths is not picked up), and it skips a
//! configuration whose content did not change. So the rotation a Traefik user has to write is
//! the new pair on disk and the dynamic file that names it rewritten: here it names the files
//! through the timestamped directory that `..data` points at after the swap, written to a
//! temporary file and renamed into the watched directory, as a careful writer would.
//! `providers.providersThrottleDuration` is 0 (Traefik's default of 2 s would hold back a
//! rotation that comes within 2 s of the one before); Traefik runs with `GOMAXPROCS=1`, as the
//! other systems run one worker.

use std::path::Path;
use std::process::Command;

use super::process::version_line;
use super::{peer_bin, watcher, write_file, Peer, Start, System};

fn bin() -> Result<std::path::PathBuf, String> {
    peer_bin("BENCH_TRAEFIK", "traefik")
}

pub fn version() -> Result<String, String> {
    let line = version_line(Command::new(bin()?).arg("version"), "version")?;
    // "Version:      3.7.15"
    Ok(line
        .split_whitespace()
        .nth(1)
        .map(|v| format!("traefik {v}"))
        .unwrap_or(line))
}

/// Writes the dynamic configuration naming the pair in the directory `$pair` (tls.crt and
/// tls.key), to a temporary file renamed into `$DYNAMIC_DIR`; `$BACKEND` and `$HOST` come from
/// the environment.
const WRITE_DYNAMIC: &str = r#"  printf '%s\n' \
    'http:' \
    '  routers:' \
    '    app:' \
    "      rule: Host(\`$HOST\`)" \
    '      entryPoints: [websecure]' \
    '      service: app' \
    '      tls: {}' \
    '  services:' \
    '    app:' \
    '      loadBalancer:' \
    '        servers:' \
    "          - url: \"http://$BACKEND\"" \
    'tls:' \
    '  certificates:' \
    "    - certFile: \"$pair/tls.crt\"" \
    "      keyFile: \"$pair/tls.key\"" \
    > "$DYNAMIC_DIR/.routes.yaml.tmp"
  mv "$DYNAMIC_DIR/.routes.yaml.tmp" "$DYNAMIC_DIR/routes.yaml""#;

/// The pair `..data` points at now.
const PAIR: &str = r#"  pair="$cert_dir/$(readlink "$cert_dir/..data")""#;

pub fn start(start: &Start) -> Result<Box<dyn System>, String> {
    let bin = bin()?;
    let mut peer = Peer::prepare(start);
    let dynamic = peer.dir().join("dynamic");
    std::fs::create_dir_all(&dynamic).map_err(|e| format!("{}: {e}", dynamic.display()))?;
    let static_config = write_file(
        peer.dir(),
        "traefik.yaml",
        &format!(
            "entryPoints:\n  websecure:\n    address: \"{https}\"\n\
             providers:\n  providersThrottleDuration: 0s\n  file:\n    directory: \"{dynamic}\"\n    watch: true\n\
             log:\n  level: INFO\n",
            https = peer.https,
            dynamic = dynamic.display(),
        ),
    )?;
    let backend = start.backend.address.to_string();
    let env: [(&str, &Path); 3] = [
        ("DYNAMIC_DIR", &dynamic),
        ("BACKEND", Path::new(&backend)),
        ("HOST", Path::new(super::HOST)),
    ];
    // The first configuration, written as each rotation writes it.
    let status = Command::new("bash")
        .arg("-c")
        .arg(format!("set -eu\n{PAIR}\n{WRITE_DYNAMIC}\n"))
        .env("cert_dir", &peer.cert_dir)
        .envs(env.iter().map(|(k, v)| (k, v.as_os_str())))
        .status()
        .map_err(|e| format!("write the first dynamic configuration: {e}"))?;
    if !status.success() {
        return Err(format!("write the first dynamic configuration: {status}"));
    }
    let mut cmd = Command::new(&bin);
    cmd.arg(format!("--configFile={}", static_config.display()))
        .env("GOMAXPROCS", "1");
    peer.spawn("traefik", &mut cmd)?;
    watcher::start(&mut peer, &format!("{PAIR}\n{WRITE_DYNAMIC}"), &env)?;
    Ok(Box::new(peer))
}
