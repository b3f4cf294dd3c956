//! The admin HTTP endpoints: `/healthz` (the reconcile loop turns: see [`super::Heartbeat`]),
//! `/readyz` (sozu holds the whole desired state, certificates included), `/metrics`
//! (Prometheus text), `/v1/state` (the agent's view per route, as JSON, with an entity tag) and
//! `/v1/events` (what the agent did, as Server-Sent Events: [`super::events`]). All of them read what
//! the loop and the sources publish; none of them talks to sozu, so a scrape never competes with
//! a reconcile.
//!
//! The server is bounded, so that no client can stall or starve the agent:
//! - **at most [`MAX_CONNECTIONS`] connections**; one more is closed at once;
//! - **deadlines**: a request's head must arrive within [`HEADER_TIMEOUT`], and a connection
//!   lives at most [`CONNECTION_DEADLINE`], whatever it is doing (a client that never reads its
//!   answer holds it no longer), but for an event stream, which ends when its client goes or the
//!   agent stops, and of which at most [`super::events::MAX_STREAMS`] are open;
//! - **bodies rendered once** per state of what they show, on the blocking pool, and shared by
//!   every request until it changes: a hundred clients of a 9 MB `/v1/state` hold one copy;
//! - **the probes first**: `/healthz` and `/readyz` read two atomics' worth of state and answer
//!   at once. The data endpoints answer at most [`MAX_DATA_RESPONSES`] at a time (a response
//!   counts until its last byte is written) and `503` beyond, so clients that never read take
//!   data slots, never the probes';
//! - **a `Host` allow-list**: an IP literal, `localhost`, or a name given with
//!   `--admin-allowed-host`. A page that DNS-rebinds its own name to the agent's address (through
//!   a `kubectl port-forward`, say) is refused.
//!
//! No token is asked for: `/metrics` and `/v1/state` hold no key or credential, and the rendered
//! NetworkPolicy lets only the monitoring namespace reach the port (docs/security.md).

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

use super::{StateBody, Views};

/// Connections open at once. Prometheus and the kubelet keep a few; the rest are people. A
/// connection that sends no request is closed after [`HEADER_TIMEOUT`].
pub const MAX_CONNECTIONS: usize = 512;
/// `/metrics` and `/v1/state` responses being written at once.
pub const MAX_DATA_RESPONSES: usize = 16;
/// A request's head must have arrived by then.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest a connection lives: room to send 9 MB to a slow scraper, none to hold it.
pub const CONNECTION_DEADLINE: Duration = Duration::from_secs(60);

/// Names the admin server answers to besides IP literals and `localhost`.
#[derive(Debug, Clone, Default)]
pub struct AllowedHosts(Arc<Vec<String>>);

impl AllowedHosts {
    pub fn new(names: impl IntoIterator<Item = String>) -> AllowedHosts {
        AllowedHosts(Arc::new(
            names
                .into_iter()
                .map(|n| n.trim().to_ascii_lowercase())
                .filter(|n| !n.is_empty())
                .collect(),
        ))
    }

    /// Whether a request whose `Host` is `host` (with or without a port) is answered.
    pub fn allows(&self, host: &str) -> bool {
        let name = strip_port(host).to_ascii_lowercase();
        name.parse::<IpAddr>().is_ok() || name == "localhost" || self.0.contains(&name)
    }
}

/// `host:port`, `[v6]:port`, `[v6]` or `host`, without its port and brackets.
fn strip_port(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match host.rsplit_once(':') {
        // An IPv6 literal without brackets has several colons: no port to strip.
        Some((name, port)) if !name.contains(':') && port.bytes().all(|b| b.is_ascii_digit()) => {
            name
        }
        _ => host,
    }
}

pub fn router(views: Views, allowed: AllowedHosts) -> Router {
    let data = Router::new()
        .route("/metrics", get(metrics))
        .route("/v1/state", get(state))
        .layer(axum::middleware::from_fn_with_state(
            Arc::new(Semaphore::new(MAX_DATA_RESPONSES)),
            limit_data,
        ));
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/v1/events", get(events))
        .merge(data)
        .with_state(views)
        .layer(axum::middleware::from_fn(move |request, next| {
            check_host(allowed.clone(), request, next)
        }))
}

/// At most [`MAX_DATA_RESPONSES`] data responses being written: the permit goes with the body
/// and is given back when the body is done or dropped.
async fn limit_data(State(slots): State<Arc<Semaphore>>, request: Request, next: Next) -> Response {
    let Ok(permit) = slots.try_acquire_owned() else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, "1")],
            "too many responses in flight; try again\n",
        )
            .into_response();
    };
    let (parts, body) = next.run(request).await.into_parts();
    Response::from_parts(
        parts,
        axum::body::Body::new(Held {
            body,
            _permit: permit,
        }),
    )
}

/// A body that holds a data slot until it is done.
struct Held {
    body: axum::body::Body,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

impl http_body::Body for Held {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

async fn check_host(allowed: AllowedHosts, request: Request, next: Next) -> Response {
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| request.uri().authority().map(|a| a.as_str()));
    match host {
        Some(host) if allowed.allows(host) => next.run(request).await,
        _ => (
            StatusCode::FORBIDDEN,
            "this Host is not one the admin server answers to (an IP address, localhost, or \
             --admin-allowed-host)\n",
        )
            .into_response(),
    }
}

/// Serves `router` on `listener` until `stop` turns true; then lets the exchanges in flight
/// finish (the caller bounds how long it waits).
pub async fn serve(listener: TcpListener, router: Router, mut stop: watch::Receiver<bool>) {
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut connections = JoinSet::new();
    let (closing, closed) = watch::channel(false);
    loop {
        let stopped = async {
            let _ = stop.wait_for(|stop| *stop).await;
        };
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = stopped => break,
            // Reaped as they end, so the set does not grow.
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
        };
        let Ok((stream, _)) = accepted else {
            continue;
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            tracing::debug!("admin connection refused: {MAX_CONNECTIONS} already open");
            continue;
        };
        let streaming = Streaming::default();
        let service = {
            let (inner, streaming) = (TowerToHyperService::new(router.clone()), streaming.clone());
            hyper::service::service_fn(move |mut request: Request<hyper::body::Incoming>| {
                request.extensions_mut().insert(streaming.clone());
                hyper::service::Service::call(&inner, request)
            })
        };
        let mut closed = closed.clone();
        connections.spawn(async move {
            let _permit = permit;
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT);
            let connection = builder.serve_connection(TokioIo::new(stream), service);
            let mut connection = std::pin::pin!(connection);
            let closing = async {
                let _ = closed.wait_for(|c| *c).await;
            };
            let served = async {
                tokio::select! {
                    _ = connection.as_mut() => {}
                    () = closing => {
                        connection.as_mut().graceful_shutdown();
                        let _ = connection.as_mut().await;
                    }
                }
            };
            let mut served = std::pin::pin!(served);
            // An event stream ends when its client goes or the agent stops (`Events::close`).
            if tokio::time::timeout(CONNECTION_DEADLINE, served.as_mut())
                .await
                .is_err()
                && streaming.0.load(std::sync::atomic::Ordering::Relaxed)
            {
                served.await;
            }
        });
    }
    let _ = closing.send(true);
    while connections.join_next().await.is_some() {}
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
    let snapshot = views.status.load();
    let readiness = &snapshot.head.readiness;
    // Ready, and said why it may not stay so: routes not served, sozu's state unreadable (the
    // agent goes on from what it knows, so this is no reason to take the pod out of service).
    let mut notes = Vec::new();
    match readiness.routes_not_served {
        0 => {}
        1 => notes.push("1 route not served".to_owned()),
        n => notes.push(format!("{n} routes not served")),
    }
    if let Some(error) = &snapshot.head.sozu.last_read_error {
        notes.push(format!(
            "sozu's state could not be read at the last resync: {error}"
        ));
    }
    match (readiness.ready, &readiness.reason) {
        (true, _) if notes.is_empty() => (StatusCode::OK, "ready\n".to_owned()),
        (true, _) => (StatusCode::OK, format!("ready ({})\n", notes.join("; "))),
        (false, Some(reason)) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {reason}\n"),
        ),
        (false, None) => (StatusCode::SERVICE_UNAVAILABLE, "not ready\n".to_owned()),
    }
}

/// `/v1/state`, with an entity tag: `304 Not Modified` to a client that sends the current one
/// back (`If-None-Match`), which costs the agent no rendering and no bytes.
async fn state(State(views): State<Views>, headers: axum::http::HeaderMap) -> Response {
    let asked = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok());
    match views.state_body_unless(asked).await {
        Ok(StateBody::Full { etag, body }) => (
            StatusCode::OK,
            [
                (header::CONTENT_TYPE, "application/json".to_owned()),
                (header::ETAG, etag),
            ],
            body,
        )
            .into_response(),
        Ok(StateBody::NotModified { etag }) => {
            (StatusCode::NOT_MODIFIED, [(header::ETAG, etag)]).into_response()
        }
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

/// `/v1/events`: Server-Sent Events ([`super::events`]), the backlog first (after
/// `Last-Event-ID`, when the client sends one), then each event as it comes, until the client
/// goes or the agent stops. The connection it comes on is exempt from
/// [`CONNECTION_DEADLINE`]: a stream is meant to last.
async fn events(
    State(views): State<Views>,
    streaming: Option<axum::Extension<Streaming>>,
    headers: axum::http::HeaderMap,
) -> Response {
    let last = headers.get("last-event-id").and_then(|v| v.to_str().ok());
    let Some(frames) = views.events.stream(last) else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, "2")],
            "too many event streams open, or the agent is stopping; try again\n",
        )
            .into_response();
    };
    if let Some(axum::Extension(streaming)) = streaming {
        streaming
            .0
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        axum::body::Body::new(super::events::StreamBody(frames)),
    )
        .into_response()
}

/// Set by [`events`] on the connection it streams on: that connection outlives
/// [`CONNECTION_DEADLINE`].
#[derive(Clone, Default)]
struct Streaming(Arc<std::sync::atomic::AtomicBool>);

/// `/metrics`, gzipped when the scraper accepts it (Prometheus does).
async fn metrics(State(views): State<Views>, headers: axum::http::HeaderMap) -> Response {
    const TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";
    let gzip = headers
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(crate::api::gzip::accepts_gzip);
    if gzip {
        match views.metrics_gzip().await {
            Ok(Some(body)) => {
                return (
                    StatusCode::OK,
                    [
                        (header::CONTENT_TYPE, TEXT),
                        (header::CONTENT_ENCODING, "gzip"),
                        (header::VARY, "Accept-Encoding"),
                    ],
                    body,
                )
                    .into_response()
            }
            Ok(None) => {}
            Err(_) => return StatusCode::INTERNAL_SERVER_ERROR.into_response(),
        }
    }
    match views.metrics_body().await {
        Ok(body) => (
            StatusCode::OK,
            [
                (header::CONTENT_TYPE, TEXT),
                (header::VARY, "Accept-Encoding"),
            ],
            body,
        )
            .into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_ip_literals_localhost_and_configured_names_are_answered() {
        let allowed = AllowedHosts::new(["Agent.Example.internal".to_owned()]);
        for host in [
            "127.0.0.1:9180",
            "10.1.2.3",
            "[::1]:9180",
            "[fd00::5]",
            "fd00::5",
            "localhost:9180",
            "agent.example.internal:9180",
        ] {
            assert!(allowed.allows(host), "{host}");
        }
        for host in [
            "evil.example:9180",
            "attacker.example",
            "localhost.evil",
            "",
        ] {
            assert!(!allowed.allows(host), "{host}");
        }
    }

    /// Clients that never read their answer hold data slots, not the probes': past the limit a
    /// data request gets 503 at once, and `/healthz` still answers.
    #[tokio::test]
    async fn data_responses_are_limited_and_the_probes_are_not() {
        use tower::ServiceExt;
        let router = router(Views::default(), AllowedHosts::default());
        let get = |path: &str| {
            http::Request::get(path)
                .header(header::HOST, "127.0.0.1:9180")
                .body(axum::body::Body::empty())
                .unwrap()
        };
        let mut held = Vec::new();
        for _ in 0..MAX_DATA_RESPONSES {
            let response = router.clone().oneshot(get("/metrics")).await.unwrap();
            assert_eq!(response.status(), StatusCode::OK);
            held.push(response);
        }
        let refused = router.clone().oneshot(get("/v1/state")).await.unwrap();
        assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
        let probe = router.clone().oneshot(get("/healthz")).await.unwrap();
        assert_eq!(probe.status(), StatusCode::OK);
        drop(held);
        let again = router.clone().oneshot(get("/v1/state")).await.unwrap();
        assert_eq!(again.status(), StatusCode::OK);
        // A page that rebinds its own name to the agent's address is refused.
        let mut rebound = get("/v1/state");
        rebound
            .headers_mut()
            .insert(header::HOST, "evil.example:9180".parse().unwrap());
        let refused = router.clone().oneshot(rebound).await.unwrap();
        assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    }

    /// `/v1/state` carries an entity tag; sent back while nothing changed, `304` and no body;
    /// after a change, the new document with a new tag.
    #[tokio::test]
    async fn the_state_is_not_sent_again_while_it_has_not_changed() {
        use http_body_util::BodyExt;
        use tower::ServiceExt;
        let views = Views::default();
        let router = router(views.clone(), AllowedHosts::default());
        let get = |tag: Option<&str>| {
            let mut request = http::Request::get("/v1/state").header(header::HOST, "127.0.0.1");
            if let Some(tag) = tag {
                request = request.header(header::IF_NONE_MATCH, tag);
            }
            let router = router.clone();
            async move {
                let response = router
                    .oneshot(request.body(axum::body::Body::empty()).unwrap())
                    .await
                    .unwrap();
                let status = response.status();
                let etag = response
                    .headers()
                    .get(header::ETAG)
                    .map(|v| v.to_str().unwrap().to_owned());
                let body = response.into_body().collect().await.unwrap().to_bytes();
                (status, etag, body)
            }
        };
        let (status, etag, body) = get(None).await;
        assert_eq!(status, StatusCode::OK);
        assert!(!body.is_empty());
        let etag = etag.expect("an entity tag");
        let (status, again, body) = get(Some(&etag)).await;
        assert_eq!(
            (status, again.as_deref(), body.len()),
            (StatusCode::NOT_MODIFIED, Some(etag.as_str()), 0)
        );
        // Weak comparison and lists, as RFC 9110 has them.
        assert_eq!(
            get(Some(&format!("\"x\", W/{etag}"))).await.0,
            StatusCode::NOT_MODIFIED
        );
        views.status.store(crate::api::Snapshot::default());
        let (status, newer, _) = get(Some(&etag)).await;
        assert_eq!(status, StatusCode::OK);
        assert_ne!(newer.as_deref(), Some(etag.as_str()));
    }

    /// A scraper that accepts gzip gets one gzip member of exactly the text others get.
    #[tokio::test]
    async fn metrics_are_gzipped_for_a_scraper_that_asks() {
        use http_body_util::BodyExt;
        use std::io::Read;
        use tower::ServiceExt;
        let router = router(Views::default(), AllowedHosts::default());
        let scrape = |encoding: Option<&str>| {
            let mut request = http::Request::get("/metrics").header(header::HOST, "127.0.0.1:9180");
            if let Some(encoding) = encoding {
                request = request.header(header::ACCEPT_ENCODING, encoding);
            }
            let router = router.clone();
            async move {
                let response = router
                    .oneshot(request.body(axum::body::Body::empty()).unwrap())
                    .await
                    .unwrap();
                assert_eq!(response.status(), StatusCode::OK);
                let encoding = response
                    .headers()
                    .get(header::CONTENT_ENCODING)
                    .map(|v| v.to_str().unwrap().to_owned());
                let body = response.into_body().collect().await.unwrap().to_bytes();
                (encoding, body)
            }
        };
        let (plain_encoding, plain) = scrape(None).await;
        assert_eq!(plain_encoding, None);
        assert!(
            String::from_utf8_lossy(&plain).contains("private_ingress_"),
            "{plain:?}"
        );
        for accept in ["gzip", "gzip, deflate, br"] {
            let (encoding, body) = scrape(Some(accept)).await;
            assert_eq!(encoding.as_deref(), Some("gzip"), "{accept}");
            let mut text = Vec::new();
            flate2::read::GzDecoder::new(&body[..])
                .read_to_end(&mut text)
                .unwrap();
            assert_eq!(text, plain, "{accept}");
        }
        let (encoding, body) = scrape(Some("gzip;q=0, identity")).await;
        assert_eq!((encoding, body), (None, plain));
    }
}
