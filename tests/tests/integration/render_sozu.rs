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
        "ntfy.in.librecloud.online",
        "otlp.in.librecloud.online",
        "git.in.librecloud.online",
    ] {
        write_certificate(&tls_dir, host);
    }
    // Beside the workspace that changes it: a workspace imports under its own directory only.
    std::fs::copy(&example, dir.path().join("librecloud.ncl")).unwrap();
    let ws = dir.path().join("reference.ncl");
    std::fs::write(
        &ws,
        format!(
            r#"let base = import "librecloud.ncl" in
let local = base & {{ tls_dir = "{tls}" }} in
std.record.update "routes"
  (std.array.map (fun r => std.record.update "upstream" "127.0.0.1" r) local.routes)
  local
"#,
            tls = tls_dir.display(),
        ),
    )
    .unwrap();
    let config = dir.path().join("sozu.toml");
    render(&ws, &config, &dir.path().join("sozu.sock"));
    let text = std::fs::read_to_string(&config).unwrap();
    // One cluster a route: five HTTPS routes, Gitea's web UI and its SSH.
    assert_eq!(
        text.lines()
            .filter(|l| l.starts_with("[clusters.\"") && l.ends_with("\"]"))
            .count(),
        7,
        "7 routes:\n{text}"
    );

    let (code, output) = config_check(&config);
    assert_eq!(
        code, 0,
        "sozu config check refused:\n{output}\n--- config:\n{text}"
    );
}

/// One mapping: sozu started from the rendered file alone (no agent) applies the same weights,
/// health checks and HSTS as the live agent does.
#[test]
fn sozu_started_from_the_rendered_file_applies_weights_health_checks_and_hsts() {
    use private_ingress_tests::live::{
        certificate, eventually, https_get, strict_transport_security, Backend, Stack,
    };
    use std::time::Duration;

    let mut stack = Stack::new();
    let hosts = ["app", "plain"].map(|h| format!("{h}.in.example.org"));
    for host in &hosts {
        certificate(&stack.tls_dir(), host);
    }
    let (heavy, light) = (Backend::start("heavy"), Backend::start("light"));
    let upstream = |b: &Backend, weight: u32| {
        format!(
            "{{ upstream = \"{}\", port = {}, weight = {weight} }}",
            b.address.ip(),
            b.address.port()
        )
    };
    let routes = [
        format!(
            "{{ host = \"{}\", upstreams = [{}, {}], health = {{ path = \"/healthz\", interval = 1, \
             timeout = 1, unhealthy_threshold = 2 }}, hsts = {{ max_age = 1200, include_subdomains = true }} }}",
            hosts[0],
            upstream(&heavy, 9),
            upstream(&light, 1)
        ),
        format!(
            "{{ host = \"{}\", upstream = \"{}\", port = {}, hsts = false }}",
            hosts[1],
            light.address.ip(),
            light.address.port()
        ),
    ];
    let ws = stack.dir.path().join("ws/workspace.ncl");
    std::fs::write(
        &ws,
        stack.workspace_text_of(&routes, "  hsts = { max_age = 600 },"),
    )
    .unwrap();
    let config = stack.dir.path().join("rendered.toml");
    render(&ws, &config, &stack.socket());
    let text = std::fs::read_to_string(&config).unwrap();
    let (code, output) = config_check(&config);
    assert_eq!(
        code, 0,
        "sozu config check refused:\n{output}\n--- config:\n{text}"
    );

    stack.start_sozu_with_config(&config);
    eventually(Duration::from_secs(10), "sozu serving the file", || {
        https_get(stack.https, &hosts[1], "/")
            .ok()
            .filter(|s| s.status == 200)
    });
    let mut heavy_share = 0;
    for _ in 0..100 {
        let seen = https_get(stack.https, &hosts[0], "/").expect("a request");
        heavy_share += usize::from(seen.body == "heavy");
    }
    assert_eq!(
        heavy_share, 90,
        "weights 9 and 1 over 100 requests:\n{text}"
    );
    let hsts = |host: &str| {
        strict_transport_security(stack.https, host)
            .expect("a request")
            .1
    };
    assert_eq!(
        hsts(&hosts[0]),
        ["max-age=1200; includeSubDomains"],
        "{text}"
    );
    assert_eq!(hsts(&hosts[1]), Vec::<String>::new(), "{text}");

    // The file's health check takes the failing backend out.
    heavy.set_healthy(false);
    eventually(
        Duration::from_secs(8),
        "only the healthy backend answering",
        || {
            (0..10)
                .all(|_| https_get(stack.https, &hosts[0], "/").is_ok_and(|s| s.body == "light"))
                .then_some(())
        },
    );
}

/// A sticky route in the rendered file, served by a sozu started from it alone: each backend
/// carries the sticky id the live agent would send, so a request carrying the cookie sozu set
/// reaches the backend it names (without one, sozu 2.3.3 follows no cookie).
#[test]
fn sozu_started_from_the_rendered_file_pins_a_sticky_routes_clients() {
    use private_ingress_tests::live::{certificate, eventually, https_get_sending, Backend, Stack};
    use std::collections::BTreeMap;
    use std::time::Duration;

    let mut stack = Stack::new();
    let host = "shop.in.example.org";
    certificate(&stack.tls_dir(), host);
    let (a, b) = (Backend::start("a"), Backend::start("b"));
    let upstream = |x: &Backend| {
        format!(
            "{{ upstream = \"{}\", port = {} }}",
            x.address.ip(),
            x.address.port()
        )
    };
    let routes = [format!(
        "{{ host = \"{host}\", upstreams = [{}, {}], sticky = true, balancing = 'random }}",
        upstream(&a),
        upstream(&b)
    )];
    let ws = stack.dir.path().join("ws/workspace.ncl");
    std::fs::write(&ws, stack.workspace_text_of(&routes, "")).unwrap();
    let config = stack.dir.path().join("rendered.toml");
    render(&ws, &config, &stack.socket());
    let text = std::fs::read_to_string(&config).unwrap();
    assert!(text.contains("sticky_session = true"), "{text}");
    assert!(text.contains("load_balancing = \"RANDOM\""), "{text}");
    let (code, output) = config_check(&config);
    assert_eq!(
        code, 0,
        "sozu config check refused:\n{output}\n--- config:\n{text}"
    );

    stack.start_sozu_with_config(&config);
    let get = |cookie: Option<&str>| {
        let headers: Vec<(&str, &str)> = cookie.map(|c| ("Cookie", c)).into_iter().collect();
        https_get_sending(stack.https, host, "/", &headers).ok()
    };
    eventually(Duration::from_secs(10), "sozu serving the file", || {
        get(None).filter(|(s, _)| s.status == 200)
    });
    let mut cookies = BTreeMap::new();
    for _ in 0..30 {
        let (seen, headers) = get(None).expect("a request");
        let cookie = headers
            .iter()
            .find(|(n, _)| n == "set-cookie")
            .and_then(|(_, v)| v.split(';').next())
            .unwrap_or_else(|| panic!("no cookie: {headers:?}"))
            .to_owned();
        cookies.insert(seen.body, cookie);
    }
    assert_eq!(
        cookies.len(),
        2,
        "both backends answer new clients: {cookies:?}"
    );
    for (backend, cookie) in &cookies {
        for _ in 0..10 {
            let (seen, _) = get(Some(cookie)).expect("a request");
            assert_eq!(&seen.body, backend, "{cookie}");
        }
    }
}
