//! `tls_rotation = 'sozu_managed` with two replicas, as `render --format k8s` writes it: a
//! StatefulSet whose pods are run as a kubelet runs them (see `pod.rs`), each in a network of its
//! own wired to a node where the cluster's services listen (pebble, BIND, the backends), each
//! with a claim of its own and the Secret `private-ingress-acme` the operator creates. Both
//! order their certificates from pebble and serve them; then the StatefulSet's rolling update
//! is played under HTTPS load through an emulated load balancer, one replica at a time, and no
//! request fails and no certificate is ordered again.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use private_ingress_tests::acme::{Bind, Pebble, Zone};
use private_ingress_tests::kubelet::{Node, Placement, Pod};
use private_ingress_tests::live::{https_get_verified, Backend};
use private_ingress_tests::load::{Load, Target};
use private_ingress_tests::{agent_bin, run, short_tempdir};

use super::pod::{images, pinned_images};

const ZONE: &str = "in.example.org";
const HOSTS: [&str; 2] = ["grafana.in.example.org", "longhorn.in.example.org"];
/// The test workspace's preStop wait, and so the StatefulSet's `minReadySeconds`.
const PRE_STOP: Duration = Duration::from_secs(3);
/// When the emulated load balancer stops sending new connections after a deletion: inside the
/// preStop wait, as it is meant to be sized.
const ENDPOINT_REMOVAL: Duration = Duration::from_secs(2);
const GRACE: Duration = Duration::from_secs(15);
/// Where the workspace puts the ACME state, the Secret's files and the CA bundle in the pod.
const STATE_DIR: &str = "/var/lib/private-ingress/acme";
const SECRETS_DIR: &str = "/run/secrets/acme";
const CA_DIR: &str = "/etc/acme-ca";

/// The workspace: two routes to backends on the node, certificates ordered from pebble over
/// DNS-01 with BIND, two replicas.
fn workspace(dir: &Path, pebble: &Pebble, bind: &Bind, backends: &[Backend]) -> std::path::PathBuf {
    let (agent_image, sozu_image) = pinned_images();
    let routes: String = HOSTS
        .iter()
        .zip(backends)
        .map(|(host, backend)| {
            format!(
                "    {{ host = \"{host}\", upstream = \"{}\", port = {} }},\n",
                backend.address.ip(),
                backend.address.port()
            )
        })
        .collect();
    let text = format!(
        "{{\n  zone = \"{ZONE}\",\n  cluster_issuer = \"internal-ca\",\n  \
         allowed_sources = [\"10.0.0.0/8\"],\n  tls_rotation = 'sozu_managed,\n  acme = {{\n    \
         directory = \"{directory}\",\n    ca_bundle = \"{CA_DIR}/roots.pem\",\n    \
         dns01 = {{ provider = 'rfc2136, server = \"{dns}\", zone = \"{ZONE}\", \
         tsig_key_name = \"acme-key\", tsig_secret_file = \"{SECRETS_DIR}/tsig\" }},\n    \
         propagation = {{ nameservers = [\"{dns}\"], timeout = 30 }},\n    \
         state_dir = \"{STATE_DIR}\",\n  }},\n  routes = [\n{routes}  ],\n  \
         deploy = {{ agent_image = \"{agent_image}\", sozu_image = \"{sozu_image}\", replicas = 2, \
         pre_stop_seconds = {}, termination_grace_period_seconds = {} }},\n}}\n",
        PRE_STOP.as_secs(),
        GRACE.as_secs(),
        directory = pebble.directory,
        dns = bind.address,
    );
    let path = dir.join("workspace.ncl");
    std::fs::write(&path, text).expect("write the workspace");
    path
}

fn render(workspace: &Path) -> String {
    let (code, out, err) = run(std::process::Command::new(agent_bin())
        .arg("render")
        .arg(workspace)
        .args(["--format", "k8s"]));
    assert_eq!(code, 0, "render --format k8s: {err}");
    out
}

/// The replica of ordinal `ordinal`: its network on the node, its claims under `claims`, the
/// Secret the operator created.
struct Replica {
    pod: Pod,
    https: SocketAddr,
}

fn start_replica(yaml: &str, node: &Node, placement: &Placement) -> Replica {
    let (network, ip) = node.attach();
    let pod = Pod::start_placed(yaml, &images(), network, placement);
    Replica {
        pod,
        https: SocketAddr::from((ip, 443)),
    }
}

/// The certificate each host is served at `https`, verified against pebble's root.
fn served(https: SocketAddr, root: &str) -> Result<Vec<String>, String> {
    HOSTS
        .iter()
        .map(|host| {
            let seen = https_get_verified(https, host, "/", root)?;
            if seen.status != 200 || seen.body != *host {
                return Err(format!("{host}: {} {:?}", seen.status, seen.body));
            }
            Ok(seen.fingerprint)
        })
        .collect()
}

#[test]
fn two_replicas_order_serve_and_roll_one_at_a_time_without_failing_a_request() {
    let node = Node::new();
    // This thread, its services and its clients are the node's.
    node.network().enter();
    let dir = short_tempdir();
    let bind = Bind::start_at(
        dir.path(),
        &[Zone {
            name: ZONE.into(),
            records: Vec::new(),
            updatable: true,
        }],
        Node::SERVICE_IP,
    );
    let pebble = Pebble::start_at(dir.path(), bind.address, Node::SERVICE_IP);
    let backends: Vec<Backend> = HOSTS
        .iter()
        .map(|h| Backend::start_at(h, Node::SERVICE_IP))
        .collect();
    let yaml = render(&workspace(dir.path(), &pebble, &bind, &backends));
    assert!(yaml.contains("kind: StatefulSet"), "{yaml}");

    let ca_bundle = std::fs::read(&pebble.ca_pem).expect("pebble's TLS CA");
    let secret: BTreeMap<String, Vec<u8>> = [
        (
            "tsig-secret".to_owned(),
            format!("{}\n", bind.secret).into_bytes(),
        ),
        ("ca-bundle".to_owned(), ca_bundle),
    ]
    .into();
    // The provisioner's volumes: outliving the pods, reached by the containers' users through
    // these directories, as the kubelet's own are.
    let claims = dir.path().join("claims");
    std::fs::create_dir(&claims).expect("create the claims' directory");
    for path in [dir.path(), &claims] {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o711))
            .expect("chmod the claims' directory");
    }
    let placements: Vec<Placement> = (0..2)
        .map(|ordinal| Placement {
            ordinal,
            claims: Some(claims.clone()),
            secrets: [("private-ingress-acme".to_owned(), secret.clone())].into(),
        })
        .collect();

    // Both replicas start together (podManagementPolicy: Parallel), each orders every host.
    let started = Instant::now();
    let mut replicas: Vec<Replica> = placements
        .iter()
        .map(|p| start_replica(&yaml, &node, p))
        .collect();
    for (ordinal, replica) in replicas.iter().enumerate() {
        replica
            .pod
            .wait_ready(Duration::from_secs(180))
            .unwrap_or_else(|e| panic!("replica {ordinal}: {e}"));
    }
    println!(
        "two replicas Ready, every host ordered by each, {:?} after they started",
        started.elapsed()
    );
    let root = pebble.root_pem();
    let mut certificates: Vec<Vec<String>> = replicas
        .iter()
        .enumerate()
        .map(|(ordinal, r)| {
            served(r.https, &root)
                .unwrap_or_else(|e| panic!("replica {ordinal}: {e}\n{}", r.pod.logs("agent")))
        })
        .collect();
    for (host, (a, b)) in HOSTS
        .iter()
        .zip(certificates[0].iter().zip(&certificates[1]))
    {
        assert_ne!(a, b, "{host}: each replica serves a certificate of its own");
    }
    let issued = pebble.issued();
    assert_eq!(
        issued,
        2 * HOSTS.len(),
        "one certificate per host per replica"
    );

    // The rolling update, as the StatefulSet controller plays it: the highest ordinal first,
    // one at a time. Each old pod is deleted (the load balancer takes it out within the preStop
    // wait), its successor starts on the same claim, joins the load balancer once Ready, and
    // the next replica waits minReadySeconds.
    let targets: Vec<Target> = HOSTS
        .iter()
        .map(|h| Target {
            host: h.to_string(),
            body: h.to_string(),
        })
        .collect();
    let endpoints: Vec<SocketAddr> = replicas.iter().map(|r| r.https).collect();
    let load = Load::start_balanced(&endpoints, targets, 4, 4);
    std::thread::sleep(Duration::from_secs(1));
    for ordinal in (0..replicas.len()).rev() {
        let Replica { mut pod, https } = replicas.remove(ordinal);
        let deletion = std::thread::spawn(move || {
            let stopped = pod.delete();
            (pod, stopped)
        });
        std::thread::sleep(ENDPOINT_REMOVAL);
        load.remove(https);
        let (old, stopped) = deletion.join().expect("delete the pod");
        assert!(
            stopped.iter().all(|s| !s.killed),
            "replica {ordinal}: {stopped:?}\n{}",
            old.logs("agent")
        );
        drop(old);

        let new = start_replica(&yaml, &node, &placements[ordinal]);
        let ready = new
            .pod
            .wait_ready(Duration::from_secs(120))
            .unwrap_or_else(|e| panic!("replica {ordinal}'s new pod: {e}"));
        // From its state: the certificates it had, and not one more order at the CA.
        let now = served(new.https, &root).unwrap_or_else(|e| {
            panic!(
                "replica {ordinal}'s new pod: {e}\n{}",
                new.pod.logs("agent")
            )
        });
        assert_eq!(now, certificates[ordinal], "replica {ordinal}");
        certificates[ordinal] = now;
        assert_eq!(pebble.issued(), issued, "replica {ordinal} ordered again");
        println!("replica {ordinal} replaced: its new pod Ready {ready:?} after it started");
        load.add(new.https);
        std::thread::sleep(PRE_STOP);
        replicas.insert(ordinal, new);
    }
    std::thread::sleep(Duration::from_secs(1));
    let report = load.stop();
    println!(
        "rolling update under load: new connections {} ok / {} failed; keep-alive {} ok / {} \
         failed / {} handed over",
        report.new_connections.ok,
        report.new_connections.failed.len(),
        report.keep_alive.ok,
        report.keep_alive.failed.len(),
        report.keep_alive.handed_over,
    );
    assert_eq!(report.failed(), 0, "{report:#?}");
    assert!(
        report.new_connections.ok > 0 && report.keep_alive.ok > 0,
        "{report:?}"
    );
}
