//! The alert rules and the dashboard as an operator gets them: `render --format
//! prometheus-rules` passes `promtool check rules`, every alert fires and stays silent when it
//! should in `promtool test rules` (tests/fixtures/alerts.test.yaml), each has its runbook
//! section in docs/operations.md, and `render --format k8s` wraps the same rules in a
//! PrometheusRule that passes `kubernetes-validate --strict` against prometheus-operator's CRD
//! schema (tests/fixtures/monitoring.coreos.com_prometheusrules.yaml), beside the dashboard's
//! ConfigMap.
//!
//! `promtool` (Debian's prometheus) and `kubernetes-validate` are installed by `scripts/test`; a
//! test that cannot find one fails and says so.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::{assert_golden, bin, run};

use serde::Deserialize;
use serde_json::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn render(workspace: &Path, args: &[&str]) -> String {
    let (code, out, err) = run(bin().arg("render").arg(workspace).args(args));
    assert_eq!(code, 0, "render {args:?} failed: {err}");
    out
}

fn rules(args: &[&str]) -> String {
    let mut all = vec!["--format", "prometheus-rules"];
    all.extend_from_slice(args);
    render(&repo().join("deploy/librecloud.ncl"), &all)
}

/// The alert names of a rules file.
fn alert_names(yaml: &str) -> Vec<String> {
    let file: Value = serde_norway::from_str(yaml).expect("the rules file parses");
    file["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("rules").iter())
        .map(|r| r["alert"].as_str().expect("an alerting rule").to_owned())
        .collect()
}

fn promtool(args: &[&str], dir: &Path) -> (i32, String) {
    let (code, out, err) = run(Command::new("promtool").args(args).current_dir(dir));
    (code, format!("{out}{err}"))
}

#[test]
fn the_rendered_rules_are_the_ones_shipped_in_deploy() {
    assert_golden(
        &repo().join("deploy/prometheus-rules.yaml"),
        &rules(&[]),
        "prometheus-rules",
    );
}

#[test]
fn the_rules_pass_promtool_check_rules() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("rules.yaml"), rules(&[])).unwrap();
    let (code, out) = promtool(&["check", "rules", "rules.yaml"], dir.path());
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("SUCCESS: 15 rules found"), "{out}");
}

/// Each alert fires when it should and stays silent when it should not, on synthetic series,
/// with the production `for:` values.
#[test]
fn every_alert_fires_and_stays_silent_in_promtool_unit_tests() {
    let dir = tempfile::tempdir().unwrap();
    let rules = rules(&[]);
    std::fs::write(dir.path().join("rules.yaml"), &rules).unwrap();
    let tests = std::fs::read_to_string(fixture("alerts.test.yaml")).unwrap();
    for alert in alert_names(&rules) {
        assert!(
            tests.contains(&format!("alertname: {alert}\n")),
            "{alert} has no promtool unit test"
        );
    }
    std::fs::write(dir.path().join("alerts.test.yaml"), tests).unwrap();
    let (code, out) = promtool(&["test", "rules", "alerts.test.yaml"], dir.path());
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("SUCCESS"), "{out}");
}

/// The unit tests can fail: an alert whose grace period is cut short fires where a test
/// expects silence.
#[test]
fn the_promtool_unit_tests_catch_a_changed_grace_period() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("rules.yaml"),
        rules(&["--alert-for-scale", "0.5"]),
    )
    .unwrap();
    std::fs::copy(
        fixture("alerts.test.yaml"),
        dir.path().join("alerts.test.yaml"),
    )
    .unwrap();
    let (code, out) = promtool(&["test", "rules", "alerts.test.yaml"], dir.path());
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("PrivateIngressCertificateRefused"), "{out}");
}

#[test]
fn the_for_scale_shortens_every_for_to_whole_seconds() {
    let fast = rules(&["--alert-for-scale", "0.01"]);
    let fors: Vec<&str> = fast
        .lines()
        .filter_map(|l| l.trim().strip_prefix("for: "))
        .collect();
    assert_eq!(
        fors,
        [
            "9s", "6s", "6s", "9s", "9s", "3s", "6s", "9s", "9s", "6s", "6s", "3s", "6s", "6s",
            "6s"
        ],
        "{fast}"
    );
    let (code, _, err) = run(bin()
        .arg("render")
        .arg(repo().join("deploy/librecloud.ncl"))
        .args(["--format", "prometheus-rules", "--alert-for-scale", "0"]));
    assert_eq!(code, 2, "{err}");
}

/// docs/operations.md has a runbook section per alert, and none for an alert that does not
/// exist.
#[test]
fn every_alert_has_a_runbook_section() {
    let docs = std::fs::read_to_string(repo().join("docs/operations.md")).unwrap();
    let documented: Vec<String> = docs
        .lines()
        .filter_map(|l| l.strip_prefix("### "))
        .filter(|h| h.starts_with("PrivateIngress"))
        .map(str::to_owned)
        .collect();
    assert_eq!(documented, alert_names(&rules(&[])));
}

/// A workspace asking for the PrometheusRule and the dashboard.
fn monitored_k8s() -> Vec<Value> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("workspace.ncl");
    std::fs::write(
        &path,
        r#"{
  zone = "in.librecloud.online",
  cluster_issuer = "librecloud-ca",
  listeners = { https = "[::]:8443", http = "[::]:8080" },
  allowed_sources = ["10.8.0.0/16"],
  deploy = { namespace = "edge", service_monitor = true, prometheus_rule = true, grafana_dashboard = true },
  deploy.sozu_image = "registry.example/sozu:2.3.3@sha256:1111111111111111111111111111111111111111111111111111111111111111",
  deploy.agent_image = "registry.example/private-ingress:0.1.0@sha256:2222222222222222222222222222222222222222222222222222222222222222",
  routes = [
    { host = "grafana.in.librecloud.online", upstream = "grafana.observability.svc.libre-wuji.local", port = 3000 },
  ],
}
"#,
    )
    .unwrap();
    let yaml = render(&path, &["--format", "k8s"]);
    serde_norway::Deserializer::from_str(&yaml)
        .map(|doc| Value::deserialize(doc).expect("rendered YAML parses"))
        .collect()
}

fn only<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    let found: Vec<&Value> = docs.iter().filter(|d| d["kind"] == kind).collect();
    assert_eq!(found.len(), 1, "{kind}");
    found[0]
}

/// Runs kubernetes-validate's own command line with the custom resources' schemas taken from
/// their CRDs (it bundles Kubernetes' schemas only): each CRD version's openAPIV3Schema, made
/// strict the way its bundled strict schemas are (no property beyond those declared).
fn kubernetes_validate_with_crds(yaml: &str, crds: &[PathBuf]) -> Result<String, String> {
    const DRIVER: &str = r#"
import sys, yaml
import kubernetes_validate.utils as utils
from kubernetes_validate.__main__ import main

def strict(node):
    if isinstance(node, dict):
        if "properties" in node and "additionalProperties" not in node:
            node["additionalProperties"] = False
        for value in node.values():
            strict(value)
    elif isinstance(node, list):
        for value in node:
            strict(value)
    return node

crds, args = [p for p in sys.argv[1].split(",") if p], sys.argv[2:]
schemas = {}
for path in crds:
    with open(path) as f:
        crd = yaml.safe_load(f)
    group = crd["spec"]["group"].split(".")[0]
    kind = crd["spec"]["names"]["kind"].lower()
    for version in crd["spec"]["versions"]:
        schema = version["schema"]["openAPIV3Schema"]
        # What the bundled schemas carry: the draft they follow and an id to register them by.
        schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
        schema["$id"] = f"https://{crd['spec']['group']}/{kind}/{version['name']}"
        schemas[f"{kind}-{group}-{version['name']}.json"] = strict(schema) if "--strict" in args else schema

bundled = utils.schema_contents
def schema_contents(filename, desired_version):
    name = filename.rsplit("/", 1)[-1]
    return schemas[name] if name in schemas else bundled(filename, desired_version)
utils.schema_contents = schema_contents
sys.argv = ["kubernetes-validate"] + args
sys.exit(main())
"#;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("manifests.yaml");
    std::fs::write(&path, yaml).unwrap();
    let crds: Vec<String> = crds.iter().map(|p| p.display().to_string()).collect();
    let (code, out, err) = run(Command::new("python3")
        .args(["-c", DRIVER, &crds.join(",")])
        .args(["--strict", "-k", "1.35"])
        .arg(&path));
    if code != 0 || out.contains("WARN") {
        return Err(format!("{out}{err}"));
    }
    Ok(out)
}

#[test]
fn the_prometheus_rule_passes_kubernetes_validate_strict_with_its_crd() {
    let docs = monitored_k8s();
    let rule = only(&docs, "PrometheusRule");
    assert_eq!(rule["metadata"]["namespace"], "edge");
    // The same rules as the plain rules file.
    let file: Value = serde_norway::from_str(&rules(&[])).unwrap();
    assert_eq!(rule["spec"], file);

    let crd = fixture("monitoring.coreos.com_prometheusrules.yaml");
    let yaml = serde_norway::to_string(rule).unwrap();
    let out = kubernetes_validate_with_crds(&yaml, std::slice::from_ref(&crd))
        .unwrap_or_else(|report| panic!("{report}\n{yaml}"));
    assert!(
        out.contains("passed for resource prometheusrule/private-ingress"),
        "{out}"
    );

    // Strict for real: a misspelt field of a rule is refused.
    let mut misspelt = rule.clone();
    misspelt["spec"]["groups"][0]["rules"][0]["alret"] = Value::from("x");
    let misspelt = serde_norway::to_string(&misspelt).unwrap();
    let report =
        kubernetes_validate_with_crds(&misspelt, &[crd]).expect_err("a misspelt field passed");
    assert!(report.contains("alret"), "{report}");
}

#[test]
fn the_dashboard_configmap_holds_the_shipped_dashboard_for_grafanas_sidecar() {
    let docs = monitored_k8s();
    let maps: Vec<&Value> = docs
        .iter()
        .filter(|d| {
            d["kind"] == "ConfigMap" && d["metadata"]["name"] == "private-ingress-dashboard"
        })
        .collect();
    assert_eq!(maps.len(), 1);
    let map = maps[0];
    assert_eq!(map["metadata"]["labels"]["grafana_dashboard"], "1");
    let shipped = std::fs::read_to_string(repo().join("deploy/grafana-dashboard.json")).unwrap();
    assert_eq!(map["data"]["private-ingress.json"], shipped.as_str());
    let dashboard: Value = serde_json::from_str(&shipped).expect("the dashboard is JSON");
    assert_eq!(dashboard["uid"], "private-ingress");
    let yaml = serde_norway::to_string(map).unwrap();
    kubernetes_validate_with_crds(&yaml, &[]).unwrap_or_else(|report| panic!("{report}"));

    // Neither without being asked for.
    let plain = render(&repo().join("deploy/librecloud.ncl"), &["--format", "k8s"]);
    assert!(!plain.contains("PrometheusRule"));
    assert!(!plain.contains("grafana_dashboard"));
}
