//! `/metrics`: Prometheus text exposition (what `promtool check metrics` reads). Pure.
//!
//! Each route's lines are rendered when the route's status changes and kept with it
//! ([`RouteMetrics`]); a scrape copies them out under their family's header. At 10,000 routes a
//! scrape is a few megabytes copied, not ten thousand label sets built: it costs the loop
//! nothing and takes the CPU from a rotation for a few milliseconds at most.

use std::fmt::Write as _;
use std::sync::Arc;

use super::Snapshot;
use crate::document::{
    BackendHealth, Counters, DnsNameStatus, HostStatus, IssuerStatus, RenewalBasis, RouteState,
    RouteStatus,
};
use crate::traffic::stats::{Counts, Histogram, RouteCounts, StreamFigures, BUCKET_LABELS};

/// The families whose lines come from each route: (name, type, help). Host-wide ones are
/// rendered by a host's first route only.
const ROUTE_FAMILIES: [(&str, &str, &str); 14] = [
    (
        "private_ingress_route_ok",
        "gauge",
        "1 when the route is fully served",
    ),
    (
        "private_ingress_certificate_not_after_seconds",
        "gauge",
        "Expiry of the host's certificate on disk, Unix seconds",
    ),
    (
        "private_ingress_certificate_not_before_seconds",
        "gauge",
        "Start of validity of the host's certificate on disk, Unix seconds",
    ),
    (
        "private_ingress_certificate_expiring_soon",
        "gauge",
        "1 when the host's certificate expires within the expiry warning (renewal overdue)",
    ),
    (
        "private_ingress_certificate_last_rotation_timestamp_seconds",
        "gauge",
        "When the host's certificate was last replaced, Unix seconds",
    ),
    (
        "private_ingress_certificate_refused",
        "gauge",
        "1 while the host's pair on disk is refused (the last good certificate keeps serving), by reason",
    ),
    (
        "private_ingress_certificate_served_info",
        "gauge",
        "The certificate sozu serves for the host, by fingerprint (SHA-256 of the leaf)",
    ),
    (
        "private_ingress_certificate_rotations_total",
        "counter",
        "Certificates replaced in sozu, per host",
    ),
    (
        "private_ingress_certificate_disk_info",
        "gauge",
        "The certificate the agent serves for the host once sozu holds it: the last valid pair read from disk, by fingerprint (SHA-256 of the leaf)",
    ),
    (
        "private_ingress_certificate_served_not_before_seconds",
        "gauge",
        "Start of validity of the certificate sozu serves for the host, Unix seconds",
    ),
    (
        "private_ingress_certificate_served_not_after_seconds",
        "gauge",
        "Expiry of the certificate sozu serves for the host, Unix seconds",
    ),
    (
        "private_ingress_backend_up",
        "gauge",
        "1 when sozu last reported the backend up, 0 down; absent until it reports either",
    ),
    (
        "private_ingress_backend_transitions_total",
        "counter",
        "Times sozu reported the backend going down or coming back up since the agent started",
    ),
    (
        "private_ingress_route_no_available_backend",
        "gauge",
        "1 when every upstream of the route is drained (sozu answers 503) or every backend is reported down (sozu fails open)",
    ),
];

/// One route's lines, every family's in one string of exactly their size: family `i`'s lines
/// are `text[ends[i - 1]..ends[i]]` (empty when the route has none of it).
///
/// One string a route, not one per family: fourteen strings, each grown by doubling as its
/// lines were written, held 22.5 MiB at 10,000 routes against 19.4 MiB exact (heaptrack), in
/// fourteen allocations a route that a mass renewal frees and makes again all over the heap.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RouteMetrics {
    text: Box<str>,
    ends: [u32; ROUTE_FAMILIES.len()],
}

impl RouteMetrics {
    /// The lines of `route`; with `host_wide`, its host's certificate lines too (one route of
    /// each host carries them).
    pub fn of(route: &RouteStatus, host_wide: bool) -> RouteMetrics {
        // Written here, then copied once into a string of the exact size.
        let mut out = String::with_capacity(2048);
        let mut ends = [0u32; ROUTE_FAMILIES.len()];
        let mut end = |out: &String, family: usize| {
            ends[family] = u32::try_from(out.len()).unwrap_or(u32::MAX);
        };
        let host = [("host", route.host.as_str())];
        sample(
            &mut out,
            ROUTE_FAMILIES[0].0,
            &[("host", &route.host), ("route", &route.id)],
            i64::from(route.state == RouteState::Ok),
        );
        end(&out, 0);
        if host_wide {
            let c = &route.certificate;
            if let Some(t) = c.disk_not_after {
                sample(&mut out, ROUTE_FAMILIES[1].0, &host, t);
            }
            end(&out, 1);
            if let Some(t) = c.disk_not_before {
                sample(&mut out, ROUTE_FAMILIES[2].0, &host, t);
            }
            end(&out, 2);
            if c.disk_fingerprint.is_some() {
                sample(
                    &mut out,
                    ROUTE_FAMILIES[3].0,
                    &host,
                    i64::from(c.expiring_soon),
                );
            }
            end(&out, 3);
            if let Some(t) = c.last_rotation {
                let t = i64::try_from(t).unwrap_or(i64::MAX);
                sample(&mut out, ROUTE_FAMILIES[4].0, &host, t);
            }
            end(&out, 4);
            if let Some(reason) = &c.error_reason {
                let labels = [("host", route.host.as_str()), ("reason", reason.as_str())];
                sample(&mut out, ROUTE_FAMILIES[5].0, &labels, 1);
            }
            end(&out, 5);
            for fingerprint in &c.served_fingerprints {
                let labels = [
                    ("fingerprint", fingerprint.as_str()),
                    ("host", route.host.as_str()),
                ];
                sample(&mut out, ROUTE_FAMILIES[6].0, &labels, 1);
            }
            end(&out, 6);
            let rotations = i64::try_from(c.rotations).unwrap_or(i64::MAX);
            sample(&mut out, ROUTE_FAMILIES[7].0, &host, rotations);
            end(&out, 7);
            // Beside `served_info`, so that an alert compares the two by fingerprint.
            if let Some(fingerprint) = &c.disk_fingerprint {
                let labels = [
                    ("fingerprint", fingerprint.as_str()),
                    ("host", route.host.as_str()),
                ];
                sample(&mut out, ROUTE_FAMILIES[8].0, &labels, 1);
            }
            end(&out, 8);
            // The served certificate's own lifetime: the expiry alert is relative to it.
            if let Some(t) = c.served_not_before {
                sample(&mut out, ROUTE_FAMILIES[9].0, &host, t);
            }
            end(&out, 9);
            if let Some(t) = c.served_not_after {
                sample(&mut out, ROUTE_FAMILIES[10].0, &host, t);
            }
            end(&out, 10);
        } else {
            for family in 1..=10 {
                end(&out, family);
            }
        }
        let route_labels = [("host", route.host.as_str()), ("route", route.id.as_str())];
        let backends = || route.upstreams.iter().flat_map(|u| &u.backends);
        fn labels<'a>(address: &'a str, route: &'a RouteStatus) -> [(&'static str, &'a str); 3] {
            [
                ("backend", address),
                ("host", route.host.as_str()),
                ("route", route.id.as_str()),
            ]
        }
        for backend in backends() {
            let labels = labels(backend.address.as_str(), route);
            match backend.health {
                BackendHealth::Up => sample(&mut out, ROUTE_FAMILIES[11].0, &labels, 1),
                BackendHealth::Down => sample(&mut out, ROUTE_FAMILIES[11].0, &labels, 0),
                BackendHealth::Unknown => {}
            }
        }
        end(&out, 11);
        for backend in backends() {
            let labels = labels(backend.address.as_str(), route);
            let transitions = i64::try_from(backend.transitions).unwrap_or(i64::MAX);
            sample(&mut out, ROUTE_FAMILIES[12].0, &labels, transitions);
        }
        end(&out, 12);
        sample(
            &mut out,
            ROUTE_FAMILIES[13].0,
            &route_labels,
            i64::from(route.no_available_backend),
        );
        end(&out, 13);
        RouteMetrics {
            text: Box::from(out.as_str()),
            ends,
        }
    }

    /// The lines of family `i` of [`ROUTE_FAMILIES`].
    fn family(&self, i: usize) -> &str {
        let start = i.checked_sub(1).map_or(0, |p| self.ends[p] as usize);
        let end = self.ends.get(i).map_or(0, |&e| e as usize);
        self.text.get(start..end).unwrap_or("")
    }

    /// Every line, in the families' order.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The length of every line together.
    pub fn len(&self) -> usize {
        self.text.len()
    }

    pub fn is_empty(&self) -> bool {
        self.text.is_empty()
    }
}

/// The whole exposition: the agent's own figures, every route's lines, every upstream name's.
pub fn render(snapshot: &Snapshot, counters: &Counters, dns: &[DnsNameStatus]) -> String {
    let routes = snapshot.routes.len();
    // The routes' lines are most of it, and their size is known: a string sized for them is
    // not doubled (and copied) on the way to up to twice what it holds (at 10,000 routes, 19.5
    // MiB kept for 12 of text).
    let lines: usize = snapshot.routes.values().map(|r| r.metrics.len()).sum();
    let mut out = String::with_capacity(16 * 1024 + lines + dns.len() * 512);
    let head = &snapshot.head;
    gauge(
        &mut out,
        "private_ingress_ready",
        "1 when the agent is ready (/readyz): sozu holds every route that can be served (every route with --readiness strict)",
        i64::from(head.readiness.ready),
    );
    gauge(
        &mut out,
        "private_ingress_routes_not_served",
        "Routes that cannot be served: a refused or missing certificate pair, upstream names that do not resolve, or a request sozu refused",
        i64::try_from(head.readiness.routes_not_served).unwrap_or(i64::MAX),
    );
    gauge(
        &mut out,
        "private_ingress_workspace_valid",
        "1 when the latest workspace edit was accepted (else the last good one serves)",
        i64::from(head.workspace.loaded && head.workspace.last_error.is_none()),
    );
    gauge(
        &mut out,
        "private_ingress_routes",
        "Routes in the live workspace",
        i64::try_from(routes).unwrap_or(i64::MAX),
    );
    for (name, help, value) in [
        (
            "private_ingress_reconciles_total",
            "Reconcile passes",
            counters.reconciles,
        ),
        (
            "private_ingress_reconcile_errors_total",
            "Reconcile passes that failed or had a request refused",
            counters.reconcile_errors,
        ),
        (
            "private_ingress_sozu_requests_total",
            "Requests sent to sozu's command socket",
            counters.sozu_requests,
        ),
        (
            "private_ingress_sozu_reconnects_total",
            "Times sozu changed (restart, new workers, reconnect) and its state was read again",
            counters.sozu_reconnects,
        ),
        (
            "private_ingress_workspace_errors_total",
            "Workspace edits rejected (syntax, contract, evaluation)",
            counters.workspace_errors,
        ),
        (
            "private_ingress_dns_failures_total",
            "Failed upstream name lookups since the agent started, of every name (those no longer in use included)",
            counters.dns_failures,
        ),
        (
            "private_ingress_resyncs_total",
            "Full resyncs: every certificate pair and sozu's state read again",
            counters.resyncs,
        ),
        (
            "private_ingress_sozu_read_failures_total",
            "Resyncs whose read of sozu's state failed; rotations and edits went on from what the agent knew",
            counters.sozu_read_failures,
        ),
        (
            "private_ingress_watch_overflows_total",
            "Times a file watcher's queue overflowed (its source then read everything again)",
            counters.watch_overflows,
        ),
        (
            "private_ingress_certificate_errors_total",
            "Distinct certificate pairs refused before reaching sozu",
            counters.certificate_errors,
        ),
        (
            "private_ingress_drift_repairs_total",
            "Changes to the agent's objects in sozu that it did not make, each repaired at once",
            counters.drift_repairs,
        ),
        (
            "private_ingress_sozu_event_stream_breaks_total",
            "Times sozu's event stream broke (counted as a possible sozu restart)",
            counters.event_stream_breaks,
        ),
        (
            "private_ingress_dns_dropped_addresses_total",
            "Addresses of upstream names' answers not used as backends: loopback, link-local, unspecified, multicast (unless the workspace allows them), or over the cap per name",
            counters.dns_dropped_addresses,
        ),
    ] {
        header(&mut out, name, "counter", help);
        sample(
            &mut out,
            name,
            &[],
            i64::try_from(value).unwrap_or(i64::MAX),
        );
    }
    if !counters.certificate_errors_by_reason.is_empty() {
        let name = "private_ingress_certificate_failures_total";
        header(
            &mut out,
            name,
            "counter",
            "Distinct certificate pairs refused before reaching sozu, by reason",
        );
        for (reason, count) in &counters.certificate_errors_by_reason {
            let count = i64::try_from(*count).unwrap_or(i64::MAX);
            sample(&mut out, name, &[("reason", reason)], count);
        }
    }
    for (i, (name, kind, help)) in ROUTE_FAMILIES.iter().enumerate() {
        let mut lines = snapshot
            .routes
            .values()
            .map(|route| route.metrics.family(i))
            .filter(|l| !l.is_empty())
            .peekable();
        if lines.peek().is_some() {
            header(&mut out, name, kind, help);
            lines.for_each(|l| out.push_str(l));
        }
    }
    let families: [DnsFamily; 3] = [
        (
            "private_ingress_dns_lookup_ok",
            "gauge",
            "1 when the latest lookup of the upstream name succeeded",
            |n| i64::from(n.last_error.is_none() && n.resolved),
        ),
        (
            "private_ingress_dns_addresses",
            "gauge",
            "Addresses in use for the upstream name (the last good answer); 0 until it first resolves",
            |n| i64::try_from(n.addresses.len()).unwrap_or(i64::MAX),
        ),
        (
            "private_ingress_dns_lookup_failures_total",
            "counter",
            "Failed lookups of the upstream name",
            |n| i64::try_from(n.failures).unwrap_or(i64::MAX),
        ),
    ];
    if !dns.is_empty() {
        for (name, kind, help, value) in families {
            header(&mut out, name, kind, help);
            for n in dns {
                sample(&mut out, name, &[("name", &n.name)], value(n));
            }
        }
    }
    out
}

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

/// `listeners.client_auth`: the device CA's expiry, each CRL's `nextUpdate` (of the version in
/// force: sozu fails every handshake once it passes) and whether the latest read of each file
/// was refused, one series per file; and whether sozu refused the set the files make, a
/// revocation on disk then not in force without any file being refused.
pub fn write_client_auth(out: &mut String, status: &crate::document::ClientAuthStatus) {
    let name = "private_ingress_client_auth_refused_by_sozu";
    header(
        out,
        name,
        "gauge",
        "1 while sozu refuses the device CA and CRLs the agent validated from the files and keeps enforcing the ones it held before",
    );
    sample(out, name, &[], i64::from(status.sozu_refused.is_some()));
    let files = status
        .ca
        .iter()
        .map(|ca| (ca.file.as_str(), ca.problem.is_some()))
        .chain(
            status
                .crls
                .iter()
                .map(|c| (c.file.as_str(), c.problem.is_some())),
        );
    let name = "private_ingress_client_auth_file_refused";
    header(
        out,
        name,
        "gauge",
        "1 when the latest read of a client-auth file (the device CA, a CRL) was refused; its last good version stays applied",
    );
    for (file, refused) in files {
        sample(out, name, &[("file", file)], i64::from(refused));
    }
    if let Some((file, not_after)) = status
        .ca
        .as_ref()
        .and_then(|ca| ca.not_after.map(|t| (ca.file.as_str(), t)))
    {
        let name = "private_ingress_client_ca_not_after_seconds";
        header(
            out,
            name,
            "gauge",
            "notAfter of the device CA's certificates (the earliest), Unix seconds",
        );
        sample(out, name, &[("file", file)], not_after);
    }
    let crls: Vec<(&str, i64)> = status
        .crls
        .iter()
        .filter_map(|c| c.next_update.map(|t| (c.file.as_str(), t)))
        .collect();
    if !crls.is_empty() {
        let name = "private_ingress_client_crl_next_update_seconds";
        header(
            out,
            name,
            "gauge",
            "nextUpdate of the CRL sozu holds from the file, Unix seconds: once it passes, sozu fails every handshake",
        );
        for (file, t) in crls {
            sample(out, name, &[("file", file)], t);
        }
    }
}

/// The issuer's families, one series per host, appended to the `/metrics` text.
pub fn write_issuer(out: &mut String, status: &IssuerStatus) {
    let hosts = &status.hosts;
    if hosts.is_empty() {
        return;
    }
    type Value = fn(&HostStatus) -> Option<i64>;
    let gauges: [(&str, &str, Value); 4] = [
        (
            "private_ingress_acme_certificate_not_after_seconds",
            "notAfter of the certificate the issuer holds for the host, Unix seconds",
            |h| h.valid_until,
        ),
        (
            "private_ingress_acme_renewal_due_seconds",
            "When the host's certificate is to be renewed, Unix seconds",
            |h| h.renewal_due,
        ),
        (
            "private_ingress_acme_renewal_from_ari",
            "1 when the renewal time comes from the CA's renewal information (ARI), 0 when from the lifetime",
            |h| h.renewal_due.map(|_| i64::from(h.renewal_basis == Some(RenewalBasis::Ari))),
        ),
        (
            "private_ingress_acme_backoff_until_seconds",
            "End of the back-off (or rate-limit hold) in force for the host, Unix seconds; 0 when none",
            |h| Some(h.backoff.as_ref().map_or(0, |b| b.until)),
        ),
    ];
    for (name, help, value) in gauges {
        let values: Vec<(&str, i64)> = hosts
            .iter()
            .filter_map(|(host, h)| value(h).map(|v| (host.as_str(), v)))
            .collect();
        if !values.is_empty() {
            header(out, name, "gauge", help);
            for (host, v) in values {
                sample(out, name, &[("host", host)], v);
            }
        }
    }
    let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    type Count = fn(&HostStatus) -> u64;
    let counters: [(&str, &str, Count); 2] = [
        (
            "private_ingress_acme_orders_total",
            "ACME orders placed for the host since the agent started",
            |h| h.orders_placed,
        ),
        (
            "private_ingress_acme_certificates_issued_total",
            "Certificates issued for the host since the agent started",
            |h| h.certificates_issued,
        ),
    ];
    for (name, help, value) in counters {
        header(out, name, "counter", help);
        for (host, h) in hosts {
            sample(out, name, &[("host", host)], count(value(h)));
        }
    }
    let failures: Vec<(&str, &str, u64)> = hosts
        .iter()
        .flat_map(|(host, h)| {
            h.orders_failed
                .iter()
                .map(move |(reason, n)| (host.as_str(), reason.as_str(), *n))
        })
        .collect();
    if !failures.is_empty() {
        let name = "private_ingress_acme_order_failures_total";
        header(
            out,
            name,
            "counter",
            "Failed ACME orders since the agent started, by host and reason",
        );
        for (host, reason, n) in failures {
            sample(out, name, &[("host", host), ("reason", reason)], count(n));
        }
    }
}

/// `/v1/events`' own family: the events slow clients skipped ([`crate::api::events`]).
pub fn write_events(out: &mut String, dropped: u64) {
    let name = "private_ingress_events_dropped_total";
    header(
        out,
        name,
        "counter",
        "Events /v1/events clients skipped because they read too slowly, since the agent started",
    );
    sample(out, name, &[], dropped);
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

/// A family with a line per upstream name: (name, type, help, the value of a name).
type DnsFamily = (
    &'static str,
    &'static str,
    &'static str,
    fn(&DnsNameStatus) -> i64,
);

fn gauge(out: &mut String, name: &str, help: &str, value: i64) {
    header(out, name, "gauge", help);
    sample(out, name, &[], value);
}

/// A family's `# HELP` and `# TYPE` lines.
fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let help = help.replace('\\', "\\\\").replace('\n', "\\n");
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// One sample; labels in the order given (sorted by name, as exposition readers expect, but
/// for a histogram's `le`, last by custom).
fn sample(out: &mut String, name: &str, labels: &[(&str, &str)], value: impl std::fmt::Display) {
    out.push_str(name);
    if !labels.is_empty() {
        out.push('{');
        for (i, (label, value)) in labels.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(label);
            out.push_str("=\"");
            escape(out, value);
            out.push('"');
        }
        out.push('}');
    }
    let _ = writeln!(out, " {value}");
}

/// A label value as the text format quotes it: backslash, double quote and line feed escaped.
fn escape(out: &mut String, value: &str) {
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        let mut out = String::new();
        sample(&mut out, "m", &[("reason", "a\"b\\c\nd")], 1);
        assert_eq!(out, "m{reason=\"a\\\"b\\\\c\\nd\"} 1\n");
    }

    /// What the alert rules compare: the on-disk and served fingerprints side by side, and the
    /// served certificate's lifetime, which may differ from the one on disk.
    #[test]
    fn a_host_shows_its_disk_and_served_certificates_apart() {
        let route = RouteStatus {
            id: "pi-a".into(),
            host: "a.in.example.org".into(),
            certificate: crate::document::CertificateStatus {
                disk_fingerprint: Some("aa".into()),
                disk_not_before: Some(2_000),
                disk_not_after: Some(3_000),
                served_fingerprints: vec!["bb".into()],
                served_not_before: Some(1_000),
                served_not_after: Some(2_500),
                ..Default::default()
            },
            ..Default::default()
        };
        let lines = RouteMetrics::of(&route, true).text().to_owned();
        for line in [
            "private_ingress_certificate_disk_info{fingerprint=\"aa\",host=\"a.in.example.org\"} 1\n",
            "private_ingress_certificate_served_info{fingerprint=\"bb\",host=\"a.in.example.org\"} 1\n",
            "private_ingress_certificate_served_not_before_seconds{host=\"a.in.example.org\"} 1000\n",
            "private_ingress_certificate_served_not_after_seconds{host=\"a.in.example.org\"} 2500\n",
            "private_ingress_certificate_not_after_seconds{host=\"a.in.example.org\"} 3000\n",
        ] {
            assert!(lines.contains(line), "{line} missing from\n{lines}");
        }
        let other = RouteMetrics::of(&route, false).text().to_owned();
        assert!(!other.contains("disk_info"), "{other}");
    }
    fn issuer_sample() -> IssuerStatus {
        use crate::document::Backoff;
        let mut hosts = std::collections::BTreeMap::new();
        hosts.insert(
            "a.in.example.org".to_owned(),
            HostStatus {
                state: "valid".into(),
                valid_until: Some(1_900_000_000),
                renewal_due: Some(1_890_000_000),
                renewal_basis: Some(RenewalBasis::Lifetime),
                ..HostStatus::default()
            },
        );
        hosts.insert(
            "b.in.example.org".to_owned(),
            HostStatus {
                state: "backing_off".into(),
                orders_failed: std::collections::BTreeMap::from([("dns_update".to_owned(), 2)]),
                backoff: Some(Backoff {
                    reason: "dns_update".into(),
                    until: 1_800_000_600,
                    failures: 2,
                }),
                ..HostStatus::default()
            },
        );
        IssuerStatus {
            hosts,
            ..IssuerStatus::default()
        }
    }

    #[test]
    fn metrics_carry_one_series_per_host() {
        let mut text = String::new();
        write_issuer(&mut text, &issuer_sample());
        assert!(
            text.contains(
                "private_ingress_acme_renewal_due_seconds{host=\"a.in.example.org\"} 1890000000"
            ),
            "{text}"
        );
        assert!(text.contains("private_ingress_acme_order_failures_total{host=\"b.in.example.org\",reason=\"dns_update\"} 2"), "{text}");
        assert!(
            text.contains(
                "private_ingress_acme_backoff_until_seconds{host=\"b.in.example.org\"} 1800000600"
            ),
            "{text}"
        );
    }

    #[test]
    fn traffic_is_written_per_route_method_and_status() {
        let ws = crate::workspace::test_workspace(
            std::path::Path::new("/tls"),
            vec![crate::workspace::test_route(
                "a.in.example.org",
                crate::workspace::Upstream::Ip {
                    address: "127.0.0.1:80".parse().unwrap(),
                },
            )],
        );
        let table = crate::traffic::stats::Table::default().follow(&ws);
        let none = |_: &str| Vec::new();
        for (cluster, status, us) in [
            (Some("pi-a.in.example.org"), 200, 4_000),
            (Some("pi-a.in.example.org"), 200, 60_000),
            (Some("pi-a.in.example.org"), 503, 100),
            (Some("pi-unknown"), 404, 100),
            (None, 404, 100),
        ] {
            let r = crate::traffic::record::decode(&crate::traffic::record::tests::record(
                cluster, "GET", status, us,
            ))
            .unwrap();
            table.of(&r).observe(&r, &none);
        }
        let mut out = String::new();
        write_traffic(&mut out, &table.snapshot(), &StreamFigures::default());
        for line in [
            "private_ingress_http_requests_total{code=\"200\",host=\"a.in.example.org\",method=\"GET\",protocol=\"http/1.1\",route=\"pi-a.in.example.org\"} 2\n",
            "private_ingress_http_requests_total{code=\"503\",host=\"a.in.example.org\",method=\"GET\",protocol=\"http/1.1\",route=\"pi-a.in.example.org\"} 1\n",
            "private_ingress_http_requests_total{code=\"404\",host=\"unmatched\",method=\"GET\",protocol=\"http/1.1\",route=\"unmatched\"} 2\n",
            "private_ingress_http_request_duration_seconds_bucket{host=\"a.in.example.org\",route=\"pi-a.in.example.org\",le=\"0.005\"} 2\n",
            "private_ingress_http_request_duration_seconds_bucket{host=\"a.in.example.org\",route=\"pi-a.in.example.org\",le=\"0.05\"} 2\n",
            "private_ingress_http_request_duration_seconds_bucket{host=\"a.in.example.org\",route=\"pi-a.in.example.org\",le=\"0.1\"} 3\n",
            "private_ingress_http_request_duration_seconds_sum{host=\"a.in.example.org\",route=\"pi-a.in.example.org\"} 0.064100\n",
            "private_ingress_http_response_bytes_total{host=\"a.in.example.org\",route=\"pi-a.in.example.org\"} 6000\n",
        ] {
            assert!(out.contains(line), "{line} missing from\n{out}");
        }
        assert!(!out.contains("private_ingress_websocket"), "{out}");
    }

    /// An h2 request is labelled so; a WebSocket's upgrade is a request (101, http/1.1) and its
    /// end is counted as an end, its hour-long duration kept out of the request histogram.
    #[test]
    fn protocols_and_websockets_are_counted_apart() {
        use crate::traffic::record::{decode, tests::record};
        let ws = crate::workspace::test_workspace(
            std::path::Path::new("/tls"),
            vec![crate::workspace::test_route(
                "a.in.example.org",
                crate::workspace::Upstream::Ip {
                    address: "127.0.0.1:80".parse().unwrap(),
                },
            )],
        );
        let table = crate::traffic::stats::Table::default().follow(&ws);
        let none = |_: &str| Vec::new();
        let a = Some("pi-a.in.example.org");
        let mut h2 = decode(&record(a, "POST", 200, 1_000)).unwrap();
        h2.0.tls_alpn = Some("h2".into());
        let mut upgrade = decode(&record(a, "GET", 101, 2_000)).unwrap();
        upgrade.0.tls_alpn = Some("http/1.1".into());
        let mut end = decode(&record(a, "GET", 101, 3_600_000_000)).unwrap();
        end.0.protocol = "WSS-TLS1.3".into();
        let mut idle = end.clone();
        idle.0.message = Some("backend socket timeout".into());
        for r in [&h2, &upgrade, &end, &upgrade, &idle, &upgrade] {
            table.of(r).observe(r, &none);
        }
        let mut out = String::new();
        write_traffic(&mut out, &table.snapshot(), &StreamFigures::default());
        let host = "host=\"a.in.example.org\"";
        let route = "route=\"pi-a.in.example.org\"";
        for line in [
            format!("private_ingress_http_requests_total{{code=\"200\",{host},method=\"POST\",protocol=\"h2\",{route}}} 1\n"),
            format!("private_ingress_http_requests_total{{code=\"101\",{host},method=\"GET\",protocol=\"http/1.1\",{route}}} 3\n"),
            format!("private_ingress_websocket_upgrades_total{{{host},{route}}} 3\n"),
            format!("private_ingress_websocket_closed_total{{end=\"closed\",{host},{route}}} 1\n"),
            format!("private_ingress_websocket_closed_total{{end=\"idle_timeout\",{host},{route}}} 1\n"),
            format!("private_ingress_websocket_closed_total{{end=\"error\",{host},{route}}} 0\n"),
            format!("private_ingress_http_request_duration_seconds_count{{{host},{route}}} 4\n"),
            format!("private_ingress_http_request_duration_seconds_bucket{{{host},{route},le=\"+Inf\"}} 4\n"),
        ] {
            assert!(out.contains(&line), "{line} missing from\n{out}");
        }
        assert!(!out.contains("protocol=\"websocket\""), "{out}");
    }

    /// A TCP route's connections are counted in families of their own, as they end: none of
    /// the HTTP families (no request, no latency) shows the route.
    #[test]
    fn tcp_connections_are_no_requests() {
        use crate::traffic::record::{decode, tests::tcp_record};
        let ws = crate::workspace::test_workspace(
            std::path::Path::new("/tls"),
            vec![crate::workspace::test_route(
                "a.in.example.org",
                crate::workspace::Upstream::Ip {
                    address: "127.0.0.1:80".parse().unwrap(),
                },
            )],
        );
        let table = crate::traffic::stats::Table::default().follow(&ws);
        for message in [None, Some("back socket read error")] {
            let r = decode(&tcp_record("pi-a.in.example.org", message)).unwrap();
            table.of(&r).observe(&r, &|_| Vec::new());
        }
        let mut out = String::new();
        write_traffic(&mut out, &table.snapshot(), &StreamFigures::default());
        let labels = "host=\"a.in.example.org\",route=\"pi-a.in.example.org\"";
        for line in [
            format!("private_ingress_tcp_connections_closed_total{{end=\"closed\",{labels}}} 1\n"),
            format!("private_ingress_tcp_connections_closed_total{{end=\"error\",{labels}}} 1\n"),
            format!(
                "private_ingress_tcp_connections_closed_total{{end=\"idle_timeout\",{labels}}} 0\n"
            ),
            format!("private_ingress_tcp_received_bytes_total{{{labels}}} 600\n"),
            format!("private_ingress_tcp_sent_bytes_total{{{labels}}} 8000\n"),
        ] {
            assert!(out.contains(&line), "{line} missing from\n{out}");
        }
        assert!(!out.contains("private_ingress_http_"), "{out}");
    }
}
