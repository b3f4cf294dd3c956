//! One of sozu's access-log records, as it arrives: a datagram holding the protobuf
//! `ProtobufAccessLog` of sozu-command-lib behind a varint length, then two zero bytes. Pure.
//!
//! Whatever arrives is taken apart defensively: a datagram is untrusted input (anything on the
//! host can send to a loopback port), so a truncated or malformed one is an error to count,
//! never a panic, and no field is trusted to be within a range it should be in.

use std::net::SocketAddr;

use prost::Message;
use sozu_command_lib::proto::command::{protobuf_endpoint, ProtobufAccessLog};

/// A datagram that is not a record sozu sends.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Malformed {
    #[error("not a length-delimited access-log record: {0}")]
    Decode(String),
    #[error("{0} bytes follow the record")]
    Trailing(usize),
}

/// A decoded record.
#[derive(Debug, Clone, PartialEq)]
pub struct Record(pub ProtobufAccessLog);

/// Decodes one datagram.
pub fn decode(datagram: &[u8]) -> Result<Record, Malformed> {
    let mut rest = datagram;
    let record = ProtobufAccessLog::decode_length_delimited(&mut rest)
        .map_err(|e| Malformed::Decode(e.to_string()))?;
    // sozu ends every record with two zero bytes (the framing of its stream targets); nothing
    // else may follow.
    if !rest.iter().all(|b| *b == 0) || rest.len() > 2 {
        return Err(Malformed::Trailing(rest.len()));
    }
    Ok(Record(record))
}

/// An HTTP method as a label: one of the methods HTTP defines, or `OTHER`, so that a client
/// cannot grow a series per method it invents.
pub fn method_label(method: Option<&str>) -> &'static str {
    const KNOWN: [&str; 9] = [
        "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH",
    ];
    match method {
        Some(m) => KNOWN.iter().find(|k| **k == m).copied().unwrap_or("OTHER"),
        None => "OTHER",
    }
}

/// The protocol a record's request used, from what sozu negotiated and which of its state
/// machines wrote the record, never from what the client wrote: the metrics' `protocol` label
/// and the access log's `http_protocol`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AppProtocol {
    /// HTTP/1.1: the HTTPS listener's `http/1.1` ALPN or none, and the HTTP listener (sozu 2.3.3
    /// takes no h2c from clients: its `lib/src/http.rs`).
    Http1,
    /// HTTP/2, negotiated in ALPN.
    H2,
    /// The end of a WebSocket: sozu's pipe writes one record when the connection closes, with the
    /// upgrade's method, path and 101 and the whole connection's duration and bytes. Its upgrade
    /// was a request of its own (HTTP/1.1, status 101), recorded when the 101 was sent.
    WebSocket,
    /// A connection of a TCP or TLS-passthrough route: sozu's TCP proxy writes one record when
    /// it ends, with its duration and bytes and no request (`lib/src/tcp.rs` and
    /// `lib/src/protocol/pipe.rs`, endpoint `Tcp`). A UDP flow writes none: sozu 2.3.3 logs its
    /// end as a plain line (`lib/src/udp.rs`, `on_close_flow`).
    Tcp,
}

impl AppProtocol {
    pub fn label(self) -> &'static str {
        match self {
            AppProtocol::Http1 => "http/1.1",
            AppProtocol::H2 => "h2",
            AppProtocol::WebSocket => "websocket",
            AppProtocol::Tcp => "tcp",
        }
    }

    /// Whether the record is a request's, which the request figures count; the end of a
    /// connection (a WebSocket's, a TCP route's) is not: its duration is the connection's.
    pub fn is_request(self) -> bool {
        matches!(self, AppProtocol::Http1 | AppProtocol::H2)
    }
}

/// How a connection sozu piped (a WebSocket, a TCP route's) ended, from the message its pipe
/// gives the last record (`lib/src/protocol/pipe.rs`): a fixed set, for a label.
pub fn end_label(message: Option<&str>) -> &'static str {
    match message {
        None => "closed",
        Some(m) if m.contains("timeout") => "idle_timeout",
        Some(_) => "error",
    }
}

impl Record {
    /// See [`AppProtocol`]. sozu's pipe names its protocol `WS` (HTTP listener) or
    /// `WSS-<TLS version>`, and `TCP` behind a TCP listener, whose records have no HTTP
    /// endpoint; the mux names the listener's, `http` or `https`.
    pub fn app_protocol(&self) -> AppProtocol {
        if matches!(
            self.0.endpoint.inner,
            Some(protobuf_endpoint::Inner::Tcp(_))
        ) {
            AppProtocol::Tcp
        } else if self.0.protocol.starts_with("WS") {
            AppProtocol::WebSocket
        } else if self.0.tls_alpn.as_deref() == Some("h2") {
            AppProtocol::H2
        } else {
            AppProtocol::Http1
        }
    }

    /// Why sozu ended the request early, when it says.
    pub fn message(&self) -> Option<&str> {
        self.0.message.as_deref()
    }

    fn http(&self) -> Option<&sozu_command_lib::proto::command::HttpEndpoint> {
        match &self.0.endpoint.inner {
            Some(protobuf_endpoint::Inner::Http(http)) => Some(http),
            _ => None,
        }
    }

    /// The cluster sozu routed the request to: the route's id, for the agent's clusters.
    pub fn cluster_id(&self) -> Option<&str> {
        self.0.cluster_id.as_deref()
    }

    /// The backend sozu sent it to, by id (`<cluster>-<address>`, `<cluster>-unix`).
    pub fn backend_id(&self) -> Option<&str> {
        self.0.backend_id.as_deref()
    }

    pub fn method(&self) -> Option<&str> {
        self.http().and_then(|h| h.method.as_deref())
    }

    /// The status sent to the client; `None` when none was (the client went away first), or
    /// when the record holds a number that is no HTTP status.
    pub fn status(&self) -> Option<u16> {
        self.http()
            .and_then(|h| h.status)
            .and_then(|s| u16::try_from(s).ok())
            .filter(|s| (100..=599).contains(s))
    }

    /// The request's `Host` (or `:authority`), as the client sent it.
    pub fn authority(&self) -> Option<&str> {
        self.http().and_then(|h| h.authority.as_deref())
    }

    /// The path with its query string, as the client sent it.
    pub fn path(&self) -> Option<&str> {
        self.http().and_then(|h| h.path.as_deref())
    }

    /// From the first byte of the request to the last byte of the response, in µs; the time
    /// spent on the session where sozu has no request time.
    pub fn duration_us(&self) -> u64 {
        self.0.request_time.unwrap_or(self.0.service_time)
    }

    /// The backend's time to answer, in µs, when a backend answered.
    pub fn backend_us(&self) -> Option<u64> {
        self.0.response_time
    }

    pub fn bytes_in(&self) -> u64 {
        self.0.bytes_in
    }

    pub fn bytes_out(&self) -> u64 {
        self.0.bytes_out
    }

    pub fn client(&self) -> Option<SocketAddr> {
        self.0.session_address.map(SocketAddr::from)
    }

    pub fn backend(&self) -> Option<SocketAddr> {
        self.0.backend_address.map(SocketAddr::from)
    }

    /// POSIX nanoseconds when sozu wrote the record.
    pub fn time_ns(&self) -> u128 {
        u128::from(self.0.time)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use sozu_command_lib::proto::command::{HttpEndpoint, ProtobufEndpoint, TcpEndpoint, Uint128};

    /// A record as sozu writes it for a request routed to `cluster`.
    pub(crate) fn record(cluster: Option<&str>, method: &str, status: u32, us: u64) -> Vec<u8> {
        let log = ProtobufAccessLog {
            request_id: Uint128 { low: 1, high: 2 },
            cluster_id: cluster.map(Into::into),
            protocol: "HTTPS".into(),
            endpoint: ProtobufEndpoint {
                inner: Some(protobuf_endpoint::Inner::Http(HttpEndpoint {
                    method: Some(method.into()),
                    authority: Some("a.in.example.org".into()),
                    path: Some("/x?token=secret".into()),
                    status: Some(status),
                    reason: None,
                })),
            },
            service_time: us / 2,
            request_time: Some(us),
            bytes_in: 100,
            bytes_out: 2_000,
            tag: "WRK-00".into(),
            time: Uint128::from(1_800_000_000_000_000_000u128),
            ..Default::default()
        };
        let mut datagram = log.encode_length_delimited_to_vec();
        datagram.extend_from_slice(&[0, 0]);
        datagram
    }

    #[test]
    fn a_record_as_sozu_sends_it_is_read() {
        let r = decode(&record(Some("pi-a"), "GET", 200, 1_500)).unwrap();
        assert_eq!(r.cluster_id(), Some("pi-a"));
        assert_eq!(r.status(), Some(200));
        assert_eq!(r.duration_us(), 1_500);
        assert_eq!(r.path(), Some("/x?token=secret"));
    }

    #[test]
    fn truncated_and_trailing_bytes_are_malformed_not_a_panic() {
        let whole = record(Some("pi-a"), "GET", 200, 1);
        for cut in 0..whole.len() - 2 {
            assert!(decode(&whole[..cut]).is_err(), "cut at {cut}");
        }
        let mut more = whole.clone();
        more.push(7);
        assert!(matches!(decode(&more), Err(Malformed::Trailing(_))));
        assert!(decode(&[0xff; 12]).is_err());
    }

    /// What sozu 2.3.3 writes: the mux's `https` with the negotiated ALPN, its pipe's `WSS-…` at
    /// a WebSocket's end; a client's bytes never choose the label.
    #[test]
    fn the_protocol_comes_from_what_sozu_negotiated() {
        let with = |protocol: &str, alpn: Option<&str>| {
            let mut r = decode(&record(Some("pi-a"), "GET", 200, 1)).unwrap();
            r.0.protocol = protocol.into();
            r.0.tls_alpn = alpn.map(Into::into);
            r.app_protocol().label()
        };
        assert_eq!(with("https", Some("h2")), "h2");
        assert_eq!(with("https", Some("http/1.1")), "http/1.1");
        assert_eq!(with("https", None), "http/1.1");
        assert_eq!(with("http", None), "http/1.1");
        assert_eq!(with("WSS-TLS1.3", Some("http/1.1")), "websocket");
        assert_eq!(with("WS", None), "websocket");
        assert_eq!(with("https", Some("h2c; DROP")), "http/1.1");
        assert_eq!(
            with("TCP", None),
            "http/1.1",
            "an HTTP endpoint is a request's"
        );
        assert_eq!(end_label(None), "closed");
        assert_eq!(end_label(Some("backend socket timeout")), "idle_timeout");
        assert_eq!(end_label(Some("front socket read error")), "error");
    }

    /// A record as sozu's TCP proxy writes it when a connection of `cluster` ends.
    pub(crate) fn tcp_record(cluster: &str, message: Option<&str>) -> Vec<u8> {
        let log = ProtobufAccessLog {
            request_id: Uint128 { low: 3, high: 4 },
            cluster_id: Some(cluster.into()),
            protocol: "TCP".into(),
            endpoint: ProtobufEndpoint {
                inner: Some(protobuf_endpoint::Inner::Tcp(TcpEndpoint {})),
            },
            message: message.map(Into::into),
            service_time: 10,
            request_time: Some(90_000_000),
            bytes_in: 300,
            bytes_out: 4_000,
            tag: "WRK-00".into(),
            time: Uint128::from(1_800_000_000_000_000_000u128),
            ..Default::default()
        };
        let mut datagram = log.encode_length_delimited_to_vec();
        datagram.extend_from_slice(&[0, 0]);
        datagram
    }

    #[test]
    fn a_tcp_connection_is_no_request() {
        let r = decode(&tcp_record("pi-db-tcp-5432", None)).unwrap();
        assert_eq!(r.app_protocol(), AppProtocol::Tcp);
        assert!(!r.app_protocol().is_request());
        assert_eq!((r.method(), r.status(), r.path()), (None, None, None));
    }

    #[test]
    fn invented_methods_and_statuses_are_bounded() {
        assert_eq!(method_label(Some("GET")), "GET");
        assert_eq!(method_label(Some("BREW")), "OTHER");
        assert_eq!(method_label(Some("get")), "OTHER");
        let r = decode(&record(None, "GET", 70_000, 1)).unwrap();
        assert_eq!(r.status(), None);
    }
}
