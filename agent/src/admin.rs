//! The admin HTTP endpoints: `/healthz` (the process is alive), `/readyz` (sozu holds the whole
//! desired state, certificates included), `/metrics` (Prometheus text) and `/v1/state` (the
//! agent's view per route, as JSON). All of them read the [`Status`] the loop publishes; none of
//! them talks to sozu, so a scrape never competes with a reconcile.

use std::net::SocketAddr;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use prometheus::{IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder};

use crate::reconcile::{SharedStatus, Status};

pub fn router(status: SharedStatus) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/v1/state", get(state))
        .with_state(status)
}

/// Serves until `shutdown` resolves.
pub async fn serve(
    address: SocketAddr,
    status: SharedStatus,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(address).await?;
    axum::serve(listener, router(status))
        .with_graceful_shutdown(shutdown)
        .await
}

fn snapshot(status: &SharedStatus) -> Status {
    status.read().unwrap_or_else(|p| p.into_inner()).clone()
}

async fn readyz(State(status): State<SharedStatus>) -> impl IntoResponse {
    if snapshot(&status).ready {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
    }
}

async fn state(State(status): State<SharedStatus>) -> impl IntoResponse {
    Json(snapshot(&status))
}

async fn metrics(State(status): State<SharedStatus>) -> impl IntoResponse {
    match render_metrics(&snapshot(&status)) {
        Ok(text) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

/// Prometheus text exposition (what `promtool check metrics` reads) for a status snapshot. Pure.
pub fn render_metrics(status: &Status) -> Result<String, prometheus::Error> {
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
            .set(i64::from(route.state == "ok"));
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
        for fingerprint in &route.certificate.served_fingerprints {
            served
                .with_label_values(&[host, fingerprint.as_str()])
                .set(1);
        }
    }
    for family in [
        route_ok,
        not_after,
        not_before,
        expiring,
        last_rotation,
        served,
    ] {
        registry.register(Box::new(family))?;
    }
    registry.register(Box::new(rotations))?;
    if let Some(issuer) = &status.issuer {
        crate::acme::status::register_metrics(&registry, issuer)?;
    }
    TextEncoder::new().encode_to_string(&registry.gather())
}
