//! The issuer's loop. It follows the latest valid workspace (a `watch` channel the reconcile loop
//! publishes to), and for each distinct route host keeps a certificate: restored from the state
//! directory into the tls dir at start, ordered when there is none, renewed when
//! [`policy::next`] says so, retried after failures with back-off, never beyond the rate limits.
//!
//! Orders run as tasks, a bounded number at a time; the loop alone reads and writes host records
//! (a task owns its host's record while it runs and hands it back). A pair is written into the tls
//! dir only after it passed [`crate::certs::parse`], and the loop is then told which host changed
//! (besides the watcher seeing the `..data` swap), so serving does not wait on inotify.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use instant_acme::{Account, CertificateIdentifier};
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::client::AccountSource;
use super::dns01::{Lookup, Provider};
use super::order::{self, Failed, Obtained};
use super::policy::{self, Current, Next, Why};
use super::status::{Backoff, HostStatus, IssuerHandle, IssuerStatus};
use super::store::{HostRecord, Issued, Store};
use super::{tlsdir, AcmeError};
use crate::workspace::{Acme, Dns01, TlsRotation, Workspace};

/// Orders in flight at once. Each waits mostly on DNS and on the CA; ten keep a first issuance
/// of fifty hosts short without looking like a flood to the CA (Let's Encrypt allows 300 new
/// orders per account per 3 hours).
const MAX_CONCURRENT_ORDERS: usize = 10;
/// Renewal information is asked for again after the CA's Retry-After, but not more often than this.
const MIN_ARI_POLL: i64 = 60;
/// After a failed renewal-information request (the CA down), asked again after this.
const ARI_RETRY: i64 = 3_600;

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
                ?knobs,
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
}

fn now() -> i64 {
    crate::clock::unix_seconds(SystemTime::now())
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

/// The account and what was learnt about the CA.
struct Ca {
    source: Arc<AccountSource>,
    /// For renewal information (no order state).
    account: Account,
    /// The configured profile, when the CA offers it.
    profile: Option<String>,
}

struct Issuer {
    store: Arc<Store>,
    options: Options,
    acme: Option<Acme>,
    tls_dir: PathBuf,
    hosts: BTreeSet<String>,
    records: BTreeMap<String, HostRecord>,
    counts: BTreeMap<String, Counts>,
    in_flight: BTreeSet<String>,
    ca: Option<Ca>,
    ca_failures: u32,
    ca_retry_at: i64,
    ca_error: Option<String>,
    /// Whether the CA at a directory offers renewal information.
    ari: BTreeMap<String, bool>,
    profile_note: Option<String>,
    provider: Option<Arc<Provider>>,
    lookup: Option<Arc<Lookup>>,
}

/// The settings a workspace gives the issuer, or `None` when it is not in `'sozu_managed` mode.
fn settings(workspace: Option<&Workspace>) -> Option<(&Acme, &PathBuf, BTreeSet<String>)> {
    let workspace = workspace.filter(|w| w.tls_rotation == TlsRotation::SozuManaged)?;
    let acme = workspace.acme.as_deref()?;
    let hosts = workspace.routes.iter().map(|r| r.host.clone()).collect();
    Some((acme, &workspace.tls_dir, hosts))
}

/// Runs until the workspace channel closes. Fails only when the state directory cannot be
/// opened or is locked by another agent: everything else is retried and reported in the status.
pub async fn run(
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
    let store = Arc::new(Store::open(&state_dir)?);
    tracing::info!(state_dir = %state_dir.display(), "ACME issuer started");
    let mut issuer = Issuer {
        store,
        tls_dir: PathBuf::new(),
        options,
        acme: None,
        hosts: BTreeSet::new(),
        records: BTreeMap::new(),
        counts: BTreeMap::new(),
        in_flight: BTreeSet::new(),
        ca: None,
        ca_failures: 0,
        ca_retry_at: 0,
        ca_error: None,
        ari: BTreeMap::new(),
        profile_note: None,
        provider: None,
        lookup: None,
    };
    let mut tasks: JoinSet<Done> = JoinSet::new();
    loop {
        let workspace = workspaces.borrow_and_update().clone();
        issuer.follow(workspace.as_deref(), &state_dir);
        // What the state directory holds is served and shown before the CA is asked anything.
        issuer.prepare();
        issuer.publish();
        let wake = issuer.step(&mut tasks).await;
        issuer.publish();
        let sleep = Duration::from_secs(u64::try_from((wake - now()).max(1)).unwrap_or(1));
        tokio::select! {
            changed = workspaces.changed() => {
                if changed.is_err() {
                    return Ok(());
                }
            }
            Some(done) = tasks.join_next(), if !tasks.is_empty() => {
                match done {
                    Ok(done) => issuer.finish(done),
                    Err(e) => tracing::error!(error = %e, "an order task ended abnormally"),
                }
            }
            _ = tokio::time::sleep(sleep) => {}
        }
    }
}

impl Issuer {
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
        let account_changed = previous.as_ref().is_none_or(|p| {
            (&p.directory, &p.ca_bundle, &p.eab, &p.email, &p.profile)
                != (
                    &acme.directory,
                    &acme.ca_bundle,
                    &acme.eab,
                    &acme.email,
                    &acme.profile,
                )
        });
        if account_changed {
            self.ca = None;
            self.ca_failures = 0;
            self.ca_retry_at = 0;
        }
        if previous
            .as_ref()
            .is_none_or(|p| (&p.dns01, &p.propagation) != (&acme.dns01, &acme.propagation))
        {
            self.provider = None;
            self.lookup = None;
        }
        self.tls_dir = self
            .options
            .tls_dir
            .clone()
            .unwrap_or_else(|| tls_dir.clone());
        self.hosts = hosts;
    }

    /// Does what is due now; returns when to look again (Unix seconds).
    async fn step(&mut self, tasks: &mut JoinSet<Done>) -> i64 {
        let Some(acme) = self.acme.clone() else {
            return now() + 3_600;
        };
        let now = now();
        let mut wake = now + 3_600;
        if let Err(e) = self.ensure_tools(&acme) {
            self.ca_error = Some(e.to_string());
            return now + 60;
        }
        if self.ca.is_none() {
            if now < self.ca_retry_at {
                return self.ca_retry_at;
            }
            self.open_account(&acme, now).await;
            if self.ca.is_none() {
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

    /// Reads the records of hosts new to the loop, and puts their stored pairs into the tls dir.
    fn prepare(&mut self) {
        if let Some(acme) = self.acme.clone() {
            self.load_records();
            self.restore_pairs(&acme);
        }
    }

    fn load_records(&mut self) {
        for host in &self.hosts {
            if self.records.contains_key(host) || self.in_flight.contains(host) {
                continue;
            }
            match self.store.load_host(host) {
                Ok(record) => {
                    self.records.insert(host.clone(), record);
                }
                Err(e) => {
                    tracing::error!(host, error = %e, "cannot read the host's ACME state");
                    self.counts.entry(host.clone()).or_default().last_error = Some(e.to_string());
                }
            }
        }
    }

    /// Puts every stored, still valid pair of this CA into the tls dir (a memory-backed tls dir
    /// is empty after a restart; the state directory is not).
    fn restore_pairs(&mut self, acme: &Acme) {
        let now = now();
        for host in &self.hosts {
            if self.in_flight.contains(host) {
                continue;
            }
            let Some(issued) = self.records.get(host).and_then(|r| r.issued.as_ref()) else {
                continue;
            };
            if issued.directory != acme.directory || issued.not_after <= now {
                continue;
            }
            match tlsdir::write_pair(&self.tls_dir, host, &issued.chain_pem, &issued.key_pem) {
                Ok(tlsdir::Written::Unchanged) => {}
                Ok(tlsdir::Written::New) => {
                    tracing::info!(host, fingerprint = %issued.fingerprint, "stored certificate written into the tls dir");
                    self.announce(host);
                }
                Err(e) => {
                    tracing::error!(host, error = %e, "cannot write the stored certificate");
                    self.counts.entry(host.clone()).or_default().last_error = Some(e.to_string());
                }
            }
        }
    }

    fn announce(&self, host: &str) {
        if let Some(written) = &self.options.written {
            written(host);
        }
    }

    fn ensure_tools(&mut self, acme: &Acme) -> Result<(), AcmeError> {
        if self.provider.is_none() {
            let provider = match &acme.dns01 {
                Dns01::Rfc2136 {
                    server,
                    zone,
                    tsig_key_name,
                    tsig_algorithm,
                    tsig_secret_file,
                } => Provider::Rfc2136(super::rfc2136::Rfc2136::new(
                    *server,
                    zone,
                    tsig_key_name,
                    *tsig_algorithm,
                    tsig_secret_file.clone(),
                )?),
                Dns01::Cloudflare { api_token_file } => {
                    Provider::Cloudflare(super::cloudflare::Cloudflare::new(
                        self.options.knobs.cloudflare_api.clone(),
                        api_token_file.clone(),
                        super::http::client(super::http::Roots::Platform)
                            .map_err(|e| AcmeError::Tls(e.to_string()))?,
                    ))
                }
            };
            self.provider = Some(Arc::new(provider));
        }
        if self.lookup.is_none() {
            self.lookup = Some(Arc::new(Lookup::new(
                acme.propagation.nameservers.clone(),
                Duration::from_secs(acme.propagation.timeout_secs),
            )));
        }
        Ok(())
    }

    async fn open_account(&mut self, acme: &Acme, now: i64) {
        let opened = async {
            let (source, created) = AccountSource::open(acme, &self.store).await?;
            let account = source.account().await?;
            Ok::<_, AcmeError>((source, created, account))
        }
        .await;
        match opened {
            Ok((source, created, account)) => {
                tracing::info!(directory = %acme.directory, created, "ACME account ready");
                let profile = acme.profile.as_ref().and_then(|wanted| {
                    if account.profiles().any(|p| p.name == wanted) {
                        self.profile_note = None;
                        Some(wanted.clone())
                    } else {
                        let note =
                            format!("the CA offers no profile `{wanted}`; orders use its default");
                        tracing::warn!(profile = %wanted, "{note}");
                        self.profile_note = Some(note);
                        None
                    }
                });
                self.ca = Some(Ca {
                    source: Arc::new(source),
                    account,
                    profile,
                });
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

    /// Asks the CA for renewal information on every host's certificate whose poll is due.
    /// Returns when the next poll is due.
    async fn poll_renewal_info(&mut self, acme: &Acme, now: i64) -> i64 {
        let mut wake = now + 86_400;
        let Some(ca) = &self.ca else { return wake };
        if self.ari.get(&acme.directory) == Some(&false) {
            return wake;
        }
        for host in &self.hosts {
            if self.in_flight.contains(host) {
                continue;
            }
            let Some(record) = self.records.get_mut(host) else {
                continue;
            };
            let Some(issued) = record
                .issued
                .as_mut()
                .filter(|i| i.directory == acme.directory)
            else {
                continue;
            };
            if let Some(at) = issued.ari_next_poll.filter(|&at| at > now) {
                wake = wake.min(at);
                continue;
            }
            let Some(id) = certificate_id(&issued.chain_pem) else {
                continue;
            };
            match ca.account.renewal_info(&id).await {
                Ok((info, retry)) => {
                    self.ari.insert(acme.directory.clone(), true);
                    let window = (
                        info.suggested_window.start.unix_timestamp(),
                        info.suggested_window.end.unix_timestamp(),
                    );
                    if issued.ari_window != Some(window) {
                        let (at, basis) = policy::renewal_time(
                            issued.not_before,
                            issued.not_after,
                            Some(window),
                            rand::random(),
                        );
                        tracing::info!(host, renew_at = at, "renewal window from the CA (ARI)");
                        issued.ari_window = Some(window);
                        issued.renew_at = at;
                        issued.basis = basis;
                    }
                    let next = now
                        + i64::try_from(retry.as_secs())
                            .unwrap_or(i64::MAX / 2)
                            .max(MIN_ARI_POLL);
                    issued.ari_next_poll = Some(next);
                    wake = wake.min(next);
                }
                Err(instant_acme::Error::Unsupported(_)) => {
                    tracing::info!(directory = %acme.directory,
                        "the CA offers no renewal information (ARI): renewals follow the certificates' lifetimes");
                    self.ari.insert(acme.directory.clone(), false);
                    return wake;
                }
                Err(e) => {
                    tracing::debug!(host, error = %e, "renewal information unavailable for now");
                    issued.ari_next_poll = Some(now + ARI_RETRY);
                    wake = wake.min(now + ARI_RETRY);
                }
            }
            let record = record.clone();
            if let Err(e) = self.store.save_host(host, &record) {
                tracing::error!(host, error = %e, "cannot store the renewal window");
            }
        }
        wake
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
        policy::next(now, current, record.backoff_until, &record.ledger)
    }

    fn backoff(&self, failures: u32, retry_after: Option<i64>) -> i64 {
        let wait = policy::backoff(failures, retry_after, rand::random());
        ((wait as f64 / self.options.knobs.backoff_scale) as i64).max(1)
    }

    fn start(&mut self, host: &str, why: Why, acme: &Acme, tasks: &mut JoinSet<Done>) {
        let (Some(ca), Some(provider), Some(lookup)) = (&self.ca, &self.provider, &self.lookup)
        else {
            return;
        };
        let record = self.records.remove(host).unwrap_or_default();
        let ari = self.ari.get(&acme.directory) == Some(&true);
        let replaces = record
            .issued
            .as_ref()
            .filter(|i| ari && i.directory == acme.directory)
            .and_then(|i| certificate_id(&i.chain_pem));
        tracing::info!(host, reason = %why, replaces = replaces.is_some(), "ordering a certificate");
        self.in_flight.insert(host.to_owned());
        let source = ca.source.clone();
        let profile = ca.profile.clone();
        let provider = provider.clone();
        let lookup = lookup.clone();
        let store = self.store.clone();
        let directory = acme.directory.clone();
        let host = host.to_owned();
        tasks.spawn(async move {
            let started = Instant::now();
            let mut record = record;
            let result = match source.account_recording().await {
                Err(error) => Err(Failed {
                    error,
                    authorization_failed: false,
                    placed: false,
                    retry_after: None,
                }),
                Ok((account, retry_after)) => {
                    let ctx = order::Context {
                        account: &account,
                        retry_after: &retry_after,
                        directory: &directory,
                        provider: &provider,
                        lookup: &lookup,
                        profile: profile.as_deref(),
                        replaces,
                    };
                    let pending = record.pending.clone();
                    let save = |pending: Option<&super::store::PendingOrder>| {
                        record.pending = pending.cloned();
                        store.save_host(&host, &record).map_err(AcmeError::from)
                    };
                    order::obtain(&ctx, &host, pending, save).await
                }
            };
            Done {
                host,
                record,
                result,
                elapsed: started.elapsed(),
            }
        });
    }

    /// Takes back a finished order's record: a success is stored and written into the tls dir, a
    /// failure sets the back-off.
    fn finish(&mut self, done: Done) {
        let Done {
            host,
            mut record,
            result,
            elapsed,
        } = done;
        self.in_flight.remove(&host);
        let now = now();
        let counts = self.counts.entry(host.clone()).or_default();
        let Some(acme) = self.acme.clone() else {
            self.records.insert(host, record);
            return;
        };
        match result {
            Ok(obtained) => {
                if obtained.placed {
                    counts.placed += 1;
                }
                let c = &obtained.certificate;
                let schedule_not_after = match self.options.knobs.lifetime {
                    Some(lifetime) => c.not_after.min(c.not_before + lifetime),
                    None => c.not_after,
                };
                let (renew_at, basis) =
                    policy::renewal_time(c.not_before, schedule_not_after, None, rand::random());
                record.issued = Some(Issued {
                    chain_pem: obtained.chain_pem,
                    key_pem: obtained.key_pem,
                    fingerprint: c.fingerprint.clone(),
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
                counts.issued += 1;
                counts.last_error = None;
                counts.last_order_seconds = Some(elapsed.as_secs_f64());
                tracing::info!(host, fingerprint = %c.fingerprint, not_after = c.not_after,
                    renew_at, basis = %basis, elapsed_ms = elapsed.as_millis() as u64, "certificate issued");
                if let Err(e) = self.store.save_host(&host, &record) {
                    tracing::error!(host, error = %e, "cannot store the issued certificate");
                    counts.last_error = Some(e.to_string());
                }
                let issued = record
                    .issued
                    .as_ref()
                    .map(|i| (i.chain_pem.clone(), i.key_pem.clone()));
                self.records.insert(host.clone(), record);
                if let Some((chain, key)) = issued {
                    match tlsdir::write_pair(&self.tls_dir, &host, &chain, &key) {
                        Ok(_) => self.announce(&host),
                        Err(e) => {
                            tracing::error!(host, error = %e, "cannot write the issued certificate");
                            self.counts.entry(host).or_default().last_error = Some(e.to_string());
                        }
                    }
                }
            }
            Err(failed) => {
                if failed.placed {
                    counts.placed += 1;
                }
                if matches!(failed.error, AcmeError::AccountGone(_)) {
                    // A CA that lost its accounts (a test CA restarted, a deactivated account):
                    // the next attempt creates a new one.
                    tracing::warn!(directory = %acme.directory, "the CA no longer knows the account; a new one will be created");
                    if let Err(e) = self.store.forget_account(&acme.directory) {
                        tracing::error!(error = %e, "cannot forget the stored account");
                    }
                    self.ca = None;
                    self.ca_retry_at = 0;
                }
                let reason = failed.error.reason();
                *counts.failed.entry(reason.to_owned()).or_default() += 1;
                counts.last_error = Some(failed.error.to_string());
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
                if let Err(e) = self.store.save_host(&host, &record) {
                    tracing::error!(host, error = %e, "cannot store the back-off");
                }
                self.records.insert(host, record);
            }
        }
    }

    fn publish(&self) {
        let now = now();
        let directory = self
            .acme
            .as_ref()
            .map(|a| a.directory.clone())
            .unwrap_or_default();
        let hosts = self
            .hosts
            .iter()
            .map(|host| {
                let default = HostRecord::default();
                let record = self.records.get(host).unwrap_or(&default);
                let counts = self.counts.get(host).cloned().unwrap_or_default();
                let issued = record.issued.as_ref().filter(|i| i.directory == directory);
                let valid = issued.filter(|i| i.not_after > now);
                let mut backoff = record
                    .backoff_until
                    .filter(|&until| until > now)
                    .map(|until| Backoff {
                        reason: record.backoff_reason.clone().unwrap_or_default(),
                        until,
                        failures: record.failures,
                    });
                if let (None, Some(acme)) = (&backoff, &self.acme) {
                    if let Next::Wait {
                        at,
                        why: Why::Limit(limit),
                    } = self.next(host, acme, now)
                    {
                        backoff = Some(Backoff {
                            reason: format!("rate_limit: {limit}"),
                            until: at,
                            failures: record.failures,
                        });
                    }
                }
                let state = if self.in_flight.contains(host) {
                    "ordering"
                } else if backoff.is_some() {
                    "backing_off"
                } else if valid.is_some() {
                    "valid"
                } else {
                    "waiting"
                };
                let status = HostStatus {
                    state: state.into(),
                    fingerprint: valid.map(|i| i.fingerprint.clone()),
                    valid_until: valid.map(|i| i.not_after),
                    renewal_due: valid.map(|i| i.renew_at),
                    renewal_basis: valid.map(|i| i.basis),
                    orders_placed: counts.placed,
                    certificates_issued: counts.issued,
                    orders_failed: counts.failed,
                    backoff,
                    last_error: counts.last_error,
                    last_order_seconds: counts.last_order_seconds,
                };
                (host.clone(), status)
            })
            .collect();
        let status = IssuerStatus {
            directory,
            account_ready: self.ca.is_some(),
            ari_supported: self
                .acme
                .as_ref()
                .and_then(|a| self.ari.get(&a.directory).copied()),
            profile_note: self.profile_note.clone(),
            last_error: self.ca_error.clone(),
            hosts,
        };
        self.options.status.publish(status);
    }
}

/// The ARI identifier (authority key id and serial) of a chain's leaf.
fn certificate_id(chain_pem: &str) -> Option<CertificateIdentifier<'static>> {
    use rustls_pki_types::pem::PemObject;
    let leaf = rustls_pki_types::CertificateDer::pem_slice_iter(chain_pem.as_bytes())
        .next()?
        .ok()?;
    CertificateIdentifier::try_from(&leaf)
        .ok()
        .map(CertificateIdentifier::into_owned)
}

#[cfg(all(test, not(feature = "test-hooks")))]
mod tests {
    use super::*;

    /// A product build sends the Cloudflare token to Cloudflare alone, and schedules by the
    /// certificates' own lifetimes, whatever its environment says.
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
}
