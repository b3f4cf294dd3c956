//! What the admin endpoints serve: the snapshots the loop publishes and the bodies rendered from
//! them (here), the HTTP server ([`admin`]) and the Prometheus rendering ([`metrics`]). The
//! `/v1/state` document's types are [`crate::document`]'s.

pub mod admin;
pub mod clients;
pub mod events;
pub mod gzip;
pub mod low_priority;
pub mod metrics;

use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, RwLock};

use serde::Serialize;

use crate::document::{
    Counters, DnsNameStatus, Document, IssuerStatus, Readiness, RouteStatus, SozuStatus,
    TrafficStatus, WorkspaceStatus,
};

/// A route's status, and whether its lines in `/metrics` carry its host's certificate families.
/// The lines themselves are written from the status at each scrape ([`metrics::render`]).
#[derive(Debug, Clone, PartialEq)]
pub struct RouteView {
    pub status: RouteStatus,
    /// The first HTTPS route of its host: its lines carry the host's certificate families.
    pub host_wide: bool,
}

/// Routes by (host, path prefix): the workspace's own order.
pub type RouteKey = (String, String);

/// The parts of the status that are not per route.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Head {
    pub readiness: Readiness,
    pub workspace: WorkspaceStatus,
    pub sozu: SozuStatus,
    pub counters: Counters,
}

/// What the loop publishes: cheap to hand out (a reader clones an `Arc`) and cheap to update (a
/// persistent map shares every route that did not change with the previous snapshot).
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub head: Head,
    pub routes: imbl::OrdMap<RouteKey, Arc<RouteView>>,
}

/// Where the loop publishes its snapshots. Readers never hold the lock longer than an `Arc`
/// clone takes, so a scrape at 10,000 routes never holds up a pass.
#[derive(Debug, Default)]
pub struct Published(RwLock<Arc<Snapshot>>);

impl Published {
    pub fn load(&self) -> Arc<Snapshot> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn store(&self, snapshot: Snapshot) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(snapshot);
    }

    /// The loop's status alone, as an owned document (no DNS names).
    pub fn status(&self) -> Document {
        self.load().status(&[])
    }
}

impl Snapshot {
    /// The whole document, owned; `/v1/state` serializes [`StatusRef`] instead, without copies.
    pub fn status(&self, dns: &[DnsNameStatus]) -> Document {
        Document {
            ready: self.head.readiness.ready,
            readiness: self.head.readiness.clone(),
            workspace: self.head.workspace.clone(),
            sozu: self.head.sozu.clone(),
            routes: self.routes.values().map(|r| r.status.clone()).collect(),
            dns: dns.to_vec(),
            counters: self.head.counters.clone(),
            issuer: None,
            traffic: None,
        }
    }
}

/// [`Document`] as serialized from a snapshot, borrowing everything: the same document.
#[derive(Serialize)]
pub struct StatusRef<'a> {
    ready: bool,
    readiness: &'a Readiness,
    workspace: &'a WorkspaceStatus,
    sozu: &'a SozuStatus,
    routes: RoutesRef<'a>,
    dns: &'a [DnsNameStatus],
    counters: &'a Counters,
    #[serde(skip_serializing_if = "Option::is_none")]
    issuer: Option<&'a IssuerStatus>,
    #[serde(skip_serializing_if = "Option::is_none")]
    traffic: Option<&'a TrafficStatus>,
}

struct RoutesRef<'a>(&'a imbl::OrdMap<RouteKey, Arc<RouteView>>);

impl Serialize for RoutesRef<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.values().map(|r| &r.status))
    }
}

/// The loop's published status.
pub type SharedStatus = Arc<Published>;

/// What the admin endpoints read: the loop's snapshots and heartbeat, the DNS source's table,
/// and the ACME issuer's status; and the bodies last rendered from them.
#[derive(Clone)]
pub struct Views {
    pub status: SharedStatus,
    pub heartbeat: Heartbeat,
    pub dns: crate::sources::dns::DnsTable,
    pub issuer: crate::acme::handle::IssuerHandle,
    pub traffic: crate::traffic::TrafficHandle,
    /// What the agent did and why, for `/v1/events`.
    pub events: events::Events,
    /// Who holds the admin server's connections ([`clients`]).
    pub connections: clients::Slots,
    pub bodies: Arc<Bodies>,
}

impl Default for Views {
    fn default() -> Views {
        Views {
            status: SharedStatus::default(),
            heartbeat: Heartbeat::default(),
            dns: Default::default(),
            issuer: Default::default(),
            traffic: Default::default(),
            events: events::Events::default(),
            connections: clients::Slots::new(admin::MAX_CONNECTIONS, admin::MAX_CONNECTIONS),
            bodies: Arc::default(),
        }
    }
}

/// Writes the families of `/metrics` that move with every request (traffic) or every event
/// (the events dropped for slow clients), as they are now.
fn write_traffic_metrics(
    text: &mut String,
    traffic: &crate::traffic::TrafficHandle,
    events: &events::Events,
    connections: &clients::Slots,
) {
    metrics::write_traffic(text, &traffic.table().snapshot(), &traffic.figures());
    metrics::write_handshake_failures(text, &traffic.handshakes().snapshot());
    metrics::write_capacity(text, &traffic.capacity().snapshot());
    metrics::write_events(text, events);
    metrics::write_admin_connections(text, connections);
}

/// `/v1/state` and `/metrics` as last rendered, with what they were rendered from: a request
/// while nothing changed gets the same bytes, shared, not a copy of its own.
#[derive(Default)]
pub struct Bodies {
    /// `/v1/state`, with its entity tag: a client that sends it back (`If-None-Match`) while
    /// nothing changed gets `304 Not Modified`, and nothing is rendered or sent (`top` polls so).
    state: tokio::sync::Mutex<Option<(Version, u64, bytes::Bytes)>>,
    /// How many times `/v1/state` was rendered: the entity tags.
    state_renders: std::sync::atomic::AtomicU64,
    /// `/v1/state` without its `traffic`, which moves every second while requests come: the
    /// routes' part, megabytes at 10,000 routes, is rendered once per change of what it shows,
    /// and each new body is that front with the traffic appended ([`compose`]). A `top` reading
    /// every refresh costs the agent the traffic's part, not the whole document.
    state_front: tokio::sync::Mutex<Option<(Version, bytes::Bytes)>>,
    /// The agent's own families of `/metrics`, deflated ([`gzip`]), with what they were
    /// rendered from (the traffic's version aside, which they do not show). Only the deflated
    /// bytes are kept, a tenth of the text: the text is written again for each plain scrape.
    metrics_deflated: tokio::sync::Mutex<Option<(Version, Arc<gzip::Deflated>)>>,
    /// The length of the last `/metrics` text (plain) and of its own families alone: the next
    /// one's buffer is sized from them, not grown by doubling.
    metrics_len: std::sync::atomic::AtomicUsize,
    own_metrics_len: std::sync::atomic::AtomicUsize,
}

/// What a body was rendered from: the loop's snapshot, and the DNS table's, the issuer's and
/// the traffic status's versions.
///
/// The snapshot is held weakly, compared by identity: a weak reference keeps its allocation,
/// so no later snapshot can take its address, but not its routes. A strong one kept every
/// route's status and lines of a snapshot long replaced alive until the next scrape: after a
/// mass renewal, the whole previous generation (tens of megabytes at 10,000 routes), freed only
/// after the trim that follows churn had run.
#[derive(Clone)]
struct Version(std::sync::Weak<Snapshot>, u64, u64, u64);

impl PartialEq for Version {
    fn eq(&self, other: &Version) -> bool {
        std::sync::Weak::ptr_eq(&self.0, &other.0)
            && self.1 == other.1
            && self.2 == other.2
            && self.3 == other.3
    }
}

/// `/v1/state` from its `front` (the document without `traffic`, which is its last field) and
/// the traffic: the same bytes as the whole document serialized at once.
fn compose(front: &[u8], traffic: Option<&TrafficStatus>) -> Result<Vec<u8>, serde_json::Error> {
    let Some(traffic) = traffic else {
        return Ok(front.to_vec());
    };
    let open = front.strip_suffix(b"}").unwrap_or(front);
    let mut body = Vec::with_capacity(front.len() + 64 * traffic.routes.len() + 256);
    body.extend_from_slice(open);
    body.extend_from_slice(b",\"traffic\":");
    serde_json::to_writer(&mut body, traffic)?;
    body.push(b'}');
    Ok(body)
}

/// `/v1/state` as the admin server sends it.
pub enum StateBody {
    Full { etag: String, body: bytes::Bytes },
    NotModified { etag: String },
}

/// A strong entity tag for the `tag`th rendering of this agent's `/v1/state`: the agent's
/// instance in it, so that a restarted agent's first body is not taken for the last one's.
fn entity_tag(tag: u64) -> String {
    format!("\"{}-{tag}\"", events::instance())
}

/// Whether an `If-None-Match` value names `etag` (`*`, or a list of tags, weak or strong:
/// RFC 9110, 13.1.2 compares weakly).
fn etag_matches(if_none_match: &str, etag: &str) -> bool {
    if_none_match.split(',').any(|t| {
        let t = t.trim();
        t == "*" || t.strip_prefix("W/").unwrap_or(t) == etag
    })
}

/// When the reconcile loop last turned: `/healthz` answers from it. A loop that waits for
/// facts still turns at least every ten seconds; one that has not turned for
/// [`Heartbeat::stale_after`] is wedged (a pass is bounded by sozu's request deadlines), and
/// only a restart repairs that.
#[derive(Debug, Clone)]
pub struct Heartbeat(Arc<Beats>);

#[derive(Debug)]
struct Beats {
    origin: tokio::time::Instant,
    /// Milliseconds since `origin` of the last turn.
    last: std::sync::atomic::AtomicU64,
    stale_after: std::time::Duration,
}

impl Default for Heartbeat {
    fn default() -> Self {
        Heartbeat::new(DEFAULT_STALE_AFTER)
    }
}

/// The longest the loop may go without turning before `/healthz` fails, unless `run` is told
/// otherwise: the tick every 10 s, and room for a pass against a sozu that answers nothing (a
/// few requests, each bounded by `--sozu-timeout-ms`).
pub const DEFAULT_STALE_AFTER: std::time::Duration = std::time::Duration::from_secs(60);

impl Heartbeat {
    /// A heart that has just beaten.
    pub fn new(stale_after: std::time::Duration) -> Heartbeat {
        Heartbeat(Arc::new(Beats {
            origin: tokio::time::Instant::now(),
            last: std::sync::atomic::AtomicU64::new(0),
            stale_after,
        }))
    }

    /// The loop turned.
    pub fn beat(&self) {
        let since = self.0.origin.elapsed().as_millis();
        self.0.last.store(
            u64::try_from(since).unwrap_or(u64::MAX),
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// How long since the loop last turned.
    pub fn age(&self) -> std::time::Duration {
        let last = self.0.last.load(std::sync::atomic::Ordering::Relaxed);
        self.0
            .origin
            .elapsed()
            .saturating_sub(std::time::Duration::from_millis(last))
    }

    /// `Err(age)` when the loop has not turned for longer than the bound.
    pub fn check(&self) -> Result<(), std::time::Duration> {
        let age = self.age();
        if age > self.0.stale_after {
            Err(age)
        } else {
            Ok(())
        }
    }

    pub fn stale_after(&self) -> std::time::Duration {
        self.0.stale_after
    }
}

impl Views {
    /// The DNS names, and the counters with the DNS source's failures counted in.
    pub fn dns(&self, counters: &Counters) -> (Vec<DnsNameStatus>, Counters) {
        let dns = self.dns.lock().unwrap_or_else(|p| p.into_inner());
        let mut counters = counters.clone();
        counters.dns_failures = dns.failures_total;
        counters.dns_dropped_addresses = dns.dropped_total;
        (dns.names.values().cloned().collect(), counters)
    }

    /// One consistent document: the loop's status with each DNS name's state.
    pub fn snapshot(&self) -> Document {
        let snapshot = self.status.load();
        let (dns, counters) = self.dns(&snapshot.head.counters);
        let mut status = snapshot.status(&dns);
        status.counters = counters;
        status.issuer = self.issuer.snapshot();
        status.traffic = self.traffic.status().map(|t| (*t).clone());
        status
    }

    fn version(&self) -> Version {
        let dns = self.dns.lock().unwrap_or_else(|p| p.into_inner()).version;
        Version(
            Arc::downgrade(&self.status.load()),
            dns,
            self.issuer.version(),
            self.traffic.version(),
        )
    }

    /// `/v1/state` as bytes to send: rendered once per change, on [`low_priority`]'s thread.
    pub async fn state_body(&self) -> Result<bytes::Bytes, serde_json::Error> {
        match self.state_body_unless(None).await? {
            StateBody::Full { body, .. } => Ok(body),
            StateBody::NotModified { .. } => unreachable!("no tag was given"),
        }
    }

    /// `/v1/state`, or [`StateBody::NotModified`] when `if_none_match` (a client's
    /// `If-None-Match`) names the body that is current: nothing to render or send.
    pub async fn state_body_unless(
        &self,
        if_none_match: Option<&str>,
    ) -> Result<StateBody, serde_json::Error> {
        let mut slot = self.bodies.state.lock().await;
        let version = self.version();
        if let Some((rendered, tag, body)) = slot.as_ref() {
            if *rendered == version {
                let etag = entity_tag(*tag);
                return Ok(match if_none_match {
                    Some(asked) if etag_matches(asked, &etag) => StateBody::NotModified { etag },
                    _ => StateBody::Full {
                        etag,
                        body: body.clone(),
                    },
                });
            }
        }
        let front = self.state_front(&version).await?;
        let traffic = self.traffic.status();
        let body: bytes::Bytes = low_priority::run(move || compose(&front, traffic.as_deref()))
            .await?
            .into();
        let tag = 1 + self
            .bodies
            .state_renders
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        *slot = Some((version, tag, body.clone()));
        Ok(StateBody::Full {
            etag: entity_tag(tag),
            body,
        })
    }

    /// `/metrics` as bytes to send: the agent's own families and the traffic families written
    /// into one buffer, on the low-priority thread ([`low_priority`]). Nothing of it is kept:
    /// the routes' lines are written from their status ([`metrics::render`]).
    pub async fn metrics_body(&self) -> Result<bytes::Bytes, serde_json::Error> {
        let views = self.clone();
        let body = low_priority::run(move || {
            let last = &views.bodies.metrics_len;
            let mut text = views.own_metrics_sized(last.load(Relaxed));
            write_traffic_metrics(&mut text, &views.traffic, &views.events, &views.connections);
            last.store(text.len() + text.len() / 16, Relaxed);
            bytes::Bytes::from(text)
        })
        .await;
        Ok(body)
    }

    /// [`Self::metrics_body`] as one gzip member: the agent's own families deflated once per
    /// change of what they show, the traffic families at each scrape. `None` when deflating
    /// failed (the caller sends the text as it is).
    ///
    /// What was deflated is known by what it was rendered from ([`Version`], the traffic's
    /// aside): the snapshot (by identity), the DNS table's and the issuer's versions. The text
    /// itself is not kept to compare with.
    pub async fn metrics_gzip(&self) -> Result<Option<bytes::Bytes>, serde_json::Error> {
        // Held while deflating: a second scraper waits for the first's front.
        let mut slot = self.bodies.metrics_deflated.lock().await;
        let version = self.version();
        let own = Version(version.0, version.1, version.2, 0);
        let front = match slot.as_ref() {
            Some((deflated_from, front)) if *deflated_from == own => front.clone(),
            _ => {
                let views = self.clone();
                let deflated = low_priority::run(move || {
                    let last = &views.bodies.own_metrics_len;
                    let text = views.own_metrics_sized(last.load(Relaxed));
                    last.store(text.len() + text.len() / 16, Relaxed);
                    gzip::Deflated::new(text.as_bytes())
                })
                .await;
                let Ok(front) = deflated.map(Arc::new) else {
                    return Ok(None);
                };
                *slot = Some((own, front.clone()));
                front
            }
        };
        drop(slot);
        let (traffic, events, connections) = (
            self.traffic.clone(),
            self.events.clone(),
            self.connections.clone(),
        );
        let body = low_priority::run(move || {
            let mut text = String::new();
            write_traffic_metrics(&mut text, &traffic, &events, &connections);
            front.finish(text.as_bytes()).ok()
        })
        .await;
        Ok(body)
    }

    /// `/v1/state` without `traffic`, rendered once per change of the rest (`version`, its
    /// traffic's version aside).
    async fn state_front(&self, version: &Version) -> Result<bytes::Bytes, serde_json::Error> {
        let front_version = Version(version.0.clone(), version.1, version.2, 0);
        let mut slot = self.bodies.state_front.lock().await;
        if let Some((rendered, front)) = slot.as_ref() {
            if *rendered == front_version {
                return Ok(front.clone());
            }
        }
        let views = self.clone();
        let front: bytes::Bytes = low_priority::run(move || views.state_json_with(false))
            .await?
            .into();
        *slot = Some((front_version, front.clone()));
        Ok(front)
    }

    /// `/v1/state`, serialized from the latest snapshot without copying it.
    pub fn state_json(&self) -> Result<Vec<u8>, serde_json::Error> {
        self.state_json_with(true)
    }

    /// `/v1/state`, with its `traffic` or without.
    fn state_json_with(&self, with_traffic: bool) -> Result<Vec<u8>, serde_json::Error> {
        let snapshot = self.status.load();
        let (dns, counters) = self.dns(&snapshot.head.counters);
        let issuer = self.issuer.snapshot();
        let traffic = self.traffic.status().filter(|_| with_traffic);
        serde_json::to_vec(&StatusRef {
            ready: snapshot.head.readiness.ready,
            readiness: &snapshot.head.readiness,
            workspace: &snapshot.head.workspace,
            sozu: &snapshot.head.sozu,
            routes: RoutesRef(&snapshot.routes),
            dns: &dns,
            counters: &counters,
            issuer: issuer.as_ref(),
            traffic: traffic.as_deref(),
        })
    }

    /// `/metrics`'s own families (the loop's, the DNS names', the issuer's): all but the
    /// traffic's.
    pub fn metrics(&self) -> String {
        self.own_metrics_sized(0)
    }

    /// [`Self::metrics`], in a buffer of `capacity` bytes to begin with.
    fn own_metrics_sized(&self, capacity: usize) -> String {
        let snapshot = self.status.load();
        let (dns, counters) = self.dns(&snapshot.head.counters);
        let mut text = String::with_capacity(capacity);
        metrics::render(&mut text, &snapshot, &counters, &dns);
        if let Some(issuer) = self.issuer.snapshot() {
            metrics::write_issuer(&mut text, &issuer);
        }
        if let Some(client_auth) = &snapshot.head.sozu.client_auth {
            metrics::write_client_auth(&mut text, client_auth);
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::document::{RouteState, Waiting};

    /// The document's front and its traffic, put together, are the document.
    #[test]
    fn the_front_and_the_traffic_make_the_whole_document() {
        let mut doc = Document::default();
        doc.routes.push(RouteStatus {
            id: "pi-a".into(),
            ..RouteStatus::default()
        });
        let mut traffic = TrafficStatus::default();
        traffic.routes.insert(
            "pi-a".into(),
            crate::document::RouteTraffic {
                requests: 3,
                ..Default::default()
            },
        );
        let front = serde_json::to_vec(&doc).unwrap();
        assert_eq!(compose(&front, None).unwrap(), front);
        doc.traffic = Some(traffic.clone());
        assert_eq!(
            compose(&front, Some(&traffic)).unwrap(),
            serde_json::to_vec(&doc).unwrap()
        );
    }

    /// `/v1/state` from a snapshot is the document `status` reads back, field for field.
    #[test]
    fn the_borrowed_document_is_the_owned_one() {
        let route = RouteStatus {
            id: "pi-a.in.example.org".into(),
            host: "a.in.example.org".into(),
            path_prefix: "/".into(),
            state: RouteState::Pending,
            waiting_for: vec![Waiting::Dns],
            ..RouteStatus::default()
        };
        let mut routes = imbl::OrdMap::new();
        routes.insert(
            (route.host.clone(), route.path_prefix.clone()),
            Arc::new(RouteView {
                host_wide: true,
                status: route,
            }),
        );
        let views = Views::default();
        views.status.store(Snapshot {
            head: Head {
                readiness: Readiness {
                    ready: true,
                    ..Readiness::default()
                },
                ..Head::default()
            },
            routes,
        });
        {
            let mut dns = views.dns.lock().unwrap();
            dns.names.insert(
                "a.svc".into(),
                DnsNameStatus {
                    name: "a.svc".into(),
                    failures: 2,
                    ..Default::default()
                },
            );
            dns.failures_total = 2;
        }
        let json = views.state_json().unwrap();
        let read: Document = serde_json::from_slice(&json).unwrap();
        assert_eq!(read, views.snapshot());
        assert_eq!(read.counters.dns_failures, 2);
        assert_eq!(read.routes.len(), 1);
    }
}
