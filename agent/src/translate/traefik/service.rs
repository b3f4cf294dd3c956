//! Traefik services as a route's upstreams: `loadBalancer` (servers, `weight` with 0 as a
//! drain, `passHostHeader`, `healthCheck`, `sticky.cookie` and `strategy`), `weighted` over load
//! balancers, and the TCP and UDP load balancers. Pure.

use serde_json::{json, Map, Value};

use super::fields::{duration_seconds, Fields};

/// A route's upstreams and health check, as contract fields.
#[derive(Debug, Clone, PartialEq)]
pub struct Upstreams {
    /// `upstream` + `port`, or `upstreams`.
    pub fields: Map<String, Value>,
    /// `upstream_protocol = 'h2c` (an `h2c://` server).
    pub h2c: bool,
}

/// A server as the workspace writes it.
#[derive(Debug, Clone, PartialEq)]
struct Server {
    upstream: String,
    port: Option<u16>,
    weight: u64,
    drain: bool,
}

/// Why a service is not carried.
pub type Refusal = String;

/// Reads one load balancer's servers (each with whether it speaks h2c).
type ReadServers<'f> = dyn FnMut(&Fields, &str) -> Result<Vec<(Server, bool)>, Refusal> + 'f;

/// The services of one section (`http`, `tcp` or `udp`), by name.
pub struct Services<'s, 'v> {
    pub section: &'s str,
    pub get: &'s dyn Fn(&str) -> Option<&'v Value>,
}

impl Services<'_, '_> {
    /// The upstreams of the service `name` (an HTTP service).
    pub fn http(&self, name: &str) -> Result<Upstreams, Refusal> {
        // Every load balancer of a `weighted` tree becomes one cluster: they must agree on how
        // it balances.
        let mut balancing: Option<Balancing> = None;
        let servers = self.servers(name, 1, 0, &mut |lb, name| {
            let this = http_balancing(lb, name)?;
            match &balancing {
                Some(before) if *before != this => Err(format!(
                    "service `{name}`: the weighted services disagree on `sticky` or `strategy` (one route is one sozu cluster, balanced one way)"
                )),
                _ => {
                    balancing = Some(this);
                    http_servers(lb, name)
                }
            }
        })?;
        let h2c = servers.iter().any(|(_, h2c)| *h2c);
        if h2c && servers.iter().any(|(_, h2c)| !*h2c) {
            return Err(format!(
                "service `{name}` mixes `h2c://` and `http://` servers: a route's backends speak one protocol"
            ));
        }
        let health = self.health(name)?;
        let mut fields = upstream_fields(servers.into_iter().map(|(s, _)| s).collect())?;
        if let Some(health) = health {
            fields.insert("health".into(), health);
        }
        let balancing = balancing.unwrap_or_default();
        if balancing.sticky {
            fields.insert("sticky".into(), json!(true));
        }
        if let Some(algorithm) = balancing.algorithm {
            fields.insert("balancing".into(), json!(algorithm));
        }
        Ok(Upstreams { fields, h2c })
    }

    /// The upstreams of the TCP or UDP service `name`, and whether its servers want a PROXY
    /// protocol v2 header.
    pub fn stream(&self, name: &str) -> Result<(Map<String, Value>, bool), Refusal> {
        let mut proxy = None;
        let servers = self.servers(name, 1, 0, &mut |lb, name| {
            let (servers, p) = stream_servers(lb, name)?;
            match proxy {
                Some(before) if before != p => Err(format!(
                    "service `{name}`: the weighted services disagree on `proxyProtocol`"
                )),
                _ => {
                    proxy = Some(p);
                    Ok(servers.into_iter().map(|s| (s, false)).collect())
                }
            }
        })?;
        let fields = upstream_fields(servers.into_iter().map(|(s, _)| s).collect())?;
        Ok((fields, proxy.unwrap_or(false)))
    }

    /// The servers of `name`, each weight multiplied by `factor` (a `weighted` parent's).
    fn servers(
        &self,
        name: &str,
        factor: u64,
        depth: usize,
        lb: &mut ReadServers<'_>,
    ) -> Result<Vec<(Server, bool)>, Refusal> {
        if depth > 8 {
            return Err(format!(
                "service `{name}`: `weighted` services nest too deeply"
            ));
        }
        let name = local_name(name, self.section)?;
        let service = (self.get)(name).ok_or_else(|| {
            format!(
                "service `{name}` is not declared (in the {} section)",
                self.section
            )
        })?;
        let service = Fields::new(service, &format!("service `{name}`"))?;
        let kinds = service.keys();
        match kinds.as_slice() {
            ["loadBalancer"] => {
                let lb_fields = Fields::new(service.get("loadBalancer").unwrap_or(&Value::Null), &format!("service `{name}` loadBalancer"))?;
                let mut servers = lb(&lb_fields, name)?;
                for (s, _) in &mut servers {
                    s.weight = s.weight.saturating_mul(factor);
                    if factor == 0 {
                        s.drain = true;
                    }
                }
                Ok(servers)
            }
            ["weighted"] => {
                let weighted = Fields::new(service.get("weighted").unwrap_or(&Value::Null), &format!("service `{name}` weighted"))?;
                weighted.only(&["services", "healthCheck"])?;
                if weighted.get("sticky").is_some() {
                    return Err(format!("service `{name}`: `weighted.sticky` is not carried"));
                }
                let children = weighted
                    .list("services")?
                    .ok_or_else(|| format!("service `{name}`: `weighted` names no services"))?;
                let mut out = Vec::new();
                for child in children {
                    let child = Fields::new(child, &format!("service `{name}` weighted.services"))?;
                    child.only(&["name", "weight"])?;
                    let child_name = child
                        .string("name")?
                        .ok_or_else(|| format!("service `{name}`: a weighted service has no `name`"))?;
                    let weight = child.whole("weight")?.unwrap_or(1);
                    out.extend(self.servers(&child_name, factor.saturating_mul(weight), depth + 1, lb)?);
                }
                Ok(out)
            }
            [] => Err(format!("service `{name}` is empty")),
            [one] => Err(format!(
                "service `{name}` is a `{one}` service, which is not carried (only `loadBalancer` and `weighted`)"
            )),
            _ => Err(format!("service `{name}` declares more than one kind of service")),
        }
    }

    /// The health check of an HTTP service (a `weighted` one's from its first child).
    fn health(&self, name: &str) -> Result<Option<Value>, Refusal> {
        let name = local_name(name, self.section)?;
        let Some(service) = (self.get)(name) else {
            return Ok(None);
        };
        let Some(lb) = service.get("loadBalancer") else {
            // A `weighted` service's children are read for their servers; a health check of
            // theirs is not carried, and is said rather than dropped.
            if let Some(children) = service
                .get("weighted")
                .and_then(|w| w.get("services"))
                .and_then(Value::as_array)
            {
                for child in children.iter().filter_map(|c| c.get("name")?.as_str()) {
                    let child = local_name(child, self.section)?;
                    let checked = (self.get)(child)
                        .and_then(|c| c.get("loadBalancer"))
                        .is_some_and(|lb| lb.get("healthCheck").is_some());
                    if checked {
                        return Err(format!(
                            "service `{name}`: the health check of its weighted service `{child}` is not carried (a route has one health check)"
                        ));
                    }
                }
            }
            return Ok(None);
        };
        let Some(check) = lb.get("healthCheck") else {
            return Ok(None);
        };
        let check = Fields::new(check, &format!("service `{name}` healthCheck"))?;
        check.only(&[
            "path",
            "interval",
            "timeout",
            "port",
            "status",
            "scheme",
            "mode",
            "unhealthyInterval",
        ])?;
        if let Some(scheme) = check.string("scheme")? {
            if scheme != "http" {
                return Err(format!(
                    "service `{name}`: a health check over `{scheme}` is not carried (sozu probes in clear text)"
                ));
            }
        }
        if let Some(mode) = check.string("mode")? {
            if mode != "http" {
                return Err(format!(
                    "service `{name}`: a `{mode}` health check is not carried (sozu probes with an HTTP GET)"
                ));
            }
        }
        let mut health = Map::new();
        let path = check.string("path")?.unwrap_or_else(|| "/".into());
        if !path.starts_with('/') || path.chars().any(char::is_whitespace) {
            return Err(format!(
                "service `{name}`: health check path `{path}` is not an absolute path"
            ));
        }
        health.insert("path".into(), json!(path));
        // Traefik's defaults: every 30 s, a 5 s timeout. Whole seconds: sozu's own unit.
        let interval = match check.get("interval") {
            Some(v) => duration_seconds(v)
                .map_err(|e| format!("service `{name}` healthCheck.interval: {e}"))?,
            None => 30,
        };
        let timeout = match check.get("timeout") {
            Some(v) => duration_seconds(v)
                .map_err(|e| format!("service `{name}` healthCheck.timeout: {e}"))?,
            None => 5,
        };
        if !(1..=3600).contains(&interval) || !(1..=3600).contains(&timeout) {
            return Err(format!(
                "service `{name}`: health check interval and timeout must be from 1 s to an hour"
            ));
        }
        health.insert("interval".into(), json!(interval));
        health.insert("timeout".into(), json!(timeout.min(interval)));
        if let Some(port) = check.whole("port")? {
            let port = u16::try_from(port).ok().filter(|p| *p > 0).ok_or_else(|| {
                format!("service `{name}`: health check port {port} is out of range")
            })?;
            health.insert("port".into(), json!(port));
        }
        if let Some(status) = check.whole("status")? {
            if !(100..=599).contains(&status) {
                return Err(format!(
                    "service `{name}`: health check status {status} is not an HTTP status"
                ));
            }
            health.insert("accepted_statuses".into(), json!([status]));
        }
        Ok(Some(Value::Object(health)))
    }
}

/// `name` or `name@file` / `name@http`: a name of the provider the configuration comes from.
/// Another provider's names (`@docker`, `@internal`) are not in this configuration.
pub fn local_name<'a>(name: &'a str, what: &str) -> Result<&'a str, Refusal> {
    match name.split_once('@') {
        None => Ok(name),
        Some((name, "file" | "http")) => Ok(name),
        Some((_, provider)) => Err(format!(
            "`{name}` names a {what} of the `{provider}` provider, which this configuration does not hold"
        )),
    }
}

/// How a load balancer picks its server, in the contract's terms.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Balancing {
    /// `sticky.cookie`: the route's `sticky = true`.
    sticky: bool,
    /// The route's `balancing`; `None` for Traefik's default, `wrr` (sozu's round robin).
    algorithm: Option<&'static str>,
}

/// The name sozu 2.3.3 gives its sticky cookie, on every listener the agent makes
/// (`DEFAULT_STICKY_NAME`, command/src/config.rs).
pub const SOZU_STICKY_COOKIE: &str = "SOZUBALANCEID";

/// A load balancer's `sticky` and `strategy`. sozu's sticky cookie is one name per listener,
/// written `SOZUBALANCEID=<backend>; Path=/` (`HttpContext::on_response_headers`,
/// lib/src/protocol/kawa_h1/editor.rs): a cookie named otherwise, or asked for with attributes
/// sozu does not write (`secure`, `httpOnly`, `sameSite`, `maxAge`, `domain`, a path other than
/// `/`), is refused rather than served with a cookie the configuration did not ask for.
fn http_balancing(lb: &Fields, name: &str) -> Result<Balancing, Refusal> {
    let mut balancing = Balancing::default();
    if let Some(sticky) = lb.get("sticky") {
        let sticky = Fields::new(sticky, &format!("service `{name}` sticky"))?;
        sticky.only(&["cookie"])?;
        let cookie = sticky.get("cookie").ok_or_else(|| {
            format!("service `{name}`: `sticky` names no `cookie` (the one kind of stickiness Traefik has)")
        })?;
        let cookie = Fields::new(cookie, &format!("service `{name}` sticky.cookie"))?;
        cookie.only(&[
            "name", "secure", "httpOnly", "sameSite", "maxAge", "path", "domain",
        ])?;
        if let Some(cookie_name) = cookie.string("name")? {
            if cookie_name != SOZU_STICKY_COOKIE {
                return Err(format!(
                    "service `{name}`: sticky cookie `{cookie_name}` is not carried: sozu names its sticky cookie `{SOZU_STICKY_COOKIE}`, once per listener (leave `name` out, or write `{SOZU_STICKY_COOKIE}`)"
                ));
            }
        }
        for flag in ["secure", "httpOnly"] {
            if cookie.boolean(flag)? == Some(true) {
                return Err(format!(
                    "service `{name}`: sticky cookie `{flag}: true` is not carried: sozu writes its cookie with `Path=/` alone"
                ));
            }
        }
        for attribute in ["sameSite", "domain"] {
            if cookie.string(attribute)?.is_some_and(|v| !v.is_empty()) {
                return Err(format!(
                    "service `{name}`: sticky cookie `{attribute}` is not carried: sozu writes its cookie with `Path=/` alone"
                ));
            }
        }
        if cookie.get("maxAge").is_some_and(|v| v.as_i64() != Some(0)) {
            return Err(format!(
                "service `{name}`: sticky cookie `maxAge` is not carried: sozu's cookie lasts the browser's session"
            ));
        }
        if let Some(path) = cookie.string("path")? {
            if path != "/" {
                return Err(format!(
                    "service `{name}`: sticky cookie path `{path}` is not carried: sozu writes `Path=/`"
                ));
            }
        }
        balancing.sticky = true;
    }
    balancing.algorithm = match lb.string("strategy")?.as_deref() {
        None | Some("wrr") => None,
        Some("p2c") => Some("power_of_two"),
        Some("hrw") => Some("hrw"),
        // Fewest connections: sozu weighs no response time (its `LEAST_LOADED` counts
        // connections), the nearest it has to Traefik's.
        Some("leasttime") => Some("least_loaded"),
        Some(other) => {
            return Err(format!(
                "service `{name}`: strategy `{other}` is not carried (Traefik's are wrr, p2c, hrw and leasttime)"
            ))
        }
    };
    Ok(balancing)
}

fn http_servers(lb: &Fields, name: &str) -> Result<Vec<(Server, bool)>, Refusal> {
    lb.only(&[
        "servers",
        "passHostHeader",
        "healthCheck",
        "sticky",
        "serversTransport",
        "responseForwarding",
        "strategy",
    ])?;
    if lb.get("serversTransport").is_some() {
        return Err(format!(
            "service `{name}`: `serversTransport` is not carried"
        ));
    }
    if lb.get("responseForwarding").is_some() {
        return Err(format!(
            "service `{name}`: `responseForwarding` is not carried"
        ));
    }
    if lb.boolean("passHostHeader")? == Some(false) {
        return Err(format!(
            "service `{name}`: `passHostHeader: false` is not carried (sozu sends the backend the request's own `Host`)"
        ));
    }
    let servers = lb
        .list("servers")?
        .ok_or_else(|| format!("service `{name}` has no servers"))?;
    let mut out = Vec::new();
    for server in servers {
        let server = Fields::new(server, &format!("service `{name}` server"))?;
        server.only(&["url", "weight", "preservePath"])?;
        let url = server
            .string("url")?
            .ok_or_else(|| format!("service `{name}`: a server has no `url`"))?;
        let weight = server.whole("weight")?.unwrap_or(1);
        let (upstream, port, h2c) =
            parse_url(&url).map_err(|e| format!("service `{name}`: {e}"))?;
        out.push((
            Server {
                upstream,
                port,
                weight,
                drain: weight == 0,
            },
            h2c,
        ));
    }
    Ok(out)
}

fn stream_servers(lb: &Fields, name: &str) -> Result<(Vec<Server>, bool), Refusal> {
    lb.only(&[
        "servers",
        "proxyProtocol",
        "serversTransport",
        "terminationDelay",
    ])?;
    if lb.get("serversTransport").is_some() {
        return Err(format!(
            "service `{name}`: `serversTransport` is not carried"
        ));
    }
    let proxy = match lb.get("proxyProtocol") {
        None => false,
        Some(p) => {
            let p = Fields::new(p, &format!("service `{name}` proxyProtocol"))?;
            p.only(&["version"])?;
            match p.whole("version")?.unwrap_or(2) {
                2 => true,
                v => {
                    return Err(format!(
                        "service `{name}`: PROXY protocol version {v} is not carried (sozu sends version 2)"
                    ))
                }
            }
        }
    };
    let servers = lb
        .list("servers")?
        .ok_or_else(|| format!("service `{name}` has no servers"))?;
    let mut out = Vec::new();
    for server in servers {
        let server = Fields::new(server, &format!("service `{name}` server"))?;
        server.only(&["address", "weight", "tls"])?;
        if server.boolean("tls")? == Some(true) {
            return Err(format!(
                "service `{name}`: a server dialled over TLS is not carried"
            ));
        }
        let address = server
            .string("address")?
            .ok_or_else(|| format!("service `{name}`: a server has no `address`"))?;
        let weight = server.whole("weight")?.unwrap_or(1);
        let (upstream, port) = host_port(&address, None)
            .map_err(|e| format!("service `{name}`: address `{address}`: {e}"))?;
        out.push(Server {
            upstream,
            port: Some(port),
            weight,
            drain: weight == 0,
        });
    }
    Ok((out, proxy))
}

/// `http://host:port`, `h2c://host:port` or `unix:///path`: the upstream, its port (none for a
/// socket) and whether it speaks h2c.
fn parse_url(url: &str) -> Result<(String, Option<u16>, bool), String> {
    if let Some(path) = url.strip_prefix("unix://") {
        if !path.starts_with('/')
            || path.ends_with('/')
            || path.chars().any(|c| c.is_whitespace() || c.is_control())
        {
            return Err(format!(
                "`{url}` is not a unix socket address (`unix:///absolute/path`)"
            ));
        }
        return Ok((url.to_owned(), None, false));
    }
    let (rest, h2c) = if let Some(rest) = url.strip_prefix("http://") {
        (rest, false)
    } else if let Some(rest) = url.strip_prefix("h2c://") {
        (rest, true)
    } else if url.starts_with("https://") {
        return Err(format!(
            "`{url}` is dialled over TLS, which is not carried (sozu speaks clear text to its backends)"
        ));
    } else {
        return Err(format!(
            "`{url}` is not an `http://`, `h2c://` or `unix://` URL"
        ));
    };
    let authority = match rest.find(['/', '?', '#']) {
        Some(at) => {
            if rest[at..] != *"/" {
                return Err(format!(
                    "`{url}` has a path, which is not carried (sozu sends the request's own path)"
                ));
            }
            &rest[..at]
        }
        None => rest,
    };
    if authority.contains('@') {
        return Err(format!(
            "`{url}` carries credentials, which are not carried"
        ));
    }
    let (host, port) = host_port(authority, Some(80))?;
    Ok((host, Some(port), h2c))
}

/// `host:port`, `[v6]:port`, or a host alone with `default`.
fn host_port(authority: &str, default: Option<u16>) -> Result<(String, u16), String> {
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let (v6, after) = rest
            .split_once(']')
            .ok_or_else(|| format!("`{authority}` has an unclosed `[`"))?;
        (v6.to_owned(), after.strip_prefix(':'))
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h.to_owned(), Some(p)),
            None => (authority.to_owned(), None),
        }
    };
    let port = match port {
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| format!("port `{p}` is not a port from 1 to 65535"))?,
        None => default.ok_or_else(|| "no port".to_owned())?,
    };
    let host = host.to_ascii_lowercase();
    if host.is_empty() {
        return Err("no host".into());
    }
    if host.parse::<std::net::IpAddr>().is_err() && !super::is_dns_name(&host) {
        return Err(format!("`{host}` is not a host name or an IP address"));
    }
    Ok((host, port))
}

/// The contract's `upstream` + `port` for one server of weight 1, `upstreams` otherwise. Weights
/// are brought into sozu's 1 to 255 keeping their ratios as nearly as whole numbers allow.
fn upstream_fields(servers: Vec<Server>) -> Result<Map<String, Value>, Refusal> {
    let mut fields = Map::new();
    if servers.is_empty() {
        return Err("the service has no servers".into());
    }
    let mut seen = std::collections::HashSet::new();
    for s in &servers {
        if !seen.insert((s.upstream.clone(), s.port)) {
            return Err(format!(
                "server `{}` is listed twice (a route names each upstream once; raise its weight)",
                shown(s)
            ));
        }
    }
    if servers.iter().filter(|s| s.port.is_none()).count() > 1 {
        return Err(
            "more than one `unix://` server: a route has at most one unix socket upstream".into(),
        );
    }
    let max = servers
        .iter()
        .filter(|s| !s.drain)
        .map(|s| s.weight)
        .max()
        .unwrap_or(1)
        .max(1);
    let scale = |w: u64| -> u64 {
        if max <= 255 {
            w.max(1)
        } else {
            ((w as u128 * 255).div_ceil(max as u128) as u64).clamp(1, 255)
        }
    };
    if let [one] = servers.as_slice() {
        if !one.drain {
            fields.insert("upstream".into(), json!(one.upstream));
            if let Some(port) = one.port {
                fields.insert("port".into(), json!(port));
            }
            return Ok(fields);
        }
    }
    let list: Vec<Value> = servers
        .iter()
        .map(|s| {
            let mut u = Map::new();
            u.insert("upstream".into(), json!(s.upstream));
            if let Some(port) = s.port {
                u.insert("port".into(), json!(port));
            }
            if s.drain {
                u.insert("drain".into(), json!(true));
            } else if scale(s.weight) != 1 {
                u.insert("weight".into(), json!(scale(s.weight)));
            }
            Value::Object(u)
        })
        .collect();
    fields.insert("upstreams".into(), Value::Array(list));
    Ok(fields)
}

fn shown(s: &Server) -> String {
    match s.port {
        Some(p) => format!("{}:{p}", s.upstream),
        None => s.upstream.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn services<'v>(v: &'v Value) -> impl Fn(&str) -> Option<&'v Value> + 'v {
        move |name| v.get(name)
    }

    #[test]
    fn orca_drain_is_every_server_drained() {
        let v = json!({"web": {"loadBalancer": {"servers": [{"url": "unix:///run/orca/a.sock", "weight": 0}]}}});
        let get = services(&v);
        let s = Services {
            section: "http",
            get: &get,
        };
        let up = s.http("web").unwrap();
        assert_eq!(
            Value::Object(up.fields),
            json!({"upstreams": [{"upstream": "unix:///run/orca/a.sock", "drain": true}]})
        );
    }

    #[test]
    fn weighted_services_multiply_and_scale_into_sozus_range() {
        let v = json!({
            "w": {"weighted": {"services": [{"name": "a", "weight": 3}, {"name": "b@file", "weight": 1000}]}},
            "a": {"loadBalancer": {"servers": [{"url": "http://10.0.0.1:8080"}]}},
            "b": {"loadBalancer": {"servers": [{"url": "http://b.ns:81/"}], "healthCheck": {"path": "/h", "interval": "5s", "timeout": "1s"}}}
        });
        let get = services(&v);
        let s = Services {
            section: "http",
            get: &get,
        };
        let e = s.http("w").unwrap_err();
        assert!(e.contains("weighted service `b`"), "{e}");
        let without_health = json!({
            "w": v["w"].clone(),
            "a": v["a"].clone(),
            "b": {"loadBalancer": {"servers": [{"url": "http://b.ns:81/"}]}},
        });
        let get_plain = services(&without_health);
        let plain = Services {
            section: "http",
            get: &get_plain,
        };
        let up = plain.http("w").unwrap();
        assert_eq!(
            Value::Object(up.fields),
            json!({"upstreams": [{"upstream": "10.0.0.1", "port": 8080}, {"upstream": "b.ns", "port": 81, "weight": 255}]})
        );
        let up = s.http("b").unwrap();
        assert_eq!(
            up.fields["health"],
            json!({"path": "/h", "interval": 5, "timeout": 1})
        );
    }

    #[test]
    fn what_cannot_be_carried_is_refused() {
        let v = json!({
            "tls": {"loadBalancer": {"servers": [{"url": "https://a:443"}]}},
            "host": {"loadBalancer": {"servers": [{"url": "http://a:80"}], "passHostHeader": false}},
            "sticky": {"loadBalancer": {"servers": [{"url": "http://a:80"}], "sticky": {"cookie": {"name": "lb"}}}},
            "secure": {"loadBalancer": {"servers": [{"url": "http://a:80"}], "sticky": {"cookie": {"secure": true}}}},
            "age": {"loadBalancer": {"servers": [{"url": "http://a:80"}], "sticky": {"cookie": {"maxAge": 60}}}},
            "strategy": {"loadBalancer": {"servers": [{"url": "http://a:80"}], "strategy": "fastest"}},
            "mixed": {"weighted": {"services": [{"name": "sticky-ok"}, {"name": "plain"}]}},
            "sticky-ok": {"loadBalancer": {"servers": [{"url": "http://a:80"}], "sticky": {"cookie": {}}}},
            "plain": {"loadBalancer": {"servers": [{"url": "http://b:80"}]}},
            "mirror": {"mirroring": {"service": "a"}},
            "odd": {"loadBalancer": {"servers": [{"url": "http://a:80"}], "surprise": 1}},
            "other": {"weighted": {"services": [{"name": "x@docker"}]}},
        });
        let get = services(&v);
        let s = Services {
            section: "http",
            get: &get,
        };
        for (name, says) in [
            ("tls", "over TLS"),
            ("host", "passHostHeader"),
            ("sticky", "sticky cookie `lb`"),
            ("secure", "`secure: true`"),
            ("age", "maxAge"),
            ("strategy", "strategy `fastest`"),
            ("mixed", "disagree on `sticky`"),
            ("mirror", "mirroring"),
            ("odd", "surprise"),
            ("other", "docker"),
            ("missing", "not declared"),
        ] {
            let e = s.http(name).unwrap_err();
            assert!(e.contains(says), "{name}: {e}");
        }
    }

    /// `sticky.cookie` without a name (or with sozu's) and each `strategy` Traefik 3.7 has
    /// become the route's `sticky` and `balancing`.
    #[test]
    fn sticky_cookies_and_strategies_are_carried() {
        let v = json!({
            "sticky": {"loadBalancer": {"servers": [{"url": "http://a:80"}], "sticky": {"cookie": {}}}},
            "named": {"loadBalancer": {"servers": [{"url": "http://a:80"}],
                "sticky": {"cookie": {"name": "SOZUBALANCEID", "path": "/", "httpOnly": false}}, "strategy": "p2c"}},
            "wrr": {"loadBalancer": {"servers": [{"url": "http://a:80"}], "strategy": "wrr"}},
            "hrw": {"loadBalancer": {"servers": [{"url": "http://a:80"}], "strategy": "hrw"}},
            "leasttime": {"loadBalancer": {"servers": [{"url": "http://a:80"}], "strategy": "leasttime"}},
            "both": {"weighted": {"services": [{"name": "sticky"}, {"name": "sticky2"}]}},
            "sticky2": {"loadBalancer": {"servers": [{"url": "http://b:80"}], "sticky": {"cookie": {}}}},
        });
        let get = services(&v);
        let s = Services {
            section: "http",
            get: &get,
        };
        let carried = |name: &str| {
            let f = s.http(name).unwrap().fields;
            (f.get("sticky").cloned(), f.get("balancing").cloned())
        };
        assert_eq!(carried("sticky"), (Some(json!(true)), None));
        assert_eq!(
            carried("named"),
            (Some(json!(true)), Some(json!("power_of_two")))
        );
        assert_eq!(carried("wrr"), (None, None));
        assert_eq!(carried("hrw"), (None, Some(json!("hrw"))));
        assert_eq!(carried("leasttime"), (None, Some(json!("least_loaded"))));
        assert_eq!(carried("both"), (Some(json!(true)), None));
    }
}
