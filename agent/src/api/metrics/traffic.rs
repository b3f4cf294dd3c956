//! The families that come from what sozu carries and how full it is: the requests of each
//! route from sozu's access log ([`crate::traffic`]), the TCP routes' connections, the TLS
//! handshakes sozu refused, and sozu's connections and buffers.

use std::sync::Arc;

use super::exposition::{gauge, header, sample};
use crate::traffic::stats::{Counts, Histogram, RouteCounts, StreamFigures, BUCKET_LABELS};

/// TLS handshakes sozu refused since the agent started, by reason (a client without a
/// certificate that the listener requires: `no_certificates_present`; a certificate not the
/// device CA's, or revoked: `invalid_certificate`). Every reason is written, 0 included, so a
/// `rate()` has a series from the first scrape.
pub fn write_handshake_failures(
    out: &mut String,
    totals: &std::collections::BTreeMap<&'static str, u64>,
) {
    let name = "private_ingress_tls_handshake_failures_total";
    header(
        out,
        name,
        "counter",
        "TLS handshakes sozu refused since the agent started, by reason (from sozu's tls.handshake.failed counters)",
    );
    for reason in crate::traffic::handshakes::REASONS {
        let count = totals.get(reason).copied().unwrap_or(0);
        sample(
            out,
            name,
            &[("reason", reason)],
            i64::try_from(count).unwrap_or(i64::MAX),
        );
    }
}

/// How full sozu is (the connections and buffers its workers hold, against their maximums),
/// and the UDP flows and datagrams it refused (see [`crate::traffic::capacity`]). The gauges
/// are written once sozu has been read; the counters always, 0 included, so a `rate()` has a
/// series from the first scrape.
pub fn write_capacity(out: &mut String, figures: &crate::traffic::capacity::Figures) {
    let gauges = [
        (
            "private_ingress_sozu_connections",
            "client.connections",
            "Client connections sozu's workers hold (every listener, idle ones included)",
        ),
        (
            "private_ingress_sozu_connections_max",
            "client.connections_max",
            "Client connections sozu's workers accept at most (max_connections, per worker, summed)",
        ),
        (
            "private_ingress_sozu_buffers_in_use",
            "buffer.in_use",
            "Buffers sozu's workers hold (two per TCP connection, from accept)",
        ),
        (
            "private_ingress_sozu_buffers_max",
            "buffer.capacity",
            "Buffers sozu's workers may hold (max_buffers, summed): none left, sozu accepts no connection",
        ),
    ];
    for (name, sozu, help) in gauges {
        if let Some(value) = figures.gauges.get(sozu) {
            header(out, name, "gauge", help);
            sample(out, name, &[], value);
        }
    }
    let counters = [
        (
            "private_ingress_udp_flows_over_limit_total",
            "udp.flows.shed.source_limit",
            "New UDP flows sozu dropped since the agent started: their client address or subnet held a route's limits.connections_per_ip or _per_subnet flows",
        ),
        (
            "private_ingress_udp_datagrams_too_large_total",
            "udp.datagrams.dropped.truncated",
            "UDP datagrams sozu dropped since the agent started: larger than their route's max_datagram_size",
        ),
    ];
    for (name, sozu, help) in counters {
        header(out, name, "counter", help);
        sample(
            out,
            name,
            &[],
            figures.counters.get(sozu).copied().unwrap_or(0),
        );
    }
}

/// The traffic families ([`crate::traffic`]), appended to the `/metrics` text: one series per
/// route (and per method and status) that has had a request, the unmatched ones, and the
/// stream's own.
pub fn write_traffic(
    out: &mut String,
    routes: &[(Arc<RouteCounts>, Counts)],
    stream: &StreamFigures,
) {
    let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    for (name, help, value) in [
        (
            "private_ingress_traffic_records_total",
            "Records of sozu's access-log stream taken since the agent started",
            stream.records,
        ),
        (
            "private_ingress_traffic_records_malformed_total",
            "Datagrams on the traffic address that were not a record sozu sends, skipped",
            stream.malformed,
        ),
        (
            "private_ingress_traffic_records_rejected_total",
            "Datagrams from an address that is neither loopback nor one of traffic.senders, dropped",
            stream.rejected,
        ),
        (
            "private_ingress_traffic_records_lost_total",
            "Records the kernel dropped because the agent did not read them in time",
            stream.lost,
        ),
        (
            "private_ingress_access_log_lines_dropped_total",
            "Access-log lines not written because the output did not keep up (their requests are counted)",
            stream.access_log_dropped,
        ),
    ] {
        header(out, name, "counter", help);
        sample(out, name, &[], count(value));
    }
    if let Some(t) = stream.last_record {
        gauge(
            out,
            "private_ingress_traffic_last_record_timestamp_seconds",
            "When the latest record arrived, Unix seconds",
            t,
        );
    }
    write_tcp(out, routes);
    let active: Vec<&(Arc<RouteCounts>, Counts)> = routes
        .iter()
        .filter(|(_, c)| !c.requests.is_empty() || !c.websockets_closed.is_empty())
        .collect();
    if active.is_empty() {
        return;
    }
    let name = "private_ingress_http_requests_total";
    header(
        out,
        name,
        "counter",
        "HTTP requests per route, by method, by the status sent to the client (sozu's own answers included; 0: none was sent) and by protocol (http/1.1, h2)",
    );
    for (route, counts) in &active {
        for ((method, code, protocol), n) in &counts.requests {
            let code = code.to_string();
            let labels = [
                ("code", code.as_str()),
                ("host", route.host.as_str()),
                ("method", method),
                ("protocol", protocol),
                ("route", route.id.as_str()),
            ];
            sample(out, name, &labels, count(*n));
        }
    }
    // WebSockets: opened (each 101 sozu sent) and ended, so that the open ones are the
    // difference. Present for a route once it has had one.
    let websockets = || {
        active
            .iter()
            .filter(|(_, c)| c.websocket_upgrades > 0 || !c.websockets_closed.is_empty())
    };
    if websockets().next().is_some() {
        let name = "private_ingress_websocket_upgrades_total";
        header(
            out,
            name,
            "counter",
            "WebSockets opened per route: the 101 responses sozu sent",
        );
        for (route, counts) in websockets() {
            let labels = [("host", route.host.as_str()), ("route", route.id.as_str())];
            sample(out, name, &labels, count(counts.websocket_upgrades));
        }
        let name = "private_ingress_websocket_closed_total";
        header(
            out,
            name,
            "counter",
            "WebSockets ended per route, by how: closed (by either side), idle_timeout (a listener timeout), error",
        );
        for (route, counts) in websockets() {
            for end in ["closed", "error", "idle_timeout"] {
                let n = counts.websockets_closed.get(end).copied().unwrap_or(0);
                let labels = [
                    ("end", end),
                    ("host", route.host.as_str()),
                    ("route", route.id.as_str()),
                ];
                sample(out, name, &labels, count(n));
            }
        }
    }
    type Of = fn(&Counts) -> &Histogram;
    let histograms: [(&str, &str, Of); 2] = [
        (
            "private_ingress_http_request_duration_seconds",
            "From the first byte of the request to the last byte of the response, per route",
            |c| &c.duration,
        ),
        (
            "private_ingress_http_backend_response_duration_seconds",
            "The backend's time to respond, per route (requests a backend answered)",
            |c| &c.backend,
        ),
    ];
    for (name, help, histogram) in histograms {
        header(out, name, "histogram", help);
        let (bucket, sum, total) = (
            format!("{name}_bucket"),
            format!("{name}_sum"),
            format!("{name}_count"),
        );
        for (route, counts) in &active {
            let h = histogram(counts);
            let labels = [("host", route.host.as_str()), ("route", route.id.as_str())];
            let mut cumulative = 0;
            for (le, n) in BUCKET_LABELS.iter().chain(["+Inf"].iter()).zip(h.counts) {
                cumulative += n;
                let [host, route] = labels;
                sample(out, &bucket, &[host, route, ("le", le)], count(cumulative));
            }
            // Microseconds as decimal seconds, exactly.
            let seconds = format!("{}.{:06}", h.sum_us / 1_000_000, h.sum_us % 1_000_000);
            sample(out, &sum, &labels, seconds);
            sample(out, &total, &labels, count(cumulative));
        }
    }
    type Bytes = fn(&Counts) -> u64;
    let bytes: [(&str, &str, Bytes); 2] = [
        (
            "private_ingress_http_request_bytes_total",
            "Bytes received from clients, per route",
            |c| c.bytes_in,
        ),
        (
            "private_ingress_http_response_bytes_total",
            "Bytes sent to clients, per route",
            |c| c.bytes_out,
        ),
    ];
    for (name, help, value) in bytes {
        header(out, name, "counter", help);
        for (route, counts) in &active {
            let labels = [("host", route.host.as_str()), ("route", route.id.as_str())];
            sample(out, name, &labels, count(value(counts)));
        }
    }
    let name = "private_ingress_http_upstream_requests_total";
    let mut upstreams = active
        .iter()
        .filter(|(_, c)| !c.upstreams.is_empty())
        .peekable();
    if upstreams.peek().is_some() {
        header(
            out,
            name,
            "counter",
            "Requests per upstream, for routes with several (`other`: a backend no upstream resolves to any more)",
        );
        for (route, counts) in upstreams {
            for (upstream, n) in &counts.upstreams {
                let labels = [
                    ("host", route.host.as_str()),
                    ("route", route.id.as_str()),
                    ("upstream", upstream.as_str()),
                ];
                sample(out, name, &labels, count(*n));
            }
        }
    }
}

/// The TCP and TLS-passthrough routes' families: their connections, counted as each ends, and
/// their bytes. Apart from the HTTP families, which count requests: a connection has none, and
/// its duration (hours, for a database's) would say nothing of latency.
fn write_tcp(out: &mut String, routes: &[(Arc<RouteCounts>, Counts)]) {
    let active: Vec<&(Arc<RouteCounts>, Counts)> = routes
        .iter()
        .filter(|(_, c)| !c.tcp.closed.is_empty())
        .collect();
    if active.is_empty() {
        return;
    }
    let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    let name = "private_ingress_tcp_connections_closed_total";
    header(
        out,
        name,
        "counter",
        "Connections of TCP and TLS-passthrough routes ended, by how: closed (by either side), idle_timeout (a listener timeout), error",
    );
    for (route, counts) in &active {
        for end in ["closed", "error", "idle_timeout"] {
            let n = counts.tcp.closed.get(end).copied().unwrap_or(0);
            let labels = [
                ("end", end),
                ("host", route.host.as_str()),
                ("route", route.id.as_str()),
            ];
            sample(out, name, &labels, count(n));
        }
    }
    type Bytes = fn(&Counts) -> u64;
    let bytes: [(&str, &str, Bytes); 2] = [
        (
            "private_ingress_tcp_received_bytes_total",
            "Bytes received from clients on TCP and TLS-passthrough routes, counted as each connection ends",
            |c| c.tcp.bytes_in,
        ),
        (
            "private_ingress_tcp_sent_bytes_total",
            "Bytes sent to clients on TCP and TLS-passthrough routes, counted as each connection ends",
            |c| c.tcp.bytes_out,
        ),
    ];
    for (name, help, value) in bytes {
        header(out, name, "counter", help);
        for (route, counts) in &active {
            let labels = [("host", route.host.as_str()), ("route", route.id.as_str())];
            sample(out, name, &labels, count(value(counts)));
        }
    }
}
