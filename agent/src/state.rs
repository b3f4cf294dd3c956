//! The vocabulary shared by the desired state (from the workspace) and the actual state (read
//! from sozu): listeners, clusters, frontends, backends and certificates, keyed the way sozu
//! identifies them. Pure data, no I/O.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use serde::Serialize;

/// Tag on every frontend the agent creates, so it can tell its own from an operator's.
pub const OWNER_TAG: (&str, &str) = ("managed-by", "private-ingress");
/// Tag naming the route a frontend belongs to.
pub const ROUTE_TAG: &str = "route";

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    Http,
    Https,
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Protocol::Http => "http",
            Protocol::Https => "https",
        })
    }
}

/// A frontend as sozu identifies it: (protocol, address, hostname, path prefix) routes to a
/// cluster.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Frontend {
    pub protocol: Protocol,
    pub address: SocketAddr,
    pub hostname: String,
    pub path_prefix: String,
    pub cluster_id: Option<String>,
    pub tags: Tags,
}

impl Frontend {
    pub fn is_owned(&self) -> bool {
        self.tags.get(OWNER_TAG.0) == Some(OWNER_TAG.1)
    }
}

/// A frontend's tags, sorted by name, each name once. A sorted list rather than a map: a frontend
/// has two tags, a map's first node has room for eleven (over 500 bytes), and the agent keeps
/// every frontend of sozu's state in memory (2,000 at 1,000 routes).
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Tags(Vec<(String, String)>);

impl Tags {
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .binary_search_by(|(n, _)| n.as_str().cmp(name))
            .ok()
            .map(|i| self.0[i].1.as_str())
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(n, v)| (n.as_str(), v.as_str()))
    }
}

/// As a map would: a name given twice keeps its last value.
impl FromIterator<(String, String)> for Tags {
    fn from_iter<I: IntoIterator<Item = (String, String)>>(tags: I) -> Tags {
        let map: BTreeMap<String, String> = tags.into_iter().collect();
        Tags(map.into_iter().collect())
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

/// A private key in PEM. Kept out of `Debug`, `Display` and serialisation so that it cannot
/// reach a log line, an error or a status document by accident.
#[derive(Clone, PartialEq, Eq)]
pub struct KeyPem(Arc<str>);

impl KeyPem {
    pub fn new(pem: String) -> KeyPem {
        KeyPem(pem.into())
    }

    /// The PEM text, for the one place that must send it: the request to sozu.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for KeyPem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KeyPem([redacted])")
    }
}

/// A certificate chain ready to send: leaf first. Cheap to clone (the PEM text and the names are
/// shared): the last good pair of every host is copied into each pass's desired state and plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Certificate {
    /// SHA-256 of the leaf's DER, lowercase hex: how sozu names certificates.
    pub fingerprint: String,
    /// PEM blocks, leaf first.
    pub chain: Arc<[String]>,
    pub key: KeyPem,
    /// The validity window, seconds since the epoch.
    pub not_before: i64,
    pub not_after: i64,
    /// The names it covers (SANs, or the CN when there is no SAN), as sozu indexes them.
    pub names: Arc<BTreeSet<String>>,
}

/// What the workspace asks sozu to hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Desired {
    /// Listeners by address.
    pub listeners: BTreeMap<SocketAddr, Protocol>,
    /// Cluster id → its backends by backend id.
    pub clusters: BTreeMap<String, BTreeMap<String, Backend>>,
    pub frontends: BTreeSet<Frontend>,
    /// Certificates on the HTTPS listener, one per host.
    pub certificates: BTreeMap<String, Certificate>,
    /// Fingerprints of certificates sozu already holds that stay as they are: those of hosts
    /// whose pair the agent has not validated yet (see `desired::adopt`).
    pub kept_certificates: BTreeSet<String>,
    /// The HTTPS listener the certificates live on.
    pub https_address: Option<SocketAddr>,
    /// Hosts the agent manages certificates for; certificates naming only hosts inside this zone
    /// on the HTTPS listener are the agent's.
    pub zone: String,
}

/// The certificates on one listener, by fingerprint.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListenerCertificates {
    /// Fingerprint → the names it covers, sorted. A boxed slice rather than a set: a set's first
    /// node has room for eleven names, and a certificate names one or two hosts.
    by_fingerprint: BTreeMap<String, Box<[String]>>,
}

impl ListenerCertificates {
    /// Adds a certificate; one already there under that fingerprint stays as it is.
    pub fn insert(&mut self, fingerprint: &str, names: &BTreeSet<String>) {
        if !self.by_fingerprint.contains_key(fingerprint) {
            self.by_fingerprint
                .insert(fingerprint.to_owned(), names.iter().cloned().collect());
        }
    }

    pub fn remove(&mut self, fingerprint: &str) {
        self.by_fingerprint.remove(fingerprint);
    }

    pub fn contains(&self, fingerprint: &str) -> bool {
        self.by_fingerprint.contains_key(fingerprint)
    }

    /// Every certificate: (fingerprint, names), by fingerprint.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &[String])> {
        self.by_fingerprint
            .iter()
            .map(|(f, n)| (f.as_str(), &n[..]))
    }

    /// An index by name, for a pass that looks up every route's host: scanning every
    /// certificate per route instead is quadratic in the number of routes. Built per pass rather
    /// than kept, so the shadow of sozu's state stays as small as it was.
    pub fn by_name(&self) -> NameIndex<'_> {
        let mut index: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (fingerprint, names) in &self.by_fingerprint {
            for name in names.iter() {
                index.entry(name).or_default().push(fingerprint);
            }
        }
        NameIndex {
            certificates: self,
            index,
        }
    }
}

/// [`ListenerCertificates`] by name; see [`ListenerCertificates::by_name`].
pub struct NameIndex<'a> {
    certificates: &'a ListenerCertificates,
    index: BTreeMap<&'a str, Vec<&'a str>>,
}

impl<'a> NameIndex<'a> {
    /// The certificates covering `name` exactly (as sozu indexes them): (fingerprint, names).
    pub fn named(&self, name: &str) -> impl Iterator<Item = (&'a str, &'a [String])> + '_ {
        self.index
            .get(name)
            .into_iter()
            .flatten()
            .filter_map(|f| self.certificates.by_fingerprint.get_key_value(*f))
            .map(|(f, n)| (f.as_str(), &n[..]))
    }
}

/// What sozu holds, as read from its command socket.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Actual {
    /// Listener address → (protocol, active).
    pub listeners: BTreeMap<SocketAddr, (Protocol, bool)>,
    /// Every cluster id.
    pub clusters: BTreeSet<String>,
    /// Backends of the clusters the agent owns, by cluster id then backend id.
    pub backends: BTreeMap<String, BTreeMap<String, Backend>>,
    /// Every HTTP and HTTPS frontend.
    pub frontends: BTreeSet<Frontend>,
    /// Certificates by listener address.
    pub certificates: BTreeMap<SocketAddr, ListenerCertificates>,
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
        let names = |list: &[&str]| list.iter().map(|n| (*n).to_owned()).collect();
        let mut held = ListenerCertificates::default();
        held.insert("aa", &names(&["a.example.org", "b.example.org"]));
        held.insert("bb", &names(&["b.example.org"]));
        let named = |held: &ListenerCertificates, name: &str| -> Vec<String> {
            held.by_name()
                .named(name)
                .map(|(f, _)| f.to_owned())
                .collect()
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
    fn zone_membership_is_by_label() {
        assert!(in_zone("a.in.example.org", "in.example.org"));
        assert!(in_zone("in.example.org", "in.example.org"));
        assert!(!in_zone("ain.example.org", "in.example.org"));
        assert!(!in_zone("example.org", "in.example.org"));
    }
}
