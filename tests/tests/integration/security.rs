//! What a workspace, a certificate pair or an admin client can do to the running agent, and
//! cannot: read a secret through an import, take over another host's SNI, stall or swell the
//! admin server (docs/security.md).

use std::io::Write;
use std::time::{Duration, Instant};

use private_ingress_tests::live::{
    atomic_write, eventually, fingerprint_of_pem, https_get, route_of, Backend, Stack,
};
use private_ingress_tests::{agent_bin, run, write_certificate};

const A: &str = "a.in.example.org";
const B: &str = "b.in.example.org";

fn route(host: &str, backend: &Backend) -> String {
    format!(
        "{{ host = \"{host}\", upstream = \"{}\", port = {} }}",
        backend.address.ip(),
        backend.address.port()
    )
}

/// A self-signed pair naming `names`, valid from yesterday to 2099: it outlives any other.
fn long_lived_pair(names: &[&str]) -> (String, String) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params =
        rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
            .unwrap();
    params.not_before = rcgen::date_time_ymd(2020, 1, 1);
    params.not_after = rcgen::date_time_ymd(2099, 1, 1);
    (params.self_signed(&key).unwrap().pem(), key.serialize_pem())
}

/// A pair in A's directory that also names B, and outlives B's own, does not take B's clients:
/// sozu is told A's name alone for it, so B's clients keep B's certificate, and the status says
/// the pair names more than its host.
#[test]
fn a_pair_naming_another_host_is_served_for_its_own_host_only() {
    let mut stack = Stack::new();
    let backend = Backend::start("app");
    let b_fingerprint = private_ingress_tests::live::certificate(&stack.tls_dir(), B);
    let (crt, key) = long_lived_pair(&[A, B]);
    atomic_write(&stack.tls_dir().join(A), &crt, &key, 1);
    let a_fingerprint = fingerprint_of_pem(&crt);
    stack.write_workspace(&stack.workspace_text_of(&[route(A, &backend), route(B, &backend)], ""));
    stack.start_sozu();
    stack.start_agent();
    stack.wait_ready(Duration::from_secs(60));
    for _ in 0..10 {
        let seen = https_get(stack.https, B, "/").unwrap();
        assert_eq!(seen.fingerprint, b_fingerprint, "B's clients get B's pair");
        let seen = https_get(stack.https, A, "/").unwrap();
        assert_eq!(seen.fingerprint, a_fingerprint);
    }
    let state = stack.state().unwrap();
    let a = route_of(&state, A).unwrap();
    assert_eq!(a["certificate"]["other_names"], serde_json::json!([B]));
    let status = std::process::Command::new(agent_bin())
        .args(["status", "--admin-address", &stack.admin.to_string()])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&status.stdout);
    assert!(
        table.contains(&format!(
            "the pair of {A} also names {B}; it is served for {A} only"
        )),
        "{table}"
    );
    // B's pair gone: B has nothing to serve, and A's pair still does not answer for B.
    std::fs::remove_dir_all(stack.tls_dir().join(B)).unwrap();
    eventually(Duration::from_secs(30), "B's pair shown gone", || {
        let state = stack.state()?;
        route_of(&state, B)?["certificate"]["error_reason"]
            .as_str()
            .map(str::to_owned)
    });
    if let Ok(seen) = https_get(stack.https, B, "/") {
        assert_ne!(seen.fingerprint, a_fingerprint, "A's pair answered for B");
    }
}

/// A workspace that imports a secret (as text, as a value; into the zone, a path prefix; by an
/// absolute path, by `..`, through a link) is refused at the import: the secret appears nowhere
/// in `check`'s or `render`'s output, the agent's log, or `/v1/state`, and the last good
/// workspace keeps serving.
#[test]
fn a_workspace_cannot_read_a_secret_outside_its_tree() {
    let mut stack = Stack::new();
    let backend = Backend::start("app");
    let secrets = tempfile::tempdir().unwrap();
    let secret = "tsig-s3cret-0123456789abcdef";
    let secret_file = secrets.path().join("tsig");
    std::fs::write(&secret_file, format!("{secret}\n")).unwrap();
    let value_file = secrets.path().join("value.ncl");
    std::fs::write(&value_file, format!("\"/{secret}\"\n")).unwrap();
    let fingerprint = private_ingress_tests::live::certificate(&stack.tls_dir(), A);
    let good = stack.workspace_text_of(&[route(A, &backend)], "");
    stack.write_workspace(&good);
    stack.start_sozu();
    stack.start_agent();
    stack.wait_ready(Duration::from_secs(60));
    let workspace_dir = stack.workspace_path().parent().unwrap().to_owned();
    std::os::unix::fs::symlink(&secret_file, workspace_dir.join("innocent.txt")).unwrap();
    let relative = pathdiff(&secret_file, &workspace_dir);
    let attempts = [
        format!(
            "zone = std.string.trim (import \"{}\" as 'Text),",
            secret_file.display()
        ),
        format!(
            "zone = std.string.trim (import \"{}\" as 'Text),",
            relative.display()
        ),
        "zone = std.string.trim (import \"innocent.txt\" as 'Text),".to_owned(),
    ];
    let mut seen = String::new();
    for (i, attempt) in attempts.iter().enumerate() {
        let text = good.replacen("zone = \"in.example.org\",", attempt, 1);
        assert_ne!(text, good);
        stack.write_workspace(&text);
        let error = eventually(Duration::from_secs(60), "the edit refused", || {
            stack.state()?["workspace"]["last_error"]
                .as_str()
                .filter(|e| e.contains("import outside the workspace"))
                .map(str::to_owned)
        });
        seen.push_str(&error);
        for command in ["check", "render"] {
            let mut cmd = std::process::Command::new(agent_bin());
            cmd.arg(command).arg(stack.workspace_path());
            if command == "render" {
                cmd.args(["--format", "k8s"]);
            }
            let (code, out, err) = run(&mut cmd);
            assert_eq!(code, 1, "attempt {i}: {command}: {out}{err}");
            seen.push_str(&out);
            seen.push_str(&err);
        }
        // The last good workspace serves on.
        let served = https_get(stack.https, A, "/").unwrap();
        assert_eq!(served.fingerprint, fingerprint);
    }
    // And a value imported into a path prefix, from a file out of the tree.
    let text = good.replacen(
        "port = ",
        &format!("path_prefix = import \"{}\", port = ", value_file.display()),
        1,
    );
    stack.write_workspace(&text);
    eventually(Duration::from_secs(60), "the edit refused", || {
        stack.state()?["workspace"]["last_error"]
            .as_str()
            .filter(|e| e.contains("is an absolute path"))
            .map(|_| ())
    });
    seen.push_str(&stack.agent_logs());
    seen.push_str(&serde_json::to_string(&stack.state().unwrap()).unwrap());
    seen.push_str(&stack.metrics());
    assert!(seen.len() > 2_000, "too little output to mean anything");
    assert!(!seen.contains(secret), "the secret leaked:\n{seen}");
}

/// An error page is sent to every client of its route, so it is read from the workspace's tree
/// alone: a page named outside it (`..`, an absolute path) makes the edit refused, at its value,
/// and a page that becomes a link out of the tree after the workspace was taken is refused at
/// its next read, its last good version served instead. The secret page is never sent, and
/// appears in no output, log, state or metric.
#[test]
fn an_error_page_is_read_from_the_workspace_tree_only() {
    let mut stack = Stack::new();
    let backend = Backend::start("app");
    let secrets = tempfile::tempdir().unwrap();
    let secret = "page-s3cret-0123456789abcdef";
    let secret_page = secrets.path().join("secret-503.http");
    std::fs::write(
        &secret_page,
        format!("HTTP/1.1 503 Service Unavailable\n\n{secret}\n"),
    )
    .unwrap();
    let workspace_dir = stack.workspace_path().parent().unwrap().to_owned();
    let pages = workspace_dir.join("pages");
    std::fs::create_dir_all(&pages).unwrap();
    std::fs::write(
        pages.join("503.http"),
        "HTTP/1.1 503 Service Unavailable\n\nclosed for the night\n",
    )
    .unwrap();
    private_ingress_tests::live::certificate(&stack.tls_dir(), A);
    let drained = |page: &str| {
        format!(
            "{{ host = \"{A}\", upstream = \"{}\", port = {}, drain = true, error_pages.\"503\" = \"{page}\" }}",
            backend.address.ip(),
            backend.address.port()
        )
    };
    let good = stack.workspace_text_of(&[drained("pages/503.http")], "");
    stack.write_workspace(&good);
    stack.start_sozu();
    stack.start_agent();
    stack.wait_ready(Duration::from_secs(60));
    let served_page = || {
        eventually(Duration::from_secs(60), "the route's 503", || {
            https_get(stack.https, A, "/")
                .ok()
                .filter(|s| s.status == 503 && s.body.contains("closed"))
        })
    };
    served_page();

    let mut seen = String::new();
    let relative = pathdiff(&secret_page, &workspace_dir);
    for (page, reason) in [
        (relative.display().to_string(), "it leads out of"),
        (secret_page.display().to_string(), "it is outside"),
    ] {
        stack.write_workspace(&stack.workspace_text_of(&[drained(&page)], ""));
        let error = eventually(Duration::from_secs(60), "the edit refused", || {
            stack.state()?["workspace"]["last_error"]
                .as_str()
                .filter(|e| {
                    e.contains(&format!(
                        "error page `{page}` is not in the workspace's tree"
                    ))
                })
                .map(str::to_owned)
        });
        assert!(error.contains(reason), "{error}");
        assert!(error.contains("workspace.ncl:"), "at its value: {error}");
        seen.push_str(&error);
        for format in ["sozu-toml", "json"] {
            let (code, out, err) = run(std::process::Command::new(agent_bin())
                .arg("render")
                .arg(stack.workspace_path())
                .args(["--format", format]));
            assert_eq!(code, 1, "{format}: {out}{err}");
            seen.push_str(&out);
            seen.push_str(&err);
        }
        assert!(!served_page().body.contains(secret));
    }

    // The workspace taken again, its page then made a link out of the tree.
    stack.write_workspace(&good);
    eventually(Duration::from_secs(60), "the good workspace taken", || {
        stack.state()?["workspace"]["last_error"]
            .is_null()
            .then_some(())
    });
    let link = pages.join("503.http.new");
    std::os::unix::fs::symlink(&secret_page, &link).unwrap();
    std::fs::rename(&link, pages.join("503.http")).unwrap();
    let problem = eventually(Duration::from_secs(60), "the page refused", || {
        let state = stack.state()?;
        let text = serde_json::to_string(&route_of(&state, A)?).ok()?;
        text.contains("it is a link to").then_some(text)
    });
    seen.push_str(&problem);
    for _ in 0..5 {
        let page = served_page();
        assert!(!page.body.contains(secret), "{}", page.body);
    }
    seen.push_str(&stack.status_text());
    seen.push_str(&stack.agent_logs());
    seen.push_str(&serde_json::to_string(&stack.state().unwrap()).unwrap());
    seen.push_str(&stack.metrics());
    assert!(!seen.contains(secret), "the secret leaked:\n{seen}");
}

/// A basic-auth users file is a Secret mounted where the deployment puts it, so the workspace
/// may name one outside its tree (`..`, a link out): the agent reads it, and shows nothing of
/// what it holds. A file that is no users file is refused by its line alone; its text appears in
/// no output, log, state or metric, and no request is let in.
#[test]
fn a_users_file_outside_the_tree_shows_nothing_of_what_it_holds() {
    let mut stack = Stack::new();
    let backend = Backend::start("app");
    let secrets = tempfile::tempdir().unwrap();
    let secret = "token-s3cret-0123456789abcdef";
    let secret_file = secrets.path().join("token");
    std::fs::write(&secret_file, format!("# credentials\nservice:{secret}\n")).unwrap();
    let workspace_dir = stack.workspace_path().parent().unwrap().to_owned();
    std::fs::create_dir_all(&workspace_dir).unwrap();
    std::os::unix::fs::symlink(&secret_file, workspace_dir.join("users")).unwrap();
    private_ingress_tests::live::certificate(&stack.tls_dir(), A);
    private_ingress_tests::live::certificate(&stack.tls_dir(), B);
    let guarded = |host: &str, users: &str| {
        format!(
            "{{ host = \"{host}\", upstream = \"{}\", port = {}, basic_auth = {{ users_file = \"{users}\" }} }}",
            backend.address.ip(),
            backend.address.port()
        )
    };
    let relative = pathdiff(&secret_file, &workspace_dir);
    stack.write_workspace(&stack.workspace_text_of(
        &[
            guarded(A, &relative.display().to_string()),
            guarded(B, "users"),
        ],
        "",
    ));
    stack.start_sozu();
    stack.start_agent();
    let mut seen = String::new();
    for host in [A, B] {
        let problem = eventually(Duration::from_secs(60), "the users file refused", || {
            let state = stack.state()?;
            let text = serde_json::to_string(&route_of(&state, host)?).ok()?;
            text.contains(":2: the hash is not a SHA-256")
                .then_some(text)
        });
        seen.push_str(&problem);
        let answer = eventually(Duration::from_secs(60), "the route answering", || {
            https_get(stack.https, host, "/").ok()
        });
        assert_eq!(answer.status, 401, "{host}: {}", answer.body);
    }
    let (code, out, err) = run(std::process::Command::new(agent_bin())
        .arg("check")
        .arg(stack.workspace_path()));
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains(":2: the hash is not a SHA-256"), "{err}");
    seen.push_str(&out);
    seen.push_str(&err);
    let (_, status, _) = run(std::process::Command::new(agent_bin()).args([
        "status",
        "--admin-address",
        &stack.admin.to_string(),
    ]));
    assert!(status.contains("the hash is not a SHA-256"), "{status}");
    seen.push_str(&status);
    seen.push_str(&stack.agent_logs());
    seen.push_str(&serde_json::to_string(&stack.state().unwrap()).unwrap());
    seen.push_str(&stack.metrics());
    assert!(!seen.contains(secret), "the secret leaked:\n{seen}");
    assert!(!seen.contains("service"), "the user leaked:\n{seen}");
}

/// `to` relative to the directory `from`, with `..` steps.
fn pathdiff(to: &std::path::Path, from: &std::path::Path) -> std::path::PathBuf {
    let to: Vec<_> = to.components().collect();
    let from: Vec<_> = from.components().collect();
    let common = to.iter().zip(&from).take_while(|(a, b)| a == b).count();
    let mut path = std::path::PathBuf::new();
    for _ in common..from.len() {
        path.push("..");
    }
    for part in &to[common..] {
        path.push(part);
    }
    path
}

/// The agent's resident memory, from /proc.
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// A hundred clients ask for `/v1/state` at 1,000 routes and never read the answer: the agent's
/// resident memory stays where it was (one rendering, shared), `/healthz` answers at once, and a
/// rotation lands.
#[test]
fn clients_that_never_read_neither_stall_nor_swell_the_agent() {
    const ROUTES: usize = 1_000;
    let mut stack = Stack::new();
    let backend = Backend::start("app");
    let hosts: Vec<String> = (0..ROUTES)
        .map(|i| format!("h{i}.in.example.org"))
        .collect();
    for host in &hosts {
        write_certificate(&stack.tls_dir(), host);
    }
    let routes: Vec<String> = hosts.iter().map(|h| route(h, &backend)).collect();
    stack.write_workspace(&stack.workspace_text_of(&routes, ""));
    stack.start_sozu();
    stack.start_agent();
    stack.wait_ready(Duration::from_secs(120));
    let pid = stack.agent_pid().unwrap();
    // One full answer first, so that the rendering is in the baseline.
    let size = ureq::get(&format!("http://{}/v1/state", stack.admin))
        .call()
        .unwrap()
        .body_mut()
        .read_to_vec()
        .unwrap()
        .len();
    std::thread::sleep(Duration::from_secs(1));
    let before = rss_kib(pid);
    let clients: Vec<std::net::TcpStream> = (0..100)
        .map(|_| {
            let mut stream = std::net::TcpStream::connect(stack.admin).unwrap();
            stream
                .write_all(b"GET /v1/state HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                .unwrap();
            stream
        })
        .collect();
    std::thread::sleep(Duration::from_secs(2));
    let asked = Instant::now();
    let healthz = ureq::get(&format!("http://{}/healthz", stack.admin))
        .call()
        .map(|r| r.status().as_u16());
    let probe = asked.elapsed();
    let during = rss_kib(pid);
    // A rotation lands meanwhile.
    let host = &hosts[ROUTES / 2];
    let pair = rcgen::generate_simple_self_signed(vec![host.clone()]).unwrap();
    atomic_write(
        &stack.tls_dir().join(host),
        &pair.cert.pem(),
        &pair.signing_key.serialize_pem(),
        7,
    );
    let new = fingerprint_of_pem(&pair.cert.pem());
    eventually(Duration::from_secs(30), "the rotation served", || {
        https_get(stack.https, host, "/")
            .ok()
            .filter(|s| s.fingerprint == new)
    });
    println!(
        "/v1/state of {size} bytes to 100 clients that never read: RSS {before} KiB before, \
         {during} KiB with them; /healthz answered in {probe:?}"
    );
    assert_eq!(healthz.ok(), Some(200));
    // One copy of the body instead of a hundred (each about `size`).
    let grown = during.saturating_sub(before) * 1024;
    assert!(
        grown < 20 * size as u64,
        "RSS grew by {grown} bytes for a body of {size}\n{}",
        stack.logs()
    );
    drop(clients);
}

/// One client holds 600 idle connections to the admin address (more than the server's 512) and
/// opens each again as soon as the agent closes it; meanwhile the kubelet, from another address,
/// probes `/healthz` and `/readyz` as the rendered pod does (a new connection each, one second
/// to answer). Every probe is answered `200`. Then the probes come from the attacker's own
/// address, as they would from a node whose `hostNetwork` pod attacks: counted and shown, and
/// each still answered.
#[test]
fn idle_connections_from_one_client_do_not_starve_the_probes() {
    use private_ingress_tests::admin_clients::{probe, IdleFlood};
    use std::net::{IpAddr, Ipv4Addr};
    const IDLE: usize = 600;
    const PROBES: usize = 30;
    let attacker = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1));
    let node = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
    let mut stack = Stack::new();
    let backend = Backend::start("app");
    write_certificate(&stack.tls_dir(), A);
    stack.write_workspace(&stack.workspace_text_of(&[route(A, &backend)], ""));
    stack.start_sozu();
    stack.start_agent();
    stack.wait_ready(Duration::from_secs(60));
    let admin = stack.admin;
    let one_second = Duration::from_secs(1);
    assert_eq!(probe(node, admin, "/healthz", one_second), Ok(200));

    let flood = IdleFlood::start(attacker, admin, IDLE, 4);
    // The flood is on: the agent has closed some of its connections, and it opened them again.
    eventually(
        Duration::from_secs(30),
        "the flood reopening connections",
        || (flood.reopened() > 0).then_some(()),
    );
    let rounds = |from: IpAddr| {
        let mut failed = Vec::new();
        let mut slowest = Duration::ZERO;
        for i in 0..PROBES {
            for path in ["/healthz", "/readyz"] {
                let asked = Instant::now();
                match probe(from, admin, path, one_second) {
                    Ok(200) => slowest = slowest.max(asked.elapsed()),
                    other => failed.push(format!("{path} #{i}: {other:?}")),
                }
            }
            // The kubelet's pace, a little faster: the readiness probe runs every second.
            std::thread::sleep(Duration::from_millis(200));
        }
        (failed, slowest)
    };
    let (from_node, node_slowest) = rounds(node);
    let (from_attacker, attacker_slowest) = rounds(attacker);
    let reopened = flood.reopened();
    drop(flood);
    eprintln!(
        "{IDLE} idle connections from one client, {reopened} reopened: probes from another \
         address {} of {} failed (slowest answer {node_slowest:?}); from the attacker's own \
         address {} of {} failed (slowest {attacker_slowest:?})",
        from_node.len(),
        2 * PROBES,
        from_attacker.len(),
        2 * PROBES
    );
    assert!(
        from_node.is_empty(),
        "probes from another address failed: {from_node:#?}\n{}",
        stack.logs()
    );
    assert!(
        from_attacker.is_empty(),
        "probes from the attacker's address failed: {from_attacker:#?}"
    );
    // Said in the metrics: connections closed to make room, none refused.
    let metrics = stack.metrics();
    assert!(
        private_ingress_tests::live::sample(
            &metrics,
            "private_ingress_admin_connections_evicted_total"
        )
        .is_some_and(|n| n > 0.0),
        "{metrics}"
    );
}
