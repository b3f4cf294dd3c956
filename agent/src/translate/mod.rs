//! Other route languages into the workspace's routes: Kubernetes `Ingress` objects with their
//! ingress-nginx annotations ([`ingress`]) and the Gateway API's routes ([`gateway`]), read from
//! the YAML `kubectl` writes ([`k8s`]) and written as workspace text ([`nickel`]).
//!
//! Pure: text in, a [`Translation`] out; reading the files and writing the output are the
//! command's (`cli/import`). Each translator turns an object into [`Route`]s in workspace terms,
//! each with its [`Origin`] (file, document, object, field), and what it cannot carry into
//! [`LeftOut`] entries with their reason. Fail closed: what sozu cannot express and would change a
//! route's meaning is never carried in a weaker form; the route (or the rule) is left out and said.
//! A Traefik translator, and a live source reading Traefik's routes, are meant to produce the
//! same [`Route`]s.

pub mod gateway;
pub mod ingress;
pub mod k8s;
pub mod nickel;
pub mod precedence;
pub mod traefik;

use std::fmt;

/// Where a route or a refusal comes from: the file, the document in it (from 1), the object, and
/// the field inside the object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    pub file: String,
    pub document: usize,
    pub kind: String,
    pub namespace: String,
    pub name: String,
    pub field: String,
}

impl Origin {
    /// The same object, another field.
    pub fn at(&self, field: impl Into<String>) -> Origin {
        Origin {
            field: field.into(),
            ..self.clone()
        }
    }
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.kind.is_empty() {
            write!(f, "{}, document {}", self.file, self.document)?;
            if !self.field.is_empty() {
                write!(f, ", {}", self.field)?;
            }
            return Ok(());
        }
        write!(
            f,
            "{} {}/{} ({}, document {})",
            self.kind, self.namespace, self.name, self.file, self.document
        )?;
        if !self.field.is_empty() {
            write!(f, " {}", self.field)?;
        }
        Ok(())
    }
}

/// How an `'https` route matches a request's path (the contract's four path fields).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PathMatch {
    /// `path_prefix`: a raw string prefix (`/v2` matches `/v2example`).
    Prefix(String),
    /// `path_segment_prefix`: by path segment (`/v2` matches `/v2` and `/v2/x`).
    SegmentPrefix(String),
    /// `path_exact`.
    Exact(String),
    /// `path_regex`, anchored at both ends as sozu anchors it.
    Regex(String),
}

impl PathMatch {
    pub fn root() -> PathMatch {
        PathMatch::Prefix("/".into())
    }
}

/// One of `match_headers`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HeaderMatch {
    pub name: String,
    pub test: HeaderTest,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HeaderTest {
    Exact(String),
    Regex(String),
    Present,
}

/// `redirect`'s scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    Https,
    Http,
    Same,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redirect {
    pub status: u16,
    pub scheme: Scheme,
    pub host: Option<String>,
    pub path: Option<String>,
    pub port: Option<u16>,
}

/// `{ set, remove }` for one direction.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeaderEdits {
    pub set: Vec<(String, String)>,
    pub remove: Vec<String>,
}

impl HeaderEdits {
    pub fn is_empty(&self) -> bool {
        self.set.is_empty() && self.remove.is_empty()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BasicAuth {
    /// Relative to the workspace's directory.
    pub users_file: String,
    pub realm: Option<String>,
}

/// What an `'https` route has besides its host and upstreams.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Http {
    pub path: PathMatch,
    /// The path the source matches, when `path` is written otherwise: a `ReplacePrefixMatch`'s
    /// prefix, written as a regex whose groups hold what follows it. The spec ranks the source's.
    pub matched: Option<PathMatch>,
    pub method: Option<String>,
    pub match_headers: Vec<HeaderMatch>,
    pub redirect: Option<Redirect>,
    pub rewrite_path: Option<String>,
    pub request_headers: HeaderEdits,
    pub response_headers: HeaderEdits,
    pub basic_auth: Option<BasicAuth>,
    /// `upstream_protocol = 'h2c` (gRPC).
    pub h2c: bool,
}

impl Default for Http {
    fn default() -> Self {
        Http {
            path: PathMatch::root(),
            matched: None,
            method: None,
            match_headers: Vec::new(),
            redirect: None,
            rewrite_path: None,
            request_headers: HeaderEdits::default(),
            response_headers: HeaderEdits::default(),
            basic_auth: None,
            h2c: false,
        }
    }
}

/// A route's kind (the contract's `protocol`). Unboxed: nearly every route imported is HTTP, and
/// an import builds each once.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    Https(Http),
    Tcp { listen_port: u16 },
    TlsPassthrough { listen_port: u16 },
    Udp { listen_port: u16 },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    pub host: String,
    pub port: u16,
    pub weight: u32,
}

/// A route in workspace terms, and where it comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub host: String,
    pub kind: Kind,
    /// Empty for a redirecting route.
    pub upstreams: Vec<Upstream>,
    pub origin: Origin,
    /// Why the route is written as it is, when its origin alone does not say.
    pub note: Option<String>,
}

impl Route {
    /// What two routes may not share (the contract's duplicate rule, with the matching fields).
    pub fn key(&self) -> String {
        match &self.kind {
            Kind::Https(http) => format!(
                "https {} {:?} {:?} {:?}",
                self.host, http.path, http.method, http.match_headers
            ),
            Kind::Tcp { listen_port } => format!("port {listen_port}"),
            Kind::Udp { listen_port } => format!("udp port {listen_port}"),
            Kind::TlsPassthrough { listen_port } => format!("port {listen_port} {}", self.host),
        }
    }
}

/// Something not carried, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeftOut {
    pub origin: Origin,
    /// What was left out: `the object`, `the rule`, an annotation, a user.
    pub what: String,
    pub reason: String,
}

impl fmt::Display for LeftOut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} left out: {}",
            self.origin, self.what, self.reason
        )
    }
}

/// A file the workspace names, written beside it (a basic-auth users file).
#[derive(Clone, PartialEq, Eq)]
pub struct SideFile {
    /// Relative to the workspace's directory, as the workspace names it.
    pub name: String,
    pub contents: String,
    pub mode: u32,
}

impl fmt::Debug for SideFile {
    // A users file holds password hashes: never in a debug print.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SideFile({}, {} bytes)", self.name, self.contents.len())
    }
}

/// What the import asked for.
#[derive(Debug, Clone)]
pub struct Options {
    pub zone: String,
    /// The host of routes that name none.
    pub host: Option<String>,
    pub cluster_issuer: Option<String>,
}

/// A translation: the workspace's routes, what was left out, and the workspace-wide fields.
#[derive(Debug, Default)]
pub struct Translation {
    /// `import ingress` or `import gateway`, for the header.
    pub command: String,
    pub files: Vec<String>,
    pub zone: String,
    pub cluster_issuer: String,
    pub allowed_sources: Option<Vec<String>>,
    pub routes: Vec<Route>,
    pub left_out: Vec<LeftOut>,
    /// What holds for the whole import, said at the top of the workspace.
    pub notes: Vec<String>,
    pub side_files: Vec<SideFile>,
}

/// An input that cannot be read as the command's objects: nothing is written.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TranslateError {
    #[error("{file}, document {document}{}: {message}", line.map(|l| format!(" (line {l})")).unwrap_or_default())]
    Yaml {
        file: String,
        document: usize,
        line: Option<usize>,
        message: String,
    },
    #[error("{origin}: {message}")]
    Field {
        origin: Box<Origin>,
        message: String,
    },
}

/// Is `host` the zone or a name under it?
pub fn in_zone(host: &str, zone: &str) -> bool {
    host == zone
        || host
            .strip_suffix(zone)
            .is_some_and(|rest| rest.ends_with('.') && rest.len() > 1)
}

/// A DNS name the contract takes as a host: lowercase labels of `a-z`, `0-9` and inner `-`.
pub fn is_dns_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
        && !name
            .rsplit('.')
            .next()
            .is_some_and(|last| last.bytes().all(|b| b.is_ascii_digit()))
}

/// Why `host` cannot be a route's host in `zone`, if it cannot.
pub fn host_problem(host: &str, zone: &str) -> Option<String> {
    if host.starts_with("*.") {
        Some(format!(
            "`{host}` is a wildcard: a workspace route names one host (give each name its route)"
        ))
    } else if !is_dns_name(host) {
        Some(format!("`{host}` is not a DNS name the workspace takes"))
    } else if !in_zone(host, zone) {
        Some(format!(
            "host `{host}` is outside the zone `{zone}` (this workspace's routes are the zone's names)"
        ))
    } else {
        None
    }
}

/// The upstream a Service stands for: `name.namespace.svc.cluster.local`.
pub fn service_upstream(name: &str, namespace: &str) -> String {
    format!("{name}.{namespace}.svc.cluster.local")
}

/// Routes of one host in the order the Gateway API ranks them (exact path, then the longest
/// prefix, then a method, then the most header matches; ties keep their order), and the second
/// of two routes that match alike left out: the first one wins, as both specs say.
pub fn order_and_dedupe(routes: Vec<Route>, left_out: &mut Vec<LeftOut>) -> Vec<Route> {
    let mut routes = routes;
    routes.sort_by_key(rank);
    let mut seen: std::collections::HashMap<String, Origin> = std::collections::HashMap::new();
    let mut kept = Vec::with_capacity(routes.len());
    for route in routes {
        match seen.get(&route.key()) {
            Some(first) => left_out.push(LeftOut {
                origin: route.origin.clone(),
                what: "the route".into(),
                reason: format!("it matches what {first} matches, which takes precedence"),
            }),
            None => {
                seen.insert(route.key(), route.origin.clone());
                kept.push(route);
            }
        }
    }
    kept
}

/// The sort key: host first (routes of a host together), then the precedence within it.
fn rank(
    route: &Route,
) -> (
    String,
    u8,
    std::cmp::Reverse<usize>,
    u8,
    std::cmp::Reverse<usize>,
) {
    match &route.kind {
        Kind::Https(http) => {
            let (class, len) = match http.matched.as_ref().unwrap_or(&http.path) {
                PathMatch::Exact(p) => (0, p.len()),
                // The spec leaves the order of regular expressions to the implementation: as written.
                PathMatch::Regex(_) => (1, 0),
                PathMatch::SegmentPrefix(p) | PathMatch::Prefix(p) => (2, p.len()),
            };
            (
                route.host.clone(),
                class,
                std::cmp::Reverse(len),
                u8::from(http.method.is_none()),
                std::cmp::Reverse(http.match_headers.len()),
            )
        }
        _ => (
            route.host.clone(),
            3,
            std::cmp::Reverse(0),
            0,
            std::cmp::Reverse(0),
        ),
    }
}

#[cfg(test)]
mod tests;
