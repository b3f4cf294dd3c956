//! Envoy with the certificate from a file SDS resource whose `watched_directory` is the
//! certificate directory: envoy reloads the pair itself on the `..data` rename, no trigger.
//! One worker thread (`--concurrency 1`), like sozu's one worker.

use std::process::Command;

use super::process::version_line;
use super::{peer_bin, write_file, Peer, Start, System};

fn bin() -> Result<std::path::PathBuf, String> {
    peer_bin("BENCH_ENVOY", "envoy")
}

pub fn version() -> Result<String, String> {
    let line = version_line(Command::new(bin()?).arg("--version"), "version")?;
    // "<path>  version: <sha>/1.40.0/Clean/RELEASE/BoringSSL"
    Ok(line
        .split_once("version:")
        .and_then(|(_, v)| v.split('/').nth(1))
        .map(|v| format!("envoy {v}"))
        .unwrap_or(line))
}

pub fn start(start: &Start) -> Result<Box<dyn System>, String> {
    let bin = bin()?;
    let mut peer = Peer::prepare(start);
    let cert_dir = peer.cert_dir.display().to_string();
    let sds = write_file(
        peer.dir(),
        "sds.yaml",
        &format!(
            r#"resources:
- "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret
  name: app
  tls_certificate:
    certificate_chain: {{ filename: "{cert_dir}/tls.crt" }}
    private_key: {{ filename: "{cert_dir}/tls.key" }}
    watched_directory: {{ path: "{cert_dir}" }}
"#
        ),
    )?;
    let config = write_file(
        peer.dir(),
        "envoy.yaml",
        &format!(
            r#"node: {{ id: bench, cluster: bench }}
static_resources:
  listeners:
  - name: https
    address: {{ socket_address: {{ address: "{ip}", port_value: {port} }} }}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: https
          route_config:
            virtual_hosts:
            - name: app
              domains: ["*"]
              routes:
              - match: {{ prefix: "/" }}
                route: {{ cluster: app }}
          http_filters:
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
      transport_socket:
        name: envoy.transport_sockets.tls
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext
          common_tls_context:
            tls_certificate_sds_secret_configs:
            - name: app
              sds_config:
                path_config_source: {{ path: "{sds}" }}
                resource_api_version: V3
  clusters:
  - name: app
    type: STATIC
    connect_timeout: 2s
    load_assignment:
      cluster_name: app
      endpoints:
      - lb_endpoints:
        - endpoint: {{ address: {{ socket_address: {{ address: "{backend_ip}", port_value: {backend_port} }} }} }}
"#,
            ip = peer.https.ip(),
            port = peer.https.port(),
            sds = sds.display(),
            backend_ip = start.backend.address.ip(),
            backend_port = start.backend.address.port(),
        ),
    )?;
    let mut cmd = Command::new(bin);
    cmd.arg("-c").arg(config).args([
        "--concurrency",
        "1",
        "--disable-hot-restart",
        "-l",
        "warning",
    ]);
    peer.spawn("envoy", &mut cmd)?;
    Ok(Box::new(peer))
}
