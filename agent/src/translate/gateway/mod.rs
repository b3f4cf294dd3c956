//! Gateway API v1 objects into routes: `Gateway` listeners, and the `HTTPRoute`, `GRPCRoute`,
//! `TLSRoute`, `TCPRoute` and `UDPRoute`s attached to them, with the `Service`s, `Namespace`s and
//! `ReferenceGrant`s they refer to.
//!
//! A route attaches to the listeners its `parentRefs` name that allow it (namespace, kind,
//! section, port); its hosts are its hostnames as each listener's hostname narrows them, or
//! `--host` when neither names one. An HTTPRoute rule becomes one workspace route per match
//! and host. A rule is left out whole when a part of it cannot be carried (a query-parameter
//! match, a mirror, an extension, a timeout, a retry, a header `add`, a backend of another kind
//! or namespace without a `ReferenceGrant`): served without it, it would answer otherwise.

mod filters;

use std::collections::BTreeMap;

use serde_norway::Value;

use super::k8s::{self, get, scalar, Object, PortRef, Services};
use super::{
    host_problem, order_and_dedupe, precedence, service_upstream, HeaderEdits, HeaderMatch,
    HeaderTest, Http, Kind, LeftOut, Options, PathMatch, Redirect, Route, Scheme, TranslateError,
    Translation, Upstream,
};

/// The kinds `import gateway` reads.
pub const KINDS: &[&str] = &[
    "Gateway",
    "GatewayClass",
    "HTTPRoute",
    "GRPCRoute",
    "TLSRoute",
    "TCPRoute",
    "UDPRoute",
    "Service",
    "ReferenceGrant",
    "Namespace",
];

use filters::{apply_redirect, apply_rewrite, header_edits};

const GROUP: &str = "gateway.networking.k8s.io";

struct Listener<'a> {
    gateway: &'a Object,
    name: String,
    port: u16,
    protocol: String,
    hostname: Option<String>,
    passthrough: bool,
    from: String,
    selector: Vec<(String, String)>,
    kinds: Option<Vec<String>>,
}

/// What a rule or a route cannot carry: `Err(reason)` leaves it out.
type Carry<T> = Result<T, String>;

pub fn translate(
    sources: &[(String, String)],
    options: &Options,
) -> Result<Translation, TranslateError> {
    let mut objects = Vec::new();
    for (file, text) in sources {
        objects.extend(k8s::objects(file, text, KINDS)?);
    }
    let mut t = Translation {
        command: "import gateway".into(),
        files: sources.iter().map(|(f, _)| f.clone()).collect(),
        zone: options.zone.clone(),
        ..Translation::default()
    };
    let services = Services::of(&objects);
    let mut listeners = Vec::new();
    let mut issuers = Vec::new();
    for gateway in objects.iter().filter(|o| o.kind == "Gateway") {
        if let Some((_, issuer)) = gateway
            .annotations()
            .into_iter()
            .find(|(k, _)| k == "cert-manager.io/cluster-issuer")
        {
            issuers.push(issuer);
        }
        listeners.extend(gateway_listeners(gateway)?);
    }
    let namespaces: BTreeMap<String, Vec<(String, String)>> = objects
        .iter()
        .filter(|o| o.kind == "Namespace")
        .map(|o| (o.name.clone(), o.labels()))
        .collect();
    let grants: Vec<&Object> = objects
        .iter()
        .filter(|o| o.kind == "ReferenceGrant")
        .collect();
    let context = Context {
        listeners: &listeners,
        namespaces: &namespaces,
        grants: &grants,
        services: &services,
        options,
    };
    let mut routes = Vec::new();
    // The spec's order among routes whose matches tie: the oldest first, then by namespace and
    // name (`kubectl get -o yaml` writes `creationTimestamp`, RFC 3339 in UTC, which sorts as
    // text); routes without one keep that order among themselves, after those with one.
    let mut route_objects: Vec<&Object> = objects
        .iter()
        .filter(|o| o.kind.ends_with("Route"))
        .collect();
    route_objects.sort_by_key(|o| {
        let created = get(&o.value, &["metadata", "creationTimestamp"]).and_then(Value::as_str);
        (
            created.is_none(),
            created.map(str::to_owned),
            o.namespace.clone(),
            o.name.clone(),
        )
    });
    for route in route_objects {
        routes.extend(context.route(route, &mut t.left_out)?);
    }
    t.routes = precedence::keep_the_specs_order(
        order_and_dedupe(routes, &mut t.left_out),
        &mut t.left_out,
    );
    t.cluster_issuer = super::ingress::cluster_issuer(options, &issuers, &mut t.notes);
    t.notes.push("Every HTTP route is served over HTTPS with the host's certificate from the tls_dir (a listener's certificateRefs are not read), on the workspace's https listener; the http listener redirects to it. A listener's port is the workspace's listener's.".into());
    Ok(t)
}

fn gateway_listeners(gateway: &Object) -> Result<Vec<Listener<'_>>, TranslateError> {
    let mut out = Vec::new();
    for (i, l) in k8s::items(
        gateway,
        &gateway.value,
        &["spec", "listeners"],
        "spec.listeners",
    )?
    .into_iter()
    .enumerate()
    {
        let field = format!("spec.listeners[{i}]");
        let port = get(l, &["port"])
            .and_then(Value::as_u64)
            .and_then(|p| u16::try_from(p).ok())
            .filter(|p| *p > 0)
            .ok_or_else(|| gateway.error(&format!("{field}.port"), "expected a port"))?;
        let protocol = get(l, &["protocol"])
            .and_then(Value::as_str)
            .ok_or_else(|| gateway.error(&format!("{field}.protocol"), "expected a protocol"))?
            .to_owned();
        let selector = match get(
            l,
            &["allowedRoutes", "namespaces", "selector", "matchLabels"],
        ) {
            Some(Value::Mapping(m)) => m
                .iter()
                .filter_map(|(k, v)| Some((k.as_str()?.to_owned(), scalar(v)?)))
                .collect(),
            _ => Vec::new(),
        };
        let kinds = match get(l, &["allowedRoutes", "kinds"]) {
            Some(Value::Sequence(kinds)) => Some(
                kinds
                    .iter()
                    .filter_map(|k| get(k, &["kind"]).and_then(Value::as_str).map(str::to_owned))
                    .collect(),
            ),
            _ => None,
        };
        out.push(Listener {
            gateway,
            name: get(l, &["name"])
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            port,
            protocol,
            hostname: get(l, &["hostname"])
                .and_then(Value::as_str)
                .map(str::to_owned),
            passthrough: get(l, &["tls", "mode"]).and_then(Value::as_str) == Some("Passthrough"),
            from: get(l, &["allowedRoutes", "namespaces", "from"])
                .and_then(Value::as_str)
                .unwrap_or("Same")
                .to_owned(),
            selector,
            kinds,
        });
    }
    Ok(out)
}

struct Context<'a> {
    listeners: &'a [Listener<'a>],
    namespaces: &'a BTreeMap<String, Vec<(String, String)>>,
    grants: &'a [&'a Object],
    services: &'a Services<'a>,
    options: &'a Options,
}

impl Context<'_> {
    /// The workspace routes of one Gateway API route.
    fn route(
        &self,
        route: &Object,
        left_out: &mut Vec<LeftOut>,
    ) -> Result<Vec<Route>, TranslateError> {
        let leave = |left_out: &mut Vec<LeftOut>, field: &str, what: &str, reason: String| {
            left_out.push(LeftOut {
                origin: route.at(field),
                what: what.into(),
                reason,
            })
        };
        let hostnames: Vec<String> = k8s::items(
            route,
            &route.value,
            &["spec", "hostnames"],
            "spec.hostnames",
        )?
        .iter()
        .filter_map(|h| h.as_str().map(str::to_owned))
        .collect();
        // Each attached listener, with the hosts it gives the route.
        let mut attached: Vec<(&Listener<'_>, Vec<String>)> = Vec::new();
        let mut refused = Vec::new();
        for (p, parent) in k8s::items(
            route,
            &route.value,
            &["spec", "parentRefs"],
            "spec.parentRefs",
        )?
        .into_iter()
        .enumerate()
        {
            match self.attach(route, parent, &hostnames) {
                Ok(found) => attached.extend(found),
                Err(reason) => refused.push(format!("parentRefs[{p}]: {reason}")),
            }
        }
        if attached.is_empty() {
            leave(
                left_out,
                "spec.parentRefs",
                "the route",
                if refused.is_empty() {
                    "it names no parent Gateway".into()
                } else {
                    format!("it is attached to no listener ({})", refused.join("; "))
                },
            );
            return Ok(Vec::new());
        }
        // The hosts, each once, with the listener that gives it (for its port).
        let mut hosts: Vec<(String, &Listener<'_>)> = Vec::new();
        for (listener, names) in &attached {
            for name in names {
                if !hosts
                    .iter()
                    .any(|(h, l)| h == name && l.port == listener.port)
                {
                    hosts.push((name.clone(), listener));
                }
            }
        }
        let mut kept_hosts = Vec::new();
        for (host, listener) in hosts {
            match host_problem(&host, &self.options.zone) {
                Some(reason) => leave(
                    left_out,
                    "spec.hostnames",
                    &format!("the host `{host}`"),
                    reason,
                ),
                None => kept_hosts.push((host, listener)),
            }
        }
        let mut out = Vec::new();
        match route.kind.as_str() {
            "HTTPRoute" | "GRPCRoute" => {
                let grpc = route.kind == "GRPCRoute";
                let rules = k8s::items(route, &route.value, &["spec", "rules"], "spec.rules")?;
                let default_rule = Value::Mapping(Default::default());
                let rules: Vec<&Value> = if rules.is_empty() {
                    vec![&default_rule]
                } else {
                    rules
                };
                for (r, rule) in rules.into_iter().enumerate() {
                    let field = format!("spec.rules[{r}]");
                    match self.http_rule(route, rule, &field, grpc) {
                        Ok(matches) => {
                            for (m, http, upstreams) in matches {
                                for (host, _) in &kept_hosts {
                                    out.push(Route {
                                        host: host.clone(),
                                        kind: Kind::Https(http.clone()),
                                        upstreams: upstreams.clone(),
                                        origin: route.at(format!("{field}.matches[{m}]")),
                                        note: None,
                                    });
                                }
                            }
                        }
                        Err(reason) => leave(left_out, &field, "the rule", reason),
                    }
                }
            }
            kind => {
                let rules = k8s::items(route, &route.value, &["spec", "rules"], "spec.rules")?;
                if rules.len() != 1 {
                    leave(
                        left_out,
                        "spec.rules",
                        "the route",
                        format!(
                            "a {kind} of {} rules: a workspace route has one set of upstreams",
                            rules.len()
                        ),
                    );
                    return Ok(out);
                }
                let field = "spec.rules[0]";
                let upstreams = match self.backends(route, rules[0], field) {
                    Ok(u) => u,
                    Err(reason) => {
                        leave(left_out, field, "the route", reason);
                        return Ok(out);
                    }
                };
                for (host, listener) in &kept_hosts {
                    let listen_port = listener.port;
                    let kind = match route.kind.as_str() {
                        "TLSRoute" => Kind::TlsPassthrough { listen_port },
                        "TCPRoute" => Kind::Tcp { listen_port },
                        _ => Kind::Udp { listen_port },
                    };
                    if matches!(listen_port, 80 | 443) {
                        leave(left_out, "spec.parentRefs", "the route", format!("its listener's port {listen_port} is the workspace's http or https listener's, which sozu 2.3.3 cannot share with a {} route: give the listener another port", route.kind));
                        continue;
                    }
                    out.push(Route {
                        host: host.clone(),
                        kind,
                        upstreams: upstreams.clone(),
                        origin: route.at(field),
                        note: None,
                    });
                }
            }
        }
        Ok(out)
    }

    /// The listeners `parent` attaches the route to, each with the hosts it gives it.
    fn attach<'l>(
        &'l self,
        route: &Object,
        parent: &Value,
        hostnames: &[String],
    ) -> Carry<Vec<(&'l Listener<'l>, Vec<String>)>> {
        let group = get(parent, &["group"])
            .and_then(Value::as_str)
            .unwrap_or(GROUP);
        let kind = get(parent, &["kind"])
            .and_then(Value::as_str)
            .unwrap_or("Gateway");
        if group != GROUP || kind != "Gateway" {
            return Err(format!(
                "a parent of kind {kind} ({group}) is not a Gateway"
            ));
        }
        let name = get(parent, &["name"])
            .and_then(Value::as_str)
            .unwrap_or_default();
        let namespace = get(parent, &["namespace"])
            .and_then(Value::as_str)
            .unwrap_or(&route.namespace);
        let section = get(parent, &["sectionName"]).and_then(Value::as_str);
        let port = get(parent, &["port"]).and_then(Value::as_u64);
        let candidates: Vec<&Listener<'_>> = self
            .listeners
            .iter()
            .filter(|l| l.gateway.name == name && l.gateway.namespace == namespace)
            .collect();
        if candidates.is_empty() {
            return Err(format!("Gateway {namespace}/{name} is not in the input"));
        }
        let mut found = Vec::new();
        let mut why = Vec::new();
        for l in candidates {
            let label = format!("listener `{}`", l.name);
            if section.is_some_and(|s| s != l.name) || port.is_some_and(|p| p != u64::from(l.port))
            {
                continue;
            }
            let kind_ok = match &l.kinds {
                Some(kinds) => kinds.iter().any(|k| k == &route.kind),
                None => match (l.protocol.as_str(), route.kind.as_str()) {
                    ("HTTP" | "HTTPS", "HTTPRoute" | "GRPCRoute") => true,
                    ("TLS", "TLSRoute") => l.passthrough,
                    ("TCP", "TCPRoute") | ("UDP", "UDPRoute") => true,
                    _ => false,
                },
            };
            if !kind_ok {
                why.push(format!("{label} does not take a {}", route.kind));
                continue;
            }
            let allowed = match l.from.as_str() {
                "All" => true,
                "Same" => route.namespace == l.gateway.namespace,
                "Selector" => match self.namespaces.get(&route.namespace) {
                    Some(labels) => l.selector.iter().all(|kv| labels.contains(kv)),
                    None => {
                        why.push(format!("{label} selects namespaces by label, and Namespace {} is not in the input", route.namespace));
                        continue;
                    }
                },
                _ => false,
            };
            if !allowed {
                why.push(format!(
                    "{label} does not allow routes of namespace {}",
                    route.namespace
                ));
                continue;
            }
            match hosts(
                hostnames,
                l.hostname.as_deref(),
                self.options.host.as_deref(),
            ) {
                Ok(names) if names.is_empty() => why.push(format!(
                    "{label}: none of the route's hostnames is the listener's"
                )),
                Ok(names) => found.push((l, names)),
                Err(reason) => why.push(format!("{label}: {reason}")),
            }
        }
        if found.is_empty() {
            let _ = &route.origin;
            return Err(if why.is_empty() {
                format!("Gateway {namespace}/{name} has no listener of that section or port")
            } else {
                why.join("; ")
            });
        }
        Ok(found)
    }

    /// An HTTPRoute's (or GRPCRoute's) rule: one `Http` per match, and its upstreams.
    fn http_rule(
        &self,
        route: &Object,
        rule: &Value,
        field: &str,
        grpc: bool,
    ) -> Carry<Vec<(usize, Http, Vec<Upstream>)>> {
        for unsupported in ["timeouts", "retry", "sessionPersistence"] {
            if get(rule, &[unsupported]).is_some() {
                return Err(format!("`{unsupported}`: sozu 2.3.3 has none per route"));
            }
        }
        let mut base = Http {
            h2c: grpc,
            ..Http::default()
        };
        let mut rewrite: Option<Value> = None;
        let mut redirect: Option<Value> = None;
        if let Some(Value::Sequence(filters)) = get(rule, &["filters"]) {
            for filter in filters {
                let kind = get(filter, &["type"])
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                match kind {
                    "RequestHeaderModifier" => {
                        base.request_headers =
                            header_edits(get(filter, &["requestHeaderModifier"]))?
                    }
                    "ResponseHeaderModifier" => {
                        base.response_headers =
                            header_edits(get(filter, &["responseHeaderModifier"]))?
                    }
                    "URLRewrite" if !grpc => rewrite = get(filter, &["urlRewrite"]).cloned(),
                    "RequestRedirect" if !grpc => {
                        redirect = get(filter, &["requestRedirect"]).cloned()
                    }
                    "RequestMirror" => {
                        return Err(
                            "RequestMirror: sozu 2.3.3 sends a request to one backend".into()
                        )
                    }
                    "ExtensionRef" => {
                        return Err("ExtensionRef: an extension of another implementation".into())
                    }
                    other => {
                        return Err(format!("the filter {other}: sozu 2.3.3 has no equivalent"))
                    }
                }
            }
        }
        let upstreams = if redirect.is_some() {
            if get(rule, &["backendRefs"])
                .is_some_and(|b| b.as_sequence().is_some_and(|s| !s.is_empty()))
            {
                return Err("a RequestRedirect beside backendRefs".into());
            }
            Vec::new()
        } else {
            self.backends(route, rule, field)?
        };
        let default_match = Value::Mapping(Default::default());
        let matches: Vec<&Value> = match get(rule, &["matches"]) {
            Some(Value::Sequence(m)) if !m.is_empty() => m.iter().collect(),
            _ => vec![&default_match],
        };
        let mut out = Vec::new();
        for (m, one) in matches.into_iter().enumerate() {
            if get(one, &["queryParams"]).is_some() {
                return Err(format!(
                    "matches[{m}].queryParams: sozu 2.3.3 does not match a query string"
                ));
            }
            let mut http = base.clone();
            let prefix_of_match;
            if grpc {
                http.path = grpc_path(get(one, &["method"]))?;
                prefix_of_match = None;
            } else {
                let kind = get(one, &["path", "type"])
                    .and_then(Value::as_str)
                    .unwrap_or("PathPrefix");
                let value = get(one, &["path", "value"])
                    .and_then(Value::as_str)
                    .unwrap_or("/");
                if !value.starts_with('/') {
                    return Err(format!(
                        "matches[{m}].path `{value}` does not start with `/`"
                    ));
                }
                http.path = match kind {
                    "PathPrefix" => {
                        let trimmed = value.trim_end_matches('/');
                        if trimmed.is_empty() {
                            PathMatch::root()
                        } else {
                            PathMatch::SegmentPrefix(trimmed.to_owned())
                        }
                    }
                    "Exact" => PathMatch::Exact(value.to_owned()),
                    "RegularExpression" => {
                        regex::Regex::new(value).map_err(|e| format!("matches[{m}].path: {e}"))?;
                        PathMatch::Regex(value.to_owned())
                    }
                    other => return Err(format!("matches[{m}].path.type {other}")),
                };
                prefix_of_match =
                    (kind == "PathPrefix").then(|| value.trim_end_matches('/').to_owned());
                if let Some(method) = get(one, &["method"]).and_then(Value::as_str) {
                    http.method = Some(method.to_owned());
                }
            }
            if let Some(Value::Sequence(headers)) = get(one, &["headers"]) {
                for h in headers {
                    let name = get(h, &["name"])
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_owned();
                    let value = get(h, &["value"])
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_owned();
                    let test = match get(h, &["type"]).and_then(Value::as_str).unwrap_or("Exact") {
                        "Exact" => HeaderTest::Exact(value),
                        "RegularExpression" => {
                            regex::Regex::new(&value)
                                .map_err(|e| format!("matches[{m}].headers `{name}`: {e}"))?;
                            HeaderTest::Regex(value)
                        }
                        other => return Err(format!("matches[{m}].headers type {other}")),
                    };
                    // The first of two matches on one name is the one that counts (the spec).
                    if !http
                        .match_headers
                        .iter()
                        .any(|x| x.name.eq_ignore_ascii_case(&name))
                    {
                        http.match_headers.push(HeaderMatch { name, test });
                    }
                }
            }
            let mut second = None;
            if let Some(r) = &rewrite {
                second = apply_rewrite(&mut http, r, prefix_of_match.as_deref())?;
            }
            if let Some(r) = &redirect {
                second = second.or(apply_redirect(&mut http, r, prefix_of_match.as_deref())?);
            }
            if let Some(path) = second {
                let bare = Http {
                    path,
                    ..http.clone()
                };
                out.push((m, bare, upstreams.clone()));
            }
            out.push((m, http, upstreams.clone()));
        }
        Ok(out)
    }

    /// A rule's `backendRefs` as weighted upstreams.
    fn backends(&self, route: &Object, rule: &Value, field: &str) -> Carry<Vec<Upstream>> {
        let refs = match get(rule, &["backendRefs"]) {
            Some(Value::Sequence(refs)) if !refs.is_empty() => refs,
            _ => return Err("it has no backendRefs (requests get 500)".into()),
        };
        let mut out = Vec::new();
        for (b, backend) in refs.iter().enumerate() {
            let at = format!("{field}.backendRefs[{b}]");
            if get(backend, &["filters"]).is_some() {
                return Err(format!("{at}.filters: filters per backend"));
            }
            let group = get(backend, &["group"])
                .and_then(Value::as_str)
                .unwrap_or("");
            let kind = get(backend, &["kind"])
                .and_then(Value::as_str)
                .unwrap_or("Service");
            if !group.is_empty() || kind != "Service" {
                return Err(format!("{at}: a backend of kind {kind} is not a Service"));
            }
            let name = get(backend, &["name"])
                .and_then(Value::as_str)
                .unwrap_or_default();
            let namespace = get(backend, &["namespace"])
                .and_then(Value::as_str)
                .unwrap_or(&route.namespace);
            if namespace != route.namespace && !self.granted(route, namespace, name) {
                return Err(format!("{at}: Service {namespace}/{name} is in another namespace, and no ReferenceGrant there allows it"));
            }
            let port = get(backend, &["port"])
                .and_then(Value::as_u64)
                .and_then(|p| u16::try_from(p).ok())
                .ok_or_else(|| format!("{at}: a Service backend needs its port"))?;
            let port = self
                .services
                .port(namespace, name, PortRef::Number(port))
                .map_err(|e| format!("{at}: {e}"))?;
            let weight = get(backend, &["weight"])
                .and_then(Value::as_u64)
                .unwrap_or(1);
            if weight == 0 {
                continue;
            }
            out.push(Upstream {
                host: service_upstream(name, namespace),
                port,
                weight: u32::try_from(weight).unwrap_or(u32::MAX),
            });
        }
        if out.is_empty() {
            return Err("every backend has weight 0 (requests get 500)".into());
        }
        // The contract's weights are 1 to 255: the same shares, divided by their greatest
        // common divisor; shares that cannot be written so are not carried.
        let gcd = out.iter().fold(0, |g, u| gcd(g, u.weight));
        for u in &mut out {
            u.weight /= gcd.max(1);
        }
        if out.iter().any(|u| u.weight > 255) {
            return Err(
                "weights whose shares need more than 255 (the contract's largest weight)".into(),
            );
        }
        Ok(out)
    }

    /// Does a ReferenceGrant in `namespace` let `route`'s kind in its namespace name Service `name`?
    fn granted(&self, route: &Object, namespace: &str, name: &str) -> bool {
        self.grants
            .iter()
            .filter(|g| g.namespace == namespace)
            .any(|g| {
                let from_ok = match get(&g.value, &["spec", "from"]) {
                    Some(Value::Sequence(from)) => from.iter().any(|f| {
                        get(f, &["group"]).and_then(Value::as_str) == Some(GROUP)
                            && get(f, &["kind"]).and_then(Value::as_str) == Some(&route.kind)
                            && get(f, &["namespace"]).and_then(Value::as_str)
                                == Some(&route.namespace)
                    }),
                    _ => false,
                };
                let to_ok = match get(&g.value, &["spec", "to"]) {
                    Some(Value::Sequence(to)) => to.iter().any(|t| {
                        get(t, &["group"])
                            .and_then(Value::as_str)
                            .unwrap_or("")
                            .is_empty()
                            && get(t, &["kind"]).and_then(Value::as_str) == Some("Service")
                            && get(t, &["name"])
                                .and_then(Value::as_str)
                                .is_none_or(|n| n == name)
                    }),
                    _ => false,
                };
                from_ok && to_ok
            })
    }
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// The hosts a route gets on a listener: its hostnames as the listener's narrows them
/// (Gateway API's intersection), or `--host` when neither names one.
fn hosts(route: &[String], listener: Option<&str>, default: Option<&str>) -> Carry<Vec<String>> {
    let matches_wildcard = |name: &str, wildcard: &str| {
        wildcard
            .strip_prefix('*')
            .is_some_and(|suffix| name.ends_with(suffix) && name.len() > suffix.len())
    };
    match (route.is_empty(), listener) {
        (true, None) => match default {
            Some(host) => Ok(vec![host.to_owned()]),
            None => Err("neither the route nor the listener names a host: give --host".into()),
        },
        (true, Some(l)) => Ok(vec![l.to_owned()]),
        (false, None) => Ok(route.to_vec()),
        (false, Some(l)) => Ok(route
            .iter()
            .filter_map(|r| {
                if r == l || (l.starts_with("*.") && !r.starts_with("*.") && matches_wildcard(r, l))
                {
                    Some(r.clone())
                } else if r.starts_with("*.") && !l.starts_with("*.") && matches_wildcard(l, r) {
                    Some(l.to_owned())
                } else if r.starts_with("*.") && l.starts_with("*.") {
                    // The narrower wildcard: a workspace host cannot be one, and says so.
                    if matches_wildcard(&r[1..], l) || r == l {
                        Some(r.clone())
                    } else if matches_wildcard(&l[1..], r) {
                        Some(l.to_owned())
                    } else {
                        None
                    }
                } else {
                    None
                }
            })
            .collect()),
    }
}

/// A GRPCRoute's method match as a path: `/service/method`.
fn grpc_path(method: Option<&Value>) -> Carry<PathMatch> {
    let Some(method) = method else {
        return Ok(PathMatch::root());
    };
    let service = get(method, &["service"]).and_then(Value::as_str);
    let name = get(method, &["method"]).and_then(Value::as_str);
    match (
        get(method, &["type"])
            .and_then(Value::as_str)
            .unwrap_or("Exact"),
        service,
        name,
    ) {
        ("Exact", Some(s), Some(m)) => Ok(PathMatch::Exact(format!("/{s}/{m}"))),
        ("Exact", Some(s), None) => Ok(PathMatch::Prefix(format!("/{s}/"))),
        ("Exact", None, Some(m)) => Ok(PathMatch::Regex(format!("/[^/]+/{}", regex::escape(m)))),
        ("Exact", None, None) => Ok(PathMatch::root()),
        ("RegularExpression", s, m) => {
            let s = s.unwrap_or("[^/]+");
            let m = m.unwrap_or("[^/]+");
            let re = format!("/{s}/{m}");
            regex::Regex::new(&re).map_err(|e| format!("the method match: {e}"))?;
            Ok(PathMatch::Regex(re))
        }
        (other, _, _) => Err(format!("a gRPC method match of type {other}")),
    }
}
