//! nginx reading the certificate from the directory, and the [watcher](super::watcher) running
//! `nginx -s reload` after each swap: the master re-reads its configuration and certificates,
//! starts new workers and lets the old ones drain. One worker (`worker_processes 1`).

use std::process::Command;

use super::process::version_line;
use super::{peer_bin, watcher, write_file, Peer, Start, System};

fn bin() -> Result<std::path::PathBuf, String> {
    peer_bin("BENCH_NGINX", "nginx")
}

pub fn version() -> Result<String, String> {
    let line = version_line(Command::new(bin()?).arg("-v"), "version")?;
    // "nginx version: nginx/1.22.1"
    Ok(line
        .rsplit('/')
        .next()
        .map(|v| format!("nginx {v}"))
        .unwrap_or(line))
}

const RELOAD: &str =
    r#"  "$NGINX" -p "$PREFIX" -c "$PREFIX/nginx.conf" -e "$PREFIX/reload.log" -s reload"#;

pub fn start(start: &Start) -> Result<Box<dyn System>, String> {
    let bin = bin()?;
    let mut peer = Peer::prepare(start);
    let prefix = peer.dir().to_owned();
    std::fs::create_dir_all(prefix.join("temp")).map_err(|e| e.to_string())?;
    let p = prefix.display();
    let config = write_file(
        &prefix,
        "nginx.conf",
        &format!(
            "daemon off;\n\
             master_process on;\n\
             worker_processes 1;\n\
             pid {p}/nginx.pid;\n\
             error_log {p}/error.log warn;\n\
             events {{ worker_connections 1024; }}\n\
             http {{\n\
             \x20 access_log off;\n\
             \x20 client_body_temp_path {p}/temp/body;\n\
             \x20 proxy_temp_path {p}/temp/proxy;\n\
             \x20 fastcgi_temp_path {p}/temp/fastcgi;\n\
             \x20 uwsgi_temp_path {p}/temp/uwsgi;\n\
             \x20 scgi_temp_path {p}/temp/scgi;\n\
             \x20 upstream app {{ server {backend}; keepalive 16; }}\n\
             \x20 server {{\n\
             \x20   listen {https} ssl;\n\
             \x20   server_name {host};\n\
             \x20   ssl_certificate {cert_dir}/tls.crt;\n\
             \x20   ssl_certificate_key {cert_dir}/tls.key;\n\
             \x20   location / {{\n\
             \x20     proxy_pass http://app;\n\
             \x20     proxy_http_version 1.1;\n\
             \x20     proxy_set_header Connection \"\";\n\
             \x20   }}\n\
             \x20 }}\n\
             }}\n",
            backend = start.backend.address,
            https = peer.https,
            host = super::HOST,
            cert_dir = peer.cert_dir.display(),
        ),
    )?;
    let mut cmd = Command::new(&bin);
    cmd.arg("-p")
        .arg(&prefix)
        .arg("-c")
        .arg(config)
        .arg("-e")
        .arg(prefix.join("error.log"));
    peer.spawn("nginx", &mut cmd)?;
    watcher::start(&mut peer, RELOAD, &[("NGINX", &bin), ("PREFIX", &prefix)])?;
    Ok(Box::new(peer))
}
