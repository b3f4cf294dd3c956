//! An HTTPRoute rule's filters in workspace terms: header edits (`RequestHeaderModifier`,
//! `ResponseHeaderModifier`), `URLRewrite` and `RequestRedirect`; what sozu cannot do of them
//! (a header `add`, a hostname rewrite, 303 and 307) is a reason the rule is left out.

use super::*;

/// Header names a workspace policy may not set or remove (the contract's list).
const FORBIDDEN_HEADERS: &[&str] = &[
    "connection",
    "content-length",
    "host",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// A `RequestHeaderModifier`'s (or `ResponseHeaderModifier`'s) edits; `add` cannot be carried.
pub(super) fn header_edits(modifier: Option<&Value>) -> Carry<HeaderEdits> {
    let Some(modifier) = modifier else {
        return Ok(HeaderEdits::default());
    };
    if get(modifier, &["add"]).is_some_and(|a| a.as_sequence().is_some_and(|s| !s.is_empty())) {
        return Err("a header modifier's `add` (a value beside the request's own): the workspace's headers `set` a header, replacing it".into());
    }
    let mut edits = HeaderEdits::default();
    if let Some(Value::Sequence(set)) = get(modifier, &["set"]) {
        for h in set {
            let name = get(h, &["name"])
                .and_then(Value::as_str)
                .unwrap_or_default();
            let value = get(h, &["value"])
                .and_then(Value::as_str)
                .unwrap_or_default();
            forbidden(name)?;
            if value.is_empty() {
                return Err(format!(
                    "header `{name}` set to an empty value (sozu reads it as a removal)"
                ));
            }
            edits.set.push((name.to_owned(), value.to_owned()));
        }
    }
    if let Some(Value::Sequence(remove)) = get(modifier, &["remove"]) {
        for name in remove.iter().filter_map(Value::as_str) {
            forbidden(name)?;
            edits.remove.push(name.to_owned());
        }
    }
    Ok(edits)
}

pub(super) fn forbidden(name: &str) -> Carry<()> {
    if FORBIDDEN_HEADERS.contains(&name.to_ascii_lowercase().as_str()) {
        Err(format!(
            "header `{name}` is one sozu manages itself: a policy may not set or remove it"
        ))
    } else {
        Ok(())
    }
}

/// The path a `ReplacePrefixMatch` keeps: the match becomes a regular expression whose first
/// group holds what follows the prefix, and the template puts the replacement before it. A
/// replacement by `/` needs two (the contract's template reads one group, and what follows
/// `/strip` is `/x` or `?q` or nothing, which become `/x`, `/?q` and `/`): `/strip/(.*)` and
/// `/strip(\?.*)?`, both rewritten to `/$PATH[1]`; the second is returned. The spec ranks both
/// as the prefix they come from ([`Http::matched`]).
fn replace_prefix(
    http: &mut Http,
    prefix: Option<&str>,
    replacement: &str,
) -> Carry<(String, Option<PathMatch>)> {
    let Some(prefix) = prefix else {
        return Err("ReplacePrefixMatch without a PathPrefix match".into());
    };
    if replacement.contains('$') {
        return Err("a `$` in a path, which sozu reads as a capture".into());
    }
    http.matched.get_or_insert_with(|| http.path.clone());
    let escaped = regex::escape(prefix);
    let replacement = replacement.trim_end_matches('/');
    if replacement.is_empty() {
        http.path = PathMatch::Regex(format!("{escaped}/(.*)"));
        let bare = (!prefix.is_empty()).then(|| PathMatch::Regex(format!("{escaped}(\\?.*)?")));
        Ok(("/$PATH[1]".into(), bare))
    } else {
        http.path = PathMatch::Regex(format!("{escaped}(/.*|\\?.*)?"));
        Ok((format!("{replacement}$PATH[1]"), None))
    }
}

/// A `URLRewrite` on `http`; the path of a second frontend when it needs one ([`replace_prefix`]).
pub(super) fn apply_rewrite(
    http: &mut Http,
    rewrite: &Value,
    prefix: Option<&str>,
) -> Carry<Option<PathMatch>> {
    if get(rewrite, &["hostname"]).is_some() {
        return Err(
            "URLRewrite of the hostname: sozu 2.3.3 would send the backend two `Host` headers"
                .into(),
        );
    }
    let mut second = None;
    if let Some(path) = get(rewrite, &["path"]) {
        let (template, bare) = path_modifier(http, path, prefix, "URLRewrite")?;
        http.rewrite_path = Some(template);
        second = bare;
    }
    Ok(second)
}

/// A `RequestRedirect` on `http`; the path of a second frontend when it needs one
/// ([`replace_prefix`]).
pub(super) fn apply_redirect(
    http: &mut Http,
    redirect: &Value,
    prefix: Option<&str>,
) -> Carry<Option<PathMatch>> {
    let status = match get(redirect, &["statusCode"])
        .and_then(Value::as_u64)
        .unwrap_or(302)
    {
        s @ (301 | 302 | 308) => s as u16,
        other => {
            return Err(format!(
                "a {other} redirect: sozu 2.3.3 redirects with 301, 302 or 308"
            ))
        }
    };
    let scheme = match get(redirect, &["scheme"]).and_then(Value::as_str) {
        None => Scheme::Same,
        Some("https") => Scheme::Https,
        Some("http") => Scheme::Http,
        Some(other) => return Err(format!("redirect scheme {other}")),
    };
    let host = get(redirect, &["hostname"])
        .and_then(Value::as_str)
        .map(str::to_owned);
    let port = get(redirect, &["port"])
        .and_then(Value::as_u64)
        .and_then(|p| u16::try_from(p).ok());
    let mut second = None;
    let path = match get(redirect, &["path"]) {
        None => None,
        Some(path) => {
            let (template, bare) = path_modifier(http, path, prefix, "RequestRedirect")?;
            second = bare;
            Some(template)
        }
    };
    http.redirect = Some(Redirect {
        status,
        scheme,
        host,
        path,
        port,
    });
    Ok(second)
}

/// An `HTTPPathModifier` (of `filter`, a `URLRewrite` or a `RequestRedirect`) as sozu's path
/// template; the path of a second frontend when it needs one ([`replace_prefix`]).
fn path_modifier(
    http: &mut Http,
    path: &Value,
    prefix: Option<&str>,
    filter: &str,
) -> Carry<(String, Option<PathMatch>)> {
    match get(path, &["type"]).and_then(Value::as_str) {
        Some("ReplaceFullPath") => {
            let full = get(path, &["replaceFullPath"])
                .and_then(Value::as_str)
                .unwrap_or("/");
            if full.contains('$') {
                return Err("a `$` in a path, which sozu reads as a capture".into());
            }
            Ok((full.to_owned(), None))
        }
        Some("ReplacePrefixMatch") => replace_prefix(
            http,
            prefix,
            get(path, &["replacePrefixMatch"])
                .and_then(Value::as_str)
                .unwrap_or("/"),
        ),
        other => Err(format!("{filter} path type {other:?}")),
    }
}
