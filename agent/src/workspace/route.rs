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

use super::RoutePolicy;

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
}

/// What a UDP route has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UdpRoute {
    /// The port of the ingress its clients send to, on the https listener's address.
    pub listen_port: u16,
}

/// What an HTTP route has that other kinds have not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpRoute {
    pub path_prefix: String,
    /// The route's own HSTS policy, overriding the workspace's; `None` follows the workspace.
    pub hsts: Option<Hsts>,
    /// Redirect, rewrites, headers, basic auth, limits, error pages; `None` for a route with
    /// none (boxed: most routes have none, and a workspace may hold ten thousand).
    pub policy: Option<Box<RoutePolicy>>,
    /// What the route's backends speak (sozu's `Cluster.http2`, which its health probe follows
    /// too).
    pub upstream_protocol: UpstreamProtocol,
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
    #[serde(default, skip_serializing_if = "Option::is_none")]
    listen_port: Option<u16>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    proxy_protocol: bool,
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
            listen_port: None,
            proxy_protocol: false,
            upstreams: route.upstreams,
            health: route.health,
            hsts: None,
            policy: None,
            upstream_protocol: UpstreamProtocol::Http1,
        };
        match route.kind {
            RouteKind::Http(http) => {
                flat.path_prefix = Some(http.path_prefix);
                flat.hsts = http.hsts;
                flat.policy = http.policy;
                flat.upstream_protocol = http.upstream_protocol;
            }
            RouteKind::Tcp(stream) => {
                flat.kind = KindName::Tcp;
                flat.listen_port = Some(stream.listen_port);
                flat.proxy_protocol = stream.proxy_protocol;
            }
            RouteKind::TlsPassthrough(stream) => {
                flat.kind = KindName::TlsPassthrough;
                flat.listen_port = Some(stream.listen_port);
                flat.proxy_protocol = stream.proxy_protocol;
            }
            RouteKind::Udp(udp) => {
                flat.kind = KindName::Udp;
                flat.listen_port = Some(udp.listen_port);
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
            })
        };
        let kind = match flat.kind {
            KindName::Http => RouteKind::Http(HttpRoute {
                path_prefix: flat
                    .path_prefix
                    .clone()
                    .ok_or_else(|| format!("route `{id}`: an http route has a path_prefix"))?,
                hsts: flat.hsts,
                policy: flat.policy.clone(),
                upstream_protocol: flat.upstream_protocol,
            }),
            KindName::Tcp => RouteKind::Tcp(stream()?),
            KindName::TlsPassthrough => RouteKind::TlsPassthrough(stream()?),
            KindName::Udp => RouteKind::Udp(UdpRoute {
                listen_port: listen_port()?,
            }),
        };
        Ok(Route {
            id: flat.id,
            host: flat.host,
            kind,
            upstreams: flat.upstreams,
            health: flat.health,
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
            kind: RouteKind::Http(HttpRoute {
                path_prefix: path_prefix.to_owned(),
                hsts: None,
                policy: None,
                upstream_protocol: UpstreamProtocol::Http1,
            }),
        }
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

    /// What sozu matches besides the host: an HTTP route's path prefix; empty for a route of
    /// its own port.
    pub fn path_prefix(&self) -> &str {
        match &self.kind {
            RouteKind::Http(http) => &http.path_prefix,
            RouteKind::Tcp(_) | RouteKind::TlsPassthrough(_) | RouteKind::Udp(_) => "",
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
    /// status: an HTTP route's path prefix (`/…`), else its protocol and port (`tcp:2222`),
    /// which sort after every path.
    pub fn place(&self) -> String {
        match (&self.kind, self.listen_port()) {
            (RouteKind::Http(http), _) => http.path_prefix.clone(),
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
