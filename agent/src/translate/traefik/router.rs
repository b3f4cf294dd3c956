//! One router into routes: its entry points, its rule's frontends, its service's upstreams and
//! health check, its middlewares as the route's policy; or the reason it is refused.

use super::*;

pub(super) enum Outcome {
    Routes(Vec<Map<String, Value>>),
    Covered(String),
}

pub(super) struct Context<'s, 'v> {
    pub(super) options: &'s Options,
    pub(super) services: service::Services<'s, 'v>,
    pub(super) middlewares: &'s dyn Fn(&str) -> Option<&'v Value>,
}

impl Context<'_, '_> {
    /// The entry points a router is on: its own, or every one the workspace maps.
    fn entry_points(&self, router: &Fields) -> Result<Vec<EntryPoint>, String> {
        match router.strings("entryPoints")? {
            None => Ok(self.options.entry_points.values().copied().collect()),
            Some(names) => names
                .iter()
                .map(|n| {
                    self.options.entry_points.get(n).copied().ok_or_else(|| {
                        format!(
                            "entry point `{n}` is not one the workspace maps (`traefik.entry_points`: {})",
                            self.options
                                .entry_points
                                .keys()
                                .map(String::as_str)
                                .collect::<Vec<_>>()
                                .join(", ")
                        )
                    })
                })
                .collect(),
        }
    }

    fn host_in_zone(&self, host: &str) -> Result<(), String> {
        if host.starts_with("*.") {
            return Err(format!(
                "`{host}` is a wildcard: a workspace route names one host"
            ));
        }
        if !is_dns_name(host) {
            return Err(format!(
                "`{host}` is not a DNS name a workspace route takes"
            ));
        }
        let zone = &self.options.zone;
        if host != zone && !host.ends_with(&format!(".{zone}")) {
            return Err(format!("host `{host}` is outside the zone `{zone}`"));
        }
        Ok(())
    }

    pub(super) fn http(&self, name: &str, value: &Value) -> Result<Outcome, String> {
        let router = Fields::new(value, &format!("router `{name}`"))?;
        router.only(&[
            "rule",
            "service",
            "entryPoints",
            "middlewares",
            "priority",
            "tls",
            "ruleSyntax",
            "observability",
        ])?;
        if let Some(syntax) = router.string("ruleSyntax")? {
            if syntax != "v3" {
                return Err(format!(
                    "`ruleSyntax: {syntax}` is not carried (the v3 syntax is read)"
                ));
            }
        }
        let rule = router.string("rule")?.ok_or("the router has no `rule`")?;
        let alternatives = rule::http(&rule).map_err(|e| format!("rule `{rule}`: {e}"))?;
        let priority = match router.integer("priority")? {
            Some(p) if p != 0 => p,
            _ => rule.len() as i64,
        };
        let mut entry_points = self.entry_points(&router)?;
        if router.get("entryPoints").is_none() {
            // On every entry point, as Traefik puts a router that names none: the listeners.
            entry_points.retain(|e| !matches!(e, EntryPoint::Port(_)));
        }
        let middlewares = router.strings("middlewares")?.unwrap_or_default();
        let policy = middleware::policy(&middlewares, self.middlewares)?;
        let tls = match router.get("tls") {
            None => None,
            Some(v) => Some(Fields::new(v, &format!("router `{name}` tls"))?),
        };
        let https = entry_points.contains(&EntryPoint::Https);
        let http = entry_points.contains(&EntryPoint::Http);
        if entry_points
            .iter()
            .any(|e| matches!(e, EntryPoint::Port(_)))
        {
            return Err(
                "an HTTP router on an entry point the workspace maps to a TCP port is not carried"
                    .into(),
            );
        }
        let Some(tls) = tls else {
            if http && !https && policy.to_https && policy.path_edit.is_none() {
                return Ok(Outcome::Covered(
                    "an HTTP router that redirects to HTTPS: the workspace's HTTP listener answers every 'https route's requests so".into(),
                ));
            }
            return Err(if https {
                "a router on the HTTPS entry point without `tls` serves plain HTTP there, which is not carried".into()
            } else {
                "a router without `tls` serves plain HTTP, which is not carried: the workspace's HTTP listener only redirects to HTTPS (add `tls: {}` to serve it over HTTPS)".into()
            });
        };
        if !https {
            return Err("a router with `tls` on no HTTPS entry point is not carried".into());
        }
        tls.only(&["certResolver", "domains", "options", "passthrough"])?;
        if let Some(options) = tls.string("options")? {
            if options != "default" && options != "default@file" {
                return Err(format!("`tls.options: {options}` is not carried (the workspace's listener sets TLS versions for every route)"));
            }
        }
        let domain = match tls.list("domains")? {
            None => None,
            Some(domains) => domains
                .first()
                .and_then(|d| get_ci(d, "main"))
                .and_then(Value::as_str)
                .map(str::to_ascii_lowercase),
        };
        let upstreams = if policy.redirect.is_some() {
            None
        } else {
            let service = router
                .string("service")?
                .ok_or("the router has no `service`")?;
            Some(self.services.http(&service)?)
        };
        let mut routes = Vec::new();
        for alt in alternatives {
            let host = alt.host.clone().or_else(|| domain.clone()).ok_or(
                "the rule names no `Host` and `tls.domains` none: a workspace route names its host",
            )?;
            self.host_in_zone(&host)?;
            let mut route = Map::new();
            route.insert("host".into(), json!(host));
            let path = alt.path.clone();
            match &path {
                None => {}
                Some(PathRule::Prefix(p)) => {
                    path_text(p)?;
                    if p != "/" {
                        route.insert("path_prefix".into(), json!(p));
                    }
                }
                Some(PathRule::Exact(p)) => {
                    path_text(p)?;
                    route.insert("path_exact".into(), json!(p));
                }
                Some(PathRule::Regex(re)) => {
                    route.insert("path_regex".into(), json!(rule::unanchored(re)));
                }
            }
            if let Some(method) = &alt.method {
                route.insert("method".into(), json!(method));
            }
            if !alt.headers.is_empty() {
                let list: Vec<Value> = alt
                    .headers
                    .iter()
                    .map(|h| match h {
                        HeaderRule::Exact(n, v) => json!({ "name": n, "exact": v }),
                        HeaderRule::Regex(n, re) => {
                            json!({ "name": n, "regex": rule::unanchored(re) })
                        }
                    })
                    .collect();
                route.insert("match_headers".into(), Value::Array(list));
            }
            if let Some(up) = &upstreams {
                for (k, v) in &up.fields {
                    route.insert(k.clone(), v.clone());
                }
                if up.h2c {
                    route.insert("upstream_protocol".into(), json!("h2c"));
                }
            }
            if let Some(hsts) = &policy.hsts {
                route.insert("hsts".into(), hsts.clone());
            }
            if let Some(redirect) = &policy.redirect {
                route.insert("redirect".into(), Value::Object(redirect.clone()));
            }
            match &policy.path_edit {
                None => {}
                Some(edit) => {
                    let (field, value) = path_edit(edit, path.as_ref())?;
                    route.insert(field.into(), value);
                }
            }
            let mut headers = Map::new();
            for (direction, set, remove) in [
                ("request", &policy.request_set, &policy.request_remove),
                ("response", &policy.response_set, &policy.response_remove),
            ] {
                if set.is_empty() && remove.is_empty() {
                    continue;
                }
                let mut edits = Map::new();
                if !set.is_empty() {
                    let mut s = Map::new();
                    for (k, v) in set {
                        s.insert(k.clone(), json!(v));
                    }
                    edits.insert("set".into(), Value::Object(s));
                }
                if !remove.is_empty() {
                    edits.insert("remove".into(), json!(remove));
                }
                headers.insert(direction.into(), Value::Object(edits));
            }
            if !headers.is_empty() {
                route.insert("headers".into(), Value::Object(headers));
            }
            route.insert("__priority".into(), json!(priority));
            routes.push(route);
        }
        Ok(Outcome::Routes(routes))
    }

    pub(super) fn tcp(&self, name: &str, value: &Value) -> Result<Outcome, String> {
        let router = Fields::new(value, &format!("router `{name}`"))?;
        router.only(&[
            "rule",
            "service",
            "entryPoints",
            "middlewares",
            "priority",
            "tls",
            "ruleSyntax",
        ])?;
        if router
            .strings("middlewares")?
            .is_some_and(|m| !m.is_empty())
        {
            return Err(
                "TCP middlewares (`ipAllowList`, `inFlightConn`) are not carried per route".into(),
            );
        }
        let rule = router.string("rule")?.ok_or("the router has no `rule`")?;
        let snis = rule::tcp(&rule).map_err(|e| format!("rule `{rule}`: {e}"))?;
        let ports = self.ports(&router)?;
        let passthrough = match router.get("tls") {
            None => false,
            Some(v) => {
                let tls = Fields::new(v, &format!("router `{name}` tls"))?;
                tls.only(&["passthrough", "certResolver", "domains", "options"])?;
                if tls.boolean("passthrough")? != Some(true) {
                    return Err("a TCP router that terminates TLS is not carried (sozu terminates TLS for HTTP routes only; `tls.passthrough: true` passes it through)".into());
                }
                true
            }
        };
        let service = router
            .string("service")?
            .ok_or("the router has no `service`")?;
        let (upstreams, proxy) = self.services.stream(&service)?;
        let mut routes = Vec::new();
        for port in ports {
            for sni in &snis {
                let mut route = Map::new();
                let host = match (sni, passthrough) {
                    (Sni::Any, false) => self.options.host.clone().ok_or(
                        "`HostSNI(`*`)` names no host: give the workspace route's host (`--host`, or the router's own rule)",
                    )?,
                    (Sni::Name(n), true) => n.clone(),
                    (Sni::Any, true) => return Err("a passthrough router needs `HostSNI` with a name: sozu passes TLS through by SNI".into()),
                    (Sni::Name(_), false) => return Err("`HostSNI` with a name needs TLS (`tls.passthrough: true`); without TLS only `HostSNI(`*`)`".into()),
                };
                self.host_in_zone(&host)?;
                route.insert("host".into(), json!(host));
                route.insert(
                    "protocol".into(),
                    json!(if passthrough {
                        "tls_passthrough"
                    } else {
                        "tcp"
                    }),
                );
                route.insert("listen_port".into(), json!(port));
                for (k, v) in &upstreams {
                    route.insert(k.clone(), v.clone());
                }
                if proxy {
                    route.insert("proxy_protocol".into(), json!(true));
                }
                routes.push(route);
            }
        }
        Ok(Outcome::Routes(routes))
    }

    pub(super) fn udp(&self, name: &str, value: &Value) -> Result<Outcome, String> {
        let router = Fields::new(value, &format!("router `{name}`"))?;
        router.only(&["service", "entryPoints"])?;
        let ports = self.ports(&router)?;
        let service = router
            .string("service")?
            .ok_or("the router has no `service`")?;
        let (upstreams, _) = self.services.stream(&service)?;
        let host = self
            .options
            .host
            .clone()
            .ok_or("a UDP router names no host: give the workspace route's host (`--host`)")?;
        self.host_in_zone(&host)?;
        let mut routes = Vec::new();
        for port in ports {
            let mut route = Map::new();
            route.insert("host".into(), json!(host));
            route.insert("protocol".into(), json!("udp"));
            route.insert("listen_port".into(), json!(port));
            for (k, v) in &upstreams {
                route.insert(k.clone(), v.clone());
            }
            routes.push(route);
        }
        Ok(Outcome::Routes(routes))
    }

    /// The ports of a TCP or UDP router's entry points.
    fn ports(&self, router: &Fields) -> Result<Vec<u16>, String> {
        let mut ports = Vec::new();
        for e in self.entry_points(router)? {
            match e {
                EntryPoint::Port(p) => ports.push(p),
                EntryPoint::Https | EntryPoint::Http if router.get("entryPoints").is_none() => {}
                _ => {
                    return Err("a TCP or UDP router on the HTTPS or HTTP listener is not carried: map its entry point to a port of its own".into())
                }
            }
        }
        if ports.is_empty() {
            return Err("the router is on no entry point the workspace maps to a port".into());
        }
        Ok(ports)
    }
}

/// A path the contract takes in `path_prefix` and `path_exact`.
fn path_text(p: &str) -> Result<(), String> {
    if !p.starts_with('/') {
        return Err(format!("path `{p}` does not start with `/`"));
    }
    if p.chars().any(|c| c.is_whitespace() || c == '?' || c == '#') || p.len() > 1024 {
        return Err(format!(
            "path `{p}` holds whitespace, `?` or `#`, or is longer than 1024"
        ));
    }
    Ok(())
}

/// A path middleware as the route's `strip_prefix` or `rewrite`, for the route's path rule.
fn path_edit(edit: &PathEdit, path: Option<&PathRule>) -> Result<(&'static str, Value), String> {
    match edit {
        PathEdit::Strip(prefixes) => {
            let Some(PathRule::Prefix(route_prefix)) = path else {
                return Err("`stripPrefix` is carried on a `PathPrefix` rule only".into());
            };
            // Traefik strips the first prefix that matches; on a route that matches only
            // `route_prefix`, that is the first prefix of which `route_prefix` is an extension.
            let strip = prefixes
                .iter()
                .find(|p| route_prefix.starts_with(p.as_str()))
                .ok_or_else(|| {
                    format!(
                        "`stripPrefix` strips none of the route's `PathPrefix(`{route_prefix}`)`"
                    )
                })?;
            let normalised = strip.trim_end_matches('/');
            if route_prefix.trim_end_matches('/') == normalised && route_prefix.ends_with('/') {
                Ok(("strip_prefix", json!(true)))
            } else {
                Err(format!(
                    "`stripPrefix` `{strip}` on `PathPrefix(`{route_prefix}`)` is not carried: sozu strips what its prefix matched, and a prefix that does not end in `/` also matches `{route_prefix}x` (write `PathPrefix(`{normalised}/`)` and strip `{normalised}`)"
                ))
            }
        }
        PathEdit::Add(prefix) => Ok(("rewrite", json!({ "path": format!("{prefix}$PATH[0]") }))),
        PathEdit::Replace(path) => Ok(("rewrite", json!({ "path": path }))),
        PathEdit::ReplaceRegex { regex, replacement } => {
            let Some(PathRule::Prefix(route_prefix)) = path else {
                return Err("`replacePathRegex` is carried on a `PathPrefix` rule only".into());
            };
            // `^/prefix/(.*)` → `/new/$1`: what follows the route's prefix, after a new one.
            let expected = [
                format!("^{}(.*)", regex_escape(route_prefix)),
                format!("^{}(.*)$", regex_escape(route_prefix)),
            ];
            let rest = replacement
                .strip_suffix("${1}")
                .or_else(|| replacement.strip_suffix("$1"));
            match rest {
                Some(new_prefix) if expected.contains(regex) && !new_prefix.contains('$') && new_prefix.starts_with('/') => {
                    Ok(("rewrite", json!({ "path": format!("{new_prefix}$PATH[1]") })))
                }
                _ => Err(format!(
                    "`replacePathRegex` `{regex}` → `{replacement}` is not carried: sozu's rewrite knows the whole path and what follows the route's prefix; carried is `^{}(.*)` → `/new/${{1}}`",
                    regex_escape(route_prefix)
                )),
            }
        }
    }
}

fn regex_escape(s: &str) -> String {
    regex::escape(s)
}
