//! The translators, judged by what a user gets: the workspace text and the report of what was
//! left out. (That `check` accepts what they write is tested with the binary, in
//! `tests/integration/import.rs`; that sozu serves it as the Gateway API means, in
//! `tests/integration/gateway_conformance.rs`.)

use super::*;

fn options(host: Option<&str>) -> Options {
    Options {
        zone: "in.example.org".into(),
        host: host.map(str::to_owned),
        cluster_issuer: None,
    }
}

fn ingress(yaml: &str) -> Translation {
    ingress::translate(&[("in.yaml".into(), yaml.into())], &options(None)).unwrap()
}

fn gateway(yaml: &str, host: Option<&str>) -> Translation {
    gateway::translate(&[("gw.yaml".into(), yaml.into())], &options(host)).unwrap()
}

/// The routes, one line each, as the workspace writes them.
fn routes(t: &Translation) -> Vec<String> {
    nickel::workspace(t)
        .lines()
        .filter(|l| l.trim_start().starts_with("{ host"))
        .map(|l| l.trim().trim_end_matches(',').to_owned())
        .collect()
}

fn left(t: &Translation) -> Vec<String> {
    t.left_out.iter().map(|l| l.to_string()).collect()
}

/// The seed's three admin UIs, as their Ingresses (one `List`, as `kubectl get -o yaml` writes).
const SEED: &str = r#"
apiVersion: v1
kind: List
items:
- apiVersion: networking.k8s.io/v1
  kind: Ingress
  metadata:
    name: grafana
    namespace: observability
    annotations:
      cert-manager.io/cluster-issuer: librecloud-ca
      nginx.ingress.kubernetes.io/ssl-redirect: "true"
  spec:
    ingressClassName: nginx
    tls:
    - hosts: [grafana.in.example.org]
      secretName: grafana-tls
    rules:
    - host: grafana.in.example.org
      http:
        paths:
        - path: /
          pathType: Prefix
          backend:
            service: { name: grafana, port: { number: 3000 } }
- apiVersion: networking.k8s.io/v1
  kind: Ingress
  metadata:
    name: prometheus
    namespace: observability
    annotations:
      cert-manager.io/cluster-issuer: librecloud-ca
  spec:
    tls:
    - hosts: [prometheus.in.example.org]
    rules:
    - host: prometheus.in.example.org
      http:
        paths:
        - path: /
          pathType: Prefix
          backend:
            service: { name: prometheus, port: { name: web } }
- apiVersion: networking.k8s.io/v1
  kind: Ingress
  metadata:
    name: longhorn
    namespace: longhorn-system
    annotations:
      cert-manager.io/cluster-issuer: librecloud-ca
  spec:
    tls:
    - hosts: [longhorn.in.example.org]
    rules:
    - host: longhorn.in.example.org
      http:
        paths:
        - path: /
          pathType: Prefix
          backend:
            service: { name: longhorn-frontend, port: { number: 80 } }
---
apiVersion: v1
kind: Service
metadata: { name: prometheus, namespace: observability }
spec:
  ports: [{ name: web, port: 9090, targetPort: 9090 }]
---
apiVersion: v1
kind: Service
metadata: { name: grafana, namespace: observability }
spec:
  ports: [{ name: http, port: 3000 }]
---
apiVersion: v1
kind: Service
metadata: { name: longhorn-frontend, namespace: longhorn-system }
spec:
  ports: [{ name: http, port: 80 }]
"#;

#[test]
fn the_seeds_ingresses_become_its_routes() {
    let t = ingress(SEED);
    assert_eq!(left(&t), Vec::<String>::new());
    assert_eq!(t.cluster_issuer, "librecloud-ca");
    assert_eq!(
        routes(&t),
        [
            r#"{ host = "grafana.in.example.org", upstream = "grafana.observability.svc.cluster.local", port = 3000 }"#,
            r#"{ host = "longhorn.in.example.org", upstream = "longhorn-frontend.longhorn-system.svc.cluster.local", port = 80 }"#,
            r#"{ host = "prometheus.in.example.org", upstream = "prometheus.observability.svc.cluster.local", port = 9090 }"#,
        ]
    );
    let text = nickel::workspace(&t);
    assert!(
        text.contains(
            "# Ingress observability/grafana (in.yaml, document 1) spec.rules[0].http.paths[0]"
        ),
        "{text}"
    );
}

fn one_ingress(annotations: &str, path: &str, path_type: &str) -> String {
    format!(
        r#"
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: app
  namespace: apps
  annotations:
{annotations}
spec:
  rules:
  - host: app.in.example.org
    http:
      paths:
      - path: "{path}"
        pathType: {path_type}
        backend:
          service: {{ name: app, port: {{ number: 8080 }} }}
"#
    )
}

#[test]
fn ingress_paths_keep_their_meaning() {
    for (path, kind, expect) in [
        ("/api", "Prefix", r#"path_segment_prefix = "/api""#),
        ("/api/", "Prefix", r#"path_segment_prefix = "/api""#),
        ("/api", "Exact", r#"path_exact = "/api""#),
        ("/api", "ImplementationSpecific", r#"path_prefix = "/api""#),
    ] {
        let t = ingress(&one_ingress("    {}", path, kind));
        let r = routes(&t);
        assert!(r[0].contains(expect), "{path} {kind}: {r:?}");
    }
}

#[test]
fn each_ingress_nginx_annotation() {
    let annotated = |a: &str| {
        ingress(&one_ingress(
            &format!("    nginx.ingress.kubernetes.io/{a}"),
            "/",
            "Prefix",
        ))
    };

    // Carried as they are.
    for a in [
        "ssl-redirect: \"true\"",
        "force-ssl-redirect: \"true\"",
        "backend-protocol: HTTP",
    ] {
        let t = annotated(a);
        assert!(t.left_out.is_empty(), "{a}: {:?}", left(&t));
    }
    let t = annotated("backend-protocol: GRPC");
    assert!(
        routes(&t)[0].ends_with(
            "upstream_protocol = 'h2c, upstream = \"app.apps.svc.cluster.local\", port = 8080 }"
        ),
        "{:?}",
        routes(&t)
    );
    let t = annotated("backend-protocol: HTTPS");
    assert!(routes(&t).is_empty());
    assert!(
        left(&t)[0].contains("the Ingress left out: backend-protocol HTTPS"),
        "{:?}",
        left(&t)
    );

    // Reported, the route carried without it.
    for (a, says) in [
        ("ssl-redirect: \"false\"", "the http listener redirects"),
        (
            "proxy-read-timeout: \"3600\"",
            "no timeout per route (the Ingress asked 3600 s)",
        ),
        ("proxy-body-size: 50m", "no limit on a request body's size"),
    ] {
        let t = annotated(a);
        assert_eq!(routes(&t).len(), 1, "{a}");
        assert_eq!(t.left_out.len(), 1, "{a}");
        assert!(left(&t)[0].contains(says), "{a}: {:?}", left(&t));
    }

    // Guards sozu cannot keep: the Ingress is left out, never served open.
    for a in [
        "configuration-snippet: \"deny all;\"",
        "server-snippet: \"if ($x) { return 403; }\"",
        "canary: \"true\"",
        "auth-url: http://oauth2-proxy/auth",
        "auth-type: digest",
    ] {
        let t = annotated(a);
        assert!(routes(&t).is_empty(), "{a}: {:?}", routes(&t));
        assert!(
            left(&t)[0].contains("the Ingress left out"),
            "{a}: {:?}",
            left(&t)
        );
    }

    // A redirect answers with the URL as it is.
    let t = annotated("permanent-redirect: https://new.example.com/landing");
    assert_eq!(
        routes(&t),
        [
            r#"{ host = "app.in.example.org", redirect = { host = "new.example.com", path = "/landing" } }"#
        ]
    );
    let t = ingress(&one_ingress(
        "    nginx.ingress.kubernetes.io/permanent-redirect: http://new.example.com:8080/\n    nginx.ingress.kubernetes.io/permanent-redirect-code: \"308\"",
        "/",
        "Prefix",
    ));
    assert_eq!(
        routes(&t),
        [
            r#"{ host = "app.in.example.org", redirect = { status = 308, scheme = 'http, host = "new.example.com", path = "/", port = 8080 } }"#
        ]
    );

    // rewrite-target makes the path a regular expression (case-insensitive, from the start, as
    // nginx's `location ~*`), its captures sozu's.
    let t = ingress(&one_ingress(
        "    nginx.ingress.kubernetes.io/rewrite-target: /$2",
        "/something(/|$)(.*)",
        "ImplementationSpecific",
    ));
    assert!(t.left_out.is_empty(), "{:?}", left(&t));
    assert!(
        routes(&t)[0].contains(
            r#"path_regex = "(?i)/something(/|$)(.*).*", rewrite = { path = "/$PATH[2]" }"#
        ),
        "{:?}",
        routes(&t)
    );
    let t = annotated("use-regex: \"true\"");
    assert!(
        routes(&t)[0].contains(r#"path_regex = "(?i)/.*""#),
        "{:?}",
        routes(&t)
    );
}

#[test]
fn source_ranges_are_the_workspaces_when_every_ingress_shares_them() {
    let both = |a: &str, b: &str| {
        let first = one_ingress(
            &format!("    nginx.ingress.kubernetes.io/whitelist-source-range: \"{a}\""),
            "/",
            "Prefix",
        );
        let second = one_ingress(
            &format!("    nginx.ingress.kubernetes.io/whitelist-source-range: \"{b}\""),
            "/",
            "Prefix",
        )
        .replace("name: app\n", "name: other\n")
        .replace("app.in.example.org", "other.in.example.org");
        ingress(&format!("{first}---{second}"))
    };
    let t = both("10.8.0.0/16, 192.0.2.7", "192.0.2.7/32,10.8.0.1/16");
    assert!(t.left_out.is_empty(), "{:?}", left(&t));
    assert_eq!(
        t.allowed_sources,
        Some(vec!["10.8.0.0/16".to_owned(), "192.0.2.7/32".to_owned()])
    );
    assert!(nickel::workspace(&t).contains(r#"allowed_sources = ["10.8.0.0/16", "192.0.2.7/32"],"#));

    // Different ranges: a workspace has one set, so neither restricted Ingress is served open.
    let t = both("10.8.0.0/16", "10.9.0.0/16");
    assert_eq!(t.allowed_sources, None);
    assert!(routes(&t).is_empty(), "{:?}", routes(&t));
    assert_eq!(t.left_out.len(), 2);
    assert!(
        left(&t)[0].contains("allows 10.8.0.0/16 only"),
        "{:?}",
        left(&t)
    );

    // One restricted, one open: the open one is carried, the restricted one is not.
    let open = one_ingress("    {}", "/", "Prefix")
        .replace("name: app\n", "name: open\n")
        .replace("app.in.example.org", "open.in.example.org");
    let restricted = one_ingress(
        "    nginx.ingress.kubernetes.io/whitelist-source-range: 10.8.0.0/16",
        "/",
        "Prefix",
    );
    let t = ingress(&format!("{open}---{restricted}"));
    assert_eq!(routes(&t).len(), 1);
    assert!(routes(&t)[0].contains("open.in.example.org"));
    assert!(left(&t)[0].contains("Ingress apps/app"), "{:?}", left(&t));
}

#[test]
fn basic_auth_users_become_a_users_file_and_hashes_are_never_said() {
    use base64::Engine;
    let bcrypt = "$2y$05$abcdefghijklmnopqrstuuA5Yq3Fh0nBd1Wb3nYqg2Qx9Zl6pJqS";
    let auth = format!("admin:{{PLAIN}}s3cret\nalice:{bcrypt}\n");
    let data = base64::engine::general_purpose::STANDARD.encode(auth);
    let yaml = format!(
        "{}---\napiVersion: v1\nkind: Secret\nmetadata: {{ name: basic, namespace: apps }}\ndata:\n  auth: {data}\n",
        one_ingress(
            "    nginx.ingress.kubernetes.io/auth-type: basic\n    nginx.ingress.kubernetes.io/auth-secret: basic\n    nginx.ingress.kubernetes.io/auth-realm: App",
            "/",
            "Prefix"
        )
    );
    let t = ingress(&yaml);
    assert!(
        routes(&t)[0]
            .contains(r#"basic_auth = { users_file = "apps-basic.users", realm = "App" }"#),
        "{:?}",
        routes(&t)
    );
    assert_eq!(t.side_files.len(), 1);
    let file = &t.side_files[0];
    assert_eq!(file.mode, 0o600);
    // sha256("s3cret")
    assert_eq!(
        file.contents,
        "admin:ff6e9d2fd0b9ac0c4e1f3a8b87b3bb1c5dcd5ea8d2c8f1c5a3e2bd0e4d4e3c79\n".replace(
            "ff6e9d2fd0b9ac0c4e1f3a8b87b3bb1c5dcd5ea8d2c8f1c5a3e2bd0e4d4e3c79",
            &{
                use sha2::Digest;
                sha2::Sha256::digest(b"s3cret")
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect::<String>()
            }
        )
    );
    let report = left(&t).join("\n");
    assert!(
        report.contains("the user `alice` left out: its password is kept as a bcrypt hash"),
        "{report}"
    );
    let text = nickel::workspace(&t);
    for secret in [bcrypt, "s3cret", &file.contents[6..]] {
        assert!(
            !report.contains(secret) && !text.contains(secret),
            "{secret}"
        );
    }

    // No user that can be carried: the route is left out, not served to no one or to anyone.
    let only_bcrypt = base64::engine::general_purpose::STANDARD.encode(format!("alice:{bcrypt}\n"));
    let t = ingress(&yaml.replace(&data, &only_bcrypt));
    assert!(routes(&t).is_empty());
    assert!(t.side_files.is_empty());
    assert!(
        left(&t)
            .iter()
            .any(|l| l.contains("no user of Secret apps/basic can be carried")),
        "{:?}",
        left(&t)
    );
}

#[test]
fn bad_ingress_inputs_name_the_document_and_field() {
    let err = |yaml: &str| {
        ingress::translate(&[("in.yaml".into(), yaml.into())], &options(None))
            .unwrap_err()
            .to_string()
    };
    let good = one_ingress("    {}", "/", "Prefix");
    assert_eq!(
        err(&format!("{good}---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {{ name: x }}\n")),
        "in.yaml, document 2, kind: unknown kind `Deployment`: this command reads Ingress, Service, Secret, IngressClass, Namespace"
    );
    let e = err(&format!(
        "{good}---\napiVersion: v1\nkind: Service\nmetadata: {{ name: other, namespace: apps }}\nspec: {{ ports: [{{ port: 80 }}] }}\n"
    ));
    assert_eq!(
        e,
        "Ingress apps/app (in.yaml, document 1) spec.rules[0].http.paths[0].backend.service.port: Service apps/app is not in the input"
    );
    let named = good.replace("{ number: 8080 }", "{ name: grpc }");
    let e = err(&format!(
        "{named}---\napiVersion: v1\nkind: Service\nmetadata: {{ name: app, namespace: apps }}\nspec: {{ ports: [{{ name: http, port: 80 }}] }}\n"
    ));
    assert!(e.ends_with("spec.rules[0].http.paths[0].backend.service.port: Service apps/app has no port named `grpc`"), "{e}");
    let e = err(&format!(
        "{good}---\nkind: Ingress\nmetadata: {{ name: [oops\n"
    ));
    assert!(e.starts_with("in.yaml, document 2 (line "), "{e}");
}

const GATEWAY: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: { name: gw, namespace: infra }
spec:
  listeners:
  - { name: http, port: 80, protocol: HTTP, allowedRoutes: { namespaces: { from: All } } }
  - { name: tcp, port: 5432, protocol: TCP, allowedRoutes: { namespaces: { from: All } } }
---
"#;

#[test]
fn an_httproute_becomes_routes_in_the_gateway_apis_order() {
    let t = gateway(
        &format!(
            r#"{GATEWAY}
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{ name: web, namespace: infra }}
spec:
  parentRefs: [{{ name: gw }}]
  hostnames: [web.in.example.org]
  rules:
  - matches:
    - path: {{ type: PathPrefix, value: / }}
    - headers: [{{ name: version, value: one }}]
    backendRefs: [{{ name: v1, port: 8080 }}]
  - matches:
    - path: {{ type: PathPrefix, value: /v2 }}
      method: GET
    - path: {{ type: Exact, value: /v2/exact }}
    backendRefs: [{{ name: v1, port: 8080, weight: 20 }}, {{ name: v2, port: 8080, weight: 80 }}]
"#
        ),
        None,
    );
    assert_eq!(left(&t), Vec::<String>::new());
    assert_eq!(
        routes(&t),
        [
            r#"{ host = "web.in.example.org", path_exact = "/v2/exact", upstreams = [{ upstream = "v1.infra.svc.cluster.local", port = 8080 }, { upstream = "v2.infra.svc.cluster.local", port = 8080, weight = 4 }] }"#,
            // A request that both match gets the exact path or the longer prefix, whatever its
            // headers: each is written with the header matches too (sozu serves a frontend
            // whose header predicates hold first).
            r#"{ host = "web.in.example.org", path_exact = "/v2/exact", match_headers = [{ name = "version", exact = "one" }], upstreams = [{ upstream = "v1.infra.svc.cluster.local", port = 8080 }, { upstream = "v2.infra.svc.cluster.local", port = 8080, weight = 4 }] }"#,
            r#"{ host = "web.in.example.org", path_segment_prefix = "/v2", method = "GET", upstreams = [{ upstream = "v1.infra.svc.cluster.local", port = 8080 }, { upstream = "v2.infra.svc.cluster.local", port = 8080, weight = 4 }] }"#,
            r#"{ host = "web.in.example.org", path_segment_prefix = "/v2", method = "GET", match_headers = [{ name = "version", exact = "one" }], upstreams = [{ upstream = "v1.infra.svc.cluster.local", port = 8080 }, { upstream = "v2.infra.svc.cluster.local", port = 8080, weight = 4 }] }"#,
            r#"{ host = "web.in.example.org", match_headers = [{ name = "version", exact = "one" }], upstream = "v1.infra.svc.cluster.local", port = 8080 }"#,
            r#"{ host = "web.in.example.org", upstream = "v1.infra.svc.cluster.local", port = 8080 }"#,
        ]
    );
}

fn route(spec: &str) -> String {
    format!("{GATEWAY}apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{ name: r, namespace: apps }}\nspec:\n  parentRefs: [{{ name: gw, namespace: infra, sectionName: http }}]\n{spec}")
}

#[test]
fn what_sozu_cannot_do_leaves_the_rule_out() {
    for (rule, says) in [
        ("  - matches: [{ queryParams: [{ name: a, value: b }] }]\n    backendRefs: [{ name: s, port: 80 }]", "queryParams: sozu 2.3.3 does not match a query string"),
        ("  - filters: [{ type: RequestMirror, requestMirror: { backendRef: { name: m, port: 80 } } }]\n    backendRefs: [{ name: s, port: 80 }]", "RequestMirror"),
        ("  - filters: [{ type: ExtensionRef, extensionRef: { group: x, kind: y, name: z } }]\n    backendRefs: [{ name: s, port: 80 }]", "ExtensionRef"),
        ("  - timeouts: { request: 10s }\n    backendRefs: [{ name: s, port: 80 }]", "`timeouts`"),
        ("  - filters: [{ type: RequestHeaderModifier, requestHeaderModifier: { add: [{ name: x, value: y }] } }]\n    backendRefs: [{ name: s, port: 80 }]", "`add`"),
        ("  - backendRefs: [{ name: s, namespace: other, port: 80 }]", "no ReferenceGrant there allows it"),
        ("  - backendRefs: [{ group: example.org, kind: Bucket, name: s }]", "not a Service"),
        ("  - matches: [{ path: { type: PathPrefix, value: /a } }]", "no backendRefs"),
    ] {
        let t = gateway(&route(&format!("  hostnames: [a.in.example.org]\n  rules:\n{rule}\n  - backendRefs: [{{ name: kept, port: 80 }}]\n")), None);
        assert_eq!(routes(&t).len(), 1, "{rule}: {:?}", routes(&t));
        assert!(routes(&t)[0].contains("kept.apps"), "{rule}");
        assert!(left(&t)[0].contains("spec.rules[0]: the rule left out") && left(&t)[0].contains(says), "{rule}: {:?}", left(&t));
    }
}

#[test]
fn a_reference_grant_lets_a_route_name_a_service_of_another_namespace() {
    let grant = "---\napiVersion: gateway.networking.k8s.io/v1beta1\nkind: ReferenceGrant\nmetadata: { name: g, namespace: other }\nspec:\n  from: [{ group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: apps }]\n  to: [{ group: \"\", kind: Service }]\n";
    let t = gateway(
        &format!("{}{grant}", route("  hostnames: [a.in.example.org]\n  rules:\n  - backendRefs: [{ name: s, namespace: other, port: 80 }]\n")),
        None,
    );
    assert_eq!(left(&t), Vec::<String>::new());
    assert!(routes(&t)[0].contains("s.other.svc.cluster.local"));
}

#[test]
fn hosts_come_from_the_route_the_listener_or_host() {
    let no_names = route("  rules:\n  - backendRefs: [{ name: s, port: 80 }]\n");
    let t = gateway(&no_names, None);
    assert!(routes(&t).is_empty());
    assert!(left(&t)[0].contains("give --host"), "{:?}", left(&t));
    let t = gateway(&no_names, Some("default.in.example.org"));
    assert!(routes(&t)[0].contains(r#"host = "default.in.example.org""#));

    let t = gateway(&route("  hostnames: [a.in.example.org, b.example.com, \"*.in.example.org\"]\n  rules:\n  - backendRefs: [{ name: s, port: 80 }]\n"), None);
    assert_eq!(routes(&t).len(), 1);
    let report = left(&t).join("\n");
    assert!(
        report.contains("outside the zone `in.example.org`"),
        "{report}"
    );
    assert!(report.contains("is a wildcard"), "{report}");

    // The listener's hostname narrows the route's.
    let narrowed = route(
        "  hostnames: [\"*.in.example.org\"]\n  rules:\n  - backendRefs: [{ name: s, port: 80 }]\n",
    )
    .replace(
        "{ name: http, port: 80, protocol: HTTP,",
        "{ name: http, port: 80, hostname: api.in.example.org, protocol: HTTP,",
    );
    let t = gateway(&narrowed, None);
    assert!(
        routes(&t)[0].contains(r#"host = "api.in.example.org""#),
        "{:?} {:?}",
        routes(&t),
        left(&t)
    );
}

#[test]
fn rewrites_and_redirects() {
    let t = gateway(&route(
        "  hostnames: [a.in.example.org]\n  rules:\n  - matches: [{ path: { type: PathPrefix, value: /prefix/one } }]\n    filters: [{ type: URLRewrite, urlRewrite: { path: { type: ReplacePrefixMatch, replacePrefixMatch: /one } } }]\n    backendRefs: [{ name: s, port: 80 }]\n  - matches: [{ path: { type: PathPrefix, value: /strip } }]\n    filters: [{ type: URLRewrite, urlRewrite: { path: { type: ReplacePrefixMatch, replacePrefixMatch: / } } }]\n    backendRefs: [{ name: s, port: 80 }]\n  - matches: [{ path: { type: Exact, value: /old } }]\n    filters: [{ type: RequestRedirect, requestRedirect: { hostname: new.in.example.org, statusCode: 301 } }]\n",
    ), None);
    assert_eq!(left(&t), Vec::<String>::new());
    assert_eq!(
        routes(&t),
        [
            r#"{ host = "a.in.example.org", path_exact = "/old", redirect = { scheme = 'same, host = "new.in.example.org" } }"#,
            r#"{ host = "a.in.example.org", path_regex = "/prefix/one(/.*|\\?.*)?", rewrite = { path = "/one$PATH[1]" }, upstream = "s.apps.svc.cluster.local", port = 80 }"#,
            r#"{ host = "a.in.example.org", path_regex = "/strip(\\?.*)?", rewrite = { path = "/$PATH[1]" }, upstream = "s.apps.svc.cluster.local", port = 80 }"#,
            r#"{ host = "a.in.example.org", path_regex = "/strip/(.*)", rewrite = { path = "/$PATH[1]" }, upstream = "s.apps.svc.cluster.local", port = 80 }"#,
        ]
    );
    // Each regular expression does what the spec's prefix replacement does.
    for (pattern, template, path, expect) in [
        (
            "/prefix/one(/.*|\\?.*)?",
            "/one$1",
            "/prefix/one/two",
            Some("/one/two"),
        ),
        (
            "/prefix/one(/.*|\\?.*)?",
            "/one$1",
            "/prefix/one",
            Some("/one"),
        ),
        ("/prefix/one(/.*|\\?.*)?", "/one$1", "/prefix/onetwo", None),
        ("/strip/(.*)", "/$1", "/strip/three", Some("/three")),
        ("/strip/(.*)", "/$1", "/strip/", Some("/")),
        ("/strip/(.*)", "/$1", "/stripped/x", None),
        ("/strip(\\?.*)?", "/$1", "/strip", Some("/")),
        ("/strip(\\?.*)?", "/$1", "/strip?q=1", Some("/?q=1")),
        ("/strip(\\?.*)?", "/$1", "/stripped", None),
    ] {
        let re = regex::Regex::new(&format!("\\A(?:{pattern})\\z")).unwrap();
        let got = re.captures(path).map(|c| {
            let mut out = String::new();
            c.expand(&template.replace("$1", "${1}"), &mut out);
            out
        });
        assert_eq!(got.as_deref(), expect, "{pattern} on {path}");
    }
}

#[test]
fn tcp_tls_and_udp_routes_take_their_listeners_port() {
    let yaml = format!(
        "{GATEWAY}apiVersion: gateway.networking.k8s.io/v1alpha2\nkind: TCPRoute\nmetadata: {{ name: pg, namespace: db }}\nspec:\n  parentRefs: [{{ name: gw, namespace: infra, sectionName: tcp }}]\n  rules: [{{ backendRefs: [{{ name: postgres, port: 5432 }}] }}]\n"
    );
    let t = gateway(&yaml, Some("db.in.example.org"));
    assert_eq!(
        routes(&t),
        [
            r#"{ host = "db.in.example.org", protocol = 'tcp, listen_port = 5432, upstream = "postgres.db.svc.cluster.local", port = 5432 }"#
        ]
    );
}

#[test]
fn nickel_strings_cannot_interpolate_or_break_out() {
    assert_eq!(nickel::string("a\"b\\c%{x}\n"), r#""a\"b\\c\%{x}\n""#);
}

/// sozu 2.3.3 serves a regex path with a method before any other path: the prefix with a method
/// loses the exact path the spec ranks first, and where that cannot be written (the exact path
/// has a header match the prefix does not), the prefix's match is left out rather than served
/// before it.
#[test]
fn where_sozu_ranks_otherwise_the_specs_order_is_written_or_the_match_left_out() {
    let rules = |prefix_headers: &str, exact_headers: &str| {
        route(&format!(
            "  hostnames: [a.in.example.org]\n  rules:\n  - matches: [{{ path: {{ type: PathPrefix, value: /a }}, method: GET{prefix_headers} }}]\n    backendRefs: [{{ name: s1, port: 80 }}]\n  - matches: [{{ path: {{ type: Exact, value: /a/b }}{exact_headers} }}]\n    backendRefs: [{{ name: s2, port: 80 }}]\n"
        ))
    };
    let t = gateway(&rules("", ""), None);
    assert_eq!(left(&t), Vec::<String>::new());
    let prefix = t
        .routes
        .iter()
        .find_map(|r| match &r.kind {
            Kind::Https(http) if http.method.as_deref() == Some("GET") => Some(http.path.clone()),
            _ => None,
        })
        .unwrap();
    let PathMatch::Regex(pattern) = prefix else {
        panic!("{prefix:?}")
    };
    let re = regex::Regex::new(&format!("\\A(?:{pattern})\\z")).unwrap();
    for (path, taken) in [
        ("/a", true),
        ("/a?q", true),
        ("/a/c", true),
        ("/a/b/c", true),
        ("/a/bc", true),
        ("/a/b", false),
        ("/a/b?q=1", false),
        ("/ab", false),
    ] {
        assert_eq!(re.is_match(path), taken, "{path} by {pattern}");
    }

    let t = gateway(
        &rules(
            ", headers: [{ name: y, value: \"1\" }]",
            ", headers: [{ name: x, value: \"1\" }]",
        ),
        None,
    );
    let report = left(&t).join("\n");
    assert!(
        report.contains("spec.rules[0].matches[0]: the match left out")
            && report.contains("spec.rules[1].matches[0], which the Gateway API ranks first")
            && report.contains("select_tree_rule"),
        "{report}"
    );
    assert_eq!(routes(&t).len(), 1, "{:?}", routes(&t));
    assert!(routes(&t)[0].contains("s2.apps"), "{:?}", routes(&t));
}

/// A match without header matches is written again with another's header matches only where no
/// match the spec ranks before it already stands there: the exact path with `x: 1` serves what
/// the exact path would with those headers, and a second frontend under its key would be
/// refused by `check` (and by sozu).
#[test]
fn a_match_is_written_with_header_matches_only_where_none_stands_for_it() {
    let t = gateway(
        &route("  hostnames: [a.in.example.org]\n  rules:\n  - matches: [{ path: { type: Exact, value: /a } }]\n    backendRefs: [{ name: s1, port: 80 }]\n  - matches: [{ headers: [{ name: x, value: \"1\" }] }]\n    backendRefs: [{ name: s2, port: 80 }]\n  - matches: [{ path: { type: Exact, value: /a }, headers: [{ name: x, value: \"1\" }] }]\n    backendRefs: [{ name: s3, port: 80 }]\n"),
        None,
    );
    assert_eq!(left(&t), Vec::<String>::new());
    assert_eq!(
        routes(&t),
        [
            r#"{ host = "a.in.example.org", path_exact = "/a", match_headers = [{ name = "x", exact = "1" }], upstream = "s3.apps.svc.cluster.local", port = 80 }"#,
            r#"{ host = "a.in.example.org", path_exact = "/a", upstream = "s1.apps.svc.cluster.local", port = 80 }"#,
            r#"{ host = "a.in.example.org", match_headers = [{ name = "x", exact = "1" }], upstream = "s2.apps.svc.cluster.local", port = 80 }"#,
        ]
    );
}

/// Of two routes whose matches tie, the spec serves the oldest (`creationTimestamp`), then the
/// first by namespace and name: the other's match is left out, whatever the input's order.
#[test]
fn of_two_routes_that_match_alike_the_oldest_serves() {
    let one = |name: &str, created: &str, service: &str| {
        format!("---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{ name: {name}, namespace: apps{created} }}\nspec:\n  parentRefs: [{{ name: gw, namespace: infra, sectionName: http }}]\n  hostnames: [a.in.example.org]\n  rules:\n  - backendRefs: [{{ name: {service}, port: 80 }}]\n")
    };
    let t = gateway(
        &format!(
            "{GATEWAY}{}{}",
            one(
                "a-newer",
                ", creationTimestamp: \"2026-03-02T10:00:00Z\"",
                "newer"
            ),
            one(
                "z-older",
                ", creationTimestamp: \"2026-03-01T10:00:00Z\"",
                "older"
            ),
        ),
        None,
    );
    assert_eq!(routes(&t).len(), 1, "{:?}", routes(&t));
    assert!(routes(&t)[0].contains("older.apps"), "{:?}", routes(&t));
    assert!(
        left(&t)[0].contains("HTTPRoute apps/a-newer"),
        "{:?}",
        left(&t)
    );
    // Without timestamps: by name.
    let t = gateway(
        &format!(
            "{GATEWAY}{}{}",
            one("b", "", "second"),
            one("a", "", "first")
        ),
        None,
    );
    assert!(routes(&t)[0].contains("first.apps"), "{:?}", routes(&t));
}
