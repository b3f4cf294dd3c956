//! `render --format k8s` and `--format dns` as an operator uses them: the manifests pass the
//! schemas of Kubernetes 1.35 (the oldest release still supported), every route host gets its certificate volume, mount and DNS record,
//! appending a route changes nothing else, and the justfile recipes run.
//!
//! The external checkers (`kubernetes-validate`, dnspython, `just`) are installed by
//! `scripts/test`; a test that cannot find one fails and says how to install it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::{assert_golden, bin, run};

use serde::Deserialize;
use serde_json::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The reference workspace as deployed: `schema/examples/librecloud.ncl` plus `lb_ip`.
fn reference() -> PathBuf {
    repo().join("deploy/librecloud.ncl")
}

fn render(workspace: &Path, format: &str) -> String {
    render_with(workspace, format, &[])
}

fn render_with(workspace: &Path, format: &str, extra: &[&str]) -> String {
    let (code, out, err) = run(bin()
        .arg("render")
        .arg(workspace)
        .args(["--format", format])
        .args(extra));
    assert_eq!(code, 0, "render --format {format} failed: {err}");
    out
}

/// A workspace in `root/conf/` that imports `root/shared/routes.ncl`: readable with
/// `--workspace-root root` only.
fn deeper_workspace(root: &Path) -> PathBuf {
    std::fs::create_dir_all(root.join("conf")).unwrap();
    std::fs::create_dir_all(root.join("shared")).unwrap();
    std::fs::write(
        root.join("shared/routes.ncl"),
        "[{ host = \"grafana.in.example.org\", upstream = \"10.0.0.12\", port = 3001 }]\n",
    )
    .unwrap();
    let workspace = root.join("conf/workspace.ncl");
    std::fs::write(
        &workspace,
        format!(
            "{{\n  zone = \"in.example.org\",\n  cluster_issuer = \"internal-ca\",\n  \
             allowed_sources = [\"10.8.0.0/16\"],\n  \
             listeners = {{ https = \"[::]:8443\", http = \"[::]:8080\" }},\n{IMAGES}  \
             routes = import \"../shared/routes.ncl\",\n}}\n"
        ),
    )
    .unwrap();
    workspace
}

/// Every document of a multi-document YAML stream.
fn documents(yaml: &str) -> Vec<Value> {
    serde_norway::Deserializer::from_str(yaml)
        .map(|doc| Value::deserialize(doc).expect("rendered YAML parses"))
        .collect()
}

fn find<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

/// The pod template of the one workload: a Deployment, or with `'sozu_managed` a StatefulSet.
fn pod_spec(docs: &[Value]) -> &Value {
    let mut workloads = find(docs, "Deployment");
    workloads.extend(find(docs, "StatefulSet"));
    assert_eq!(workloads.len(), 1);
    &workloads[0]["spec"]["template"]["spec"]
}

fn container<'a>(docs: &'a [Value], list: &str, name: &str) -> &'a Value {
    pod_spec(docs)[list]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no {name} in {list}"))
}

/// The images a test workspace names unless it names its own: pinned, as `render` wants them.
const IMAGES: &str = "  deploy.sozu_image = \"registry.example/sozu:2.3.3@sha256:1111111111111111111111111111111111111111111111111111111111111111\",\n  deploy.agent_image = \"registry.example/private-ingress:0.1.0@sha256:2222222222222222222222222222222222222222222222222222222222222222\",\n";

/// A workspace in a temporary directory, one route per line so that a route is one line of the
/// ConfigMap (indented by 8: 4 in the file, 4 in the YAML block). It names the [`IMAGES`]
/// unless `fields` names images of its own (Nickel merges the two `deploy` definitions).
fn workspace_file(dir: &Path, name: &str, fields: &str, routes: &[&str]) -> PathBuf {
    let routes: String = routes.iter().map(|r| format!("    {r},\n")).collect();
    let images = if fields.contains("_image") {
        ""
    } else {
        IMAGES
    };
    let text = format!(
        "{{\n  zone = \"in.librecloud.online\",\n  cluster_issuer = \"librecloud-ca\",\n{images}{fields}  routes = [\n{routes}  ],\n}}\n"
    );
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// The documents `render --format k8s` writes for a workspace of `fields` and `routes`.
fn k8s_of(fields: &str, routes: &[&str]) -> Vec<Value> {
    let dir = tempfile::tempdir().unwrap();
    let workspace = workspace_file(dir.path(), "workspace.ncl", fields, routes);
    documents(&render(&workspace, "k8s"))
}

const GRAFANA: &str = r#"{ host = "grafana.in.librecloud.online", upstream = "grafana.observability.svc.libre-wuji.local", port = 3000 }"#;
const PROMETHEUS: &str = r#"{ host = "prometheus.in.librecloud.online", upstream = "prometheus.observability.svc.libre-wuji.local", port = 9090 }"#;
const ALERTMANAGER: &str = r#"{ host = "alertmanager.in.librecloud.online", upstream = "alertmanager.observability.svc.libre-wuji.local", port = 9093 }"#;

#[test]
fn the_reference_workspace_renders_to_its_golden_files() {
    for (format, golden) in [("k8s", "librecloud.k8s.yaml"), ("dns", "librecloud.zone")] {
        let out = render(&reference(), format);
        assert_golden(
            &repo().join("schema/examples/rendered").join(golden),
            &out,
            format,
        );
    }
}

/// The Kubernetes release the manifests are validated against: the oldest still supported. It
/// has everything the pod uses (native sidecars, 1.29; the preStop sleep action, GA in 1.34).
const KUBERNETES: &str = "1.35";

/// Runs `kubernetes-validate --strict -k 1.35` and returns the kinds it passed. Custom resources
/// (cert-manager's Certificate, the ServiceMonitor) have no bundled schema and are only warned
/// about, so the test checks their shape itself.
fn kubernetes_validate(yaml: &str) -> Result<Vec<String>, String> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("manifests.yaml");
    std::fs::write(&path, yaml).unwrap();
    let (code, out, err) = run(Command::new("kubernetes-validate")
        .args(["--strict", "-k", KUBERNETES])
        .arg(&path));
    if code != 0 {
        return Err(format!("{out}{err}"));
    }
    Ok(out
        .lines()
        .filter_map(|l| l.split(" passed for resource ").nth(1))
        .filter_map(|r| r.split('/').next())
        .map(str::to_owned)
        .collect())
}

#[test]
fn every_rendered_manifest_passes_kubernetes_validate_strict() {
    let dir = tempfile::tempdir().unwrap();
    let monitored = workspace_file(
        dir.path(),
        "monitored.ncl",
        "  lb_ip = \"fd00::6\",\n  allowed_sources = [\"fd00:8::/32\", \"10.8.0.0/16\"],\n  listeners = { https = \"[::]:8443\", http = \"[::]:8080\" },\n  deploy = { service_monitor = true, prometheus_rule = true, grafana_dashboard = true, replicas = 1, namespace = \"edge\", pre_stop_seconds = 0, monitoring = { namespace = \"observability\", pod_labels = { \"app.kubernetes.io/name\" = \"prometheus\" } } },\n",
        &[GRAFANA, PROMETHEUS],
    );
    for workspace in [
        reference(),
        repo().join("schema/examples/modular/workspace.ncl"),
        monitored,
    ] {
        let yaml = render(&workspace, "k8s");
        let docs = documents(&yaml);
        let passed = kubernetes_validate(&yaml)
            .unwrap_or_else(|report| panic!("{}:\n{report}", workspace.display()));
        // Custom resources are the ones whose API group is a domain name outside Kubernetes'
        // own (`networking.k8s.io` is built in).
        let custom = |d: &&Value| {
            let api = d["apiVersion"].as_str().unwrap();
            api.contains('.') && !api.contains(".k8s.io/")
        };
        let core: Vec<String> = docs
            .iter()
            .filter(|d| !custom(d))
            .map(|d| d["kind"].as_str().unwrap().to_lowercase())
            .collect();
        assert_eq!(passed, core, "{}", workspace.display());
        assert_service_ports_are_unique(&docs);
        for resource in docs.iter().filter(custom) {
            assert_eq!(
                resource["metadata"]["namespace"],
                docs[0]["metadata"]["name"]
            );
            assert!(resource["spec"].is_object(), "{resource}");
        }
    }
}

/// What the API server checks of a Service's ports and kubernetes-validate does not: each
/// (port, protocol) once, each name once.
fn assert_service_ports_are_unique(docs: &[Value]) {
    for service in find(docs, "Service") {
        let mut seen = std::collections::BTreeSet::new();
        let mut names = std::collections::BTreeSet::new();
        for port in service["spec"]["ports"].as_array().unwrap() {
            let key = format!("{}/{}", port["port"], port["protocol"].as_str().unwrap());
            assert!(seen.insert(key.clone()), "{key} twice in {service}");
            let name = port["name"].as_str().unwrap().to_owned();
            assert!(
                names.insert(name.clone()),
                "port name {name} twice in {service}"
            );
        }
    }
}

/// The validator is strict for real: a misspelt field in the pod is refused.
#[test]
fn kubernetes_validate_refuses_an_unknown_field() {
    let yaml = render(&reference(), "k8s").replace(
        "      enableServiceLinks: false\n",
        "      enableServiceLinks: false\n      hostNetwrok: true\n",
    );
    let report = kubernetes_validate(&yaml).expect_err("a misspelt field passed");
    assert!(report.contains("hostNetwrok"), "{report}");
}

#[test]
fn one_csi_volume_and_one_mount_per_route_host() {
    let yaml = render(&reference(), "k8s");
    let docs = documents(&yaml);
    let spec = pod_spec(&docs);
    let csi: Vec<&Value> = spec["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| v.get("csi").is_some())
        .collect();
    let hosts = [
        "git.in.librecloud.online",
        "grafana.in.librecloud.online",
        "longhorn.in.librecloud.online",
        "ntfy.in.librecloud.online",
        "otlp.in.librecloud.online",
        "prometheus.in.librecloud.online",
    ];
    assert_eq!(csi.len(), hosts.len());
    let mounts: Vec<&Value> = ["initContainers", "containers"]
        .iter()
        .flat_map(|list| spec[*list].as_array().unwrap())
        .flat_map(|c| c["volumeMounts"].as_array().unwrap())
        .collect();
    for (volume, host) in csi.iter().zip(hosts) {
        let attributes = &volume["csi"]["volumeAttributes"];
        assert_eq!(volume["csi"]["driver"], "csi.cert-manager.io");
        assert_eq!(volume["csi"]["readOnly"], true);
        assert_eq!(attributes["csi.cert-manager.io/dns-names"], host);
        assert_eq!(
            attributes["csi.cert-manager.io/issuer-name"],
            "librecloud-ca"
        );
        assert_eq!(
            attributes["csi.cert-manager.io/issuer-kind"],
            "ClusterIssuer"
        );
        assert_eq!(
            attributes["csi.cert-manager.io/fs-group"],
            spec["securityContext"]["fsGroup"].to_string(),
            "the files are readable by the pod's group"
        );
        let at: Vec<&Value> = mounts
            .iter()
            .copied()
            .filter(|m| m["name"] == volume["name"])
            .collect();
        assert_eq!(at.len(), 1, "{host} is mounted once");
        assert_eq!(at[0]["mountPath"], format!("/etc/sozu/tls/{host}"));
        assert_eq!(at[0]["readOnly"], true);
    }
    let agent = container(&docs, "initContainers", "agent");
    assert_eq!(
        agent["volumeMounts"].as_array().unwrap().len(),
        3 + hosts.len()
    );
}

#[test]
fn reloader_mode_has_a_certificate_and_a_secret_volume_per_host() {
    let yaml = render(&repo().join("schema/examples/modular/workspace.ncl"), "k8s");
    let docs = documents(&yaml);
    let certificates = find(&docs, "Certificate");
    let hosts = [
        "grafana.in.example.org",
        "in.example.org",
        "metrics.in.example.org",
    ];
    assert_eq!(
        certificates.len(),
        hosts.len(),
        "two routes share grafana's host"
    );
    let volumes = pod_spec(&docs)["volumes"].as_array().unwrap();
    assert!(volumes.iter().all(|v| v.get("csi").is_none()));
    for (certificate, host) in certificates.iter().zip(hosts) {
        assert_eq!(certificate["spec"]["dnsNames"], serde_json::json!([host]));
        assert_eq!(certificate["spec"]["issuerRef"]["name"], "internal-ca");
        assert_eq!(certificate["spec"]["issuerRef"]["kind"], "ClusterIssuer");
        let secret = &certificate["spec"]["secretName"];
        let volume = volumes
            .iter()
            .find(|v| &v["secret"]["secretName"] == secret)
            .unwrap_or_else(|| panic!("no volume for {secret}"));
        let agent = container(&docs, "initContainers", "agent");
        let mount = agent["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == volume["name"])
            .unwrap();
        assert_eq!(mount["mountPath"], format!("/etc/sozu/tls/{host}"));
    }
    // Imports travel with the workspace, at their relative paths.
    let keys = |docs: &[Value]| -> Vec<String> {
        find(docs, "ConfigMap")[0]["data"]
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect()
    };
    assert_eq!(keys(&docs), ["routes.ncl", "sozu.toml", "workspace.ncl"]);
    assert_eq!(
        find(&docs, "ConfigMap")[0]["data"]["routes.ncl"],
        std::fs::read_to_string(repo().join("schema/examples/modular/routes.ncl")).unwrap()
    );
    // A workspace deeper in its root: its imports at their paths under the root, and an entry
    // at the volume's root that imports it.
    let dir = tempfile::tempdir().unwrap();
    let deeper = deeper_workspace(dir.path());
    let root = dir.path().display().to_string();
    let docs = documents(&render_with(&deeper, "k8s", &["--workspace-root", &root]));
    assert_eq!(
        keys(&docs),
        [
            "conf--workspace.ncl",
            "private-ingress-workspace.ncl",
            "shared--routes.ncl",
            "sozu.toml",
        ]
    );
}

/// `render` ships the files the evaluation may read, and no other: an import out of the
/// workspace's directory fails the render as it fails `check`, and nothing is copied.
#[test]
fn render_refuses_to_ship_a_file_from_outside_the_workspace_tree() {
    let dir = tempfile::tempdir().unwrap();
    let deeper = deeper_workspace(dir.path());
    std::fs::write(dir.path().join("secret"), "s3cret-value\n").unwrap();
    let (code, out, err) = run(bin().arg("render").arg(&deeper).args(["--format", "k8s"]));
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.is_empty(), "{out}");
    assert!(
        err.contains("import outside the workspace's directory"),
        "{err}"
    );
    assert!(err.contains("workspace.ncl:8:"), "{err}");
    // An absolute import of a secret is refused before anything reads it.
    std::fs::write(
        &deeper,
        format!(
            "{{ zone = \"in.example.org\", cluster_issuer = import \"{}\" as 'Text, routes = [] }}\n",
            dir.path().join("secret").display()
        ),
    )
    .unwrap();
    for format in ["k8s", "json"] {
        let (code, out, err) = run(bin().arg("render").arg(&deeper).args(["--format", format]));
        assert_eq!(code, 1, "{out}{err}");
        assert!(
            !out.contains("s3cret") && !err.contains("s3cret"),
            "{out}{err}"
        );
        assert!(err.contains("is an absolute path"), "{err}");
    }
}

/// `tls_rotation = 'sozu_managed`: no certificate volume per host, a memory-backed tls dir the
/// agent fills, and a StatefulSet of two replicas, each with its ACME state on a claim of its
/// own, rolled one replica at a time, spread over nodes, named by a headless Service; the
/// credentials from the Secret `private-ingress-acme` mounted as the files the workspace names.
/// Appending a route adds no volume, and `--format dns` is the same as in other modes.
#[test]
fn sozu_managed_mode_has_a_memory_tls_dir_a_state_claim_and_the_credentials_as_files() {
    let dir = tempfile::tempdir().unwrap();
    let acme = "  lb_ip = \"10.200.3.6\",\n  listeners = { https = \"0.0.0.0:8443\", http = \"0.0.0.0:8080\" },\n  \
        tls_rotation = 'sozu_managed,\n  acme = {\n    ca_bundle = \"/etc/acme-ca/roots.pem\",\n    \
        eab = { kid = \"kid-1\", hmac_key_file = \"/run/secrets/acme/eab\" },\n    \
        dns01 = { provider = 'rfc2136, server = \"10.0.0.53\", zone = \"in.librecloud.online\", \
        tsig_key_name = \"acme-key\", tsig_secret_file = \"/run/secrets/acme/tsig\" },\n    \
        state_dir = \"/var/lib/acme\",\n  },\n";
    let workspace = workspace_file(dir.path(), "managed.ncl", acme, &[GRAFANA, PROMETHEUS]);
    let yaml = render(&workspace, "k8s");
    let docs = documents(&yaml);
    let passed = kubernetes_validate(&yaml).unwrap_or_else(|report| panic!("{report}"));
    assert!(passed.contains(&"statefulset".to_owned()), "{passed:?}");
    assert!(find(&docs, "Certificate").is_empty());
    assert!(find(&docs, "Deployment").is_empty());
    // No claim of its own: each replica's comes from the template.
    assert!(find(&docs, "PersistentVolumeClaim").is_empty());

    let set = find(&docs, "StatefulSet")[0];
    assert_eq!(set["spec"]["replicas"], 2, "two replicas by default");
    assert_eq!(set["spec"]["podManagementPolicy"], "Parallel");
    assert_eq!(
        set["spec"]["updateStrategy"],
        serde_json::json!({ "type": "RollingUpdate", "rollingUpdate": { "maxUnavailable": 1 } })
    );
    assert_eq!(set["spec"]["minReadySeconds"], 10, "the preStop wait");
    let claims = set["spec"]["volumeClaimTemplates"].as_array().unwrap();
    assert_eq!(claims.len(), 1);
    let claim = &claims[0];
    assert_eq!(
        claim["spec"]["accessModes"],
        serde_json::json!(["ReadWriteOnce"])
    );
    assert_eq!(
        set["spec"]["persistentVolumeClaimRetentionPolicy"],
        serde_json::json!({ "whenDeleted": "Retain", "whenScaled": "Retain" })
    );
    let governing = find(&docs, "Service")
        .into_iter()
        .find(|s| s["metadata"]["name"] == set["spec"]["serviceName"])
        .expect("the StatefulSet's governing Service");
    assert_eq!(governing["spec"]["clusterIP"], "None");
    let spread = &pod_spec(&docs)["topologySpreadConstraints"][0];
    assert_eq!(spread["whenUnsatisfiable"], "DoNotSchedule");
    assert!(
        spread.get("matchLabelKeys").is_none(),
        "spread against the replicas that stay: {spread}"
    );
    assert_eq!(
        find(&docs, "PodDisruptionBudget")[0]["spec"]["maxUnavailable"],
        1
    );

    let volumes = pod_spec(&docs)["volumes"].as_array().unwrap().clone();
    assert!(
        volumes.iter().all(|v| v.get("csi").is_none()),
        "no CSI volume"
    );
    let agent = container(&docs, "initContainers", "agent");
    let mounts = agent["volumeMounts"].as_array().unwrap();
    let mounted = |path: &str| {
        let mount = mounts
            .iter()
            .find(|m| m["mountPath"] == path)
            .unwrap_or_else(|| panic!("nothing mounted at {path}"));
        let volume = volumes
            .iter()
            .find(|v| v["name"] == mount["name"])
            .cloned()
            .unwrap_or(Value::Null);
        (mount.clone(), volume)
    };
    let (tls_mount, tls) = mounted("/etc/sozu/tls");
    assert_eq!(tls["emptyDir"]["medium"], "Memory");
    assert!(
        tls_mount.get("readOnly").is_none(),
        "the agent writes the tls dir"
    );
    assert!(mounts.iter().all(|m| !m["mountPath"]
        .as_str()
        .unwrap()
        .starts_with("/etc/sozu/tls/")));
    let (state_mount, state) = mounted("/var/lib/acme");
    assert_eq!(state, Value::Null, "not a volume of the pod: {state}");
    assert_eq!(state_mount["name"], claim["metadata"]["name"]);
    // `just install-private-ingress` waits for the StatefulSet's rollout, and switching from a
    // Deployment prunes it.
    let (code, stdout, err) = just_with(
        &dir.path().join("out"),
        Some(&workspace),
        &["install-private-ingress", "update"],
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        stdout.contains("rollout status statefulset/private-ingress")
            && stdout.contains("--prune-allowlist=apps/v1/Deployment"),
        "{stdout}"
    );
    let (secrets_mount, secrets) = mounted("/run/secrets/acme");
    assert_eq!(secrets_mount["readOnly"], true);
    assert_eq!(secrets["secret"]["secretName"], "private-ingress-acme");
    assert_eq!(
        secrets["secret"]["items"],
        serde_json::json!([{ "key": "tsig-secret", "path": "tsig" }, { "key": "eab-hmac-key", "path": "eab" }])
    );
    let (_, bundle) = mounted("/etc/acme-ca");
    assert_eq!(
        bundle["secret"]["items"],
        serde_json::json!([{ "key": "ca-bundle", "path": "roots.pem" }])
    );

    // The NetworkPolicy lets the agent reach the ACME directory and Cloudflare (HTTPS to any
    // address); DNS (port 53) is allowed in every mode.
    let policy = find(&docs, "NetworkPolicy")[0];
    let egress_ports: Vec<(u64, String)> = policy["spec"]["egress"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|rule| rule.get("to").is_none())
        .flat_map(|rule| rule["ports"].as_array().cloned().unwrap_or_default())
        .map(|p| {
            (
                p["port"].as_u64().unwrap_or(0),
                p["protocol"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    for wanted in [(443, "TCP"), (53, "UDP"), (53, "TCP")] {
        assert!(
            egress_ports.contains(&(wanted.0, wanted.1.to_owned())),
            "{wanted:?} allowed out: {egress_ports:?}"
        );
    }
    // The DNS server it updates, by its address.
    let to_server = policy["spec"]["egress"]
        .as_array()
        .unwrap()
        .iter()
        .find(|rule| rule["to"] == serde_json::json!([{ "ipBlock": { "cidr": "10.0.0.53/32" } }]))
        .expect("a rule for the dns01 server");
    assert_eq!(ports(to_server), ["53/UDP", "53/TCP"]);
    // With the propagation check's servers named, port 53 goes to them and to the cluster's
    // DNS alone, not to any address.
    let named = workspace_file(
        dir.path(),
        "named.ncl",
        &acme.replace(
            "    state_dir =",
            "    propagation = { nameservers = [\"192.0.2.53:5353\"] },\n    state_dir =",
        ),
        &[GRAFANA],
    );
    let docs = documents(&render(&named, "k8s"));
    let egress = network_policy(&docs)["egress"].as_array().unwrap().clone();
    let anywhere: Vec<String> = egress
        .iter()
        .filter(|rule| rule.get("to").is_none())
        .flat_map(ports)
        .collect();
    assert!(
        !anywhere.iter().any(|p| p.starts_with("53/")),
        "{anywhere:?}"
    );
    let to_nameserver = egress
        .iter()
        .find(|rule| rule["to"] == serde_json::json!([{ "ipBlock": { "cidr": "192.0.2.53/32" } }]))
        .expect("a rule for the propagation nameserver");
    assert_eq!(ports(to_nameserver), ["5353/UDP", "5353/TCP"]);

    // A new route: the workspace changes, the pod's volumes do not.
    let appended = workspace_file(
        dir.path(),
        "managed.ncl",
        acme,
        &[GRAFANA, PROMETHEUS, ALERTMANAGER],
    );
    let docs_after = documents(&render(&appended, "k8s"));
    let names = |v: &[Value]| v.iter().map(|v| v["name"].clone()).collect::<Vec<_>>();
    let volumes_after = pod_spec(&docs_after)["volumes"].as_array().unwrap().clone();
    assert_eq!(names(&volumes_after[4..]), names(&volumes[4..]));

    // The DNS records are those of any mode.
    let csi = workspace_file(
        dir.path(),
        "csi.ncl",
        "  lb_ip = \"10.200.3.6\",\n",
        &[GRAFANA, PROMETHEUS, ALERTMANAGER],
    );
    assert_eq!(render(&appended, "dns"), render(&csi, "dns"));
}

/// The ConfigMap, laid out the way the kubelet mounts it, is a workspace the agent can load: the
/// file it is given checks, with every route.
#[test]
fn the_mounted_configmap_is_the_same_workspace() {
    let deeper = tempfile::tempdir().unwrap();
    for (workspace, summary) in [
        (reference(), "7 routes in zone in.librecloud.online"),
        (
            repo().join("schema/examples/modular/workspace.ncl"),
            "4 routes in zone in.example.org, tls_rotation reloader",
        ),
        (
            deeper_workspace(deeper.path()),
            "1 route in zone in.example.org",
        ),
    ] {
        let root = deeper.path().display().to_string();
        let extra: &[&str] = if workspace.starts_with(deeper.path()) {
            &["--workspace-root", &root]
        } else {
            &[]
        };
        let docs = documents(&render_with(&workspace, "k8s", extra));
        let data = &find(&docs, "ConfigMap")[0]["data"];
        let volume = pod_spec(&docs)["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == "workspace")
            .unwrap()
            .clone();
        let mount = tempfile::tempdir().unwrap();
        for item in volume["configMap"]["items"].as_array().unwrap() {
            let path = mount.path().join(item["path"].as_str().unwrap());
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, data[item["key"].as_str().unwrap()].as_str().unwrap()).unwrap();
        }
        let args = container(&docs, "initContainers", "agent")["args"].clone();
        assert_eq!(args[1], "--workspace");
        let entry = args[2].as_str().unwrap();
        let relative = entry
            .strip_prefix("/etc/private-ingress/workspace/")
            .unwrap();
        assert!(
            !relative.contains('/'),
            "the entry sits at the volume's root: {entry}"
        );
        let (code, out, err) = run(bin().arg("check").arg(mount.path().join(relative)));
        assert_eq!(code, 0, "{}: {err}", workspace.display());
        assert!(out.contains(summary), "{out}");
    }
}

#[test]
fn the_pod_is_restricted_and_gets_net_bind_service_only_for_a_low_port() {
    let dir = tempfile::tempdir().unwrap();
    let high = workspace_file(
        dir.path(),
        "high.ncl",
        "  listeners = { https = \"0.0.0.0:8443\", http = \"0.0.0.0:8080\" },\n",
        &[GRAFANA],
    );
    for (workspace, low) in [(reference(), true), (high, false)] {
        let docs = documents(&render(&workspace, "k8s"));
        let pod = pod_spec(&docs);
        assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
        assert_eq!(
            pod["securityContext"]["seccompProfile"]["type"],
            "RuntimeDefault"
        );
        assert_eq!(pod["automountServiceAccountToken"], false);
        for (list, name) in [("initContainers", "agent"), ("containers", "sozu")] {
            let c = container(&docs, list, name);
            let security = &c["securityContext"];
            assert_eq!(security["allowPrivilegeEscalation"], false);
            assert_eq!(security["readOnlyRootFilesystem"], true);
            assert_eq!(security["capabilities"]["drop"], serde_json::json!(["ALL"]));
            let added = security["capabilities"].get("add").cloned();
            if name == "sozu" && low {
                assert_eq!(added, Some(serde_json::json!(["NET_BIND_SERVICE"])));
            } else {
                assert_eq!(added, None, "{name} in {}", workspace.display());
            }
            assert!(c["resources"]["requests"]["memory"].is_string());
            assert!(c["resources"]["limits"]["memory"].is_string());
        }
        assert_eq!(pod["securityContext"].get("sysctls").is_some(), low);
        let service = find(&docs, "Service")[0];
        let targets: Vec<_> = service["spec"]["ports"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                (
                    p["port"].as_u64().unwrap(),
                    p["targetPort"].as_u64().unwrap(),
                )
            })
            .collect();
        // The reference's SSH route listens on 2222 of the ingress and of the pod alike.
        let expected = if low {
            vec![(80, 80), (443, 443), (2222, 2222)]
        } else {
            vec![(80, 8080), (443, 8443)]
        };
        assert_eq!(targets, expected);
    }
}

#[test]
fn the_agent_is_a_native_sidecar_probed_on_healthz_and_readyz() {
    let docs = documents(&render(&reference(), "k8s"));
    let agent = container(&docs, "initContainers", "agent");
    assert_eq!(agent["restartPolicy"], "Always");
    assert_eq!(agent["startupProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(agent["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(agent["readinessProbe"]["httpGet"]["path"], "/readyz");
    let sozu = container(&docs, "containers", "sozu");
    assert_eq!(
        sozu["image"],
        "registry.in.librecloud.online/platform/sozu:2.3.3@sha256:5d8c3bc1e36f53c2ec8a8a2d3f8ef4ad8b0b3d6a7a0c3b9d2e4f1a6c8b7e5d3f"
    );
    let shared = |c: &Value| {
        c["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == "run")
            .map(|m| m["mountPath"].clone())
    };
    assert_eq!(
        shared(agent),
        shared(sozu),
        "the control socket directory is shared"
    );
    let service = find(&docs, "Service")[0];
    assert_eq!(service["spec"]["type"], "LoadBalancer");
    assert_eq!(
        service["metadata"]["annotations"]["lbipam.cilium.io/ips"],
        "10.200.3.6"
    );
    assert_eq!(find(&docs, "PodDisruptionBudget").len(), 1);
    let annotations = &find(&docs, "Deployment")[0]["spec"]["template"]["metadata"]["annotations"];
    assert_eq!(annotations["prometheus.io/scrape"], "true");
}

#[test]
fn deploy_settings_from_the_workspace_reach_the_manifests() {
    let docs = k8s_of(
        "  deploy = { namespace = \"edge\", sozu_image = \"registry.example/sozu:2.3.3-1\", agent_image = \"registry.example/pi:7@sha256:0ea1c4d7b9e3f2a6c8d5b7e9f1a3c5e7d9b1f3a5c7e9d1b3f5a7c9e1d3b5f7a9\", replicas = 3, resources = { sozu = { limits = { memory = \"1Gi\" } } }, service_monitor = true },\n",
        &[GRAFANA],
    );
    assert!(docs
        .iter()
        .all(|d| d["kind"] == "Namespace" || d["metadata"]["namespace"] == "edge"));
    assert_eq!(find(&docs, "Deployment")[0]["spec"]["replicas"], 3);
    let sozu = container(&docs, "containers", "sozu");
    assert_eq!(sozu["image"], "registry.example/sozu:2.3.3-1");
    assert_eq!(sozu["resources"]["limits"]["memory"], "1Gi");
    assert_eq!(
        sozu["resources"]["limits"]["cpu"], "1",
        "the other defaults stay"
    );
    assert_eq!(
        container(&docs, "initContainers", "agent")["image"],
        "registry.example/pi:7@sha256:0ea1c4d7b9e3f2a6c8d5b7e9f1a3c5e7d9b1f3a5c7e9d1b3f5a7c9e1d3b5f7a9",
        "pinned by digest"
    );
    assert_eq!(find(&docs, "ServiceMonitor").len(), 1);
    let annotations = &find(&docs, "Deployment")[0]["spec"]["template"]["metadata"]["annotations"];
    assert!(
        annotations.get("prometheus.io/scrape").is_none(),
        "scraped once, by the monitor"
    );
    let service = find(&docs, "Service")[0];
    assert!(
        service["metadata"].get("annotations").is_none(),
        "no lb_ip, no annotation"
    );
}

fn network_policy(docs: &[Value]) -> &Value {
    let policies = find(docs, "NetworkPolicy");
    assert_eq!(policies.len(), 1);
    &policies[0]["spec"]
}

fn ports(rule: &Value) -> Vec<String> {
    rule["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            format!(
                "{}/{}",
                p["port"].to_string().trim_matches('"'),
                p["protocol"].as_str().unwrap()
            )
        })
        .collect()
}

/// Without `allowed_sources`, the listeners are open to any address (and `check` warns); the
/// admin port is open to the monitoring namespace only; the pods reach the cluster's DNS pods
/// and their upstreams' ports, nothing else.
#[test]
fn the_network_policy_admits_the_listeners_and_the_monitoring_namespace_only() {
    let docs = k8s_of("", &[GRAFANA, PROMETHEUS]);
    let service = find(&docs, "Service")[0];
    assert_eq!(service["spec"]["externalTrafficPolicy"], "Local");
    assert!(service["spec"].get("loadBalancerSourceRanges").is_none());
    let policy = network_policy(&docs);
    assert_eq!(
        policy["podSelector"]["matchLabels"],
        serde_json::json!({ "app.kubernetes.io/name": "private-ingress" })
    );
    assert_eq!(
        policy["policyTypes"],
        serde_json::json!(["Ingress", "Egress"])
    );
    let ingress = policy["ingress"].as_array().unwrap();
    assert_eq!(ingress.len(), 2);
    assert_eq!(ports(&ingress[0]), ["http/TCP", "https/TCP"]);
    assert!(
        ingress[0].get("from").is_none(),
        "any source: {}",
        ingress[0]
    );
    assert_eq!(ports(&ingress[1]), ["admin/TCP"]);
    assert_eq!(
        ingress[1]["from"],
        serde_json::json!([{ "namespaceSelector": { "matchLabels": { "kubernetes.io/metadata.name": "monitoring" } } }])
    );
    let egress = policy["egress"].as_array().unwrap();
    assert_eq!(egress.len(), 2);
    assert_eq!(ports(&egress[0]), ["53/UDP", "53/TCP"]);
    assert_eq!(
        egress[0]["to"],
        serde_json::json!([{
            "namespaceSelector": { "matchLabels": { "kubernetes.io/metadata.name": "kube-system" } },
            "podSelector": { "matchLabels": { "k8s-app": "kube-dns" } },
        }]),
        "DNS to the cluster's DNS pods only"
    );
    // grafana 3000, prometheus 9090: to any address, on these ports only.
    assert_eq!(ports(&egress[1]), ["3000/TCP", "9090/TCP"]);
    assert!(egress[1].get("to").is_none());
    // The admin port's name resolves in the pod.
    let agent = container(&docs, "initContainers", "agent");
    assert_eq!(agent["ports"][0]["name"], "admin");
}

#[test]
fn allowed_sources_restrict_the_load_balancer_and_the_network_policy() {
    let dir = tempfile::tempdir().unwrap();
    let workspace = workspace_file(
        dir.path(),
        "private.ncl",
        "  allowed_sources = [\"10.8.0.0/16\", \"fd00:8::/32\", \"192.0.2.7/32\"],\n  deploy = { monitoring = { namespace = \"observability\", pod_labels = { \"app.kubernetes.io/name\" = \"prometheus\" } } },\n",
        &[GRAFANA],
    );
    let docs = documents(&render(&workspace, "k8s"));
    let sources = serde_json::json!(["10.8.0.0/16", "fd00:8::/32", "192.0.2.7/32"]);
    assert_eq!(
        find(&docs, "Service")[0]["spec"]["loadBalancerSourceRanges"],
        sources
    );
    let ingress = &network_policy(&docs)["ingress"];
    let from: Vec<&Value> = ingress[0]["from"]
        .as_array()
        .unwrap()
        .iter()
        .map(|peer| &peer["ipBlock"]["cidr"])
        .collect();
    assert_eq!(serde_json::json!(from), sources);
    assert_eq!(
        ingress[1]["from"],
        serde_json::json!([{
            "namespaceSelector": { "matchLabels": { "kubernetes.io/metadata.name": "observability" } },
            "podSelector": { "matchLabels": { "app.kubernetes.io/name": "prometheus" } },
        }])
    );
    let (code, _, err) = run(bin().arg("check").arg(&workspace));
    assert_eq!(code, 0, "{err}");
    assert!(err.is_empty(), "no warning once the sources are set: {err}");
    let open = workspace_file(dir.path(), "open.ncl", "", &[GRAFANA]);
    let (code, _, err) = run(bin().arg("check").arg(&open));
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("warning: allowed_sources is not set: deployed, the listeners accept connections from any address"),
        "{err}"
    );
}

/// Routes to UNIX sockets need no egress: no upstream rule at all, since a rule without ports
/// would admit every port.
#[test]
fn unix_upstreams_open_no_egress_port() {
    let docs = k8s_of(
        "",
        &[r#"{ host = "portal.in.librecloud.online", upstream = "unix:///run/portal/http.sock" }"#],
    );
    let egress = network_policy(&docs)["egress"].as_array().unwrap().clone();
    assert_eq!(egress.len(), 1, "{egress:?}");
    assert_eq!(ports(&egress[0]), ["53/UDP", "53/TCP"]);
}

/// Every upstream of a route is dialled, and so is a health check's own port.
#[test]
fn every_upstream_port_and_a_health_check_port_are_open() {
    let docs = k8s_of(
        "",
        &[r#"{ host = "grafana.in.librecloud.online", upstreams = [
            { upstream = "grafana-a.observability", port = 3000, weight = 9 },
            { upstream = "grafana-b.observability", port = 3001, drain = true },
          ], health = { path = "/api/health", port = 8081 } }"#],
    );
    let egress = &network_policy(&docs)["egress"][1];
    assert_eq!(ports(egress), ["3000/TCP", "3001/TCP", "8081/TCP"]);
}

/// A Service whose target port differs from its port is reached on the target port after the
/// network plugin's translation: the workspace names such ports, without a protocol, so both
/// are open (NodeLocal DNSCache's 53 is asked over UDP first).
#[test]
fn extra_egress_ports_join_the_upstream_ports() {
    let docs = k8s_of(
        "  deploy = { extra_egress_ports = [8000, 3000] },\n",
        &[GRAFANA],
    );
    let egress = &network_policy(&docs)["egress"][1];
    assert_eq!(
        ports(egress),
        ["3000/TCP", "3000/UDP", "8000/TCP", "8000/UDP"]
    );
}

const SYSLOG: &str = r#"{ host = "syslog.in.librecloud.online", protocol = 'udp, listen_port = 5514, upstream = "syslog.logging.svc.libre-wuji.local", port = 514 }"#;
const GIT_SSH: &str = r#"{ host = "git.in.librecloud.online", protocol = 'tcp, listen_port = 2222, upstream = "gitea-ssh.gitea.svc.libre-wuji.local", port = 22 }"#;

/// A 'udp route's datagrams reach its upstream over UDP: an enforcing network plugin drops
/// what the NetworkPolicy does not admit, so its port is open as UDP (and as TCP only where a
/// route dials it so); the route's own port is admitted in as UDP, and the manifests pass
/// kubernetes-validate.
#[test]
fn a_udp_routes_upstream_port_is_open_as_udp() {
    let dir = tempfile::tempdir().unwrap();
    let workspace = workspace_file(dir.path(), "udp.ncl", "", &[GRAFANA, SYSLOG, GIT_SSH]);
    let yaml = render(&workspace, "k8s");
    kubernetes_validate(&yaml).unwrap_or_else(|report| panic!("{report}"));
    let docs = documents(&yaml);
    let policy = network_policy(&docs);
    assert_eq!(
        ports(&policy["egress"][1]),
        ["22/TCP", "514/UDP", "3000/TCP"]
    );
    assert_eq!(
        ports(&policy["ingress"][0]),
        ["http/TCP", "https/TCP", "2222/TCP", "5514/UDP"]
    );

    // A 'udp route's health check is a TCP connection to the same port: both are let out.
    let checked = SYSLOG.replacen(" }", ", health = { mode = 'tcp } }", 1);
    let workspace = workspace_file(dir.path(), "udp-health.ncl", "", &[GRAFANA, &checked]);
    let docs = documents(&render(&workspace, "k8s"));
    let policy = network_policy(&docs);
    assert_eq!(
        ports(&policy["egress"][1]),
        ["514/TCP", "514/UDP", "3000/TCP"]
    );
}

/// The Service takes the listeners' clients on 80 and 443 whatever ports the listeners have in
/// the pod, and each route of its own port at its `listen_port`: a `'tcp` route on 443 beside
/// listeners on 8443 and 8080 would give the Service `443/TCP` twice, which the API server
/// refuses. `render --format k8s` refuses it at the route's port, with file and line; `check`
/// (which knows no Service) and the manifests of a route on another port are fine, and each
/// Service port is one (port, protocol) with one name.
#[test]
fn a_route_on_the_load_balancers_https_port_is_refused_for_k8s() {
    let dir = tempfile::tempdir().unwrap();
    let listeners = "  listeners = { https = \"0.0.0.0:8443\", http = \"0.0.0.0:8080\" },\n";
    let on_443 = r#"{ host = "git.in.librecloud.online", protocol = 'tcp, listen_port = 443, upstream = "10.0.0.1", port = 22 }"#;
    let workspace = workspace_file(dir.path(), "on443.ncl", listeners, &[GRAFANA, on_443]);
    let (code, out, err) = run(bin().args(["render", "--format", "k8s"]).arg(&workspace));
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.is_empty(), "{out}");
    assert!(
        err.contains("routes[1]: listen_port 443 is the load balancer's https port"),
        "{err}"
    );
    assert!(err.contains("on443.ncl:"), "with its position: {err}");
    let (code, _, err) = run(bin().arg("check").arg(&workspace));
    assert_eq!(code, 0, "{err}");

    let workspace = workspace_file(
        dir.path(),
        "on2222.ncl",
        listeners,
        &[GRAFANA, GIT_SSH, SYSLOG],
    );
    let yaml = render(&workspace, "k8s");
    kubernetes_validate(&yaml).unwrap_or_else(|report| panic!("{report}"));
    let docs = documents(&yaml);
    assert_service_ports_are_unique(&docs);
    let service = find(&docs, "Service")[0];
    let service_ports: Vec<String> = service["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            format!(
                "{}/{} {}",
                p["port"],
                p["protocol"].as_str().unwrap(),
                p["name"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(
        service_ports,
        [
            "80/TCP http",
            "443/TCP https",
            "2222/TCP tcp-2222",
            "5514/UDP udp-5514"
        ]
    );
}

/// Deleted, sozu keeps accepting through the preStop wait, then stops softly; the grace period
/// covers both. Both come from the workspace, with defaults.
#[test]
fn shutdown_timings_come_from_the_workspace() {
    let timed = |fields: &str| {
        let docs = k8s_of(fields, &[GRAFANA]);
        let pre_stop = container(&docs, "containers", "sozu")["lifecycle"]["preStop"].clone();
        let grace = pod_spec(&docs)["terminationGracePeriodSeconds"].clone();
        (pre_stop, grace)
    };
    assert_eq!(
        timed(""),
        (
            serde_json::json!({ "sleep": { "seconds": 10 } }),
            serde_json::json!(40)
        )
    );
    assert_eq!(
        timed("  deploy = { pre_stop_seconds = 5, termination_grace_period_seconds = 65 },\n"),
        (
            serde_json::json!({ "sleep": { "seconds": 5 } }),
            serde_json::json!(65)
        )
    );
    assert_eq!(
        timed("  deploy = { pre_stop_seconds = 0 },\n"),
        (Value::Null, serde_json::json!(40)),
        "no wait, no hook"
    );
}

/// The labels Kubernetes tools read, a selector that never changes, spreading per revision,
/// evictable unready pods, JSON logs, and sozu's own temporary directory in memory.
#[test]
fn the_manifests_carry_what_cluster_tools_expect() {
    let docs = documents(&render(&reference(), "k8s"));
    for doc in &docs {
        let labels = &doc["metadata"]["labels"];
        assert_eq!(
            labels["app.kubernetes.io/managed-by"], "private-ingress",
            "{doc}"
        );
        assert_eq!(
            labels["app.kubernetes.io/version"],
            env!("CARGO_PKG_VERSION"),
            "{doc}"
        );
    }
    let deployment = find(&docs, "Deployment")[0];
    let selector = serde_json::json!({ "app.kubernetes.io/name": "private-ingress" });
    assert_eq!(deployment["spec"]["selector"]["matchLabels"], selector);
    assert_eq!(find(&docs, "Service")[0]["spec"]["selector"], selector);
    let spread = &pod_spec(&docs)["topologySpreadConstraints"][0];
    assert_eq!(
        spread["matchLabelKeys"],
        serde_json::json!(["pod-template-hash"])
    );
    let budget = &find(&docs, "PodDisruptionBudget")[0]["spec"];
    assert_eq!(budget["unhealthyPodEvictionPolicy"], "AlwaysAllow");
    assert_eq!(budget["selector"]["matchLabels"], selector);
    let args = container(&docs, "initContainers", "agent")["args"].clone();
    let args: Vec<&str> = args
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert!(
        args.windows(2).any(|w| w == ["--log-format", "json"]),
        "{args:?}"
    );
    let sozu = container(&docs, "containers", "sozu");
    let tmp = sozu["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["mountPath"] == "/tmp")
        .expect("sozu has a /tmp");
    let volume = pod_spec(&docs)["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == tmp["name"])
        .unwrap();
    assert_eq!(
        volume["emptyDir"]["medium"], "Memory",
        "sozu's state file holds private keys"
    );
    let agent = container(&docs, "initContainers", "agent");
    assert!(
        agent["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["name"] != tmp["name"]),
        "sozu's temporary directory is its own"
    );
}

/// The deployed reference is the example plus its `lb_ip` and its images: a copy (a workspace
/// imports only under its own directory) that must not drift from the example.
#[test]
fn the_deployed_reference_is_the_example_with_its_lb_ip_and_images() {
    let example = private_ingress::evaluate::contract::evaluate(
        &repo().join("schema/examples/librecloud.ncl"),
    )
    .unwrap();
    let deployed = private_ingress::evaluate::contract::evaluate(&reference()).unwrap();
    assert_eq!(deployed.lb_ip, Some("10.200.3.6".parse().unwrap()));
    let mut deploy = (*deployed.deploy).clone();
    for image in [&deploy.sozu_image, &deploy.agent_image] {
        assert!(
            image.as_deref().is_some_and(|i| i.contains("@sha256:")),
            "{image:?}"
        );
    }
    deploy.sozu_image = None;
    deploy.agent_image = None;
    assert_eq!(
        private_ingress::workspace::Workspace {
            lb_ip: None,
            deploy: Box::new(deploy),
            ..deployed
        },
        example
    );
}

/// The defaults the contract applies are the ones `Deploy::default` promises to code.
#[test]
fn contract_defaults_match_the_model_defaults() {
    let ws = private_ingress::evaluate::contract::evaluate(
        &repo().join("schema/examples/librecloud.ncl"),
    )
    .unwrap();
    assert_eq!(*ws.deploy, private_ingress::workspace::Deploy::default());
    assert_eq!(ws.lb_ip, None);
}

/// Parses a zone fragment with dnspython and returns (name, type, address) per record.
fn parse_zone(text: &str, origin: &str) -> Result<Vec<(String, String, String)>, String> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fragment.zone");
    std::fs::write(&path, text).unwrap();
    let script = "import sys, dns.zone\n\
        z = dns.zone.from_file(sys.argv[1], origin=sys.argv[2], relativize=False, check_origin=False)\n\
        for name, ttl, rdata in z.iterate_rdatas():\n    print(name, dns.rdatatype.to_text(rdata.rdtype), rdata.address)\n";
    let (code, out, err) = run(Command::new("python3")
        .args(["-c", script])
        .arg(&path)
        .arg(origin));
    if code != 0 {
        return Err(err);
    }
    Ok(out
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (f[0].to_owned(), f[1].to_owned(), f[2].to_owned())
        })
        .collect())
}

#[test]
fn the_dns_fragment_parses_with_dnspython() {
    let records = parse_zone(&render(&reference(), "dns"), "in.librecloud.online.").unwrap();
    let expected: Vec<(String, String, String)> =
        ["git", "grafana", "longhorn", "ntfy", "otlp", "prometheus"]
            .iter()
            .map(|h| {
                (
                    format!("{h}.in.librecloud.online."),
                    "A".to_owned(),
                    "10.200.3.6".to_owned(),
                )
            })
            .collect();
    assert_eq!(records, expected);

    let dir = tempfile::tempdir().unwrap();
    let v6 = workspace_file(dir.path(), "v6.ncl", "  lb_ip = \"fd00::6\",\n", &[GRAFANA]);
    let records = parse_zone(&render(&v6, "dns"), "in.librecloud.online.").unwrap();
    assert_eq!(
        records,
        [(
            "grafana.in.librecloud.online.".to_owned(),
            "AAAA".to_owned(),
            "fd00::6".to_owned()
        )]
    );
    // The parser is a real one: a malformed record is refused.
    assert!(parse_zone(
        "grafana.in.librecloud.online. 300 IN A 10.0.0.300\n",
        "in.librecloud.online."
    )
    .is_err());
}

#[test]
fn dns_without_lb_ip_fails_with_a_clear_message() {
    let (code, out, err) = run(bin()
        .arg("render")
        .arg(repo().join("schema/examples/librecloud.ncl"))
        .args(["--format", "dns"]));
    assert_eq!(code, 1, "{err}");
    assert!(out.is_empty());
    assert_eq!(
        err.trim(),
        "error: --format dns needs `lb_ip` in the workspace: the load-balancer address every \
         route host resolves to (e.g. lb_ip = \"10.200.3.6\")"
    );
}

#[test]
fn a_loopback_listener_cannot_be_deployed() {
    let dir = tempfile::tempdir().unwrap();
    let workspace = workspace_file(
        dir.path(),
        "local.ncl",
        "  listeners = { https = \"127.0.0.1:8443\", http = \"0.0.0.0:8080\" },\n",
        &[GRAFANA],
    );
    let (code, _, err) = run(bin()
        .arg("render")
        .arg(&workspace)
        .args(["--format", "k8s"]));
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("the https listener 127.0.0.1:8443 is a loopback address"),
        "{err}"
    );
}

/// `new` holds every line of `old`, in order (nothing removed or changed); returns the added
/// lines, counted.
fn added_lines<'a>(old: &str, new: &'a str) -> BTreeMap<&'a str, usize> {
    let mut old_lines = old.lines().peekable();
    let mut added = BTreeMap::new();
    for line in new.lines() {
        if old_lines.peek() == Some(&line) {
            old_lines.next();
        } else {
            *added.entry(line).or_default() += 1;
        }
    }
    let left: Vec<_> = old_lines.collect();
    assert!(left.is_empty(), "lines removed or changed: {left:#?}");
    added
}

fn counted(block: &str) -> BTreeMap<&str, usize> {
    let mut out = BTreeMap::new();
    for line in block.lines() {
        *out.entry(line).or_default() += 1;
    }
    out
}

/// A workspace of grafana and prometheus (plus `fields`), and the same with alertmanager appended.
struct Appended {
    before: PathBuf,
    after: PathBuf,
    /// `render --format k8s` of each; the second as an edit of the first ([`as_edit_of`]).
    k8s_before: String,
    k8s_after: String,
    /// The appended host, and the name its certificate volume got.
    host: &'static str,
    name: String,
}

fn append_alertmanager(dir: &Path, fields: &str) -> Appended {
    let before = workspace_file(dir, "before.ncl", fields, &[GRAFANA, PROMETHEUS]);
    let after = workspace_file(
        dir,
        "after.ncl",
        fields,
        &[GRAFANA, ALERTMANAGER, PROMETHEUS],
    );
    let k8s_before = render(&before, "k8s");
    let k8s_after = as_edit_of(&k8s_before, render(&after, "k8s"));
    let host = "alertmanager.in.librecloud.online";
    let name = volume_name(&k8s_after, host);
    Appended {
        before,
        after,
        k8s_before,
        k8s_after,
        host,
        name,
    }
}

/// `after` rendered as an edit of the workspace `before` renders from: the same file name in the
/// ConfigMap, and the same ConfigMap name. That name follows the contents, so an edited
/// workspace is a new ConfigMap (checked here) that only the new pod template mounts.
fn as_edit_of(before: &str, after: String) -> String {
    let name = |yaml: &str| {
        find(&documents(yaml), "ConfigMap")[0]["metadata"]["name"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let (old, new) = (name(before), name(&after));
    assert_ne!(old, new, "an edited workspace must be a new ConfigMap");
    after.replace("after.ncl", "before.ncl").replace(&new, &old)
}

/// The name the render gave the new host's certificate volume.
fn volume_name(yaml: &str, host: &str) -> String {
    let docs = documents(yaml);
    let mounts = container(&docs, "initContainers", "agent")["volumeMounts"].clone();
    mounts
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["mountPath"].as_str().unwrap().ends_with(host))
        .map(|m| m["name"].as_str().unwrap().to_owned())
        .unwrap()
}

/// A new route adds its volume, its mount, its DNS record, and its upstream port to what the
/// pods may connect to (when no other route has that port).
#[test]
fn appending_a_route_adds_exactly_its_volume_mount_and_record() {
    let dir = tempfile::tempdir().unwrap();
    let Appended {
        before,
        after,
        k8s_before,
        k8s_after,
        host,
        name,
    } = append_alertmanager(dir.path(), "  lb_ip = \"10.200.3.6\",\n");
    assert!(name.starts_with("tls-alertmanager-"), "{name}");
    let expected = format!(
        "        {ALERTMANAGER},
      - csi:
          driver: csi.cert-manager.io
          readOnly: true
          volumeAttributes:
            csi.cert-manager.io/dns-names: {host}
            csi.cert-manager.io/fs-group: '65532'
            csi.cert-manager.io/issuer-kind: ClusterIssuer
            csi.cert-manager.io/issuer-name: librecloud-ca
        name: {name}
        - mountPath: /etc/sozu/tls/{host}
          name: {name}
          readOnly: true
    - port: 9093
      protocol: TCP
"
    );
    assert_eq!(added_lines(&k8s_before, &k8s_after), counted(&expected));

    let (dns_before, dns_after) = (render(&before, "dns"), render(&after, "dns"));
    assert_eq!(
        added_lines(&dns_before, &dns_after),
        counted(&format!("{host}.\t300\tIN\tA\t10.200.3.6\n"))
    );
}

#[test]
fn appending_a_route_in_reloader_mode_adds_its_certificate_secret_volume_and_mount() {
    let dir = tempfile::tempdir().unwrap();
    let Appended {
        k8s_before,
        k8s_after,
        host,
        name,
        ..
    } = append_alertmanager(dir.path(), "  tls_rotation = 'reloader,\n");
    let expected = format!(
        "        {ALERTMANAGER},
---
apiVersion: cert-manager.io/v1
kind: Certificate
metadata:
  labels:
    app.kubernetes.io/managed-by: private-ingress
    app.kubernetes.io/name: private-ingress
    app.kubernetes.io/version: {version}
  name: {name}
  namespace: ingress-private
spec:
  dnsNames:
  - {host}
  issuerRef:
    group: cert-manager.io
    kind: ClusterIssuer
    name: librecloud-ca
  secretName: {name}
      - name: {name}
        secret:
          defaultMode: 288
          optional: true
          secretName: {name}
        - mountPath: /etc/sozu/tls/{host}
          name: {name}
          readOnly: true
    - port: 9093
      protocol: TCP
",
        version = env!("CARGO_PKG_VERSION"),
    );
    assert_eq!(added_lines(&k8s_before, &k8s_after), counted(&expected));
}

/// The pinned sozu: `SOZU_BIN`, else where `scripts/ensure-sozu` installs it. Missing, the test
/// fails and says how to get it, rather than passing without checking anything.
fn sozu_bin() -> std::path::PathBuf {
    if let Some(path) = std::env::var_os("SOZU_BIN").filter(|p| !p.is_empty()) {
        return path.into();
    }
    let cache = std::env::var_os("SOZU_CACHE_DIR")
        .map(std::path::PathBuf::from)
        .or_else(|| {
            std::env::var_os("XDG_CACHE_HOME")
                .map(|d| std::path::PathBuf::from(d).join("private-ingress"))
        })
        .or_else(|| {
            std::env::var_os("HOME")
                .map(|d| std::path::PathBuf::from(d).join(".cache/private-ingress"))
        })
        .unwrap_or_default();
    let bin = cache.join("sozu-2.3.3/bin/sozu");
    assert!(
        bin.is_file(),
        "sozu 2.3.3 not found at {}: run scripts/ensure-sozu (or scripts/test), or set SOZU_BIN",
        bin.display()
    );
    bin
}

/// sozu 2.3.3 itself accepts the bootstrap configuration shipped in the ConfigMap.
#[test]
fn sozu_accepts_the_bootstrap_configuration() {
    let sozu = sozu_bin();
    let docs = documents(&render(&reference(), "k8s"));
    let config = find(&docs, "ConfigMap")[0]["data"]["sozu.toml"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(config.contains("command_socket = \"/run/sozu/sozu.sock\""));
    assert!(
        !config.contains("[clusters."),
        "the agent pushes the routes: {config}"
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.toml");
    std::fs::write(&path, config).unwrap();
    let (code, out, err) = run(Command::new(sozu)
        .args(["config", "check", "-c"])
        .arg(&path));
    assert_eq!(
        code, 0,
        "sozu refused the bootstrap configuration:\n{out}{err}"
    );
}

/// Runs a justfile recipe with kubectl (and the image build) printed instead of run.
fn just(out: &Path, args: &[&str]) -> (i32, String, String) {
    just_with(out, None, args)
}

/// [`just`] on `workspace` (`WORKSPACE`) instead of the reference.
fn just_with(out: &Path, workspace: Option<&Path>, args: &[&str]) -> (i32, String, String) {
    let mut command = Command::new("just");
    command
        .arg("--justfile")
        .arg(repo().join("deploy/justfile"))
        .args(args)
        .env("PRIVATE_INGRESS", env!("CARGO_BIN_EXE_private-ingress"))
        .env("OUT", out)
        .env("DRY_RUN", "1")
        .env_remove("WORKSPACE");
    if let Some(workspace) = workspace {
        command.env("WORKSPACE", workspace);
    }
    run(&mut command)
}

#[test]
fn the_justfile_recipes_run() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path();

    let (code, stdout, err) = just(out, &["check"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        stdout.contains("ok: ") && stdout.contains("7 routes"),
        "{stdout}"
    );

    let (code, _, err) = just(out, &["render"]);
    assert_eq!(code, 0, "{err}");
    let manifests = std::fs::read_to_string(out.join("private-ingress.yaml")).unwrap();
    assert_eq!(manifests, render(&reference(), "k8s"));
    let zone = std::fs::read_to_string(out.join("private-ingress.zone")).unwrap();
    assert_eq!(zone, render(&reference(), "dns"));

    let manifests_path = out.join("private-ingress.yaml").display().to_string();
    let (code, stdout, err) = just(out, &["diff"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        stdout.contains(&format!(
            "kubectl diff --server-side --field-manager=private-ingress -f {manifests_path}"
        )),
        "{stdout}"
    );

    let (code, stdout, err) = just(out, &["install-private-ingress", "update"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        stdout.contains(&format!("kubectl apply --server-side --field-manager=private-ingress --prune -l app.kubernetes.io/name=private-ingress --prune-allowlist=cert-manager.io/v1/Certificate --prune-allowlist=core/v1/ConfigMap --prune-allowlist=apps/v1/Deployment --prune-allowlist=apps/v1/StatefulSet -f {manifests_path}")),
        "{stdout}"
    );
    assert!(
        stdout.contains(
            "kubectl --namespace ingress-private rollout status deployment/private-ingress"
        ),
        "{stdout}"
    );
    let (code, stdout, err) = just(out, &["install-private-ingress", "install"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        stdout.contains("kubectl get crd certificates.cert-manager.io"),
        "{stdout}"
    );
    assert!(
        stdout.contains("kubectl get csidriver csi.cert-manager.io"),
        "{stdout}"
    );
    let (code, _, err) = just(out, &["install-private-ingress", "upgrade"]);
    assert_ne!(code, 0);
    assert!(err.contains("install or update"), "{err}");

    let (code, stdout, err) = just(out, &["demo"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        stdout.contains("Deployment") && stdout.contains("IN\tA\t10.200.3.6"),
        "{stdout}"
    );

    // `test` runs the whole suite, this test included: only show what it would run.
    let (code, _, err) = just(out, &["--dry-run", "test"]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("scripts/test"), "{err}");
}

/// `render --format k8s` of a workspace that names no images fails, saying which field and how
/// to get the references; `render --format dns` needs none.
#[test]
fn render_refuses_a_workspace_that_names_no_images() {
    let dir = tempfile::tempdir().unwrap();
    let workspace = workspace_file(
        dir.path(),
        "no-images.ncl",
        "  lb_ip = \"10.200.3.6\",\n  deploy.agent_image = \"registry.example/private-ingress:0.1.0@sha256:2222222222222222222222222222222222222222222222222222222222222222\",\n",
        &[GRAFANA],
    );
    let (code, out, err) = run(bin()
        .arg("render")
        .arg(&workspace)
        .args(["--format", "k8s"]));
    assert_eq!(code, 1, "{err}");
    assert!(out.is_empty(), "{out}");
    assert!(
        err.contains("error: deploy.sozu_image is not set: no registry publishes the sozu image")
            && err.contains("`just image`")
            && err.contains("`just push-images REGISTRY`"),
        "{err}"
    );
    render(&workspace, "dns");
}

/// An image named by tag alone is rendered, with a warning from `render` and from `check`; the
/// reference workspace, pinned, gets none.
#[test]
fn an_image_without_a_digest_is_warned_about() {
    let dir = tempfile::tempdir().unwrap();
    let workspace = workspace_file(
        dir.path(),
        "tagged.ncl",
        "  allowed_sources = [\"10.8.0.0/16\"],\n  deploy.sozu_image = \"registry.example/sozu:2.3.3\",\n  deploy.agent_image = \"registry.example/private-ingress:0.1.0@sha256:2222222222222222222222222222222222222222222222222222222222222222\",\n",
        &[GRAFANA],
    );
    let warning =
        "warning: deploy.sozu_image `registry.example/sozu:2.3.3` is not pinned by digest";
    for args in [vec!["render", "--format", "k8s"], vec!["check"]] {
        let (code, out, err) = run(bin().arg(args[0]).arg(&workspace).args(&args[1..]));
        assert_eq!(code, 0, "{args:?}: {err}");
        assert!(err.contains(warning), "{args:?}: {err}");
        assert!(!err.contains("agent_image"), "{args:?}: {err}");
        if args[0] == "render" {
            assert!(
                out.contains("image: registry.example/sozu:2.3.3\n"),
                "{out}"
            );
        }
    }
    let (code, _, err) = run(bin()
        .arg("render")
        .arg(reference())
        .args(["--format", "k8s"]));
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("warning"), "{err}");
}

/// Every shipped example is what it claims: `check` passes it without a warning, which it gives
/// for listeners open to any address; `render --format k8s` warns about those too.
#[test]
fn every_shipped_example_is_private_and_pinned() {
    let examples = repo().join("schema/examples");
    let mut checked = 0;
    for path in [
        examples.join("librecloud.ncl"),
        examples.join("acme.ncl"),
        examples.join("backends.ncl"),
        examples.join("plain.json"),
        examples.join("modular/workspace.ncl"),
        reference(),
    ] {
        let (code, _, err) = run(bin().arg("check").arg(&path));
        assert_eq!(code, 0, "{}: {err}", path.display());
        assert!(!err.contains("warning"), "{}: {err}", path.display());
        checked += 1;
    }
    assert_eq!(checked, 6);
    let dir = tempfile::tempdir().unwrap();
    let open = workspace_file(dir.path(), "open.ncl", "", &[GRAFANA]);
    let (code, _, err) = run(bin().arg("render").arg(&open).args(["--format", "k8s"]));
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("warning: allowed_sources is not set: deployed, the listeners accept connections from any address"),
        "{err}"
    );
}

/// Each load balancer is asked for `lb_ip` the way its documentation says (docs/deploy.md cites
/// each), never also through the deprecated `spec.loadBalancerIP`; a class of the workspace's
/// own gets its class and annotations; a NodePort Service gets the node ports. Every render
/// passes the Kubernetes schemas, and the DNS records say what `lb_ip` is.
#[test]
fn each_load_balancer_provider_gets_the_address_its_documented_way() {
    // (provider, more fields, the Service's annotations, what the DNS records say lb_ip is)
    type Case<'a> = (&'a str, &'a str, &'a [(&'a str, &'a str)], &'a str);
    let cases: [Case; 5] = [
        ("cilium", "", &[("lbipam.cilium.io/ips", "10.200.3.6")], "the address the Service asks Cilium LB-IPAM for (lbipam.cilium.io/ips)"),
        ("metallb", "", &[("metallb.io/loadBalancerIPs", "10.200.3.6")], "the address the Service asks MetalLB for (metallb.io/loadBalancerIPs)"),
        ("kube_vip", "", &[("kube-vip.io/loadbalancerIPs", "10.200.3.6")], "the address the Service asks kube-vip for (kube-vip.io/loadbalancerIPs)"),
        (
            "class",
            ", class = \"service.k8s.aws/nlb\", annotations = { \"service.beta.kubernetes.io/aws-load-balancer-scheme\" = \"internal\" }",
            &[("service.beta.kubernetes.io/aws-load-balancer-scheme", "internal")],
            "the address the loadBalancerClass service.k8s.aws/nlb must give the Service",
        ),
        (
            "node_port",
            ", node_ports = { https = 30443, http = 30080 }",
            &[],
            "your load balancer in front of the nodes, forwarding 443 to node port 30443 and 80 to node port 30080",
        ),
    ];
    let dir = tempfile::tempdir().unwrap();
    for (provider, extra, annotations, dns_says) in cases {
        let fields = format!(
            "  lb_ip = \"10.200.3.6\",\n  allowed_sources = [\"10.8.0.0/16\"],\n  deploy.load_balancer = {{ provider = '{provider}{extra} }},\n"
        );
        let workspace = workspace_file(dir.path(), &format!("{provider}.ncl"), &fields, &[GRAFANA]);
        let yaml = render(&workspace, "k8s");
        kubernetes_validate(&yaml).unwrap_or_else(|report| panic!("{provider}:\n{report}"));
        let docs = documents(&yaml);
        let service = find(&docs, "Service")
            .into_iter()
            .find(|s| s["metadata"]["name"] == "private-ingress")
            .unwrap_or_else(|| panic!("{provider}: no Service"));
        let expected: serde_json::Map<String, Value> = annotations
            .iter()
            .map(|(k, v)| ((*k).to_owned(), Value::from(*v)))
            .collect();
        let got = service["metadata"]["annotations"]
            .as_object()
            .cloned()
            .unwrap_or_default();
        assert_eq!(got, expected, "{provider}");
        let spec = &service["spec"];
        assert!(spec.get("loadBalancerIP").is_none(), "{provider}: {spec}");
        assert_eq!(spec["externalTrafficPolicy"], "Local", "{provider}");
        match provider {
            "node_port" => {
                assert_eq!(spec["type"], "NodePort");
                assert_eq!(spec["ports"][0]["nodePort"], 30080);
                assert_eq!(spec["ports"][1]["nodePort"], 30443);
                assert!(spec.get("loadBalancerSourceRanges").is_none(), "{spec}");
            }
            _ => {
                assert_eq!(spec["type"], "LoadBalancer", "{provider}");
                assert_eq!(
                    spec["loadBalancerSourceRanges"],
                    serde_json::json!(["10.8.0.0/16"])
                );
            }
        }
        let class = if provider == "class" {
            Value::from("service.k8s.aws/nlb")
        } else {
            Value::Null
        };
        assert_eq!(spec["loadBalancerClass"], class, "{provider}");
        let zone = render(&workspace, "dns");
        assert!(
            zone.contains(&format!("; Every route host resolves to lb_ip: {dns_says}")),
            "{provider}:\n{zone}"
        );
        assert!(
            zone.contains("grafana.in.librecloud.online.\t300\tIN\tA\t10.200.3.6"),
            "{zone}"
        );
    }
}

/// Replicas are spread over nodes or not scheduled, counting only the nodes they may run on;
/// `'reloader` Secrets not issued yet do not keep the pod from starting; `deploy.readiness =
/// 'strict` reaches the agent.
#[test]
fn the_pod_spreads_starts_without_every_secret_and_takes_the_readiness_mode() {
    let docs = k8s_of(
        "  tls_rotation = 'reloader,\n  deploy.readiness = 'strict,\n",
        &[GRAFANA],
    );
    let spec = pod_spec(&docs);
    let spread = &spec["topologySpreadConstraints"][0];
    assert_eq!(spread["whenUnsatisfiable"], "DoNotSchedule", "{spread}");
    assert_eq!(spread["nodeTaintsPolicy"], "Honor", "{spread}");
    assert_eq!(spread["topologyKey"], "kubernetes.io/hostname");
    let secret = spec["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|v| {
            v.get("secret")
                .filter(|s| s["secretName"] != "private-ingress-acme")
        })
        .expect("a Secret volume");
    assert_eq!(secret["optional"], true, "{secret}");
    let args = container(&docs, "initContainers", "agent")["args"].clone();
    let args: Vec<&str> = args
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        args.windows(2).any(|w| w == ["--readiness", "strict"]),
        "{args:?}"
    );
    let default = k8s_of("", &[GRAFANA]);
    let args = container(&default, "initContainers", "agent")["args"].to_string();
    assert!(
        !args.contains("--readiness"),
        "the default is the agent's: {args}"
    );
}

/// `listeners.client_auth`: the device CA and its CRLs come from the Secret
/// `private-ingress-client-auth`, mounted read-only at the paths the workspace names in sozu
/// (whose bootstrap configuration names them) and in the agent. An interface of the host cannot
/// be deployed in a pod; the PROXY protocol is warned about.
#[test]
fn client_certificates_are_mounted_in_both_containers_from_their_secret() {
    let dir = tempfile::tempdir().unwrap();
    let listeners = "  lb_ip = \"10.200.3.6\",\n  listeners = { https = \"0.0.0.0:8443\", http = \"0.0.0.0:8080\", \
        client_auth = { mode = 'required, ca_file = \"/etc/devices/ca.crt\", \
        crl_files = [\"/etc/devices/devices.crl\", \"/etc/devices/old/devices.crl\"] } },\n";
    let workspace = workspace_file(dir.path(), "devices.ncl", listeners, &[GRAFANA]);
    let yaml = render(&workspace, "k8s");
    kubernetes_validate(&yaml).unwrap_or_else(|report| panic!("{report}"));
    let docs = documents(&yaml);
    let volumes = pod_spec(&docs)["volumes"].as_array().unwrap().clone();
    for container in [
        container(&docs, "containers", "sozu"),
        container(&docs, "initContainers", "agent"),
    ] {
        let mounts = container["volumeMounts"].as_array().unwrap();
        let items_at = |path: &str| {
            let mount = mounts
                .iter()
                .find(|m| m["mountPath"] == path)
                .unwrap_or_else(|| panic!("{}: nothing at {path}", container["name"]));
            assert_eq!(mount["readOnly"], true);
            let volume = volumes.iter().find(|v| v["name"] == mount["name"]).unwrap();
            assert_eq!(
                volume["secret"]["secretName"],
                "private-ingress-client-auth"
            );
            volume["secret"]["items"].clone()
        };
        assert_eq!(
            items_at("/etc/devices"),
            serde_json::json!([{ "key": "client-ca", "path": "ca.crt" }, { "key": "client-crl-0", "path": "devices.crl" }])
        );
        assert_eq!(
            items_at("/etc/devices/old"),
            serde_json::json!([{ "key": "client-crl-1", "path": "devices.crl" }])
        );
    }
    let config = find(&docs, "ConfigMap")
        .into_iter()
        .find_map(|c| c["data"]["sozu.toml"].as_str())
        .expect("sozu's bootstrap configuration");
    assert!(
        config.contains("client_auth = \"required\"")
            && config.contains("client_ca_certificates = [\"/etc/devices/ca.crt\"]"),
        "{config}"
    );

    let pinned = workspace_file(
        dir.path(),
        "wg.ncl",
        &listeners.replace("listeners = {", "listeners = { interface = \"wg0\","),
        &[GRAFANA],
    );
    let (code, _, err) = run(Command::new(env!("CARGO_BIN_EXE_private-ingress"))
        .arg("render")
        .arg(&pinned)
        .args(["--format", "k8s"]));
    assert_ne!(code, 0);
    assert!(
        err.contains("listeners.interface `wg0` names an interface of the host"),
        "{err}"
    );

    let proxied = workspace_file(
        dir.path(),
        "proxy.ncl",
        &listeners.replace("listeners = {", "listeners = { expect_proxy = true,"),
        &[GRAFANA],
    );
    let (code, _, err) = run(Command::new(env!("CARGO_BIN_EXE_private-ingress"))
        .arg("render")
        .arg(&proxied)
        .args(["--format", "k8s"]));
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("the load balancer in front must send one"),
        "{err}"
    );
}

/// Route policies' files in the pod: error pages ship in the ConfigMap at their relative paths
/// (where the agent's relative paths find them); a users file comes from the Secret
/// `private-ingress-basic-auth`, mounted in the agent alone at the path the workspace names.
/// sozu's bootstrap configuration names no page (the agent sets them). A users file inside the
/// workspace's directory would ship in the ConfigMap, and a page outside the workspace's tree is
/// no page the agent reads: both refused.
#[test]
fn route_policy_files_reach_the_agent_from_the_workspace_and_a_secret() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("pages")).unwrap();
    std::fs::write(
        dir.path().join("pages/404.http"),
        "HTTP/1.1 404 Not Found\n\nnothing here\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("pages/longhorn-503.http"),
        "HTTP/1.1 503 Service Unavailable\n\nback soon\n",
    )
    .unwrap();
    let fields = "  lb_ip = \"10.200.3.6\",\n  listeners = { https = \"0.0.0.0:8443\", http = \"0.0.0.0:8080\" },\n  \
        error_pages = { \"404\" = \"pages/404.http\" },\n";
    let route = r#"{ host = "longhorn.in.librecloud.online", upstream = "10.0.0.5", port = 80, basic_auth = { users_file = "/etc/private-ingress/auth/longhorn.users" }, error_pages."503" = "pages/longhorn-503.http" }"#;
    let workspace = workspace_file(dir.path(), "policies.ncl", fields, &[route]);
    let yaml = render(&workspace, "k8s");
    kubernetes_validate(&yaml).unwrap_or_else(|report| panic!("{report}"));
    let docs = documents(&yaml);
    let data = find(&docs, "ConfigMap")
        .into_iter()
        .find(|c| c["data"]["sozu.toml"].is_string())
        .map(|c| c["data"].clone())
        .unwrap();
    assert_eq!(
        data["pages--404.http"],
        "HTTP/1.1 404 Not Found\n\nnothing here\n"
    );
    assert_eq!(
        data["pages--longhorn-503.http"],
        "HTTP/1.1 503 Service Unavailable\n\nback soon\n"
    );
    assert!(
        !data["sozu.toml"].as_str().unwrap().contains("answers"),
        "{}",
        data["sozu.toml"]
    );
    let volumes = pod_spec(&docs)["volumes"].as_array().unwrap().clone();
    let agent = container(&docs, "initContainers", "agent");
    let source_at = |path: &str| {
        let mount = agent["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["mountPath"] == path)
            .unwrap_or_else(|| panic!("nothing at {path}"));
        assert_eq!(mount["readOnly"], true);
        volumes
            .iter()
            .find(|v| v["name"] == mount["name"])
            .unwrap()
            .clone()
    };
    let users = source_at("/etc/private-ingress/auth");
    assert_eq!(users["secret"]["secretName"], "private-ingress-basic-auth");
    assert_eq!(
        users["secret"]["items"],
        serde_json::json!([{ "key": "longhorn.users", "path": "longhorn.users" }])
    );
    let sozu = container(&docs, "containers", "sozu");
    assert!(
        !sozu["volumeMounts"]
            .to_string()
            .contains("/etc/private-ingress"),
        "sozu mounts none of them"
    );

    let inside = workspace_file(
        dir.path(),
        "inside.ncl",
        fields,
        &[&route.replace(
            "/etc/private-ingress/auth/longhorn.users",
            "auth/longhorn.users",
        )],
    );
    let (code, _, err) = run(Command::new(env!("CARGO_BIN_EXE_private-ingress"))
        .arg("render")
        .arg(&inside)
        .args(["--format", "k8s"]));
    assert_ne!(code, 0);
    assert!(err.contains("lies in the workspace's directory"), "{err}");

    let outside = workspace_file(
        dir.path(),
        "outside.ncl",
        fields,
        &[&route.replace(
            "pages/longhorn-503.http",
            "/etc/private-ingress/pages/longhorn-503.http",
        )],
    );
    let (code, _, err) = run(Command::new(env!("CARGO_BIN_EXE_private-ingress"))
        .arg("render")
        .arg(&outside)
        .args(["--format", "k8s"]));
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("is not in the workspace's tree: it is outside"),
        "{err}"
    );
}
