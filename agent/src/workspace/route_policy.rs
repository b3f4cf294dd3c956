//! Route policies as the workspace declares them: a redirect instead of forwarding, rewrites,
//! header edits, basic authentication, connection limits and error pages. The contract checked
//! each field; [`RoutePolicy::from_raw`] still refuses what the model cannot hold.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::raw::{
    RawBasicAuth, RawHeaderEdits, RawHeaders, RawLimits, RawRedirect, RawRewrite, RedirectScheme,
};

/// What a route does besides forwarding to its upstreams. `Default` is a route with none.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoutePolicy {
    /// Every request is answered with this redirect; the route forwards nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redirect: Option<Redirect>,
    /// What the backend sees instead of the request's path.
    #[serde(default, skip_serializing_if = "Rewrite::is_empty")]
    pub rewrite: Rewrite,
    /// The route's own header edits, applied after the workspace's.
    #[serde(default, skip_serializing_if = "HeaderPolicy::is_empty")]
    pub headers: HeaderPolicy,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub basic_auth: Option<BasicAuth>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<Limits>,
    /// Status → the file of the page sozu answers with.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub error_pages: BTreeMap<u16, PathBuf>,
}

impl RoutePolicy {
    pub fn is_empty(&self) -> bool {
        *self == RoutePolicy::default()
    }

    /// One line for the status: `redirect 301 → https://new…`, `strip /app`, `auth`, ….
    pub fn summary(&self, path_prefix: &str) -> String {
        // Every field is named: a new one fails to compile until it is shown.
        let RoutePolicy {
            redirect,
            rewrite,
            headers,
            basic_auth,
            limits,
            error_pages,
        } = self;
        let mut parts = Vec::new();
        if let Some(r) = redirect {
            parts.push(format!("redirect {} {}", r.status, r.location_label()));
        }
        match &rewrite.path {
            Some(path) if rewrite.strips_prefix(path_prefix) => {
                parts.push(format!("strip {path_prefix}"))
            }
            Some(path) => parts.push(format!("path→{path}")),
            None => {}
        }
        let edits = headers.count();
        if edits > 0 {
            parts.push(format!("{edits} header edit(s)"));
        }
        if basic_auth.is_some() {
            parts.push("basic auth".into());
        }
        if let Some(l) = limits {
            let mut caps = Vec::new();
            if let Some(n) = l.connections_per_ip {
                caps.push(format!("{n}/ip"));
            }
            if let Some(n) = l.connections_per_subnet {
                caps.push(format!("{n}/subnet"));
            }
            if !caps.is_empty() {
                parts.push(format!("≤{} connections", caps.join(", ")));
            }
        }
        if !error_pages.is_empty() {
            let statuses: Vec<String> = error_pages.keys().map(u16::to_string).collect();
            parts.push(format!("pages {}", statuses.join(",")));
        }
        parts.join(", ")
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Redirect {
    /// 301, 302 or 308.
    pub status: u16,
    pub scheme: RedirectScheme,
    /// Templates with `$HOST[0]`, `$PATH[0]`, `$PATH[1]`; `None` keeps the request's.
    pub host: Option<String>,
    pub path: Option<String>,
    pub port: Option<u16>,
}

impl Redirect {
    /// The `Location` as a template, for the status: `https://new.in.example.org$PATH[0]`.
    pub fn location_label(&self) -> String {
        let scheme = match self.scheme {
            RedirectScheme::Https => "https",
            RedirectScheme::Http => "http",
            RedirectScheme::Same => "(same)",
        };
        let port = self.port.map(|p| format!(":{p}")).unwrap_or_default();
        format!(
            "{scheme}://{}{port}{}",
            self.host.as_deref().unwrap_or("$HOST[0]"),
            self.path.as_deref().unwrap_or("$PATH[0]")
        )
    }
}

/// What the backend sees instead of the request's path. The host and the port are not here:
/// sozu 2.3.3 sends a backend two `Host` headers when it rewrites the host, and uses a rewritten
/// port only in a redirect's `Location` ([`Redirect`] has both).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rewrite {
    /// `strip_prefix` is written here: what follows the prefix (see [`strip_template`]).
    pub path: Option<String>,
}

impl Rewrite {
    pub fn is_empty(&self) -> bool {
        *self == Rewrite::default()
    }

    /// Whether `path` is what `strip_prefix` writes for `path_prefix`.
    fn strips_prefix(&self, path_prefix: &str) -> bool {
        self.path.as_deref() == Some(&strip_template(path_prefix))
    }
}

/// The rewrite of the path that takes `path_prefix` away. sozu's `$PATH[1]` is what follows the
/// prefix: `x` of `/app/x` for the prefix `/app/`, so the `/` is put back. The contract admits
/// `strip_prefix` only on a prefix ending in `/` (sozu's prefix `/app` also matches `/apps` and
/// `/app?q`, whose rest is no path); the other branch is kept for a model built without it.
pub fn strip_template(path_prefix: &str) -> String {
    if path_prefix.ends_with('/') {
        "/$PATH[1]".to_owned()
    } else {
        "$PATH[1]".to_owned()
    }
}

/// Header edits in each direction.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeaderPolicy {
    pub request: HeaderEdits,
    pub response: HeaderEdits,
}

impl HeaderPolicy {
    pub fn is_empty(&self) -> bool {
        self.count() == 0
    }

    fn count(&self) -> usize {
        self.request.set.len()
            + self.request.remove.len()
            + self.response.set.len()
            + self.response.remove.len()
    }

    /// `self` (the workspace's edits) then `route`'s: a name the route sets or removes takes the
    /// route's edit alone. Names compare without case, as HTTP's do.
    pub fn then(&self, route: &HeaderPolicy) -> HeaderPolicy {
        HeaderPolicy {
            request: self.request.then(&route.request),
            response: self.response.then(&route.response),
        }
    }
}

/// Headers set (replaced) and removed in one direction. Names are kept as written.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeaderEdits {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub set: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remove: Vec<String>,
}

impl HeaderEdits {
    fn then(&self, route: &HeaderEdits) -> HeaderEdits {
        let overridden = |name: &str| {
            route
                .set
                .keys()
                .chain(route.remove.iter())
                .any(|n| n.eq_ignore_ascii_case(name))
        };
        let mut set: BTreeMap<String, String> = self
            .set
            .iter()
            .filter(|(n, _)| !overridden(n))
            .map(|(n, v)| (n.clone(), v.clone()))
            .collect();
        set.extend(route.set.iter().map(|(n, v)| (n.clone(), v.clone())));
        let mut remove: Vec<String> = self
            .remove
            .iter()
            .filter(|n| !overridden(n))
            .cloned()
            .collect();
        remove.extend(route.remove.iter().cloned());
        HeaderEdits { set, remove }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BasicAuth {
    /// `user:hex(sha256(password))` lines, read and watched by the agent.
    pub users_file: PathBuf,
    /// Shown in the browser's prompt; the route's host when the workspace gives none.
    pub realm: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    pub connections_per_ip: Option<u64>,
    pub connections_per_subnet: Option<u64>,
    /// Seconds, in the 429's `Retry-After`; 0 leaves the header out.
    pub retry_after: u32,
}

/// The statuses sozu has an answer template for, which an error page may replace.
pub const ERROR_PAGE_STATUSES: [u16; 10] = [400, 401, 404, 408, 413, 429, 502, 503, 504, 507];

/// `error_pages` as the model holds them: statuses as numbers, paths made absolute against the
/// workspace's directory.
pub fn error_pages_from_raw(
    raw: Option<BTreeMap<String, String>>,
    base: Option<&Path>,
) -> Result<BTreeMap<u16, PathBuf>, String> {
    let mut pages = BTreeMap::new();
    for (status, path) in raw.unwrap_or_default() {
        let code: u16 = status
            .parse()
            .ok()
            .filter(|c| ERROR_PAGE_STATUSES.contains(c))
            .ok_or_else(|| format!("error_pages: sozu has no page for status `{status}`"))?;
        let path = PathBuf::from(path);
        let path = match base {
            Some(base) if path.is_relative() => base.join(path),
            _ => path,
        };
        pages.insert(code, path);
    }
    Ok(pages)
}

pub fn headers_from_raw(raw: Option<RawHeaders>) -> HeaderPolicy {
    let edits = |e: Option<RawHeaderEdits>| {
        let e = e.unwrap_or_default();
        HeaderEdits {
            set: e.set,
            remove: e.remove,
        }
    };
    match raw {
        None => HeaderPolicy::default(),
        Some(h) => HeaderPolicy {
            request: edits(h.request),
            response: edits(h.response),
        },
    }
}

fn port(what: &str, p: Option<f64>) -> Result<Option<u16>, String> {
    match p {
        None => Ok(None),
        Some(p) if p.fract() == 0.0 && (1.0..=65535.0).contains(&p) => Ok(Some(p as u16)),
        Some(p) => Err(format!("{what} {p} is not a port")),
    }
}

fn count(what: &str, n: Option<f64>) -> Result<Option<u64>, String> {
    match n {
        None => Ok(None),
        Some(n) if n.fract() == 0.0 && (1.0..=1_000_000.0).contains(&n) => Ok(Some(n as u64)),
        Some(n) => Err(format!(
            "{what} {n} is not a whole number from 1 to 1000000"
        )),
    }
}

/// The parts of a raw route that make its policy.
pub struct RawPolicy {
    pub redirect: Option<RawRedirect>,
    pub rewrite: Option<RawRewrite>,
    pub strip_prefix: bool,
    pub headers: Option<RawHeaders>,
    pub basic_auth: Option<RawBasicAuth>,
    pub limits: Option<RawLimits>,
    pub error_pages: Option<BTreeMap<String, String>>,
}

impl RoutePolicy {
    pub fn from_raw(
        raw: RawPolicy,
        host: &str,
        path_prefix: &str,
        base: Option<&Path>,
    ) -> Result<RoutePolicy, String> {
        let redirect = raw
            .redirect
            .map(|r| {
                let status = match r.status {
                    s if s == 301.0 || s == 302.0 || s == 308.0 => s as u16,
                    s => return Err(format!("redirect status {s} is not 301, 302 or 308")),
                };
                Ok(Redirect {
                    status,
                    scheme: r.scheme,
                    host: r.host,
                    path: r.path,
                    port: port("redirect.port", r.port)?,
                })
            })
            .transpose()?;
        let rewrite = raw.rewrite.unwrap_or_default();
        if raw.strip_prefix && rewrite.path.is_some() {
            return Err("give `strip_prefix` or `rewrite.path`, not both".into());
        }
        if raw.strip_prefix && path_prefix == "/" {
            return Err("`strip_prefix` on a route at `/` strips nothing".into());
        }
        let rewrite = Rewrite {
            path: if raw.strip_prefix {
                Some(strip_template(path_prefix))
            } else {
                rewrite.path
            },
        };
        let limits = raw
            .limits
            .map(|l| {
                let retry_after = match l.retry_after {
                    r if r.fract() == 0.0 && (0.0..=86_400.0).contains(&r) => r as u32,
                    r => return Err(format!("limits.retry_after {r} is not 0 to 86400 seconds")),
                };
                Ok(Limits {
                    connections_per_ip: count("limits.connections_per_ip", l.connections_per_ip)?,
                    connections_per_subnet: count(
                        "limits.connections_per_subnet",
                        l.connections_per_subnet,
                    )?,
                    retry_after,
                })
            })
            .transpose()?;
        let basic_auth = raw
            .basic_auth
            .map(|a| {
                let users_file = PathBuf::from(a.users_file);
                if users_file.as_os_str().is_empty() {
                    return Err("basic_auth.users_file is empty".to_owned());
                }
                Ok(BasicAuth {
                    users_file,
                    realm: a.realm.unwrap_or_else(|| host.to_owned()),
                })
            })
            .transpose()?;
        Ok(RoutePolicy {
            redirect,
            rewrite,
            headers: headers_from_raw(raw.headers),
            basic_auth,
            limits,
            error_pages: error_pages_from_raw(raw.error_pages, base)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_route_edit_replaces_the_workspace_edit_of_the_same_name_whatever_its_case() {
        let workspace = HeaderPolicy {
            response: HeaderEdits {
                set: BTreeMap::from([
                    ("X-Frame-Options".into(), "DENY".into()),
                    ("Referrer-Policy".into(), "no-referrer".into()),
                ]),
                remove: vec!["Server".into()],
            },
            ..HeaderPolicy::default()
        };
        let route = HeaderPolicy {
            response: HeaderEdits {
                set: BTreeMap::from([("x-frame-options".into(), "SAMEORIGIN".into())]),
                remove: vec![],
            },
            request: HeaderEdits {
                set: BTreeMap::from([("X-Route".into(), "a".into())]),
                remove: vec![],
            },
        };
        let merged = workspace.then(&route);
        assert_eq!(
            merged.response.set,
            BTreeMap::from([
                ("Referrer-Policy".into(), "no-referrer".into()),
                ("x-frame-options".into(), "SAMEORIGIN".into()),
            ])
        );
        assert_eq!(merged.response.remove, ["Server"]);
        assert_eq!(merged.request.set.len(), 1);
    }

    #[test]
    fn stripping_a_prefix_keeps_the_path_absolute() {
        assert_eq!(strip_template("/app"), "$PATH[1]");
        assert_eq!(strip_template("/app/"), "/$PATH[1]");
    }
}
