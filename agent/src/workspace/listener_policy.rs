//! What the workspace asks of sozu's listeners (`listeners.*`): their addresses, and the policy
//! every route on them shares: the lowest TLS version, the PROXY protocol, the interface, the
//! timeouts, and client certificates from a device CA. Pure data, checked by the contract.

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
        }
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

impl Default for ListenerTimeouts {
    /// sozu 2.3.3's defaults.
    fn default() -> Self {
        ListenerTimeouts {
            front: 60,
            back: 30,
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
