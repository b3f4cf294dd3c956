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
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

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
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    route: String,
    host: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HostLabels {
    host: String,
}

/// Prometheus text for a status snapshot. Pure.
pub fn render_metrics(status: &Status) -> Result<String, std::fmt::Error> {
    let mut registry = Registry::with_prefix("private_ingress");
    let gauge = |registry: &mut Registry, name: &str, help: &str, value: i64| {
        let g = Gauge::<i64>::default();
        g.set(value);
        registry.register(name, help, g);
    };
    gauge(
        &mut registry,
        "ready",
        "1 when sozu holds the whole desired state, certificates included",
        i64::from(status.ready),
    );
    gauge(
        &mut registry,
        "workspace_valid",
        "1 when the latest workspace edit was accepted (else the last good one serves)",
        i64::from(status.workspace.loaded && status.workspace.last_error.is_none()),
    );
    gauge(
        &mut registry,
        "routes",
        "Routes in the live workspace",
        status.routes.len() as i64,
    );
    let counters = &status.counters;
    for (name, help, value) in [
        ("reconciles", "Reconcile passes", counters.reconciles),
        (
            "reconcile_errors",
            "Reconcile passes that failed and were retried",
            counters.reconcile_errors,
        ),
        (
            "sozu_requests",
            "Requests sent to sozu's command socket",
            counters.sozu_requests,
        ),
        (
            "sozu_reconnects",
            "Times sozu changed (restart, new workers, reconnect) and its state was read again",
            counters.sozu_reconnects,
        ),
        (
            "workspace_errors",
            "Workspace edits rejected (syntax, contract, evaluation)",
            counters.workspace_errors,
        ),
        (
            "dns_failures",
            "Failed upstream name lookups",
            counters.dns_failures,
        ),
        (
            "certificate_errors",
            "Certificate pairs that could not be loaded, per reconcile and host",
            counters.certificate_errors,
        ),
    ] {
        let c = Counter::<u64>::default();
        c.inc_by(value);
        registry.register(name, help, c);
    }
    let route_ok = Family::<RouteLabels, Gauge>::default();
    let not_after = Family::<HostLabels, Gauge>::default();
    for route in &status.routes {
        route_ok
            .get_or_create(&RouteLabels {
                route: route.id.clone(),
                host: route.host.clone(),
            })
            .set(i64::from(route.state == "ok"));
        if let Some(t) = route.certificate.disk_not_after {
            not_after
                .get_or_create(&HostLabels {
                    host: route.host.clone(),
                })
                .set(t);
        }
    }
    registry.register("route_ok", "1 when the route is fully served", route_ok);
    registry.register(
        "certificate_not_after_seconds",
        "Expiry of the host's certificate on disk, Unix seconds",
        not_after,
    );
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &registry)?;
    Ok(out)
}
