//! The vocabulary shared by the desired state (from the workspace) and the actual state (read
//! from sozu): listeners, clusters, frontends, backends and certificates, keyed the way sozu
//! identifies them. Pure data, no I/O.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use serde::Serialize;

pub use crate::plan::route_policy::{ClusterPolicy, FrontendPolicy, HeaderEdit};
// What the workspace asks sozu to check (health) and send (HSTS), and a validated pair, are part
// of the vocabulary too; they are defined where they come from.
pub use crate::certs::{Certificate, KeyPem, Names};
pub use crate::workspace::{
    HeaderMatch, HeaderTest, HealthCheck, Hsts, Http2Offer, PathKind, PathRule, Probe,
};

/// Tag on every frontend the agent creates, so it can tell its own from an operator's.
pub const OWNER_TAG: (&str, &str) = ("managed-by", "private-ingress");
/// Tag naming the route a frontend belongs to.
pub const ROUTE_TAG: &str = "route";

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    Http,
    Https,
    /// Connections forwarded as they are: a TCP route, or TLS passed through by SNI.
    Tcp,
    Udp,
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Protocol::Http => "http",
            Protocol::Https => "https",
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
        })
    }
}

/// A frontend of a route of its own port, as sozu identifies it: its listener (protocol and
/// address) and, for TLS passed through, the host the ClientHello names. sozu cannot change one
/// in place: a changed frontend is removed and added again.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct StreamFrontend {
    /// [`Protocol::Tcp`] or [`Protocol::Udp`].
    pub protocol: Protocol,
    pub address: SocketAddr,
    /// The host a TLS ClientHello must name for the connection to be this frontend's; `None`:
    /// every connection to the listener. sozu's listener takes one kind or the other.
    pub sni: Option<String>,
    pub cluster_id: String,
    pub tags: Tags,
}

impl StreamFrontend {
    pub fn is_owned(&self) -> bool {
        self.tags.get(OWNER_TAG.0) == Some(OWNER_TAG.1)
    }
}

/// A frontend as sozu identifies it: (protocol, address, hostname, path rule, method, header
/// predicates) routes to a cluster. Ordered by hostname first, so that a host's frontends are
/// one range of a set ([`frontends_of`]): a pass about one host looks at that host's frontends
/// alone.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Frontend {
    pub hostname: String,
    pub protocol: Protocol,
    pub address: SocketAddr,
    /// The path rule: a prefix for most routes.
    pub path: PathRule,
    /// Only requests of this method; part of sozu's key for the frontend.
    pub method: Option<String>,
    /// Only requests whose headers all match, names lowercase, sorted, each once (as sozu files
    /// them); part of sozu's key for the frontend.
    pub header_predicates: Vec<HeaderMatch>,
    pub cluster_id: Option<String>,
    pub tags: Tags,
    /// The HSTS policy of this frontend when it overrides the listener's; `None` inherits it.
    /// Part of the frontend as the agent compares it: a changed override is a new frontend.
    pub hsts: Option<Hsts>,
    /// Redirect, rewrites, header edits, credentials (HTTPS frontends of routes with a policy).
    pub policy: Option<Arc<FrontendPolicy>>,
    /// Held in sozu under the host's other spelling, a first label written as a pattern
    /// (`/app/.in.example.org`), which sozu matches after the exact name: a frontend changed
    /// without a moment with none is added under the spelling its host does not use, before
    /// the one it replaces goes (see `crate::plan`, "Frontend swaps").
    pub alias: bool,
}

impl Frontend {
    /// The hostname sozu keys the frontend by: the host, or its other spelling.
    pub fn sozu_hostname(&self) -> String {
        if !self.alias {
            return self.hostname.clone();
        }
        match self.hostname.split_once('.') {
            Some((first, rest)) => format!("/{first}/.{rest}"),
            None => format!("/{}/", self.hostname),
        }
    }

    /// A host and whether it is the other spelling, from the hostname sozu lists.
    pub fn parse_sozu_hostname(name: &str) -> (String, bool) {
        if let Some(pattern) = name.strip_prefix('/') {
            if let Some((first, rest)) = pattern.split_once('/') {
                let plain = first.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
                if plain && (rest.is_empty() || rest.starts_with('.')) {
                    return (format!("{first}{rest}"), true);
                }
            }
        }
        (name.to_owned(), false)
    }

    /// What sozu 2.3.3 files the frontend under beside its address and hostname
    /// (`RequestHttpFrontend`'s `Display`, `command/src/request.rs`): `P/v2`, `P/v2;GET`,
    /// `R^/v2$;H0:"x-canary"="1"`. sozu refuses a second frontend under a key it holds, and
    /// replays a host's frontends to a restarted worker in the order of these keys.
    pub fn match_key(&self) -> String {
        let mut key = self.path.sozu_key();
        if let Some(method) = &self.method {
            key.push(';');
            key.push_str(method);
        }
        for predicate in &self.header_predicates {
            let (kind, value) = match &predicate.test {
                HeaderTest::Exact(v) => (0, Some(v)),
                HeaderTest::Regex(v) => (1, Some(v)),
                HeaderTest::Present => (2, None),
            };
            key.push_str(&format!(";H{kind}:{:?}", predicate.name));
            if let Some(value) = value {
                key.push_str(&format!("={value:?}"));
            }
        }
        key
    }

    /// How a summary writes the frontend's match after its hostname: its prefix (`/api`), as
    /// before frontends had other rules; else a space and [`Frontend::match_key`].
    pub fn match_label(&self) -> String {
        if self.prefix_only() {
            self.path.value.clone()
        } else {
            format!(" {}", self.match_key())
        }
    }

    /// Whether sozu matches `self` and `other` alike (same path rule, method and header
    /// predicates), under whichever spelling.
    pub fn same_match(&self, other: &Frontend) -> bool {
        self.path == other.path
            && self.method == other.method
            && self.header_predicates == other.header_predicates
    }

    /// Whether sozu matches the frontend by its path prefix alone: two such frontends of one
    /// host never tie for a request (the longer prefix wins), so the order sozu holds them in
    /// does not matter. Any other frontend may tie with another, and sozu then serves the
    /// later one it holds (see `crate::plan`, "Frontend order").
    pub fn prefix_only(&self) -> bool {
        self.path.kind == PathKind::Prefix
            && self.method.is_none()
            && self.header_predicates.is_empty()
    }

    /// The same frontend under the other spelling, or this one.
    pub fn spelled(&self, alias: bool) -> Frontend {
        Frontend {
            alias,
            ..self.clone()
        }
    }

    /// [`Frontend::spelled`], sharing `frontend` itself when it is spelled so already.
    pub fn spelled_shared(frontend: &Arc<Frontend>, alias: bool) -> Arc<Frontend> {
        if frontend.alias == alias {
            Arc::clone(frontend)
        } else {
            Arc::new(frontend.spelled(alias))
        }
    }
}

impl Frontend {
    pub fn is_owned(&self) -> bool {
        self.tags.get(OWNER_TAG.0) == Some(OWNER_TAG.1)
    }
}

/// Whether a certificate naming `names` is the agent's: every name in the workspace zone (a
/// certificate carries no tag; its names are what tell).
pub fn owned_certificate(names: &[String], zone: &str) -> bool {
    !names.is_empty()
        && names
            .iter()
            .all(|n| in_zone(n.trim_start_matches("*."), zone))
}

/// The frontends of `host` in `set`: one range, thanks to the order of [`Frontend`].
pub fn frontends_of<'a>(
    set: &'a BTreeSet<Arc<Frontend>>,
    host: &'a str,
) -> impl Iterator<Item = &'a Arc<Frontend>> + 'a {
    let first = Frontend {
        hostname: host.to_owned(),
        protocol: Protocol::Http,
        address: SocketAddr::from(([0, 0, 0, 0], 0)),
        path: PathRule {
            kind: PathKind::Equals,
            value: String::new(),
        },
        method: None,
        header_predicates: Vec::new(),
        cluster_id: None,
        tags: Tags::default(),
        hsts: None,
        policy: None,
        alias: false,
    };
    set.range::<Frontend, _>(first..)
        .take_while(move |f| f.hostname == host)
}

/// A frontend's tags, sorted by name, each name once. A shared list rather than a map: a
/// frontend has two tags, a map's first node has room for eleven (over 500 bytes), and the agent
/// keeps every frontend of sozu's state in memory (20,000 at 10,000 routes). A route's frontends
/// share one list, and the agent's own tag names and mark are one copy for all.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Tags(Arc<[(Arc<str>, Arc<str>)]>);

impl Tags {
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .binary_search_by(|(n, _)| (**n).cmp(name))
            .ok()
            .map(|i| &*self.0[i].1)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(n, v)| (&**n, &**v))
    }
}

/// The one copy of a text every frontend of the agent's tags with ([`OWNER_TAG`], [`ROUTE_TAG`]),
/// or `text` itself.
fn tag_text(text: String) -> Arc<str> {
    static COMMON: std::sync::LazyLock<[Arc<str>; 3]> =
        std::sync::LazyLock::new(|| [OWNER_TAG.0.into(), OWNER_TAG.1.into(), ROUTE_TAG.into()]);
    match COMMON.iter().find(|common| ***common == *text) {
        Some(common) => Arc::clone(common),
        None => text.into(),
    }
}

/// As a map would: a name given twice keeps its last value.
impl FromIterator<(String, String)> for Tags {
    fn from_iter<I: IntoIterator<Item = (String, String)>>(tags: I) -> Tags {
        let map: BTreeMap<String, String> = tags.into_iter().collect();
        Tags(
            map.into_iter()
                .map(|(n, v)| (tag_text(n), tag_text(v)))
                .collect(),
        )
    }
}

impl Serialize for Tags {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.iter())
    }
}

/// A backend of a cluster, identified within it by `id`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Backend {
    pub id: String,
    pub address: Address,
    /// Its share of the cluster's requests, against the other backends' weights. Never 0: sozu
    /// takes a weight of 0 for 1, so a drain takes a backend out instead.
    pub weight: u32,
}

impl Backend {
    /// What the sticky-session cookie names this backend by (sozu's `AddBackend.sticky_id`): a
    /// digest of its id, so the cookie a client keeps says nothing of the backend's address.
    ///
    /// Sent for every backend: sozu 2.3.3 answers a sticky cluster's client with the backend's
    /// id when it has no sticky id (`RegistrySelector::select`, lib/src/protocol/mux/mod.rs) but
    /// follows a cookie by sticky id alone (`BackendList::find_sticky`, lib/src/backends.rs), so
    /// without one every cookie it sets would name no backend and pin nothing (measured: the
    /// requests carrying it were spread over both backends).
    pub fn sticky_id(&self) -> String {
        sticky_id(&self.id)
    }
}

/// [`Backend::sticky_id`] of the backend `id`: 16 hex digits of its SHA-256.
pub fn sticky_id(id: &str) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(id.as_bytes());
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// A cluster's backends, by id: [`Backend`]s sorted by their `id`, each id once.
///
/// A list, not a map: a cluster has one backend or a few, and a `BTreeMap` of one entry is a
/// whole node of eleven (about 1.1 KB with its key copied beside the backend's own id). The
/// desired state, the shadow of sozu's and the cache of sozu's clusters each hold one per
/// cluster: at 10,000 routes that was about 30 MiB for some 3 MiB of backends.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Backends(Vec<Backend>);

impl Backends {
    fn position(&self, id: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|b| b.id.as_str().cmp(id))
    }

    pub fn get(&self, id: &str) -> Option<&Backend> {
        self.position(id).ok().map(|i| &self.0[i])
    }

    pub fn contains_key(&self, id: &str) -> bool {
        self.position(id).is_ok()
    }

    /// Adds `backend`, or replaces the one of its id; returns the one replaced.
    pub fn insert(&mut self, backend: Backend) -> Option<Backend> {
        match self.position(&backend.id) {
            Ok(i) => Some(std::mem::replace(&mut self.0[i], backend)),
            Err(i) => {
                // Grown by one, not doubled: the list is kept as long as the cluster lives.
                self.0.reserve_exact(1);
                self.0.insert(i, backend);
                None
            }
        }
    }

    pub fn remove(&mut self, id: &str) -> Option<Backend> {
        let i = self.position(id).ok()?;
        Some(self.0.remove(i))
    }

    /// The ids, in order.
    pub fn keys(&self) -> impl Iterator<Item = &String> {
        self.0.iter().map(|b| &b.id)
    }

    /// The backends, in the order of their ids.
    pub fn values(&self) -> std::slice::Iter<'_, Backend> {
        self.0.iter()
    }

    /// (id, backend), in order, as a map's iterator.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &Backend)> {
        self.0.iter().map(|b| (&b.id, b))
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// As a map would: an id given twice keeps its last backend.
impl FromIterator<Backend> for Backends {
    fn from_iter<I: IntoIterator<Item = Backend>>(backends: I) -> Backends {
        let mut list = Backends::default();
        for backend in backends {
            list.insert(backend);
        }
        list
    }
}

/// Where a backend's traffic goes.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Address {
    /// An IP address and port: what the agent sends sozu, DNS names resolved by the agent.
    Ip(SocketAddr),
    /// A UNIX socket. sozu still identifies a backend by an IP address within its cluster: the
    /// request carries [`UNIX_BACKEND_IDENTITY`] beside the path.
    Unix(PathBuf),
    /// A DNS name and port left for sozu to resolve, once, when it loads a configuration file.
    /// Only a rendered file holds one: the live path resolves names itself and sends addresses,
    /// and the socket protocol has no way to name a host.
    Name { name: String, port: u16 },
}

/// The address a unix backend is known by inside its cluster: each route has one unix backend
/// at most, so one fixed identity is enough.
pub const UNIX_BACKEND_IDENTITY: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 1);

impl fmt::Display for Address {
    /// As the workspace writes upstreams: `10.0.0.1:80`, `[fd00::1]:80`, `unix:///run/app.sock`,
    /// `svc.ns:80`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Address::Ip(address) => write!(f, "{address}"),
            Address::Unix(path) => write!(f, "unix://{}", path.display()),
            Address::Name { name, port } => write!(f, "{name}:{port}"),
        }
    }
}

/// A listener's settings beyond its address and its HSTS, as the agent sets them and as sozu
/// reports them. sozu changes `expect_proxy` and the timeouts on a running listener; the
/// interface, the TLS versions and client authentication are set when it is made.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ListenerSettings {
    pub interface: Option<String>,
    /// HTTPS: TLS 1.3 only (else 1.2 and 1.3).
    pub tls13_only: bool,
    pub expect_proxy: bool,
    /// Seconds: front, back, connect, request.
    pub timeouts: [u32; 4],
    /// HTTPS: client certificates, when asked for.
    pub client_auth: Option<ClientAuthState>,
    /// HTTPS: whether HTTP/2 is offered in ALPN (sozu's `alpn_protocols` and `disable_http11`,
    /// both changed on a running listener). The HTTP listener speaks HTTP/1.1 alone: sozu 2.3.3
    /// takes no h2c from clients.
    pub http2: Http2Offer,
    /// UDP: the largest datagram forwarded, in bytes (`max_rx_datagram_size`, changed on a
    /// running listener); 0 on the others.
    pub max_datagram_size: u32,
}

/// Client certificates on an HTTPS listener: the mode and the PEMs sozu checks them against.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ClientAuthState {
    /// Required; else optional.
    pub required: bool,
    /// The CA's certificates, PEM each.
    pub cas: Vec<String>,
    /// The CRLs, PEM each.
    pub crls: Vec<String>,
}

impl ClientAuthState {
    /// The same mode and material, whitespace around each PEM aside (sozu stores them as sent).
    pub fn same_as(&self, other: &ClientAuthState) -> bool {
        let trimmed = |v: &[String]| v.iter().map(|p| p.trim().to_owned()).collect::<Vec<_>>();
        self.required == other.required
            && trimmed(&self.cas) == trimmed(&other.cas)
            && trimmed(&self.crls) == trimmed(&other.crls)
    }
}

/// The idle time of a UDP flow, client side and backend side, in seconds: sozu 2.3.3's own
/// (`UdpListenerConfig`). The workspace's listener timeouts are for connections.
pub const UDP_FLOW_TIMEOUTS: [u32; 2] = [30, 30];

/// The largest datagram a UDP listener forwards unless its route says otherwise: sozu 2.3.3's
/// own (`UdpListenerConfig.max_rx_datagram_size`); a larger one is dropped and counted
/// (`udp.datagrams.dropped.truncated`).
pub const UDP_DATAGRAM_SIZE: u32 = 1500;

impl ListenerSettings {
    /// What a listener of `protocol` holds of these settings, as sozu reports it: the TLS ones
    /// on HTTPS only, the request timeout on HTTP(S) only (sozu reports 0 elsewhere), and on UDP
    /// the interface and sozu's flow timeouts alone.
    pub fn for_protocol(&self, protocol: Protocol) -> ListenerSettings {
        let [front, back, connect, _] = self.timeouts;
        match protocol {
            Protocol::Https => self.clone(),
            Protocol::Http => ListenerSettings {
                tls13_only: false,
                client_auth: None,
                ..self.clone()
            },
            Protocol::Tcp => ListenerSettings {
                tls13_only: false,
                client_auth: None,
                timeouts: [front, back, connect, 0],
                ..self.clone()
            },
            Protocol::Udp => ListenerSettings {
                interface: self.interface.clone(),
                timeouts: [UDP_FLOW_TIMEOUTS[0], UDP_FLOW_TIMEOUTS[1], 0, 0],
                max_datagram_size: UDP_DATAGRAM_SIZE,
                ..ListenerSettings::default()
            },
        }
    }

    /// What sozu can change on a running listener of `protocol` differs.
    pub fn patchable_differs(&self, other: &ListenerSettings, protocol: Protocol) -> bool {
        self.expect_proxy != other.expect_proxy
            || self.timeouts != other.timeouts
            || self.max_datagram_size != other.max_datagram_size
            || (protocol == Protocol::Https && self.http2 != other.http2)
    }

    /// What only a new listener can change differs: the names of those settings.
    pub fn fixed_differences(
        &self,
        other: &ListenerSettings,
        protocol: Protocol,
    ) -> Vec<&'static str> {
        let mut fixed = Vec::new();
        if self.interface != other.interface {
            fixed.push("interface");
        }
        if protocol == Protocol::Https && self.tls13_only != other.tls13_only {
            fixed.push("min_tls_version");
        }
        fixed
    }
}

/// What the workspace asks sozu to hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Desired {
    /// Listeners by address.
    pub listeners: BTreeMap<SocketAddr, Protocol>,
    /// The settings of both listeners (the TLS ones apply to the HTTPS listener only).
    pub listener_settings: ListenerSettings,
    /// With client certificates asked for: whether their CA and CRLs are known (each file read
    /// and valid once). Until they are, the HTTPS listener's client certificates in sozu are
    /// left as they are, and no HTTPS listener is made.
    pub client_auth_known: bool,
    /// Cluster id → its backends by backend id.
    pub clusters: BTreeMap<String, Backends>,
    /// Cluster id → its health check, for the clusters that have one.
    pub health_checks: BTreeMap<String, HealthCheck>,
    /// Cluster id → its credentials, limits and error pages, for the clusters that have some.
    pub cluster_policies: BTreeMap<String, Arc<ClusterPolicy>>,
    /// The listeners' error pages (the workspace's `error_pages`), by status.
    pub listener_answers: BTreeMap<String, Arc<str>>,
    /// Clusters whose responses carry an HSTS header that sozu adds. A drain there takes the
    /// backend out without closing its sessions: sozu 2.3.3 writes the header before the status
    /// line of a response in flight on a session it was told to close, and the client gets a
    /// broken response. Keep-alive clients still move: sozu picks a backend for each request.
    pub hsts_clusters: BTreeSet<String>,
    /// Cluster id → the ids of the backends its drained upstreams stand for, for the HTTP
    /// clusters that have some. Only these backends' sessions are closed when they leave the
    /// cluster: a drain is the operator taking the upstream out. A route of its own port has
    /// none: its sessions are an SSH session or a database's connections, which a drain lets go
    /// on until they close. A backend that leaves because its name no
    /// longer resolves to it, or an edit replaced its upstream, keeps its sessions until they
    /// end: an open WebSocket or event stream goes on, and sozu never reuses a connection to a
    /// retired backend for a new request (`Router::with_backend_retired`,
    /// `lib/src/protocol/mux/router.rs`).
    pub drained_backends: BTreeMap<String, BTreeSet<String>>,
    /// The HTTPS listener's HSTS policy, which frontends without their own inherit.
    pub hsts: Option<Hsts>,
    /// Shared with the requests that add them and, once sozu applied those, with the shadow of
    /// sozu's state: one copy of each frontend, not one per holder.
    pub frontends: BTreeSet<Arc<Frontend>>,
    /// The frontends of the routes of their own port (TCP, TLS passed through, UDP), each on a
    /// listener of its own in [`Desired::listeners`].
    pub stream_frontends: BTreeSet<StreamFrontend>,
    /// The UDP listeners whose route sets its largest datagram, by address: the others keep
    /// [`UDP_DATAGRAM_SIZE`].
    pub datagram_sizes: BTreeMap<SocketAddr, u32>,
    /// Certificates on the HTTPS listener, one per host; see [`Desired::set_certificate`].
    certificates: BTreeMap<String, Certificate>,
    /// Certificates sozu already holds that stay as they are, by host: those of hosts whose
    /// pair the agent has not validated yet (see `crate::plan::desired`).
    kept: BTreeMap<String, Arc<str>>,
    /// How many hosts want each fingerprint (served or kept): whether one of sozu's
    /// certificates may go is one look-up, not a scan of every host. The fingerprints are the
    /// certificates' own, shared.
    wanted: BTreeMap<Arc<str>, usize>,
    /// The HTTPS listener the certificates live on.
    pub https_address: Option<SocketAddr>,
    /// Hosts the agent manages certificates for; certificates naming only hosts inside this zone
    /// on the HTTPS listener are the agent's.
    pub zone: String,
}

impl Desired {
    /// What the listener at `address`, of `protocol`, is to hold: the listeners' settings as
    /// that kind of listener holds them, and a UDP listener's largest datagram as its route
    /// says.
    pub fn listener_settings_at(
        &self,
        address: SocketAddr,
        protocol: Protocol,
    ) -> ListenerSettings {
        let mut settings = self.listener_settings.for_protocol(protocol);
        if let Some(&size) = self.datagram_sizes.get(&address) {
            if protocol == Protocol::Udp {
                settings.max_datagram_size = size;
            }
        }
        settings
    }

    /// The certificate to serve for `host`, in place of any other (served or kept).
    pub fn set_certificate(&mut self, host: &str, certificate: Certificate) {
        self.clear_certificate(host);
        self.want(&certificate.fingerprint);
        self.certificates.insert(host.to_owned(), certificate);
    }

    /// Keeps sozu's certificate `fingerprint` for `host`, in place of any other.
    pub fn keep_certificate(&mut self, host: &str, fingerprint: &Arc<str>) {
        self.clear_certificate(host);
        self.want(fingerprint);
        self.kept.insert(host.to_owned(), Arc::clone(fingerprint));
    }

    /// No certificate for `host`.
    pub fn clear_certificate(&mut self, host: &str) {
        let old = self
            .certificates
            .remove(host)
            .map(|c| c.fingerprint)
            .or_else(|| self.kept.remove(host));
        if let Some(old) = old {
            if let Some(count) = self.wanted.get_mut(&old) {
                *count -= 1;
                if *count == 0 {
                    self.wanted.remove(&old);
                }
            }
        }
    }

    fn want(&mut self, fingerprint: &Arc<str>) {
        *self.wanted.entry(Arc::clone(fingerprint)).or_default() += 1;
    }

    /// The certificates to serve, by host.
    pub fn certificates(&self) -> &BTreeMap<String, Certificate> {
        &self.certificates
    }

    /// Whether some host wants the certificate `fingerprint` (to serve, or kept as it is).
    pub fn is_wanted(&self, fingerprint: &str) -> bool {
        self.wanted.contains_key(fingerprint)
    }

    /// Every host with a certificate to serve or keep.
    pub fn hosts_with_certificates(&self) -> impl Iterator<Item = &str> {
        self.certificates
            .keys()
            .chain(self.kept.keys())
            .map(String::as_str)
    }
}

/// The certificates on one listener, by fingerprint, and by the names they cover.
///
/// The fingerprints and name lists of certificates the agent sent are those of its
/// [`Certificate`]s, shared rather than copied: at 10,000 hosts each copy of a fingerprint is
/// about a megabyte.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListenerCertificates {
    /// Fingerprint → the names it covers, sorted.
    by_fingerprint: BTreeMap<Arc<str>, Names>,
    /// Name → the fingerprints covering it: kept up to date, so that a pass about one host
    /// finds that host's certificates in one look-up instead of indexing every certificate.
    by_name: BTreeMap<String, Vec<Arc<str>>>,
}

impl ListenerCertificates {
    /// Adds a certificate; one already there under that fingerprint stays as it is. Given an
    /// `Arc` and [`Names`], it shares them.
    pub fn insert(&mut self, fingerprint: impl Into<Arc<str>>, names: impl Into<Names>) {
        let fingerprint = fingerprint.into();
        if self.by_fingerprint.contains_key(&fingerprint) {
            return;
        }
        let names = names.into();
        for name in &names {
            match self.by_name.get_mut(name.as_str()) {
                Some(fingerprints) => fingerprints.push(Arc::clone(&fingerprint)),
                None => {
                    self.by_name
                        .insert(name.clone(), vec![Arc::clone(&fingerprint)]);
                }
            }
        }
        self.by_fingerprint.insert(fingerprint, names);
    }

    pub fn remove(&mut self, fingerprint: &str) {
        let Some(names) = self.by_fingerprint.remove(fingerprint) else {
            return;
        };
        for name in names.iter() {
            if let Some(fingerprints) = self.by_name.get_mut(name) {
                fingerprints.retain(|f| **f != *fingerprint);
                if fingerprints.is_empty() {
                    self.by_name.remove(name);
                }
            }
        }
    }

    pub fn contains(&self, fingerprint: &str) -> bool {
        self.by_fingerprint.contains_key(fingerprint)
    }

    /// The names the certificate `fingerprint` is served for.
    pub fn names_of(&self, fingerprint: &str) -> Option<&Names> {
        self.by_fingerprint.get(fingerprint)
    }

    /// Every certificate: (fingerprint, names), by fingerprint.
    pub fn iter(&self) -> impl Iterator<Item = (&Arc<str>, &Names)> {
        self.by_fingerprint.iter()
    }

    /// Every name a certificate covers.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.by_name.keys().map(String::as_str)
    }

    /// The certificates covering `name` exactly (as sozu indexes them): (fingerprint, names).
    pub fn named<'a>(&'a self, name: &str) -> impl Iterator<Item = (&'a Arc<str>, &'a Names)> + 'a {
        self.by_name
            .get(name)
            .into_iter()
            .flatten()
            .filter_map(|f| self.by_fingerprint.get_key_value(f))
    }
}

/// What sozu holds, as read from its command socket.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Actual {
    /// Listener address → (protocol, active).
    pub listeners: BTreeMap<SocketAddr, (Protocol, bool)>,
    /// Each listener's settings.
    pub listener_settings: BTreeMap<SocketAddr, ListenerSettings>,
    /// Every cluster id.
    pub clusters: BTreeSet<String>,
    /// Backends of the clusters the agent owns, by cluster id then backend id.
    pub backends: BTreeMap<String, Backends>,
    /// Health checks of the clusters the agent owns, by cluster id.
    pub health_checks: BTreeMap<String, HealthCheck>,
    /// Credentials, limits and error pages of the clusters the agent owns that have some.
    pub cluster_policies: BTreeMap<String, Arc<ClusterPolicy>>,
    /// Each listener's error pages, by status.
    pub listener_answers: BTreeMap<SocketAddr, BTreeMap<String, Arc<str>>>,
    /// HSTS policy of each HTTPS listener that has one.
    pub hsts: BTreeMap<SocketAddr, Hsts>,
    /// Every HTTP and HTTPS frontend.
    pub frontends: BTreeSet<Arc<Frontend>>,
    /// Every TCP and UDP frontend.
    pub stream_frontends: BTreeSet<StreamFrontend>,
    /// Certificates by listener address.
    pub certificates: BTreeMap<SocketAddr, ListenerCertificates>,
}

/// One cluster as sozu holds it, read on its own.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterState {
    pub exists: bool,
    pub backends: Backends,
    pub health_check: Option<HealthCheck>,
    pub policy: Option<Arc<ClusterPolicy>>,
    /// Its HTTP and HTTPS frontends.
    pub frontends: Vec<Arc<Frontend>>,
}

impl Actual {
    /// What is known of cluster `id`, its frontends left out: the inverse of
    /// [`Self::replace_cluster`] for a cluster that exists.
    pub fn cluster_state(&self, id: &str) -> ClusterState {
        ClusterState {
            exists: self.clusters.contains(id),
            backends: self.backends.get(id).cloned().unwrap_or_default(),
            health_check: self.health_checks.get(id).cloned(),
            policy: self.cluster_policies.get(id).cloned(),
            frontends: Vec::new(),
        }
    }

    /// Replaces what is known of cluster `id` with `state`; `hosts` are the hosts whose
    /// frontends may route to it.
    pub fn replace_cluster(&mut self, id: &str, state: ClusterState, hosts: &[&str]) {
        if state.exists {
            self.clusters.insert(id.to_owned());
            self.backends.insert(id.to_owned(), state.backends);
        } else {
            self.clusters.remove(id);
            self.backends.remove(id);
        }
        match state.health_check {
            Some(check) => {
                self.health_checks.insert(id.to_owned(), check);
            }
            None => {
                self.health_checks.remove(id);
            }
        }
        match state.policy {
            Some(policy) => {
                self.cluster_policies.insert(id.to_owned(), policy);
            }
            None => {
                self.cluster_policies.remove(id);
            }
        }
        let stale: Vec<Arc<Frontend>> = hosts
            .iter()
            .flat_map(|host| frontends_of(&self.frontends, host))
            .filter(|f| f.cluster_id.as_deref() == Some(id))
            .cloned()
            .collect();
        for frontend in stale {
            self.frontends.remove(&frontend);
        }
        self.frontends.extend(state.frontends);
    }
}

/// True when `name` is `zone` or lies below it.
pub fn in_zone(name: &str, zone: &str) -> bool {
    name == zone
        || name
            .strip_suffix(zone)
            .is_some_and(|head| head.ends_with('.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_pem_never_prints() {
        let key = KeyPem::new("-----BEGIN PRIVATE KEY-----\nsecret\n".into());
        assert!(!format!("{key:?}").contains("secret"));
    }

    #[test]
    fn certificates_are_found_by_name_until_removed() {
        let names =
            |list: &[&str]| -> BTreeSet<String> { list.iter().map(|n| (*n).to_owned()).collect() };
        let mut held = ListenerCertificates::default();
        held.insert("aa", names(&["a.example.org", "b.example.org"]));
        held.insert("bb", names(&["b.example.org"]));
        let named = |held: &ListenerCertificates, name: &str| -> Vec<String> {
            held.named(name).map(|(f, _)| f.to_string()).collect()
        };
        assert_eq!(named(&held, "b.example.org"), ["aa", "bb"]);
        held.remove("aa");
        assert_eq!(named(&held, "b.example.org"), ["bb"]);
        assert!(named(&held, "a.example.org").is_empty());
        assert_eq!(held.iter().count(), 1);
        held.remove("bb");
        assert!(held.iter().next().is_none() && named(&held, "b.example.org").is_empty());
    }

    #[test]
    fn backends_are_kept_by_id_as_a_map_would() {
        let backend = |id: &str, weight: u32| Backend {
            id: id.to_owned(),
            address: Address::Ip(([127, 0, 0, 1], 80).into()),
            weight,
        };
        let mut list: Backends = [backend("b", 1), backend("a", 1), backend("b", 2)]
            .into_iter()
            .collect();
        assert_eq!(list.keys().collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(
            list.get("b").map(|b| b.weight),
            Some(2),
            "the last one given stays"
        );
        assert_eq!(list.insert(backend("c", 1)), None);
        assert_eq!(list.insert(backend("a", 5)).map(|b| b.weight), Some(1));
        assert_eq!(list.keys().collect::<Vec<_>>(), ["a", "b", "c"]);
        assert_eq!(list.remove("b").map(|b| b.weight), Some(2));
        assert!(list.remove("b").is_none() && !list.contains_key("b"));
        assert_eq!(list.len(), 2);
    }

    #[test]
    fn zone_membership_is_by_label() {
        assert!(in_zone("a.in.example.org", "in.example.org"));
        assert!(in_zone("in.example.org", "in.example.org"));
        assert!(!in_zone("ain.example.org", "in.example.org"));
        assert!(!in_zone("example.org", "in.example.org"));
    }
}
