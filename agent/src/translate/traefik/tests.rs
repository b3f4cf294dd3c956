use serde_json::json;

use super::*;

fn options() -> Options {
    let mut entry_points = default_entry_points();
    entry_points.insert("ssh".into(), EntryPoint::Port(2222));
    entry_points.insert("dns".into(), EntryPoint::Port(5353));
    Options {
        zone: "example.org".into(),
        entry_points,
        host: Some("edge.example.org".into()),
    }
}

fn run(files: &[(&str, &str)]) -> Translation {
    let sources: Vec<(String, String)> = files
        .iter()
        .map(|(n, t)| (n.to_string(), t.to_string()))
        .collect();
    translate_texts(&sources, &options())
}

/// Orca's emitter output, as the issue quotes it.
pub(crate) const ORCA: &str = r#"http:
  routers:
    orca-web:
      rule: PathPrefix("/web")
      service: orca-web
      tls:
        certResolver: orca
        domains:
          - main: "cluster.orca.example.org"
  services:
    orca-web:
      loadBalancer:
        servers:
          - url: "unix:///run/orca/alloc-1234/port-http.sock"
        healthCheck: { path: /healthz, interval: 5s, timeout: 1s }
"#;

/// Atlas's answer, as the issue describes it.
pub(crate) const ATLAS: &str = r#"{
  "http": {
    "routers": {
      "app-api": {
        "rule": "Host(`app.example.org`) && PathPrefix(`/api`)",
        "service": "app-api",
        "tls": {}
      },
      "plain": {
        "rule": "Host(`plain.example.org`)",
        "service": "app-api"
      }
    },
    "services": {
      "app-api": {
        "loadBalancer": {
          "servers": [{"url": "http://10.0.0.1:8080"}, {"url": "http://10.0.0.2:8080"}],
          "passHostHeader": true
        }
      }
    }
  }
}"#;

#[test]
fn orca_takes_its_host_from_tls_domains_and_its_socket_as_upstream() {
    let t = run(&[("orca-web.yaml", ORCA)]);
    assert_eq!(t.refused, vec![]);
    assert_eq!(t.routes.len(), 1);
    let r = &t.routes[0];
    assert_eq!(
        r.origin.to_string(),
        "orca-web.yaml:3: http router `orca-web`"
    );
    assert_eq!(
        Value::Object(r.route.clone()),
        json!({
            "host": "cluster.orca.example.org",
            "path_prefix": "/web",
            "upstream": "unix:///run/orca/alloc-1234/port-http.sock",
            "health": {"path": "/healthz", "interval": 5, "timeout": 1},
        })
    );
}

#[test]
fn orca_drain_is_the_same_file_with_weight_zero() {
    let drained = ORCA.replace(
        "- url: \"unix:///run/orca/alloc-1234/port-http.sock\"",
        "- url: \"unix:///run/orca/alloc-1234/port-http.sock\"\n            weight: 0",
    );
    let t = run(&[("orca-web.yaml", &drained)]);
    assert_eq!(
        t.routes[0].route["upstreams"],
        json!([{"upstream": "unix:///run/orca/alloc-1234/port-http.sock", "drain": true}])
    );
}

#[test]
fn atlas_routes_with_tls_are_carried_and_a_plain_one_is_refused() {
    let t = run(&[("atlas", ATLAS)]);
    assert_eq!(t.routes.len(), 1);
    assert_eq!(
        Value::Object(t.routes[0].route.clone()),
        json!({
            "host": "app.example.org",
            "path_prefix": "/api",
            "upstreams": [{"upstream": "10.0.0.1", "port": 8080}, {"upstream": "10.0.0.2", "port": 8080}],
        })
    );
    assert_eq!(t.refused.len(), 1);
    assert_eq!(t.refused[0].origin.router, "plain");
    assert_eq!(t.refused[0].origin.line, Some(9));
    assert!(
        t.refused[0].reason.contains("plain HTTP"),
        "{}",
        t.refused[0]
    );
}

#[test]
fn or_makes_several_routes_and_matching_fields_are_the_agreed_names() {
    let yaml = r#"
http:
  routers:
    r:
      rule: "Host(`a.example.org`) && (Path(`/x`) || PathRegexp(`^/v[0-9]+`)) && Method(`GET`) && Header(`X-Canary`, `1`)"
      service: s
      tls: {}
  services:
    s:
      loadBalancer:
        servers: [{url: "h2c://grpc.ns:50051"}]
"#;
    let t = run(&[("r.yml", yaml)]);
    assert_eq!(t.refused, vec![]);
    let routes: Vec<Value> = t
        .routes
        .iter()
        .map(|r| Value::Object(r.route.clone()))
        .collect();
    assert_eq!(routes.len(), 2);
    assert!(routes.contains(&json!({
        "host": "a.example.org", "path_exact": "/x", "method": "GET",
        "match_headers": [{"name": "X-Canary", "exact": "1"}],
        "upstream": "grpc.ns", "port": 50051, "upstream_protocol": "h2c",
    })));
    assert!(routes.contains(&json!({
        "host": "a.example.org", "path_regex": ".*(?:^/v[0-9]+).*", "method": "GET",
        "match_headers": [{"name": "X-Canary", "exact": "1"}],
        "upstream": "grpc.ns", "port": 50051, "upstream_protocol": "h2c",
    })));
}

#[test]
fn middlewares_become_route_policies() {
    let yaml = r#"
http:
  routers:
    app:
      rule: "Host(`app.example.org`) && PathPrefix(`/app/`)"
      service: s
      middlewares: [strip, sec]
      tls: {certResolver: le}
    moved:
      rule: "Host(`old.example.org`)"
      service: s
      middlewares: [moved]
      tls: {}
    web:
      rule: "Host(`app.example.org`)"
      entryPoints: [web]
      service: s
      middlewares: [https]
  middlewares:
    strip: {stripPrefix: {prefixes: ["/app"]}}
    sec:
      headers:
        customResponseHeaders: {X-Served-By: sozu, Server: ""}
        stsSeconds: 31536000
        stsIncludeSubdomains: true
    moved: {redirectRegex: {regex: "^https?://[^/]+/(.*)", replacement: "https://new.example.org/${1}", permanent: true}}
    https: {redirectScheme: {scheme: https, permanent: true}}
  services:
    s: {loadBalancer: {servers: [{url: "http://app.ns:8080"}]}}
"#;
    let t = run(&[("m.yaml", yaml)]);
    assert_eq!(t.refused, vec![]);
    assert_eq!(t.covered.len(), 1);
    assert_eq!(t.covered[0].0.router, "web");
    let app = t.routes.iter().find(|r| r.origin.router == "app").unwrap();
    assert_eq!(app.route["strip_prefix"], json!(true));
    assert_eq!(
        app.route["headers"],
        json!({"response": {"set": {"X-Served-By": "sozu"}, "remove": ["Server"]}})
    );
    assert_eq!(
        app.route["hsts"],
        json!({"max_age": 31536000, "include_subdomains": true, "preload": false})
    );
    let moved = t
        .routes
        .iter()
        .find(|r| r.origin.router == "moved")
        .unwrap();
    assert_eq!(
        Value::Object(moved.route.clone()),
        json!({"host": "old.example.org", "redirect": {"status": 301, "scheme": "https", "host": "new.example.org"}})
    );
}

#[test]
fn fail_closed_a_router_with_what_cannot_be_carried_is_not_served() {
    let yaml = r#"
http:
  routers:
    admin:
      rule: "Host(`admin.example.org`)"
      service: s
      middlewares: [office-only]
      tls: {}
    auth:
      rule: "Host(`auth.example.org`)"
      service: s
      middlewares: [users]
      tls: {}
    not:
      rule: "Host(`not.example.org`) && !PathPrefix(`/private`)"
      service: s
      tls: {}
    outside:
      rule: "Host(`app.elsewhere.net`)"
      service: s
      tls: {}
    typo:
      rule: "Host(`typo.example.org`)"
      servce: s
      tls: {}
  middlewares:
    office-only: {ipAllowList: {sourceRange: ["10.0.0.0/8"]}}
    users: {basicAuth: {users: ["u:$2y$05$abcdefghijklmnopqrstuv"]}}
  services:
    s: {loadBalancer: {servers: [{url: "http://app.ns:8080"}]}}
"#;
    let t = run(&[("f.yaml", yaml)]);
    assert_eq!(t.routes, vec![], "nothing may be served");
    let reasons: Vec<String> = t.refused.iter().map(|r| r.to_string()).collect();
    for (router, line, says) in [
        ("admin", 4, "allowed_sources"),
        ("auth", 9, "bcrypt"),
        ("not", 14, "`!`"),
        ("outside", 18, "outside the zone"),
        ("typo", 22, "`servce` is not carried"),
    ] {
        let found = reasons
            .iter()
            .find(|r| r.starts_with(&format!("f.yaml:{line}: http router `{router}`")))
            .unwrap_or_else(|| panic!("{router} at line {line} in {reasons:#?}"));
        assert!(found.contains(says), "{found}");
    }
}

#[test]
fn names_across_files_and_a_broken_file() {
    let routers = "http:\n  routers:\n    a:\n      rule: Host(`a.example.org`)\n      service: shared@file\n      tls: {}\n";
    let services = "[http.services.shared.loadBalancer]\n[[http.services.shared.loadBalancer.servers]]\nurl = \"http://10.0.0.9:80\"\n";
    let broken = "http:\n  routers:\n    b: [\n";
    let t = run(&[
        ("a.yaml", routers),
        ("s.toml", services),
        ("z.yaml", broken),
    ]);
    assert_eq!(t.routes.len(), 1);
    assert_eq!(t.routes[0].route["upstream"], json!("10.0.0.9"));
    assert_eq!(t.broken.len(), 1);
    assert_eq!(t.broken[0].file, "z.yaml");
    assert!(t.broken[0].line.is_some());

    // The same router declared differently in two files: neither is served.
    let other = routers.replace("shared@file", "other");
    let t = run(&[
        ("a.yaml", routers),
        ("b.yaml", &other),
        ("s.toml", services),
    ]);
    assert_eq!(t.routes, vec![]);
    assert!(
        t.refused[0].reason.contains("a.yaml and b.yaml"),
        "{}",
        t.refused[0]
    );
}

#[test]
fn priority_decides_as_traefik_does() {
    let yaml = r#"
http:
  routers:
    catch-all:
      rule: "Host(`a.example.org`)"
      priority: 1000
      service: s
      tls: {}
    api:
      rule: "Host(`a.example.org`) && PathPrefix(`/api`)"
      service: s
      tls: {}
    default-order:
      rule: "Host(`b.example.org`) && PathPrefix(`/api`)"
      service: s
      tls: {}
    default-root:
      rule: "Host(`b.example.org`)"
      service: s
      tls: {}
  services:
    s: {loadBalancer: {servers: [{url: "http://app.ns:8080"}]}}
"#;
    let t = run(&[("p.yaml", yaml)]);
    let served: Vec<&str> = t.routes.iter().map(|r| r.origin.router.as_str()).collect();
    assert_eq!(served, vec!["catch-all", "default-order", "default-root"]);
    assert_eq!(t.refused.len(), 1);
    assert_eq!(t.refused[0].origin.router, "api");
    assert!(
        t.refused[0].reason.contains("never served"),
        "{}",
        t.refused[0]
    );
}

#[test]
fn tcp_and_udp_routers_on_mapped_ports() {
    let yaml = r#"
tcp:
  routers:
    ssh:
      rule: "HostSNI(`*`)"
      entryPoints: [ssh]
      service: ssh
    db:
      rule: "HostSNI(`db.example.org`)"
      entryPoints: [ssh]
      service: ssh
      tls: {passthrough: true}
    on-https:
      rule: "HostSNI(`*`)"
      entryPoints: [websecure]
      service: ssh
  services:
    ssh: {loadBalancer: {servers: [{address: "10.0.0.5:22"}], proxyProtocol: {version: 2}}}
udp:
  routers:
    dns: {entryPoints: [dns], service: dns}
  services:
    dns: {loadBalancer: {servers: [{address: "10.0.0.53:53"}]}}
"#;
    let t = run(&[("t.yaml", yaml)]);
    let by = |n: &str| {
        Value::Object(
            t.routes
                .iter()
                .find(|r| r.origin.router == n)
                .unwrap()
                .route
                .clone(),
        )
    };
    assert_eq!(
        by("ssh"),
        json!({"host": "edge.example.org", "protocol": "tcp", "listen_port": 2222, "upstream": "10.0.0.5", "port": 22, "proxy_protocol": true})
    );
    assert_eq!(
        by("db"),
        json!({"host": "db.example.org", "protocol": "tls_passthrough", "listen_port": 2222, "upstream": "10.0.0.5", "port": 22, "proxy_protocol": true})
    );
    assert_eq!(
        by("dns"),
        json!({"host": "edge.example.org", "protocol": "udp", "listen_port": 5353, "upstream": "10.0.0.53", "port": 53})
    );
    assert_eq!(t.refused.len(), 1);
    assert_eq!(t.refused[0].origin.router, "on-https");
}

#[test]
fn the_workspace_text_names_each_router_and_each_refusal() {
    let t = run(&[("orca-web.yaml", ORCA), ("atlas", ATLAS)]);
    let text = workspace_text::workspace(
        &t,
        &["orca-web.yaml".into(), "atlas".into()],
        "example.org",
        "internal-ca",
    );
    assert!(text.contains("    # orca-web.yaml:3: http router `orca-web`\n    { host = \"cluster.orca.example.org\", path_prefix = \"/web\", upstream = \"unix:///run/orca/alloc-1234/port-http.sock\", health = { path = \"/healthz\", interval = 5, timeout = 1 } },"), "{text}");
    assert!(
        text.contains("# - atlas:9: http router `plain`: not served:"),
        "{text}"
    );
}

/// `sticky.cookie` and `strategy` come over as the route's `sticky` and `balancing`, in a
/// workspace text the contract accepts with them.
#[test]
fn sticky_and_strategy_are_written_as_fields_the_contract_takes() {
    let yaml = r#"
http:
  routers:
    shop:
      rule: "Host(`shop.example.org`)"
      service: shop
      tls: {}
  services:
    shop:
      loadBalancer:
        strategy: p2c
        sticky:
          cookie: {}
        servers:
          - url: "http://10.0.0.1:8080"
          - url: "http://10.0.0.2:8080"
"#;
    let t = run(&[("shop.yaml", yaml)]);
    assert_eq!(t.refused, vec![]);
    let text = workspace_text::workspace(&t, &["shop.yaml".into()], "example.org", "internal-ca");
    assert!(
        text.contains("balancing = 'power_of_two") && text.contains("sticky = true"),
        "{text}"
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("workspace.ncl");
    std::fs::write(&path, &text).unwrap();
    let ws = crate::evaluate::contract::evaluate(&path).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(
        ws.routes[0].policy_summary(),
        "sticky, balancing power_of_two"
    );
}

/// `tls.certificates` becomes the workspace's `certificates`, each under a comment naming where
/// it was, in a text the contract accepts (paths kept as written).
#[test]
fn tls_certificates_are_written_as_the_workspaces_certificates() {
    let yaml = r#"
http:
  routers:
    web: { rule: "Host(`a.example.org`)", service: s, tls: {} }
  services:
    s: { loadBalancer: { servers: [{ url: "http://10.0.0.1:80" }] } }
tls:
  certificates:
    - certFile: /etc/letsencrypt/live/example.org/fullchain.pem
      keyFile: /etc/letsencrypt/live/example.org/privkey.pem
    - { certFile: certs/wild.crt, keyFile: certs/wild.key }
"#;
    let t = run(&[("dynamic.yaml", yaml)]);
    let text = workspace_text::workspace(&t, &["dynamic.yaml".into()], "example.org", "ca");
    assert!(
        text.contains("  certificates = [\n    # dynamic.yaml:8: tls.certificates\n    { cert_file = \"/etc/letsencrypt/live/example.org/fullchain.pem\", key_file = \"/etc/letsencrypt/live/example.org/privkey.pem\" },"),
        "{text}"
    );
    assert!(!text.contains("put the pair in the tls_dir"), "{text}");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("workspace.ncl");
    std::fs::write(&path, &text).unwrap();
    let ws = crate::evaluate::contract::evaluate(&path).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let files: Vec<_> = ws
        .certificates
        .iter()
        .map(|p| (p.cert_file.clone(), p.key_file.clone()))
        .collect();
    assert_eq!(
        files,
        vec![
            (
                "/etc/letsencrypt/live/example.org/fullchain.pem".into(),
                "/etc/letsencrypt/live/example.org/privkey.pem".into()
            ),
            (
                dir.path().join("certs/wild.crt"),
                dir.path().join("certs/wild.key")
            ),
        ],
        "relative paths are the workspace directory's"
    );
}

/// A seeded fuzz: Traefik files cut, spliced and mutated never panic the translation, and every
/// refusal or broken file names its file (and a router, for a refusal).
#[test]
fn seeded_fuzz_never_panics_and_names_the_file() {
    const TOML: &str = "[http.routers.a]\nrule = \"Host(`a.example.org`) && PathPrefix(`/é`)\"\nservice = \"s\"\ntls = {}\n\n[[http.services.s.loadBalancer.servers]]\nurl = \"http://10.0.0.1:80\"\n";
    let seeds = [ORCA, ATLAS, TOML];
    let pieces = [
        "rule: \"Host(`x.example.org`) && (\"",
        "middlewares: [nope]",
        "weight: -1",
        "tls: 3",
        "!",
        "HostSNI(`*`)",
        "url: \"unix://\"",
        "priority: 99999999999999999999",
        "\u{0}",
        "{{{{",
        "`",
        "servers: []",
        "entryPoints: [nowhere]",
        "é",
        "\u{1F600}",
        "[http.routers.\"b\"]",
    ];
    let mut rng = fastrand::Rng::with_seed(52);
    for round in 0..2000 {
        let seed = seeds[rng.usize(..seeds.len())];
        let mut text: Vec<char> = seed.chars().collect();
        for _ in 0..rng.usize(1..4) {
            let at = rng.usize(..=text.len());
            match rng.u8(..3) {
                0 => {
                    let piece = pieces[rng.usize(..pieces.len())];
                    text.splice(at..at, piece.chars());
                }
                1 => {
                    let end = (at + rng.usize(..20)).min(text.len());
                    text.drain(at..end);
                }
                _ => {
                    if at < text.len() {
                        text[at] = char::from(rng.u8(32..127));
                    }
                }
            }
        }
        let text: String = text.into_iter().collect();
        let name = match seed {
            ORCA => "f.yaml",
            TOML => "f.toml",
            _ => "f.json",
        };
        let t = run(&[(name, &text)]);
        for r in &t.refused {
            assert!(r.to_string().starts_with("f."), "round {round}: {r}");
            assert!(r.origin.line.is_some(), "round {round}: {r}\n{text}");
        }
        for b in &t.broken {
            assert_eq!(b.file, name, "round {round}: {b}");
        }
    }
}

#[test]
fn a_regex_is_compared_with_the_paths_it_can_share() {
    // `regex` (the longest rule, which Traefik prefers) shares no request with `exact` nor with
    // `docs`: all three are served. `short`, a regex Traefik ranks below `catch` (its explicit
    // priority) and sozu above it, shares `/v1…` with it: it is refused.
    let yaml = r#"
http:
  routers:
    exact: { rule: "Host(`m.example.org`) && Path(`/exact`)", service: s, tls: {} }
    regex: { rule: "Host(`m.example.org`) && PathRegexp(`^/v[0-9]+/things`)", service: s, tls: {} }
    docs: { rule: "Host(`m.example.org`) && PathPrefix(`/docs`)", service: s, tls: {} }
    catch: { rule: "Host(`n.example.org`) && PathPrefix(`/v1`)", priority: 500, service: s, tls: {} }
    short: { rule: "Host(`n.example.org`) && PathRegexp(`^/v`)", service: s, tls: {} }
  services:
    s: {loadBalancer: {servers: [{url: "http://app.ns:8080"}]}}
"#;
    let t = run(&[("r.yaml", yaml)]);
    let served: Vec<&str> = t.routes.iter().map(|r| r.origin.router.as_str()).collect();
    assert_eq!(
        served,
        vec!["exact", "regex", "docs", "catch"],
        "{:#?}",
        t.refused
    );
    assert_eq!(t.refused.len(), 1);
    assert_eq!(t.refused[0].origin.router, "short");
}
