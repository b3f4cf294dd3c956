use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::SystemTime;

use super::*;
use crate::acme::ca::RenewalInfo;
use crate::clock::TokioClock;
use crate::workspace::{Dns01, Propagation, Upstream};

/// What the fake CA does with the next order of a host.
#[derive(Debug, Clone)]
enum Script {
    /// Issues a certificate valid for this many days from an hour ago.
    Issue(u64),
    /// Fails the way a CA that cannot be reached fails.
    Fail,
    /// The order task panics.
    Panic,
}

#[derive(Default)]
struct FakeState {
    /// Per host, what its next orders do; an order with nothing scripted issues 90 days.
    script: BTreeMap<String, VecDeque<Script>>,
    /// Every order placed: (host, Unix seconds).
    orders: Vec<(String, i64)>,
    connects: usize,
    /// Renewal information is offered, and its requests never answer.
    ari_hangs: bool,
}

#[derive(Clone)]
struct FakeCa {
    state: Arc<Mutex<FakeState>>,
    clock: TokioClock,
}

impl Ca for FakeCa {
    type Session = FakeCa;

    async fn connect(&self, _: &Acme, _: &Arc<Store>) -> Result<FakeCa, AcmeError> {
        self.state.lock().unwrap().connects += 1;
        Ok(self.clone())
    }
}

impl Session for FakeCa {
    fn profile_note(&self) -> Option<String> {
        None
    }

    async fn renewal_info(&self, _: &str) -> RenewalInfo {
        if self.state.lock().unwrap().ari_hangs {
            return std::future::pending().await;
        }
        RenewalInfo::Unsupported
    }

    async fn order(
        &self,
        host: &str,
        _: Option<PendingOrder>,
        _: Option<String>,
        _: &mut (impl Progress + Send),
    ) -> Result<Obtained, Failed> {
        let now = self.clock.unix();
        let next = {
            let mut state = self.state.lock().unwrap();
            state.orders.push((host.to_owned(), now));
            state
                .script
                .get_mut(host)
                .and_then(VecDeque::pop_front)
                .unwrap_or(Script::Issue(90))
        };
        // An order takes a moment at the CA.
        tokio::time::sleep(Duration::from_secs(2)).await;
        match next {
            Script::Issue(days) => Ok(issue(host, self.clock.now(), days)),
            Script::Fail => Err(Failed {
                error: AcmeError::Unreachable("connection refused".into()),
                authorization_failed: false,
                placed: true,
                retry_after: None,
            }),
            Script::Panic => panic!("the order of {host} panicked"),
        }
    }
}

fn issue(host: &str, now: SystemTime, days: u64) -> Obtained {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(vec![host.to_owned()]).unwrap();
    let since = now.duration_since(SystemTime::UNIX_EPOCH).unwrap();
    params.not_before = rcgen::date_time_ymd(1970, 1, 1) + since - Duration::from_secs(3_600);
    params.not_after =
        rcgen::date_time_ymd(1970, 1, 1) + since + Duration::from_secs(days * 86_400);
    let chain_pem = params.self_signed(&key).unwrap().pem();
    let key_pem = key.serialize_pem();
    let certificate = crate::certs::parse(
        chain_pem.as_bytes(),
        std::path::Path::new("chain"),
        key_pem.as_bytes(),
        std::path::Path::new("key"),
        host,
        crate::clock::unix_seconds(now),
    )
    .unwrap();
    Obtained {
        chain_pem,
        key_pem: key_pem.into(),
        certificate,
        placed: true,
    }
}

struct Running {
    ca: FakeCa,
    status: IssuerHandle,
    tls_dir: tempfile::TempDir,
    _state_dir: tempfile::TempDir,
    workspace: watch::Sender<Option<Arc<Workspace>>>,
}

const A: &str = "a.in.example.org";
const B: &str = "b.in.example.org";

/// The issuer, for `hosts`, against the fake CA: 2026-06-01 and paused time.
fn start(hosts: &[&str], script: &[(&str, Vec<Script>)]) -> Running {
    start_seeded(hosts, script, 7)
}

/// [`start`] with the jitter's seed, which each agent draws for itself.
fn start_seeded(hosts: &[&str], script: &[(&str, Vec<Script>)], seed: u64) -> Running {
    let clock =
        TokioClock::starting_at(SystemTime::UNIX_EPOCH + Duration::from_secs(1_780_272_000));
    let ca = FakeCa {
        state: Arc::default(),
        clock,
    };
    for (host, steps) in script {
        ca.state
            .lock()
            .unwrap()
            .script
            .insert((*host).to_owned(), steps.iter().cloned().collect());
    }
    let (tls_dir, state_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let routes = hosts
        .iter()
        .map(|h| {
            crate::workspace::test_route(
                h,
                Upstream::Ip {
                    address: "10.0.0.1:80".parse().unwrap(),
                },
            )
        })
        .collect();
    let mut workspace = crate::workspace::test_workspace(tls_dir.path(), routes);
    workspace.tls_rotation = TlsRotation::SozuManaged;
    workspace.acme = Some(Box::new(Acme {
        directory: "https://ca.test/dir".into(),
        email: None,
        profile: None,
        ca_bundle: None,
        eab: None,
        dns01: Dns01::Cloudflare {
            api_token_file: "/dev/null".into(),
        },
        propagation: Propagation {
            nameservers: None,
            timeout_secs: 60,
        },
        state_dir: state_dir.path().to_owned(),
    }));
    let (workspace_tx, workspaces) = watch::channel(Some(Arc::new(workspace)));
    let status = IssuerHandle::default();
    let options = Options {
        tls_dir: None,
        knobs: Knobs::default(),
        written: None,
        status: status.clone(),
        clock: Arc::new(clock),
        seed,
    };
    tokio::spawn(run_with(ca.clone(), workspaces, options));
    Running {
        ca,
        status,
        tls_dir,
        _state_dir: state_dir,
        workspace: workspace_tx,
    }
}

impl Running {
    fn host(&self, host: &str) -> HostStatus {
        self.status
            .snapshot()
            .and_then(|s| s.hosts.get(host).cloned())
            .unwrap_or_default()
    }

    fn orders(&self, host: &str) -> Vec<i64> {
        let state = self.ca.state.lock().unwrap();
        state
            .orders
            .iter()
            .filter(|(h, _)| h == host)
            .map(|(_, at)| *at)
            .collect()
    }

    /// Waits, in paused time (so at no cost), until `host`'s status satisfies `test`: looks
    /// every second for an hour, then every ten minutes for 120 days.
    async fn until(&self, host: &str, what: &str, test: impl Fn(&HostStatus) -> bool) {
        for i in 0..3_600 + 120 * 144 {
            if test(&self.host(host)) {
                return;
            }
            let step = if i < 3_600 { 1 } else { 600 };
            tokio::time::sleep(Duration::from_secs(step)).await;
        }
        panic!("{host}: {what}: {:?}", self.host(host));
    }
}

/// A first issuance at once, written into the tls dir; the renewal at a third of the
/// lifetime before expiry, with its jitter, and not before.
#[tokio::test(start_paused = true)]
async fn a_host_is_issued_at_once_and_renewed_at_its_time() {
    let running = start(&[A], &[]);
    running.until(A, "issued", |h| h.state == "valid").await;
    let first = running.host(A);
    assert_eq!(running.orders(A).len(), 1);
    assert!(running.tls_dir.path().join(A).join("tls.crt").exists());
    let due = first.renewal_due.unwrap();
    let not_after = first.valid_until.unwrap();
    // 90 days: renewed with 30 days left, up to 3 days earlier.
    assert!(
        (not_after - 33 * 86_400..=not_after - 30 * 86_400).contains(&due),
        "{first:?}"
    );
    running
        .until(A, "renewed", |h| h.certificates_issued == 2)
        .await;
    let orders = running.orders(A);
    assert_eq!(orders.len(), 2, "{orders:?}");
    assert!(
        orders[1] >= due && orders[1] <= due + 2,
        "{orders:?} due {due}"
    );
}

/// Replicas of `'sozu_managed` renewing the same host: each is an issuer of its own, with a
/// seed of its own (`run::instance_seed`: the pod's name and its start), so their renewals
/// of one 90-day certificate fall apart in the 3-day window instead of in the same minute,
/// and each orders once, at its own time.
#[tokio::test(start_paused = true)]
async fn replicas_renew_the_same_host_each_once_at_its_own_time() {
    let replicas = [
        start_seeded(&[A], &[], 0x5eed_0001),
        start_seeded(&[A], &[], 0x5eed_0002),
    ];
    for replica in &replicas {
        replica.until(A, "issued", |h| h.state == "valid").await;
    }
    let dues: Vec<i64> = replicas
        .iter()
        .map(|r| r.host(A).renewal_due.unwrap())
        .collect();
    assert!((dues[0] - dues[1]).abs() >= 3_600, "{dues:?}");
    for replica in &replicas {
        replica
            .until(A, "renewed", |h| h.certificates_issued == 2)
            .await;
    }
    for (replica, due) in replicas.iter().zip(&dues) {
        let orders = replica.orders(A);
        assert_eq!(orders.len(), 2, "{orders:?}");
        assert!(
            orders[1] >= *due && orders[1] <= due + 2,
            "{orders:?} due {due}"
        );
    }
}

/// A failed order backs off and is retried; the other host is not held up.
#[tokio::test(start_paused = true)]
async fn a_failed_order_backs_off_alone() {
    let running = start(&[A, B], &[(A, vec![Script::Fail, Script::Fail])]);
    running.until(B, "issued", |h| h.state == "valid").await;
    running
        .until(A, "backing off", |h| h.state == "backing_off")
        .await;
    running.until(A, "issued", |h| h.state == "valid").await;
    let orders = running.orders(A);
    assert_eq!(orders.len(), 3, "{orders:?}");
    // The second wait is longer than the first.
    assert!(orders[2] - orders[1] > orders[1] - orders[0], "{orders:?}");
    assert_eq!(
        running.host(A).orders_failed.get("ca_unreachable"),
        Some(&2)
    );
}

/// An order task that dies takes one back-off, not the host: the host is given back,
/// shown backing off with the reason, and ordered again.
#[tokio::test(start_paused = true)]
async fn a_panicking_order_task_costs_one_back_off_not_the_host() {
    let running = start(&[A, B], &[(A, vec![Script::Panic])]);
    running
        .until(A, "backing off", |h| h.state == "backing_off")
        .await;
    let host = running.host(A);
    assert_eq!(
        host.backoff.as_ref().map(|b| b.reason.as_str()),
        Some(TASK_FAILED)
    );
    assert_eq!(host.orders_failed.get(TASK_FAILED), Some(&1));
    assert_eq!(host.last_error.as_deref(), Some("the order task panicked"));
    running.until(A, "issued", |h| h.state == "valid").await;
    let orders = running.orders(A);
    assert_eq!(orders.len(), 2, "{orders:?}");
    assert!(
        orders[1] - orders[0] >= 60,
        "after its back-off: {orders:?}"
    );
    running.until(B, "issued", |h| h.state == "valid").await;
    assert_eq!(running.orders(B).len(), 1);
}

/// A pair is restored into the tls dir once, when its host is first seen, not at every
/// wake-up of the loop.
#[tokio::test(start_paused = true)]
async fn stored_pairs_are_restored_once() {
    let running = start(&[A], &[]);
    running.until(A, "issued", |h| h.state == "valid").await;
    let crt = running.tls_dir.path().join(A).join("tls.crt");
    // Someone removes the served files: the issuer does not write them again on its own.
    let data = std::fs::read_link(running.tls_dir.path().join(A).join("..data")).unwrap();
    std::fs::remove_dir_all(running.tls_dir.path().join(A).join(data)).unwrap();
    tokio::time::sleep(Duration::from_secs(7_200)).await;
    assert!(!crt.exists());
    assert_eq!(running.ca.state.lock().unwrap().connects, 1);
}

/// A CA whose renewal-information requests hang stops nothing: the poll gives up at its
/// deadline, and a host added meanwhile is ordered.
#[tokio::test(start_paused = true)]
async fn a_hung_renewal_information_request_holds_up_no_order() {
    let running = start(&[A], &[]);
    running.ca.state.lock().unwrap().ari_hangs = true;
    running.until(A, "issued", |h| h.state == "valid").await;
    // The next wake-up polls A's renewal information, which never answers; B arrives.
    let mut workspace = (**running.workspace.borrow().as_ref().unwrap()).clone();
    workspace.routes.push(crate::workspace::test_route(
        B,
        Upstream::Ip {
            address: "10.0.0.2:80".parse().unwrap(),
        },
    ));
    running.workspace.send_replace(Some(Arc::new(workspace)));
    running.until(B, "issued", |h| h.state == "valid").await;
    assert_eq!(running.orders(B).len(), 1);
}

/// A product build sends the Cloudflare token to Cloudflare alone, and schedules by the
/// certificates' own lifetimes, whatever its environment says.
#[cfg(not(feature = "test-hooks"))]
#[test]
fn a_product_build_reads_no_test_settings() {
    std::env::set_var(
        "PRIVATE_INGRESS_ACME_TEST_CLOUDFLARE_API",
        "https://attacker.example",
    );
    std::env::set_var("PRIVATE_INGRESS_ACME_TEST_LIFETIME_SECS", "20");
    let knobs = Knobs::from_env();
    assert_eq!(knobs.cloudflare_api, super::super::cloudflare::API);
    assert_eq!(knobs.lifetime, None);
}
