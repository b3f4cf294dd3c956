//! The policies sozu applies per route, in sozu's terms: on a frontend (redirect, rewrites,
//! header edits, whether credentials are required) and on a cluster (the credentials, the realm,
//! connection limits, error pages), plus the listeners' error pages. Shared by the desired state,
//! the state read from sozu, the requests and the rendered file. Pure data.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use serde::Serialize;

use crate::workspace::{Balancing, RedirectScheme};

/// What an HTTPS frontend does besides routing to its cluster. Not part of the frontend's key in
/// sozu: a changed policy is a new frontend (see `crate::plan`, "Frontend swaps").
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct FrontendPolicy {
    /// A redirect status (301, 302, 308) and the scheme of its `Location`.
    pub redirect: Option<(u16, RedirectScheme)>,
    pub rewrite_host: Option<String>,
    pub rewrite_path: Option<String>,
    pub rewrite_port: Option<u16>,
    /// In the order sozu applies them.
    pub headers: Vec<HeaderEdit>,
    /// Requests need credentials the cluster's `authorized_hashes` accept.
    pub required_auth: bool,
}

impl FrontendPolicy {
    pub fn is_empty(&self) -> bool {
        *self == FrontendPolicy::default()
    }
}

/// One header edit: set `name` to `value`, or remove it (an empty value, as sozu reads it).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct HeaderEdit {
    /// On the response; else on the request.
    pub response: bool,
    pub name: String,
    pub value: String,
}

/// What a cluster holds besides its backends and health check.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct ClusterPolicy {
    /// `user:hex(sha256(password))`: hashes of credentials, never shown.
    pub authorized_hashes: Vec<String>,
    /// The whole `WWW-Authenticate` value of a 401 (`Basic realm="…"`).
    pub www_authenticate: Option<String>,
    pub max_connections_per_ip: Option<u64>,
    pub max_connections_per_subnet: Option<u64>,
    pub retry_after: Option<u32>,
    /// Status → the whole HTTP response template.
    pub answers: BTreeMap<String, Arc<str>>,
    /// A TCP cluster's backends get a PROXY protocol v2 header first, naming the client.
    pub proxy_protocol: bool,
    /// The backends speak HTTP/2 in clear text (sozu's `Cluster.http2`): sozu opens h2c
    /// connections to them, and its health probe speaks h2c too.
    pub http2: bool,
    /// sozu's `Cluster.sticky_session`: a client keeps to the backend its cookie names.
    pub sticky_session: bool,
    /// sozu's `Cluster.load_balancing`.
    pub load_balancing: Balancing,
}

impl ClusterPolicy {
    pub fn is_empty(&self) -> bool {
        *self == ClusterPolicy::default()
    }
}

/// The credentials are counted, never printed; the pages by status.
impl fmt::Debug for ClusterPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterPolicy")
            .field("authorized_hashes", &self.authorized_hashes.len())
            .field("www_authenticate", &self.www_authenticate)
            .field("max_connections_per_ip", &self.max_connections_per_ip)
            .field(
                "max_connections_per_subnet",
                &self.max_connections_per_subnet,
            )
            .field("retry_after", &self.retry_after)
            .field("answers", &self.answers.keys().collect::<Vec<_>>())
            .field("proxy_protocol", &self.proxy_protocol)
            .field("http2", &self.http2)
            .field("sticky_session", &self.sticky_session)
            .field("load_balancing", &self.load_balancing)
            .finish()
    }
}

/// The page sozu is given for `status` in place of one that was removed. sozu cannot take an
/// error page back from a running worker (a cluster's and a listener's pages are only ever
/// replaced), so a removed page is replaced by this one: a plain response of the status, with
/// the request's id and, for 401 and 429, the header sozu fills in.
pub fn plain_answer(status: u16) -> String {
    let reason = match status {
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        408 => "Request Timeout",
        413 => "Content Too Large",
        421 => "Misdirected Request",
        429 => "Too Many Requests",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        507 => "Insufficient Storage",
        _ => "Error",
    };
    let extra = match status {
        401 => "WWW-Authenticate: %WWW_AUTHENTICATE\r\n",
        429 => "Retry-After: %RETRY_AFTER\r\n",
        _ => "",
    };
    let body = format!("{status} {reason}\r\n");
    format!(
        "HTTP/1.1 {status} {reason}\r\nCache-Control: no-cache\r\nConnection: close\r\n\
         Content-Type: text/plain; charset=utf-8\r\nSozu-Id: %REQUEST_ID\r\n{extra}\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
}
