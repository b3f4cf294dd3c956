//! The loop against an in-memory sozu, with facts fed straight in and time paused.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::sync::mpsc::UnboundedSender;

use super::{Agent, Settings};
use crate::api::SharedStatus;
use crate::clock::{Clock, TokioClock};
use crate::document::{Document, ReadinessMode, RouteState, Waiting};
use crate::plan::{self, Op, Outcome};
use crate::sources::sozu_events::{Change, ChangeKind, SozuEvent};
use crate::sources::{CertSource, Fact, NameFact};
use crate::sozu::phases::{send_in_phases, SendError};
use crate::sozu::state::{Actual, Certificate};
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
    /// Where sozu's event stream goes, when the test listens as the agent does.
    events: Option<UnboundedSender<Fact>>,
    /// A fact that arrives while sozu takes its request with this number (1-based), as a
    /// swapped pair arrives in the middle of a long pass.
    during: Option<(usize, Fact)>,
    /// The published status, read at each request: whether `/readyz` said ready then, and the
    /// certificate sent, if any.
    watch: Option<(SharedStatus, Vec<SeenAtRequest>)>,
    /// sozu refuses every new set of client certificates for this reason.
    refuse_client_auth: Option<String>,
    /// The client-certificate sets sent, refused or not.
    client_auth_sent: usize,
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
        Delivered::one_by_one(send_in_phases(&ops, 1, |_, op| {
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
                        Some(certificate.fingerprint.clone())
                    }
                    _ => None,
                };
                seen.push((status.load().head.readiness.ready, fingerprint));
            }
            if let Op::AddCertificate { certificate, .. }
            | Op::ReplaceCertificate { certificate, .. } = op
            {
                if s.refuse.contains(&certificate.fingerprint) {
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
            plan::apply(&mut s.actual, op);
            Ok(matches!(op, Op::CloseSessions { .. }).then_some(0))
        }))
    }
    async fn read_cluster(
        &mut self,
        id: String,
    ) -> Result<crate::sozu::state::ClusterState, SozuError> {
        let s = self.0.lock().unwrap();
        Ok(crate::sozu::state::ClusterState {
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
    /// A bulk change as the real proxy sends one: certificates by request, everything else in
    /// one state file, reported once. A file that fails to load in part turns bulk off.
    fn apply_in_bulk(&self, ops: &[Op]) -> Delivered {
        let mut s = self.0.lock().unwrap();
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
    issuer: Option<super::readiness::SharedIssuerProgress>,
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
    let agent = Agent::new(
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
    fn served(&self, host: &str) -> Vec<String> {
        let s = self.sozu.0.lock().unwrap();
        s.actual
            .certificates
            .values()
            .flat_map(|held| {
                held.named(host)
                    .map(|(f, _)| f.to_owned())
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// Hosts with an HTTPS frontend (an HTTP one only redirects, and needs no certificate).
    fn hosts_routed(&self) -> BTreeSet<String> {
        let s = self.sozu.0.lock().unwrap();
        s.actual
            .frontends
            .iter()
            .filter(|f| f.protocol == crate::sozu::state::Protocol::Https)
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

#[tokio::test(start_paused = true)]
async fn converges_and_reports_ready() {
    let h = start(Settings::default());
    h.send(workspace(vec![
        route(A, dns("a.svc")),
        route(B, ip("10.0.0.2:80")),
    ]));
    h.send(answer("a.svc", &["10.0.0.1"], None));
    h.pair(A, 90);
    h.pair(B, 90);
    let status = h.until("ready", |s| s.ready).await;
    assert_eq!(h.hosts_routed(), BTreeSet::from([A.into(), B.into()]));
    assert_eq!(h.backends(A), ["10.0.0.1:80"]);
    assert!(status.routes.iter().all(|r| r.state == RouteState::Ok));
}

/// An IP route is served as soon as its pair is known, beside a DNS route whose name has never
/// resolved: that one is shown waiting for DNS. The agent is ready, serving the other route
/// (strictly, it is not).
#[tokio::test(start_paused = true)]
async fn a_route_needing_dns_waits_alone() {
    a_route_needing_dns_waits_alone_in(ReadinessMode::Serving).await;
    a_route_needing_dns_waits_alone_in(ReadinessMode::Strict).await;
}

async fn a_route_needing_dns_waits_alone_in(readiness: ReadinessMode) {
    let h = start(Settings {
        readiness,
        ..Settings::default()
    });
    h.send(workspace(vec![
        route(A, ip("10.0.0.1:80")),
        route(B, dns("never.svc")),
    ]));
    h.pair(A, 90);
    h.pair(B, 90);
    h.send(answer("never.svc", &[], Some("no answer within 5000 ms")));
    let status = h.until_ok(A).await;
    assert_eq!(h.backends(A), ["10.0.0.1:80"]);
    assert_eq!(
        route_state(&status, B),
        Some((RouteState::Pending, vec![Waiting::Dns]))
    );
    let b = status.routes.iter().find(|r| r.host == B).unwrap();
    assert_eq!(
        b.last_error.as_deref(),
        Some("resolving never.svc: no answer within 5000 ms")
    );
    assert_eq!(status.readiness.routes_not_served, 1, "{readiness}");
    match readiness {
        ReadinessMode::Serving => assert!(status.ready, "{:?}", status.readiness),
        ReadinessMode::Strict => {
            assert!(!status.ready);
            assert_eq!(
                status.readiness.reason.as_deref(),
                Some("not all of the 2 routes can be served (1 not served)")
            );
        }
    }
    // The name resolves: the route gets its backend, and the agent is ready.
    h.send(answer("never.svc", &["10.0.0.9"], None));
    h.until("every route served", |s| {
        s.ready && s.readiness.routes_not_served == 0
    })
    .await;
    assert_eq!(h.backends(B), ["10.0.0.9:80"]);
}

/// Readiness waits for what is not known yet, and not for a route that cannot be served: one
/// host's pair missing, another route's only name failing. Strictly, it waits for every route;
/// and a workspace none of whose routes can be served is not ready in either mode.
#[tokio::test(start_paused = true)]
async fn readiness_waits_for_unknowns_and_not_for_routes_that_cannot_be_served() {
    let missing = |host: &str| {
        Fact::Pairs(vec![(
            host.into(),
            Err(crate::certs::CertError::Unreadable {
                path: format!("/tls/{host}/tls.crt").into(),
                reason: "No such file or directory (os error 2)".into(),
            }),
        )])
    };
    for readiness in [ReadinessMode::Serving, ReadinessMode::Strict] {
        let h = start(Settings {
            readiness,
            ..Settings::default()
        });
        h.send(workspace(vec![
            route(A, ip("10.0.0.1:80")),
            route(B, ip("10.0.0.2:80")),
            route(C, dns("gone.svc")),
        ]));
        h.pair(A, 90);
        h.pair(C, 90);
        // B's pair has not been read yet, nor gone.svc looked up: not ready in either mode.
        let status = h.until_ok(A).await;
        assert!(!status.ready, "{readiness}: {:?}", status.readiness);
        assert_eq!(
            status.readiness.reason.as_deref(),
            Some("1 route(s) wait for their certificate pair to be read or issued")
        );
        h.send(missing(B));
        let status = h
            .until("B's failure shown", |s| {
                s.routes
                    .iter()
                    .any(|r| r.host == B && r.certificate.error.is_some())
            })
            .await;
        assert!(!status.ready, "{readiness}: {:?}", status.readiness);
        assert_eq!(
            status.readiness.reason.as_deref(),
            Some("1 upstream name(s) wait for their first lookup")
        );
        h.send(answer("gone.svc", &[], Some("NXDOMAIN")));
        let status = h
            .until("gone.svc's failure shown", |s| {
                s.routes
                    .iter()
                    .any(|r| r.host == C && r.last_error.is_some())
            })
            .await;
        assert_eq!(status.readiness.routes_not_served, 2, "{readiness}");
        assert_eq!(status.readiness.mode, readiness);
        match readiness {
            ReadinessMode::Serving => assert!(status.ready, "{:?}", status.readiness),
            ReadinessMode::Strict => assert!(!status.ready, "{:?}", status.readiness),
        }
        // B has no frontend (no certificate); C has, and no backend: sozu answers 503.
        assert_eq!(h.hosts_routed(), BTreeSet::from([A.into(), C.into()]));
        // An edit that leaves only the two broken routes: none can be served, not ready.
        h.send(workspace(vec![
            route(B, ip("10.0.0.2:80")),
            route(C, dns("gone.svc")),
        ]));
        let status = h.until("the edit applied", |s| s.routes.len() == 2).await;
        assert!(!status.ready, "{readiness}: {:?}", status.readiness);
        assert_eq!(
            status.readiness.reason.as_deref(),
            Some("none of the 2 routes can be served (2 not served)")
        );
    }
}

/// A users file is read on a thread of its own, which may answer after the first pass: until
/// it has, the route is applied without credentials (everyone refused), and the agent is not
/// ready. Once read, the credentials are in sozu and the agent is ready.
#[tokio::test(start_paused = true)]
async fn readiness_waits_for_a_users_file_to_be_read() {
    let users_file = std::path::PathBuf::from("/etc/auth/admin.users");
    let h = start(Settings::default());
    let mut guarded = route(A, ip("10.0.0.1:80"));
    guarded.policy = Some(Box::new(crate::workspace::RoutePolicy {
        basic_auth: Some(crate::workspace::BasicAuth {
            users_file: users_file.clone(),
            realm: "Admin".into(),
        }),
        ..Default::default()
    }));
    h.send(workspace(vec![guarded]));
    h.pair(A, 90);
    let status = h.until_ok(A).await;
    assert!(!status.ready, "{:?}", status.readiness);
    assert_eq!(
        status.readiness.reason.as_deref(),
        Some("1 policy file(s) wait for their first read")
    );
    let hashes = || {
        let s = h.sozu.0.lock().unwrap();
        s.actual
            .cluster_policies
            .get(&crate::workspace::route_id(A, "/"))
            .map(|p| p.authorized_hashes.clone())
            .unwrap_or_default()
    };
    assert!(hashes().is_empty(), "credentials before the file was read");
    let mut reads = crate::sources::route_policy_files::PolicyFileReads::default();
    let line = format!("alice:{}", "0".repeat(64));
    reads
        .users
        .insert(users_file, Ok(Arc::from(vec![line.clone()])));
    h.send(Fact::PolicyFiles(Box::new(reads)));
    h.until("ready", |s| s.ready).await;
    assert_eq!(hashes(), [line]);
}

/// The issuer's progress as a test sets it.
#[derive(Default)]
struct FakeIssuer(std::sync::Mutex<(u64, super::readiness::Stalled)>);

impl super::readiness::IssuerProgress for FakeIssuer {
    fn version(&self) -> u64 {
        self.0.lock().unwrap().0
    }

    fn stalled(&self) -> super::readiness::Stalled {
        self.0.lock().unwrap().1.clone()
    }
}

/// With `'sozu_managed`, a pair missing from the tls dir is one the agent's issuer is still
/// getting: waited for, until the issuer backs off on that host.
#[tokio::test(start_paused = true)]
async fn with_sozu_managed_a_missing_pair_is_waited_for_until_the_issuer_backs_off() {
    let issuer = Arc::new(FakeIssuer::default());
    let h = start_with(Settings::default(), Some(issuer.clone()));
    let Fact::Workspace(Ok(ws)) = workspace(vec![
        route(A, ip("10.0.0.1:80")),
        route(B, ip("10.0.0.2:80")),
    ]) else {
        unreachable!()
    };
    let mut ws = (*ws).clone();
    ws.tls_rotation = crate::workspace::TlsRotation::SozuManaged;
    h.send(Fact::Workspace(Ok(Arc::new(ws))));
    h.pair(A, 90);
    h.send(Fact::Pairs(vec![(
        B.into(),
        Err(crate::certs::CertError::Unreadable {
            path: format!("/tls/{B}/tls.crt").into(),
            reason: "No such file or directory (os error 2)".into(),
        }),
    )]));
    let status = h
        .until("B's missing pair shown", |s| {
            s.routes
                .iter()
                .any(|r| r.host == B && r.certificate.error.is_some())
        })
        .await;
    assert!(!status.ready, "{:?}", status.readiness);
    assert_eq!(
        status.readiness.reason.as_deref(),
        Some("1 route(s) wait for their certificate pair to be read or issued")
    );
    *issuer.0.lock().unwrap() = (
        1,
        super::readiness::Stalled {
            all: false,
            hosts: BTreeSet::from([B.to_owned()]),
        },
    );
    // The loop reads the issuer at its next turn: at the latest one TICK later.
    tokio::time::sleep(super::driver::TICK).await;
    let status = h.until("ready without B", |s| s.ready).await;
    assert_eq!(status.readiness.routes_not_served, 1);
}

#[tokio::test(start_paused = true)]
async fn a_broken_edit_keeps_the_last_good_workspace_serving() {
    let h = start(Settings::default());
    h.send(workspace(vec![route(A, ip("10.0.0.1:80"))]));
    h.pair(A, 90);
    h.until("ready", |s| s.ready).await;
    h.send(Fact::Workspace(Err("syntax error at ws.ncl:3:1".into())));
    let status = h
        .until("the error shown", |s| s.workspace.last_error.is_some())
        .await;
    assert_eq!(
        status.workspace.last_error.as_deref(),
        Some("syntax error at ws.ncl:3:1")
    );
    assert_eq!(status.counters.workspace_errors, 1);
    assert_eq!(h.hosts_routed(), BTreeSet::from([A.into()]));
    // The next good edit applies, and the error is cleared.
    h.send(workspace(vec![route(B, ip("10.0.0.2:80"))]));
    h.pair(B, 90);
    h.until("the new workspace served", |s| {
        s.ready && s.workspace.last_error.is_none() && s.routes.len() == 1
    })
    .await;
    assert_eq!(h.hosts_routed(), BTreeSet::from([B.into()]));
}

#[tokio::test(start_paused = true)]
async fn a_new_dns_answer_moves_the_backends_and_a_failure_keeps_them() {
    let h = start(Settings::default());
    h.send(workspace(vec![route(A, dns("a.svc"))]));
    h.send(answer("a.svc", &["10.0.0.1"], None));
    h.pair(A, 90);
    h.until("ready", |s| s.ready).await;
    h.send(answer("a.svc", &["10.0.0.7", "fd00::7"], None));
    h.until("moved", |_| {
        h.backends(A) == ["10.0.0.7:80", "[fd00::7]:80"]
    })
    .await;
    h.send(answer("a.svc", &["10.0.0.7", "fd00::7"], Some("SERVFAIL")));
    let status = h
        .until("the failure shown", |s| s.routes[0].last_error.is_some())
        .await;
    assert_eq!(h.backends(A), ["10.0.0.7:80", "[fd00::7]:80"]);
    assert_eq!(status.routes[0].state, RouteState::Error);
}

#[tokio::test(start_paused = true)]
async fn a_restarted_sozu_gets_the_whole_state_back() {
    let h = start(Settings::default());
    h.send(workspace(vec![route(A, ip("10.0.0.1:80"))]));
    h.pair(A, 90);
    h.until("ready", |s| s.ready).await;
    {
        let mut s = h.sozu.0.lock().unwrap();
        s.actual = Actual::default();
        s.restarts += 1;
    }
    h.send(Fact::SozuSocket);
    let status = h
        .until("served again", |s| {
            s.counters.sozu_reconnects == 1 && s.ready
        })
        .await;
    assert_eq!(h.hosts_routed(), BTreeSet::from([A.into()]));
    assert!(status.sozu.generation.unwrap().ends_with("workers 101"));
}

/// sozu down: the loop backs off (jittered, growing), absorbing facts meanwhile, and converges
/// once sozu answers; a new socket ends the wait at once.
#[tokio::test(start_paused = true)]
async fn an_unreachable_sozu_is_retried_with_backoff_and_a_new_socket_ends_the_wait() {
    let h = start(Settings::default());
    h.sozu.0.lock().unwrap().down = true;
    h.send(workspace(vec![route(A, ip("10.0.0.1:80"))]));
    h.pair(A, 90);
    h.until("the failure shown", |s| s.sozu.last_error.is_some())
        .await;
    tokio::time::sleep(Duration::from_secs(20)).await;
    let failures = h.status().counters.reconcile_errors;
    // 100 ms doubling (jittered) to 10 s: about eight attempts in 20 s, not two hundred.
    assert!((5..=12).contains(&failures), "{failures}");
    assert!(!h.status().ready);
    h.sozu.0.lock().unwrap().down = false;
    let started = tokio::time::Instant::now();
    h.send(Fact::SozuSocket);
    h.until("ready", |s| s.ready).await;
    assert!(
        started.elapsed() < Duration::from_millis(10),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(h.hosts_routed(), BTreeSet::from([A.into()]));
}

/// A certificate sozu refuses holds back only its own host, and is retried on its own
/// schedule; another host's rotation meanwhile goes through at once.
#[tokio::test(start_paused = true)]
async fn a_refused_certificate_delays_no_other_host() {
    let h = start(Settings::default());
    h.send(workspace(vec![
        route(A, ip("10.0.0.1:80")),
        route(B, ip("10.0.0.2:80")),
    ]));
    let a = certificate(A, h.clock.now(), 90);
    h.sozu
        .0
        .lock()
        .unwrap()
        .refuse
        .insert(a.fingerprint.clone());
    h.send(Fact::Pairs(vec![(A.into(), Ok(a.clone()))]));
    h.pair(B, 90);
    let status = h
        .until("the refusal shown", |s| {
            s.routes.iter().any(|r| r.last_error.is_some())
                && route_state(s, B).is_some_and(|r| r.0 == RouteState::Ok)
        })
        .await;
    // Ready, serving B; A is reported.
    assert!(status.ready, "{:?}", status.readiness);
    assert_eq!(status.readiness.routes_not_served, 1);
    assert!(status.routes[0]
        .last_error
        .as_deref()
        .unwrap()
        .contains("KeyMismatch"));
    assert_eq!(h.hosts_routed(), BTreeSet::from([B.into()]));
    let requests = h.sozu.0.lock().unwrap().requests;
    // B rotates: served at once, without waiting for A's retry.
    let renewed = h.pair(B, 90);
    h.until("B rotated", |_| {
        h.served(B) == [renewed.fingerprint.clone()]
    })
    .await;
    assert_eq!(
        h.sozu.0.lock().unwrap().requests,
        requests + 1,
        "one request, A's not sent again"
    );
    // sozu takes A's certificate on a retry.
    h.sozu.0.lock().unwrap().refuse.clear();
    h.until("every route served", |s| {
        s.ready && s.readiness.routes_not_served == 0
    })
    .await;
    assert_eq!(h.served(A), [a.fingerprint]);
}

/// While sozu refuses a renewal, the status gives the validity of the certificate it still
/// serves, not the renewal's on disk: the expiry alert is about what clients get.
#[tokio::test(start_paused = true)]
async fn the_served_validity_is_the_served_certificates_while_a_renewal_is_refused() {
    let h = start(Settings::default());
    h.send(workspace(vec![route(A, ip("10.0.0.1:80"))]));
    let old = h.pair(A, 3);
    let status = h.until("ready", |s| s.ready).await;
    let cert = &status.routes[0].certificate;
    assert_eq!(cert.served_not_before, Some(old.not_before));
    assert_eq!(cert.served_not_after, Some(old.not_after));

    let renewed = certificate(A, h.clock.now(), 90);
    h.sozu
        .0
        .lock()
        .unwrap()
        .refuse
        .insert(renewed.fingerprint.clone());
    h.send(Fact::Pairs(vec![(A.into(), Ok(renewed.clone()))]));
    let status = h
        .until("the renewal refused", |s| {
            s.routes[0].last_error.is_some()
                && s.routes[0].certificate.disk_fingerprint.as_ref() == Some(&renewed.fingerprint)
        })
        .await;
    let cert = &status.routes[0].certificate;
    assert_eq!(cert.served_fingerprints, [old.fingerprint]);
    assert_eq!(cert.served_not_after, Some(old.not_after));
    assert_eq!(cert.disk_not_after, Some(renewed.not_after));

    h.sozu.0.lock().unwrap().refuse.clear();
    let status = h.until("ready", |s| s.ready).await;
    assert_eq!(
        status.routes[0].certificate.served_not_after,
        Some(renewed.not_after)
    );
}

#[tokio::test(start_paused = true)]
async fn a_periodic_resync_reads_every_pair_and_repairs_drift() {
    let h = start(Settings::default());
    h.send(workspace(vec![route(A, ip("10.0.0.1:80"))]));
    h.pair(A, 90);
    h.until("ready", |s| s.ready).await;
    // Someone removes the frontends behind the agent's back, same sozu.
    h.sozu.0.lock().unwrap().actual.frontends.clear();
    tokio::time::sleep(Duration::from_secs(59)).await;
    assert!(h.hosts_routed().is_empty(), "not before the resync");
    assert_eq!(h.certs.0.load(Ordering::SeqCst), 0);
    let status = h.until("repaired", |s| s.counters.resyncs == 1).await;
    assert_eq!(h.hosts_routed(), BTreeSet::from([A.into()]));
    assert_eq!(h.certs.0.load(Ordering::SeqCst), 1, "every pair read again");
    assert!(status.ready);
}

#[tokio::test(start_paused = true)]
async fn a_new_pair_replaces_the_served_one_and_the_rotation_is_recorded() {
    let h = start(Settings::default());
    h.send(workspace(vec![route(A, ip("10.0.0.1:80"))]));
    h.pair(A, 90);
    h.until("ready", |s| s.ready).await;
    tokio::time::sleep(Duration::from_secs(3600)).await;
    let renewed = h.pair(A, 90);
    let status = h
        .until("rotated", |s| s.routes[0].certificate.rotations == 1)
        .await;
    assert_eq!(
        h.served(A),
        std::slice::from_ref(&renewed.fingerprint),
        "exactly the new one"
    );
    assert_eq!(
        status.routes[0].certificate.last_rotation,
        Some(1_780_272_000 + 3600),
        "at the clock's time"
    );
    // A refused pair on disk leaves the new one serving, and says why.
    h.send(Fact::Pairs(vec![(
        A.into(),
        Err(crate::certs::CertError::KeyMismatch {
            path: "/tls/a/tls.key".into(),
        }),
    )]));
    let status = h
        .until("refusal shown", |s| s.routes[0].certificate.error.is_some())
        .await;
    assert_eq!(
        status.routes[0].certificate.error_reason.as_deref(),
        Some("key_mismatch")
    );
    assert_eq!(status.counters.certificate_errors, 1);
    assert_eq!(h.served(A), [renewed.fingerprint]);
}

/// The expiry flag turns on by itself when the served certificate enters the warning, no fact
/// needed: 15 days left with a 14-day warning is not flagged, a day later it is.
#[tokio::test(start_paused = true)]
async fn a_served_certificate_is_flagged_when_it_enters_the_expiry_warning() {
    let h = start(Settings::default());
    h.send(workspace(vec![route(A, ip("10.0.0.1:80"))]));
    h.pair(A, 15);
    let status = h.until("ready", |s| s.ready).await;
    assert!(!status.routes[0].certificate.expiring_soon);
    tokio::time::sleep(Duration::from_secs(86_400 - 60)).await;
    assert!(!h.status().routes[0].certificate.expiring_soon);
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert!(h.status().routes[0].certificate.expiring_soon);
}

/// A restarted agent finds sozu serving: until its first reads and lookups it keeps what sozu
/// holds (certificates, frontends, backends) instead of tearing it down, and once the facts
/// match, it sends nothing at all.
#[tokio::test(start_paused = true)]
async fn a_restarted_agent_keeps_what_sozu_serves_until_its_facts_arrive() {
    let first = start(Settings::default());
    let routes = || vec![route(A, dns("a.svc")), route(B, ip("10.0.0.2:80"))];
    first.send(workspace(routes()));
    first.send(answer("a.svc", &["10.0.0.1"], None));
    let a = first.pair(A, 90);
    let b = first.pair(B, 90);
    first.until("ready", |s| s.ready).await;

    // The second agent, on the same sozu, before any pair or answer.
    let sozu = first.sozu.clone();
    let before = sozu.0.lock().unwrap().actual.clone();
    let requests = sozu.0.lock().unwrap().requests;
    let status = SharedStatus::default();
    let (facts, rx) = tokio::sync::mpsc::unbounded_channel();
    let agent = Agent::new(
        sozu.clone(),
        FakeCerts::default(),
        Settings::default(),
        status.clone(),
        first.clock.clone(),
    );
    tokio::spawn(agent.run(rx, std::future::pending()));
    let second = Harness {
        sozu,
        certs: FakeCerts::default(),
        status,
        heartbeat: crate::api::Heartbeat::default(),
        facts,
        clock: first.clock.clone(),
    };
    second.send(workspace(routes()));
    second
        .until("a pass made", |s| s.counters.reconciles >= 1)
        .await;
    assert_eq!(
        second.sozu.0.lock().unwrap().actual,
        before,
        "nothing torn down"
    );
    assert_eq!(second.sozu.0.lock().unwrap().requests, requests);
    second.send(answer("a.svc", &["10.0.0.1"], None));
    second.send(Fact::Pairs(vec![(A.into(), Ok(a)), (B.into(), Ok(b))]));
    second.until("ready", |s| s.ready).await;
    assert_eq!(second.sozu.0.lock().unwrap().actual, before);
    assert_eq!(
        second.sozu.0.lock().unwrap().requests,
        requests,
        "not one request"
    );
}

/// What the loop was told, kept by a test to recompute the desired state from scratch.
#[derive(Default)]
struct Mirror {
    workspace: Option<Arc<crate::workspace::Workspace>>,
    resolved: std::collections::BTreeMap<String, Vec<IpAddr>>,
    last_good: std::collections::BTreeMap<String, Certificate>,
}

/// Incremental passes end where a full recomputation would: random sequences of facts (new and
/// refused pairs, DNS answers and failures, workspace edits adding and removing routes, periodic
/// resyncs, sozu restarts), and after each, planning everything from the same facts against what
/// sozu holds plans nothing.
#[tokio::test(start_paused = true)]
async fn incremental_passes_end_where_a_full_recomputation_would() {
    let hosts: Vec<String> = (0..6).map(|i| format!("h{i}.in.example.org")).collect();
    let names = ["n0.svc", "n1.svc", "n2.svc"];
    for seed in 1..=12u64 {
        let mut rng = fastrand::Rng::with_seed(seed);
        let h = start(Settings::default());
        let mut mirror = Mirror::default();
        // Routes: (host, path prefix) → upstream.
        let mut routes: std::collections::BTreeMap<(usize, &str), Upstream> = Default::default();
        let mut log = Vec::new();
        for step in 0..60 {
            let host = rng.usize(..hosts.len());
            match rng.u8(..10) {
                0..=2 => {
                    let c = certificate(&hosts[host], h.clock.now(), 90);
                    mirror.last_good.insert(hosts[host].clone(), c.clone());
                    h.send(Fact::Pairs(vec![(hosts[host].clone(), Ok(c))]));
                    log.push(format!("new pair {}", hosts[host]));
                }
                3 => {
                    h.send(Fact::Pairs(vec![(
                        hosts[host].clone(),
                        Err(crate::certs::CertError::NoKey {
                            path: "/tls/tls.key".into(),
                        }),
                    )]));
                    log.push(format!("refused pair {}", hosts[host]));
                }
                4..=5 => {
                    let name = names[rng.usize(..names.len())];
                    let addresses: Vec<String> = (0..rng.usize(0..3))
                        .map(|_| format!("10.0.0.{}", rng.u8(1..5)))
                        .collect();
                    let refs: Vec<&str> = addresses.iter().map(String::as_str).collect();
                    let error = refs.is_empty().then_some("SERVFAIL");
                    if !refs.is_empty() {
                        let mut ips: Vec<IpAddr> =
                            refs.iter().map(|a| a.parse().unwrap()).collect();
                        ips.sort();
                        ips.dedup();
                        if mirror
                            .workspace
                            .as_ref()
                            .is_some_and(|w| crate::plan::desired::upstream_names(w).contains(name))
                        {
                            mirror.resolved.insert(name.into(), ips);
                        }
                    }
                    // A failure keeps the last addresses: the source sends them again.
                    let kept: Vec<String> = mirror
                        .resolved
                        .get(name)
                        .map(|a| a.iter().map(ToString::to_string).collect())
                        .unwrap_or_default();
                    let sent: Vec<&str> = if refs.is_empty() {
                        kept.iter().map(String::as_str).collect()
                    } else {
                        refs
                    };
                    h.send(answer(name, &sent, error));
                    log.push(format!("answer {name} {sent:?} {error:?}"));
                }
                6..=7 => {
                    let path = if rng.bool() { "/" } else { "/api" };
                    if routes.remove(&(host, path)).is_none() {
                        let upstream = if rng.bool() {
                            dns(names[rng.usize(..names.len())])
                        } else {
                            ip(&format!("10.1.0.{}:80", rng.u8(1..9)))
                        };
                        routes.insert((host, path), upstream);
                    }
                    let list: Vec<Route> = routes
                        .iter()
                        .map(|((host, path), upstream)| Route {
                            id: crate::workspace::route_id(&hosts[*host], path),
                            host: hosts[*host].clone(),
                            path_prefix: (*path).into(),
                            ..route(&hosts[*host], upstream.clone())
                        })
                        .collect();
                    let mut ws =
                        crate::workspace::test_workspace(std::path::Path::new("/tls"), list);
                    ws.routes
                        .sort_by(|a, b| (&a.host, &a.path_prefix).cmp(&(&b.host, &b.path_prefix)));
                    let ws = Arc::new(ws);
                    let used = crate::plan::desired::upstream_names(&ws);
                    mirror.resolved.retain(|n, _| used.contains(n));
                    let hosts_used: BTreeSet<&str> =
                        ws.routes.iter().map(|r| r.host.as_str()).collect();
                    mirror
                        .last_good
                        .retain(|h, _| hosts_used.contains(h.as_str()));
                    mirror.workspace = Some(ws.clone());
                    h.send(Fact::Workspace(Ok(ws)));
                    log.push(format!("workspace {} routes", routes.len()));
                }
                8 => {
                    tokio::time::sleep(Duration::from_secs(61)).await;
                    log.push("resync".into());
                }
                _ => {
                    {
                        let mut s = h.sozu.0.lock().unwrap();
                        s.actual = Actual::default();
                        s.restarts += 1;
                    }
                    h.send(Fact::SozuSocket);
                    log.push("sozu restarted".into());
                }
            }
            // Let the loop take it all in (paused time: this costs nothing).
            tokio::time::sleep(Duration::from_millis(50)).await;
            let Some(ws) = &mirror.workspace else {
                continue;
            };
            let actual = h.sozu.0.lock().unwrap().actual.clone();
            let (expected, _) = crate::plan::desired::build(
                ws,
                &mirror.resolved,
                &mirror.last_good,
                &Default::default(),
                Some(&actual),
            );
            let missing = crate::plan::plan(&actual, &expected);
            assert!(
                missing.is_empty(),
                "seed {seed}, step {step}: a full pass would still send {:#?}\nafter {log:#?}",
                missing.iter().map(Op::describe).collect::<Vec<_>>()
            );
        }
    }
}

/// A route of `A` over two IP upstreams, the first drained or not.
fn two_upstreams(drain_first: bool) -> Route {
    let mut r = route(A, ip("10.0.0.1:80"));
    r.upstreams = vec![
        crate::workspace::RouteUpstream {
            upstream: ip("10.0.0.1:80"),
            weight: 9,
            drain: drain_first,
        },
        crate::workspace::RouteUpstream {
            upstream: ip("10.0.0.2:80"),
            weight: 1,
            drain: false,
        },
    ];
    r
}

fn upstream_state(status: &Document, address: &str) -> Option<String> {
    status
        .routes
        .iter()
        .flat_map(|r| &r.upstreams)
        .find(|u| u.upstream == address)
        .map(|u| u.state.clone())
}

#[tokio::test(start_paused = true)]
async fn a_drained_upstream_is_draining_until_sozu_says_its_last_connection_ended() {
    use crate::sources::sozu_events::SozuEvent;
    let h = start(Settings::default());
    h.send(workspace(vec![two_upstreams(false)]));
    h.pair(A, 90);
    h.until("ready", |s| s.ready).await;
    assert_eq!(h.backends(A), ["10.0.0.1:80", "10.0.0.2:80"]);

    h.send(workspace(vec![two_upstreams(true)]));
    let status = h
        .until("draining", |s| {
            upstream_state(s, "10.0.0.1:80").is_some_and(|u| u.starts_with("draining"))
        })
        .await;
    assert_eq!(h.backends(A), ["10.0.0.2:80"]);
    // The fake sozu answers that no session was left finishing.
    assert_eq!(
        upstream_state(&status, "10.0.0.1:80").as_deref(),
        Some("draining (0 sessions)")
    );
    assert_eq!(
        upstream_state(&status, "10.0.0.2:80").as_deref(),
        Some("in rotation")
    );
    h.send(Fact::Sozu(SozuEvent::BackendDrained {
        backend_id: format!("pi-{A}-10.0.0.1:80"),
    }));
    h.until("drained", |s| {
        upstream_state(s, "10.0.0.1:80").as_deref() == Some("drained")
    })
    .await;
    // Undrained: back in rotation, with its weight.
    h.send(workspace(vec![two_upstreams(false)]));
    h.until("in rotation", |s| {
        upstream_state(s, "10.0.0.1:80").as_deref() == Some("in rotation")
    })
    .await;
    let s = h.sozu.0.lock().unwrap();
    let weights: Vec<u32> = s.actual.backends[&format!("pi-{A}")]
        .values()
        .map(|b| b.weight)
        .collect();
    assert_eq!(weights, [9, 1]);
}

#[tokio::test(start_paused = true)]
async fn a_route_whose_backends_are_all_down_or_drained_shows_it() {
    use crate::document::BackendHealth;
    use crate::sources::sozu_events::SozuEvent;
    let h = start(Settings::default());
    h.send(workspace(vec![two_upstreams(false)]));
    h.pair(A, 90);
    h.until("ready", |s| s.ready).await;
    let down = |address: &str| {
        Fact::Sozu(SozuEvent::BackendDown {
            backend_id: format!("pi-{A}-{address}"),
        })
    };
    h.send(down("10.0.0.1:80"));
    let status = h
        .until("one down", |s| {
            s.routes[0]
                .upstreams
                .iter()
                .any(|u| u.backends[0].health == BackendHealth::Down)
        })
        .await;
    assert!(!status.routes[0].no_available_backend);
    h.send(down("10.0.0.2:80"));
    let status = h
        .until("none left", |s| s.routes[0].no_available_backend)
        .await;
    assert_eq!(status.routes[0].state, RouteState::Error);
    assert_eq!(
        status.routes[0].last_error.as_deref(),
        Some(
            "every backend is reported down: sozu still tries them (fail-open) and answers 503 when none connects"
        )
    );
    h.send(Fact::Sozu(SozuEvent::BackendUp {
        backend_id: format!("pi-{A}-10.0.0.2:80"),
    }));
    let status = h.until("back", |s| !s.routes[0].no_available_backend).await;
    let b = &status.routes[0].upstreams[1].backends[0];
    assert_eq!((b.health, b.transitions), (BackendHealth::Up, 2));
    // Every upstream drained: no backend, said so.
    let mut both = two_upstreams(true);
    both.upstreams[1].drain = true;
    h.send(workspace(vec![both]));
    let status = h
        .until("all drained", |s| {
            s.routes[0].last_error.as_deref() == Some("every upstream is drained: sozu answers 503")
        })
        .await;
    assert!(status.routes[0].no_available_backend);
    assert!(h.backends(A).is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_frontend_removed_behind_the_agents_back_is_restored_from_the_event_alone() {
    use crate::sources::sozu_events::{Change, ChangeKind, SozuEvent};
    // No periodic resync: only the event can bring the frontend back.
    let h = start(Settings {
        resync: None,
        ..Settings::default()
    });
    h.send(workspace(vec![route(A, ip("10.0.0.1:80"))]));
    h.pair(A, 90);
    h.until("ready", |s| s.ready).await;
    // The agent's own changes, reported by sozu, are not drift.
    let own = |kind| {
        Fact::Sozu(SozuEvent::Changed(Change {
            kind,
            cluster_id: Some(format!("pi-{A}")),
            address: None,
        }))
    };
    h.send(own(ChangeKind::ClusterAdded));
    h.send(own(ChangeKind::FrontendAdded));
    h.send(own(ChangeKind::FrontendAdded));
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(h.status().counters.drift_repairs, 0);
    let requests = h.sozu.0.lock().unwrap().requests;

    // Someone removes the HTTPS frontend: sozu reports it.
    {
        let mut s = h.sozu.0.lock().unwrap();
        let https = s
            .actual
            .frontends
            .iter()
            .find(|f| f.protocol == crate::sozu::state::Protocol::Https)
            .cloned()
            .unwrap();
        s.actual.frontends.remove(&https);
    }
    assert!(h.hosts_routed().is_empty());
    h.send(own(ChangeKind::FrontendRemoved));
    h.until("repaired", |s| s.counters.drift_repairs == 1).await;
    h.until("served again", |_| h.hosts_routed().contains(A))
        .await;
    // One request: the frontend, nothing else.
    assert_eq!(h.sozu.0.lock().unwrap().requests, requests + 1);
}

/// `/healthz` as the kubelet sees it.
async fn healthz(h: &Harness) -> (u16, String) {
    use tower::ServiceExt;
    let views = crate::api::Views {
        status: h.status.clone(),
        heartbeat: h.heartbeat.clone(),
        ..crate::api::Views::default()
    };
    let response = crate::api::admin::router(views, Default::default())
        .oneshot(
            http::Request::get("/healthz")
                .header(http::header::HOST, "127.0.0.1:9180")
                .body(axum::body::Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    let status = response.status().as_u16();
    let body = axum::body::to_bytes(response.into_body(), 1 << 16)
        .await
        .unwrap();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// A loop that waits for facts is alive; one stuck in a pass that never ends is not, and
/// `/healthz` says so once it has not turned for the bound.
#[tokio::test(start_paused = true)]
async fn healthz_fails_when_the_loop_is_wedged() {
    let h = start(Settings::default());
    h.send(workspace(vec![route(A, ip("10.0.0.1:80"))]));
    h.pair(A, 90);
    h.until("ready", |s| s.ready).await;
    // Idle for ten minutes, no fact at all: it still turns.
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert_eq!(healthz(&h).await, (200, "ok\n".to_owned()));
    // A rotation whose request sozu never answers.
    h.sozu.0.lock().unwrap().hang = true;
    h.pair(A, 120);
    tokio::time::sleep(crate::api::DEFAULT_STALE_AFTER - Duration::from_secs(5)).await;
    assert_eq!(healthz(&h).await.0, 200, "within the bound");
    tokio::time::sleep(Duration::from_secs(10)).await;
    let (code, body) = healthz(&h).await;
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("has not turned for"), "{body}");
}

/// A start's bulk pass leaves sozu's reports of its changes queued for the loop, and a pair
/// swapped during it queued behind them. `/readyz` says ready only once the loop has taken them
/// up: the swapped pair is sent before readiness says ready, not after it, behind the start.
#[tokio::test(start_paused = true)]
async fn readiness_waits_for_what_queued_during_the_start() {
    let h = start(Settings {
        resync: None,
        ..Settings::default()
    });
    let hosts: Vec<String> = (0..100).map(|i| format!("h{i}.in.example.org")).collect();
    let swapped = certificate(&hosts[7], h.clock.now(), 90);
    {
        let mut s = h.sozu.0.lock().unwrap();
        s.events = Some(h.facts.clone());
        // Four requests a route (cluster, two frontends, certificate): past the first third.
        s.during = Some((
            150,
            Fact::Pairs(vec![(hosts[7].clone(), Ok(swapped.clone()))]),
        ));
        s.watch = Some((h.status.clone(), Vec::new()));
    }
    h.send(workspace(
        hosts
            .iter()
            .enumerate()
            .map(|(i, host)| route(host, ip(&format!("10.0.2.{}:80", i + 1))))
            .collect(),
    ));
    for host in &hosts {
        h.pair(host, 90);
    }
    h.until("ready", |s| s.ready).await;
    assert_eq!(
        h.served(&hosts[7]),
        std::slice::from_ref(&swapped.fingerprint)
    );
    let s = h.sozu.0.lock().unwrap();
    let seen = &s.watch.as_ref().unwrap().1;
    assert!(seen.len() > 400, "a bulk start: {} requests", seen.len());
    let sent_when_ready = seen
        .iter()
        .find(|(_, fp)| fp.as_deref() == Some(swapped.fingerprint.as_str()))
        .map(|(ready, _)| *ready);
    assert_eq!(
        sent_when_ready,
        Some(false),
        "the swapped pair was sent before /readyz said ready"
    );
    drop(s);
    // Nothing of the start was taken for drift.
    assert_eq!(h.status().counters.drift_repairs, 0);
}

/// sozu reports a request of its own twice and a state file once: the proxy says which went
/// how, so that the agent's own changes are never taken for drift, also once bulk loading has
/// been turned off mid-run and a change as large goes one request at a time.
#[tokio::test(start_paused = true)]
async fn bulk_turned_off_mid_run_counts_no_drift() {
    let h = start(Settings {
        resync: None,
        ..Settings::default()
    });
    {
        let mut s = h.sozu.0.lock().unwrap();
        s.events = Some(h.facts.clone());
        s.bulk_from = Some(crate::sozu::bulk::BATCH_MIN);
    }
    let routes = |from: usize, to: usize| -> Vec<Route> {
        (from..to)
            .map(|i| {
                route(
                    &format!("h{i}.in.example.org"),
                    ip(&format!("10.0.1.{}:80", i + 1)),
                )
            })
            .collect()
    };
    let grow = |to: usize| {
        h.send(workspace(routes(0, to)));
        for i in 0..to {
            h.pair(&format!("h{i}.in.example.org"), 90);
        }
    };
    // A cold start in bulk.
    grow(20);
    h.until("ready", |s| s.ready && s.routes.len() == 20).await;
    let bulk_requests = h.sozu.0.lock().unwrap().requests;
    // The next large change fails to load in part: bulk is off for good, and it is sent again
    // one request at a time.
    h.sozu.0.lock().unwrap().bulk_fails_next = true;
    grow(40);
    h.until("ready", |s| s.ready && s.routes.len() == 40).await;
    assert_eq!(h.sozu.0.lock().unwrap().bulk_from, None, "bulk turned off");
    // A third large change, one request at a time.
    let before = h.sozu.0.lock().unwrap().requests;
    grow(60);
    h.until("ready", |s| s.ready && s.routes.len() == 60).await;
    assert!(
        h.sozu.0.lock().unwrap().requests - before >= crate::sozu::bulk::BATCH_MIN,
        "sent one request at a time"
    );
    assert!(
        bulk_requests < 40,
        "the cold start went in bulk: {bulk_requests} requests"
    );
    // Every report has come in.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let status = h.status();
    assert_eq!(status.counters.drift_repairs, 0, "{:?}", status.counters);
}

/// The HTTPS listener's client certificates as sozu holds them: how many certificates each CRL
/// revokes.
fn crls_held(h: &Harness) -> Vec<usize> {
    use x509_parser::prelude::FromDer;
    let s = h.sozu.0.lock().unwrap();
    let https = s
        .actual
        .listeners
        .iter()
        .find(|(_, (protocol, _))| *protocol == crate::sozu::state::Protocol::Https)
        .map(|(address, _)| *address);
    let held = https
        .and_then(|a| s.actual.listener_settings.get(&a))
        .and_then(|l| l.client_auth.clone())
        .unwrap_or_default();
    held.crls
        .iter()
        .map(|pem| {
            let (_, der) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap();
            let (_, crl) =
                x509_parser::revocation_list::CertificateRevocationList::from_der(&der.contents)
                    .unwrap();
            crl.iter_revoked_certificates().count()
        })
        .collect()
}

/// A workspace asking for client certificates from `/etc/devices/ca.crt` and
/// `/etc/devices/devices.crl`, with one route to A; and the client-auth source's read of them:
/// the CA `devices` and a CRL of it revoking `revoked`, or that CRL refused for `refused`.
fn client_auth_workspace() -> Fact {
    use crate::workspace::{ClientAuth, ClientAuthMode};
    let mut ws = crate::workspace::test_workspace(
        std::path::Path::new("/tls"),
        vec![route(A, ip("10.0.0.1:80"))],
    );
    ws.listener_policy.client_auth = ClientAuth {
        mode: ClientAuthMode::Required,
        ca_file: Some("/etc/devices/ca.crt".into()),
        crl_files: vec!["/etc/devices/devices.crl".into()],
    };
    Fact::Workspace(Ok(Arc::new(ws)))
}

fn client_auth_read(
    devices: &rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
    now: i64,
    revoked: &[u64],
    refused: Option<&str>,
) -> Fact {
    use crate::certs::client_ca::{parse_ca, parse_crl, ClientCaError};
    use std::path::{Path, PathBuf};
    let (ca_file, crl_file) = ("/etc/devices/ca.crt", "/etc/devices/devices.crl");
    let parsed = parse_ca(devices.pem().as_bytes(), Path::new(ca_file), now).unwrap();
    let crl = crate::certs::client_ca::tests::crl_scoped(devices, None, revoked);
    let crl = match refused {
        None => parse_crl(crl.as_bytes(), Path::new(crl_file), &parsed, now),
        Some(reason) => Err(ClientCaError::CrlRefused {
            path: crl_file.into(),
            reason: reason.into(),
        }),
    };
    Fact::ClientAuth(Box::new(crate::sources::client_auth::ClientAuthFiles {
        crls: vec![(PathBuf::from(crl_file), crl)],
        ca: Some((ca_file.into(), Ok(parsed))),
    }))
}

/// At start, a CRL file refused leaves no https listener (none is made without the client
/// certificates the workspace asks for) and `/readyz` says why, for as long as it lasts; the
/// first good read makes the listener at once, not at the next retry of the refused one.
#[tokio::test(start_paused = true)]
async fn no_https_listener_until_the_crls_are_good_and_then_at_once() {
    let h = start(Settings::default());
    h.send(client_auth_workspace());
    h.pair(A, 90);
    let devices = crate::certs::client_ca::tests::ca("devices");
    let now = h.clock.unix();
    h.send(client_auth_read(
        &devices,
        now,
        &[],
        Some("MalformedExtensions"),
    ));
    let status = h
        .until("the listener held back", |s| {
            s.readiness
                .reason
                .as_deref()
                .is_some_and(|r| r.contains("have not all been read good yet"))
        })
        .await;
    assert!(!status.ready);
    // Its retries back off: 1, 2, 4, 8 and 16 s.
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert!(crls_held(&h).is_empty() && !h.status().ready);
    let written = tokio::time::Instant::now();
    h.send(client_auth_read(&devices, now, &[42], None));
    h.until("ready", |s| s.ready).await;
    assert!(
        written.elapsed() < Duration::from_millis(500),
        "the listener waited {:?}",
        written.elapsed()
    );
    assert_eq!(crls_held(&h), [1]);
}

/// sozu refuses the HTTPS listener's new client certificates (a set the agent validated: what
/// its checks cannot foresee, such as a last good CRL that lapsed since): the listener keeps the
/// ones it held and serves on, so the agent stays ready, and the status says that sozu refused
/// the files' set, with sozu's reason, each file showing the version sozu kept. The request is
/// retried with back-off; a newer set goes at once, not at that retry.
#[tokio::test(start_paused = true)]
async fn a_client_auth_set_sozu_refuses_is_shown_with_its_reason_and_a_new_set_goes_at_once() {
    let h = start(Settings::default());
    h.send(client_auth_workspace());
    h.pair(A, 90);
    let devices = crate::certs::client_ca::tests::ca("devices");
    let now = h.clock.unix();
    let read = |revoked: &[u64]| client_auth_read(&devices, now, revoked, None);
    h.send(read(&[]));
    h.until("ready", |s| s.ready).await;
    assert_eq!(crls_held(&h), [0]);

    let reason = "failed to configure client certificate authentication (mTLS): CRL #1 (counted \
                  across client_ca_crls) expired 2 seconds ago: its nextUpdate is past, refresh it";
    h.sozu.0.lock().unwrap().refuse_client_auth = Some(reason.into());
    h.send(read(&[42]));
    let status = h
        .until("sozu's refusal shown", |s| {
            s.sozu
                .client_auth
                .as_ref()
                .is_some_and(|a| a.sozu_refused.is_some())
        })
        .await;
    let auth = status.sozu.client_auth.clone().unwrap_or_default();
    assert_eq!(auth.sozu_refused.as_deref(), Some(reason));
    assert_eq!(auth.crls[0].revoked, Some(0), "the CRL sozu kept: {auth:?}");
    assert_eq!(auth.crls[0].problem, None);
    assert!(status.ready, "{:?}", status.readiness);
    assert_eq!(crls_held(&h), [0]);
    // Retried with back-off, 1 s after the refusal, then 2 s after that one.
    let sent = h.sozu.0.lock().unwrap().client_auth_sent;
    tokio::time::sleep(Duration::from_millis(3_100)).await;
    assert_eq!(h.sozu.0.lock().unwrap().client_auth_sent, sent + 2);
    assert!(h
        .status()
        .sozu
        .client_auth
        .is_some_and(|a| a.sozu_refused.is_some()));

    // A newer set, which sozu takes: sent at once, not at the refusal's next retry (4 s away).
    h.sozu.0.lock().unwrap().refuse_client_auth = None;
    let written = tokio::time::Instant::now();
    h.send(read(&[42, 43]));
    let status = h
        .until("the new set in force", |s| {
            s.sozu
                .client_auth
                .as_ref()
                .is_some_and(|a| a.sozu_refused.is_none() && a.crls[0].revoked == Some(2))
        })
        .await;
    assert!(
        written.elapsed() < Duration::from_millis(500),
        "the new set waited {:?}",
        written.elapsed()
    );
    assert_eq!(crls_held(&h), [2]);
    assert!(status.ready);
}
