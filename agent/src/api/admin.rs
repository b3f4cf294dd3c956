//! The admin HTTP endpoints: `/healthz` (the reconcile loop turns: see [`super::Heartbeat`]),
//! `/readyz` (sozu holds the whole desired state, certificates included), `/metrics`
//! (Prometheus text), `/v1/state` (the agent's view per route, as JSON, with an entity tag) and
//! `/v1/events` (what the agent did, as Server-Sent Events: [`super::events`]). All of them read what
//! the loop and the sources publish; none of them talks to sozu, so a scrape never competes with
//! a reconcile.
//!
//! The server is bounded, so that no client can stall or starve the agent:
//! - **at most [`MAX_CONNECTIONS`] connections**, counted per client (an address): when they
//!   are all open, a new one is made room for by closing the connection that has waited longest
//!   for a request of the client holding the most ([`super::clients`]). One client holding
//!   hundreds of idle connections loses its own, never the kubelet's probe; a connection is
//!   refused only when none is idle;
//! - **deadlines**: a request's head must arrive within [`HEADER_TIMEOUT`], and a connection
//!   lives at most [`CONNECTION_DEADLINE`], whatever it is doing (a client that never reads its
//!   answer holds it no longer), but for an event stream, which ends when its client goes or the
//!   agent stops, when its client reads nothing for [`super::events::STALL`], or when a newer
//!   stream takes its slot (at most [`super::events::MAX_STREAMS_PER_CLIENT`] per client,
//!   [`super::events::MAX_STREAMS`] in all);
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

use super::clients::{Client, Closer, Closing, Slot, Slots};
use super::{StateBody, Views};

/// Connections open at once. Prometheus and the kubelet keep a few; the rest are people. A
/// connection that sends no request is closed after [`HEADER_TIMEOUT`], or sooner when its
/// slot is wanted ([`super::clients`]).
pub const MAX_CONNECTIONS: usize = 512;
/// How long a connection told to close gracefully (an event stream whose slot went to a newer
/// one) may take to finish its response.
pub const CLOSE_GRACE: Duration = Duration::from_secs(1);
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
        axum::body::Body::new(GuardedBody {
            body,
            _guard: permit,
        }),
    )
}

/// A body that holds something (a data slot, its connection's busy mark) until it is done.
struct GuardedBody<G> {
    body: axum::body::Body,
    _guard: G,
}

impl<G: Send + Unpin + 'static> http_body::Body for GuardedBody<G> {
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
/// finish (the caller bounds how long it waits). `connections` is the table of who holds which
/// connection ([`super::clients`]), at most [`MAX_CONNECTIONS`].
pub async fn serve(
    listener: TcpListener,
    router: Router,
    connections: Slots,
    mut stop: watch::Receiver<bool>,
) {
    let mut tasks = JoinSet::new();
    let (closing, closed) = watch::channel(false);
    loop {
        let stopped = async {
            let _ = stop.wait_for(|stop| *stop).await;
        };
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = stopped => break,
            // Reaped as they end, so the set does not grow.
            Some(_) = tasks.join_next(), if !tasks.is_empty() => continue,
        };
        let Ok((stream, peer)) = accepted else {
            continue;
        };
        let client = Client::of(peer.ip());
        // A full table makes room from the client holding the most idle connections (the newest
        // comer's own, if that is it); refused only when nothing may give way.
        let Some(slot) = connections.take(client, false, Closing::Abort) else {
            tracing::debug!(%client, "admin connection refused: {MAX_CONNECTIONS} open, none idle");
            continue;
        };
        tasks.spawn(connection(stream, slot, router.clone(), closed.clone()));
        // The new connection's task reads its request before the next one is taken: a probe
        // that comes while a client floods the port is answered before the flood can make it
        // the oldest idle connection.
        tokio::task::yield_now().await;
    }
    let _ = closing.send(true);
    while tasks.join_next().await.is_some() {}
}

/// Serves one connection until it ends, its deadline passes, the server stops or its slot is
/// taken for another.
async fn connection(
    stream: tokio::net::TcpStream,
    slot: Slot,
    router: Router,
    mut closed: watch::Receiver<bool>,
) {
    let slot = Arc::new(slot);
    let streaming = Streaming::default();
    let service = {
        let inner = TowerToHyperService::new(router);
        let info = Connection {
            client: slot.client(),
            closer: slot.closer(),
            streaming: streaming.clone(),
        };
        let slot = slot.clone();
        hyper::service::service_fn(move |mut request: Request<hyper::body::Incoming>| {
            request.extensions_mut().insert(info.clone());
            // Busy until the response's last byte is written: not idle, so not taken.
            let busy = slot.busy();
            let response = hyper::service::Service::call(&inner, request);
            async move {
                let response = response.await?;
                Ok::<_, std::convert::Infallible>(
                    response.map(|body| axum::body::Body::new(GuardedBody { body, _guard: busy })),
                )
            }
        })
    };
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT);
    let connection = builder.serve_connection(TokioIo::new(stream), service);
    let mut connection = std::pin::pin!(connection);
    let served = async {
        tokio::select! {
            _ = connection.as_mut() => {}
            () = async { let _ = closed.wait_for(|c| *c).await; } => {
                connection.as_mut().graceful_shutdown();
                let _ = connection.as_mut().await;
            }
            how = slot.closing() => {
                if how == Closing::Graceful {
                    connection.as_mut().graceful_shutdown();
                    let _ = tokio::time::timeout(CLOSE_GRACE, connection.as_mut()).await;
                }
                // Aborted: dropped, closed now.
            }
        }
    };
    let mut served = std::pin::pin!(served);
    // An event stream ends when its client goes or the agent stops (`Events::close`), or when
    // its client does not read (`events::STALL`) or its slot goes to a newer stream.
    if tokio::time::timeout(CONNECTION_DEADLINE, served.as_mut())
        .await
        .is_err()
        && streaming.0.load(std::sync::atomic::Ordering::Relaxed)
    {
        served.await;
    }
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
    connection: Option<axum::Extension<Connection>>,
    headers: axum::http::HeaderMap,
) -> Response {
    let last = headers.get("last-event-id").and_then(|v| v.to_str().ok());
    let (client, closer) = match &connection {
        Some(axum::Extension(c)) => (c.client, Some(c.closer.clone())),
        None => (Client::default(), None),
    };
    let Some(frames) = views.events.stream(last, client, closer) else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, "2")],
            "too many event streams open, or the agent is stopping; try again\n",
        )
            .into_response();
    };
    if let Some(axum::Extension(connection)) = connection {
        connection
            .streaming
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

/// What a request knows of the connection it came on: its client, what closes it, and its
/// streaming mark.
#[derive(Clone)]
struct Connection {
    client: Client,
    closer: Closer,
    streaming: Streaming,
}

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

    /// What a scraper gets, plain or gzip (decoded), through the router as a client sends it.
    async fn scrape_text(router: &Router, gzip: bool) -> (Vec<u8>, String) {
        use http_body_util::BodyExt;
        use std::io::Read;
        use tower::ServiceExt;
        let mut request = http::Request::get("/metrics").header(header::HOST, "127.0.0.1:9180");
        if gzip {
            request = request.header(header::ACCEPT_ENCODING, "gzip");
        }
        let response = router
            .clone()
            .oneshot(request.body(axum::body::Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let body = response.into_body().collect().await.unwrap().to_bytes();
        let mut text = String::new();
        if gzip {
            flate2::read::GzDecoder::new(&body[..])
                .read_to_string(&mut text)
                .unwrap();
        } else {
            text = String::from_utf8(body.to_vec()).unwrap();
        }
        (body.to_vec(), text)
    }

    /// The agent's own families are deflated once and kept until what they show changes: the
    /// loop's snapshot or the DNS names. A gzip scrape after either change shows it, as the
    /// plain one does; with nothing changed, the same bytes.
    #[tokio::test]
    async fn a_gzip_scrape_shows_every_change_a_plain_one_shows() {
        use crate::api::{RouteView, Snapshot};
        use crate::document::{DnsNameStatus, RouteState, RouteStatus};
        let views = Views::default();
        let router = router(views.clone(), AllowedHosts::default());
        let publish = |state: RouteState| {
            let route = RouteStatus {
                id: "pi-a.in.example.org".into(),
                host: "a.in.example.org".into(),
                path_prefix: "/".into(),
                state,
                ..RouteStatus::default()
            };
            let mut routes = imbl::OrdMap::new();
            routes.insert(
                (route.host.clone(), route.path_prefix.clone()),
                std::sync::Arc::new(RouteView {
                    status: route,
                    host_wide: true,
                }),
            );
            views.status.store(Snapshot {
                routes,
                ..Snapshot::default()
            });
        };
        let ok = |v: u8| {
            format!(
                "private_ingress_route_ok{{host=\"a.in.example.org\",route=\"pi-a.in.example.org\"}} {v}\n"
            )
        };
        let dns = "private_ingress_dns_lookup_ok{name=\"a.svc\"} 1\n";

        publish(RouteState::Pending);
        let (first, gzipped) = scrape_text(&router, true).await;
        assert!(gzipped.contains(&ok(0)), "{gzipped}");
        assert_eq!(gzipped, scrape_text(&router, false).await.1);
        assert_eq!(scrape_text(&router, true).await.0, first, "nothing changed");

        publish(RouteState::Ok);
        let (_, gzipped) = scrape_text(&router, true).await;
        assert!(gzipped.contains(&ok(1)), "{gzipped}");
        assert!(!gzipped.contains(&ok(0)), "{gzipped}");
        assert_eq!(gzipped, scrape_text(&router, false).await.1);

        {
            let mut table = views.dns.lock().unwrap();
            table.names.insert(
                "a.svc".into(),
                DnsNameStatus {
                    name: "a.svc".into(),
                    resolved: true,
                    ..DnsNameStatus::default()
                },
            );
            table.version += 1;
        }
        let (_, gzipped) = scrape_text(&router, true).await;
        assert!(gzipped.contains(dns), "{gzipped}");
        assert_eq!(gzipped, scrape_text(&router, false).await.1);
    }
}
