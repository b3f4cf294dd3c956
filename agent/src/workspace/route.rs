//! A route: the name clients reach, the upstreams its traffic goes to, and its kind, which says
//! how sozu tells the route's traffic apart and what it does with it.
//!
//! **Kinds of routes.** What every kind shares lives on [`Route`] (the host, whose DNS record
//! points at the load balancer; the upstreams with their weights and drains, re-resolved by the
//! DNS source; the health check). What only one kind has lives in its variant of [`RouteKind`]
//! (an HTTP route's path prefix, HSTS, route policies and what its backends speak). Code that
//! does something different for each kind matches on [`RouteKind`] without a wildcard arm, so a
//! new kind is a new variant that the compiler makes every layer handle: the desired state, the
//! rendered file, the pod, the status (docs/agent.md, "Kinds of routes").

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{Limits, RoutePolicy};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "FlatRoute", try_from = "FlatRoute")]
pub struct Route {
    /// Stable identifier of the route, used as sozu's cluster id. Derived from what tells the
    /// route apart from the others of its host ([`route_id`]), so editing a route's upstream
    /// updates the cluster in place.
    pub id: String,
    /// The name clients reach the route by.
    pub host: String,
    pub kind: RouteKind,
    /// At least one, unless the route answers every request itself (a redirect); a route written
    /// with `upstream` and `port` has exactly one, of weight 1.
    pub upstreams: Vec<RouteUpstream>,
    /// sozu's active health check on the route's backends.
    pub health: Option<HealthCheck>,
    /// How sozu picks a backend of the route's cluster for each request or connection.
    pub balancing: Balancing,
}

/// sozu's `Cluster.load_balancing` (`LoadBalancingAlgorithms` in sozu 2.3.3's `command.proto`),
/// by the workspace's `balancing` tags. Every algorithm sozu 2.3.3 has is here; the two
/// client-affine ones (`Hrw`, `Maglev`) key on the client's source address, as sozu does for a
/// cluster that names no affinity header or cookie (`affinity_key`, lib/src/protocol/mux/router.rs).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Balancing {
    /// Each backend in turn, by weight (sozu's default).
    #[default]
    RoundRobin,
    Random,
    /// The backend with the fewest connections (sozu's default load metric).
    LeastLoaded,
    /// The less loaded of two backends drawn at random.
    PowerOfTwo,
    /// Rendezvous hashing of the client's address: a client stays on one backend while it is
    /// up, and few clients move when a backend comes or goes.
    Hrw,
    /// Maglev consistent hashing of the client's address: as `Hrw`, by a lookup table.
    Maglev,
}

impl Balancing {
    pub fn is_default(&self) -> bool {
        *self == Balancing::RoundRobin
    }
}

impl fmt::Display for Balancing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Balancing::RoundRobin => "round_robin",
            Balancing::Random => "random",
            Balancing::LeastLoaded => "least_loaded",
            Balancing::PowerOfTwo => "power_of_two",
            Balancing::Hrw => "hrw",
            Balancing::Maglev => "maglev",
        })
    }
}

/// How sozu carries a route's traffic: one variant per way it tells routes apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouteKind {
    /// HTTPS that sozu terminates with the host's certificate, matched by host and path prefix,
    /// beside an HTTP frontend that redirects to it.
    Http(HttpRoute),
    /// Every connection to a port of the ingress, forwarded as it is (SSH, a database, a broker).
    Tcp(StreamRoute),
    /// TLS connections to a port of the ingress whose ClientHello names the route's host (SNI),
    /// passed through untouched: the backend terminates TLS with its own certificate.
    TlsPassthrough(StreamRoute),
    /// Datagrams to a port of the ingress, forwarded by client address (one flow each).
    Udp(UdpRoute),
}

/// What a TCP or TLS-passthrough route has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamRoute {
    /// The port of the ingress its clients connect to, on the https listener's address.
    pub listen_port: u16,
    /// The backends get a PROXY protocol v2 header first, naming the client.
    pub proxy_protocol: bool,
    /// Connections at once from one client address and from one subnet: sozu closes one past
    /// either (`retry_after` is 0: no HTTP answer carries it).
    pub limits: Option<Limits>,
    /// Open to clients without a client certificate although `listeners.client_auth` requires
    /// one: sozu checks none on a port of its own (docs/security.md).
    pub client_auth_exempt: bool,
}

/// What a UDP route has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UdpRoute {
    /// The port of the ingress its clients send to, on the https listener's address.
    pub listen_port: u16,
    /// Flows at once from one client address and from one subnet: sozu drops a new flow past
    /// either (`retry_after` is 0).
    pub limits: Option<Limits>,
    /// The largest datagram forwarded, in bytes (the listener's `max_rx_datagram_size`);
    /// `None` leaves sozu's 1,500.
    pub max_datagram_size: Option<u32>,
    /// As [`StreamRoute::client_auth_exempt`].
    pub client_auth_exempt: bool,
}

/// What an HTTP route has that other kinds have not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpRoute {
    /// How the route matches the request's path (`path_prefix` and its three siblings).
    pub path: PathMatch,
    /// Only requests of this method, compared as written (sozu's `method`).
    pub method: Option<String>,
    /// Only requests whose headers all match (sozu's `header_predicates`); empty for none.
    pub match_headers: Vec<HeaderMatch>,
    /// The route's own HSTS policy, overriding the workspace's; `None` follows the workspace.
    pub hsts: Option<Hsts>,
    /// Redirect, rewrites, headers, basic auth, limits, error pages; `None` for a route with
    /// none (boxed: most routes have none, and a workspace may hold ten thousand).
    pub policy: Option<Box<RoutePolicy>>,
    /// What the route's backends speak (sozu's `Cluster.http2`, which its health probe follows
    /// too).
    pub upstream_protocol: UpstreamProtocol,
    /// A client that got a response keeps to its backend (sozu's `Cluster.sticky_session`): sozu
    /// answers with its listener's cookie naming the backend, and a request carrying it goes
    /// there while that backend is in the cluster.
    pub sticky: bool,
}

/// How an HTTP route matches the request's path: the workspace's four path fields. sozu sees
/// the path with its query string (measured, docs/contract.md, "Matching"), so each is turned
/// into the sozu rule ([`PathRule`]) that means what the field says, whatever query follows.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PathMatch {
    /// `path_prefix`: the path starts with this text (sozu PREFIX): `/v2` matches `/v2example`.
    Prefix(String),
    /// `path_segment_prefix`: this path or one below it, segment by segment (`/v2` matches
    /// `/v2` and `/v2/x`, not `/v2example`); a trailing `/` is not part of it.
    SegmentPrefix(String),
    /// `path_exact`: exactly this path.
    Exact(String),
    /// `path_regex`: a regular expression the whole path, query string included, matches.
    Regex(String),
}

/// How sozu 2.3.3 matches a path (`PathRuleKind` in `command.proto`). Ordered as sozu orders
/// the keys of a host's frontends (`=`, `P`, `R`): see [`PathRule::sozu_key`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PathKind {
    Equals,
    Prefix,
    Regex,
}

/// A path rule as sozu holds it: its kind and its text.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct PathRule {
    pub kind: PathKind,
    pub value: String,
}

impl PathRule {
    pub fn prefix(value: &str) -> PathRule {
        PathRule {
            kind: PathKind::Prefix,
            value: value.to_owned(),
        }
    }

    /// The path part of the key sozu 2.3.3 files the frontend under (`RequestHttpFrontend`'s
    /// `Display`, `command/src/request.rs`): `P/v2`, `R^/v2$`, `=/v2`.
    pub fn sozu_key(&self) -> String {
        let kind = match self.kind {
            PathKind::Prefix => 'P',
            PathKind::Regex => 'R',
            PathKind::Equals => '=',
        };
        format!("{kind}{}", self.value)
    }
}

impl PathMatch {
    /// The sozu rule that means what the field says. sozu anchors a regex at both ends
    /// (`anchored_regex` in sozu-lib 2.3.3's `router/mod.rs`), and the path it matches carries the
    /// query string: an exact path is the path, then an optional query; a segment prefix is the
    /// path, then nothing, a `/` or a query. Both are regexes, not sozu's EQUALS, which would
    /// miss `/v2?page=2`; see docs/contract.md, "Matching", for what that does to precedence.
    pub fn rule(&self) -> PathRule {
        let pattern = |value: String| PathRule {
            kind: PathKind::Regex,
            value,
        };
        match self {
            PathMatch::Prefix(prefix) => PathRule::prefix(prefix),
            PathMatch::SegmentPrefix(path) => match path.trim_end_matches('/') {
                // Every path is below `/`.
                "" => PathRule::prefix("/"),
                path => pattern(format!("^{}(?:[/?].*)?$", regex::escape(path))),
            },
            PathMatch::Exact(path) => pattern(format!("^{}(?:\\?.*)?$", regex::escape(path))),
            PathMatch::Regex(regex) => pattern(regex.clone()),
        }
    }

    /// The field that sets it, as the workspace names it.
    pub fn field(&self) -> &'static str {
        match self {
            PathMatch::Prefix(_) => "path_prefix",
            PathMatch::SegmentPrefix(_) => "path_segment_prefix",
            PathMatch::Exact(_) => "path_exact",
            PathMatch::Regex(_) => "path_regex",
        }
    }

    /// The value as written.
    pub fn value(&self) -> &str {
        match self {
            PathMatch::Prefix(v)
            | PathMatch::SegmentPrefix(v)
            | PathMatch::Exact(v)
            | PathMatch::Regex(v) => v,
        }
    }

    /// How the status shows it: a prefix as it is (`/v2`, as before the other fields existed),
    /// the others after a word (`exact /v2`, `segments /v2`, `regex ^/v[0-9]+/`), which no
    /// prefix starts with.
    pub fn label(&self) -> String {
        match self {
            PathMatch::Prefix(v) => v.clone(),
            PathMatch::SegmentPrefix(v) => format!("segments {v}"),
            PathMatch::Exact(v) => format!("exact {v}"),
            PathMatch::Regex(v) => format!("regex {v}"),
        }
    }
}

/// One of a route's `match_headers`: a header the request must carry, and how its value is
/// tested. The name is kept lowercase: sozu compares names case-insensitively and files a
/// frontend under the lowercase name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct HeaderMatch {
    pub name: String,
    pub test: HeaderTest,
}

/// How a header's value is tested (sozu's `HeaderMatchKind`). Ordered as sozu numbers the
/// kinds (`EXACT`, `REGEX`, `PRESENT`), which its frontend key sorts by.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HeaderTest {
    /// The first value of the header is exactly this.
    Exact(String),
    /// The first value of the header matches this regular expression whole.
    Regex(String),
    /// The request carries the header, whatever its value.
    Present,
}

impl HeaderMatch {
    /// As the status shows it: `x-canary="1"`, `x-env=~"stag.*"`, `x-debug`. A name holds no
    /// `=` or `"`, so no two matches read alike.
    pub fn label(&self) -> String {
        match &self.test {
            HeaderTest::Exact(v) => format!("{}={v:?}", self.name),
            HeaderTest::Regex(v) => format!("{}=~{v:?}", self.name),
            HeaderTest::Present => self.name.clone(),
        }
    }
}

/// What an HTTP route's backends speak. Whatever the client speaks to sozu (HTTP/1.1 or h2,
/// `listeners.http2`), sozu speaks this to the backend.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum UpstreamProtocol {
    #[default]
    Http1,
    /// HTTP/2 in clear text with prior knowledge (RFC 9113 §3.3): gRPC servers, h2c-only
    /// services.
    H2c,
}

impl UpstreamProtocol {
    fn is_default(&self) -> bool {
        *self == UpstreamProtocol::Http1
    }
}

impl fmt::Display for UpstreamProtocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            UpstreamProtocol::Http1 => "http1",
            UpstreamProtocol::H2c => "h2c",
        })
    }
}

/// A route as the normalised JSON writes it (and the sandbox's report carries it): one flat
/// record, its `kind` naming the kind, with the fields that kind has. Flat as it always was, and
/// without serde's `flatten`, which buffers every route and reads no map with numbered keys (a
/// route's error pages).
#[derive(Serialize, Deserialize)]
struct FlatRoute {
    id: String,
    host: String,
    kind: KindName,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    path_prefix: Option<String>,
    /// The other path fields, the method and the header matches: written when given, so the
    /// JSON of a route matched by its prefix alone stays as it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    path_segment_prefix: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    path_exact: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    path_regex: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    method: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    match_headers: Vec<HeaderMatch>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    listen_port: Option<u16>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    proxy_protocol: bool,
    /// A route of its own port's limits (an HTTP route's are in its `policy`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    limits: Option<Limits>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_datagram_size: Option<u32>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    client_auth_exempt: bool,
    upstreams: Vec<RouteUpstream>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    health: Option<HealthCheck>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    hsts: Option<Hsts>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    policy: Option<Box<RoutePolicy>>,
    /// Written when not HTTP/1.1, so the JSON of every other route stays as it was.
    #[serde(default, skip_serializing_if = "UpstreamProtocol::is_default")]
    upstream_protocol: UpstreamProtocol,
    /// Written when given, so the JSON of every other route stays as it was.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    sticky: bool,
    #[serde(default, skip_serializing_if = "Balancing::is_default")]
    balancing: Balancing,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum KindName {
    Http,
    Tcp,
    TlsPassthrough,
    Udp,
}

impl From<Route> for FlatRoute {
    fn from(route: Route) -> FlatRoute {
        let mut flat = FlatRoute {
            id: route.id,
            host: route.host,
            kind: KindName::Http,
            path_prefix: None,
            path_segment_prefix: None,
            path_exact: None,
            path_regex: None,
            method: None,
            match_headers: Vec::new(),
            listen_port: None,
            proxy_protocol: false,
            limits: None,
            max_datagram_size: None,
            client_auth_exempt: false,
            upstreams: route.upstreams,
            health: route.health,
            hsts: None,
            policy: None,
            upstream_protocol: UpstreamProtocol::Http1,
            sticky: false,
            balancing: route.balancing,
        };
        match route.kind {
            RouteKind::Http(http) => {
                match http.path {
                    PathMatch::Prefix(v) => flat.path_prefix = Some(v),
                    PathMatch::SegmentPrefix(v) => flat.path_segment_prefix = Some(v),
                    PathMatch::Exact(v) => flat.path_exact = Some(v),
                    PathMatch::Regex(v) => flat.path_regex = Some(v),
                }
                flat.method = http.method;
                flat.match_headers = http.match_headers;
                flat.hsts = http.hsts;
                flat.policy = http.policy;
                flat.upstream_protocol = http.upstream_protocol;
                flat.sticky = http.sticky;
            }
            RouteKind::Tcp(stream) => {
                flat.kind = KindName::Tcp;
                flat.listen_port = Some(stream.listen_port);
                flat.proxy_protocol = stream.proxy_protocol;
                flat.limits = stream.limits;
                flat.client_auth_exempt = stream.client_auth_exempt;
            }
            RouteKind::TlsPassthrough(stream) => {
                flat.kind = KindName::TlsPassthrough;
                flat.listen_port = Some(stream.listen_port);
                flat.proxy_protocol = stream.proxy_protocol;
                flat.limits = stream.limits;
                flat.client_auth_exempt = stream.client_auth_exempt;
            }
            RouteKind::Udp(udp) => {
                flat.kind = KindName::Udp;
                flat.listen_port = Some(udp.listen_port);
                flat.limits = udp.limits;
                flat.max_datagram_size = udp.max_datagram_size;
                flat.client_auth_exempt = udp.client_auth_exempt;
            }
        }
        flat
    }
}

impl TryFrom<FlatRoute> for Route {
    type Error = String;

    fn try_from(flat: FlatRoute) -> Result<Route, String> {
        let id = flat.id.clone();
        let listen_port = || {
            flat.listen_port
                .ok_or_else(|| format!("route `{id}`: a route of its own port has a listen_port"))
        };
        let stream = || -> Result<StreamRoute, String> {
            Ok(StreamRoute {
                listen_port: listen_port()?,
                proxy_protocol: flat.proxy_protocol,
                limits: flat.limits,
                client_auth_exempt: flat.client_auth_exempt,
            })
        };
        let path = match (
            flat.path_prefix.clone(),
            flat.path_segment_prefix.clone(),
            flat.path_exact.clone(),
            flat.path_regex.clone(),
        ) {
            (Some(v), None, None, None) => Some(PathMatch::Prefix(v)),
            (None, Some(v), None, None) => Some(PathMatch::SegmentPrefix(v)),
            (None, None, Some(v), None) => Some(PathMatch::Exact(v)),
            (None, None, None, Some(v)) => Some(PathMatch::Regex(v)),
            (None, None, None, None) => None,
            _ => return Err(format!("route `{id}`: one path field at most")),
        };
        let kind = match flat.kind {
            KindName::Http => RouteKind::Http(HttpRoute {
                path: path
                    .ok_or_else(|| format!("route `{id}`: an http route has a path field"))?,
                method: flat.method.clone(),
                match_headers: flat.match_headers.clone(),
                hsts: flat.hsts,
                policy: flat.policy.clone(),
                upstream_protocol: flat.upstream_protocol,
                sticky: flat.sticky,
            }),
            KindName::Tcp => RouteKind::Tcp(stream()?),
            KindName::TlsPassthrough => RouteKind::TlsPassthrough(stream()?),
            KindName::Udp => RouteKind::Udp(UdpRoute {
                listen_port: listen_port()?,
                limits: flat.limits,
                max_datagram_size: flat.max_datagram_size,
                client_auth_exempt: flat.client_auth_exempt,
            }),
        };
        Ok(Route {
            id: flat.id,
            host: flat.host,
            kind,
            upstreams: flat.upstreams,
            health: flat.health,
            balancing: flat.balancing,
        })
    }
}

/// One upstream of a route, with its share of the traffic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteUpstream {
    pub upstream: Upstream,
    pub weight: u32,
    /// Out of rotation: no new request goes to it, the ones in flight finish. The route's own
    /// `drain` drains every upstream.
    pub drain: bool,
}

/// The policy of a route without one.
fn no_policy() -> &'static RoutePolicy {
    static NONE: std::sync::OnceLock<RoutePolicy> = std::sync::OnceLock::new();
    NONE.get_or_init(RoutePolicy::default)
}

impl HttpRoute {
    /// [`Route::place`] of an HTTP route.
    pub fn place(&self) -> String {
        let mut place = self.path.label();
        if let Some(method) = &self.method {
            place.push_str(" method ");
            place.push_str(method);
        }
        for header in &self.match_headers {
            place.push_str(" header ");
            place.push_str(&header.label());
        }
        place
    }

    /// Whether the route matches by its path prefix alone, as every route did before the other
    /// path fields, `method` and `match_headers`: its id and its status stay as they were.
    pub fn prefix_only(&self) -> bool {
        matches!(self.path, PathMatch::Prefix(_))
            && self.method.is_none()
            && self.match_headers.is_empty()
    }

    /// The route's policy, or none.
    pub fn policy(&self) -> &RoutePolicy {
        match self.policy.as_deref() {
            Some(policy) => policy,
            None => no_policy(),
        }
    }
}

impl Route {
    /// An HTTP route at `path_prefix` of `host` to `upstreams`, with no health check, HSTS of
    /// its own or policy.
    pub fn http(host: &str, path_prefix: &str, upstreams: Vec<RouteUpstream>) -> Route {
        Route {
            id: route_id(host, path_prefix),
            host: host.to_owned(),
            upstreams,
            health: None,
            balancing: Balancing::RoundRobin,
            kind: RouteKind::Http(HttpRoute {
                path: PathMatch::Prefix(path_prefix.to_owned()),
                method: None,
                match_headers: Vec::new(),
                hsts: None,
                policy: None,
                upstream_protocol: UpstreamProtocol::Http1,
                sticky: false,
            }),
        }
    }

    /// The route's policies in one line, as the status shows them: its route policy's, then
    /// how its backends are picked when that is not sozu's default (`sticky`, `balancing`).
    pub fn policy_summary(&self) -> String {
        let mut parts = vec![self.policy().summary(self.path_prefix())];
        if matches!(&self.kind, RouteKind::Http(http) if http.sticky) {
            parts.push("sticky".into());
        }
        if !self.balancing.is_default() {
            parts.push(format!("balancing {}", self.balancing));
        }
        parts.retain(|p| !p.is_empty());
        parts.join(", ")
    }

    /// What the route's backends speak; HTTP/1.1 for a kind whose backends sozu does not speak
    /// HTTP to.
    pub fn upstream_protocol(&self) -> UpstreamProtocol {
        match &self.kind {
            RouteKind::Http(http) => http.upstream_protocol,
            RouteKind::Tcp(_) | RouteKind::TlsPassthrough(_) | RouteKind::Udp(_) => {
                UpstreamProtocol::Http1
            }
        }
    }

    /// An HTTP route's `path_prefix`; empty for a route matched another way, or of its own
    /// port.
    pub fn path_prefix(&self) -> &str {
        match &self.kind {
            RouteKind::Http(HttpRoute {
                path: PathMatch::Prefix(prefix),
                ..
            }) => prefix,
            RouteKind::Http(_)
            | RouteKind::Tcp(_)
            | RouteKind::TlsPassthrough(_)
            | RouteKind::Udp(_) => "",
        }
    }

    /// How a message writes the route after its host: its prefix (`/api`), as before routes
    /// had other matches; else a space and [`Route::place`].
    pub fn match_label(&self) -> String {
        match &self.kind {
            RouteKind::Http(http) if !http.prefix_only() => format!(" {}", http.place()),
            _ => self.path_prefix().to_owned(),
        }
    }

    /// The connection limits sozu applies to the route's clients: an HTTP route's policy's, or
    /// those of a route of its own port.
    pub fn limits(&self) -> Option<&Limits> {
        match &self.kind {
            RouteKind::Http(http) => http.policy().limits.as_ref(),
            RouteKind::Tcp(stream) | RouteKind::TlsPassthrough(stream) => stream.limits.as_ref(),
            RouteKind::Udp(udp) => udp.limits.as_ref(),
        }
    }

    /// The port of the ingress a route of its own port listens on.
    pub fn listen_port(&self) -> Option<u16> {
        match &self.kind {
            RouteKind::Http(_) => None,
            RouteKind::Tcp(stream) | RouteKind::TlsPassthrough(stream) => Some(stream.listen_port),
            RouteKind::Udp(udp) => Some(udp.listen_port),
        }
    }

    /// A route of its own port that says it is open to clients without a client certificate
    /// (`client_auth_exempt`): sozu checks none there, whatever `listeners.client_auth` says.
    pub fn client_auth_exempt(&self) -> bool {
        match &self.kind {
            RouteKind::Http(_) => false,
            RouteKind::Tcp(stream) | RouteKind::TlsPassthrough(stream) => stream.client_auth_exempt,
            RouteKind::Udp(udp) => udp.client_auth_exempt,
        }
    }

    /// The kind's name, as the contract's `protocol` and the status write it.
    pub fn protocol(&self) -> &'static str {
        match &self.kind {
            RouteKind::Http(_) => "https",
            RouteKind::Tcp(_) => "tcp",
            RouteKind::TlsPassthrough(_) => "tls_passthrough",
            RouteKind::Udp(_) => "udp",
        }
    }

    /// What tells the route apart from its host's others, for ordering them and keying the
    /// status: an HTTP route's path ([`PathMatch::label`]: `/…` for a prefix) with its method
    /// and header matches (`/api method POST header x-canary=1`), else its protocol and port
    /// (`tcp:2222`), which sort after every path.
    pub fn place(&self) -> String {
        match (&self.kind, self.listen_port()) {
            (RouteKind::Http(http), _) => http.place(),
            (_, Some(port)) => format!("{}:{port}", self.protocol()),
            (_, None) => String::new(),
        }
    }

    /// The route's own HSTS policy, overriding the workspace's; `None` follows the workspace (and
    /// a kind sozu sends no HTTP response for has none).
    pub fn hsts(&self) -> Option<Hsts> {
        match &self.kind {
            RouteKind::Http(http) => http.hsts,
            RouteKind::Tcp(_) | RouteKind::TlsPassthrough(_) | RouteKind::Udp(_) => None,
        }
    }

    /// The route's policies (redirect, rewrites, headers, basic auth, limits, error pages), or
    /// none: a kind sozu does not apply them to has none.
    pub fn policy(&self) -> &RoutePolicy {
        match &self.kind {
            RouteKind::Http(http) => http.policy(),
            RouteKind::Tcp(_) | RouteKind::TlsPassthrough(_) | RouteKind::Udp(_) => no_policy(),
        }
    }

    /// Whether sozu terminates TLS for the route with its host's certificate: the agent then
    /// watches (or orders) the host's pair, and holds the route back until it has a good one.
    pub fn terminates_tls(&self) -> bool {
        match &self.kind {
            RouteKind::Http(_) => true,
            RouteKind::Tcp(_) | RouteKind::TlsPassthrough(_) | RouteKind::Udp(_) => false,
        }
    }

    /// The route's upstreams that are names to resolve.
    pub fn upstream_names(&self) -> impl Iterator<Item = &str> {
        self.upstreams.iter().filter_map(|u| match &u.upstream {
            Upstream::Dns { name, .. } => Some(name.as_str()),
            _ => None,
        })
    }

    /// How the route's upstreams read in status: `a:80`, or `a:80 (×9), b:80 (×1, drained)`.
    pub fn upstreams_label(&self) -> String {
        if let Some(redirect) = self.policy().redirect.as_ref() {
            return format!("redirect {} {}", redirect.status, redirect.location_label());
        }
        // What the backends speak, when it is not HTTP/1.1.
        let speaks = match self.upstream_protocol() {
            UpstreamProtocol::Http1 => "",
            UpstreamProtocol::H2c => " (h2c)",
        };
        if let [only] = &self.upstreams[..] {
            if only.weight == 1 && !only.drain {
                return format!("{}{speaks}", only.upstream);
            }
        }
        let list = self
            .upstreams
            .iter()
            .map(|u| {
                let drain = if u.drain { ", drained" } else { "" };
                format!("{} (×{}{drain})", u.upstream, u.weight)
            })
            .collect::<Vec<_>>()
            .join(", ");
        format!("{list}{speaks}")
    }
}

#[cfg(test)]
impl Route {
    /// The HTTP parts of a route a test built as one.
    pub(crate) fn http_mut(&mut self) -> &mut HttpRoute {
        match &mut self.kind {
            RouteKind::Http(http) => http,
            _ => panic!("a test built {} as an HTTP route", self.id),
        }
    }
}

/// Where a route's traffic goes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Upstream {
    /// A DNS name, resolved (and re-resolved) to every A and AAAA address.
    Dns { name: String, port: u16 },
    /// An IP literal.
    Ip { address: SocketAddr },
    /// A UNIX socket; the path is absolute.
    Unix { path: PathBuf },
}

impl fmt::Display for Upstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Upstream::Dns { name, port } => write!(f, "{name}:{port}"),
            Upstream::Ip { address } => write!(f, "{address}"),
            Upstream::Unix { path } => write!(f, "unix://{}", path.display()),
        }
    }
}

/// An HSTS policy (RFC 6797) as sozu applies it: a `Strict-Transport-Security` header on every
/// HTTPS response, unless the backend sends its own. `enabled = false` on a frontend turns off
/// the listener's policy for that frontend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Hsts {
    pub enabled: bool,
    pub max_age: u32,
    pub include_subdomains: bool,
    pub preload: bool,
}

impl Hsts {
    /// The header value a client receives, or `None` when the policy is off.
    pub fn header(&self) -> Option<String> {
        if !self.enabled {
            return None;
        }
        let mut value = format!("max-age={}", self.max_age);
        if self.include_subdomains {
            value.push_str("; includeSubDomains");
        }
        if self.preload {
            value.push_str("; preload");
        }
        Some(value)
    }

    /// The policy that turns the listener's off for one frontend.
    pub const OFF: Hsts = Hsts {
        enabled: false,
        max_age: 0,
        include_subdomains: false,
        preload: false,
    };
}

/// A cluster's active health check, run by sozu's workers on each backend.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct HealthCheck {
    pub probe: Probe,
    /// Seconds between probes, and how long one may take.
    pub interval: u32,
    pub timeout: u32,
    /// Consecutive successes that bring a backend back, failures that take it out.
    pub healthy_threshold: u32,
    pub unhealthy_threshold: u32,
    /// The port probed instead of the backend's own.
    pub port: Option<u16>,
}

/// What a health probe does.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(tag = "mode", rename_all = "snake_case")]
pub enum Probe {
    /// `GET path`; healthy when the status is in one of the inclusive ranges (any 2xx when
    /// there are none).
    Http {
        path: String,
        accepted_statuses: Vec<(u16, u16)>,
    },
    /// Healthy when a TCP connection is established.
    Tcp,
}

/// Prefix of every cluster id the agent creates: the mark of what it owns in sozu.
pub const ID_PREFIX: &str = "pi-";

/// `pi-<host>-<protocol>-<port>` for a route of its own port (`pi-git.in.example.org-tcp-2222`).
pub fn port_route_id(host: &str, protocol: &str, port: u16) -> String {
    format!("{ID_PREFIX}{host}-{protocol}-{port}")
}

/// The id of an HTTP route: [`route_id`] of its prefix when it matches by its prefix alone (the
/// ids of every route written before the other path fields stay as they were); else
/// `pi-<host>-<8 hex digits>` of SHA-256 over the path field, the method and the header matches,
/// one per line (no path starts with a field's name, so no such id is a prefix route's).
pub fn http_route_id(host: &str, http: &HttpRoute) -> String {
    if let (true, PathMatch::Prefix(prefix)) = (http.prefix_only(), &http.path) {
        return route_id(host, prefix);
    }
    use sha2::Digest;
    let mut text = format!("{}\n{}\n", http.path.field(), http.path.value());
    text.push_str(http.method.as_deref().unwrap_or(""));
    for header in &http.match_headers {
        let (kind, value) = match &header.test {
            HeaderTest::Exact(v) => ("exact", v.as_str()),
            HeaderTest::Regex(v) => ("regex", v.as_str()),
            HeaderTest::Present => ("present", ""),
        };
        text.push_str(&format!("\n{}\n{kind}\n{value}", header.name));
    }
    let digest = sha2::Sha256::digest(text.as_bytes());
    let short: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
    format!("{ID_PREFIX}{host}-{short}")
}

/// `pi-<host>` for the root path, `pi-<host>-<8 hex digits of SHA-256(path)>` otherwise: readable
/// in `sozu` listings, and free of the characters a path may hold.
pub fn route_id(host: &str, path_prefix: &str) -> String {
    if path_prefix == "/" {
        format!("{ID_PREFIX}{host}")
    } else {
        use sha2::Digest;
        let digest = sha2::Sha256::digest(path_prefix.as_bytes());
        let short: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
        format!("{ID_PREFIX}{host}-{short}")
    }
}
