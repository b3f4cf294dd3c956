//! The requests a plan is made of ([`Op`]), what became of each ([`Outcome`]), and what each
//! concerns ([`Scope`]). Pure.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;

use std::sync::Arc;

use crate::plan::state::{
    Backend, Certificate, ClientAuthState, ClusterPolicy, Desired, Frontend, HealthCheck, Hsts,
    ListenerSettings, Protocol, StreamFrontend,
};

/// One request to sozu.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    AddListener {
        protocol: Protocol,
        address: SocketAddr,
        settings: Box<ListenerSettings>,
    },
    /// The settings sozu changes on a running listener: `expect_proxy`, the timeouts and (HTTPS)
    /// the ALPN protocols offered.
    PatchListener {
        protocol: Protocol,
        address: SocketAddr,
        settings: Box<ListenerSettings>,
    },
    ActivateListener {
        protocol: Protocol,
        address: SocketAddr,
        /// sozu keys a listener bound to an interface by its address and that interface.
        interface: Option<String>,
    },
    /// The client certificates of an HTTPS listener, replaced whole (off with `None`): new
    /// handshakes follow it, the connections already made are left alone.
    SetClientAuth {
        address: SocketAddr,
        client_auth: Option<Box<ClientAuthState>>,
    },
    /// The HSTS policy of an HTTPS listener, which its frontends without their own follow.
    SetListenerHsts {
        address: SocketAddr,
        hsts: Option<Hsts>,
    },
    /// Adds a cluster, or sets the policy of one sozu holds (sozu takes a cluster again as an
    /// update).
    AddCluster {
        id: String,
        policy: Option<Arc<ClusterPolicy>>,
    },
    /// The error pages of a listener, replaced status by status (sozu keeps a page it is not
    /// sent again: see `crate::plan`).
    SetListenerAnswers {
        protocol: Protocol,
        address: SocketAddr,
        answers: BTreeMap<String, Arc<str>>,
    },
    /// One step of a frontend swap: a host's frontends added under the spelling the host does
    /// not use (`add`), then the ones they replace removed, `step` ordering the steps of one
    /// swap (see `crate::plan`, "Frontend swaps").
    SwapFrontend {
        frontend: Arc<Frontend>,
        add: bool,
        step: u16,
    },
    SetHealthCheck {
        cluster_id: String,
        check: HealthCheck,
    },
    RemoveHealthCheck {
        cluster_id: String,
    },
    AddBackend {
        cluster_id: String,
        backend: Backend,
    },
    AddCertificate {
        address: SocketAddr,
        certificate: Certificate,
    },
    ReplaceCertificate {
        address: SocketAddr,
        old_fingerprint: Arc<str>,
        certificate: Certificate,
    },
    RemoveCertificate {
        address: SocketAddr,
        fingerprint: Arc<str>,
    },
    /// A frontend is shared with the state it comes from (see [`crate::plan::state::Desired`]).
    RemoveFrontend(Arc<Frontend>),
    AddFrontend(Arc<Frontend>),
    /// A frontend of a route of its own port (TCP, TLS passed through, UDP).
    AddStreamFrontend(StreamFrontend),
    RemoveStreamFrontend(StreamFrontend),
    /// A TCP or UDP listener no route uses any more stops taking connections, then goes.
    DeactivateListener {
        protocol: Protocol,
        address: SocketAddr,
    },
    RemoveListener {
        protocol: Protocol,
        address: SocketAddr,
    },
    RemoveBackend {
        cluster_id: String,
        backend: Backend,
    },
    /// After a backend left its cluster: its idle keep-alive sessions close now, the busy ones
    /// once their request is answered, so that clients move on to the backends in rotation.
    CloseSessions {
        cluster_id: String,
        backend: Backend,
    },
    RemoveCluster {
        id: String,
    },
}

impl Op {
    /// A short description for logs and errors; never includes key material.
    pub fn describe(&self) -> String {
        match self {
            Op::AddListener {
                protocol,
                address,
                settings,
            } => match &settings.client_auth {
                Some(auth) if *protocol == Protocol::Https && auth.cas.is_empty() => format!(
                    "add {protocol} listener {address} (its client certificates not known yet)"
                ),
                Some(auth) if *protocol == Protocol::Https => format!(
                    "add {protocol} listener {address} (client certificates {})",
                    client_auth_label(auth)
                ),
                _ => format!("add {protocol} listener {address}"),
            },
            Op::PatchListener {
                protocol, address, ..
            } => {
                match protocol {
                    Protocol::Https => format!(
                    "update the timeouts, PROXY protocol and HTTP/2 offer of {protocol} listener \
                     {address}"
                ),
                    Protocol::Http | Protocol::Tcp => {
                        format!("update the timeouts and PROXY protocol of {protocol} listener {address}")
                    }
                    Protocol::Udp => {
                        format!("update the flow timeouts of {protocol} listener {address}")
                    }
                }
            }
            Op::SetClientAuth {
                address,
                client_auth,
            } => match client_auth {
                Some(auth) => format!(
                    "set the client certificates of https listener {address} ({})",
                    client_auth_label(auth)
                ),
                None => format!("stop asking for client certificates on https listener {address}"),
            },
            Op::ActivateListener {
                protocol, address, ..
            } => {
                format!("activate {protocol} listener {address}")
            }
            Op::SetListenerHsts { address, hsts } => match hsts.and_then(|h| h.header()) {
                Some(header) => format!("set hsts `{header}` on listener {address}"),
                None => format!("turn hsts off on listener {address}"),
            },
            Op::AddCluster { id, policy } => match policy {
                Some(p) => format!(
                    "add cluster {id} ({} credential(s), {} error page(s))",
                    p.authorized_hashes.len(),
                    p.answers.len()
                ),
                None => format!("add cluster {id}"),
            },
            Op::SetListenerAnswers {
                protocol,
                address,
                answers,
            } => format!(
                "set the error pages of {protocol} listener {address} ({})",
                answers.keys().cloned().collect::<Vec<_>>().join(", ")
            ),
            Op::SwapFrontend {
                frontend: f, add, ..
            } => format!(
                "{} {} frontend {}{} on {} (swap)",
                if *add { "add" } else { "remove" },
                f.protocol,
                f.sozu_hostname(),
                f.match_label(),
                f.address
            ),
            Op::SetHealthCheck { cluster_id, .. } => format!("set health check of {cluster_id}"),
            Op::RemoveHealthCheck { cluster_id } => {
                format!("remove health check of {cluster_id}")
            }
            Op::CloseSessions {
                cluster_id,
                backend,
            } => format!("close sessions to backend {} of {cluster_id}", backend.id),
            Op::AddBackend {
                cluster_id,
                backend,
            } => format!("add backend {} to {cluster_id}", backend.id),
            Op::AddCertificate {
                address,
                certificate,
            } => format!(
                "add certificate {} on {address}",
                short(&certificate.fingerprint)
            ),
            Op::ReplaceCertificate {
                address,
                old_fingerprint,
                certificate,
            } => format!(
                "replace certificate {} with {} on {address}",
                short(old_fingerprint),
                short(&certificate.fingerprint)
            ),
            Op::RemoveCertificate {
                address,
                fingerprint,
            } => format!("remove certificate {} on {address}", short(fingerprint)),
            Op::RemoveFrontend(f) => format!(
                "remove {} frontend {}{} on {}",
                f.protocol,
                f.hostname,
                f.match_label(),
                f.address
            ),
            Op::AddFrontend(f) => format!(
                "add {} frontend {}{} on {}",
                f.protocol,
                f.hostname,
                f.match_label(),
                f.address
            ),
            Op::RemoveBackend {
                cluster_id,
                backend,
            } => format!("remove backend {} from {cluster_id}", backend.id),
            Op::RemoveCluster { id } => format!("remove cluster {id}"),
            Op::AddStreamFrontend(f) => format!("add {} on {}", stream_label(f), f.address),
            Op::RemoveStreamFrontend(f) => {
                format!("remove {} on {}", stream_label(f), f.address)
            }
            Op::DeactivateListener { protocol, address } => {
                format!("deactivate {protocol} listener {address}")
            }
            Op::RemoveListener { protocol, address } => {
                format!("remove {protocol} listener {address}")
            }
        }
    }
}

/// `tcp frontend of <cluster>`, `tcp frontend for SNI <host> of <cluster>`.
fn stream_label(f: &StreamFrontend) -> String {
    match &f.sni {
        Some(host) => format!("{} frontend for SNI {host} of {}", f.protocol, f.cluster_id),
        None => format!("{} frontend of {}", f.protocol, f.cluster_id),
    }
}

fn short(fingerprint: &str) -> &str {
    fingerprint.get(..16).unwrap_or(fingerprint)
}

/// What became of one planned request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Applied,
    /// Applied, and sozu says this many sessions are still finishing their requests (the
    /// answer to [`Op::CloseSessions`]).
    Closing(u64),
    /// sozu said no; the connection is fine.
    Refused(String),
    /// Not sent: it depends on a request that was refused.
    Skipped,
    /// Not sent: the connection broke on this or an earlier request.
    NotSent(String),
}

impl Outcome {
    /// Whether sozu applied the request.
    pub fn is_applied(&self) -> bool {
        matches!(self, Outcome::Applied | Outcome::Closing(_))
    }
}

/// What a plan covers: everything, or only some hosts (their certificates and frontends) and
/// some clusters (whether they exist, and their backends). A pass about one host's certificate
/// plans that host alone, in time independent of the number of routes; planning each host and
/// each cluster of the workspace is planning everything, with the same code.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scope {
    pub everything: bool,
    pub hosts: BTreeSet<String>,
    pub clusters: BTreeSet<String>,
}

impl Scope {
    pub fn everything() -> Scope {
        Scope {
            everything: true,
            ..Scope::default()
        }
    }

    pub fn is_empty(&self) -> bool {
        !self.everything && self.hosts.is_empty() && self.clusters.is_empty()
    }

    pub fn extend(&mut self, other: Scope) {
        self.everything |= other.everything;
        self.hosts.extend(other.hosts);
        self.clusters.extend(other.clusters);
    }
}

/// The routes a request to make or open a route port's listener (TCP or UDP) is for, as
/// `desired` places them: a refusal of it (a port sozu cannot bind, held by another process)
/// keeps those routes from being served, and no other. Empty for any other request: the HTTP
/// listeners are every HTTPS route's.
pub fn listener_routes(desired: &Desired, op: &Op) -> BTreeSet<String> {
    match op {
        Op::AddListener {
            protocol: protocol @ (Protocol::Tcp | Protocol::Udp),
            address,
            ..
        }
        | Op::ActivateListener {
            protocol: protocol @ (Protocol::Tcp | Protocol::Udp),
            address,
            ..
        } => desired
            .stream_frontends
            .iter()
            .filter(|f| f.protocol == *protocol && f.address == *address)
            .map(|f| f.cluster_id.clone())
            .collect(),
        _ => BTreeSet::new(),
    }
}

/// The hosts and clusters a request concerns: where its failure shows, and what a plan must
/// cover to send it again.
pub fn scope_of(op: &Op) -> Scope {
    let mut scope = Scope::default();
    match op {
        Op::AddCluster { id, .. } | Op::RemoveCluster { id } => {
            scope.clusters.insert(id.clone());
        }
        Op::SwapFrontend { frontend, .. } => {
            scope.hosts.insert(frontend.hostname.clone());
        }
        Op::AddBackend { cluster_id, .. }
        | Op::RemoveBackend { cluster_id, .. }
        | Op::CloseSessions { cluster_id, .. }
        | Op::SetHealthCheck { cluster_id, .. }
        | Op::RemoveHealthCheck { cluster_id } => {
            scope.clusters.insert(cluster_id.clone());
        }
        Op::AddCertificate { certificate, .. } | Op::ReplaceCertificate { certificate, .. } => {
            scope.hosts.extend(certificate.names.iter().cloned());
        }
        Op::AddFrontend(f) | Op::RemoveFrontend(f) => {
            scope.hosts.insert(f.hostname.clone());
        }
        Op::AddStreamFrontend(f) | Op::RemoveStreamFrontend(f) => {
            scope.clusters.insert(f.cluster_id.clone());
        }
        Op::AddListener { .. }
        | Op::PatchListener { .. }
        | Op::SetClientAuth { .. }
        | Op::ActivateListener { .. }
        | Op::SetListenerHsts { .. }
        | Op::SetListenerAnswers { .. }
        | Op::DeactivateListener { .. }
        | Op::RemoveListener { .. }
        | Op::RemoveCertificate { .. } => {
            scope.everything = true;
        }
    }
    scope
}

/// The client certificates of a listener in a few words, and a digest of their PEMs: a refused
/// request is known by its description (see `crate::reconcile::retry_policy::Refusals`), so a new CA
/// or CRL must make a new description, or it would wait for the old one's retry. The PEMs are
/// public (certificates and revocation lists), and only the digest is written.
fn client_auth_label(auth: &ClientAuthState) -> String {
    use sha2::Digest;
    let mut digest = sha2::Sha256::new();
    for (kind, pems) in [("CA", &auth.cas), ("CRL", &auth.crls)] {
        for pem in pems {
            digest.update(kind.as_bytes());
            digest.update(pem.trim().as_bytes());
        }
    }
    let hex: String = digest
        .finalize()
        .iter()
        .take(6)
        .map(|b| format!("{b:02x}"))
        .collect();
    format!(
        "{}, {} CA certificate(s), {} CRL(s), set {hex}",
        if auth.required {
            "required"
        } else {
            "optional"
        },
        auth.cas.len(),
        auth.crls.len()
    )
}

/// Counts of what a plan does, for logs.
pub fn summary(ops: &[Op]) -> BTreeMap<&'static str, usize> {
    let mut counts = BTreeMap::new();
    for op in ops {
        let kind = match op {
            Op::AddListener { .. }
            | Op::PatchListener { .. }
            | Op::SetClientAuth { .. }
            | Op::ActivateListener { .. }
            | Op::SetListenerHsts { .. }
            | Op::SetListenerAnswers { .. } => "listeners",
            Op::AddCluster { .. } | Op::RemoveCluster { .. } => "clusters",
            Op::SetHealthCheck { .. } | Op::RemoveHealthCheck { .. } => "health checks",
            Op::AddBackend { .. } | Op::RemoveBackend { .. } => "backends",
            Op::CloseSessions { .. } => "sessions",
            Op::AddFrontend(_) | Op::RemoveFrontend(_) | Op::SwapFrontend { .. } => "frontends",
            Op::AddStreamFrontend(_) | Op::RemoveStreamFrontend(_) => "stream frontends",
            Op::DeactivateListener { .. } | Op::RemoveListener { .. } => "listeners removed",
            Op::AddCertificate { .. }
            | Op::ReplaceCertificate { .. }
            | Op::RemoveCertificate { .. } => "certificates",
        };
        *counts.entry(kind).or_default() += 1;
    }
    counts
}
