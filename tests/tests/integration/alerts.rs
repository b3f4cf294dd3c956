//! The alert rules and the dashboard against a real Prometheus scraping a running agent.
//!
//! Prometheus (Debian's `prometheus` package, which `scripts/test` installs) scrapes the agent
//! every second and evaluates the rules of `render --format prometheus-rules
//! --alert-for-scale 0.01` (`for: 6s` for a refused pair) every second. A bad pair makes the
//! refused-certificate alert fire, a good pair resolves it, both seen through Prometheus' HTTP
//! API; meanwhile every query of the dashboard (deploy/grafana-dashboard.json) runs against it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use private_ingress_tests::corpus::{Kind, Volume, HOST};
use private_ingress_tests::live::{
    certificate, eventually_every, free_port, https_get, Backend, KeepAlive, Process, RouteSpec,
    Stack,
};
use serde_json::Value;

/// The factor every `for:` is rendered with: 10 minutes become 6 seconds.
const FOR_SCALE: &str = "0.01";
/// The refused-certificate alert's `for:` at that scale.
const REFUSED_FOR: Duration = Duration::from_secs(6);

/// A Prometheus server on a loopback port, with its storage in a temporary directory; killed on
/// drop.
struct Prometheus {
    address: SocketAddr,
    _process: Process,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    /// Scrapes `target` every second and evaluates `rules` every second.
    fn start(target: SocketAddr, rules: &str) -> Prometheus {
        let binary = Path::new("/usr/bin/prometheus");
        assert!(
            binary.is_file(),
            "{} is missing: scripts/test installs Debian's prometheus package",
            binary.display()
        );
        let dir = tempfile::tempdir().expect("a temporary directory");
        std::fs::write(dir.path().join("rules.yaml"), rules).expect("write rules.yaml");
        std::fs::write(
            dir.path().join("prometheus.yml"),
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
                 rule_files:\n  - {rules}\n\
                 scrape_configs:\n  - job_name: private-ingress\n    static_configs:\n      - targets: [\"{target}\"]\n",
                rules = dir.path().join("rules.yaml").display(),
            ),
        )
        .expect("write prometheus.yml");
        let address = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let mut cmd = Command::new(binary);
        cmd.arg(format!(
            "--config.file={}",
            dir.path().join("prometheus.yml").display()
        ))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.path().join("data").display()
        ))
        .arg(format!("--web.listen-address={address}"))
        .arg("--log.level=warn");
        let process = Process::spawn(&mut cmd, &dir.path().join("prometheus.log"));
        let prometheus = Prometheus {
            address,
            _process: process,
            _dir: dir,
        };
        eventually_every(
            Duration::from_millis(100),
            Duration::from_secs(30),
            "Prometheus ready",
            || {
                ureq::get(&format!("http://{address}/-/ready"))
                    .call()
                    .ok()
                    .map(|_| ())
            },
        );
        prometheus
    }

    fn get(&self, path: &str, query: Option<&str>) -> Result<Value, String> {
        let mut request = ureq::get(&format!("http://{}{path}", self.address))
            .config()
            .http_status_as_error(false)
            .build();
        if let Some(query) = query {
            request = request.query("query", query);
        }
        let body = request
            .call()
            .and_then(|mut r| r.body_mut().read_to_string())
            .map_err(|e| format!("GET {path}: {e}"))?;
        let value: Value =
            serde_json::from_str(&body).map_err(|e| format!("GET {path}: {e}: {body}"))?;
        if value["status"] != "success" {
            return Err(format!("GET {path} {query:?}: {body}"));
        }
        Ok(value["data"].clone())
    }

    /// An instant query's result vector.
    fn query(&self, expr: &str) -> Result<Vec<Value>, String> {
        let data = self.get("/api/v1/query", Some(expr))?;
        Ok(data["result"].as_array().cloned().unwrap_or_default())
    }

    /// The active (pending or firing) alerts.
    fn alerts(&self) -> Vec<Value> {
        self.get("/api/v1/alerts", None)
            .ok()
            .and_then(|data| data["alerts"].as_array().cloned())
            .unwrap_or_default()
    }

    /// The state (`pending`, `firing`) of the refused-certificate alert for `host`, if active.
    fn refused_alert(&self, host: &str) -> Option<(String, Value)> {
        self.alerts()
            .into_iter()
            .find(|a| {
                a["labels"]["alertname"] == "PrivateIngressCertificateRefused"
                    && a["labels"]["host"] == host
            })
            .map(|a| (a["state"].as_str().unwrap_or_default().to_owned(), a))
    }
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The rules as an operator renders them, with short `for:` values.
fn rendered_rules(workspace: &Path) -> String {
    let (code, out, err) = private_ingress_tests::run(
        Command::new(private_ingress_tests::agent_bin())
            .arg("render")
            .arg(workspace)
            .args([
                "--format",
                "prometheus-rules",
                "--alert-for-scale",
                FOR_SCALE,
            ]),
    );
    assert_eq!(code, 0, "render --format prometheus-rules: {err}");
    out
}

/// Every query of the dashboard's panels, with Grafana's interval variables set as Grafana
/// would for a short range.
fn dashboard_queries() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(repo().join("deploy/grafana-dashboard.json"))
        .expect("deploy/grafana-dashboard.json");
    let dashboard: Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let mut queries = Vec::new();
    let mut panels: Vec<&Value> = dashboard["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .collect();
    while let Some(panel) = panels.pop() {
        if let Some(nested) = panel["panels"].as_array() {
            panels.extend(nested);
        }
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().expect("a PromQL target");
            let expr = expr
                .replace("$__rate_interval", "1m")
                .replace("$__interval", "1s")
                .replace("$__range", "5m");
            queries.push((panel["title"].as_str().unwrap_or("?").to_owned(), expr));
        }
    }
    queries
}

/// The agent's metric names a query reads.
fn metric_names(expr: &str) -> Vec<&str> {
    let mut names = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("private_ingress_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        names.push(&tail[..end]);
        rest = &tail[end..];
    }
    names
}

/// Runs each (panel, query); returns what failed (a query Prometheus rejects, or one that
/// returns nothing although every metric it reads is exported) and what returned nothing
/// because a metric it reads is not exported.
fn failing_queries(
    prometheus: &Prometheus,
    queries: Vec<(String, String)>,
) -> (Vec<String>, Vec<String>) {
    let mut failures = Vec::new();
    let mut unexported = Vec::new();
    for (panel, expr) in queries {
        match prometheus.query(&expr) {
            Err(e) => failures.push(format!("{panel}: {expr}: {e}")),
            Ok(result) if result.is_empty() => {
                let exported = metric_names(&expr).into_iter().all(|name| {
                    prometheus
                        .query(&format!("count({{__name__=\"{name}\"}})"))
                        .is_ok_and(|r| !r.is_empty())
                });
                if exported {
                    failures.push(format!("{panel}: {expr}: no result"));
                } else {
                    unexported.push(format!("{panel}: {expr}"));
                }
            }
            Ok(_) => {}
        }
    }
    (failures, unexported)
}

#[test]
fn a_refused_pair_fires_its_alert_in_prometheus_and_a_good_pair_resolves_it() {
    let mut stack = Stack::new();
    let backend = Backend::start("alerts-backend");
    let mut volume = Volume::new(stack.tls_dir().join(HOST));
    volume.write_good();
    // Upstream by name (`localhost`, from /etc/hosts), so that the DNS families are exported;
    // a loopback answer is a backend only when the workspace allows it.
    // sozu sends its records, so that the traffic families are exported once a request is made.
    let traffic = stack.send_traffic();
    stack.write_workspace(&stack.workspace_text_with(
        &[RouteSpec {
            host: HOST.into(),
            upstream: "localhost".into(),
            port: Some(backend.address.port()),
        }],
        &format!("  allow_special_upstream_addresses = true,\n{traffic}"),
    ));
    stack.start_sozu();
    stack.start_agent();
    stack.wait_ready(Duration::from_secs(60));
    let prometheus = Prometheus::start(stack.admin, &rendered_rules(&stack.workspace_path()));
    for path in ["/", "/status/500"] {
        https_get(stack.https, HOST, path).unwrap_or_else(|e| panic!("{path}: {e}"));
    }

    // Scraped, evaluated, quiet.
    eventually_every(
        Duration::from_millis(100),
        Duration::from_secs(30),
        "the agent scraped and ready in Prometheus",
        || {
            prometheus
                .query("private_ingress_ready{job=\"private-ingress\"} == 1")
                .ok()
                .filter(|r| r.len() == 1)
                .map(|_| ())
        },
    );
    assert_eq!(prometheus.refused_alert(HOST).map(|a| a.0), None);

    // A pair the agent refuses: pending first, firing once `for:` has passed.
    let kind = Kind::MismatchedKey;
    let written = Instant::now();
    volume.write(kind);
    let mut pending = None;
    let alert = eventually_every(
        Duration::from_millis(100),
        Duration::from_secs(60),
        "PrivateIngressCertificateRefused firing",
        || match prometheus.refused_alert(HOST) {
            Some((state, alert)) if state == "firing" => Some(alert),
            Some((state, _)) if state == "pending" => {
                pending.get_or_insert_with(|| written.elapsed());
                None
            }
            _ => None,
        },
    );
    let firing = written.elapsed();
    assert_eq!(alert["labels"]["reason"], kind.reason(), "{alert:#}");
    assert_eq!(alert["labels"]["severity"], "warning", "{alert:#}");
    assert_eq!(
        alert["annotations"]["summary"],
        format!(
            "The certificate pair on disk for {HOST} is refused ({})",
            kind.reason()
        ),
        "{alert:#}"
    );
    assert!(
        pending.is_some(),
        "the alert went to firing without being seen pending"
    );
    assert!(
        firing >= REFUSED_FOR,
        "firing {firing:?} after the bad pair, before its for: of {REFUSED_FOR:?}"
    );

    // Every dashboard query while every metric family is exported, a refusal included.
    let queries = dashboard_queries();
    assert!(queries.len() >= 10, "{queries:?}");
    let (failures, unexported) = failing_queries(&prometheus, queries);
    assert!(
        failures.is_empty(),
        "dashboard queries failed:\n{}",
        failures.join("\n")
    );
    // The route's upstream is a name and a refusal is shown: every family the dashboard reads
    // is exported, so every panel has something to show.
    assert!(
        unexported.is_empty(),
        "dashboard queries over metrics the agent does not export:\n{}",
        unexported.join("\n")
    );
    // The check itself can fail: a query Prometheus rejects, or an empty one over exported
    // metrics, is flagged; an empty one over a metric the agent does not export is not.
    let (broken, unexported) = failing_queries(
        &prometheus,
        [
            ("rejected", "sum by (host (private_ingress_ready)"),
            ("empty", "private_ingress_ready == 7"),
            ("not exported", "private_ingress_no_such_metric"),
        ]
        .map(|(p, q)| (p.to_owned(), q.to_owned()))
        .to_vec(),
    );
    assert_eq!(broken.len(), 2, "{broken:?}");
    assert!(broken[0].starts_with("rejected: "), "{broken:?}");
    assert!(broken[1].starts_with("empty: "), "{broken:?}");
    assert_eq!(unexported.len(), 1, "{unexported:?}");

    // A good pair again: the alert resolves.
    let fixed = Instant::now();
    volume.write_good();
    eventually_every(
        Duration::from_millis(100),
        Duration::from_secs(30),
        "PrivateIngressCertificateRefused resolved",
        || prometheus.refused_alert(HOST).is_none().then_some(()),
    );
    let resolved = fixed.elapsed();
    eprintln!(
        "alert latency with for: {REFUSED_FOR:?}, scrape and evaluation every 1s: bad pair \
         written → pending {:?}, firing {firing:?}; good pair written → resolved {resolved:?}",
        pending.unwrap_or_default()
    );
}

/// A route whose backend answers 5xx fires the error-ratio alert in Prometheus, named by route
/// and host; a route beside it that answers 200 does not.
#[test]
fn a_failing_route_fires_the_error_ratio_alert_and_a_healthy_one_does_not() {
    const FAILING: &str = "failing.in.example.org";
    const HEALTHY: &str = "healthy.in.example.org";
    let mut stack = Stack::new();
    let backend = Backend::start("traffic-backend");
    certificate(&stack.tls_dir(), FAILING);
    certificate(&stack.tls_dir(), HEALTHY);
    let traffic = stack.send_traffic();
    let route = |host: &str| RouteSpec {
        host: host.into(),
        upstream: backend.address.ip().to_string(),
        port: Some(backend.address.port()),
    };
    stack.write_workspace(&stack.workspace_text_with(&[route(FAILING), route(HEALTHY)], &traffic));
    stack.start_sozu();
    stack.start_agent();
    stack.wait_ready(Duration::from_secs(60));
    let prometheus = Prometheus::start(stack.admin, &rendered_rules(&stack.workspace_path()));

    // Requests keep coming, as they would from users: one in four fails on the failing route.
    // Kept-alive connections, ten requests a second a route: enough for the alert's floor, and
    // no TLS handshake per request to take the machine from the other tests.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let https = stack.https;
    let load = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut connections: [Option<KeepAlive>; 2] = [None, None];
            let mut i = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let failing = if i.is_multiple_of(4) {
                    "/status/503"
                } else {
                    "/"
                };
                for (slot, (host, path)) in connections
                    .iter_mut()
                    .zip([(FAILING, failing), (HEALTHY, "/")])
                {
                    if slot.is_none() {
                        *slot = KeepAlive::connect(https, host).ok();
                    }
                    if let Some(c) = slot {
                        if c.get(path).is_err() {
                            *slot = None;
                        }
                    }
                }
                i += 1;
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    let alert_for = |host: &str| {
        prometheus.alerts().into_iter().find(|a| {
            a["labels"]["alertname"] == "PrivateIngressRouteErrorRatioHigh"
                && a["labels"]["host"] == host
        })
    };
    let alert = eventually_every(
        Duration::from_millis(200),
        Duration::from_secs(120),
        "PrivateIngressRouteErrorRatioHigh firing for the failing route",
        || alert_for(FAILING).filter(|a| a["state"] == "firing"),
    );
    assert_eq!(
        alert["labels"]["route"],
        format!("pi-{FAILING}"),
        "{alert:#}"
    );
    assert!(alert_for(HEALTHY).is_none(), "{:#?}", prometheus.alerts());
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = load.join();
}
