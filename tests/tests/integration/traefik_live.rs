//! The workspace's `traefik` record served live by the agent and a real sozu: Orca's directory
//! of files (written atomically, one per service, a `unix://` server each) edited, added,
//! broken, drained and removed while clients watch; Atlas's endpoint polled while it changes,
//! stalls and answers garbage; a router that cannot be carried answering nothing. What a
//! client gets is asserted, and what `/v1/state`, `status` and `/metrics` say of each problem.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use private_ingress_tests::live::{eventually, free_port, https_get, sample, Backend, Stack};
use private_ingress_tests::write_certificate;

use super::traefik::unix_echo;

const PATIENCE: Duration = Duration::from_secs(30);

/// Orca's emitter output, as the issue shows it, for `service` at `path` on `socket`.
fn orca(service: &str, path: &str, socket: &Path, weight: Option<u32>) -> String {
    let weight = weight
        .map(|w| format!("\n            weight: {w}"))
        .unwrap_or_default();
    format!(
        "http:\n  routers:\n    orca-{service}:\n      rule: PathPrefix(\"{path}\")\n      service: orca-{service}\n      tls:\n        certResolver: orca\n        domains:\n          - main: \"cluster.orca.local\"\n  services:\n    orca-{service}:\n      loadBalancer:\n        servers:\n          - url: \"unix://{}\"{weight}\n        healthCheck: {{ path: /healthz, interval: 5s, timeout: 1s }}\n",
        socket.display()
    )
}

/// Written as Orca writes: a temporary file beside it, then renamed over it.
fn write_atomically(path: &Path, text: &str) {
    let tmp = path.with_extension("yaml.tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// The status a request for `path` of `host` gets (0 when it fails), and the body.
fn get(stack: &Stack, host: &str, path: &str) -> (u16, String) {
    match https_get(stack.https, host, path) {
        Ok(seen) => (seen.status, seen.body),
        Err(e) => (0, e),
    }
}

/// The `traefik` section of `/v1/state`.
fn traefik_state(stack: &Stack) -> serde_json::Value {
    stack
        .state()
        .map(|s| s["workspace"]["traefik"].clone())
        .unwrap_or_default()
}

/// The error `/v1/state` shows for the source whose name ends with `name`.
fn source_error(stack: &Stack, name: &str) -> Option<String> {
    traefik_state(stack)["sources"]
        .as_array()?
        .iter()
        .find(|s| s["source"].as_str().is_some_and(|n| n.ends_with(name)))?["error"]
        .as_str()
        .map(str::to_owned)
}

/// A workspace of no routes of its own, in zone `zone`, with `traefik` as its record.
fn workspace(stack: &Stack, zone: &str, traefik: &str) -> String {
    stack
        .workspace_text_of(&[], &format!("  traefik = {traefik},\n"))
        .replace("zone = \"in.example.org\"", &format!("zone = \"{zone}\""))
}

/// Orca's directory, live: its exact output served (a unix socket, which Traefik itself
/// cannot), then a file edited (the old path gone, the new one served), a file added, a file
/// half written (the last good routes stay, the error with its file and line shown, then
/// cleared once fixed), a drain (`weight: 0` on every server), a router that cannot be carried
/// (answers nothing, says why), and a file removed (its routes gone).
#[test]
fn orcas_directory_is_served_live_through_every_edit() {
    let mut stack = Stack::new();
    write_certificate(&stack.tls_dir(), "cluster.orca.local");
    let sockets = stack.dir.path().join("alloc");
    std::fs::create_dir_all(&sockets).unwrap();
    let web_socket = sockets.join("web.sock");
    let api_socket = sockets.join("api.sock");
    unix_echo(&web_socket, "web");
    unix_echo(&api_socket, "api");
    // Relative to the workspace's directory, as the record allows.
    let dynamic = stack.dir.path().join("ws/dynamic");
    std::fs::create_dir_all(&dynamic).unwrap();
    let web = dynamic.join("orca-web.yaml");
    write_atomically(&web, &orca("web", "/web", &web_socket, None));
    stack.write_workspace(&workspace(
        &stack,
        "orca.local",
        "{ directory = \"dynamic\" }",
    ));
    stack.start_sozu();
    stack.start_agent();
    stack.wait_ready(PATIENCE);

    let host = "cluster.orca.local";
    // Ready means served: the first workspace the agent serves has the directory's routes.
    let (status, body) = get(&stack, host, "/web/index.html");
    assert!(
        status == 200 && body.starts_with("echo:web"),
        "Orca's unix socket served once ready: {status} {body}"
    );
    let state = stack.state().unwrap();
    let route = private_ingress_tests::live::route_of(&state, host).unwrap();
    let origin = route["origin"].as_str().unwrap();
    assert!(
        origin.starts_with("traefik: ")
            && origin.ends_with("ws/dynamic/orca-web.yaml:3: http router `orca-web`"),
        "{origin}"
    );
    assert!(stack.status_text().contains("http router `orca-web`"));

    // Edited: the path changes.
    write_atomically(&web, &orca("web", "/web2", &web_socket, None));
    eventually(PATIENCE, "the new path served, the old one gone", || {
        let new = get(&stack, host, "/web2/x");
        let old = get(&stack, host, "/web/x");
        (new.0 == 200 && new.1.starts_with("echo:web") && old.0 == 404).then_some(())
    });

    // Added: a router of its own file.
    let api = dynamic.join("orca-api.yaml");
    let written = std::time::Instant::now();
    write_atomically(&api, &orca("api", "/api", &api_socket, None));
    eventually(PATIENCE, "the added router served", || {
        let (status, body) = get(&stack, host, "/api/v1");
        (status == 200 && body.starts_with("echo:api")).then_some(())
    });
    eprintln!("a file added: served after {:?}", written.elapsed());

    // Broken: half written (a writer that does not rename), invalid YAML.
    let text = orca("api", "/api", &api_socket, None);
    let half = format!("{}\n   - [", &text[..text.find("tls:").unwrap() + 4]);
    std::fs::write(&api, half).unwrap();
    let error = eventually(PATIENCE, "the broken file's error in /v1/state", || {
        source_error(&stack, "orca-api.yaml")
    });
    assert!(error.contains("orca-api.yaml:"), "file and line: {error}");
    let (status, body) = get(&stack, host, "/api/v1");
    assert_eq!(
        (status, body.starts_with("echo:api")),
        (200, true),
        "the last good routes stay"
    );
    let status_text = stack.status_text();
    assert!(
        status_text.contains("error, last good kept"),
        "{status_text}"
    );
    assert!(status_text.contains("orca-api.yaml:"), "{status_text}");
    let metrics = stack.metrics();
    let series = format!(
        "private_ingress_traefik_source_errors{{source=\"{}\",kind=\"file\"}}",
        api.display()
    );
    assert_eq!(sample(&metrics, &series), Some(1.0), "{metrics}");
    // Fixed: the error clears.
    write_atomically(&api, &orca("api", "/api", &api_socket, None));
    eventually(PATIENCE, "the error cleared", || {
        let state = traefik_state(&stack);
        let source = state["sources"]
            .as_array()?
            .iter()
            .find(|s| {
                s["source"]
                    .as_str()
                    .is_some_and(|n| n.ends_with("orca-api.yaml"))
            })?
            .clone();
        (source["state"] == "ok" && source["error"].is_null()).then_some(())
    });

    // Drained: `weight: 0` on every server, as Orca drains.
    write_atomically(&web, &orca("web", "/web2", &web_socket, Some(0)));
    eventually(PATIENCE, "the drained route answers 503", || {
        (get(&stack, host, "/web2/x").0 == 503).then_some(())
    });
    assert_eq!(
        get(&stack, host, "/api/v1").0,
        200,
        "the other file's route goes on"
    );

    // Fail closed: a router with forwardAuth answers nothing, and says why.
    let guarded = dynamic.join("guarded.yaml");
    write_atomically(
        &guarded,
        &format!(
            "http:\n  routers:\n    guarded:\n      rule: PathPrefix(`/guarded`)\n      service: orca-api\n      middlewares: [auth]\n      tls:\n        domains:\n          - main: \"cluster.orca.local\"\n  middlewares:\n    auth:\n      forwardAuth:\n        address: \"http://127.0.0.1:{}/auth\"\n",
            free_port()
        ),
    );
    let refused = eventually(PATIENCE, "the guarded router refused in /v1/state", || {
        traefik_state(&stack)["refused"]
            .as_array()?
            .iter()
            .filter_map(|r| r.as_str())
            .find(|r| r.contains("router `guarded`"))
            .map(str::to_owned)
    });
    assert!(
        refused.contains("guarded.yaml:3:") && refused.contains("forwardAuth"),
        "{refused}"
    );
    assert_eq!(
        get(&stack, host, "/guarded/x").0,
        404,
        "served without its forwardAuth"
    );
    assert!(stack.status_text().contains("router `guarded`: not served"));

    // Each problem was an event: the broken file and the refused router, in the backlog a
    // client joining now gets.
    let events = events_until(stack.admin, "router `guarded`");
    assert!(
        events.contains("traefik file refused (its last good version stays): ")
            && events.contains("orca-api.yaml:"),
        "{events}"
    );
    assert!(
        events.contains("traefik file ") && events.contains("read again"),
        "{events}"
    );

    // Removed: its routes go.
    std::fs::remove_file(&api).unwrap();
    eventually(PATIENCE, "the removed file's route gone", || {
        (get(&stack, host, "/api/v1").0 == 404).then_some(())
    });
}

/// `/v1/events` as a client joining now gets it (the backlog first), read until `until` is in
/// it or the stream stalls.
fn events_until(admin: SocketAddr, until: &str) -> String {
    let mut stream = std::net::TcpStream::connect(admin).expect("connect to the admin address");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("read timeout");
    write!(stream, "GET /v1/events HTTP/1.1\r\nHost: {admin}\r\n\r\n").expect("send the request");
    let mut got = Vec::new();
    let mut chunk = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains(until) {
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&chunk[..n]),
        }
    }
    String::from_utf8_lossy(&got).into_owned()
}

/// What the test endpoint does when asked.
#[derive(Clone)]
enum Answer {
    Json(String),
    /// Answers after two seconds: an endpoint slow at the agent's start.
    Slow(String),
    /// Answers 500.
    Failing,
    /// Accepts the connection and never answers.
    Stall,
    Garbage,
}

/// An HTTP server standing for Atlas: answers `GET /v1/integrations/traefik/config` as told.
struct Atlas {
    address: SocketAddr,
    answer: Arc<Mutex<Answer>>,
}

impl Atlas {
    fn start(answer: Answer) -> Atlas {
        let listener = TcpListener::bind(("127.0.0.1", 0)).unwrap();
        let address = listener.local_addr().unwrap();
        let answer = Arc::new(Mutex::new(answer));
        let shared = answer.clone();
        std::thread::spawn(move || {
            let mut stalled = Vec::new();
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                let answer = shared.lock().unwrap().clone();
                let mut buf = [0u8; 4096];
                let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
                let _ = stream.read(&mut buf);
                let body = match answer {
                    Answer::Stall => {
                        stalled.push(stream);
                        continue;
                    }
                    Answer::Json(json) => json,
                    Answer::Slow(json) => {
                        std::thread::sleep(Duration::from_secs(2));
                        json
                    }
                    Answer::Garbage => "<html>502 Bad Gateway</html> {\"http\": [".to_owned(),
                    Answer::Failing => {
                        let _ = write!(
                            stream,
                            "HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                        );
                        continue;
                    }
                };
                let _ = write!(
                    stream,
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        Atlas { address, answer }
    }

    fn set(&self, answer: Answer) {
        *self.answer.lock().unwrap() = answer;
    }

    fn endpoint(&self) -> String {
        format!("http://{}/v1/integrations/traefik/config", self.address)
    }
}

/// Atlas's answer: one router per route, `tls: {}`, a service with sorted servers and
/// `passHostHeader`.
fn atlas(routes: &[(&str, &str, &Backend)]) -> String {
    let mut routers = serde_json::Map::new();
    let mut services = serde_json::Map::new();
    for (name, prefix, backend) in routes {
        routers.insert(
            (*name).into(),
            serde_json::json!({
                "rule": format!("Host(`app.in.example.org`) && PathPrefix(`{prefix}`)"),
                "service": name,
                "tls": {},
            }),
        );
        services.insert(
            (*name).into(),
            serde_json::json!({
                "loadBalancer": {
                    "servers": [{ "url": format!("http://{}", backend.address) }],
                    "passHostHeader": true,
                }
            }),
        );
    }
    serde_json::json!({ "http": { "routers": routers, "services": services } }).to_string()
}

/// Atlas's endpoint, polled: its routes served, a change taken within a poll or two, a stall
/// and garbage leaving the last good routes served with the error shown, and later answers
/// taken again.
#[test]
fn atlas_endpoint_is_polled_and_its_last_good_answer_survives_stalls_and_garbage() {
    let a = Backend::start("atlas-a");
    let b = Backend::start("atlas-b");
    let mut stack = Stack::new();
    write_certificate(&stack.tls_dir(), "app.in.example.org");
    let atlas_server = Atlas::start(Answer::Slow(atlas(&[("api", "/api", &a)])));
    stack.write_workspace(&workspace(
        &stack,
        "in.example.org",
        &format!(
            "{{ endpoint = \"{}\", poll_interval = 1 }}",
            atlas_server.endpoint()
        ),
    ));
    stack.start_sozu();
    stack.start_agent();
    stack.wait_ready(PATIENCE);
    let host = "app.in.example.org";
    // Ready means served: the first workspace waits for the endpoint's first answer, slow as
    // it is.
    let (status, body) = get(&stack, host, "/api/x");
    assert!(
        status == 200 && body.trim() == "atlas-a",
        "Atlas's route served once ready: {status} {body}"
    );

    atlas_server.set(Answer::Json(atlas(&[("api", "/api", &a)])));
    // A change: the route moves to another backend and a second route comes.
    atlas_server.set(Answer::Json(atlas(&[
        ("api", "/api", &b),
        ("web", "/web", &a),
    ])));
    let started = std::time::Instant::now();
    eventually(PATIENCE, "the change picked up", || {
        let api = get(&stack, host, "/api/x");
        let web = get(&stack, host, "/web/x");
        (api.0 == 200 && api.1.trim() == "atlas-b" && web.0 == 200).then_some(())
    });
    eprintln!(
        "change served after {:?} (poll_interval 1 s)",
        started.elapsed()
    );

    // A stall: the last good routes stay; the error is shown.
    atlas_server.set(Answer::Stall);
    let error = eventually(PATIENCE, "the stall shown", || {
        source_error(&stack, "/v1/integrations/traefik/config")
    });
    assert!(error.contains("no complete answer within 5 s"), "{error}");
    assert_eq!(
        get(&stack, host, "/web/x").0,
        200,
        "the last good routes stay"
    );

    // Answering again: taken.
    atlas_server.set(Answer::Json(atlas(&[("api", "/api", &a)])));
    eventually(PATIENCE, "the answer taken after the stall", || {
        let web = get(&stack, host, "/web/x");
        let cleared = source_error(&stack, "/traefik/config").is_none();
        (web.0 == 404 && cleared).then_some(())
    });

    // An error status: the last good routes stay; the status is shown.
    atlas_server.set(Answer::Failing);
    let error = eventually(PATIENCE, "the error status shown", || {
        source_error(&stack, "/traefik/config")
    });
    assert!(error.contains("500"), "{error}");
    assert_eq!(get(&stack, host, "/api/x").1.trim(), "atlas-a");

    // Garbage: the last good routes stay; the error names the answer's line.
    atlas_server.set(Answer::Garbage);
    let error = eventually(PATIENCE, "the garbage shown", || {
        source_error(&stack, "/traefik/config").filter(|e| !e.contains("answered 500"))
    });
    let line = error
        .strip_prefix(&format!("{}:", atlas_server.endpoint()))
        .and_then(|rest| rest.split(':').next())
        .and_then(|line| line.parse::<u32>().ok());
    assert!(line.is_some(), "the answer's line: {error}");
    let (status, body) = get(&stack, host, "/api/x");
    assert!(status == 200 && body.trim() == "atlas-a", "{status} {body}");
    let status_text = stack.status_text();
    assert!(status_text.contains("endpoint"), "{status_text}");
}

/// `check` reads the record's directory as the agent would: a file that does not parse and a
/// router that cannot be carried are errors with their file and line (exit 1), the endpoint is
/// said to be read live only; `render` includes the routes the files hold.
#[test]
fn check_and_render_read_the_traefik_directory() {
    let dir = tempfile::tempdir().unwrap();
    let dynamic = dir.path().join("dynamic");
    std::fs::create_dir_all(&dynamic).unwrap();
    std::fs::write(
        dynamic.join("app.yaml"),
        "http:\n  routers:\n    app:\n      rule: Host(`app.in.example.org`) && PathPrefix(`/api`)\n      service: app\n      tls: {}\n  services:\n    app:\n      loadBalancer:\n        servers:\n          - url: \"http://10.0.0.7:8080\"\n",
    )
    .unwrap();
    let workspace = dir.path().join("ws.ncl");
    std::fs::write(
        &workspace,
        "{\n  zone = \"in.example.org\",\n  cluster_issuer = \"internal-ca\",\n  traefik = { directory = \"dynamic\", endpoint = \"http://atlas.internal:8080/v1/integrations/traefik/config\" },\n  routes = [],\n}\n",
    )
    .unwrap();
    let check = |ws: &Path| {
        private_ingress_tests::run(
            std::process::Command::new(private_ingress_tests::agent_bin())
                .arg("check")
                .arg(ws),
        )
    };
    let (code, out, err) = check(&workspace);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("1 route (1 from traefik)"), "{out}");
    assert!(err.contains("is read live only"), "{err}");

    let (code, toml, err) = private_ingress_tests::run(
        std::process::Command::new(private_ingress_tests::agent_bin())
            .args(["render", "--format", "sozu-toml"])
            .arg(&workspace),
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        toml.contains("app.in.example.org") && toml.contains("10.0.0.7:8080"),
        "{toml}"
    );

    std::fs::write(
        dynamic.join("guarded.yaml"),
        "http:\n  routers:\n    guarded:\n      rule: Host(`g.in.example.org`)\n      service: app\n      middlewares: [auth]\n      tls: {}\n  middlewares:\n    auth:\n      forwardAuth:\n        address: http://auth\n",
    )
    .unwrap();
    std::fs::write(dynamic.join("broken.yaml"), "http:\n  routers:\n    x: [\n").unwrap();
    let (code, out, err) = check(&workspace);
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains("broken.yaml:"), "{err}");
    assert!(
        err.contains("guarded.yaml:3: http router `guarded`: not served:")
            && err.contains("forwardAuth"),
        "{err}"
    );
}

/// One file (`file`), mounted as a ConfigMap mounts it: a link into `..data`, which the kubelet
/// swaps by rename to a new directory and removes the old one. The new version is served.
#[test]
fn a_configmap_swap_of_the_one_file_is_followed() {
    use std::os::unix::fs::symlink;
    let a = Backend::start("cm-a");
    let b = Backend::start("cm-b");
    let mut stack = Stack::new();
    write_certificate(&stack.tls_dir(), "app.in.example.org");
    let routes = |backend: &Backend| {
        format!(
            "http:\n  routers:\n    app:\n      rule: Host(`app.in.example.org`)\n      service: app\n      tls: {{}}\n  services:\n    app:\n      loadBalancer:\n        servers:\n          - url: \"http://{}\"\n",
            backend.address
        )
    };
    let cm = stack.dir.path().join("ws/cm");
    let first = cm.join("..2026_12_06_01");
    std::fs::create_dir_all(&first).unwrap();
    std::fs::write(first.join("routes.yaml"), routes(&a)).unwrap();
    symlink("..2026_12_06_01", cm.join("..data")).unwrap();
    symlink("..data/routes.yaml", cm.join("routes.yaml")).unwrap();
    stack.write_workspace(&workspace(
        &stack,
        "in.example.org",
        "{ file = \"cm/routes.yaml\" }",
    ));
    stack.start_sozu();
    stack.start_agent();
    stack.wait_ready(PATIENCE);
    let (status, body) = get(&stack, "app.in.example.org", "/");
    assert_eq!((status, body.trim()), (200, "cm-a"));

    // The kubelet's swap: a new directory, a new link renamed over `..data`, the old one gone.
    let second = cm.join("..2026_12_06_02");
    std::fs::create_dir_all(&second).unwrap();
    std::fs::write(second.join("routes.yaml"), routes(&b)).unwrap();
    symlink("..2026_12_06_02", cm.join("..data_tmp")).unwrap();
    std::fs::rename(cm.join("..data_tmp"), cm.join("..data")).unwrap();
    std::fs::remove_dir_all(&first).unwrap();
    eventually(PATIENCE, "the swapped file served", || {
        let (status, body) = get(&stack, "app.in.example.org", "/");
        (status == 200 && body.trim() == "cm-b").then_some(())
    });
    assert!(source_error(&stack, "routes.yaml").is_none());
}

/// Atlas's endpoint polled by a real Traefik (its HTTP provider) and by the agent at once: the
/// same requests get the same answers (status, and the backend that answered), before and after
/// Atlas's answer changes.
#[test]
fn atlas_answers_alike_through_traefik_and_the_agent() {
    let a = Backend::start("twin-a");
    let b = Backend::start("twin-b");
    let mut stack = Stack::new();
    write_certificate(&stack.tls_dir(), "app.in.example.org");
    let atlas_server = Atlas::start(Answer::Json(atlas(&[
        ("api", "/api", &a),
        ("web", "/web", &b),
    ])));
    let dir = stack.dir.path().join("traefik");
    std::fs::create_dir_all(&dir).unwrap();
    let traefik = super::traefik::Traefik::start_with(
        &dir,
        &format!(
            "http: {{ endpoint: \"{}\", pollInterval: 1s }}",
            atlas_server.endpoint()
        ),
    );
    stack.write_workspace(&workspace(
        &stack,
        "in.example.org",
        &format!(
            "{{ endpoint = \"{}\", poll_interval = 1 }}",
            atlas_server.endpoint()
        ),
    ));
    stack.start_sozu();
    stack.start_agent();
    stack.wait_ready(PATIENCE);
    let paths = ["/api/x?q=1", "/web/y", "/other", "/apiary"];
    // What one server answers each path: the status, and the backend for a 200.
    let answers = |address: SocketAddr| -> Vec<(u16, String)> {
        paths
            .iter()
            .map(
                |path| match https_get(address, "app.in.example.org", path) {
                    Ok(seen) if seen.status == 200 => (200, seen.body.trim().to_owned()),
                    Ok(seen) => (seen.status, String::new()),
                    Err(e) => (0, e),
                },
            )
            .collect()
    };
    let expected = vec![
        (200, "twin-a".to_owned()),
        (200, "twin-b".to_owned()),
        (404, String::new()),
        (200, "twin-a".to_owned()),
    ];
    eventually(
        PATIENCE,
        "Traefik and the agent answering Atlas's routes",
        || {
            let (through_traefik, through_sozu) =
                (answers(traefik.websecure), answers(stack.https));
            (through_traefik == expected && through_sozu == expected).then_some(())
        },
    );

    atlas_server.set(Answer::Json(atlas(&[("api", "/api", &b)])));
    let expected = vec![
        (200, "twin-b".to_owned()),
        (404, String::new()),
        (404, String::new()),
        (200, "twin-b".to_owned()),
    ];
    eventually(PATIENCE, "both taking Atlas's new answer", || {
        let (through_traefik, through_sozu) = (answers(traefik.websecure), answers(stack.https));
        (through_traefik == expected && through_sozu == expected).then_some(())
    });
}

/// Faults a user meets: the directory is not there when the agent starts (Orca not started yet),
/// which is shown and tried again until it is; a router that takes a match of the workspace's
/// own routes is refused, and the workspace's route goes on serving.
#[test]
fn a_directory_made_later_is_read_and_the_workspaces_own_routes_win() {
    let own = Backend::start("own");
    let theirs = Backend::start("theirs");
    let mut stack = Stack::new();
    for host in ["app.in.example.org", "new.in.example.org"] {
        write_certificate(&stack.tls_dir(), host);
    }
    let own_route = format!(
        "{{ host = \"app.in.example.org\", upstream = \"127.0.0.1\", port = {} }}",
        own.address.port()
    );
    let text = stack.workspace_text_of(&[own_route], "  traefik = { directory = \"dynamic\" },\n");
    stack.write_workspace(&text);
    stack.start_sozu();
    stack.start_agent();
    stack.wait_ready(PATIENCE);
    let error = eventually(PATIENCE, "the missing directory shown", || {
        source_error(&stack, "ws/dynamic")
    });
    assert!(error.contains("ws/dynamic"), "{error}");
    assert_eq!(get(&stack, "app.in.example.org", "/").1.trim(), "own");

    let dynamic = stack.dir.path().join("ws/dynamic");
    std::fs::create_dir_all(&dynamic).unwrap();
    write_atomically(
        &dynamic.join("routes.yaml"),
        &format!(
            "http:\n  routers:\n    takes-app:\n      rule: Host(`app.in.example.org`)\n      service: s\n      tls: {{}}\n    new:\n      rule: Host(`new.in.example.org`)\n      service: s\n      tls: {{}}\n  services:\n    s:\n      loadBalancer:\n        servers:\n          - url: \"http://{}\"\n",
            theirs.address
        ),
    );
    eventually(PATIENCE, "the directory read once it exists", || {
        let (status, body) = get(&stack, "new.in.example.org", "/");
        (status == 200 && body.trim() == "theirs").then_some(())
    });
    assert!(source_error(&stack, "ws/dynamic").is_none());
    assert_eq!(
        get(&stack, "app.in.example.org", "/").1.trim(),
        "own",
        "the workspace's own route wins"
    );
    let refused = traefik_state(&stack)["refused"].to_string();
    assert!(
        refused.contains("routes.yaml:3: http router `takes-app`: not served: host `app.in.example.org` / is already served by the workspace's route"),
        "{refused}"
    );

    // The directory moved away and removed (its watch goes with it) and made again, as a deploy
    // that replaces it does: its last good routes serve meanwhile, and the new one is watched
    // and read. Moved first: `rm -r` in place removes its files one by one before the
    // directory, and each file removed is its routes removed (as documented), which the source
    // may see before the directory goes.
    let away = stack.dir.path().join("ws/dynamic.old");
    std::fs::rename(&dynamic, &away).unwrap();
    std::fs::remove_dir_all(&away).unwrap();
    let error = eventually(PATIENCE, "the removed directory shown", || {
        source_error(&stack, "ws/dynamic")
    });
    assert!(error.contains("ws/dynamic"), "{error}");
    assert_eq!(
        get(&stack, "new.in.example.org", "/").1.trim(),
        "theirs",
        "the last good routes serve while the directory is gone"
    );
    std::fs::create_dir_all(&dynamic).unwrap();
    write_atomically(
        &dynamic.join("again.yaml"),
        &format!(
            "http:\n  routers:\n    again:\n      rule: Host(`new.in.example.org`) && PathPrefix(`/again`)\n      service: s\n      tls: {{}}\n  services:\n    s:\n      loadBalancer:\n        servers:\n          - url: \"http://{}\"\n",
            own.address
        ),
    );
    eventually(
        PATIENCE,
        "the directory made again watched and read",
        || {
            let (status, body) = get(&stack, "new.in.example.org", "/again");
            (status == 200 && body.trim() == "own").then_some(())
        },
    );
    // A file written after the new directory is read too: it is watched, not read once.
    write_atomically(
        &dynamic.join("later.yaml"),
        &format!(
            "http:\n  routers:\n    later:\n      rule: Host(`new.in.example.org`) && PathPrefix(`/later`)\n      service: s2\n      tls: {{}}\n  services:\n    s2:\n      loadBalancer:\n        servers:\n          - url: \"http://{}\"\n",
            theirs.address
        ),
    );
    eventually(
        PATIENCE,
        "a file written into the new directory served",
        || {
            let (status, body) = get(&stack, "new.in.example.org", "/later");
            (status == 200 && body.trim() == "theirs").then_some(())
        },
    );
    assert!(source_error(&stack, "ws/dynamic").is_none());
}

/// A pair that the configuration's `tls.certificates` names (relative to the file, as Traefik
/// files beside their certificates often say), served live for the router's host, and a
/// renewal renamed into place under the same path served within a second, with nothing else
/// touched: Traefik itself picks it up only when a configuration file changes.
#[test]
fn a_certificate_renewed_under_a_tls_certificates_path_is_served_live_within_a_second() {
    use private_ingress_tests::live::fingerprint_of_pem;
    let backend = Backend::start("app");
    let mut stack = Stack::new();
    let host = "certs.in.example.org";
    let dynamic = stack.dir.path().join("dynamic");
    let certs = dynamic.join("certs");
    std::fs::create_dir_all(&certs).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let issue = || {
        rcgen::CertificateParams::new(vec![host.to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap()
            .pem()
    };
    let first = issue();
    let crt_path = certs.join("certs.crt");
    std::fs::write(&crt_path, &first).unwrap();
    std::fs::write(certs.join("certs.key"), key.serialize_pem()).unwrap();
    std::fs::write(
        dynamic.join("certs.yaml"),
        format!(
            "http:\n  routers:\n    web: {{ rule: \"Host(`{host}`)\", service: a, tls: {{}} }}\n  services:\n    a: {{ loadBalancer: {{ servers: [{{ url: \"http://{}\" }}] }} }}\ntls:\n  certificates:\n    - {{ certFile: certs/certs.crt, keyFile: certs/certs.key }}\n",
            backend.address
        ),
    )
    .unwrap();
    stack.write_workspace(&workspace(
        &stack,
        "in.example.org",
        &format!("{{ directory = \"{}\" }}", dynamic.display()),
    ));
    stack.start_sozu();
    stack.start_agent();
    stack.wait_ready(PATIENCE);
    let fingerprint = || {
        https_get(stack.https, host, "/")
            .map(|seen| seen.fingerprint)
            .unwrap_or_else(|e| format!("error: {e}"))
    };
    let old = fingerprint_of_pem(&first);
    eventually(PATIENCE, "the pair tls.certificates names served", || {
        (fingerprint() == old).then_some(())
    });
    assert_eq!(get(&stack, host, "/").0, 200, "the router is served");

    let renewed = issue();
    let new = fingerprint_of_pem(&renewed);
    let tmp = certs.join("certs.crt.tmp");
    std::fs::write(&tmp, &renewed).unwrap();
    let since = std::time::Instant::now();
    std::fs::rename(&tmp, &crt_path).unwrap();
    let took = eventually(PATIENCE, "the renewed certificate served", || {
        (fingerprint() == new).then(|| since.elapsed())
    });
    eprintln!("renamed into place → served in {took:?}");
    assert!(
        took < Duration::from_secs(1),
        "served {took:?} after the rename; a pair named by path is watched as the tls dir's are"
    );
}
