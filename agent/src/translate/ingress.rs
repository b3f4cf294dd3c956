//! `Ingress` (networking.k8s.io/v1) objects and their ingress-nginx annotations into routes.
//!
//! What ingress-nginx means by a path: `Prefix` is by path segment, `Exact` exact, and
//! `ImplementationSpecific` an nginx prefix location (a raw string prefix); with `use-regex` (or
//! `rewrite-target`, which implies it) a path is a case-insensitive regular expression matched
//! from the path's start. Each annotation is carried, reported (the route carried without it:
//! it tunes, it does not guard), or keeps its Ingress out (it guards or changes what a request
//! gets, and sozu cannot do it): see [`annotation`].

use std::collections::BTreeMap;

use serde_norway::Value;
use sha2::Digest;

use super::k8s::{self, get, Object, PortRef, Services};
use super::{
    host_problem, order_and_dedupe, service_upstream, BasicAuth, Http, Kind, LeftOut, Options,
    PathMatch, Redirect, Route, Scheme, SideFile, TranslateError, Translation, Upstream,
};

/// The kinds `import ingress` reads.
pub const KINDS: &[&str] = &["Ingress", "Service", "Secret", "IngressClass", "Namespace"];

const NGINX: &str = "nginx.ingress.kubernetes.io/";

/// Annotations that only tune nginx (buffers, connection timeouts): reported, the route carried.
const TUNING: &[&str] = &[
    "proxy-connect-timeout",
    "proxy-send-timeout",
    "proxy-read-timeout",
    "proxy-body-size",
    "proxy-buffer-size",
    "proxy-buffering",
    "proxy-buffers-number",
    "proxy-request-buffering",
    "client-body-buffer-size",
    "proxy-http-version",
    "enable-cors",
    "cors-allow-origin",
    "cors-allow-methods",
    "cors-allow-headers",
    "cors-allow-credentials",
    "cors-max-age",
    "upstream-hash-by",
    "affinity",
    "session-cookie-name",
    "load-balance",
    "proxy-next-upstream",
    "proxy-next-upstream-tries",
    "proxy-next-upstream-timeout",
];

/// Reads `sources` (file name, text) as Ingresses, Services and Secrets and translates them.
pub fn translate(
    sources: &[(String, String)],
    options: &Options,
) -> Result<Translation, TranslateError> {
    let mut objects = Vec::new();
    for (file, text) in sources {
        objects.extend(k8s::objects(file, text, KINDS)?);
    }
    let services = Services::of(&objects);
    let secrets: Vec<&Object> = objects.iter().filter(|o| o.kind == "Secret").collect();
    let mut t = Translation {
        command: "import ingress".into(),
        files: sources.iter().map(|(f, _)| f.clone()).collect(),
        zone: options.zone.clone(),
        ..Translation::default()
    };
    let mut issuers = Vec::new();
    let mut carried: Vec<Carried> = Vec::new();
    for ingress in objects.iter().filter(|o| o.kind == "Ingress") {
        if let Some((_, issuer)) = ingress
            .annotations()
            .into_iter()
            .find(|(k, _)| k == "cert-manager.io/cluster-issuer")
        {
            issuers.push(issuer);
        }
        match one(ingress, &services, &secrets, options, &mut t)? {
            Some(c) => carried.push(c),
            None => continue,
        }
    }
    // `whitelist-source-range` is carried as the workspace's `allowed_sources`, which holds for
    // every route: only when every Ingress carried has the same one.
    let ranges: Vec<Option<Vec<String>>> = carried.iter().map(|c| c.sources.clone()).collect();
    let uniform = ranges.first().cloned().flatten().filter(|first| {
        ranges
            .iter()
            .all(|r| r.as_ref().is_some_and(|r| r == first))
    });
    match uniform {
        Some(sources) => {
            t.notes.push(format!(
                "whitelist-source-range: every Ingress allows {}, the workspace's allowed_sources (the Service's source ranges and the NetworkPolicy once deployed with `render --format k8s`).",
                sources.join(", ")
            ));
            t.allowed_sources = Some(sources);
            for c in carried {
                t.routes.extend(c.routes);
                t.side_files.extend(c.side_files);
            }
        }
        None => {
            for c in carried {
                if let Some(sources) = &c.sources {
                    t.left_out.push(LeftOut {
                        origin: c.object.at(format!("metadata.annotations.{NGINX}whitelist-source-range")),
                        what: "the Ingress".into(),
                        reason: format!(
                            "it allows {} only, and the workspace's allowed_sources holds for every route (these Ingresses do not all allow the same sources): import the Ingresses of each source range into a workspace of their own",
                            sources.join(", ")
                        ),
                    });
                } else {
                    t.routes.extend(c.routes);
                    t.side_files.extend(c.side_files);
                }
            }
        }
    }
    t.cluster_issuer = cluster_issuer(options, &issuers, &mut t.notes);
    let routes = std::mem::take(&mut t.routes);
    t.routes = order_and_dedupe(routes, &mut t.left_out);
    t.notes.push(
        "Every route is served over HTTPS with the host's certificate from the tls_dir; the http listener redirects to it.".into(),
    );
    Ok(t)
}

/// `--cluster-issuer`, else the Ingresses' `cert-manager.io/cluster-issuer` when they agree.
pub(super) fn cluster_issuer(
    options: &Options,
    found: &[String],
    notes: &mut Vec<String>,
) -> String {
    if let Some(issuer) = &options.cluster_issuer {
        return issuer.clone();
    }
    let mut distinct: Vec<&String> = found.iter().collect();
    distinct.sort();
    distinct.dedup();
    match distinct.as_slice() {
        [one] => (*one).clone(),
        _ => {
            notes.push("cluster_issuer: no single cert-manager.io/cluster-issuer was found (give --cluster-issuer): `internal-ca` is a placeholder.".into());
            "internal-ca".into()
        }
    }
}

/// An Ingress carried: its routes, the users files they name, and its source ranges.
struct Carried<'a> {
    object: &'a Object,
    routes: Vec<Route>,
    side_files: Vec<SideFile>,
    sources: Option<Vec<String>>,
}

/// What the annotations say for every route of the Ingress.
#[derive(Default)]
struct Effects {
    h2c: bool,
    regex: bool,
    rewrite_target: Option<String>,
    redirect: Option<Redirect>,
    basic_auth: Option<BasicAuth>,
    side_files: Vec<SideFile>,
    sources: Option<Vec<String>>,
}

/// One Ingress: `Ok(None)` when it is left out (said in `t.left_out`).
fn one<'a>(
    ingress: &'a Object,
    services: &Services<'_>,
    secrets: &[&Object],
    options: &Options,
    t: &mut Translation,
) -> Result<Option<Carried<'a>>, TranslateError> {
    let mut effects = Effects::default();
    let annotations: BTreeMap<String, String> = ingress.annotations().into_iter().collect();
    for (key, value) in &annotations {
        let Some(short) = key.strip_prefix(NGINX) else {
            continue;
        };
        let field = format!("metadata.annotations.{key}");
        match annotation(short, value, &annotations, ingress, secrets, &mut effects) {
            Verdict::Carried => {}
            Verdict::Reported(reason) => t.left_out.push(LeftOut {
                origin: ingress.at(&field),
                what: format!("the annotation `{short}`"),
                reason,
            }),
            Verdict::KeepsOut(reason) => {
                t.left_out.push(LeftOut {
                    origin: ingress.at(&field),
                    what: "the Ingress".into(),
                    reason,
                });
                return Ok(None);
            }
            Verdict::Users(left) => t.left_out.extend(left),
        }
    }
    let tls_hosts: Vec<String> = k8s::items(ingress, &ingress.value, &["spec", "tls"], "spec.tls")?
        .iter()
        .flat_map(|tls| match get(tls, &["hosts"]) {
            Some(Value::Sequence(hosts)) => hosts
                .iter()
                .filter_map(|h| h.as_str().map(str::to_owned))
                .collect(),
            _ => Vec::new(),
        })
        .collect();
    let mut routes = Vec::new();
    if let Some(backend) = get(&ingress.value, &["spec", "defaultBackend"]) {
        let field = "spec.defaultBackend";
        match &options.host {
            Some(host) => {
                if let Some(route) = path_route(
                    ingress, services, &effects, options, host, None, backend, field, t,
                )? {
                    routes.push(route);
                }
            }
            None => t.left_out.push(LeftOut {
                origin: ingress.at(field),
                what: "the default backend".into(),
                reason: "it answers hosts no rule names, and a workspace route names its host: give --host".into(),
            }),
        }
    }
    for (r, rule) in k8s::items(ingress, &ingress.value, &["spec", "rules"], "spec.rules")?
        .into_iter()
        .enumerate()
    {
        let host = match get(rule, &["host"]) {
            Some(h) => ingress.string(h, &format!("spec.rules[{r}].host"))?,
            None => None,
        };
        let host = match host.or_else(|| options.host.clone()) {
            Some(host) => host,
            None => {
                t.left_out.push(LeftOut {
                    origin: ingress.at(format!("spec.rules[{r}]")),
                    what: "the rule".into(),
                    reason: "it names no host (it answers any): give --host".into(),
                });
                continue;
            }
        };
        if !tls_hosts.is_empty() && !tls_hosts.contains(&host) {
            t.notes.push(format!(
                "{}: host `{host}` has no tls entry (ingress-nginx serves it over plain HTTP); it is served over HTTPS here.",
                ingress.origin
            ));
        }
        let paths = k8s::items(
            ingress,
            rule,
            &["http", "paths"],
            &format!("spec.rules[{r}].http.paths"),
        )?;
        for (p, path) in paths.into_iter().enumerate() {
            let field = format!("spec.rules[{r}].http.paths[{p}]");
            let Some(backend) = get(path, &["backend"]) else {
                return Err(ingress.error(&format!("{field}.backend"), "the path has no backend"));
            };
            if let Some(route) = path_route(
                ingress,
                services,
                &effects,
                options,
                &host,
                Some(path),
                backend,
                &field,
                t,
            )? {
                routes.push(route);
            }
        }
    }
    Ok(Some(Carried {
        object: ingress,
        routes,
        side_files: effects.side_files,
        sources: effects.sources,
    }))
}

/// The route of one path (or of the default backend, `path` none).
#[allow(clippy::too_many_arguments)]
fn path_route(
    ingress: &Object,
    services: &Services<'_>,
    effects: &Effects,
    options: &Options,
    host: &str,
    path: Option<&Value>,
    backend: &Value,
    field: &str,
    t: &mut Translation,
) -> Result<Option<Route>, TranslateError> {
    if let Some(problem) = host_problem(host, &options.zone) {
        t.left_out.push(LeftOut {
            origin: ingress.at(field),
            what: "the path".into(),
            reason: problem,
        });
        return Ok(None);
    }
    let (value, kind) = match path {
        None => ("/".to_owned(), "Prefix".to_owned()),
        Some(path) => {
            let value = match get(path, &["path"]) {
                Some(v) => ingress
                    .string(v, &format!("{field}.path"))?
                    .unwrap_or_else(|| "/".into()),
                None => "/".into(),
            };
            let kind = match get(path, &["pathType"]) {
                Some(v) => ingress
                    .string(v, &format!("{field}.pathType"))?
                    .unwrap_or_default(),
                None => {
                    return Err(ingress.error(
                        &format!("{field}.pathType"),
                        "the path has no pathType (Prefix, Exact or ImplementationSpecific)",
                    ))
                }
            };
            (value, kind)
        }
    };
    let path_match = if effects.regex && kind != "Exact" {
        let anchored = format!("(?i){}.*", value);
        if let Err(err) = regex::Regex::new(&anchored) {
            t.left_out.push(LeftOut {
                origin: ingress.at(format!("{field}.path")),
                what: "the path".into(),
                reason: format!("`{value}` is not a regular expression sozu reads: {err}"),
            });
            return Ok(None);
        }
        PathMatch::Regex(anchored)
    } else {
        if !value.starts_with('/') {
            return Err(ingress.error(
                &format!("{field}.path"),
                format!("the path `{value}` does not start with `/`"),
            ));
        }
        match kind.as_str() {
            "Prefix" if value == "/" => PathMatch::root(),
            "Prefix" => PathMatch::SegmentPrefix(value.trim_end_matches('/').to_owned()),
            "Exact" => PathMatch::Exact(value.clone()),
            "ImplementationSpecific" => PathMatch::Prefix(value.clone()),
            other => {
                return Err(ingress.error(
                    &format!("{field}.pathType"),
                    format!("unknown pathType `{other}` (Prefix, Exact or ImplementationSpecific)"),
                ))
            }
        }
    };
    let mut http = Http {
        path: path_match,
        h2c: effects.h2c,
        basic_auth: effects.basic_auth.clone(),
        redirect: effects.redirect.clone(),
        ..Http::default()
    };
    if let Some(target) = &effects.rewrite_target {
        http.rewrite_path = Some(rewrite_template(target));
    }
    let upstreams = if http.redirect.is_some() {
        Vec::new()
    } else {
        vec![backend_upstream(ingress, services, backend, field)?]
    };
    Ok(Some(Route {
        host: host.to_owned(),
        kind: Kind::Https(http),
        upstreams,
        origin: ingress.at(field),
        note: None,
    }))
}

/// nginx's `$1` as sozu's `$PATH[1]`.
fn rewrite_template(target: &str) -> String {
    let mut out = String::new();
    let mut chars = target.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '$' && chars.peek().is_some_and(char::is_ascii_digit) {
            let mut n = String::new();
            while let Some(d) = chars.peek().filter(|d| d.is_ascii_digit()) {
                n.push(*d);
                chars.next();
            }
            out.push_str(&format!("$PATH[{n}]"));
        } else {
            out.push(c);
        }
    }
    out
}

fn backend_upstream(
    ingress: &Object,
    services: &Services<'_>,
    backend: &Value,
    field: &str,
) -> Result<Upstream, TranslateError> {
    if get(backend, &["resource"]).is_some() {
        return Err(ingress.error(
            &format!("{field}.backend.resource"),
            "a resource backend is not a Service: the workspace's upstreams are addresses",
        ));
    }
    let service_field = format!("{field}.backend.service");
    let Some(service) = get(backend, &["service"]) else {
        return Err(ingress.error(&service_field, "the backend names no service"));
    };
    let name = match get(service, &["name"]) {
        Some(v) => ingress.string(v, &format!("{service_field}.name"))?,
        None => None,
    }
    .ok_or_else(|| ingress.error(&format!("{service_field}.name"), "the service has no name"))?;
    let port_field = format!("{service_field}.port");
    let port = if let Some(number) = get(service, &["port", "number"]) {
        let n = number
            .as_u64()
            .and_then(|n| u16::try_from(n).ok())
            .filter(|n| *n > 0)
            .ok_or_else(|| ingress.error(&format!("{port_field}.number"), "not a port number"))?;
        services.port(&ingress.namespace, &name, PortRef::Number(n))
    } else if let Some(named) = get(service, &["port", "name"]).and_then(Value::as_str) {
        services.port(&ingress.namespace, &name, PortRef::Name(named))
    } else {
        return Err(ingress.error(&port_field, "the service port has no number or name"));
    }
    .map_err(|message| ingress.error(&port_field, message))?;
    Ok(Upstream {
        host: service_upstream(&name, &ingress.namespace),
        port,
        weight: 1,
    })
}

enum Verdict {
    Carried,
    /// Not carried; the route is, without it.
    Reported(String),
    /// The Ingress is left out.
    KeepsOut(String),
    /// Basic-auth users that could not be carried (the route is).
    Users(Vec<LeftOut>),
}

/// What one ingress-nginx annotation (`short`, without its prefix) does to the Ingress.
fn annotation(
    short: &str,
    value: &str,
    all: &BTreeMap<String, String>,
    ingress: &Object,
    secrets: &[&Object],
    effects: &mut Effects,
) -> Verdict {
    let get_nginx = |name: &str| all.get(&format!("{NGINX}{name}")).map(String::as_str);
    match short {
        "ssl-redirect" | "force-ssl-redirect" => match value {
            "true" => Verdict::Carried,
            _ if short == "force-ssl-redirect" => Verdict::Carried,
            _ => Verdict::Reported(
                "the http listener redirects every request to HTTPS: the route is served over HTTPS only".into(),
            ),
        },
        "backend-protocol" => match value.to_ascii_uppercase().as_str() {
            "HTTP" => Verdict::Carried,
            "GRPC" => {
                effects.h2c = true;
                Verdict::Carried
            }
            other => Verdict::KeepsOut(format!(
                "backend-protocol {other}: sozu 2.3.3 speaks HTTP/1.1 or h2c to a backend, no TLS, FastCGI or AJP"
            )),
        },
        "whitelist-source-range" | "allowlist-source-range" => match source_ranges(value) {
            Ok(ranges) => {
                effects.sources = Some(ranges);
                Verdict::Carried
            }
            Err(reason) => Verdict::KeepsOut(reason),
        },
        "use-regex" => {
            effects.regex = value == "true";
            Verdict::Carried
        }
        "rewrite-target" => {
            if value.contains('?') || value.contains("${") {
                return Verdict::KeepsOut(format!(
                    "rewrite-target `{value}` holds a query string or a variable sozu's templates do not have"
                ));
            }
            effects.regex = true;
            effects.rewrite_target = Some(value.to_owned());
            Verdict::Carried
        }
        "permanent-redirect" | "temporal-redirect" => {
            let status = if short == "temporal-redirect" {
                match get_nginx("temporal-redirect-code").unwrap_or("302") {
                    "302" => Some(302),
                    "308" => Some(308),
                    _ => None,
                }
            } else {
                match get_nginx("permanent-redirect-code").unwrap_or("301") {
                    "301" => Some(301),
                    "308" => Some(308),
                    "302" => Some(302),
                    _ => None,
                }
            };
            let Some(status) = status else {
                return Verdict::KeepsOut(format!(
                    "{short}'s code: sozu 2.3.3 redirects with 301, 302 or 308"
                ));
            };
            match redirect_to(value, status) {
                Ok(redirect) => {
                    effects.redirect = Some(redirect);
                    Verdict::Carried
                }
                Err(reason) => Verdict::KeepsOut(reason),
            }
        }
        "permanent-redirect-code" | "temporal-redirect-code" | "auth-realm"
        | "auth-secret" | "auth-secret-type" => Verdict::Carried,
        "auth-type" => {
            if value != "basic" {
                return Verdict::KeepsOut(format!(
                    "auth-type {value}: sozu 2.3.3 checks basic auth only"
                ));
            }
            basic_auth(ingress, secrets, get_nginx("auth-secret"), get_nginx("auth-secret-type"), get_nginx("auth-realm"), effects)
        }
        "proxy-read-timeout" => Verdict::Reported(format!(
            "a backend's answer waits `listeners.timeouts.back` (360 s unless set), the same for every route: sozu 2.3.3 has no timeout per route (the Ingress asked {value} s)"
        )),
        "proxy-body-size" => Verdict::Reported(
            "sozu 2.3.3 has no limit on a request body's size".into(),
        ),
        "configuration-snippet" | "server-snippet" | "stream-snippet" | "modsecurity-snippet" => {
            Verdict::KeepsOut(format!(
                "{short}: nginx configuration sozu cannot run, which may guard the route"
            ))
        }
        s if s.starts_with("canary") => Verdict::KeepsOut(
            "a canary Ingress splits another Ingress's traffic by header, cookie or weight: import the split as weighted `upstreams` by hand".into(),
        ),
        s if TUNING.contains(&s) => Verdict::Reported(format!(
            "`{s}` tunes nginx; sozu 2.3.3 has no setting for it per route"
        )),
        other => Verdict::KeepsOut(format!(
            "`{other}` is not an annotation this import reads, and it may guard the route"
        )),
    }
}

/// The annotation's CIDR blocks, canonical (a bare address is a /32 or /128; nginx reads an
/// address's bits after the prefix as zero).
fn source_ranges(value: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for part in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let net = if part.contains('/') {
            part.parse::<ipnet::IpNet>()
                .map(|n| n.trunc())
                .map_err(|_| ())
        } else {
            part.parse::<std::net::IpAddr>()
                .map(ipnet::IpNet::from)
                .map_err(|_| ())
        };
        match net {
            Ok(net) => out.push(net.to_string()),
            Err(_) => {
                return Err(format!(
                    "whitelist-source-range: `{part}` is not a CIDR block"
                ))
            }
        }
    }
    if out.is_empty() {
        return Err("whitelist-source-range is empty".into());
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// `permanent-redirect`'s URL as a redirect: nginx answers with it as it is, whatever the
/// request's path.
fn redirect_to(url: &str, status: u16) -> Result<Redirect, String> {
    let refused = |why: &str| Err(format!("redirect to `{url}`: {why}"));
    let (scheme, rest) = match url.split_once("://") {
        Some(("https", rest)) => (Scheme::Https, rest),
        Some(("http", rest)) => (Scheme::Http, rest),
        _ => return refused("not an http:// or https:// URL"),
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    if path.contains(['?', '#', '$']) || path.chars().any(char::is_whitespace) {
        return refused(
            "a query, a fragment or a `$` in its path, which sozu's template cannot hold",
        );
    }
    let (host, port) = match authority.rsplit_once(':') {
        Some((host, port)) => match port.parse::<u16>() {
            Ok(port) => (host, Some(port)),
            Err(_) => return refused("its port is not a number"),
        },
        None => (authority, None),
    };
    if !super::is_dns_name(host) {
        return refused("its host is not a DNS name");
    }
    Ok(Redirect {
        status,
        scheme,
        host: Some(host.to_owned()),
        path: Some(path.to_owned()),
        port,
    })
}

/// `auth-type: basic`: the users of the Secret `auth-secret`, written as a users file beside the
/// workspace (`user:sha256` lines, mode 0600). Only a `{PLAIN}` password can be carried: the
/// workspace checks the SHA-256 of the password, and a crypt, MD5 (`$apr1$`), bcrypt or SHA-1
/// hash cannot be turned into one. A user that cannot be carried is reported by name, never by
/// hash; an Ingress none of whose users can be is left out (its route would refuse everyone).
fn basic_auth(
    ingress: &Object,
    secrets: &[&Object],
    secret: Option<&str>,
    secret_type: Option<&str>,
    realm: Option<&str>,
    effects: &mut Effects,
) -> Verdict {
    let Some(secret) = secret else {
        return Verdict::KeepsOut("auth-type basic without auth-secret".into());
    };
    let (namespace, name) = match secret.split_once('/') {
        Some((ns, name)) => (ns, name),
        None => (ingress.namespace.as_str(), secret),
    };
    let Some(object) = secrets
        .iter()
        .find(|s| s.namespace == namespace && s.name == name)
    else {
        return Verdict::KeepsOut(format!(
            "auth-secret {namespace}/{name} is not in the input: give the Secret (`kubectl get secret -n {namespace} {name} -o yaml`)"
        ));
    };
    let decode = |key: &str, v: &Value| -> Option<String> {
        let text = v.as_str()?;
        if get(&object.value, &["stringData", key]).is_some() {
            return Some(text.to_owned());
        }
        use base64::Engine;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(text.trim())
            .ok()?;
        String::from_utf8(bytes).ok()
    };
    let entries = |section: &str| -> Vec<(String, String)> {
        match get(&object.value, &[section]) {
            Some(Value::Mapping(map)) => map
                .iter()
                .filter_map(|(k, v)| {
                    let key = k.as_str()?;
                    let value = if section == "stringData" {
                        v.as_str()?.to_owned()
                    } else {
                        decode(key, v)?
                    };
                    Some((key.to_owned(), value))
                })
                .collect(),
            _ => Vec::new(),
        }
    };
    let mut data = entries("data");
    data.extend(entries("stringData"));
    let lines: Vec<(String, String)> = if secret_type == Some("auth-map") {
        data
    } else {
        data.iter()
            .filter(|(k, _)| k == "auth")
            .flat_map(|(_, text)| {
                text.lines()
                    .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
                    .filter_map(|l| {
                        l.trim()
                            .split_once(':')
                            .map(|(u, h)| (u.to_owned(), h.to_owned()))
                    })
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    let mut users = String::new();
    let mut left = Vec::new();
    for (user, hash) in &lines {
        match hash.strip_prefix("{PLAIN}") {
            Some(password) if !user.is_empty() && !user.contains(char::is_whitespace) => {
                let digest = sha2::Sha256::digest(password.as_bytes());
                let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
                users.push_str(&format!("{user}:{hex}\n"));
            }
            _ => left.push(LeftOut {
                origin: object.at(if secret_type == Some("auth-map") {
                    format!("data.{user}")
                } else {
                    "data.auth".into()
                }),
                what: format!("the user `{user}`"),
                reason: format!(
                    "its password is kept as {} hash, and the workspace checks the SHA-256 of the password: add the user with `just basic-auth-user {user} FILE`",
                    hash_scheme(hash)
                ),
            }),
        }
    }
    if users.is_empty() {
        return Verdict::KeepsOut(format!(
            "no user of Secret {namespace}/{name} can be carried (the workspace checks the SHA-256 of a password; the Secret holds {}): write its users file with `just basic-auth-user` and add the route by hand",
            if lines.is_empty() { "no user".to_owned() } else { format!("{} other hash{}", lines.len(), if lines.len() == 1 { "" } else { "es" }) }
        ));
    }
    let file = format!("{namespace}-{name}.users");
    effects.basic_auth = Some(BasicAuth {
        users_file: file.clone(),
        realm: realm
            .filter(|r| {
                !r.is_empty()
                    && r.len() <= 128
                    && r.bytes()
                        .all(|b| (b' '..=b'~').contains(&b) && b != b'"' && b != b'\\')
            })
            .map(str::to_owned),
    });
    if !effects.side_files.iter().any(|f| f.name == file) {
        effects.side_files.push(SideFile {
            name: file,
            contents: users,
            mode: 0o600,
        });
    }
    Verdict::Users(left)
}

/// The name of a password hash's scheme, from its form (never the hash itself).
fn hash_scheme(hash: &str) -> &'static str {
    if hash.starts_with("$apr1$") {
        "an Apache MD5 ($apr1$)"
    } else if hash.starts_with("$2") {
        "a bcrypt"
    } else if hash.starts_with("$5$") || hash.starts_with("$6$") || hash.starts_with("$1$") {
        "a crypt(3)"
    } else if hash.starts_with("{SHA}") || hash.starts_with("{SSHA}") {
        "a SHA-1"
    } else {
        "a crypt(3) DES"
    }
}
