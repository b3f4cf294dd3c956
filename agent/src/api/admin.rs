//! The admin HTTP endpoints: `/healthz` (the reconcile loop turns: see [`super::Heartbeat`]),
//! `/readyz` (sozu holds the whole desired state, certificates included), `/metrics` (Prometheus text) and `/v1/state` (the
//! agent's view per route, as JSON). All of them read what the loop and the DNS source publish;
//! none of them talks to sozu, so a scrape never competes with a reconcile.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

use super::Views;

pub fn router(views: Views) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/v1/state", get(state))
        .with_state(views)
}

async fn healthz(State(views): State<Views>) -> impl IntoResponse {
    match views.heartbeat.check() {
        Ok(()) => (StatusCode::OK, "ok\n".to_owned()),
        Err(age) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "the reconcile loop has not turned for {} s (more than {} s): it is wedged\n",
                age.as_secs(),
                views.heartbeat.stale_after().as_secs()
            ),
        ),
    }
}

async fn readyz(State(views): State<Views>) -> impl IntoResponse {
    let ready = views.status.load().head.ready;
    if ready {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
    }
}

async fn state(State(views): State<Views>) -> impl IntoResponse {
    match views.state_json() {
        Ok(body) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

async fn metrics(State(views): State<Views>) -> impl IntoResponse {
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        views.metrics(),
    )
}
