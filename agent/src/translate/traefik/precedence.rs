//! Which of two routers that share requests Traefik sends them to, against which one sozu would
//! ([`precedence`]): where the two disagree, the router Traefik ranks lower is left out, so that
//! the requests both match still go where Traefik sends them.

use super::*;

/// How one HTTP route matches, read back from its fields, for [`precedence`].
struct Matching {
    priority: i64,
    /// 0: exact, 1: regex, 2: prefix (sozu's classes, the first outranking).
    class: u8,
    path: String,
    method: Option<String>,
    predicated: bool,
}

impl Matching {
    fn of(route: &Carried) -> Option<Matching> {
        let r = &route.route;
        if r.contains_key("protocol") {
            return None;
        }
        let s = |k: &str| r.get(k).and_then(Value::as_str).map(str::to_owned);
        let (class, path) = if let Some(p) = s("path_exact") {
            (0, p)
        } else if let Some(p) = s("path_regex") {
            (1, p)
        } else {
            (2, s("path_prefix").unwrap_or_else(|| "/".into()))
        };
        let method = s("method");
        let predicated = method.is_some() || r.contains_key("match_headers");
        Some(Matching {
            priority: r.get("__priority").and_then(Value::as_i64).unwrap_or(0),
            class,
            path,
            method,
            predicated,
        })
    }

    /// Whether some request could match both. A regex against an exact path is tried on it; a
    /// regex that starts with `^` and literal text overlaps the paths that text allows; any
    /// other regex is taken to overlap everything.
    fn overlaps(&self, other: &Matching) -> bool {
        let methods = match (&self.method, &other.method) {
            (Some(a), Some(b)) => a == b,
            _ => true,
        };
        let either = |a: &str, b: &str| a.starts_with(b) || b.starts_with(a);
        let paths = match (self.class, other.class) {
            (1, 0) => regex_matches(&self.path, &other.path),
            (0, 1) => regex_matches(&other.path, &self.path),
            (1, 2) | (1, 1) | (2, 1) => match (literal_start(self), literal_start(other)) {
                (Some(a), Some(b)) => either(&a, &b),
                _ => true,
            },
            (0, 0) => self.path == other.path,
            (0, 2) => self.path.starts_with(&other.path),
            (2, 0) => other.path.starts_with(&self.path),
            _ => either(&self.path, &other.path),
        };
        methods && paths
    }

    /// Whether every request `other` matches, this matches too.
    fn covers(&self, other: &Matching) -> bool {
        !self.predicated
            && self.class == 2
            && other.class != 1
            && other.path.starts_with(&self.path)
    }

    /// Whether sozu 2.3.3 serves a request both match with this one (`select_tree_rule` in
    /// `lib/src/router/mod.rs`: a satisfied predicate first, then an exact or regex path, then
    /// the longest prefix).
    fn sozu_prefers(&self, other: &Matching) -> bool {
        if self.predicated != other.predicated {
            return self.predicated;
        }
        match (self.class, other.class) {
            (2, 2) => self.path.len() > other.path.len(),
            (a, b) => a < b,
        }
    }
}

/// Whether the route's `path_regex` (as sozu anchors it) matches `path`; a pattern that does
/// not compile matches nothing (the router was refused for it already).
fn regex_matches(pattern: &str, path: &str) -> bool {
    regex::Regex::new(&format!("\\A(?:{pattern})\\z")).is_ok_and(|re| re.is_match(path))
}

/// The literal text a path's regex starts with, for a regex (or a prefix) whose every match
/// starts with it: a prefix's own text; a `PathRegexp` written `^/literal…`, up to its first
/// special character.
fn literal_start(m: &Matching) -> Option<String> {
    match m.class {
        2 => Some(m.path.clone()),
        1 => {
            let rest = m.path.strip_prefix(".*(?:^")?;
            let literal: String = rest
                .chars()
                .take_while(|c| !"\\.+*?()|[]{}^$".contains(*c))
                .collect();
            // A quantifier after the literal applies to its last character.
            let next = rest[literal.len()..].chars().next();
            let literal = if matches!(next, Some('*' | '?' | '{')) {
                let mut l = literal;
                l.pop();
                l
            } else {
                literal
            };
            (!literal.is_empty()).then_some(literal)
        }
        _ => Some(m.path.clone()),
    }
}

/// Routers of one host that Traefik and sozu would rank differently: where both could match a
/// request and sozu prefers the one Traefik ranks lower (Traefik: the higher `priority`, by
/// default the longer rule), the lower one is refused, so that the requests they share go where
/// Traefik sends them.
pub(super) fn precedence(t: &mut Translation, refused: &mut std::collections::HashSet<Origin>) {
    let mut by_host: BTreeMap<&str, Vec<(usize, Matching)>> = BTreeMap::new();
    for (i, route) in t.routes.iter().enumerate() {
        if let Some(m) = Matching::of(route) {
            by_host.entry(route.host()).or_default().push((i, m));
        }
    }
    let mut out = Vec::new();
    for routes in by_host.values() {
        for (i, x) in routes {
            for (j, y) in routes {
                let (xo, yo) = (&t.routes[*i].origin, &t.routes[*j].origin);
                if xo.router == yo.router || x.priority <= y.priority {
                    continue;
                }
                // Traefik prefers x.
                if y.sozu_prefers(x) && x.overlaps(y) {
                    let reason = if x.covers(y) {
                        format!("Traefik sends every request it matches to {xo} (a higher priority), so it is never served there")
                    } else {
                        format!("Traefik sends the requests it shares with {xo} there (a higher priority), where sozu would prefer this one: it is not served, so that they still go there")
                    };
                    out.push((yo.clone(), reason));
                }
            }
        }
    }
    for (origin, reason) in out {
        if refused.insert(origin.clone()) {
            t.refused.push(Refused { origin, reason });
        }
    }
    for r in &mut t.routes {
        r.route.remove("__priority");
    }
}
