//! The Gateway API conformance suite's HTTPRoute cases (kubernetes-sigs/gateway-api,
//! `conformance/tests/httproute-*`), written here in our own words: each case's routes are
//! translated with `private-ingress import gateway`, served by the agent and a real sozu to echo
//! backends standing for the suite's Services, and every request the suite sends is checked as
//! the suite checks it: which Service answered, the path and headers it got, or the status and
//! `Location` of the answer. Requests go over HTTPS (every workspace route is), with the host the
//! suite names; the suite's `example.com`-style hosts are names of this workspace's zone here.
//!
//! The cases sozu cannot express are in [`NOT_EXPRESSIBLE`]: `import` must leave their rule out
//! with its reason (exit 1), never serve it in a weaker form. docs/import.md's "The conformance
//! suite's HTTPRoute cases" counts both.

use std::time::{Duration, Instant};

use private_ingress_tests::live::{certificate, https_request, Backend, Echoed, Seen, Stack};
use private_ingress_tests::{agent_bin, run};

const PATIENCE: Duration = Duration::from_secs(30);
const NS: &str = "gateway-conformance-infra";
/// The host of the routes that name none: the suite's Gateway address.
const GATEWAY_HOST: &str = "gw.in.example.org";

/// The suite's namespace of backends that routes of other namespaces name.
const WEB: &str = "gateway-conformance-web-backend";
/// The Services the echo backends stand for: (name, namespace).
const SERVICES: [(&str, &str); 4] = [
    ("infra-backend-v1", NS),
    ("infra-backend-v2", NS),
    ("infra-backend-v3", NS),
    ("web-backend", WEB),
];

/// What the suite's base manifests give every case: the Gateway `same-namespace`, the Gateway
/// `backend-namespaces` (routes of namespaces labelled `gateway-conformance: backend`), the
/// namespace `gateway-conformance-web-backend` so labelled, and the backends' Services.
fn base() -> String {
    let mut text = format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{ name: same-namespace, namespace: {NS} }}\n\
         spec:\n  gatewayClassName: private-ingress\n  listeners:\n  - {{ name: http, port: 80, protocol: HTTP, allowedRoutes: {{ namespaces: {{ from: Same }} }} }}\n"
    );
    text.push_str(&format!(
        "---\napiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{ name: backend-namespaces, namespace: {NS} }}\n\
         spec:\n  gatewayClassName: private-ingress\n  listeners:\n  - {{ name: http, port: 80, protocol: HTTP, allowedRoutes: {{ namespaces: {{ from: Selector, selector: {{ matchLabels: {{ gateway-conformance: backend }} }} }} }} }}\n\
         ---\napiVersion: v1\nkind: Namespace\nmetadata: {{ name: {WEB}, labels: {{ gateway-conformance: backend }} }}\n"
    ));
    for (name, namespace) in SERVICES {
        text.push_str(&format!(
            "---\napiVersion: v1\nkind: Service\nmetadata: {{ name: {name}, namespace: {namespace} }}\nspec: {{ ports: [{{ name: first-port, port: 8080 }}] }}\n"
        ));
    }
    text
}

/// An HTTPRoute of the base namespace attached to `same-namespace`.
fn route(name: &str, hostnames: &[&str], rules: &str) -> String {
    let hostnames = if hostnames.is_empty() {
        String::new()
    } else {
        format!("  hostnames: [{}]\n", hostnames.join(", "))
    };
    format!(
        "---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{ name: {name}, namespace: {NS} }}\n\
         spec:\n  parentRefs: [{{ name: same-namespace }}]\n{hostnames}  rules:\n{rules}"
    )
}

type Headers = &'static [(&'static str, &'static str)];

/// One request and what the suite expects of it.
struct Request {
    method: &'static str,
    host: &'static str,
    path: &'static str,
    headers: &'static [(&'static str, &'static str)],
    expect: Expect,
}

enum Expect {
    /// This Service answered; the path it got when given (a rewrite).
    Backend(&'static str, Option<&'static str>),
    /// This Service answered, and got these headers (name, value) and none of those named.
    Edited(&'static str, Headers, &'static [&'static str]),
    Status(u16),
    /// A redirect: its status and `Location`.
    Redirect(u16, &'static str),
}

fn get(path: &'static str, expect: Expect) -> Request {
    Request {
        method: "GET",
        host: GATEWAY_HOST,
        path,
        headers: &[],
        expect,
    }
}

fn v(n: u8) -> Expect {
    Expect::Backend(
        ["infra-backend-v1", "infra-backend-v2", "infra-backend-v3"][usize::from(n - 1)],
        None,
    )
}

struct Case {
    name: &'static str,
    manifests: String,
    requests: Vec<Request>,
}

/// A rule of one `PathPrefix` match that redirects (`requestRedirect`'s fields, YAML flow style).
fn redirect_rule(prefix: &str, redirect: &str) -> String {
    format!("  - matches: [{{ path: {{ type: PathPrefix, value: {prefix} }} }}]\n    filters: [{{ type: RequestRedirect, requestRedirect: {{ {redirect} }} }}]\n")
}

fn redirect(path: &'static str, status: u16, location: &'static str) -> Request {
    get(path, Expect::Redirect(status, location))
}

/// The cases sozu 2.3.3 can express, each with every request the suite sends.
fn cases() -> Vec<Case> {
    let one_backend = |name: &str| format!("    backendRefs: [{{ name: {name}, port: 8080 }}]\n");
    vec![
        Case {
            name: "HTTPRouteSimpleSameNamespace",
            manifests: route("gateway-conformance-infra-test", &[], &format!("  - {}", one_backend("infra-backend-v1").trim_start())),
            requests: vec![get("/", v(1))],
        },
        Case {
            name: "HTTPRouteMatching",
            manifests: route(
                "matching",
                &[],
                &format!(
                    "  - matches: [{{ path: {{ type: PathPrefix, value: / }} }}, {{ headers: [{{ name: version, value: one }}] }}]\n{}\
                     \x20 - matches: [{{ path: {{ type: PathPrefix, value: /v2 }} }}, {{ headers: [{{ name: version, value: two }}] }}]\n{}",
                    one_backend("infra-backend-v1"),
                    one_backend("infra-backend-v2")
                ),
            ),
            requests: vec![
                get("/", v(1)),
                get("/example", v(1)),
                Request { headers: &[("Version", "one")], ..get("/", v(1)) },
                get("/v2", v(2)),
                get("/v2/example", v(2)),
                Request { headers: &[("Version", "two")], ..get("/", v(2)) },
                get("/v2/", v(2)),
                get("/v2example", v(1)),
                get("/foo/v2/example", v(1)),
            ],
        },
        Case {
            name: "HTTPRouteExactPathMatching",
            manifests: route(
                "exact-matching",
                &[],
                &format!(
                    "  - matches: [{{ path: {{ type: Exact, value: /one }} }}]\n{}\
                     \x20 - matches: [{{ path: {{ type: Exact, value: /two }} }}]\n{}",
                    one_backend("infra-backend-v1"),
                    one_backend("infra-backend-v2")
                ),
            ),
            requests: vec![
                get("/one", v(1)),
                get("/two", v(2)),
                get("/", Expect::Status(404)),
                get("/one/example", Expect::Status(404)),
                get("/two/", Expect::Status(404)),
                get("/Two", Expect::Status(404)),
            ],
        },
        Case {
            name: "HTTPRoutePathMatchOrder",
            manifests: route(
                "path-matching-order",
                &[],
                &[
                    ("Exact", "/match", "infra-backend-v1"),
                    ("Exact", "/match/exact", "infra-backend-v2"),
                    ("Exact", "/match/exact/one", "infra-backend-v3"),
                    ("PathPrefix", "/match/", "infra-backend-v3"),
                    ("PathPrefix", "/match/prefix/", "infra-backend-v1"),
                    ("PathPrefix", "/match/prefix/one", "infra-backend-v2"),
                ]
                .iter()
                .map(|(kind, value, backend)| {
                    format!("  - matches: [{{ path: {{ type: {kind}, value: {value} }} }}]\n{}", one_backend(backend))
                })
                .collect::<String>(),
            ),
            requests: vec![
                get("/match/exact/one", v(3)),
                get("/match/exact", v(2)),
                get("/match", v(1)),
                get("/match/prefix/one/any", v(2)),
                get("/match/prefix/any", v(1)),
                get("/match/any", v(3)),
            ],
        },
        Case {
            name: "HTTPRouteHeaderMatching",
            manifests: route(
                "header-matching",
                &[],
                &format!(
                    "  - matches: [{{ headers: [{{ name: version, value: one }}] }}]\n{}\
                     \x20 - matches: [{{ headers: [{{ name: version, value: two }}] }}]\n{}\
                     \x20 - matches: [{{ headers: [{{ name: version, value: two }}, {{ name: color, value: orange }}] }}]\n{}\
                     \x20 - matches: [{{ headers: [{{ name: color, value: blue }}] }}, {{ headers: [{{ name: color, value: green }}] }}]\n{}\
                     \x20 - matches: [{{ headers: [{{ name: color, value: red }}] }}, {{ headers: [{{ name: color, value: yellow }}] }}]\n{}",
                    one_backend("infra-backend-v1"),
                    one_backend("infra-backend-v2"),
                    one_backend("infra-backend-v1"),
                    one_backend("infra-backend-v1"),
                    one_backend("infra-backend-v2"),
                ),
            ),
            requests: vec![
                Request { headers: &[("Version", "one")], ..get("/", v(1)) },
                Request { headers: &[("Version", "two")], ..get("/", v(2)) },
                Request { headers: &[("Version", "two"), ("Color", "orange")], ..get("/", v(1)) },
                Request { headers: &[("Version", "two"), ("Color", "blue")], ..get("/", v(2)) },
                Request { headers: &[("Color", "orange")], ..get("/", Expect::Status(404)) },
                Request { headers: &[("Some-Other-Header", "one")], ..get("/", Expect::Status(404)) },
                Request { headers: &[("Color", "blue")], ..get("/", v(1)) },
                Request { headers: &[("Color", "green")], ..get("/", v(1)) },
                Request { headers: &[("Color", "red")], ..get("/", v(2)) },
                Request { headers: &[("Color", "yellow")], ..get("/", v(2)) },
                Request { headers: &[("Color", "purple")], ..get("/", Expect::Status(404)) },
            ],
        },
        Case {
            name: "HTTPRouteMethodMatching",
            manifests: route(
                "method-matching",
                &[],
                &format!(
                    "  - matches: [{{ method: POST }}]\n{}\
                     \x20 - matches: [{{ method: GET }}]\n{}\
                     \x20 - matches: [{{ path: {{ type: PathPrefix, value: /path1 }}, method: GET }}]\n{}\
                     \x20 - matches: [{{ headers: [{{ name: version, value: one }}], method: PUT }}]\n{}\
                     \x20 - matches: [{{ path: {{ type: PathPrefix, value: /path2 }}, headers: [{{ name: version, value: two }}], method: POST }}]\n{}\
                     \x20 - matches: [{{ path: {{ type: PathPrefix, value: /path3 }}, method: PATCH }}, {{ path: {{ type: PathPrefix, value: /path4 }}, headers: [{{ name: version, value: three }}], method: DELETE }}]\n{}\
                     \x20 - matches: [{{ path: {{ type: PathPrefix, value: /path5 }} }}]\n{}\
                     \x20 - matches: [{{ method: PATCH }}]\n{}\
                     \x20 - matches: [{{ headers: [{{ name: version, value: four }}] }}]\n{}",
                    one_backend("infra-backend-v1"),
                    one_backend("infra-backend-v2"),
                    one_backend("infra-backend-v1"),
                    one_backend("infra-backend-v2"),
                    one_backend("infra-backend-v3"),
                    one_backend("infra-backend-v1"),
                    one_backend("infra-backend-v1"),
                    one_backend("infra-backend-v2"),
                    one_backend("infra-backend-v3"),
                ),
            ),
            requests: vec![
                Request { method: "POST", ..get("/", v(1)) },
                get("/", v(2)),
                Request { method: "HEAD", ..get("/", Expect::Status(404)) },
                get("/path1", v(1)),
                Request { method: "PUT", headers: &[("version", "one")], ..get("/", v(2)) },
                Request { method: "POST", headers: &[("version", "two")], ..get("/path2", v(3)) },
                Request { method: "PATCH", ..get("/path3", v(1)) },
                Request { method: "DELETE", headers: &[("version", "three")], ..get("/path4", v(1)) },
                Request { method: "PUT", ..get("/", Expect::Status(404)) },
                Request { method: "DELETE", ..get("/path4", Expect::Status(404)) },
                Request { method: "PATCH", ..get("/path5", v(1)) },
                Request { method: "PATCH", headers: &[("version", "four")], ..get("/", v(2)) },
            ],
        },
        Case {
            name: "HTTPRouteMatchingAcrossRoutes",
            manifests: format!(
                "{}{}",
                route(
                    "matching-part1",
                    &["com.in.example.org", "net.in.example.org"],
                    &format!("  - matches: [{{ path: {{ type: PathPrefix, value: / }} }}, {{ headers: [{{ name: version, value: one }}] }}]\n{}", one_backend("infra-backend-v1")),
                ),
                route(
                    "matching-part2",
                    &["com.in.example.org"],
                    &format!("  - matches: [{{ path: {{ type: PathPrefix, value: /v2 }} }}, {{ headers: [{{ name: version, value: two }}] }}]\n{}", one_backend("infra-backend-v2")),
                ),
            ),
            requests: vec![
                Request { host: "com.in.example.org", ..get("/", v(1)) },
                Request { host: "com.in.example.org", ..get("/example", v(1)) },
                Request { host: "net.in.example.org", ..get("/example", v(1)) },
                Request { host: "com.in.example.org", headers: &[("Version", "one")], ..get("/example", v(1)) },
                Request { host: "com.in.example.org", ..get("/v2", v(2)) },
                Request { host: "net.in.example.org", ..get("/v2", v(1)) },
                Request { host: "com.in.example.org", ..get("/v2/example", v(2)) },
                Request { host: "com.in.example.org", headers: &[("Version", "two")], ..get("/", v(2)) },
            ],
        },
        Case {
            name: "HTTPRouteRewritePath",
            manifests: route(
                "rewrite-path",
                &[],
                &format!(
                    "  - matches: [{{ path: {{ type: PathPrefix, value: /prefix/one }} }}]\n    filters: [{{ type: URLRewrite, urlRewrite: {{ path: {{ type: ReplacePrefixMatch, replacePrefixMatch: /one }} }} }}]\n{}\
                     \x20 - matches: [{{ path: {{ type: PathPrefix, value: /strip-prefix }} }}]\n    filters: [{{ type: URLRewrite, urlRewrite: {{ path: {{ type: ReplacePrefixMatch, replacePrefixMatch: / }} }} }}]\n{}\
                     \x20 - matches: [{{ path: {{ type: PathPrefix, value: /full/one }} }}]\n    filters: [{{ type: URLRewrite, urlRewrite: {{ path: {{ type: ReplaceFullPath, replaceFullPath: /one }} }} }}]\n{}",
                    one_backend("infra-backend-v1"),
                    one_backend("infra-backend-v1"),
                    one_backend("infra-backend-v1"),
                ),
            ),
            requests: vec![
                get("/prefix/one/two", Expect::Backend("infra-backend-v1", Some("/one/two"))),
                get("/strip-prefix/three", Expect::Backend("infra-backend-v1", Some("/three"))),
                get("/strip-prefix", Expect::Backend("infra-backend-v1", Some("/"))),
                get("/full/one/two", Expect::Backend("infra-backend-v1", Some("/one"))),
            ],
        },
        Case {
            name: "HTTPRouteRedirectHostAndStatus",
            manifests: route(
                "redirect-host-and-status",
                &[],
                "  - matches: [{ path: { type: PathPrefix, value: /hostname-redirect } }]\n    filters: [{ type: RequestRedirect, requestRedirect: { hostname: example.in.example.org } }]\n\
                 \x20 - matches: [{ path: { type: PathPrefix, value: /host-and-status } }]\n    filters: [{ type: RequestRedirect, requestRedirect: { hostname: example.in.example.org, statusCode: 301 } }]\n",
            ),
            requests: vec![
                get("/hostname-redirect", Expect::Redirect(302, "https://example.in.example.org/hostname-redirect")),
                get("/host-and-status", Expect::Redirect(301, "https://example.in.example.org/host-and-status")),
            ],
        },
        Case {
            name: "HTTPRouteRequestHeaderModifier",
            manifests: route(
                "request-header-modifier",
                &[],
                &format!(
                    "  - matches: [{{ path: {{ type: PathPrefix, value: /set }} }}]\n    filters: [{{ type: RequestHeaderModifier, requestHeaderModifier: {{ set: [{{ name: X-Header-Set, value: set-overwrites-values }}] }} }}]\n{}\
                     \x20 - matches: [{{ path: {{ type: PathPrefix, value: /remove }} }}]\n    filters: [{{ type: RequestHeaderModifier, requestHeaderModifier: {{ remove: [X-Header-Remove] }} }}]\n{}",
                    one_backend("infra-backend-v1"),
                    one_backend("infra-backend-v1"),
                ),
            ),
            requests: vec![
                Request {
                    headers: &[("Some-Other-Header", "val")],
                    ..get("/set", Expect::Edited("infra-backend-v1", &[("X-Header-Set", "set-overwrites-values")], &[]))
                },
                Request {
                    headers: &[("Some-Other-Header", "val"), ("X-Header-Set", "some-other-value")],
                    ..get("/set", Expect::Edited("infra-backend-v1", &[("X-Header-Set", "set-overwrites-values")], &[]))
                },
                Request {
                    headers: &[("X-Header-Remove", "val")],
                    ..get("/remove", Expect::Edited("infra-backend-v1", &[], &["X-Header-Remove"]))
                },
            ],
        },
        Case {
            name: "HTTPRouteCrossNamespace",
            manifests: format!(
                "---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{ name: cross-namespace, namespace: {WEB} }}\n\
                 spec:\n  parentRefs: [{{ name: backend-namespaces, namespace: {NS} }}]\n  rules:\n  - {}",
                one_backend("web-backend").trim_start()
            ),
            requests: vec![get("/", Expect::Backend("web-backend", None))],
        },
        Case {
            name: "HTTPRouteReferenceGrant",
            manifests: format!(
                "---\napiVersion: gateway.networking.k8s.io/v1beta1\nkind: ReferenceGrant\nmetadata: {{ name: reference-grant, namespace: {WEB} }}\n\
                 spec:\n  from: [{{ group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: {NS} }}]\n  to: [{{ group: \"\", kind: Service, name: web-backend }}]\n{}",
                route(
                    "reference-grant",
                    &[],
                    &format!("  - backendRefs: [{{ name: web-backend, namespace: {WEB}, port: 8080 }}]\n"),
                )
            ),
            requests: vec![get("/", Expect::Backend("web-backend", None))],
        },
        Case {
            name: "HTTPRouteRedirectPath",
            manifests: route(
                "redirect-path",
                &[],
                &[
                    ("/original-prefix", "path: { type: ReplacePrefixMatch, replacePrefixMatch: /replacement-prefix }"),
                    ("/full", "path: { type: ReplaceFullPath, replaceFullPath: /full-path-replacement }"),
                    ("/path-and-host", "hostname: example.in.example.org, path: { type: ReplacePrefixMatch, replacePrefixMatch: /replacement-prefix }"),
                    ("/path-and-status", "path: { type: ReplacePrefixMatch, replacePrefixMatch: /replacement-prefix }, statusCode: 301"),
                    ("/full-path-and-host", "hostname: example.in.example.org, path: { type: ReplaceFullPath, replaceFullPath: /replacement-full }"),
                    ("/full-path-and-status", "path: { type: ReplaceFullPath, replaceFullPath: /replacement-full }, statusCode: 301"),
                ]
                .iter()
                .map(|(prefix, r)| redirect_rule(prefix, r))
                .collect::<String>(),
            ),
            requests: vec![
                redirect("/original-prefix/lemon", 302, "https://gw.in.example.org/replacement-prefix/lemon"),
                redirect("/full/path/original", 302, "https://gw.in.example.org/full-path-replacement"),
                redirect("/path-and-host", 302, "https://example.in.example.org/replacement-prefix"),
                redirect("/path-and-status", 301, "https://gw.in.example.org/replacement-prefix"),
                redirect("/full-path-and-host", 302, "https://example.in.example.org/replacement-full"),
                redirect("/full-path-and-status", 301, "https://gw.in.example.org/replacement-full"),
            ],
        },
        Case {
            name: "HTTPRouteRedirectScheme",
            manifests: route(
                "redirect-scheme",
                &[],
                &[
                    ("/scheme", "scheme: https"),
                    ("/scheme-and-host", "hostname: example.in.example.org, scheme: https"),
                    ("/scheme-and-status", "scheme: https, statusCode: 301"),
                    ("/scheme-and-host-and-status", "scheme: https, statusCode: 302, hostname: example.in.example.org"),
                ]
                .iter()
                .map(|(prefix, r)| redirect_rule(prefix, r))
                .collect::<String>(),
            ),
            requests: vec![
                redirect("/scheme", 302, "https://gw.in.example.org/scheme"),
                redirect("/scheme-and-host", 302, "https://example.in.example.org/scheme-and-host"),
                redirect("/scheme-and-status", 301, "https://gw.in.example.org/scheme-and-status"),
                redirect("/scheme-and-host-and-status", 302, "https://example.in.example.org/scheme-and-host-and-status"),
            ],
        },
        Case {
            name: "HTTPRouteRedirectPort",
            manifests: route(
                "redirect-port",
                &[],
                &[
                    ("/port", "port: 8083"),
                    ("/port-and-host", "hostname: example.in.example.org, port: 8083"),
                    ("/port-and-status", "port: 8083, statusCode: 301"),
                    ("/port-and-host-and-status", "port: 8083, hostname: example.in.example.org, statusCode: 302"),
                ]
                .iter()
                .map(|(prefix, r)| redirect_rule(prefix, r))
                .collect::<String>(),
            ),
            requests: vec![
                redirect("/port", 302, "https://gw.in.example.org:8083/port"),
                redirect("/port-and-host", 302, "https://example.in.example.org:8083/port-and-host"),
                redirect("/port-and-status", 301, "https://gw.in.example.org:8083/port-and-status"),
                redirect("/port-and-host-and-status", 302, "https://example.in.example.org:8083/port-and-host-and-status"),
            ],
        },
        Case {
            name: "HTTPRoute308Redirect",
            manifests: route("308-redirect", &[], &redirect_rule("/permanent", "statusCode: 308")),
            requests: vec![redirect("/permanent", 308, "https://gw.in.example.org/permanent")],
        },
    ]
}

/// The cases (and the parts of a case) sozu 2.3.3 cannot express, and the reason `import`
/// gives for leaving each rule out: (case, a rule of it, the words of the reason).
pub const NOT_EXPRESSIBLE: &[(&str, &str, &str)] = &[
    (
        "HTTPRouteQueryParamMatching",
        "  - matches: [{ queryParams: [{ name: animal, value: whale }] }]\n    backendRefs: [{ name: infra-backend-v1, port: 8080 }]\n",
        "queryParams: sozu 2.3.3 does not match a query string",
    ),
    (
        "HTTPRouteRequestMirror",
        "  - filters: [{ type: RequestMirror, requestMirror: { backendRef: { name: infra-backend-v2, port: 8080 } } }]\n    backendRefs: [{ name: infra-backend-v1, port: 8080 }]\n",
        "RequestMirror: sozu 2.3.3 sends a request to one backend",
    ),
    (
        "HTTPRouteRequestHeaderModifier",
        "  - filters: [{ type: RequestHeaderModifier, requestHeaderModifier: { add: [{ name: X-Header-Add, value: add-appends-values }] } }]\n    backendRefs: [{ name: infra-backend-v1, port: 8080 }]\n",
        "a header modifier's `add`",
    ),
    (
        "HTTPRouteResponseHeaderModifier",
        "  - filters: [{ type: ResponseHeaderModifier, responseHeaderModifier: { add: [{ name: X-Header-Add, value: add-appends-values }] } }]\n    backendRefs: [{ name: infra-backend-v1, port: 8080 }]\n",
        "a header modifier's `add`",
    ),
    (
        "HTTPRouteTimeoutRequest",
        "  - timeouts: { request: 500ms }\n    backendRefs: [{ name: infra-backend-v1, port: 8080 }]\n",
        "`timeouts`: sozu 2.3.3 has none per route",
    ),
    (
        "HTTPRouteRetry",
        "  - retry: { codes: [500], attempts: 2 }\n    backendRefs: [{ name: infra-backend-v1, port: 8080 }]\n",
        "`retry`: sozu 2.3.3 has none per route",
    ),
    (
        "HTTPRouteRewriteHost",
        "  - filters: [{ type: URLRewrite, urlRewrite: { hostname: one.example.org } }]\n    backendRefs: [{ name: infra-backend-v1, port: 8080 }]\n",
        "URLRewrite of the hostname",
    ),
    (
        "HTTPRoute307Redirect",
        "  - filters: [{ type: RequestRedirect, requestRedirect: { statusCode: 307, hostname: example.in.example.org } }]\n",
        "a 307 redirect: sozu 2.3.3 redirects with 301, 302 or 308",
    ),
    (
        "HTTPRoute303Redirect",
        "  - filters: [{ type: RequestRedirect, requestRedirect: { statusCode: 303 } }]\n",
        "a 303 redirect: sozu 2.3.3 redirects with 301, 302 or 308",
    ),
    (
        "HTTPRouteInvalidNonExistentBackendRef",
        "  - backendRefs: [{ name: nonexistent, port: 8080 }]\n",
        "Service gateway-conformance-infra/nonexistent is not in the input",
    ),
    (
        "HTTPRouteInvalidCrossNamespaceBackendRef",
        "  - backendRefs: [{ name: web-backend, namespace: gateway-conformance-web-backend, port: 8080 }]\n",
        "no ReferenceGrant there allows it",
    ),
    (
        "HTTPRouteNoBackendRefs",
        "  - matches: [{ path: { type: PathPrefix, value: / } }]\n",
        "it has no backendRefs (requests get 500)",
    ),
];

/// `import gateway` on `manifests`: exit code, workspace, stderr.
fn import(dir: &std::path::Path, name: &str, manifests: &str) -> (i32, String, String) {
    let file = dir.join(format!("{name}.yaml"));
    std::fs::write(&file, format!("{}{manifests}", base())).unwrap();
    run(std::process::Command::new(agent_bin())
        .args(["import", "gateway"])
        .arg(&file)
        .args(["--zone", "in.example.org", "--host", GATEWAY_HOST]))
}

/// The route records of an imported workspace, each Service's upstream replaced by the echo
/// backend standing for it.
fn routes_to(workspace: &str, backends: &[(Backend, &str)]) -> Vec<String> {
    workspace
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("{ host"))
        .map(|l| {
            let mut l = l.trim_end_matches(',').to_owned();
            for (b, namespace) in backends {
                l = l.replace(
                    &format!(
                        "upstream = \"{}.{namespace}.svc.cluster.local\", port = 8080",
                        b.name.trim_start_matches("echo:")
                    ),
                    &format!(
                        "upstream = \"{}\", port = {}",
                        b.address.ip(),
                        b.address.port()
                    ),
                );
            }
            l
        })
        .collect()
}

/// What one request got, judged as the suite judges it: `Ok` or what differed.
fn check(stack: &Stack, r: &Request) -> Result<(), String> {
    let (seen, headers) = https_request(stack.https, r.host, r.method, r.path, r.headers)?;
    let header = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    };
    match &r.expect {
        Expect::Status(status) if seen.status == *status => Ok(()),
        Expect::Status(status) => Err(format!(
            "{} instead of {status}: {}",
            seen.status, seen.body
        )),
        Expect::Redirect(status, location) => {
            if seen.status == *status && header("location").as_deref() == Some(location) {
                Ok(())
            } else {
                Err(format!(
                    "{} to {:?} instead of {status} to {location}",
                    seen.status,
                    header("location")
                ))
            }
        }
        Expect::Backend(backend, path) => {
            echoed_by(&seen, r, backend, path.unwrap_or(r.path), &[], &[])
        }
        Expect::Edited(backend, edited, absent) => {
            echoed_by(&seen, r, backend, r.path, edited, absent)
        }
    }
}

/// The answer is `backend`'s echo of `r` at `path`: each header sent arrives as it was sent
/// (the suite's echo server reports them), but those `edited` (which arrive with the value given)
/// and those `absent` (which do not arrive).
fn echoed_by(
    seen: &Seen,
    r: &Request,
    backend: &str,
    path: &str,
    edited: Headers,
    absent: &[&str],
) -> Result<(), String> {
    let echoed = Echoed::of(&seen.body)
        .ok_or_else(|| format!("{} without an echo: {}", seen.status, seen.body))?;
    if seen.status != 200
        || echoed.backend != backend
        || echoed.path != path
        || echoed.method != r.method
    {
        return Err(format!(
            "{} from {} ({} {}) instead of {backend} ({} {path})",
            seen.status, echoed.backend, echoed.method, echoed.path, r.method
        ));
    }
    let got = |name: &str| {
        echoed
            .headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    };
    let told = |name: &str| {
        edited.iter().any(|(n, _)| n.eq_ignore_ascii_case(name))
            || absent.iter().any(|n| n.eq_ignore_ascii_case(name))
    };
    for (name, value) in r.headers.iter().filter(|(n, _)| !told(n)).chain(edited) {
        if got(name) != Some(*value) {
            return Err(format!(
                "header {name} reached the backend as {:?}, not {value:?}",
                got(name)
            ));
        }
    }
    for name in absent {
        if let Some(value) = got(name) {
            return Err(format!("header {name} reached the backend ({value:?})"));
        }
    }
    Ok(())
}

/// Every case sozu can express: imported without anything left out, served, and each request
/// answered as the suite expects. A failure names the case, the request and what it got.
#[test]
fn every_httproute_case_sozu_can_express_passes() {
    serve_and_check(cases());
}

/// Requests the suite does not send to its cases' routes, where sozu 2.3.3's own order
/// (docs/contract.md, "Which route serves a request") and the Gateway API's differ: each gets
/// what the spec says, because `import` writes the routes so that sozu ranks them as the spec
/// does (translate/precedence.rs).
fn beyond_the_suite() -> Vec<Case> {
    let suite = cases();
    let manifests = |name: &str| {
        suite
            .iter()
            .find(|c| c.name == name)
            .map(|c| c.manifests.clone())
            .unwrap_or_else(|| panic!("no case {name}"))
    };
    let one_backend = |name: &str| format!("    backendRefs: [{{ name: {name}, port: 8080 }}]\n");
    vec![
        Case {
            // sozu serves a frontend whose header predicates hold before any without.
            name: "HTTPRouteMatching: a longer prefix before header matches",
            manifests: manifests("HTTPRouteMatching"),
            requests: vec![
                Request { headers: &[("Version", "one")], ..get("/v2", v(2)) },
                Request { headers: &[("Version", "one")], ..get("/v2/example", v(2)) },
                Request { headers: &[("Version", "two")], ..get("/example", v(2)) },
                Request { headers: &[("Version", "one")], ..get("/v2example", v(1)) },
            ],
        },
        Case {
            // sozu serves header predicates first, and a regex path with a method before any
            // other path.
            name: "HTTPRouteMethodMatching: a method before header matches, a longer prefix before a method",
            manifests: manifests("HTTPRouteMethodMatching"),
            requests: vec![
                Request { headers: &[("version", "four")], ..get("/", v(2)) },
                Request { headers: &[("version", "four")], ..get("/path5", v(1)) },
                Request { headers: &[("version", "four")], ..get("/path5/x", v(1)) },
                Request { headers: &[("version", "four")], ..get("/path5x", v(2)) },
                Request { headers: &[("version", "four")], ..get("/path1/x", v(1)) },
                Request { method: "DELETE", headers: &[("version", "four")], ..get("/", v(3)) },
                Request { method: "PUT", headers: &[("version", "one")], ..get("/path5", v(1)) },
                Request { method: "PATCH", headers: &[("version", "four")], ..get("/path5", v(1)) },
            ],
        },
        Case {
            // Of two prefixes as long, sozu serves the last in key order.
            name: "HTTPRouteHeaderMatching: more header matches first, on any path",
            manifests: manifests("HTTPRouteHeaderMatching"),
            requests: vec![
                Request { headers: &[("Version", "two"), ("Color", "orange")], ..get("/any/path", v(1)) },
                Request { headers: &[("Version", "two"), ("Color", "red")], ..get("/any/path", v(2)) },
            ],
        },
        Case {
            // sozu serves a regex path with a method before any other path.
            name: "an exact path before a prefix with a method",
            manifests: route(
                "exact-before-method",
                &[],
                &format!(
                    "  - matches: [{{ path: {{ type: PathPrefix, value: /a }}, method: GET }}]\n{}\
                     \x20 - matches: [{{ path: {{ type: Exact, value: /a/b }} }}]\n{}",
                    one_backend("infra-backend-v1"),
                    one_backend("infra-backend-v2"),
                ),
            ),
            requests: vec![
                get("/a/b", v(2)),
                get("/a/b?x=1", v(2)),
                get("/a", v(1)),
                get("/a/c", v(1)),
                get("/a/b/c", v(1)),
                Request { method: "POST", ..get("/a/b", v(2)) },
                Request { method: "POST", ..get("/a/c", Expect::Status(404)) },
            ],
        },
        Case {
            // Of two regex paths with a method sozu serves the first in key order, of two
            // without one the last; the keys sort by header name, the spec by rule.
            name: "the first rule, of two on one path with as many header matches",
            manifests: route(
                "rule-order",
                &[],
                &format!(
                    "  - matches: [{{ path: {{ type: Exact, value: /r }}, method: GET, headers: [{{ name: y, value: \"1\" }}] }}]\n{}\
                     \x20 - matches: [{{ path: {{ type: Exact, value: /r }}, method: GET, headers: [{{ name: x, value: \"1\" }}] }}]\n{}\
                     \x20 - matches: [{{ path: {{ type: Exact, value: /s }}, headers: [{{ name: x, value: \"1\" }}] }}]\n{}\
                     \x20 - matches: [{{ path: {{ type: Exact, value: /s }}, headers: [{{ name: y, value: \"1\" }}] }}]\n{}",
                    one_backend("infra-backend-v1"),
                    one_backend("infra-backend-v2"),
                    one_backend("infra-backend-v1"),
                    one_backend("infra-backend-v2"),
                ),
            ),
            requests: vec![
                Request { headers: &[("x", "1"), ("y", "1")], ..get("/r", v(1)) },
                Request { headers: &[("x", "1")], ..get("/r", v(2)) },
                Request { headers: &[("x", "1"), ("y", "1")], ..get("/s", v(1)) },
                Request { headers: &[("x", "1"), ("y", "1")], ..get("/s?q=1", v(1)) },
                Request { headers: &[("y", "1")], ..get("/s", v(2)) },
            ],
        },
    ]
}

#[test]
fn where_sozus_order_differs_the_specs_is_kept() {
    serve_and_check(beyond_the_suite());
}

/// Each case imported without anything left out and served; each request answered as expected.
fn serve_and_check(cases: Vec<Case>) {
    let dir = tempfile::tempdir().unwrap();
    let backends: Vec<(Backend, &str)> = SERVICES
        .iter()
        .map(|(name, namespace)| (Backend::start_echo(name), *namespace))
        .collect();
    let mut failures = Vec::new();
    let mut counts = Vec::new();
    for case in cases {
        let file = case.name.replace(|c: char| !c.is_ascii_alphanumeric(), "-");
        let (code, workspace, err) = import(dir.path(), &file, &case.manifests);
        assert_eq!(
            code, 0,
            "{}: import left something out:\n{err}\n{workspace}",
            case.name
        );
        let routes = routes_to(&workspace, &backends);
        let mut stack = Stack::new();
        let mut hosts: Vec<&str> = case.requests.iter().map(|r| r.host).collect();
        hosts.sort();
        hosts.dedup();
        for host in &hosts {
            certificate(&stack.tls_dir(), host);
        }
        stack.write_workspace(&stack.workspace_text_of(&routes, ""));
        // A workspace `check` refuses is a failure of every request of the case, said at once.
        let (code, _, refused) = run(std::process::Command::new(agent_bin())
            .arg("check")
            .arg(stack.workspace_path()));
        if code != 0 {
            failures.push(format!(
                "{}: check refuses the imported workspace:\n{refused}",
                case.name
            ));
            counts.push(format!("{}: 0/{}", case.name, case.requests.len()));
            continue;
        }
        stack.start_sozu();
        stack.start_agent();
        stack.wait_ready(PATIENCE);
        // The first request waits for every frontend (the agent is ready once sozu holds them).
        let mut passed = 0;
        for (i, request) in case.requests.iter().enumerate() {
            let outcome = if i == 0 {
                // Until it passes or the patience runs out: then what it got last is the failure.
                let deadline = Instant::now() + PATIENCE;
                loop {
                    let outcome = check(&stack, request);
                    if outcome.is_ok() || Instant::now() > deadline {
                        break outcome;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            } else {
                check(&stack, request)
            };
            match outcome {
                Ok(()) => passed += 1,
                Err(e) => failures.push(format!(
                    "{} #{i} {} {}{} {:?}: {e}",
                    case.name, request.method, request.host, request.path, request.headers
                )),
            }
        }
        counts.push(format!("{}: {passed}/{}", case.name, case.requests.len()));
        drop(stack);
    }
    eprintln!("{}", counts.join("\n"));
    assert!(
        failures.is_empty(),
        "{}\n\n{}\n\nworkspaces in {}",
        failures.join("\n"),
        counts.join("\n"),
        dir.path().display()
    );
}

/// What sozu cannot express is left out by `import`, rule by rule with its reason (exit 1), and
/// the route's other rules are carried: never served in a weaker form.
#[test]
fn what_sozu_cannot_express_is_left_out_with_its_reason() {
    let dir = tempfile::tempdir().unwrap();
    for (case, rule, reason) in NOT_EXPRESSIBLE {
        let manifests = route("r", &[], &format!("{rule}  - matches: [{{ path: {{ type: Exact, value: /kept }} }}]\n    backendRefs: [{{ name: infra-backend-v3, port: 8080 }}]\n"));
        let (code, workspace, err) = import(dir.path(), case, &manifests);
        assert_eq!(code, 1, "{case}: {err}");
        assert!(
            err.contains("spec.rules[0]: the rule left out") && err.contains(reason),
            "{case}: {err}"
        );
        let routes: Vec<&str> = workspace
            .lines()
            .filter(|l| l.trim_start().starts_with("{ host"))
            .collect();
        assert_eq!(routes.len(), 1, "{case}: {workspace}");
        assert!(
            routes[0].contains("path_exact = \"/kept\""),
            "{case}: {workspace}"
        );
        assert!(
            workspace.contains(reason),
            "{case}: the workspace does not say why\n{workspace}"
        );
    }
}
