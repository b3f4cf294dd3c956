//! A route's match as the contract writes it (one path field, a method, header predicates),
//! checked as sozu 2.3.3 will take it: its regular expressions compiled alone and anchored as
//! sozu anchors them, `$PATH[n]` templates against the capture groups the match has. Pure.

use super::route_policy::RoutePolicy;
use super::{HeaderMatch, HeaderTest, PathMatch, RawRoute};

/// The route's path field, method and header matches as the model holds them: one path field
/// (`path_prefix` holds its default, `/`, when another is given), header names lowercase and
/// the matches sorted, each once, as sozu files them (its frontend key sorts and deduplicates
/// them): two spellings of one conjunction are one route.
pub(super) type RouteMatch = (PathMatch, Option<String>, Vec<HeaderMatch>);

pub(super) fn route_match(raw: &RawRoute) -> Result<RouteMatch, String> {
    let others = [
        raw.path_segment_prefix
            .clone()
            .map(PathMatch::SegmentPrefix),
        raw.path_exact.clone().map(PathMatch::Exact),
        raw.path_regex.clone().map(PathMatch::Regex),
    ];
    let mut given = others.into_iter().flatten();
    let path = match (given.next(), given.next()) {
        (None, _) => PathMatch::Prefix(raw.path_prefix.clone()),
        (Some(path), None) if raw.path_prefix == "/" => path,
        (Some(path), _) => {
            return Err(format!(
                "give one path field, not `path_prefix` and `{}` together",
                path.field()
            ))
        }
    };
    if let PathMatch::Regex(pattern) = &path {
        regex_problem(pattern).map_or(Ok(()), |e| Err(format!("path_regex: {e}")))?;
    }
    let is_token = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
    };
    if let Some(method) = &raw.method {
        if !is_token(method) {
            return Err(format!("method `{method}` is not an HTTP method"));
        }
    }
    let mut headers = Vec::new();
    for h in raw.match_headers.iter().flatten() {
        let name = h.name.to_ascii_lowercase();
        if !is_token(&name) || name == "host" || name == "cookie" {
            return Err(format!(
                "match_headers: `{}` is not a header sozu matches",
                h.name
            ));
        }
        let test = match (&h.exact, &h.regex, h.present) {
            (Some(v), None, None) => HeaderTest::Exact(v.clone()),
            (None, Some(v), None) => {
                regex_problem(v).map_or(Ok(()), |e| Err(format!("match_headers `{name}`: {e}")))?;
                HeaderTest::Regex(v.clone())
            }
            (None, None, Some(true)) => HeaderTest::Present,
            _ => {
                return Err(format!(
                    "match_headers `{name}`: one of `exact`, `regex`, `present`"
                ))
            }
        };
        headers.push(HeaderMatch { name, test });
    }
    headers.sort();
    headers.dedup();
    Ok((path, raw.method.clone(), headers))
}

/// sozu fills `$PATH[1]` with what follows a prefix, or with a regex's first group: a route
/// matched by `path_exact` or `path_segment_prefix` (a regex without groups) has none, nor has a
/// `path_regex` without a group, and sozu would refuse its frontend.
pub(super) fn path_captures(path: &PathMatch, policy: &RoutePolicy) -> Result<(), String> {
    let groups = match path {
        PathMatch::Prefix(_) => return Ok(()),
        PathMatch::Regex(pattern) => regex::bytes::Regex::new(pattern)
            .map(|r| r.captures_len().saturating_sub(1))
            .unwrap_or(0),
        PathMatch::SegmentPrefix(_) | PathMatch::Exact(_) => 0,
    };
    let redirect = policy.redirect.as_ref();
    let templates = [
        ("redirect.path", redirect.and_then(|r| r.path.as_deref())),
        ("redirect.host", redirect.and_then(|r| r.host.as_deref())),
        ("rewrite.path", policy.rewrite.path.as_deref()),
    ];
    for (field, template) in templates {
        let Some(template) = template else { continue };
        for n in 1..=9usize {
            if n > groups && template.contains(&format!("$PATH[{n}]")) {
                return Err(format!(
                    "{field} names `$PATH[{n}]`, but the route's `{}` has {groups} capture group(s)",
                    path.field()
                ));
            }
        }
    }
    Ok(())
}

/// Why sozu 2.3.3 would refuse `pattern` as a path or header regex, or `None`: it compiles the
/// pattern alone, then anchored as `\A(?:pattern)\z` (`anchored_regex` in sozu-lib's
/// `router/mod.rs`), with the same crate's byte-oriented `Regex`, and refuses a frontend when
/// either fails.
pub fn regex_problem(pattern: &str) -> Option<String> {
    if let Err(e) = regex::bytes::Regex::new(pattern) {
        return Some(regex_error(e));
    }
    regex::bytes::Regex::new(&format!("\\A(?:{pattern})\\z"))
        .err()
        .map(|e| format!("anchored as sozu anchors it, {}", regex_error(e)))
}

/// The `regex` crate's message, on one line.
fn regex_error(e: regex::Error) -> String {
    match e {
        regex::Error::Syntax(text) => text
            .lines()
            .rfind(|l| !l.trim().is_empty())
            .map(|l| l.trim().trim_start_matches("error: "))
            .unwrap_or("the expression does not parse")
            .to_owned(),
        regex::Error::CompiledTooBig(limit) => {
            format!("the expression compiles to more than {limit} bytes")
        }
        _ => "the expression does not compile".to_owned(),
    }
}
