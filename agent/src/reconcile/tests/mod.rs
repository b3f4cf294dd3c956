//! The loop against an in-memory sozu, with facts fed straight in and time paused; `state`, a
//! pass and a publish on the reconciler's state alone.

mod backends;
mod certificates;
mod client_auth;
mod edits;
mod overtaking;
mod readiness;
mod resync;
mod sozu;
mod state;

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::sync::mpsc::UnboundedSender;

use super::{Driver, Settings};
use crate::api::SharedStatus;
use crate::clock::{Clock, TokioClock};
use crate::document::{Document, ReadinessMode, RouteState, Waiting};
use crate::plan::state::{Actual, Certificate};
use crate::plan::{self, Op, Outcome};
use crate::sources::sozu_events::{Change, ChangeKind, SozuEvent};
use crate::sources::{CertSource, Fact, NameFact};
use crate::sozu::phases::{send_in_phases, SendError};
use crate::sozu::{Delivered, SozuError};
use crate::sozu::{Generation, Proxy};
use crate::workspace::{test_route as route, Route, Upstream};

/// An in-memory sozu: applies operations as sozu would, can refuse, be down, and "restart".
#[derive(Default)]
struct FakeSozu {
    actual: Actual,
    restarts: i32,
    down: bool,
    /// Fingerprints sozu refuses to load.
    refuse: BTreeSet<String>,
    requests: usize,
    /// A pass's requests never get an answer: the loop is wedged in it.
    hang: bool,
    /// From this many operations on, a plan goes as state files (none: never), as the real
    /// proxy decides; the next bulk change fails to load in part, and turns bulk off for good.
    bulk_from: Option<usize>,
    bulk_fails_next: bool,
    /// A change sent beside the loop waits for this before sozu takes its requests, as an
    /// edit's requests wait for sozu's answers; how many sends have waited for it.
    send_gate: Option<Arc<tokio::sync::Notify>>,
    sends_waiting: usize,
    /// Requests sent past a change under way.
    sent_past: usize,
    /// A resync's read beside the loop waits for this before it answers, as a long read of a
    /// large state does; what it lists is sozu's state once the gate opens.
    read_gate: Option<Arc<tokio::sync::Notify>>,
    /// Resync reads beside the loop fail with this.
    read_fails: Option<String>,
    /// Reads beside the loop started.
    reads_beside: usize,
    /// A sozu listens at a socket the agent has not tried yet (see `crate::sozu::socket`).
    listening_again: bool,
    /// Where sozu's event stream goes, when the test listens as the agent does.
    events: Option<UnboundedSender<Fact>>,
    /// A fact that arrives while sozu takes its request with this number (1-based), as a
    /// swapped pair arrives in the middle of a long pass.
    during: Option<(usize, Fact)>,
    /// The published status, read at each request (and each bulk change): whether `/readyz`
    /// said ready then, and the certificate sent, if any.
    watch: Option<(SharedStatus, Vec<SeenAtRequest>)>,
    /// sozu refuses every new set of client certificates for this reason.
    refuse_client_auth: Option<String>,
    /// The client-certificate sets sent, refused or not.
    client_auth_sent: usize,
    /// Listeners sozu cannot bind (another process holds the port): their activation fails.
    unbindable: BTreeSet<std::net::SocketAddr>,
}

/// Whether the status said ready when sozu took a request, and the certificate it carried.
type SeenAtRequest = (bool, Option<String>);

impl FakeSozu {
    /// What sozu's event stream says of a request it received: a change, twice (when its main
    /// process accepts it, and when its workers have applied it).
    fn report(&self, op: &Op) {
        let (kind, cluster_id) = match op {
            Op::AddCluster { id, .. } => (ChangeKind::ClusterAdded, Some(id.clone())),
            Op::RemoveCluster { id } => (ChangeKind::ClusterRemoved, Some(id.clone())),
            Op::AddFrontend(f) => (ChangeKind::FrontendAdded, f.cluster_id.clone()),
            Op::RemoveFrontend(f) => (ChangeKind::FrontendRemoved, f.cluster_id.clone()),
            Op::AddCertificate { .. } => (ChangeKind::CertificateAdded, None),
            Op::ReplaceCertificate { .. } => (ChangeKind::CertificateReplaced, None),
            Op::RemoveCertificate { .. } => (ChangeKind::CertificateRemoved, None),
            _ => return,
        };
        self.emit(kind, cluster_id.clone());
        self.emit(kind, cluster_id);
    }

    fn emit(&self, kind: ChangeKind, cluster_id: Option<String>) {
        if let Some(events) = &self.events {
            let _ = events.send(Fact::Sozu(SozuEvent::Changed(Change {
                kind,
                cluster_id,
                address: None,
            })));
        }
    }
}

#[derive(Clone, Default)]
struct Fake(Arc<Mutex<FakeSozu>>);

impl Proxy for Fake {
    async fn generation(&mut self) -> Result<Generation, SozuError> {
        let s = self.0.lock().unwrap();
        if s.down {
            return Err(SozuError::Connect {
                path: "/run/sozu.sock".into(),
                reason: "connection refused".into(),
            });
        }
        Ok(Generation {
            connection: 1,
            workers: BTreeSet::from([100 + s.restarts]),
        })
    }
    async fn read_state(&mut self) -> Result<Actual, SozuError> {
        Ok(self.0.lock().unwrap().actual.clone())
    }
    fn read_state_beside(&mut self) -> crate::sozu::proxy::ReadBeside {
        let sozu = self.0.clone();
        let gate = {
            let mut s = sozu.lock().unwrap();
            s.reads_beside += 1;
            s.read_gate.clone()
        };
        Box::pin(async move {
            if let Some(gate) = gate {
                gate.notified().await;
            }
            let s = sozu.lock().unwrap();
            match &s.read_fails {
                Some(reason) => Err(SozuError::Channel {
                    request: "ListFrontends".into(),
                    reason: reason.clone(),
                }),
                None => Ok(crate::sozu::proxy::StateRead {
                    actual: s.actual.clone(),
                    ..Default::default()
                }),
            }
        })
    }
    async fn listening_again(&mut self) -> bool {
        std::mem::take(&mut self.0.lock().unwrap().listening_again)
    }
    async fn apply(&mut self, ops: Vec<Op>) -> Delivered {
        if self.0.lock().unwrap().hang {
            return std::future::pending().await;
        }
        let bulk = {
            let s = self.0.lock().unwrap();
            s.bulk_from.is_some_and(|n| ops.len() >= n)
        };
        if bulk {
            return self.apply_in_bulk(&ops);
        }
        self.send(&ops)
    }
    /// Every change but a bulk one; the send waits for `send_gate` when there is one.
    fn send_beside(&mut self, ops: Vec<Op>) -> Result<crate::sozu::proxy::SendBeside, Vec<Op>> {
        let (hang, bulk, gate) = {
            let s = self.0.lock().unwrap();
            (
                s.hang,
                s.bulk_from.is_some_and(|n| ops.len() >= n),
                s.send_gate.clone(),
            )
        };
        if bulk {
            return Err(ops);
        }
        let fake = self.clone();
        Ok(Box::pin(async move {
            if hang {
                return std::future::pending().await;
            }
            if let Some(gate) = gate {
                fake.0.lock().unwrap().sends_waiting += 1;
                gate.notified().await;
            }
            fake.send(&ops)
        }))
    }
    async fn apply_past(&mut self, ops: Vec<Op>) -> Delivered {
        self.0.lock().unwrap().sent_past += ops.len();
        self.send(&ops)
    }
    async fn read_cluster(
        &mut self,
        id: String,
    ) -> Result<crate::plan::state::ClusterState, SozuError> {
        let s = self.0.lock().unwrap();
        Ok(crate::plan::state::ClusterState {
            exists: s.actual.clusters.contains(&id),
            backends: s.actual.backends.get(&id).cloned().unwrap_or_default(),
            health_check: s.actual.health_checks.get(&id).cloned(),
            policy: s.actual.cluster_policies.get(&id).cloned(),
            frontends: s
                .actual
                .frontends
                .iter()
                .filter(|f| f.cluster_id.as_deref() == Some(id.as_str()))
                .cloned()
                .collect(),
        })
    }
}

impl Fake {
    /// The fingerprints of the certificates sozu holds for `host`, on any listener.
    fn served(&self, host: &str) -> Vec<std::sync::Arc<str>> {
        let s = self.0.lock().unwrap();
        s.actual
            .certificates
            .values()
            .flat_map(|held| {
                held.named(host)
                    .map(|(f, _)| std::sync::Arc::clone(f))
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// Sends `ops` one request at a time, as sozu takes them.
    fn send(&self, ops: &[Op]) -> Delivered {
        Delivered::one_by_one(send_in_phases(ops, 1, |_, op| self.take(op)))
    }

    /// One request, as sozu takes it.
    fn take(&self, op: &Op) -> Result<Option<u64>, SendError> {
        let mut s = self.0.lock().unwrap();
        if s.down {
            return Err(SendError::Broken("EPIPE".into()));
        }
        s.requests += 1;
        s.report(op);
        if s.during.as_ref().is_some_and(|(at, _)| *at == s.requests) {
            if let (Some((_, fact)), Some(facts)) = (s.during.take(), &s.events) {
                let _ = facts.send(fact);
            }
        }
        if let Some((status, seen)) = &mut s.watch {
            let fingerprint = match op {
                Op::AddCertificate { certificate, .. }
                | Op::ReplaceCertificate { certificate, .. } => {
                    Some(certificate.fingerprint.to_string())
                }
                _ => None,
            };
            seen.push((status.load().head.readiness.ready, fingerprint));
        }
        if let Op::AddCertificate { certificate, .. } | Op::ReplaceCertificate { certificate, .. } =
            op
        {
            if s.refuse.contains(&*certificate.fingerprint) {
                return Err(SendError::Refused("KeyMismatch".into()));
            }
        }
        // What the real proxy refuses before sending: a listener it cannot build (an https
        // one without its client certificates).
        if let Err(e) = crate::sozu::request::to_request(op) {
            return Err(match e {
                SozuError::Refused { message, .. } => SendError::Refused(message),
                other => SendError::Broken(other.to_string()),
            });
        }
        if let Op::SetClientAuth { .. } = op {
            s.client_auth_sent += 1;
            if let Some(reason) = &s.refuse_client_auth {
                return Err(SendError::Refused(reason.clone()));
            }
        }
        if let Op::ActivateListener { address, .. } = op {
            if s.unbindable.contains(address) {
                return Err(SendError::Refused(format!(
                    "Could not activate TCP listener: could not bind to socket {address}: \
                     Address already in use (os error 98)"
                )));
            }
        }
        if let Some(reason) = plan::refusal(&s.actual, op) {
            return Err(SendError::Refused(reason));
        }
        plan::apply(&mut s.actual, op);
        Ok(matches!(op, Op::CloseSessions { .. }).then_some(0))
    }

    /// A bulk change as the real proxy sends one: certificates by request, everything else in
    /// one state file, reported once. A file that fails to load in part turns bulk off.
    fn apply_in_bulk(&self, ops: &[Op]) -> Delivered {
        let mut s = self.0.lock().unwrap();
        if let Some((status, seen)) = &mut s.watch {
            seen.push((status.load().head.readiness.ready, None));
        }
        let certificate = |op: &Op| {
            matches!(
                op,
                Op::AddCertificate { .. }
                    | Op::ReplaceCertificate { .. }
                    | Op::RemoveCertificate { .. }
            )
        };
        let in_file: Vec<bool> = ops.iter().map(|op| !certificate(op)).collect();
        for op in ops.iter().filter(|op| certificate(op)) {
            s.requests += 1;
            s.report(op);
            plan::apply(&mut s.actual, op);
        }
        let fails = std::mem::take(&mut s.bulk_fails_next);
        // sozu applies what it can of a file and skips the rest; it reports the load once.
        for op in ops.iter().filter(|op| !certificate(op)) {
            plan::apply(&mut s.actual, op);
        }
        s.requests += 1;
        s.emit(ChangeKind::Loaded, None);
        let file_outcome = if fails {
            s.bulk_from = None;
            Outcome::NotSent("sozu loaded the bulk state only in part".into())
        } else {
            Outcome::Applied
        };
        let outcomes = ops
            .iter()
            .map(|op| {
                if certificate(op) {
                    Outcome::Applied
                } else {
                    file_outcome.clone()
                }
            })
            .collect();
        Delivered {
            outcomes,
            in_file,
            files: 1,
        }
    }
}

#[derive(Clone, Default)]
struct FakeCerts(Arc<AtomicUsize>);

impl CertSource for FakeCerts {
    fn reread(&self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

const A: &str = "a.in.example.org";
const B: &str = "b.in.example.org";
const C: &str = "c.in.example.org";

fn dns(name: &str) -> Upstream {
    Upstream::Dns {
        name: name.into(),
        port: 80,
    }
}

fn ip(address: &str) -> Upstream {
    Upstream::Ip {
        address: address.parse().unwrap(),
    }
}

fn workspace(routes: Vec<Route>) -> Fact {
    Fact::Workspace(Ok(Arc::new(crate::workspace::test_workspace(
        std::path::Path::new("/tls"),
        routes,
    ))))
}

fn answer(name: &str, addresses: &[&str], error: Option<&str>) -> Fact {
    Fact::Dns(NameFact {
        name: name.into(),
        addresses: (!addresses.is_empty()).then(|| {
            addresses
                .iter()
                .map(|a| a.parse::<IpAddr>().unwrap())
                .collect()
        }),
        error: error.map(str::to_owned),
    })
}

/// A certificate for `host` valid from a day before `now` for `days`, parsed as the cert
/// source would hand it over.
fn certificate(host: &str, now: SystemTime, days: u64) -> Certificate {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(vec![host.to_owned()]).unwrap();
    let since = now.duration_since(SystemTime::UNIX_EPOCH).unwrap();
    params.not_before = rcgen::date_time_ymd(1970, 1, 1) + since - Duration::from_secs(86_400);
    params.not_after =
        rcgen::date_time_ymd(1970, 1, 1) + since + Duration::from_secs(days * 86_400);
    let crt = params.self_signed(&key).unwrap().pem();
    crate::certs::parse(
        crt.as_bytes(),
        std::path::Path::new("/tls/tls.crt"),
        key.serialize_pem().as_bytes(),
        std::path::Path::new("/tls/tls.key"),
        host,
        crate::clock::unix_seconds(now),
    )
    .unwrap()
}

struct Harness {
    sozu: Fake,
    certs: FakeCerts,
    status: SharedStatus,
    heartbeat: crate::api::Heartbeat,
    facts: UnboundedSender<Fact>,
    clock: Arc<TokioClock>,
}

fn start(settings: Settings) -> Harness {
    start_with(settings, None)
}

fn start_with(
    settings: Settings,
    issuer: Option<crate::reconcile::readiness::SharedIssuerProgress>,
) -> Harness {
    let sozu = Fake::default();
    let certs = FakeCerts::default();
    let status = SharedStatus::default();
    let (facts, rx) = tokio::sync::mpsc::unbounded_channel();
    // 2026-06-01.
    let clock = Arc::new(TokioClock::starting_at(
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_780_272_000),
    ));
    let heartbeat = crate::api::Heartbeat::default();
    let agent = Driver::new(
        sozu.clone(),
        certs.clone(),
        settings,
        status.clone(),
        clock.clone(),
    )
    .with_heartbeat(heartbeat.clone());
    let agent = match issuer {
        Some(issuer) => agent.with_issuer(issuer),
        None => agent,
    };
    tokio::spawn(agent.run(rx, std::future::pending()));
    Harness {
        sozu,
        certs,
        status,
        heartbeat,
        facts,
        clock,
    }
}

impl Harness {
    fn send(&self, fact: Fact) {
        self.facts.send(fact).unwrap();
    }

    fn pair(&self, host: &str, days: u64) -> Certificate {
        let c = certificate(host, self.clock.now(), days);
        self.send(Fact::Pairs(vec![(host.into(), Ok(c.clone()))]));
        c
    }

    fn status(&self) -> Document {
        self.status.status()
    }

    /// Waits (in paused time, so at no cost) until the status satisfies `test`.
    async fn until(&self, what: &str, test: impl Fn(&Document) -> bool) -> Document {
        for _ in 0..10_000 {
            let status = self.status();
            if test(&status) {
                return status;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        panic!("{what}: {:#?}", self.status());
    }

    /// Waits until `host`'s route is shown `ok`.
    async fn until_ok(&self, host: &str) -> Document {
        self.until(&format!("{host} served"), |s| {
            route_state(s, host).is_some_and(|r| r.0 == RouteState::Ok)
        })
        .await
    }

    /// Fingerprints sozu holds for `host`.
    fn served(&self, host: &str) -> Vec<std::sync::Arc<str>> {
        self.sozu.served(host)
    }

    /// Hosts with an HTTPS frontend (an HTTP one only redirects, and needs no certificate).
    fn hosts_routed(&self) -> BTreeSet<String> {
        let s = self.sozu.0.lock().unwrap();
        s.actual
            .frontends
            .iter()
            .filter(|f| f.protocol == crate::plan::state::Protocol::Https)
            .map(|f| f.hostname.clone())
            .collect()
    }

    fn backends(&self, host: &str) -> Vec<String> {
        let s = self.sozu.0.lock().unwrap();
        s.actual
            .backends
            .get(&crate::workspace::route_id(host, "/"))
            .map(|b| b.values().map(|b| b.address.to_string()).collect())
            .unwrap_or_default()
    }
}

fn route_state(status: &Document, host: &str) -> Option<(RouteState, Vec<Waiting>)> {
    let r = status.routes.iter().find(|r| r.host == host)?;
    Some((r.state, r.waiting_for.clone()))
}
