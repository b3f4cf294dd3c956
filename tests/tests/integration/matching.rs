//! How routes match, as clients see it through a real sozu: an exact path, a path by segment, a
//! regular expression, routes of one host and path told apart by method and by headers, which
//! of several matching routes serves a request (docs/contract.md, "Matching"), and a route
//! whose method changes while it serves.

use std::time::Duration;

use private_ingress_tests::live::{certificate, eventually, https_request, Backend, Stack};

const PATIENCE: Duration = Duration::from_secs(30);

fn upstream(backend: &Backend) -> String {
    format!(
        "upstream = \"{}\", port = {}",
        backend.address.ip(),
        backend.address.port()
    )
}

/// Who answered `method path` on `host` with `headers`: the backend's name, or the status
/// sozu answered itself with (`404`).
fn who(stack: &Stack, host: &str, method: &str, path: &str, headers: &[(&str, &str)]) -> String {
    match https_request(stack.https, host, method, path, headers) {
        Ok((seen, _)) if seen.status == 200 => seen.body,
        Ok((seen, _)) => seen.status.to_string(),
        Err(e) => format!("error: {e}"),
    }
}

/// Starts sozu and the agent on `routes` and waits until the agent is ready.
fn serve(stack: &mut Stack, hosts: &[&str], routes: &[String]) {
    for host in hosts {
        certificate(&stack.tls_dir(), host);
    }
    stack.write_workspace(&stack.workspace_text_of(routes, ""));
    stack.start_sozu();
    stack.start_agent();
    stack.wait_ready(PATIENCE);
}

/// Each request with the answer it must get: `(method, path, headers, who answers)`.
type Expected<'a> = [(&'a str, &'a str, &'a [(&'a str, &'a str)], &'a str)];

fn assert_answers(stack: &Stack, host: &str, expected: &Expected<'_>) {
    // The first one waits for the routes to be served; the rest must answer at once.
    let (method, path, headers, first) = expected[0];
    eventually(PATIENCE, "the first answer", || {
        (who(stack, host, method, path, headers) == first).then_some(())
    });
    let seen: Vec<String> = expected
        .iter()
        .map(|(method, path, headers, _)| who(stack, host, method, path, headers))
        .collect();
    let wanted: Vec<&str> = expected.iter().map(|e| e.3).collect();
    let lines: Vec<String> = expected
        .iter()
        .zip(&seen)
        .map(|((m, p, h, _), s)| format!("{m} {p} {h:?} -> {s}"))
        .collect();
    assert_eq!(seen, wanted, "{host}:\n{}", lines.join("\n"));
}

/// `path_exact`, `path_segment_prefix` and `path_regex`, each on a host of its own (so that
/// nothing else answers what they refuse). sozu matches the path with its query string: an
/// exact path and a segment prefix still match with one, a regular expression sees it.
#[test]
fn exact_segment_and_regex_paths_answer_what_they_say() {
    let (exact, segments, regex) = (
        Backend::start("exact"),
        Backend::start("segments"),
        Backend::start("regex"),
    );
    let mut stack = Stack::new();
    let routes = [
        format!(
            r#"{{ host = "exact.in.example.org", path_exact = "/v2", {} }}"#,
            upstream(&exact)
        ),
        format!(
            r#"{{ host = "seg.in.example.org", path_segment_prefix = "/v2", {} }}"#,
            upstream(&segments)
        ),
        format!(
            r#"{{ host = "re.in.example.org", path_regex = "^/v[0-9]+/[a-z]+$", {} }}"#,
            upstream(&regex)
        ),
    ];
    serve(
        &mut stack,
        &[
            "exact.in.example.org",
            "seg.in.example.org",
            "re.in.example.org",
        ],
        &routes,
    );
    assert_answers(
        &stack,
        "exact.in.example.org",
        &[
            ("GET", "/v2", &[], "exact"),
            ("GET", "/v2?page=2", &[], "exact"),
            ("GET", "/v2/x", &[], "404"),
            ("GET", "/v2/", &[], "404"),
            ("GET", "/v2example", &[], "404"),
            ("GET", "/", &[], "404"),
        ],
    );
    assert_answers(
        &stack,
        "seg.in.example.org",
        &[
            ("GET", "/v2", &[], "segments"),
            ("GET", "/v2/", &[], "segments"),
            ("GET", "/v2/x/y", &[], "segments"),
            ("GET", "/v2?page=2", &[], "segments"),
            ("GET", "/v2example", &[], "404"),
            ("GET", "/v", &[], "404"),
        ],
    );
    assert_answers(
        &stack,
        "re.in.example.org",
        &[
            ("GET", "/v12/users", &[], "regex"),
            ("GET", "/v1/x", &[], "regex"),
            // Anchored at both ends, as sozu anchors it.
            ("GET", "/v1/x/", &[], "404"),
            ("GET", "/api/v1/x", &[], "404"),
            // The query string is part of what the expression sees.
            ("GET", "/v1/x?page=2", &[], "404"),
        ],
    );
}

/// Routes of one host and one path told apart by method and by header matches (exact, regex,
/// present); header matches outrank a method; and a method changed in the workspace takes
/// effect without a request failing to find a route on the way.
#[test]
fn one_path_split_by_method_and_by_headers() {
    let names = ["read", "write", "canary", "staging", "debug", "put"];
    let backends: Vec<Backend> = names.iter().map(|n| Backend::start(n)).collect();
    let up = |name: &str| upstream(&backends[names.iter().position(|n| *n == name).unwrap()]);
    let host = "api.in.example.org";
    let routes = |write_method: &str| {
        vec![
            format!(
                r#"{{ host = "{host}", path_prefix = "/api", {} }}"#,
                up("read")
            ),
            format!(
                r#"{{ host = "{host}", path_prefix = "/api", method = "{write_method}", {} }}"#,
                up("write")
            ),
            format!(
                r#"{{ host = "{host}", path_prefix = "/api", match_headers = [{{ name = "x-canary", exact = "1" }}], {} }}"#,
                up("canary")
            ),
            format!(
                r#"{{ host = "{host}", path_prefix = "/api", match_headers = [{{ name = "X-Env", regex = "stag.*" }}], {} }}"#,
                up("staging")
            ),
            format!(
                r#"{{ host = "{host}", path_prefix = "/api", match_headers = [{{ name = "x-debug", present = true }}], {} }}"#,
                up("debug")
            ),
        ]
    };
    let mut stack = Stack::new();
    serve(&mut stack, &[host], &routes("POST"));
    assert_answers(
        &stack,
        host,
        &[
            ("GET", "/api/users", &[], "read"),
            ("POST", "/api/users", &[], "write"),
            // Methods are compared as written.
            ("PUT", "/api/users", &[], "read"),
            ("GET", "/api/users", &[("x-canary", "1")], "canary"),
            ("GET", "/api/users", &[("x-canary", "2")], "read"),
            // A route with header matches outranks one with a method.
            ("POST", "/api/users", &[("x-canary", "1")], "canary"),
            // Header names are case-insensitive; a regex matches the whole value.
            ("GET", "/api/users", &[("x-env", "staging")], "staging"),
            ("GET", "/api/users", &[("X-ENV", "stag")], "staging"),
            ("GET", "/api/users", &[("x-env", "prestaging")], "read"),
            ("GET", "/api/users", &[("x-debug", "")], "debug"),
            ("GET", "/api/users", &[("x-debug", "yes")], "debug"),
            // Two routes of the same prefix whose matches all hold: the one whose key sorts
            // later in sozu (`…;H2:"x-debug"` after `…;H0:"x-canary"`).
            (
                "GET",
                "/api/users",
                &[("x-canary", "1"), ("x-debug", "1")],
                "debug",
            ),
            ("GET", "/other", &[], "404"),
        ],
    );
    let state = stack.state().expect("/v1/state");
    let matches: Vec<String> = state["routes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["match"].as_str().map(str::to_owned))
        .collect();
    assert!(
        matches.contains(&"/api method POST".to_owned()),
        "{matches:?}"
    );
    assert!(
        matches.contains(&"/api header x-env=~\"stag.*\"".to_owned()),
        "{matches:?}"
    );

    // The write route now takes PUT: its frontend is another one for sozu (its key holds the
    // method). While it changes, every GET keeps its answer.
    stack.write_workspace(&stack.workspace_text_of(&routes("PUT"), ""));
    eventually(PATIENCE, "PUT to the write route", || {
        let put = who(&stack, host, "PUT", "/api/users", &[]);
        assert_eq!(who(&stack, host, "GET", "/api/users", &[]), "read");
        (put == "write").then_some(())
    });
    assert_answers(
        &stack,
        host,
        &[
            ("PUT", "/api/users", &[], "write"),
            ("POST", "/api/users", &[], "read"),
            ("GET", "/api/users", &[("x-canary", "1")], "canary"),
        ],
    );
    let log = stack.current_agent_log();
    assert!(
        !log.contains("already exists"),
        "sozu refused a frontend:\n{log}"
    );
    drop(backends);
}

/// Which route of a host serves a request several match, as docs/contract.md, "Matching",
/// says sozu 2.3.3 decides: an exact path before a segment prefix of the same path, a segment
/// prefix (a regex for sozu) before any text prefix, however long, and the longest text prefix
/// among text prefixes.
#[test]
fn precedence_among_a_hosts_routes_is_as_documented() {
    let names = ["root", "exact", "segments", "long", "longer"];
    let backends: Vec<Backend> = names.iter().map(|n| Backend::start(n)).collect();
    let up = |i: usize| upstream(&backends[i]);
    let host = "docs.in.example.org";
    let routes = vec![
        format!(r#"{{ host = "{host}", {} }}"#, up(0)),
        format!(r#"{{ host = "{host}", path_exact = "/docs", {} }}"#, up(1)),
        format!(
            r#"{{ host = "{host}", path_segment_prefix = "/docs", {} }}"#,
            up(2)
        ),
        format!(
            r#"{{ host = "{host}", path_prefix = "/docs/api", {} }}"#,
            up(3)
        ),
        format!(
            r#"{{ host = "{host}", path_prefix = "/static/css", {} }}"#,
            up(4)
        ),
    ];
    let mut stack = Stack::new();
    serve(&mut stack, &[host], &routes);
    assert_answers(
        &stack,
        host,
        &[
            ("GET", "/docs", &[], "exact"),
            ("GET", "/docs?q=1", &[], "exact"),
            ("GET", "/docs/", &[], "segments"),
            ("GET", "/docs/guide", &[], "segments"),
            // Unlike the Gateway API, where the longer prefix would win.
            ("GET", "/docs/api/v1", &[], "segments"),
            ("GET", "/docsearch", &[], "root"),
            ("GET", "/static/css/a.css", &[], "longer"),
            ("GET", "/static/js/a.js", &[], "root"),
        ],
    );
    drop(backends);
}
