//! What the workspace asks of sozu's listeners (`listeners.*`): their addresses, and the policy
//! every route on them shares: the lowest TLS version, the PROXY protocol, the interface, the
//! timeouts (every WebSocket's and event stream's idle limit), whether HTTP/2 is offered, and
//! client certificates from a device CA. Pure data, checked by the contract.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Listeners {
    pub https: SocketAddr,
    pub http: SocketAddr,
}

/// What the workspace asks of the listeners beyond their addresses (`listeners.*`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListenerPolicy {
    /// The interface both listeners are bound to (SO_BINDTODEVICE).
    pub interface: Option<String>,
    /// The lowest TLS version of the HTTPS listener.
    pub min_tls_version: TlsVersion,
    /// Every connection starts with a PROXY protocol v2 header.
    pub expect_proxy: bool,
    pub timeouts: ListenerTimeouts,
    pub client_auth: ClientAuth,
    /// Whether the HTTPS listener offers HTTP/2 to clients.
    pub http2: Http2Offer,
}

impl Default for ListenerPolicy {
    /// sozu 2.3.3's own listener defaults, TLS 1.2 and up, no client certificate.
    fn default() -> Self {
        ListenerPolicy {
            interface: None,
            min_tls_version: TlsVersion::V1_2,
            expect_proxy: false,
            timeouts: ListenerTimeouts::default(),
            client_auth: ClientAuth::default(),
            http2: Http2Offer::default(),
        }
    }
}

/// What the HTTPS listener offers in TLS ALPN. sozu changes it on a running listener: new
/// handshakes follow it, connections already made keep what they negotiated.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Http2Offer {
    /// `h2`, then `http/1.1`: sozu's default, what browsers and gRPC clients pick from.
    #[default]
    Offered,
    /// `http/1.1` only: for clients that misbehave over h2.
    Off,
    /// `h2` only; a client that negotiates anything else, or nothing, is refused at the
    /// handshake. WebSockets, which sozu 2.3.3 carries over HTTP/1.1 only, are refused with it.
    Only,
}

impl Http2Offer {
    /// The ALPN protocols sozu advertises, in order of preference.
    pub fn alpn(self) -> &'static [&'static str] {
        match self {
            Http2Offer::Offered => &["h2", "http/1.1"],
            Http2Offer::Off => &["http/1.1"],
            Http2Offer::Only => &["h2"],
        }
    }

    /// What sozu's listener settings (`alpn_protocols`, `disable_http11`) read as.
    pub fn of(alpn: &[String], disable_http11: bool) -> Http2Offer {
        let h2 = alpn.is_empty() || alpn.iter().any(|p| p == "h2");
        let h1 = alpn.is_empty() || alpn.iter().any(|p| p == "http/1.1");
        match (h2, h1 && !disable_http11) {
            (true, true) => Http2Offer::Offered,
            (true, false) => Http2Offer::Only,
            (false, _) => Http2Offer::Off,
        }
    }
}

impl fmt::Display for Http2Offer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Http2Offer::Offered => "offered",
            Http2Offer::Off => "off",
            Http2Offer::Only => "only",
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum TlsVersion {
    #[serde(rename = "1.2")]
    V1_2,
    #[serde(rename = "1.3")]
    V1_3,
}

impl fmt::Display for TlsVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TlsVersion::V1_2 => "1.2",
            TlsVersion::V1_3 => "1.3",
        })
    }
}

/// Seconds, as sozu counts them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListenerTimeouts {
    pub front: u32,
    pub back: u32,
    pub connect: u32,
    pub request: u32,
}

impl ListenerTimeouts {
    /// sozu 2.3.3's own, which a configuration file that names none gets.
    pub const SOZU: ListenerTimeouts = ListenerTimeouts {
        front: 60,
        back: 30,
        connect: 3,
        request: 10,
    };
}

impl Default for ListenerTimeouts {
    /// The contract's defaults: sozu 2.3.3's, except `front` and `back` (60 and 30 there), long
    /// enough for a WebSocket or an event stream idle for five minutes (sozu has no timeout per
    /// cluster, so the listener's are the streams').
    fn default() -> Self {
        ListenerTimeouts {
            front: 360,
            back: 360,
            connect: 3,
            request: 10,
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClientAuthMode {
    #[default]
    Off,
    /// A certificate, when the client sends one, must be the CA's and not revoked.
    Optional,
    /// No certificate of the CA's, no connection.
    Required,
}

impl fmt::Display for ClientAuthMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ClientAuthMode::Off => "off",
            ClientAuthMode::Optional => "optional",
            ClientAuthMode::Required => "required",
        })
    }
}

/// Client certificates on the HTTPS listener: the CA's certificates and its revocation lists
/// are files, read and watched by the agent.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientAuth {
    pub mode: ClientAuthMode,
    /// Set unless the mode is off (the contract sees to it).
    pub ca_file: Option<PathBuf>,
    pub crl_files: Vec<PathBuf>,
}
