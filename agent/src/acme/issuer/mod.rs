//! The issuer's loop. It follows the latest valid workspace (a `watch` channel the reconcile loop
//! publishes to), and for each distinct route host keeps a certificate: restored from the state
//! directory into the tls dir when the host is first seen, ordered when there is none, renewed
//! when [`renewal_policy::next`] says so, retried after failures with back-off, never beyond the rate
//! limits.
//!
//! Orders run as tasks, a bounded number at a time; the loop alone reads and writes host records
//! (a task owns its host's record while it runs and hands it back; a task that dies gives its
//! host back through the store, backing off). A pair is written into the tls dir only after it
//! passed [`crate::certs::parse`], and the loop is then told which host changed (besides the
//! watcher seeing the `..data` swap), so serving does not wait on inotify.
//!
//! The loop is generic over the CA ([`Ca`]) and reads time from a [`Clock`] and jitter from a
//! seeded generator, so that its schedule is tested with paused time against a fake CA. Every
//! file it reads or writes goes through tokio's blocking pool.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::{Id, JoinError, JoinSet};

mod ari;
mod publish;

use crate::acme::ca::{AcmeCa, Ca, Session};
use crate::acme::handle::IssuerHandle;
use crate::acme::order::{Failed, Obtained, Progress};
use crate::acme::renewal_policy::{self, Current, Next, Why};
use crate::acme::store::{HostRecord, Issued, PendingOrder, Store, StoreError};
use crate::acme::{tlsdir, AcmeError};
use crate::clock::Clock;
use crate::document::{Backoff, HostStatus, IssuerStatus, RenewalBasis};
use crate::workspace::{Acme, TlsRotation, Workspace};

/// Orders in flight at once. Each waits mostly on DNS and on the CA; ten keep a first issuance
/// of fifty hosts short without looking like a flood to the CA (Let's Encrypt allows 300 new
/// orders per account per 3 hours).
const MAX_CONCURRENT_ORDERS: usize = 10;
/// Renewal information is asked for again after the CA's Retry-After, but not more often than this.
const MIN_ARI_POLL: i64 = 60;
/// After a failed renewal-information request (the CA down), asked again after this.
const ARI_RETRY: i64 = 3_600;
/// A renewal-information request must be answered by then (its HTTP exchange is bounded
/// already; this bounds any session).
const RENEWAL_INFO_TIMEOUT: Duration = Duration::from_secs(60);
/// The reason a host backs off after its order task died (a panic): shown and counted.
const TASK_FAILED: &str = "task_failed";

/// Settings for tests: in a build with the `test-hooks` feature (the test suite's), read from
/// `PRIVATE_INGRESS_ACME_TEST_*` (docs/acme.md); in any other build, the defaults, whatever the
/// environment says.
#[derive(Debug, Clone)]
pub struct Knobs {
    /// `PRIVATE_INGRESS_ACME_TEST_LIFETIME_SECS`: schedule renewals as if each certificate lived
    /// this long from its notBefore (pebble 2.4 issues 5-year certificates).
    pub lifetime: Option<i64>,
    /// `PRIVATE_INGRESS_ACME_TEST_BACKOFF_SCALE`: divide back-off delays by this (≥ 1).
    pub backoff_scale: f64,
    /// `PRIVATE_INGRESS_ACME_TEST_CLOUDFLARE_API`: Cloudflare's API root.
    pub cloudflare_api: String,
}

impl Default for Knobs {
    fn default() -> Self {
        Knobs {
            lifetime: None,
            backoff_scale: 1.0,
            cloudflare_api: super::cloudflare::API.to_owned(),
        }
    }
}

impl Knobs {
    #[cfg(not(feature = "test-hooks"))]
    pub fn from_env() -> Knobs {
        Knobs::default()
    }

    #[cfg(feature = "test-hooks")]
    pub fn from_env() -> Knobs {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let knobs = Knobs {
            lifetime: var("PRIVATE_INGRESS_ACME_TEST_LIFETIME_SECS")
                .and_then(|v| v.parse().ok())
                .filter(|&v: &i64| v > 0),
            backoff_scale: var("PRIVATE_INGRESS_ACME_TEST_BACKOFF_SCALE")
                .and_then(|v| v.parse().ok())
                .filter(|&v: &f64| v >= 1.0)
                .unwrap_or(1.0),
            cloudflare_api: var("PRIVATE_INGRESS_ACME_TEST_CLOUDFLARE_API")
                .unwrap_or_else(|| super::cloudflare::API.to_owned()),
        };
        if knobs.lifetime.is_some()
            || knobs.backoff_scale > 1.0
            || knobs.cloudflare_api != super::cloudflare::API
        {
            tracing::warn!(
                lifetime_s = knobs.lifetime,
                backoff_scale = knobs.backoff_scale,
                cloudflare_api = %knobs.cloudflare_api,
                "ACME test settings in force (PRIVATE_INGRESS_ACME_TEST_*, a test build)"
            );
        }
        knobs
    }
}

/// Told the host of each pair written.
pub type Written = Box<dyn Fn(&str) + Send + Sync>;

/// What `run` needs besides the workspaces.
pub struct Options {
    /// `--tls-dir`, which overrides the workspace's.
    pub tls_dir: Option<PathBuf>,
    pub knobs: Knobs,
    /// Told the host of each pair written, so the certificate source reads it at once (a new
    /// host directory may appear before the tls dir itself is watched).
    pub written: Option<Written>,
    /// Where each new status goes: `/v1/state`, `status` and `/metrics` read it.
    pub status: IssuerHandle,
    /// The time renewals are scheduled by.
    pub clock: Arc<dyn Clock>,
    /// Seeds the jitter of renewal times and back-offs.
    pub seed: u64,
}

/// Per-process counts of one host.
#[derive(Debug, Clone, Default)]
struct Counts {
    placed: u64,
    issued: u64,
    failed: BTreeMap<String, u64>,
    last_error: Option<String>,
    last_order_seconds: Option<f64>,
}

/// What an order task hands back.
struct Done {
    host: String,
    record: HostRecord,
    result: Result<Obtained, Failed>,
    elapsed: Duration,
}

struct Issuer<C: Ca> {
    ca: C,
    store: Arc<Store>,
    options: Options,
    acme: Option<Acme>,
    tls_dir: PathBuf,
    hosts: BTreeSet<String>,
    records: BTreeMap<String, HostRecord>,
    counts: BTreeMap<String, Counts>,
    in_flight: BTreeSet<String>,
    /// The host of each order task, to give it back when the task dies.
    tasks: BTreeMap<Id, String>,
    /// Hosts whose stored pair has been put into the tls dir since they were first seen.
    restored: BTreeSet<String>,
    session: Option<Arc<C::Session>>,
    ca_failures: u32,
    ca_retry_at: i64,
    ca_error: Option<String>,
    /// Whether the CA at a directory offers renewal information.
    ari: BTreeMap<String, bool>,
    rng: fastrand::Rng,
}

/// The settings a workspace gives the issuer, or `None` when it is not in `'sozu_managed` mode.
fn settings(workspace: Option<&Workspace>) -> Option<(&Acme, &PathBuf, BTreeSet<String>)> {
    let workspace = workspace.filter(|w| w.tls_rotation == TlsRotation::SozuManaged)?;
    let acme = workspace.acme.as_deref()?;
    let hosts = workspace
        .tls_hosts()
        .into_iter()
        .map(str::to_owned)
        .collect();
    Some((acme, &workspace.tls_dir, hosts))
}

/// Runs until the workspace channel closes, against the real CA. Fails only when the state
/// directory cannot be opened or is locked by another agent: everything else is retried and
/// reported in the status.
pub async fn run(
    workspaces: watch::Receiver<Option<Arc<Workspace>>>,
    options: Options,
) -> Result<(), AcmeError> {
    let ca = AcmeCa {
        cloudflare_api: options.knobs.cloudflare_api.clone(),
    };
    run_with(ca, workspaces, options).await
}

/// [`run`] against any CA.
pub async fn run_with<C: Ca>(
    ca: C,
    mut workspaces: watch::Receiver<Option<Arc<Workspace>>>,
    options: Options,
) -> Result<(), AcmeError> {
    // The state directory is known with the first workspace in this mode.
    let state_dir = loop {
        let current = workspaces.borrow_and_update().clone();
        if let Some((acme, _, _)) = settings(current.as_deref()) {
            break acme.state_dir.clone();
        }
        if workspaces.changed().await.is_err() {
            return Ok(());
        }
    };
    let store = {
        let dir = state_dir.clone();
        blocking(move || Store::open(&dir)).await?
    };
    tracing::info!(state_dir = %state_dir.display(), "ACME issuer started");
    let mut issuer = Issuer {
        ca,
        store: Arc::new(store),
        tls_dir: PathBuf::new(),
        rng: fastrand::Rng::with_seed(options.seed),
        options,
        acme: None,
        hosts: BTreeSet::new(),
        records: BTreeMap::new(),
        counts: BTreeMap::new(),
        in_flight: BTreeSet::new(),
        tasks: BTreeMap::new(),
        restored: BTreeSet::new(),
        session: None,
        ca_failures: 0,
        ca_retry_at: 0,
        ca_error: None,
        ari: BTreeMap::new(),
    };
    let mut tasks: JoinSet<Done> = JoinSet::new();
    loop {
        let workspace = workspaces.borrow_and_update().clone();
        issuer.follow(workspace.as_deref(), &state_dir);
        // What the state directory holds is served and shown before the CA is asked anything.
        issuer.prepare().await;
        issuer.publish();
        let wake = issuer.step(&mut tasks).await;
        issuer.publish();
        let wait = wake.saturating_sub(issuer.now()).clamp(1, 86_400);
        let sleep = Duration::from_secs(u64::try_from(wait).unwrap_or(1));
        tokio::select! {
            changed = workspaces.changed() => {
                if changed.is_err() {
                    return Ok(());
                }
            }
            Some(done) = tasks.join_next_with_id(), if !tasks.is_empty() => {
                match done {
                    Ok((id, done)) => {
                        issuer.tasks.remove(&id);
                        issuer.finish(done).await;
                    }
                    Err(e) => issuer.task_died(e).await,
                }
            }
            _ = tokio::time::sleep(sleep) => {}
        }
    }
}

/// Store I/O on the blocking pool, as the issuer's error.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, AcmeError> {
    Ok(super::store::blocking(f).await?)
}

/// An order task's record, saved as the order progresses: a restart resumes the order.
struct HostProgress {
    store: Arc<Store>,
    host: String,
    record: HostRecord,
}

impl Progress for HostProgress {
    async fn save(&mut self, pending: Option<&PendingOrder>) -> Result<(), AcmeError> {
        self.record.pending = pending.cloned();
        let (store, host, record) = (self.store.clone(), self.host.clone(), self.record.clone());
        blocking(move || store.save_host(&host, &record)).await
    }

    fn pending(&self) -> Option<PendingOrder> {
        self.record.pending.clone()
    }
}

impl<C: Ca> Issuer<C> {
    fn now(&self) -> i64 {
        self.options.clock.unix()
    }

    /// Takes in the latest workspace: settings, hosts, the tls dir.
    fn follow(&mut self, workspace: Option<&Workspace>, state_dir: &PathBuf) {
        let Some((acme, tls_dir, hosts)) = settings(workspace) else {
            if self.acme.take().is_some() {
                tracing::info!(
                    "tls_rotation is no longer 'sozu_managed: the issuer stops ordering"
                );
            }
            self.hosts.clear();
            return;
        };
        if &acme.state_dir != state_dir {
            tracing::warn!(configured = %acme.state_dir.display(), in_use = %state_dir.display(),
                "acme.state_dir changed: the new directory is used after a restart");
        }
        let previous = self.acme.replace(acme.clone());
        let connection_changed = previous.as_ref().is_none_or(|p| {
            (
                &p.directory,
                &p.ca_bundle,
                &p.eab,
                &p.email,
                &p.profile,
                &p.dns01,
                &p.propagation,
            ) != (
                &acme.directory,
                &acme.ca_bundle,
                &acme.eab,
                &acme.email,
                &acme.profile,
                &acme.dns01,
                &acme.propagation,
            )
        });
        if connection_changed {
            self.session = None;
            self.ca_failures = 0;
            self.ca_retry_at = 0;
        }
        let tls_dir = self
            .options
            .tls_dir
            .clone()
            .unwrap_or_else(|| tls_dir.clone());
        if tls_dir != self.tls_dir {
            self.restored.clear();
            self.tls_dir = tls_dir;
        }
        self.restored.retain(|host| hosts.contains(host));
        self.hosts = hosts;
    }

    /// Does what is due now; returns when to look again (Unix seconds).
    async fn step(&mut self, tasks: &mut JoinSet<Done>) -> i64 {
        let now = self.now();
        let Some(acme) = self.acme.clone() else {
            return now + 3_600;
        };
        let mut wake = now + 3_600;
        if self.session.is_none() {
            if now < self.ca_retry_at {
                return self.ca_retry_at;
            }
            self.connect(&acme, now).await;
            if self.session.is_none() {
                return self.ca_retry_at;
            }
        }
        wake = wake.min(self.poll_renewal_info(&acme, now).await);

        let hosts: Vec<String> = self.hosts.iter().cloned().collect();
        for host in hosts {
            if self.in_flight.contains(&host) {
                continue;
            }
            match self.next(&host, &acme, now) {
                Next::Wait { at, .. } => wake = wake.min(at),
                Next::Order(why) => {
                    if self.in_flight.len() >= MAX_CONCURRENT_ORDERS {
                        // A task's end wakes the loop.
                        continue;
                    }
                    self.start(&host, why, &acme, tasks);
                }
            }
        }
        wake
    }

    /// Reads the records of hosts new to the loop, and puts the stored pairs of hosts not seen
    /// before into the tls dir.
    async fn prepare(&mut self) {
        if let Some(acme) = self.acme.clone() {
            self.load_records().await;
            self.restore_pairs(&acme).await;
        }
    }

    async fn load_records(&mut self) {
        let new: Vec<String> = self
            .hosts
            .iter()
            .filter(|h| !self.records.contains_key(*h) && !self.in_flight.contains(*h))
            .cloned()
            .collect();
        for host in new {
            match self.load(&host).await {
                Ok(record) => {
                    self.records.insert(host, record);
                }
                Err(e) => {
                    tracing::error!(host, error = %e, "cannot read the host's ACME state");
                    self.counts.entry(host).or_default().last_error = Some(e.to_string());
                }
            }
        }
    }

    async fn load(&self, host: &str) -> Result<HostRecord, AcmeError> {
        let (store, host) = (self.store.clone(), host.to_owned());
        blocking(move || store.load_host(&host)).await
    }

    async fn save(&self, host: &str, record: &HostRecord) -> Result<(), AcmeError> {
        let (store, host, record) = (self.store.clone(), host.to_owned(), record.clone());
        blocking(move || store.save_host(&host, &record)).await
    }

    async fn write_pair(&self, host: &str, issued: &Issued) -> Result<tlsdir::Written, AcmeError> {
        let (dir, host) = (self.tls_dir.clone(), host.to_owned());
        let (chain, key) = (issued.chain_pem.clone(), issued.key_pem.clone());
        tokio::task::spawn_blocking(move || tlsdir::write_pair(&dir, &host, &chain, &key))
            .await
            .map_err(|e| {
                AcmeError::Store(StoreError::Io {
                    path: self.tls_dir.clone(),
                    reason: format!("the I/O task failed: {e}"),
                })
            })?
            .map_err(AcmeError::from)
    }

    /// Puts the stored, still valid pair of this CA of each host seen for the first time into
    /// the tls dir (a memory-backed tls dir is empty after a restart; the state directory is
    /// not). A host's later pairs are written when they are issued.
    async fn restore_pairs(&mut self, acme: &Acme) {
        let now = self.now();
        let todo: Vec<String> = self
            .hosts
            .iter()
            .filter(|h| !self.restored.contains(*h) && self.records.contains_key(*h))
            .cloned()
            .collect();
        for host in todo {
            let issued = self
                .records
                .get(&host)
                .and_then(|r| r.issued.clone())
                .filter(|i| i.directory == acme.directory && i.not_after > now);
            let Some(issued) = issued else {
                self.restored.insert(host);
                continue;
            };
            match self.write_pair(&host, &issued).await {
                Ok(tlsdir::Written::Unchanged) => {
                    self.restored.insert(host);
                }
                Ok(tlsdir::Written::New) => {
                    tracing::info!(host, fingerprint = %issued.fingerprint, "stored certificate written into the tls dir");
                    self.announce(&host);
                    self.restored.insert(host);
                }
                Err(e) => {
                    tracing::error!(host, error = %e, "cannot write the stored certificate");
                    self.counts.entry(host).or_default().last_error = Some(e.to_string());
                }
            }
        }
    }

    fn announce(&self, host: &str) {
        if let Some(written) = &self.options.written {
            written(host);
        }
    }

    async fn connect(&mut self, acme: &Acme, now: i64) {
        match self.ca.connect(acme, &self.store).await {
            Ok(session) => {
                self.session = Some(Arc::new(session));
                self.ca_failures = 0;
                self.ca_error = None;
            }
            Err(e) => {
                self.ca_failures += 1;
                let wait = self.backoff(self.ca_failures, None);
                self.ca_retry_at = now + wait;
                tracing::warn!(directory = %acme.directory, error = %e, retry_in_s = wait,
                    "cannot open the ACME account");
                self.ca_error = Some(e.to_string());
            }
        }
    }

    fn next(&self, host: &str, acme: &Acme, now: i64) -> Next {
        let default = HostRecord::default();
        let record = self.records.get(host).unwrap_or(&default);
        let current = record
            .issued
            .as_ref()
            .filter(|i| i.directory == acme.directory)
            .map(|i| Current {
                not_after: i.not_after,
                renew_at: i.renew_at,
                basis: i.basis,
            });
        renewal_policy::next(now, current, record.backoff_until, &record.ledger)
    }

    fn backoff(&mut self, failures: u32, retry_after: Option<i64>) -> i64 {
        let wait = renewal_policy::backoff(failures, retry_after, self.rng.f64());
        ((wait as f64 / self.options.knobs.backoff_scale) as i64).max(1)
    }

    fn start(&mut self, host: &str, why: Why, acme: &Acme, tasks: &mut JoinSet<Done>) {
        let Some(session) = self.session.clone() else {
            return;
        };
        let record = self.records.remove(host).unwrap_or_default();
        let ari = self.ari.get(&acme.directory) == Some(&true);
        let replaces = record
            .issued
            .as_ref()
            .filter(|i| ari && i.directory == acme.directory)
            .map(|i| i.chain_pem.clone());
        tracing::info!(host, reason = %why, replaces = replaces.is_some(), "ordering a certificate");
        self.in_flight.insert(host.to_owned());
        let store = self.store.clone();
        let host = host.to_owned();
        let task_host = host.clone();
        let handle = tasks.spawn(async move {
            let started = tokio::time::Instant::now();
            let pending = record.pending.clone();
            let mut progress = HostProgress {
                store,
                host: host.clone(),
                record,
            };
            let result = session.order(&host, pending, replaces, &mut progress).await;
            Done {
                host,
                record: progress.record,
                result,
                elapsed: started.elapsed(),
            }
        });
        self.tasks.insert(handle.id(), task_host);
    }

    /// An order task that died (a panic) took its host's record with it: the host is given
    /// back from the store (where the task saved its progress) and backs off like any failed
    /// order, so that it is ordered again.
    async fn task_died(&mut self, error: JoinError) {
        let Some(host) = self.tasks.remove(&error.id()) else {
            tracing::error!(error = %error, "an order task of no known host ended abnormally");
            return;
        };
        self.in_flight.remove(&host);
        let now = self.now();
        let message = if error.is_panic() {
            "the order task panicked"
        } else {
            "the order task was cancelled"
        };
        let mut record = match self.load(&host).await {
            Ok(record) => record,
            Err(e) => {
                tracing::error!(host, error = %e, "cannot read the host's ACME state back");
                HostRecord::default()
            }
        };
        record.failures += 1;
        let failures = record.failures;
        let wait = self.backoff(failures, None);
        record.backoff_until = Some(now + wait);
        record.backoff_reason = Some(TASK_FAILED.to_owned());
        tracing::error!(host, error = %error, failures, retry_in_s = wait,
            "{message}; the host backs off and is ordered again");
        let counts = self.counts.entry(host.clone()).or_default();
        *counts.failed.entry(TASK_FAILED.to_owned()).or_default() += 1;
        counts.last_error = Some(message.to_owned());
        if let Err(e) = self.save(&host, &record).await {
            tracing::error!(host, error = %e, "cannot store the back-off");
        }
        self.records.insert(host, record);
    }

    /// Takes back a finished order's record: a success is stored and written into the tls dir, a
    /// failure sets the back-off.
    async fn finish(&mut self, done: Done) {
        let Done {
            host,
            mut record,
            result,
            elapsed,
        } = done;
        self.in_flight.remove(&host);
        let now = self.now();
        let Some(acme) = self.acme.clone() else {
            self.records.insert(host, record);
            return;
        };
        match result {
            Ok(obtained) => {
                let c = &obtained.certificate;
                let schedule_not_after = match self.options.knobs.lifetime {
                    Some(lifetime) => c.not_after.min(c.not_before + lifetime),
                    None => c.not_after,
                };
                let (renew_at, basis) = renewal_policy::renewal_time(
                    c.not_before,
                    schedule_not_after,
                    None,
                    self.rng.f64(),
                );
                record.issued = Some(Issued {
                    chain_pem: obtained.chain_pem.clone(),
                    key_pem: obtained.key_pem.clone(),
                    fingerprint: c.fingerprint.to_string(),
                    not_before: c.not_before,
                    not_after: c.not_after,
                    directory: acme.directory.clone(),
                    renew_at,
                    basis,
                    ari_window: None,
                    ari_next_poll: None,
                });
                record.ledger.record_issued(now);
                record.failures = 0;
                record.backoff_until = None;
                record.backoff_reason = None;
                tracing::info!(host, fingerprint = %c.fingerprint, not_after = c.not_after,
                    renew_at, basis = %basis, elapsed_ms = elapsed.as_millis() as u64, "certificate issued");
                let mut last_error = None;
                if let Err(e) = self.save(&host, &record).await {
                    tracing::error!(host, error = %e, "cannot store the issued certificate");
                    last_error = Some(e.to_string());
                }
                if let Some(issued) = record.issued.clone() {
                    match self.write_pair(&host, &issued).await {
                        Ok(_) => {
                            self.announce(&host);
                            self.restored.insert(host.clone());
                        }
                        Err(e) => {
                            tracing::error!(host, error = %e, "cannot write the issued certificate");
                            last_error = Some(e.to_string());
                        }
                    }
                }
                let counts = self.counts.entry(host.clone()).or_default();
                if obtained.placed {
                    counts.placed += 1;
                }
                counts.issued += 1;
                counts.last_error = last_error;
                counts.last_order_seconds = Some(elapsed.as_secs_f64());
                self.records.insert(host, record);
            }
            Err(failed) => {
                if matches!(failed.error, AcmeError::AccountGone(_)) {
                    // A CA that lost its accounts (a test CA restarted, a deactivated account):
                    // the next attempt creates a new one.
                    tracing::warn!(directory = %acme.directory, "the CA no longer knows the account; a new one will be created");
                    let (store, directory) = (self.store.clone(), acme.directory.clone());
                    if let Err(e) = blocking(move || store.forget_account(&directory)).await {
                        tracing::error!(error = %e, "cannot forget the stored account");
                    }
                    self.session = None;
                    self.ca_retry_at = 0;
                }
                let reason = failed.error.reason();
                if failed.authorization_failed {
                    record.ledger.record_failed_authorization(now);
                }
                record.failures += 1;
                let retry_after = failed.retry_after.map(|at| (at - now).max(0));
                let failures = record.failures;
                let wait = self.backoff(failures, retry_after);
                record.backoff_until = Some(now + wait);
                record.backoff_reason = Some(reason.to_owned());
                tracing::warn!(host, reason, error = %failed.error, failures, retry_in_s = wait,
                    kept_serving = record.issued.is_some(), "order failed; backing off");
                if let Err(e) = self.save(&host, &record).await {
                    tracing::error!(host, error = %e, "cannot store the back-off");
                }
                let counts = self.counts.entry(host.clone()).or_default();
                if failed.placed {
                    counts.placed += 1;
                }
                *counts.failed.entry(reason.to_owned()).or_default() += 1;
                counts.last_error = Some(failed.error.to_string());
                self.records.insert(host, record);
            }
        }
    }
}

#[cfg(test)]
mod tests;
