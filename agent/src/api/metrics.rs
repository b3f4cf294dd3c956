//! `/metrics`: a status snapshot as Prometheus text exposition (what `promtool check metrics`
//! reads). Pure.

use prometheus::{IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder};

use super::{RouteState, Status};

/// Prometheus text exposition (what `promtool check metrics` reads) for a status snapshot. Pure.
pub fn render(status: &Status) -> Result<String, prometheus::Error> {
    let registry = Registry::new();
    let gauge = |name: &str, help: &str, value: i64| -> Result<(), prometheus::Error> {
        let g = IntGauge::with_opts(Opts::new(name, help))?;
        g.set(value);
        registry.register(Box::new(g))
    };
    let counter = |name: &str, help: &str, value: u64| -> Result<(), prometheus::Error> {
        let c = IntCounter::with_opts(Opts::new(name, help))?;
        c.inc_by(value);
        registry.register(Box::new(c))
    };
    gauge(
        "private_ingress_ready",
        "1 when sozu holds the whole desired state, certificates included",
        i64::from(status.ready),
    )?;
    gauge(
        "private_ingress_workspace_valid",
        "1 when the latest workspace edit was accepted (else the last good one serves)",
        i64::from(status.workspace.loaded && status.workspace.last_error.is_none()),
    )?;
    gauge(
        "private_ingress_routes",
        "Routes in the live workspace",
        status.routes.len() as i64,
    )?;
    let c = &status.counters;
    for (name, help, value) in [
        (
            "private_ingress_reconciles_total",
            "Reconcile passes",
            c.reconciles,
        ),
        (
            "private_ingress_reconcile_errors_total",
            "Reconcile passes that failed and were retried",
            c.reconcile_errors,
        ),
        (
            "private_ingress_sozu_requests_total",
            "Requests sent to sozu's command socket",
            c.sozu_requests,
        ),
        (
            "private_ingress_sozu_reconnects_total",
            "Times sozu changed (restart, new workers, reconnect) and its state was read again",
            c.sozu_reconnects,
        ),
        (
            "private_ingress_workspace_errors_total",
            "Workspace edits rejected (syntax, contract, evaluation)",
            c.workspace_errors,
        ),
        (
            "private_ingress_dns_failures_total",
            "Failed upstream name lookups",
            c.dns_failures,
        ),
        (
            "private_ingress_resyncs_total",
            "Full resyncs: every certificate pair and sozu's state read again",
            c.resyncs,
        ),
        (
            "private_ingress_watch_overflows_total",
            "Times the file watcher's queue overflowed (each followed by a resync)",
            c.watch_overflows,
        ),
        (
            "private_ingress_certificate_errors_total",
            "Distinct certificate pairs refused before reaching sozu",
            c.certificate_errors,
        ),
    ] {
        counter(name, help, value)?;
    }

    let failures = IntCounterVec::new(
        Opts::new(
            "private_ingress_certificate_failures_total",
            "Distinct certificate pairs refused before reaching sozu, by reason",
        ),
        &["reason"],
    )?;
    for (reason, count) in &c.certificate_errors_by_reason {
        failures
            .with_label_values(&[reason.as_str()])
            .inc_by(*count);
    }
    registry.register(Box::new(failures))?;

    let route_ok = IntGaugeVec::new(
        Opts::new(
            "private_ingress_route_ok",
            "1 when the route is fully served",
        ),
        &["route", "host"],
    )?;
    let not_after = IntGaugeVec::new(
        Opts::new(
            "private_ingress_certificate_not_after_seconds",
            "Expiry of the host's certificate on disk, Unix seconds",
        ),
        &["host"],
    )?;
    let not_before = IntGaugeVec::new(
        Opts::new(
            "private_ingress_certificate_not_before_seconds",
            "Start of validity of the host's certificate on disk, Unix seconds",
        ),
        &["host"],
    )?;
    let expiring = IntGaugeVec::new(
        Opts::new(
            "private_ingress_certificate_expiring_soon",
            "1 when the host's certificate expires within the expiry warning (renewal overdue)",
        ),
        &["host"],
    )?;
    let rotations = IntCounterVec::new(
        Opts::new(
            "private_ingress_certificate_rotations_total",
            "Certificates replaced in sozu, per host",
        ),
        &["host"],
    )?;
    let last_rotation = IntGaugeVec::new(
        Opts::new(
            "private_ingress_certificate_last_rotation_timestamp_seconds",
            "When the host's certificate was last replaced, Unix seconds",
        ),
        &["host"],
    )?;
    let refused = IntGaugeVec::new(
        Opts::new(
            "private_ingress_certificate_refused",
            "1 while the host's pair on disk is refused (the last good certificate keeps serving), by reason",
        ),
        &["host", "reason"],
    )?;
    let served = IntGaugeVec::new(
        Opts::new(
            "private_ingress_certificate_served_info",
            "The certificate sozu serves for the host, by fingerprint (SHA-256 of the leaf)",
        ),
        &["host", "fingerprint"],
    )?;
    let mut hosts = std::collections::BTreeSet::new();
    for route in &status.routes {
        route_ok
            .with_label_values(&[route.id.as_str(), route.host.as_str()])
            .set(i64::from(route.state == RouteState::Ok));
        // Several routes can share a host: its certificate series once.
        if !hosts.insert(route.host.as_str()) {
            continue;
        }
        let host = route.host.as_str();
        if let Some(t) = route.certificate.disk_not_after {
            not_after.with_label_values(&[host]).set(t);
        }
        if let Some(t) = route.certificate.disk_not_before {
            not_before.with_label_values(&[host]).set(t);
        }
        if route.certificate.disk_fingerprint.is_some() {
            expiring
                .with_label_values(&[host])
                .set(i64::from(route.certificate.expiring_soon));
        }
        rotations
            .with_label_values(&[host])
            .inc_by(route.certificate.rotations);
        if let Some(t) = route.certificate.last_rotation {
            last_rotation
                .with_label_values(&[host])
                .set(i64::try_from(t).unwrap_or(i64::MAX));
        }
        if let Some(reason) = &route.certificate.error_reason {
            refused.with_label_values(&[host, reason.as_str()]).set(1);
        }
        for fingerprint in &route.certificate.served_fingerprints {
            served
                .with_label_values(&[host, fingerprint.as_str()])
                .set(1);
        }
    }
    let lookup_ok = IntGaugeVec::new(
        Opts::new(
            "private_ingress_dns_lookup_ok",
            "1 when the latest lookup of the upstream name succeeded",
        ),
        &["name"],
    )?;
    let addresses = IntGaugeVec::new(
        Opts::new(
            "private_ingress_dns_addresses",
            "Addresses in use for the upstream name (the last good answer); 0 until it first resolves",
        ),
        &["name"],
    )?;
    let lookup_failures = IntCounterVec::new(
        Opts::new(
            "private_ingress_dns_lookup_failures_total",
            "Failed lookups of the upstream name",
        ),
        &["name"],
    )?;
    for name in &status.dns {
        let label = [name.name.as_str()];
        lookup_ok
            .with_label_values(&label)
            .set(i64::from(name.last_error.is_none() && name.resolved));
        addresses
            .with_label_values(&label)
            .set(i64::try_from(name.addresses.len()).unwrap_or(i64::MAX));
        lookup_failures
            .with_label_values(&label)
            .inc_by(name.failures);
    }
    for family in [
        route_ok,
        not_after,
        not_before,
        expiring,
        last_rotation,
        refused,
        served,
        lookup_ok,
        addresses,
    ] {
        registry.register(Box::new(family))?;
    }
    registry.register(Box::new(rotations))?;
    registry.register(Box::new(lookup_failures))?;
    TextEncoder::new().encode_to_string(&registry.gather())
}
