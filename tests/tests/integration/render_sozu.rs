use std::path::Path;
use std::process::Command;

use private_ingress_tests::{agent_bin, run, short_tempdir, sozu_bin, write_certificate};

const HOSTS: [&str; 4] = [
    "grafana.in.example.org",
    "metrics.in.example.org",
    "portal.in.example.org",
    "v6.in.example.org",
];

/// A workspace with every kind of upstream, all resolvable here (sozu resolves names when it
/// loads a file), and its certificates under `tls_dir`.
fn workspace(dir: &Path) -> std::path::PathBuf {
    let tls_dir = dir.join("tls");
    for host in HOSTS {
        write_certificate(&tls_dir, host);
    }
    let path = dir.join("workspace.ncl");
    std::fs::write(
        &path,
        format!(
            r#"{{
  zone = "in.example.org",
  cluster_issuer = "internal-ca",
  tls_dir = "{tls}",
  listeners = {{ https = "127.0.0.1:28443", http = "127.0.0.1:28080" }},
  routes = [
    {{ host = "grafana.in.example.org", upstream = "localhost", port = 3000 }},
    {{ host = "grafana.in.example.org", upstream = "127.0.0.1", port = 3001, path_prefix = "/api" }},
    {{ host = "metrics.in.example.org", upstream = "127.0.0.1", port = 9090 }},
    {{ host = "portal.in.example.org", upstream = "unix://{sock}" }},
    {{ host = "v6.in.example.org", upstream = "::1", port = 8080 }},
  ],
}}"#,
            tls = tls_dir.display(),
            sock = dir.join("portal.sock").display(),
        ),
    )
    .unwrap();
    path
}

fn render(workspace: &Path, out: &Path, socket: &Path) {
    let (code, _, err) = run(Command::new(agent_bin())
        .arg("render")
        .arg(workspace)
        .args(["--format", "sozu-toml", "--output"])
        .arg(out)
        .arg("--sozu-socket")
        .arg(socket));
    assert_eq!(code, 0, "render failed: {err}");
}

fn config_check(config: &Path) -> (i32, String) {
    let (code, out, err) = run(Command::new(sozu_bin())
        .args(["config", "check", "-c"])
        .arg(config));
    (code, format!("{out}{err}"))
}

#[test]
fn sozu_accepts_the_rendered_configuration() {
    let dir = short_tempdir();
    let ws = workspace(dir.path());
    let config = dir.path().join("sozu.toml");
    render(&ws, &config, &dir.path().join("sozu.sock"));

    let (code, output) = config_check(&config);
    let text = std::fs::read_to_string(&config).unwrap();
    assert_eq!(
        code, 0,
        "sozu config check refused:\n{output}\n--- config:\n{text}"
    );
    assert!(output.contains("Configuration file is valid"), "{output}");
}

/// The check above reads the certificate files: without one, sozu refuses the same config.
#[test]
fn sozu_refuses_it_when_a_certificate_file_is_missing() {
    let dir = short_tempdir();
    let ws = workspace(dir.path());
    let config = dir.path().join("sozu.toml");
    render(&ws, &config, &dir.path().join("sozu.sock"));
    std::fs::remove_file(dir.path().join("tls/metrics.in.example.org/tls.key")).unwrap();

    let (code, output) = config_check(&config);
    assert_ne!(
        code, 0,
        "sozu accepted a config whose key file is missing:\n{output}"
    );
}

/// The reference example itself, with only what cannot work here changed: its upstreams are
/// cluster DNS names that sozu would resolve when loading the file, so they point at loopback,
/// and its certificates live in a temporary `tls_dir`.
#[test]
fn sozu_accepts_the_reference_example() {
    let dir = short_tempdir();
    let tls_dir = dir.path().join("tls");
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../schema/examples/librecloud.ncl");
    for host in [
        "grafana.in.librecloud.online",
        "prometheus.in.librecloud.online",
        "longhorn.in.librecloud.online",
    ] {
        write_certificate(&tls_dir, host);
    }
    let ws = dir.path().join("reference.ncl");
    std::fs::write(
        &ws,
        format!(
            r#"let base = import "{example}" in
let local = base & {{ tls_dir = "{tls}" }} in
std.record.update "routes"
  (std.array.map (fun r => std.record.update "upstream" "127.0.0.1" r) local.routes)
  local
"#,
            example = example.canonicalize().unwrap().display(),
            tls = tls_dir.display(),
        ),
    )
    .unwrap();
    let config = dir.path().join("sozu.toml");
    render(&ws, &config, &dir.path().join("sozu.sock"));
    let text = std::fs::read_to_string(&config).unwrap();
    assert_eq!(
        text.matches("[[clusters.").count() / 3,
        3,
        "3 routes:\n{text}"
    );

    let (code, output) = config_check(&config);
    assert_eq!(
        code, 0,
        "sozu config check refused:\n{output}\n--- config:\n{text}"
    );
}
