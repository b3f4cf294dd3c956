//! Route policies as users see them through a real sozu: redirects with their `Location`, a
//! stripped prefix, header edits both ways, basic auth from a watched users file, error pages,
//! and a policy changed under load without a failed request.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use private_ingress_tests::live::{
    basic_auth, certificate, eventually, https_get, https_get_sending, https_get_with_headers,
    users_line, Backend, KeepAlive, Stack,
};

const PATIENCE: Duration = Duration::from_secs(20);

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// Starts sozu and the agent on `routes` (Nickel route records, certificates made for each
/// host) with workspace fields `extra`, and waits until the agent is ready.
fn serve(stack: &mut Stack, hosts: &[&str], routes: &[String], extra: &str) {
    for host in hosts {
        certificate(&stack.tls_dir(), host);
    }
    stack.write_workspace(&stack.workspace_text_of(routes, extra));
    stack.start_sozu();
    stack.start_agent();
    stack.wait_ready(PATIENCE);
}

fn upstream(backend: &Backend) -> String {
    format!(
        "upstream = \"{}\", port = {}",
        backend.address.ip(),
        backend.address.port()
    )
}

/// A 301, a 302 and a 308, each with the `Location` its route's redirect builds.
#[test]
fn redirects_carry_the_location_their_route_builds() {
    let mut stack = Stack::new();
    let routes = [
        r#"{ host = "old.in.example.org", redirect = { host = "new.in.example.org" } }"#.to_owned(),
        r#"{ host = "tmp.in.example.org", redirect = { status = 302, path = "/maintenance" } }"#
            .to_owned(),
        r#"{ host = "api.in.example.org", redirect = { status = 308, host = "api2.in.example.org", path = "/v2$PATH[0]" } }"#
            .to_owned(),
    ];
    serve(
        &mut stack,
        &[
            "old.in.example.org",
            "tmp.in.example.org",
            "api.in.example.org",
        ],
        &routes,
        "",
    );
    for (host, path, status, location) in [
        (
            "old.in.example.org",
            "/a?b=1",
            301,
            "https://new.in.example.org/a?b=1",
        ),
        (
            "tmp.in.example.org",
            "/x",
            302,
            "https://tmp.in.example.org/maintenance",
        ),
        (
            "api.in.example.org",
            "/users",
            308,
            "https://api2.in.example.org/v2/users",
        ),
    ] {
        let (seen, headers) = eventually(PATIENCE, host, || {
            https_get_with_headers(stack.https, host, path)
                .ok()
                .filter(|(seen, _)| seen.status == status)
        });
        assert_eq!(seen.status, status, "{host}");
        assert_eq!(header(&headers, "location"), Some(location), "{host}");
    }
}

/// A stripped prefix, a request header the backend sees, a response header added and one the
/// backend sends removed; the workspace's headers apply to every route.
#[test]
fn headers_and_a_stripped_prefix_reach_the_backend_and_the_client() {
    let backend = Backend::start("app");
    let mut stack = Stack::new();
    let host = "app.in.example.org";
    let route = format!(
        r#"{{ host = "{host}", path_prefix = "/app/", {}, strip_prefix = true,
             headers = {{ request.set = {{ "X-Route" = "app" }}, response = {{ set = {{ "X-Frame-Options" = "DENY" }}, remove = ["Content-Type"] }} }} }}"#,
        upstream(&backend)
    );
    serve(
        &mut stack,
        &[host],
        &[route],
        r#"  headers.response.set = { "Referrer-Policy" = "no-referrer" },"#,
    );
    let (seen, headers) = eventually(PATIENCE, "the route served", || {
        https_get_with_headers(stack.https, host, "/app/headers")
            .ok()
            .filter(|(seen, _)| seen.status == 200)
    });
    assert!(
        seen.body.starts_with("GET /headers HTTP/1.1"),
        "the prefix is stripped before the backend sees the request: {}",
        seen.body
    );
    assert!(seen.body.contains("X-Route: app"), "{}", seen.body);
    // The prefix itself reaches the backend as its root; the query string goes along.
    for (path, expected) in [
        ("/app/?echo", "GET /?echo HTTP/1.1"),
        ("/app/headers?q=1", "GET /headers?q=1 HTTP/1.1"),
    ] {
        let (seen, _) = https_get_with_headers(stack.https, host, path).expect(path);
        assert!(seen.body.starts_with(expected), "{path}: {}", seen.body);
    }
    assert_eq!(header(&headers, "x-frame-options"), Some("DENY"));
    assert_eq!(header(&headers, "referrer-policy"), Some("no-referrer"));
    assert_eq!(header(&headers, "content-type"), None, "{headers:?}");
    // `status` lists the route's policies in one line.
    let status = stack.status_text();
    assert!(status.contains("strip /app/, 3 header edit(s)"), "{status}");
}

/// `just basic-auth-user NAME FILE`, the password on standard input.
fn set_user(file: &std::path::Path, name: &str, password: &str) {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut child = Command::new("just")
        .arg("--justfile")
        .arg(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/justfile"))
        .args(["basic-auth-user", name])
        .arg(file)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("just");
    writeln!(child.stdin.take().unwrap(), "{password}").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Basic auth from a users file: no credentials and wrong ones get 401 with
/// `WWW-Authenticate`, right ones 200, and a user removed from the file gets 401 at the next
/// request, without a restart.
#[test]
fn basic_auth_follows_its_users_file() {
    let backend = Backend::start("longhorn");
    let mut stack = Stack::new();
    let host = "longhorn.in.example.org";
    let users = stack.dir.path().join("auth/users");
    std::fs::create_dir_all(users.parent().unwrap()).unwrap();
    let file = |lines: &[(&str, &str)]| {
        let text: String = lines.iter().map(|(u, p)| users_line(u, p)).collect();
        // As a Secret's AtomicWriter would: a new file moved into place.
        let tmp = users.with_extension("tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, &users).unwrap();
    };
    // As an operator would: the recipe, then the file.
    set_user(&users, "alice", "wonderland");
    set_user(&users, "bob", "builder");
    let route = format!(
        r#"{{ host = "{host}", {}, basic_auth = {{ users_file = "{}", realm = "Longhorn" }} }}"#,
        upstream(&backend),
        users.display()
    );
    serve(&mut stack, &[host], &[route], "");
    let get = |auth: Option<String>| {
        let headers: Vec<(&str, &str)> = auth
            .as_deref()
            .map(|a| vec![("Authorization", a)])
            .unwrap_or_default();
        https_get_sending(stack.https, host, "/", &headers)
    };
    let (seen, _) = eventually(PATIENCE, "alice let in", || {
        get(Some(basic_auth("alice", "wonderland")))
            .ok()
            .filter(|(s, _)| s.status == 200)
    });
    assert_eq!(seen.body, "longhorn");
    let (none, headers) = get(None).unwrap();
    assert_eq!(none.status, 401);
    assert_eq!(
        header(&headers, "www-authenticate"),
        Some("Basic realm=\"Longhorn\"")
    );
    assert_eq!(
        get(Some(basic_auth("alice", "wrong"))).unwrap().0.status,
        401
    );
    assert_eq!(
        get(Some(basic_auth("bob", "builder"))).unwrap().0.status,
        200
    );

    file(&[("alice", "wonderland")]);
    eventually(PATIENCE, "bob refused once removed", || {
        get(Some(basic_auth("bob", "builder")))
            .ok()
            .filter(|(s, _)| s.status == 401)
    });
    assert_eq!(
        get(Some(basic_auth("alice", "wonderland")))
            .unwrap()
            .0
            .status,
        200
    );

    // A malformed file is refused, with its line, and the last good users stay.
    std::fs::write(&users, "alice:not-a-hash\n").unwrap();
    eventually(PATIENCE, "the refusal shown", || {
        stack
            .agent_logs()
            .contains("users:1: the hash is not a SHA-256")
            .then_some(())
    });
    assert!(
        !stack.agent_logs().contains("not-a-hash") && !stack.agent_logs().contains("`alice`"),
        "nothing of a users file is logged"
    );
    let status = stack.status_text();
    assert!(
        status.contains("policy file refused (its last good version stays)")
            && status.contains("users:1: the hash is not a SHA-256"),
        "{status}"
    );
    assert_eq!(
        get(Some(basic_auth("alice", "wonderland")))
            .unwrap()
            .0
            .status,
        200
    );
}

/// Past its connection cap, a client gets 429 with `Retry-After`.
#[test]
fn a_connection_cap_per_client_answers_429_with_retry_after() {
    let backend = Backend::start("app");
    let mut stack = Stack::new();
    let host = "capped.in.example.org";
    let route = format!(
        r#"{{ host = "{host}", {}, limits = {{ connections_per_ip = 2, retry_after = 30 }} }}"#,
        upstream(&backend)
    );
    serve(&mut stack, &[host], &[route], "");
    eventually(PATIENCE, "served", || {
        https_get(stack.https, host, "/")
            .ok()
            .filter(|s| s.status == 200)
    });
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut conn = KeepAlive::connect(stack.https, host).unwrap();
        assert_eq!(conn.get("/").unwrap().0, 200);
        held.push(conn);
    }
    let (seen, headers) = https_get_with_headers(stack.https, host, "/").unwrap();
    assert_eq!(seen.status, 429);
    assert_eq!(header(&headers, "retry-after"), Some("30"));
    drop(held);
}

/// A branded 503 for a drained route and a branded 404 for a host no route serves; a page that
/// is not a response of its status is refused, and the last good page stays.
#[test]
fn error_pages_brand_a_drained_route_and_an_unknown_host() {
    let backend = Backend::start("app");
    let mut stack = Stack::new();
    let host = "shop.in.example.org";
    let pages = stack.dir.path().join("ws/pages");
    std::fs::create_dir_all(&pages).unwrap();
    std::fs::write(
        pages.join("503.http"),
        "HTTP/1.1 503 Service Unavailable\nContent-Type: text/html\n\n<h1>Shop closed</h1> %ROUTE\n",
    )
    .unwrap();
    std::fs::write(
        pages.join("404.http"),
        "HTTP/1.1 404 Not Found\nContent-Type: text/html\n\n<h1>Nothing here</h1>\n",
    )
    .unwrap();
    let route = format!(
        r#"{{ host = "{host}", {}, drain = true, error_pages."503" = "pages/503.http" }}"#,
        upstream(&backend)
    );
    serve(
        &mut stack,
        &[host],
        &[route],
        r#"  error_pages = { "404" = "pages/404.http" },"#,
    );
    let seen = eventually(PATIENCE, "the branded 503", || {
        https_get(stack.https, host, "/")
            .ok()
            .filter(|s| s.body.contains("Shop closed"))
    });
    assert_eq!(seen.status, 503);
    certificate(&stack.tls_dir(), "nobody.in.example.org");
    let unknown = eventually(PATIENCE, "the branded 404", || {
        https_get(stack.https, "nobody.in.example.org", "/")
            .ok()
            .filter(|s| s.body.contains("Nothing here"))
    });
    assert_eq!(unknown.status, 404);

    std::fs::write(pages.join("503.http"), "HTTP/1.1 500 Oops\n\nbroken\n").unwrap();
    eventually(PATIENCE, "the bad page refused", || {
        stack
            .agent_logs()
            .contains("the page of 503 answers `500`")
            .then_some(())
    });
    let still = https_get(stack.https, host, "/").unwrap();
    assert!(still.body.contains("Shop closed"), "{}", still.body);

    // Pages taken out of the workspace: sozu's workers cannot forget one, so each is replaced
    // by a plain page of its status.
    let bare = format!(
        r#"{{ host = "{host}", {}, drain = true }}"#,
        upstream(&backend)
    );
    stack.write_workspace(&stack.workspace_text_of(&[bare], ""));
    let plain = eventually(PATIENCE, "the plain 503", || {
        https_get(stack.https, host, "/")
            .ok()
            .filter(|s| !s.body.contains("Shop closed"))
    });
    assert_eq!(
        (plain.status, plain.body.as_str()),
        (503, "503 Service Unavailable\r\n")
    );
    let plain = eventually(PATIENCE, "the plain 404", || {
        https_get(stack.https, "nobody.in.example.org", "/")
            .ok()
            .filter(|s| !s.body.contains("Nothing here"))
    });
    assert_eq!(
        (plain.status, plain.body.as_str()),
        (404, "404 Not Found\r\n")
    );
}

/// A route's response headers changed three times while clients send requests over HTTPS
/// without pause: every request is answered 200, and the new header arrives each time.
#[test]
fn changing_a_routes_headers_under_load_fails_no_request() {
    let backend = Backend::start("app");
    let mut stack = Stack::new();
    let host = "busy.in.example.org";
    let route = |value: u32| {
        format!(
            r#"{{ host = "{host}", {}, headers.response.set = {{ "X-Version" = "{value}" }} }}"#,
            upstream(&backend)
        )
    };
    serve(&mut stack, &[host], &[route(0)], "");
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let failures = Arc::new(std::sync::Mutex::new(Vec::new()));
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let (stop, ok, failed, failures) =
                (stop.clone(), ok.clone(), failed.clone(), failures.clone());
            let https = stack.https;
            std::thread::spawn(move || {
                let mut conn = None;
                while !stop.load(Ordering::Relaxed) {
                    let c = match conn.as_mut() {
                        Some(c) => c,
                        None => match KeepAlive::connect(https, host) {
                            Ok(c) => conn.insert(c),
                            Err(e) => {
                                failed.fetch_add(1, Ordering::Relaxed);
                                failures.lock().unwrap().push(e);
                                continue;
                            }
                        },
                    };
                    match c.get("/") {
                        Ok((200, _)) => {
                            ok.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok((status, body)) => {
                            failed.fetch_add(1, Ordering::Relaxed);
                            failures.lock().unwrap().push(format!("{status}: {body}"));
                        }
                        // A closed keep-alive connection is a new connection, not a failure.
                        Err(_) => conn = None,
                    }
                }
            })
        })
        .collect();
    for value in 1..=3 {
        stack.write_workspace(&stack.workspace_text_of(&[route(value)], ""));
        let want = value.to_string();
        eventually(PATIENCE, "the new header served", || {
            https_get_with_headers(stack.https, host, "/")
                .ok()
                .filter(|(_, h)| header(h, "x-version") == Some(want.as_str()))
        });
    }
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        client.join().unwrap();
    }
    let (ok, failed) = (ok.load(Ordering::Relaxed), failed.load(Ordering::Relaxed));
    eprintln!("{ok} requests answered 200 across three header changes, {failed} failed");
    assert!(ok > 100, "too few requests to tell: {ok}");
    assert_eq!(failed, 0, "{:?}", failures.lock().unwrap());
}

/// Two requests on one kept-alive connection to `host` each get the page of `status` holding
/// `text`: the first page ended where its `Content-Length` said, so the second request was read.
fn two_pages_on_one_connection(address: std::net::SocketAddr, host: &str, status: u16, text: &str) {
    let mut conn = KeepAlive::connect(address, host).unwrap();
    for request in 1..=2 {
        let (seen, body) = conn
            .get("/")
            .unwrap_or_else(|e| panic!("{host}, request {request} on one connection: {e}"));
        assert_eq!(seen, status, "{host}: {body}");
        assert!(body.contains(text), "{host}: {body}");
    }
}

/// The sozu configuration rendered from a workspace with every policy the file can hold, loaded
/// by sozu alone: the same redirect, stripped prefix, headers, 429, branded 503 and 404 as the
/// agent gives; basic auth, whose users stay in their file, refuses every request (401). The
/// workspace is rendered from its own directory, naming its pages relative to it, and sozu
/// starts from another: the pages are in the file, framed for a kept-alive client.
#[test]
fn the_rendered_file_alone_behaves_as_the_agent_does() {
    use private_ingress_tests::{agent_bin, run};
    use std::process::Command;

    let backend = Backend::start("app");
    let mut stack = Stack::new();
    let pages = stack.dir.path().join("ws/pages");
    std::fs::create_dir_all(&pages).unwrap();
    std::fs::write(
        pages.join("503.http"),
        "HTTP/1.1 503 Service Unavailable\nContent-Type: text/html\n\n<h1>Shop closed</h1>\n",
    )
    .unwrap();
    std::fs::write(
        pages.join("404.http"),
        "HTTP/1.1 404 Not Found\nContent-Type: text/html\n\n<h1>Nothing here</h1>\n",
    )
    .unwrap();
    let up = upstream(&backend);
    let routes = [
        r#"{ host = "old.in.example.org", redirect = { host = "new.in.example.org" } }"#.to_owned(),
        format!(
            r#"{{ host = "app.in.example.org", path_prefix = "/app/", {up}, strip_prefix = true,
                 headers = {{ request.set = {{ "X-Route" = "app" }}, response.set = {{ "X-Frame-Options" = "DENY" }} }},
                 limits.connections_per_ip = 2 }}"#
        ),
        format!(
            r#"{{ host = "shop.in.example.org", {up}, drain = true, error_pages."503" = "pages/503.http" }}"#
        ),
        format!(
            r#"{{ host = "admin.in.example.org", {up}, basic_auth = {{ users_file = "{}", realm = "Admin" }} }}"#,
            stack.dir.path().join("users").display()
        ),
    ];
    for host in [
        "old.in.example.org",
        "app.in.example.org",
        "shop.in.example.org",
        "admin.in.example.org",
        "nobody.in.example.org",
    ] {
        certificate(&stack.tls_dir(), host);
    }
    let text = stack.workspace_text_of(&routes, r#"  error_pages = { "404" = "pages/404.http" },"#);
    let ws = stack.dir.path().join("ws/workspace.ncl");
    std::fs::write(&ws, &text).unwrap();
    let config = stack.dir.path().join("rendered.toml");
    let (code, _, err) = run(Command::new(agent_bin())
        .current_dir(ws.parent().unwrap())
        .args([
            "render",
            "workspace.ncl",
            "--format",
            "sozu-toml",
            "--output",
        ])
        .arg(&config)
        .arg("--sozu-socket")
        .arg(stack.socket()));
    assert_eq!(code, 0, "render failed: {err}");
    assert!(
        err.contains("admin.in.example.org/`: its basic-auth users are not written"),
        "{err}"
    );
    assert_ne!(
        std::env::current_dir().unwrap(),
        ws.parent().unwrap(),
        "sozu starts from another directory"
    );
    stack.start_sozu_with_config(&config);

    let (seen, headers) = eventually(PATIENCE, "the redirect", || {
        https_get_with_headers(stack.https, "old.in.example.org", "/a")
            .ok()
            .filter(|(s, _)| s.status == 301)
    });
    assert_eq!(seen.status, 301);
    assert_eq!(
        header(&headers, "location"),
        Some("https://new.in.example.org/a")
    );
    let (seen, headers) =
        https_get_with_headers(stack.https, "app.in.example.org", "/app/headers").unwrap();
    assert!(
        seen.body.starts_with("GET /headers HTTP/1.1"),
        "{}",
        seen.body
    );
    assert!(seen.body.contains("X-Route: app"), "{}", seen.body);
    assert_eq!(header(&headers, "x-frame-options"), Some("DENY"));
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut conn = KeepAlive::connect(stack.https, "app.in.example.org").unwrap();
        assert_eq!(conn.get("/app/").unwrap().0, 200);
        held.push(conn);
    }
    let capped = https_get(stack.https, "app.in.example.org", "/app/").unwrap();
    assert_eq!(capped.status, 429);
    drop(held);
    for (host, status, text) in [
        ("shop.in.example.org", 503, "Shop closed"),
        ("nobody.in.example.org", 404, "Nothing here"),
    ] {
        two_pages_on_one_connection(stack.https, host, status, text);
    }
    let (admin, headers) = https_get_sending(
        stack.https,
        "admin.in.example.org",
        "/",
        &[("Authorization", &basic_auth("alice", "wonderland"))],
    )
    .unwrap();
    assert_eq!(admin.status, 401);
    assert_eq!(
        header(&headers, "www-authenticate"),
        Some("Basic realm=\"Admin\"")
    );
}

/// The lines of `head` (a request or response head) that are the header `name`, by value.
fn every(head: &str, name: &str) -> Vec<String> {
    head.lines()
        .filter_map(|line| {
            let (n, v) = line.split_once(':')?;
            n.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_owned())
        })
        .collect()
}

/// A header a policy sets is the only one of its name, whatever the client or the backend sent
/// under that name (in any case): on the request, a client's own value is replaced; on the
/// response, a backend's `X-Frame-Options: ALLOWALL` gives way to the route's, and to the
/// workspace's on a route without one.
#[test]
fn a_header_a_policy_sets_is_the_only_one_of_its_name() {
    let backend = Backend::start("app");
    let mut stack = Stack::new();
    let (own, plain) = ("app.in.example.org", "plain.in.example.org");
    let routes = [
        format!(
            r#"{{ host = "{own}", {}, headers = {{ request.set = {{ "X-Policy" = "policy-value" }},
                 response.set = {{ "X-Frame-Options" = "SAMEORIGIN" }} }} }}"#,
            upstream(&backend)
        ),
        format!(r#"{{ host = "{plain}", {} }}"#, upstream(&backend)),
    ];
    serve(
        &mut stack,
        &[own, plain],
        &routes,
        r#"  headers.response.set = { "X-Frame-Options" = "DENY" },"#,
    );
    let (seen, headers) = eventually(PATIENCE, "the route served", || {
        https_get_sending(
            stack.https,
            own,
            "/respond/X-Frame-Options/ALLOWALL?echo",
            &[("X-Policy", "client-value"), ("x-policy", "second-value")],
        )
        .ok()
        .filter(|(s, _)| s.status == 200)
    });
    assert_eq!(
        every(&seen.body, "x-policy"),
        ["policy-value"],
        "what the backend got:\n{}",
        seen.body
    );
    let frame = |headers: &[(String, String)]| -> Vec<String> {
        headers
            .iter()
            .filter(|(n, _)| n == "x-frame-options")
            .map(|(_, v)| v.clone())
            .collect()
    };
    assert_eq!(frame(&headers), ["SAMEORIGIN"], "{headers:?}");
    let (seen, headers) =
        https_get_with_headers(stack.https, plain, "/respond/x-frame-options/ALLOWALL").unwrap();
    assert_eq!(seen.status, 200);
    assert_eq!(frame(&headers), ["DENY"], "{headers:?}");
}

/// Why `rewrite.host` and `rewrite.port` are refused, shown on sozu 2.3.3 itself (a frontend of
/// its own file, no agent): a rewritten host reaches the backend as two `Host` headers, which
/// RFC 9112 has a server answer 400 (Go's net/http and nginx do), and a rewritten port reaches
/// it nowhere. The day a sozu sends one, this test fails, and the refusal can be lifted.
#[test]
fn sozu_rewriting_a_host_sends_two_host_headers_and_a_rewritten_port_nowhere() {
    use private_ingress_tests::{agent_bin, run};
    use std::io::{Read, Write};

    let backend = Backend::start("app");
    let mut stack = Stack::new();
    let config = stack.dir.path().join("sozu.toml");
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str(&format!(
        "[[listeners]]\nprotocol = \"http\"\naddress = \"{http}\"\n\n\
         [clusters.pinned]\nprotocol = \"http\"\n\
         frontends = [{{ address = \"{http}\", hostname = \"app.in.example.org\", \
         rewrite_host = \"internal.example.net\", rewrite_port = 8443 }}]\n\
         backends = [{{ address = \"{backend}\" }}]\n",
        http = stack.http,
        backend = backend.address,
    ));
    std::fs::write(&config, text).unwrap();
    stack.start_sozu_with_config(&config);
    let head = eventually(PATIENCE, "sozu forwarding", || {
        let mut conn = std::net::TcpStream::connect(stack.http).ok()?;
        conn.set_read_timeout(Some(PATIENCE)).ok()?;
        conn.write_all(
            b"GET /headers HTTP/1.1\r\nHost: app.in.example.org\r\nConnection: close\r\n\r\n",
        )
        .ok()?;
        let mut answer = String::new();
        conn.read_to_string(&mut answer).ok()?;
        answer.starts_with("HTTP/1.1 200").then_some(answer)
    });
    assert_eq!(
        every(&head, "host"),
        ["internal.example.net", "internal.example.net"],
        "what the backend got:\n{head}"
    );
    assert!(!head.contains("8443"), "what the backend got:\n{head}");

    // And the contract says so.
    let ws = stack.dir.path().join("ws/workspace.ncl");
    for (rewrite, message) in [
        (
            r#"host = "internal.example.net""#,
            "`rewrite.host` would give the backend two `Host` headers",
        ),
        (
            "port = 8443",
            "`rewrite.port` changes nothing the backend sees",
        ),
    ] {
        let route = format!(
            r#"{{ host = "app.in.example.org", {}, rewrite = {{ {rewrite} }} }}"#,
            upstream(&backend)
        );
        std::fs::write(&ws, stack.workspace_text_of(&[route], "")).unwrap();
        let (code, _, err) = run(std::process::Command::new(agent_bin())
            .arg("check")
            .arg(&ws));
        assert_eq!(code, 1, "{err}");
        assert!(err.contains(message), "{err}");
    }
}

/// Error pages written as docs/contract.md shows them, without `Content-Length`, are sent
/// framed: a client that keeps its connection alive reads the page to its end and sends its
/// next request on the same connection (a route's 503, the workspace's 404 and 503).
#[test]
fn error_pages_keep_a_kept_alive_connection_usable() {
    let backend = Backend::start("app");
    let mut stack = Stack::new();
    let pages = stack.dir.path().join("ws/pages");
    std::fs::create_dir_all(&pages).unwrap();
    for (file, page) in [
        (
            "shop-503.http",
            "HTTP/1.1 503 Service Unavailable\nContent-Type: text/html\n\n<h1>Shop closed</h1> %ROUTE\n",
        ),
        (
            "503.http",
            "HTTP/1.1 503 Service Unavailable\nContent-Type: text/html\n\n<h1>Back soon</h1>\n",
        ),
        (
            "404.http",
            "HTTP/1.1 404 Not Found\nContent-Type: text/html\n\n<h1>Nothing here</h1>\n",
        ),
    ] {
        std::fs::write(pages.join(file), page).unwrap();
    }
    let (shop, blog) = ("shop.in.example.org", "blog.in.example.org");
    let routes = [
        format!(
            r#"{{ host = "{shop}", {}, drain = true, error_pages."503" = "pages/shop-503.http" }}"#,
            upstream(&backend)
        ),
        format!(
            r#"{{ host = "{blog}", {}, drain = true }}"#,
            upstream(&backend)
        ),
    ];
    serve(
        &mut stack,
        &[shop, blog],
        &routes,
        r#"  error_pages = { "404" = "pages/404.http", "503" = "pages/503.http" },"#,
    );
    for (host, status, text) in [
        (shop, 503, "Shop closed"),
        (blog, 503, "Back soon"),
        ("nobody.in.example.org", 404, "Nothing here"),
    ] {
        // The pages reach sozu after the routes: wait for this one on connections of their own.
        eventually(PATIENCE, text, || {
            https_get(stack.https, host, "/")
                .ok()
                .filter(|s| s.status == status && s.body.contains(text))
        });
        two_pages_on_one_connection(stack.https, host, status, text);
    }
}
