//! Traefik HTTP middlewares as route policies: `stripPrefix`, `addPrefix`, `replacePath`,
//! `replacePathRegex`, `redirectScheme`, `redirectRegex`, `headers` and `chain`; `basicAuth`,
//! `ipAllowList`, `forwardAuth`, plugins and every other middleware refused with the reason.
//! Pure.

use serde_json::{json, Map, Value};

use super::fields::Fields;
use super::service::local_name;

/// What a router's middlewares do, before the router's path is known.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Policy {
    /// The one middleware that changes the path the backend sees.
    pub path_edit: Option<PathEdit>,
    /// A redirect answering every request (the contract's `redirect` record).
    pub redirect: Option<Map<String, Value>>,
    /// `redirectScheme` to https: on an HTTP entry point, what the workspace's HTTP listener
    /// already does for every `'https` route.
    pub to_https: bool,
    pub request_set: Vec<(String, String)>,
    pub request_remove: Vec<String>,
    pub response_set: Vec<(String, String)>,
    pub response_remove: Vec<String>,
    /// The contract's `hsts` record.
    pub hsts: Option<Value>,
}

/// How the path the backend sees is changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathEdit {
    /// `stripPrefix` of these prefixes (Traefik strips the first that matches).
    Strip(Vec<String>),
    /// `addPrefix`.
    Add(String),
    /// `replacePath`.
    Replace(String),
    /// `replacePathRegex`.
    ReplaceRegex { regex: String, replacement: String },
}

/// The middlewares of a router, by name, in the order written.
pub fn policy<'v>(
    names: &[String],
    get: &dyn Fn(&str) -> Option<&'v Value>,
) -> Result<Policy, String> {
    let mut policy = Policy::default();
    let mut seen = Vec::new();
    for name in names {
        apply(name, get, &mut policy, &mut seen, 0)?;
    }
    if policy.redirect.is_some() && policy.path_edit.is_some() {
        return Err("a redirect after a path rewrite is not carried (sozu's `Location` is written from the request's own path)".into());
    }
    Ok(policy)
}

fn apply<'v>(
    name: &str,
    get: &dyn Fn(&str) -> Option<&'v Value>,
    policy: &mut Policy,
    seen: &mut Vec<String>,
    depth: usize,
) -> Result<(), String> {
    let local = local_name(name, "middleware")?;
    if depth > 8 || seen.iter().filter(|n| *n == local).count() > 0 && depth > 0 {
        return Err(format!(
            "middleware `{local}`: a chain that includes itself"
        ));
    }
    seen.push(local.to_owned());
    let value = get(local).ok_or_else(|| format!("middleware `{local}` is not declared"))?;
    let what = format!("middleware `{local}`");
    let m = Fields::new(value, &what)?;
    let kinds = m.keys();
    let [kind] = kinds.as_slice() else {
        return Err(format!(
            "{what} declares {} kinds of middleware, not one",
            kinds.len()
        ));
    };
    let body = Fields::new(
        m.get(kind).unwrap_or(&Value::Null),
        &format!("{what} {kind}"),
    )?;
    let edit = |policy: &mut Policy, e: PathEdit| {
        if policy.path_edit.is_some() {
            Err(format!("{what}: a second middleware that changes the path is not carried (sozu rewrites a path once)"))
        } else if policy.redirect.is_some() {
            Err(format!("{what}: a path rewrite after a redirect changes nothing in Traefik and is refused here"))
        } else {
            policy.path_edit = Some(e);
            Ok(())
        }
    };
    match kind.to_ascii_lowercase().as_str() {
        "chain" => {
            body.only(&["middlewares"])?;
            for child in body.strings("middlewares")?.unwrap_or_default() {
                apply(&child, get, policy, seen, depth + 1)?;
            }
        }
        "stripprefix" => {
            body.only(&["prefixes", "forceSlash"])?;
            let prefixes = body.strings("prefixes")?.unwrap_or_default();
            if prefixes.is_empty() {
                return Err(format!("{what}: `stripPrefix` names no prefix"));
            }
            edit(policy, PathEdit::Strip(prefixes))?;
        }
        "addprefix" => {
            body.only(&["prefix"])?;
            let prefix = body.string("prefix")?.unwrap_or_default();
            template_text(&what, &prefix)?;
            if !prefix.starts_with('/') {
                return Err(format!("{what}: `addPrefix` `{prefix}` does not start with `/`"));
            }
            edit(policy, PathEdit::Add(prefix))?;
        }
        "replacepath" => {
            body.only(&["path"])?;
            let path = body.string("path")?.unwrap_or_default();
            template_text(&what, &path)?;
            if !path.starts_with('/') {
                return Err(format!("{what}: `replacePath` `{path}` does not start with `/`"));
            }
            edit(policy, PathEdit::Replace(path))?;
        }
        "replacepathregex" => {
            body.only(&["regex", "replacement"])?;
            let regex = body.string("regex")?.unwrap_or_default();
            let replacement = body.string("replacement")?.unwrap_or_default();
            edit(policy, PathEdit::ReplaceRegex { regex, replacement })?;
        }
        "redirectscheme" => {
            body.only(&["scheme", "port", "permanent"])?;
            let scheme = body.string("scheme")?.unwrap_or_else(|| "https".into());
            let permanent = body.boolean("permanent")?.unwrap_or(false);
            let port = match body.string("port")? {
                None => None,
                Some(p) => Some(p.parse::<u16>().ok().filter(|p| *p > 0).ok_or_else(|| {
                    format!("{what}: port `{p}` is not a port from 1 to 65535")
                })?),
            };
            if scheme != "https" && scheme != "http" {
                return Err(format!("{what}: scheme `{scheme}` is not carried (https or http)"));
            }
            if policy.redirect.is_some() {
                return Err(format!("{what}: a second redirect is not carried"));
            }
            let mut r = Map::new();
            // Traefik answers a permanent redirect of a GET with 301, a temporary one with 302
            // (`pkg/middlewares/redirect`); 308/307 for other methods, which sozu 2.3.3 cannot
            // tell apart: the difference is in the docs.
            r.insert("status".into(), json!(if permanent { 301 } else { 302 }));
            r.insert("scheme".into(), json!(scheme));
            if let Some(port) = port {
                if !((scheme == "https" && port == 443) || (scheme == "http" && port == 80)) {
                    r.insert("port".into(), json!(port));
                }
            }
            policy.to_https = scheme == "https" && permanent && port.is_none_or(|p| p == 443);
            policy.redirect = Some(r);
        }
        "redirectregex" => {
            body.only(&["regex", "replacement", "permanent"])?;
            let regex = body.string("regex")?.unwrap_or_default();
            let replacement = body.string("replacement")?.unwrap_or_default();
            let permanent = body.boolean("permanent")?.unwrap_or(false);
            if policy.redirect.is_some() {
                return Err(format!("{what}: a second redirect is not carried"));
            }
            policy.redirect = Some(redirect_regex(&what, &regex, &replacement, permanent)?);
        }
        "headers" => headers(&what, &body, policy)?,
        "basicauth" => {
            let users = body.strings("users")?.unwrap_or_default();
            let formats: Vec<&str> = users.iter().map(|u| hash_format(u)).collect();
            return Err(format!(
                "{what}: `basicAuth` is not carried: its users' hashes ({}) are htpasswd formats, and sozu 2.3.3 checks only `user:hex(sha256(password))`; give the route a users file in that form",
                if formats.is_empty() { "none, or a usersFile".to_owned() } else { dedup(formats).join(", ") }
            ));
        }
        "ipallowlist" | "ipwhitelist" => {
            return Err(format!(
                "{what}: `{kind}` is not carried: the workspace admits sources for every route at once (`allowed_sources`), sozu 2.3.3 has no per-frontend source filter"
            ))
        }
        "forwardauth" => {
            return Err(format!("{what}: `forwardAuth` is not carried: sozu 2.3.3 cannot ask another service before forwarding"))
        }
        "plugin" => return Err(format!("{what}: plugins are not carried")),
        other => {
            return Err(format!(
                "{what}: `{other}` is not carried (the middlewares carried are stripPrefix, addPrefix, replacePath, replacePathRegex, redirectScheme, redirectRegex, headers and chain)"
            ))
        }
    }
    Ok(())
}

fn dedup(mut v: Vec<&str>) -> Vec<&str> {
    v.sort_unstable();
    v.dedup();
    v
}

/// The htpasswd format of a `user:hash` line, named for the refusal (the hash is never shown).
fn hash_format(line: &str) -> &'static str {
    let hash = line.split_once(':').map(|(_, h)| h).unwrap_or("");
    if hash.starts_with("$apr1$") {
        "MD5 `$apr1$`"
    } else if hash.starts_with("$2y$") || hash.starts_with("$2a$") || hash.starts_with("$2b$") {
        "bcrypt"
    } else if hash.starts_with("{SHA}") {
        "SHA-1 `{SHA}`"
    } else if hash.starts_with("$5$") || hash.starts_with("$6$") {
        "crypt SHA-2"
    } else {
        "unrecognised"
    }
}

/// Text that goes into a sozu template: `$` would start a capture there.
fn template_text(what: &str, text: &str) -> Result<(), String> {
    if text.contains('$') {
        return Err(format!(
            "{what}: `{text}` holds a `$`, which sozu reads as the start of a capture"
        ));
    }
    if text
        .chars()
        .any(|c| c.is_whitespace() || c.is_control() || c == '"')
        || text.len() > 1024
    {
        return Err(format!("{what}: `{text}` is not a path sozu can write"));
    }
    Ok(())
}

/// `redirectRegex` carried where its regex matches every URL and its replacement is a fixed
/// URL, or the request's own path under a new scheme and host (`^https?://[^/]+/(.*)` →
/// `https://new.host/${1}`).
fn redirect_regex(
    what: &str,
    regex: &str,
    replacement: &str,
    permanent: bool,
) -> Result<Map<String, Value>, String> {
    let refuse = || {
        format!(
            "{what}: `redirectRegex` `{regex}` → `{replacement}` is not carried: sozu's redirect keeps the request's host and path or replaces them whole (`$HOST[0]`, `$PATH[0]`); carried are a regex that matches every URL with a fixed URL, and `^https?://[^/]+/(.*)` with `scheme://host/${{1}}`"
        )
    };
    let all = [".*", "^.*$", "^.*", "^(.*)$", "(.*)"];
    let path_forms = [
        "^https?://[^/]+/(.*)",
        "^https?://[^/]+/(.*)$",
        "^https?://[^/]+(/.*)",
        "^https?://[^/]+(/.*)$",
    ];
    let (scheme, rest) = if let Some(rest) = replacement.strip_prefix("https://") {
        ("https", rest)
    } else if let Some(rest) = replacement.strip_prefix("http://") {
        ("http", rest)
    } else {
        return Err(refuse());
    };
    let (authority, path) = match rest.find('/') {
        Some(at) => (&rest[..at], &rest[at..]),
        None => (rest, "/"),
    };
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) => (h, Some(p.parse::<u16>().map_err(|_| refuse())?)),
        None => (authority, None),
    };
    if host.is_empty() || !super::is_dns_name(&host.to_ascii_lowercase()) {
        return Err(refuse());
    }
    let path = if all.contains(&regex) {
        if path.contains('$') || path.contains('?') {
            return Err(refuse());
        }
        path.to_owned()
    } else if path_forms.contains(&regex) {
        let slash = regex.contains("/(.*)");
        match (slash, path) {
            (true, "/${1}" | "/$1") | (false, "${1}" | "$1") => "$PATH[0]".to_owned(),
            _ => return Err(refuse()),
        }
    } else {
        return Err(refuse());
    };
    template_text(what, &path.replace("$PATH[0]", ""))?;
    let mut r = Map::new();
    r.insert("status".into(), json!(if permanent { 301 } else { 302 }));
    r.insert("scheme".into(), json!(scheme));
    r.insert("host".into(), json!(host.to_ascii_lowercase()));
    if path != "$PATH[0]" {
        r.insert("path".into(), json!(path));
    }
    if let Some(port) = port {
        r.insert("port".into(), json!(port));
    }
    Ok(r)
}

/// The `headers` fields carried: custom request and response headers (an empty value removes),
/// the fixed security headers, and the `sts*` fields as the route's HSTS.
fn headers(what: &str, body: &Fields, policy: &mut Policy) -> Result<(), String> {
    body.only(&[
        "customRequestHeaders",
        "customResponseHeaders",
        "stsSeconds",
        "stsIncludeSubdomains",
        "stsPreload",
        "forceSTSHeader",
        "frameDeny",
        "customFrameOptionsValue",
        "contentTypeNosniff",
        "browserXssFilter",
        "customBrowserXSSValue",
        "contentSecurityPolicy",
        "referrerPolicy",
        "permissionsPolicy",
    ])?;
    for (direction, key) in [
        ("request", "customRequestHeaders"),
        ("response", "customResponseHeaders"),
    ] {
        for (name, value) in body.string_map(key)? {
            header_name(what, &name)?;
            let (set, remove) = if direction == "request" {
                (&mut policy.request_set, &mut policy.request_remove)
            } else {
                (&mut policy.response_set, &mut policy.response_remove)
            };
            if value.is_empty() {
                remove.push(name);
            } else {
                header_value(what, &value)?;
                set.push((name, value));
            }
        }
    }
    let mut fixed = Vec::new();
    if let Some(v) = body.string("customFrameOptionsValue")? {
        fixed.push(("X-Frame-Options", v));
    } else if body.boolean("frameDeny")? == Some(true) {
        fixed.push(("X-Frame-Options", "DENY".into()));
    }
    if body.boolean("contentTypeNosniff")? == Some(true) {
        fixed.push(("X-Content-Type-Options", "nosniff".into()));
    }
    if let Some(v) = body.string("customBrowserXSSValue")? {
        fixed.push(("X-XSS-Protection", v));
    } else if body.boolean("browserXssFilter")? == Some(true) {
        fixed.push(("X-XSS-Protection", "1; mode=block".into()));
    }
    for (field, header) in [
        ("contentSecurityPolicy", "Content-Security-Policy"),
        ("referrerPolicy", "Referrer-Policy"),
        ("permissionsPolicy", "Permissions-Policy"),
    ] {
        if let Some(v) = body.string(field)? {
            fixed.push((header, v));
        }
    }
    for (name, value) in fixed {
        header_value(what, &value)?;
        policy.response_set.push((name.to_owned(), value));
    }
    let seconds = body.whole("stsSeconds")?.unwrap_or(0);
    if seconds > 0 {
        if body.boolean("forceSTSHeader")? == Some(true) {
            // Traefik then adds the header to plain-HTTP answers too; the workspace's HTTP
            // listener only redirects, so the HTTPS answers are the same.
        }
        let include = body.boolean("stsIncludeSubdomains")?.unwrap_or(false);
        let preload = body.boolean("stsPreload")?.unwrap_or(false);
        if seconds > u32::MAX as u64 {
            return Err(format!(
                "{what}: `stsSeconds` {seconds} is larger than the workspace's `max_age` takes"
            ));
        }
        if preload && (!include || seconds < 31_536_000) {
            return Err(format!(
                "{what}: `stsPreload` without `stsIncludeSubdomains` and a year of `stsSeconds` is refused by the workspace (the preload list's own requirements)"
            ));
        }
        policy.hsts =
            Some(json!({ "max_age": seconds, "include_subdomains": include, "preload": preload }));
    }
    Ok(())
}

/// A header name as the contract takes it (an RFC 9110 token).
fn header_name(what: &str, name: &str) -> Result<(), String> {
    let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    if name.is_empty() || name.len() > 256 || !name.bytes().all(token) {
        return Err(format!("{what}: `{name}` is not a header name"));
    }
    Ok(())
}

fn header_value(what: &str, value: &str) -> Result<(), String> {
    if value.len() > 4096 || value.chars().any(|c| c.is_control() && c != '\t') {
        return Err(format!(
            "{what}: a header value sozu cannot send (control characters, or longer than 4096)"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(names: &[&str], v: &Value) -> Result<Policy, String> {
        let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        policy(&names, &|n: &str| v.get(n))
    }

    #[test]
    fn chains_and_headers_are_carried() {
        let v = json!({
            "sec": {"chain": {"middlewares": ["h", "r@file"]}},
            "h": {"headers": {"customRequestHeaders": {"X-Env": "prod", "X-Drop": ""}, "frameDeny": true, "stsSeconds": 300}},
            "r": {"redirectScheme": {"scheme": "https", "permanent": true}},
        });
        let p = run(&["sec"], &v).unwrap();
        assert_eq!(p.request_set, vec![("X-Env".into(), "prod".into())]);
        assert_eq!(p.request_remove, vec!["X-Drop".to_string()]);
        assert_eq!(
            p.response_set,
            vec![("X-Frame-Options".into(), "DENY".into())]
        );
        assert_eq!(
            p.hsts,
            Some(json!({"max_age": 300, "include_subdomains": false, "preload": false}))
        );
        assert!(p.to_https);
        assert_eq!(
            p.redirect,
            Some(
                json!({"status": 301, "scheme": "https"})
                    .as_object()
                    .unwrap()
                    .clone()
            )
        );
    }

    #[test]
    fn what_cannot_be_carried_is_refused_and_says_why() {
        let v = json!({
            "auth": {"basicAuth": {"users": ["test:$apr1$H6uskkkW$IgXLP6ewTrSuBkTrqE8wj/"]}},
            "allow": {"ipAllowList": {"sourceRange": ["10.0.0.0/8"]}},
            "fwd": {"forwardAuth": {"address": "http://auth"}},
            "plug": {"plugin": {"x": {}}},
            "rl": {"rateLimit": {"average": 1}},
            "loop": {"chain": {"middlewares": ["loop"]}},
            "cors": {"headers": {"accessControlAllowOriginList": ["*"]}},
            "rx": {"redirectRegex": {"regex": "^http://a/(.*)", "replacement": "https://b/$1"}},
        });
        for (name, says) in [
            ("auth", "MD5 `$apr1$`"),
            ("allow", "allowed_sources"),
            ("fwd", "forwardAuth"),
            ("plug", "plugins"),
            ("rl", "ratelimit"),
            ("loop", "includes itself"),
            ("cors", "accessControlAllowOriginList"),
            ("rx", "redirectRegex"),
            ("nope", "not declared"),
        ] {
            let e = run(&[name], &v).unwrap_err();
            assert!(e.contains(says), "{name}: {e}");
            assert!(!e.contains("H6uskkkW"), "a hash must never be shown: {e}");
        }
    }

    #[test]
    fn redirect_regex_forms_that_are_carried() {
        let r = redirect_regex(
            "m",
            "^https?://[^/]+/(.*)",
            "https://new.example.org/${1}",
            true,
        )
        .unwrap();
        assert_eq!(
            Value::Object(r),
            json!({"status": 301, "scheme": "https", "host": "new.example.org"})
        );
        let r = redirect_regex("m", ".*", "http://x.example.org:8080/moved", false).unwrap();
        assert_eq!(
            Value::Object(r),
            json!({"status": 302, "scheme": "http", "host": "x.example.org", "path": "/moved", "port": 8080})
        );
    }
}
