//! `/metrics`: Prometheus text exposition (what `promtool check metrics` reads). Pure.
//!
//! Each route's lines are written at each scrape from the route's status in the loop's snapshot
//! ([`render`]), family by family: nothing of the text is kept between scrapes. The status is
//! the one copy of what the lines say; lines kept beside it, and the whole text kept for the
//! next scrape, held the same strings three times (31 MiB at 10,000 routes). The work is done
//! on the low-priority thread ([`crate::api::low_priority`]), never by the loop.

mod exposition;
mod traffic;

use exposition::{gauge, header, sample};
pub use traffic::{write_capacity, write_handshake_failures, write_traffic};

use super::Snapshot;
use crate::document::{
    BackendHealth, Counters, DnsNameStatus, HostStatus, IssuerStatus, RenewalBasis, RouteState,
    RouteStatus,
};

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

/// Writes `route`'s lines of family `family` of [`ROUTE_FAMILIES`]; with `host_wide`, its host's
/// certificate families too (one route of each host carries them).
///
/// Written at each scrape from the route's status, not kept beside it: a route's lines are its
/// status's strings again (host, route, fingerprints, backends), and lines kept per route beside
/// the status held 19.4 MiB at 10,000 routes after a full renewal (heaptrack), with the whole
/// text kept for the next scrape 12 MiB more. Writing them costs a plain scrape at 10,000
/// routes about 9 ms more CPU than copying kept lines did, on the low-priority thread
/// ([`crate::api::low_priority`]; docs/benchmarks.md, "One copy each").
fn write_route_family(out: &mut String, route: &RouteStatus, host_wide: bool, family: usize) {
    let Some(&(name, _, _)) = ROUTE_FAMILIES.get(family) else {
        return;
    };
    let host = [("host", route.host.as_str())];
    let c = &route.certificate;
    let backends = || route.upstreams.iter().flat_map(|u| &u.backends);
    fn labels<'a>(address: &'a str, route: &'a RouteStatus) -> [(&'static str, &'a str); 3] {
        [
            ("backend", address),
            ("host", route.host.as_str()),
            ("route", route.id.as_str()),
        ]
    }
    let route_labels = [("host", route.host.as_str()), ("route", route.id.as_str())];
    match family {
        0 => sample(
            out,
            name,
            &route_labels,
            i64::from(route.state == RouteState::Ok),
        ),
        1..=10 if !host_wide => {}
        1 => {
            if let Some(t) = c.disk_not_after {
                sample(out, name, &host, t);
            }
        }
        2 => {
            if let Some(t) = c.disk_not_before {
                sample(out, name, &host, t);
            }
        }
        3 => {
            if c.disk_fingerprint.is_some() {
                sample(out, name, &host, i64::from(c.expiring_soon));
            }
        }
        4 => {
            if let Some(t) = c.last_rotation {
                sample(out, name, &host, i64::try_from(t).unwrap_or(i64::MAX));
            }
        }
        5 => {
            if let Some(reason) = &c.error_reason {
                let labels = [("host", route.host.as_str()), ("reason", reason.as_str())];
                sample(out, name, &labels, 1);
            }
        }
        6 => {
            for fingerprint in &c.served_fingerprints {
                let labels = [
                    ("fingerprint", &**fingerprint),
                    ("host", route.host.as_str()),
                ];
                sample(out, name, &labels, 1);
            }
        }
        7 => sample(
            out,
            name,
            &host,
            i64::try_from(c.rotations).unwrap_or(i64::MAX),
        ),
        // Beside `served_info`, so that an alert compares the two by fingerprint.
        8 => {
            if let Some(fingerprint) = &c.disk_fingerprint {
                let labels = [
                    ("fingerprint", &**fingerprint),
                    ("host", route.host.as_str()),
                ];
                sample(out, name, &labels, 1);
            }
        }
        // The served certificate's own lifetime: the expiry alert is relative to it.
        9 => {
            if let Some(t) = c.served_not_before {
                sample(out, name, &host, t);
            }
        }
        10 => {
            if let Some(t) = c.served_not_after {
                sample(out, name, &host, t);
            }
        }
        11 => {
            for backend in backends() {
                let labels = labels(backend.address.as_str(), route);
                match backend.health {
                    BackendHealth::Up => sample(out, name, &labels, 1),
                    BackendHealth::Down => sample(out, name, &labels, 0),
                    BackendHealth::Unknown => {}
                }
            }
        }
        12 => {
            for backend in backends() {
                let labels = labels(backend.address.as_str(), route);
                let transitions = i64::try_from(backend.transitions).unwrap_or(i64::MAX);
                sample(out, name, &labels, transitions);
            }
        }
        _ => sample(
            out,
            name,
            &route_labels,
            i64::from(route.no_available_backend),
        ),
    }
}

/// Every line of `route`, in the families' order: what a scrape shows of it.
#[cfg(test)]
fn route_lines(route: &RouteStatus, host_wide: bool) -> String {
    let mut out = String::new();
    for family in 0..ROUTE_FAMILIES.len() {
        write_route_family(&mut out, route, host_wide, family);
    }
    out
}

/// The whole exposition, written into `out`: the agent's own figures, every route's lines,
/// every upstream name's. The caller sizes `out` (from the last scrape's length): at 10,000
/// routes it is megabytes, and a string grown by doubling copies it over and over.
pub fn render(out: &mut String, snapshot: &Snapshot, counters: &Counters, dns: &[DnsNameStatus]) {
    let routes = snapshot.routes.len();
    let head = &snapshot.head;
    gauge(
        out,
        "private_ingress_ready",
        "1 when the agent is ready (/readyz): sozu holds every route that can be served (every route with --readiness strict)",
        i64::from(head.readiness.ready),
    );
    gauge(
        out,
        "private_ingress_routes_not_served",
        "Routes that cannot be served: a refused or missing certificate pair, upstream names that do not resolve, or a request sozu refused",
        i64::try_from(head.readiness.routes_not_served).unwrap_or(i64::MAX),
    );
    gauge(
        out,
        "private_ingress_workspace_valid",
        "1 when the latest workspace edit was accepted (else the last good one serves)",
        i64::from(head.workspace.loaded && head.workspace.last_error.is_none()),
    );
    gauge(
        out,
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
            "Resyncs: every certificate pair looked at again (read when its files changed) and sozu's state read again",
            counters.resyncs,
        ),
        (
            "private_ingress_sozu_read_failures_total",
            "Resyncs whose read of sozu's state failed; rotations and edits went on from what the agent knew",
            counters.sozu_read_failures,
        ),
        (
            "private_ingress_resync_worker_queries_total",
            "Queries resyncs sent to sozu's workers (cluster hashes, clusters by id, served certificates), each answered on the threads that serve traffic; none while nobody but the agent changes sozu",
            counters.resync_worker_queries,
        ),
        (
            "private_ingress_resync_frontend_listings_total",
            "Resyncs that had sozu's main process list every frontend (a rotation waits behind each listing); none while nobody but the agent changes sozu's frontends",
            counters.resync_frontend_listings,
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
        header(out, name, "counter", help);
        sample(
            out,
            name,
            &[],
            i64::try_from(value).unwrap_or(i64::MAX),
        );
    }
    if !counters.certificate_errors_by_reason.is_empty() {
        let name = "private_ingress_certificate_failures_total";
        header(
            out,
            name,
            "counter",
            "Distinct certificate pairs refused before reaching sozu, by reason",
        );
        for (reason, count) in &counters.certificate_errors_by_reason {
            let count = i64::try_from(*count).unwrap_or(i64::MAX);
            sample(out, name, &[("reason", reason)], count);
        }
    }
    // The routes are walked once per family: from a list, not the persistent map's tree.
    let views: Vec<&super::RouteView> = snapshot.routes.values().map(|v| &**v).collect();
    for (i, (name, kind, help)) in ROUTE_FAMILIES.iter().enumerate() {
        // A family no route has a line of gets no header either.
        let start = out.len();
        header(out, name, kind, help);
        let lines = out.len();
        for route in &views {
            write_route_family(out, &route.status, route.host_wide, i);
        }
        if out.len() == lines {
            out.truncate(start);
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
            header(out, name, kind, help);
            for n in dns {
                sample(out, name, &[("name", &n.name)], value(n));
            }
        }
    }
    if let Some(traefik) = &head.workspace.traefik {
        write_traefik(out, traefik);
    }
}

/// The `traefik` record's sources: whether each one's latest read was refused (its last good
/// version serving meanwhile), one series per file or endpoint; the routers refused; the routes
/// served from them.
pub fn write_traefik(out: &mut String, status: &crate::document::TraefikStatus) {
    let name = "private_ingress_traefik_source_errors";
    header(
        out,
        name,
        "gauge",
        "1 when the latest read of a Traefik file or endpoint was refused (it does not parse, or does not answer): its last good version serves",
    );
    for source in &status.sources {
        sample(
            out,
            name,
            &[("source", &source.source), ("kind", &source.kind)],
            i64::from(source.error.is_some()),
        );
    }
    gauge(
        out,
        "private_ingress_traefik_routers_refused",
        "Traefik routers not served: what they ask cannot be carried, or collides with another route",
        i64::try_from(status.refused.len()).unwrap_or(i64::MAX),
    );
    gauge(
        out,
        "private_ingress_traefik_routes",
        "Routes served from the Traefik configuration",
        i64::try_from(status.routes).unwrap_or(i64::MAX),
    );
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
pub fn write_events(out: &mut String, events: &super::events::Events) {
    let name = "private_ingress_events_dropped_total";
    header(
        out,
        name,
        "counter",
        "Events /v1/events clients skipped because they read too slowly, since the agent started",
    );
    sample(out, name, &[], events.dropped());
    let name = "private_ingress_events_streams";
    header(out, name, "gauge", "/v1/events streams open");
    sample(out, name, &[], events.streams());
    let name = "private_ingress_events_streams_closed_total";
    header(
        out,
        name,
        "counter",
        "/v1/events streams the agent ended, by reason: replaced (its slot went to a newer stream), stalled (its client read nothing for 30 s)",
    );
    let (replaced, stalled) = events.streams_closed();
    sample(out, name, &[("reason", "replaced")], replaced);
    sample(out, name, &[("reason", "stalled")], stalled);
}

/// The admin server's connections ([`super::clients`]): open, closed to make room, refused.
pub fn write_admin_connections(out: &mut String, connections: &super::clients::Slots) {
    let name = "private_ingress_admin_connections";
    header(out, name, "gauge", "Connections open to the admin server");
    sample(out, name, &[], connections.held());
    for (name, help, value) in [
        (
            "private_ingress_admin_connections_evicted_total",
            "Idle admin connections closed to make room for a new one, since the agent started",
            connections.evicted(),
        ),
        (
            "private_ingress_admin_connections_refused_total",
            "Admin connections refused because every open one was busy, since the agent started",
            connections.refused(),
        ),
    ] {
        header(out, name, "counter", help);
        sample(out, name, &[], value);
    }
}

/// A family with a line per upstream name: (name, type, help, the value of a name).
type DnsFamily = (
    &'static str,
    &'static str,
    &'static str,
    fn(&DnsNameStatus) -> i64,
);

#[cfg(test)]
mod tests {
    use super::*;

    /// The traffic table of a workspace with one route, `pi-a.in.example.org`.
    fn one_route_table() -> crate::traffic::stats::Table {
        let ws = crate::workspace::test_workspace(
            std::path::Path::new("/tls"),
            vec![crate::workspace::test_route(
                "a.in.example.org",
                crate::workspace::Upstream::Ip {
                    address: "127.0.0.1:80".parse().unwrap(),
                },
            )],
        );
        crate::traffic::stats::Table::default().follow(&ws)
    }
    use crate::traffic::stats::StreamFigures;

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
        let lines = route_lines(&route, true);
        for line in [
            "private_ingress_certificate_disk_info{fingerprint=\"aa\",host=\"a.in.example.org\"} 1\n",
            "private_ingress_certificate_served_info{fingerprint=\"bb\",host=\"a.in.example.org\"} 1\n",
            "private_ingress_certificate_served_not_before_seconds{host=\"a.in.example.org\"} 1000\n",
            "private_ingress_certificate_served_not_after_seconds{host=\"a.in.example.org\"} 2500\n",
            "private_ingress_certificate_not_after_seconds{host=\"a.in.example.org\"} 3000\n",
        ] {
            assert!(lines.contains(line), "{line} missing from\n{lines}");
        }
        let other = route_lines(&route, false);
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
        let table = one_route_table();
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
        let table = one_route_table();
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
        let table = one_route_table();
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
