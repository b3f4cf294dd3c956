mod bad_examples;
mod tiers;

use super::*;
use crate::workspace::Upstream;
use nickel_lang_core::error::report::{report_as_str, ColorOpt};
use nickel_lang_core::program::{Program, ProgramBuilder};

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../schema/examples")
}

fn write(dir: &tempfile::TempDir, name: &str, text: &str) -> PathBuf {
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn diagnostic(path: &Path) -> String {
    match evaluate(path) {
        Err(ContractError::Invalid { diagnostic }) => diagnostic,
        other => panic!("{} should be invalid, got {other:?}", path.display()),
    }
}

/// The bundled contract with `from` replaced by `to`, each found exactly once: a variant only
/// the tests evaluate.
fn schema_variant(replacements: &[(&str, &str)]) -> String {
    let mut schema = SCHEMA.to_owned();
    for (from, to) in replacements {
        assert_eq!(schema.matches(from).count(), 1, "`{from}` in the contract");
        schema = schema.replace(from, to);
    }
    schema
}

/// The contract without its fast tiers: every route through `Route zone`, one by one.
static WITHOUT_FAST_TIERS: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    schema_variant(&[(
        "    routes | Routes zone,",
        "    routes | Array (Route zone),",
    )])
});

/// The contract tracing the tier each route takes (`tier` in `Routes`).
static TRACING_TIERS: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    schema_variant(&[(
            "let tier = fun name count checked => checked in",
            "let tier = fun name count checked => std.trace \"tier %{name} %{std.string.from count}\" checked in",
        )])
});

/// What Nickel's `std.trace` writes during one evaluation.
#[derive(Clone, Default)]
struct Trace(std::rc::Rc<std::cell::RefCell<Vec<u8>>>);

impl std::io::Write for Trace {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.borrow_mut().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// How many routes took each tier of `Routes`, as traced by [`TRACING_TIERS`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Tiers {
    /// Checked at once or alone by the expression for routes written with `upstream` and
    /// `port` only.
    plain: usize,
    /// Checked at once or alone by the expression for the newer fields too.
    fast: usize,
    /// Routes, or `upstreams` and `health` values, handed to the contracts of `Route zone`.
    slow: usize,
}

impl Tiers {
    fn ran(&self) -> bool {
        *self != Tiers::default()
    }
}

impl Trace {
    fn tiers(&self) -> Tiers {
        let text = String::from_utf8(self.0.borrow().clone()).unwrap();
        let mut tiers = Tiers::default();
        for line in text.lines() {
            let Some((name, count)) = line
                .split_once("tier ")
                .and_then(|(_, rest)| rest.split_once(' '))
            else {
                continue;
            };
            let count: usize = count.trim().parse().unwrap();
            match name {
                "plain" => tiers.plain += count,
                "fast" => tiers.fast += count,
                "slow" => tiers.slow += count,
                other => panic!("unknown tier `{other}` in {text}"),
            }
        }
        tiers
    }
}

/// Evaluates `path` with [`TRACING_TIERS`], and the tiers its routes took.
fn evaluate_tracing(path: &Path, target: Target) -> (Result<Workspace, ContractError>, Tiers) {
    let trace = Trace::default();
    let result = evaluate_with(
        &Input::File(path.to_owned()),
        None,
        target,
        DEFAULT_ADMIN_PORT,
        &TRACING_TIERS,
        trace.clone(),
        Afterwards::Free,
    );
    (result, trace.tiers())
}

/// What a bad example says it is refused with.
struct BadExample {
    /// The message (`# expect:`).
    expect: String,
    /// `line:column` (`# at:`) in the example, or the line in the file it names (`# in:`).
    at: String,
    /// The file a mistake is found in by reading it, as `check` and the agent do.
    named: Option<PathBuf>,
    /// Refused when rendered for sozu's configuration file (`# render: sozu-toml`).
    for_toml: bool,
    /// Refused when rendered as Kubernetes manifests (`# render: k8s`).
    for_k8s: bool,
}

impl BadExample {
    fn read(path: &Path, text: &str) -> BadExample {
        let header = |key: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(key))
                .map(str::trim)
                .unwrap_or_else(|| panic!("{} lacks `{key}`", path.display()))
                .to_owned()
        };
        BadExample {
            expect: header("# expect:"),
            at: header("# at:"),
            named: text
                .lines()
                .find_map(|l| l.strip_prefix("# in:"))
                .map(|f| path.parent().unwrap().join(f.trim())),
            for_toml: text.lines().any(|l| l.trim() == "# render: sozu-toml"),
            for_k8s: text.lines().any(|l| l.trim() == "# render: k8s"),
        }
    }

    /// The report for the example at `path` (traced), which must be refused.
    fn report(&self, path: &Path) -> (String, Tiers) {
        let target = if self.for_toml {
            Target::SozuToml
        } else if self.for_k8s {
            Target::K8s
        } else {
            Target::Agent
        };
        let (result, tiers) = evaluate_tracing(path, target);
        let report = match (&self.named, result) {
            (None, Err(ContractError::Invalid { diagnostic })) => diagnostic,
            (Some(_), Ok(ws)) => {
                let tree = Root::of(path, None).unwrap();
                let (unreadable, refused) = crate::sources::route_policy_files::check(&ws, &tree);
                assert!(unreadable.is_empty(), "{unreadable:?}");
                refused.join("\n")
            }
            (_, other) => panic!("{} should be refused, got {other:?}", path.display()),
        };
        (report, tiers)
    }

    /// Asserts that `report` (for the example at `path`) has the message at its position, and
    /// neither asks the author to edit the bundled contract nor points at the line that
    /// applies it.
    fn assert_refused(&self, path: &Path, report: &str) {
        assert!(
            report.contains(&self.expect),
            "{}: expected `{}` in\n{report}",
            path.display(),
            self.expect
        );
        let file_name = self
            .named
            .as_deref()
            .unwrap_or(path)
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        assert!(
            report.contains(&format!("{file_name}:{}", self.at)),
            "{}: expected a pointer at {} in\n{report}",
            path.display(),
            self.at
        );
        assert!(!report.contains("`, ..`"), "{}:\n{report}", path.display());
        assert!(
            !report.contains("|> (fun schema"),
            "{}:\n{report}",
            path.display()
        );
    }
}

/// A report's words: its lines without the excerpts of sources (whose file names, and the
/// text around a mistake, differ between an example and a copy of it).
fn words(report: &str) -> Vec<String> {
    report
        .lines()
        .filter(|l| !l.contains('│') && !l.contains('┌') && !l.contains('·'))
        .map(|l| l.trim().to_owned())
        .filter(|l| !l.is_empty())
        .collect()
}

/// The `i`th of the valid routes in `zone` that the bad examples are placed among: each
/// uses one or more of `drain`, `health`, `hsts` and `upstreams`, in a form the fast tier
/// checks.
fn fast_route(zone: &str, i: usize) -> String {
    let host = format!("tier-{i}.{zone}");
    match i % 6 {
            0 => format!("{{ host = \"{host}\", upstream = \"app-{i}.apps\", port = 8080, drain = true }}"),
            1 => format!(
                "{{ host = \"{host}\", upstreams = [{{ upstream = \"app-{i}.apps\", port = 80, weight = 9 }}, \
                 {{ upstream = \"app-{i}-next.apps\", port = 80 }}], health = {{ path = \"/healthz\", interval = 5, timeout = 2 }} }}"
            ),
            2 => format!(
                "{{ host = \"{host}\", upstream = \"10.0.0.{i}\", port = 5432, health = {{ mode = 'tcp }}, hsts = {{ max_age = 86400 }} }}"
            ),
            3 => format!(
                "{{ host = \"{host}\", path_prefix = \"/app/\", upstreams = [{{ upstream = \"fd00::{i}\", port = 443 }}, \
                 {{ upstream = \"10.1.0.{i}\", port = 443, drain = true }}], hsts = false }}"
            ),
            4 => format!(
                "{{ host = \"{host}\", upstream = \"unix:///run/app-{i}.sock\", hsts = true, health = {{ accepted_statuses = [204, \"200-299\"] }} }}"
            ),
            _ => format!(
                "{{ host = \"{host}\", upstreams = [{{ upstream = \"unix:///run/app-{i}.sock\", weight = 2 }}], drain = false }}"
            ),
        }
}

/// `s` with every index in `routes` (`routes[2]`) raised by `by`.
fn shift_indexes(s: &str, by: usize) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(at) = rest.find("routes[") {
        out.push_str(&rest[..at + "routes[".len()]);
        rest = &rest[at + "routes[".len()..];
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        match rest[..digits].parse::<usize>() {
            Ok(index) => out.push_str(&(index + by).to_string()),
            Err(_) => out.push_str(&rest[..digits]),
        }
        rest = &rest[digits..];
    }
    out.push_str(rest);
    out
}

/// A copy of the bad example `text` whose `routes` hold `count` valid routes of
/// [`fast_route`] before its own and as many after, each group on the line of a bracket so
/// that no line moves; and the example's expectation moved with it (an index in `routes` by
/// `count`, a column on the opening bracket's line right of the routes added there by their
/// length). `None` for an example without `routes`.
fn among_fast_routes(
    text: &str,
    example: &BadExample,
    count: usize,
) -> Option<(String, BadExample)> {
    let open = text.find("routes = [")? + "routes = [".len();
    // The matching bracket, outside strings and comments.
    let (mut depth, mut in_string, mut escaped, mut in_comment) = (1, false, false, false);
    let mut close = None;
    for (offset, c) in text[open..].char_indices() {
        match c {
            _ if in_comment => in_comment = c != '\n',
            _ if escaped => escaped = false,
            '\\' if in_string => escaped = true,
            '"' => in_string = !in_string,
            _ if in_string => {}
            '#' => in_comment = true,
            '[' => depth += 1,
            ']' => {
                depth -= 1;
                if depth == 0 {
                    close = Some(open + offset);
                    break;
                }
            }
            _ => {}
        }
    }
    let close = close?;
    let zone = text
        .split_once("zone = \"")
        .and_then(|(_, rest)| rest.split_once('"'))
        .map_or("in.example.org", |(zone, _)| zone);
    let before: String = (0..count)
        .map(|i| format!("{}, ", fast_route(zone, i)))
        .collect();
    let after: Vec<_> = (count..2 * count).map(|i| fast_route(zone, i)).collect();
    let comma = match text[..close].trim_end().chars().last() {
        Some(',' | '[') => "",
        _ => ", ",
    };
    let copy = format!(
        "{}{before}{}{comma}{}{}",
        &text[..open],
        &text[open..close],
        after.join(", "),
        &text[close..]
    );

    let open_line = text[..open].lines().count();
    let open_column = text[..open].rsplit('\n').next().unwrap().chars().count() + 1;
    let at = match (example.named.is_none(), example.at.split_once(':')) {
        (true, Some((line, column))) => {
            let (line, column): (usize, usize) = (line.parse().unwrap(), column.parse().unwrap());
            let column = if line == open_line && column >= open_column {
                column + before.chars().count()
            } else {
                column
            };
            format!("{line}:{column}")
        }
        _ => example.at.clone(),
    };
    let moved = BadExample {
        expect: shift_indexes(&example.expect, count),
        at,
        named: example.named.clone(),
        for_toml: example.for_toml,
        for_k8s: example.for_k8s,
    };
    Some((copy, moved))
}

#[test]
fn reference_example_passes_with_defaults_applied() {
    let ws = evaluate(&examples().join("librecloud.ncl")).unwrap();
    assert_eq!(ws.zone, "in.librecloud.online");
    assert_eq!(ws.tls_rotation, TlsRotation::CsiDriver);
    assert_eq!(ws.tls_dir, Path::new("/etc/sozu/tls"));
    assert_eq!(ws.listeners.https.to_string(), "0.0.0.0:443");
    assert_eq!(ws.listeners.http.to_string(), "0.0.0.0:80");
    // The contract's traffic defaults are the model's own (`Traffic::default`).
    assert_eq!(*ws.traffic, crate::workspace::Traffic::default());
    let summary: Vec<_> = ws
        .routes
        .iter()
        .map(|r| format!("{}{} -> {}", r.host, r.path_prefix(), r.upstreams_label()))
        .collect();
    assert_eq!(
            summary,
            [
                "git.in.librecloud.online/ -> gitea-http.gitea.svc.libre-wuji.local:3000",
                "git.in.librecloud.online -> gitea-ssh.gitea.svc.libre-wuji.local:22",
                "grafana.in.librecloud.online/ -> grafana.observability.svc.libre-wuji.local:3000",
                "longhorn.in.librecloud.online/ -> longhorn-frontend.longhorn-system.svc.libre-wuji.local:80",
                "ntfy.in.librecloud.online/ -> ntfy.ntfy.svc.libre-wuji.local:80",
                "otlp.in.librecloud.online/ -> otel-collector.observability.svc.libre-wuji.local:4317 (h2c)",
                "prometheus.in.librecloud.online/ -> prometheus.observability.svc.libre-wuji.local:9090",
            ]
        );
    // The listeners' defaults: HTTP/2 offered, idle streams held 6 minutes.
    assert_eq!(
        ws.listener_policy.http2,
        crate::workspace::Http2Offer::Offered
    );
    assert_eq!(
        (
            ws.listener_policy.timeouts.front,
            ws.listener_policy.timeouts.back
        ),
        (360, 360)
    );
}

#[test]
fn imports_resolve_relative_to_the_workspace_and_every_upstream_kind_passes() {
    let ws = evaluate(&examples().join("modular/workspace.ncl")).unwrap();
    assert_eq!(ws.tls_rotation, TlsRotation::Reloader);
    assert_eq!(ws.listeners.https.to_string(), "[::]:8443");
    let upstreams: Vec<_> = ws
        .routes
        .iter()
        .map(|r| r.upstreams[0].upstream.clone())
        .collect();
    assert!(matches!(upstreams[0], Upstream::Dns { port: 3000, .. }));
    assert_eq!(upstreams[1].to_string(), "10.0.0.12:3001");
    assert_eq!(upstreams[2].to_string(), "unix:///run/portal/http.sock");
    assert_eq!(upstreams[3].to_string(), "[fd00::10]:9090");
    assert_eq!(ws.routes[1].path_prefix(), "/api/");
}

#[test]
fn plain_json_data_is_a_workspace() {
    let ws = evaluate(&examples().join("plain.json")).unwrap();
    assert_eq!(ws.tls_dir, Path::new("/var/lib/tls"));
    assert_eq!(
        ws.tls_rotation,
        TlsRotation::Reloader,
        "a string names the mode in JSON"
    );
    assert_eq!(ws.routes.len(), 1);
}

/// Evaluates a workspace that must pass.
fn accepted(text: &str) -> Workspace {
    let dir = tempfile::tempdir().unwrap();
    evaluate(&write(&dir, "ok.ncl", text)).unwrap()
}

/// The passing side of each rule that the bad examples break.
#[test]
fn accepted_values_for_each_rule() {
    let ws = accepted(
        r#"{
  zone = "in.example.org",
  cluster_issuer = "ca.internal-1",
  tls_rotation = 'csi_driver,
  tls_dir = "/srv/tls",
  listeners = { https = "127.0.0.1:8443", http = "[::1]:8080" },
  routes = [
    { host = "in.example.org", upstream = "192.168.1.10", port = 1 },
    { host = "a-b.c.in.example.org", upstream = "svc-1.ns", port = 65535, path_prefix = "/x/y" },
    { host = "a-b.c.in.example.org", upstream = "svc-1.ns", port = 80, path_prefix = "/x" },
    { host = "v6.in.example.org", upstream = "::1", port = 8080 },
    { host = "sock.in.example.org", upstream = "unix:///run/a b/app.sock" },
  ],
}"#,
    );
    assert_eq!(ws.routes.len(), 5);
    assert_eq!(ws.listeners.http.to_string(), "[::1]:8080");
    assert_eq!(ws.tls_dir, Path::new("/srv/tls"));
}

/// The example of several upstreams, drains, health checks and HSTS, with every default the
/// contract fills in.
#[test]
fn backends_example_passes_with_defaults_applied() {
    use crate::plan::state::{HealthCheck, Hsts, Probe};
    let ws = evaluate(&examples().join("backends.ncl")).unwrap();
    let policy = |max_age, include_subdomains| Hsts {
        enabled: true,
        max_age,
        include_subdomains,
        preload: false,
    };
    assert_eq!(ws.hsts, Some(policy(63_072_000, true)));
    let route = |host: &str| ws.routes.iter().find(|r| r.host == host).unwrap();

    let shop = route("shop.in.example.org");
    assert_eq!(
        shop.upstreams_label(),
        "shop-v1.shop.svc.cluster.local:8080 (×9), shop-v2.shop.svc.cluster.local:8080 (×1), \
             10.0.0.40:8080 (×1, drained)"
    );
    assert_eq!(
        shop.health,
        Some(HealthCheck {
            probe: Probe::Http {
                path: "/healthz".into(),
                accepted_statuses: vec![(204, 204), (200, 299)],
            },
            interval: 5,
            timeout: 2,
            healthy_threshold: 3,
            unhealthy_threshold: 3,
            port: Some(9090),
        })
    );
    assert_eq!(shop.hsts(), None, "follows the workspace's policy");

    let admin = route("db-admin.in.example.org");
    assert_eq!(
        admin.health,
        Some(HealthCheck {
            probe: Probe::Tcp,
            interval: 10,
            timeout: 5,
            healthy_threshold: 3,
            unhealthy_threshold: 3,
            port: None,
        }),
        "sozu's own defaults"
    );
    assert_eq!(admin.hsts(), Some(policy(86_400, false)));

    let legacy = route("legacy.in.example.org");
    assert!(legacy.upstreams.iter().all(|u| u.drain && u.weight == 1));
    assert_eq!(
        legacy.upstreams[1].upstream.to_string(),
        "unix:///run/legacy/http.sock"
    );
    assert_eq!(legacy.hsts(), Some(Hsts::OFF));
    assert_eq!(legacy.health, None);

    let wiki = route("wiki.in.example.org");
    assert_eq!(wiki.upstreams_label(), "wiki.docs.svc.cluster.local:8080");
    assert_eq!((&wiki.health, wiki.hsts()), (&None, None));
}

/// The passing side of the rules on upstreams, health checks and HSTS, at their edges, in
/// JSON (modes as strings) and in Nickel.
#[test]
fn accepted_values_for_the_backend_rules() {
    use crate::plan::state::{Hsts, Probe};
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        &dir,
        "ws.json",
        r#"{ "zone": "in.example.org", "cluster_issuer": "ca", "hsts": false,
                 "routes": [
                   { "host": "a.in.example.org",
                     "upstreams": [
                       { "upstream": "fd00::10", "port": 80, "weight": 255 },
                       { "upstream": "fd00::10", "port": 81, "weight": 1 },
                       { "upstream": "fd00::11", "port": 80, "drain": false },
                       { "upstream": "10.0.0.1", "port": 80 },
                       { "upstream": "svc.ns", "port": 80 },
                       { "upstream": "svc.ns", "port": 81 },
                       { "upstream": "unix:///run/a.sock" }
                     ],
                     "health": { "mode": "http", "accepted_statuses": [100, 599, "100-599", "204-204"],
                                 "interval": 3600, "timeout": 3600, "healthy_threshold": 100,
                                 "unhealthy_threshold": 1, "port": 65535 },
                     "hsts": true },
                   { "host": "b.in.example.org", "upstream": "svc.ns", "port": 80, "drain": true,
                     "health": { "mode": "tcp", "interval": 1, "timeout": 1 },
                     "hsts": { "max_age": 31536000, "include_subdomains": true, "preload": true } },
                   { "host": "c.in.example.org", "upstream": "svc.ns", "port": 80,
                     "hsts": { "max_age": 0 } }
                 ] }"#,
    );
    let ws = evaluate(&path).unwrap();
    assert_eq!(
        ws.hsts, None,
        "`hsts = false` turns the listener's header off"
    );
    let [a, b, c] = &ws.routes[..] else {
        panic!("{:?}", ws.routes)
    };
    let weights: Vec<_> = a.upstreams.iter().map(|u| (u.weight, u.drain)).collect();
    assert_eq!(weights[..2], [(255, false), (1, false)]);
    assert_eq!(a.upstreams.len(), 7);
    let health = a.health.as_ref().unwrap();
    assert_eq!(
        health.probe,
        Probe::Http {
            path: "/".into(),
            accepted_statuses: vec![(100, 100), (599, 599), (100, 599), (204, 204)],
        }
    );
    assert_eq!(
        (health.interval, health.timeout, health.healthy_threshold),
        (3600, 3600, 100)
    );
    assert_eq!((health.unhealthy_threshold, health.port), (1, Some(65535)));
    assert_eq!(
        a.hsts(),
        crate::workspace::recommended_hsts(),
        "`true`: the recommended policy"
    );

    assert!(
        b.upstreams[0].drain,
        "a route's `drain` drains its upstream"
    );
    assert_eq!(b.health.as_ref().unwrap().probe, Probe::Tcp);
    assert_eq!(
        b.hsts(),
        Some(Hsts {
            enabled: true,
            max_age: 31_536_000,
            include_subdomains: true,
            preload: true,
        })
    );
    assert_eq!(c.hsts().unwrap().max_age, 0);

    // Tags in Nickel; an absent `hsts` is no header.
    let ws = accepted(
        r#"{
  zone = "in.example.org",
  cluster_issuer = "ca",
  routes = [
    { host = "a.in.example.org", upstreams = [{ upstream = "svc.ns", port = 80 }], health = { mode = 'tcp, port = 9000 } },
    { host = "b.in.example.org", upstream = "unix:///run/b.sock", health = { mode = 'http, path = "/ready?full=1" }, hsts = { preload = false } },
  ],
}"#,
    );
    assert_eq!(ws.hsts, None);
    assert_eq!(ws.routes[0].health.as_ref().unwrap().port, Some(9000));
    assert_eq!(
        ws.routes[1].health.as_ref().unwrap().probe,
        Probe::Http {
            path: "/ready?full=1".into(),
            accepted_statuses: vec![],
        }
    );
    assert_eq!(ws.routes[1].hsts(), crate::workspace::recommended_hsts());
}

/// The passing side of the network and shutdown rules: canonical networks of both families
/// (a single address, everything), digests, timings, monitoring selectors.
#[test]
fn accepted_values_for_the_deploy_rules() {
    let ws = accepted(
        r#"{
  zone = "in.example.org",
  cluster_issuer = "ca",
  allowed_sources = ["10.8.0.0/16", "192.0.2.7/32", "0.0.0.0/0", "fd00:8::/32", "::/0", "2001:db8::1/128", "FD00:9::/32"],
  routes = [],
  deploy = {
    sozu_image = "registry.example:5000/sozu/sozu:2.3.3@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
    pre_stop_seconds = 0,
    termination_grace_period_seconds = 1,
    monitoring = { namespace = "observability", pod_labels = { "app.kubernetes.io/name" = "prometheus", tier = "" } },
  },
}"#,
    );
    let sources: Vec<String> = ws
        .allowed_sources
        .unwrap()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        sources,
        [
            "10.8.0.0/16",
            "192.0.2.7/32",
            "0.0.0.0/0",
            "fd00:8::/32",
            "::/0",
            "2001:db8::1/128",
            "fd00:9::/32"
        ]
    );
    assert_eq!(ws.deploy.pre_stop_seconds, 0);
    assert_eq!(ws.deploy.termination_grace_period_seconds, 1);
    assert_eq!(ws.deploy.monitoring.namespace, "observability");
    assert_eq!(ws.deploy.monitoring.pod_labels.len(), 2);
}

#[test]
fn sozu_managed_with_an_acme_record_passes_with_its_defaults() {
    use crate::workspace::{Dns01, TsigAlgorithm};
    let ws = evaluate(&examples().join("acme.ncl")).unwrap();
    assert_eq!(ws.tls_rotation, TlsRotation::SozuManaged);
    let acme = ws.acme.expect("the acme record");
    assert_eq!(
        acme.directory,
        "https://acme-v02.api.letsencrypt.org/directory"
    );
    assert_eq!(acme.state_dir, Path::new("/var/lib/private-ingress/acme"));
    assert_eq!(acme.propagation.timeout_secs, 120);
    assert_eq!(acme.propagation.nameservers, None);
    assert_eq!((acme.profile, acme.ca_bundle, acme.eab), (None, None, None));
    match acme.dns01 {
        Dns01::Rfc2136 {
            server,
            tsig_algorithm,
            ..
        } => {
            assert_eq!(server.to_string(), "10.0.0.53:53");
            assert_eq!(tsig_algorithm, TsigAlgorithm::HmacSha256);
        }
        other => panic!("{other:?}"),
    }
    // JSON spells the tags as strings, and the rest the same way.
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        &dir,
        "ws.json",
        r#"{ "zone": "in.example.org", "cluster_issuer": "ca", "tls_rotation": "sozu_managed",
                 "acme": { "directory": "https://127.0.0.1:14000/dir", "profile": "shortlived",
                           "ca_bundle": "/etc/ca.pem", "eab": { "kid": "kid-1", "hmac_key_file": "/run/eab" },
                           "dns01": { "provider": "cloudflare", "api_token_file": "/run/token" },
                           "propagation": { "nameservers": ["[fd00::53]:5353", "10.0.0.1"], "timeout": 30 },
                           "state_dir": "/var/lib/pi" },
                 "routes": [] }"#,
    );
    let acme = evaluate(&path).unwrap().acme.unwrap();
    assert_eq!(
        acme.dns01,
        Dns01::Cloudflare {
            api_token_file: "/run/token".into()
        }
    );
    let servers: Vec<String> = acme
        .propagation
        .nameservers
        .unwrap()
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(servers, ["[fd00::53]:5353", "10.0.0.1:53"]);
    assert_eq!(acme.profile.as_deref(), Some("shortlived"));
}

#[test]
fn a_missing_file_is_unreadable_not_invalid() {
    let err = evaluate(Path::new("/nonexistent/ws.ncl")).unwrap_err();
    assert!(
        matches!(&err, ContractError::Unreadable { reason, .. } if reason == "no such file"),
        "{err:?}"
    );
    let dir = tempfile::tempdir().unwrap();
    let err = evaluate(dir.path()).unwrap_err();
    assert!(matches!(err, ContractError::Unreadable { .. }), "{err:?}");
}

#[test]
fn paths_with_quotes_and_percent_signs_are_imported_verbatim() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        &dir,
        "we\"ird %{x} \\name.ncl",
        r#"{ zone = "in.example.org", cluster_issuer = "ca", routes = [] }"#,
    );
    assert_eq!(evaluate(&path).unwrap().routes.len(), 0);
}

/// `sticky` and `balancing`: every algorithm sozu 2.3.3 has, as a tag and as a string (JSON),
/// on an 'https route and on a route of its own port; the defaults when absent.
#[test]
fn sticky_and_balancing_are_read_on_the_routes_that_take_them() {
    use crate::workspace::{Balancing, RouteKind};
    let ws = accepted(
        r#"{
  zone = "in.example.org",
  cluster_issuer = "ca",
  routes = [
    { host = "a.in.example.org", upstream = "10.0.0.1", port = 80, sticky = true, balancing = 'least_loaded },
    { host = "b.in.example.org", upstream = "10.0.0.1", port = 80, balancing = "power_of_two" },
    { host = "c.in.example.org", upstream = "10.0.0.1", port = 80, sticky = false, balancing = 'maglev },
    { host = "d.in.example.org", upstream = "10.0.0.1", port = 80, balancing = 'hrw },
    { host = "e.in.example.org", upstream = "10.0.0.1", port = 80, balancing = 'random },
    { host = "f.in.example.org", upstream = "10.0.0.1", port = 80 },
    { host = "g.in.example.org", protocol = 'tcp, listen_port = 2222, upstream = "10.0.0.1", port = 22, balancing = 'round_robin },
  ],
}"#,
    );
    let got: Vec<(String, bool, Balancing)> = ws
        .routes
        .iter()
        .map(|r| {
            let sticky = matches!(&r.kind, RouteKind::Http(h) if h.sticky);
            (r.host.clone(), sticky, r.balancing)
        })
        .collect();
    let want = |h: &str, s, b| (format!("{h}.in.example.org"), s, b);
    assert_eq!(
        got,
        vec![
            want("a", true, Balancing::LeastLoaded),
            want("b", false, Balancing::PowerOfTwo),
            want("c", false, Balancing::Maglev),
            want("d", false, Balancing::Hrw),
            want("e", false, Balancing::Random),
            want("f", false, Balancing::RoundRobin),
            want("g", false, Balancing::RoundRobin),
        ]
    );
    assert_eq!(
        ws.routes[0].policy_summary(),
        "sticky, balancing least_loaded"
    );
    assert_eq!(ws.routes[5].policy_summary(), "");
}
