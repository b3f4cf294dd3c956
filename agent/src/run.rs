//! `private-ingress run`: wires the sources, the real sozu client and the admin server around the
//! reconcile loop, and stops cleanly on SIGTERM or SIGINT.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};

use crate::api::{Heartbeat, Views};
use crate::cli::{LogFormat, RunArgs};
use crate::clock::{Clock, SystemClock};
use crate::reconcile::{Driver, Settings};
use crate::sources::dns::DnsSettings;
use crate::sources::resolver::SystemResolver;
use crate::sources::workspace::SandboxLoader;
use crate::sources::{self, WatchError};
use crate::sozu::{SozuClient, SozuProxy};
use crate::supervisor::{Ended, Supervisor};

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("cannot locate the private-ingress executable: {0}")]
    Exe(std::io::Error),
    #[error(transparent)]
    Watch(#[from] WatchError),
    #[error("admin server on {address}: {error}")]
    Admin {
        address: std::net::SocketAddr,
        error: std::io::Error,
    },
    #[error("cannot install signal handlers: {0}")]
    Signals(std::io::Error),
    #[error("cannot start reading sozu's events: {0}")]
    Events(std::io::Error),
    #[error(transparent)]
    Acme(#[from] crate::acme::AcmeError),
    #[error("{0}")]
    TaskEnded(Ended),
}

pub fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colour codes only for a person at a terminal who has not asked for none (NO_COLOR set and
    // not empty, https://no-color.org; CLICOLOR=0): in a file, a pipe or `kubectl logs` they are
    // noise in every line. anstream decides, as it does for clap's help and errors.
    let ansi = anstream::AutoStream::choice(&std::io::stderr()) != anstream::ColorChoice::Never;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Human => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
    // A panic is logged like everything else (one JSON object in `kubectl logs`), with the
    // thread it happened on; the supervisor then names the task and the agent exits.
    std::panic::set_hook(Box::new(|info| {
        let thread = std::thread::current();
        tracing::error!(
            thread = thread.name().unwrap_or("unnamed"),
            panic = %info,
            "panicked"
        );
    }));
}

/// How long the tasks get to finish after a signal: the pass in flight (each of its requests
/// bounded by `--sozu-timeout-ms`, but sozu may be gone), the admin server's open exchanges.
/// Then the process exits whatever they are doing: it is well inside any grace period a
/// kubelet gives (30 s by default, 15 s in the rendered pod), busy machine or not.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);

pub async fn run(args: RunArgs) -> Result<(), RunError> {
    tracing::info!(
        workspace = %args.workspace.display(),
        sozu_socket = %args.sozu_socket.display(),
        tls_dir = args.tls_dir.as_ref().map(|d| tracing::field::display(d.display())),
        admin_address = %args.admin_address,
        resync_interval_s = args.resync_interval,
        dns_interval_s = args.dns_interval,
        dns_timeout_ms = args.dns_timeout_ms,
        "starting"
    );
    // Signals first: one that arrives while the agent starts is not lost.
    let mut signals = Signals::install().map_err(RunError::Signals)?;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let timeout = Duration::from_millis(args.sozu_timeout_ms);
    let views = Views {
        heartbeat: Heartbeat::new(stale_after(timeout)),
        ..Views::default()
    };
    let (facts, facts_rx) = mpsc::unbounded_channel();
    let (latest, latest_rx) = watch::channel(None);
    let mut tasks = Supervisor::default();

    let exe = std::env::current_exe().map_err(RunError::Exe)?;
    let loader = SandboxLoader {
        exe,
        path: args.workspace.clone(),
        limits: args.eval.limits(args.admin_address),
    };
    let peer = crate::sozu::SozuPeer { uid: args.sozu_uid };
    sources::sozu_events::spawn(
        &args.sozu_socket,
        peer,
        facts.clone(),
        tasks.thread("sozu-events"),
    )
    .map_err(RunError::Events)?;
    tasks.adopt(
        "workspace",
        sources::workspace::spawn(&args.workspace, loader, facts.clone(), latest)?,
    );
    tasks.adopt(
        "sozu-socket",
        sources::sozu_socket::spawn(&args.sozu_socket, facts.clone())?,
    );
    tasks.adopt(
        "dns",
        sources::dns::spawn(
            SystemResolver::default(),
            DnsSettings {
                interval: Duration::from_secs(args.dns_interval),
                timeout: Duration::from_millis(args.dns_timeout_ms),
                ..DnsSettings::default()
            },
            latest_rx.clone(),
            facts.clone(),
            views.dns.clone(),
            clock.clone(),
        ),
    );
    tasks.spawn(
        "handshakes",
        crate::traffic::handshakes::run(
            args.sozu_socket.clone(),
            timeout,
            views.traffic.handshakes().clone(),
            views.traffic.capacity().clone(),
        ),
    );
    tasks.spawn(
        "traffic",
        crate::traffic::receiver::run(latest_rx.clone(), views.traffic.clone(), views.dns.clone()),
    );
    let (certs, forwarder) = sources::tlsdir::spawn(
        args.tls_dir.clone(),
        latest_rx.clone(),
        facts.clone(),
        clock.clone(),
        tasks.thread("tls-dir"),
    )?;
    tasks.adopt("tls-dir", forwarder);
    let forwarder = sources::watched_files::spawn(
        sources::client_auth::Files::new(clock.clone()),
        latest_rx.clone(),
        facts.clone(),
        tasks.thread("client-auth"),
    )?;
    tasks.adopt("client-auth", forwarder);
    let forwarder = sources::watched_files::spawn(
        sources::route_policy_files::Files::new(
            args.workspace.clone(),
            args.eval.workspace_root.clone(),
        ),
        latest_rx.clone(),
        facts.clone(),
        tasks.thread("policy-files"),
    )?;
    tasks.adopt("policy-files", forwarder);

    let listener = tokio::net::TcpListener::bind(args.admin_address)
        .await
        .map_err(|error| RunError::Admin {
            address: args.admin_address,
            error,
        })?;
    let (stop_admin, admin_stopped) = watch::channel(false);
    let allowed = crate::api::admin::AllowedHosts::new(args.admin_allowed_host.clone());
    let router = crate::api::admin::router(views.clone(), allowed);
    tasks.spawn(
        "admin",
        crate::api::admin::serve(listener, router, views.connections.clone(), admin_stopped),
    );

    // Bulk changes go as a state file beside the socket: the one directory sozu surely shares.
    let proxy = SozuProxy::new(
        (0..args.sozu_connections)
            .map(|_| SozuClient::new(&args.sozu_socket, timeout).with_peer(peer))
            .collect(),
    )
    .with_batches(sources::watcher::parent_dir(&args.sozu_socket).join(".private-ingress"));
    let settings = Settings {
        resync: (args.resync_interval > 0).then(|| Duration::from_secs(args.resync_interval)),
        expiry_warning: Duration::from_secs(args.expiry_warning_days.saturating_mul(86_400)),
        seed: instance_seed(),
        readiness: args.readiness.into(),
    };
    let events = views.events.clone();
    views.issuer.watch(Box::new(move |old, new| {
        let mut said = Vec::new();
        crate::reconcile::announce::issuer(old, new, &mut said);
        for a in said {
            events.emit(a.kind, a.host.as_deref(), a.problem, a.message);
        }
    }));
    #[cfg(feature = "test-hooks")]
    flood_events(&views.events);
    let agent = Driver::new(proxy, certs.clone(), settings, views.status.clone(), clock)
        .with_heartbeat(views.heartbeat.clone())
        .with_events(views.events.clone())
        .with_issuer(Arc::new(views.issuer.clone()));
    // With tls_rotation = 'sozu_managed, the issuer writes pairs where the tls dir source reads
    // them, and tells it which host it wrote. It fails only when it cannot run at all (its state
    // directory is another agent's): why is kept for the exit.
    let (issuer_failed, mut issuer_error) = tokio::sync::oneshot::channel();
    let issuer =
        issue_when_sozu_managed(latest_rx, args.tls_dir.clone(), certs, views.issuer.clone());
    tasks.spawn("acme-issuer", async move {
        if let Err(e) = issuer.await {
            tracing::error!(error = %e, "the ACME issuer cannot run");
            let _ = issuer_failed.send(e);
        }
    });
    drop(facts);
    let (stop_loop, mut loop_stopped) = watch::channel(false);
    tasks.spawn("reconcile", async move {
        agent
            .run(facts_rx, async move {
                let _ = loop_stopped.wait_for(|s| *s).await;
            })
            .await;
    });

    // The agent runs until a signal, or until one of its tasks ends: then it exits non-zero, and
    // whoever runs it starts it again.
    let ended = tokio::select! {
        () = signals.recv() => None,
        ended = tasks.ended() => Some(ended),
    };
    let mut waiting: Vec<&str> = vec!["reconcile", "admin"];
    if let Some(ended) = &ended {
        waiting.retain(|task| *task != ended.task);
    }
    let failure = match ended {
        None => {
            tracing::info!("stopping");
            None
        }
        Some(ended) => {
            tracing::error!(
                task = ended.task,
                panic = ended.panic.as_deref(),
                "{ended}; exiting"
            );
            Some(match issuer_error.try_recv() {
                Ok(e) => RunError::Acme(e),
                Err(_) => RunError::TaskEnded(ended),
            })
        }
    };
    // The loop stops after the pass in flight, if any, and the admin server after its open
    // exchanges, within the grace; sozu keeps serving what it holds.
    let _ = stop_loop.send(true);
    // Event streams say so and end, so that the admin server's open responses finish.
    views.events.close();
    let _ = stop_admin.send(true);
    let deadline = tokio::time::Instant::now() + SHUTDOWN_GRACE;
    while !waiting.is_empty() {
        match tokio::time::timeout_at(deadline, tasks.ended()).await {
            Ok(ended) => waiting.retain(|task| *task != ended.task),
            Err(_) => {
                tracing::warn!(tasks = %waiting.join(", "), grace_s = SHUTDOWN_GRACE.as_secs(),
                    "stopping without waiting any longer");
                break;
            }
        }
    }
    tasks.abort_all();
    match failure {
        Some(e) => Err(e),
        None => {
            tracing::info!("stopped");
            Ok(())
        }
    }
}

/// How long `/healthz` lets the loop go without turning: [`crate::api::DEFAULT_STALE_AFTER`],
/// or more when sozu's deadline is long enough that a pass against a sozu that answers
/// nothing (a generation check, a state read and the requests in flight, each waiting its
/// deadline, a bulk load twice as long) could take longer.
pub fn stale_after(sozu_timeout: Duration) -> Duration {
    // A test build may shorten it (`PRIVATE_INGRESS_TEST_HEALTHZ_STALE_SECS`), so that a test of
    // a wedged loop takes seconds.
    #[cfg(feature = "test-hooks")]
    if let Some(seconds) = std::env::var("PRIVATE_INGRESS_TEST_HEALTHZ_STALE_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        return Duration::from_secs(seconds);
    }
    crate::api::DEFAULT_STALE_AFTER.max(sozu_timeout.saturating_mul(6))
}

/// A test build emits `PRIVATE_INGRESS_TEST_EVENT_FLOOD` events of about 300 bytes once
/// `PRIVATE_INGRESS_TEST_EVENT_FLOOD_FILE` names a file that exists (so that the test's slow
/// client connects first), a thousand at a time: what a slow `/v1/events` client costs the
/// agent is measured against a flood no real agent makes.
#[cfg(feature = "test-hooks")]
fn flood_events(events: &crate::api::events::Events) {
    let count = std::env::var("PRIVATE_INGRESS_TEST_EVENT_FLOOD")
        .ok()
        .and_then(|n| n.parse::<usize>().ok());
    let start = std::env::var_os("PRIVATE_INGRESS_TEST_EVENT_FLOOD_FILE");
    let (Some(count), Some(start)) = (count, start) else {
        return;
    };
    let events = events.clone();
    tokio::spawn(async move {
        while !std::path::Path::new(&start).exists() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let padding = "x".repeat(200);
        for i in 0..count {
            events.emit(
                crate::document::EventKind::DnsChanged,
                Some("flood.in.example.org"),
                false,
                format!("test flood {i} {padding}"),
            );
            if i % 1_000 == 999 {
                tokio::task::yield_now().await;
            }
        }
        tracing::info!(count, "test flood of events emitted");
    });
}

/// Readiness waits for a host's first pair while the issuer is getting it, and no longer once
/// it backs off (a failure, a rate limit) or cannot order at all.
impl crate::reconcile::readiness::IssuerProgress for crate::acme::IssuerHandle {
    fn version(&self) -> u64 {
        crate::acme::IssuerHandle::version(self)
    }

    fn stalled(&self) -> crate::reconcile::readiness::Stalled {
        let Some(status) = self.snapshot() else {
            return Default::default();
        };
        crate::reconcile::readiness::Stalled {
            all: status.last_error.is_some(),
            hosts: status
                .hosts
                .into_iter()
                .filter(|(_, host)| host.state == "backing_off")
                .map(|(name, _)| name)
                .collect(),
        }
    }
}

/// Runs the ACME issuer once the workspace asks for `tls_rotation = 'sozu_managed`.
async fn issue_when_sozu_managed(
    mut workspaces: sources::WorkspaceWatch,
    tls_dir: Option<std::path::PathBuf>,
    certs: sources::tlsdir::TlsDir,
    status: crate::acme::IssuerHandle,
) -> Result<(), crate::acme::AcmeError> {
    use crate::workspace::TlsRotation;
    let sozu_managed = |w: &Option<Arc<crate::workspace::Workspace>>| {
        w.as_ref()
            .is_some_and(|w| w.tls_rotation == TlsRotation::SozuManaged)
    };
    if workspaces.wait_for(sozu_managed).await.is_err() {
        return Ok(());
    }
    let options = crate::acme::Options {
        tls_dir,
        knobs: crate::acme::Knobs::from_env(),
        written: Some(Box::new(move |host: &str| certs.changed(host))),
        status,
        clock: Arc::new(SystemClock),
        seed: instance_seed(),
    };
    crate::acme::run(workspaces, options).await
}

/// The seed of this agent's jitter (the renewal times, the back-offs). Not the process id
/// alone: in a pod the agent is the first process of its own PID namespace, so every replica
/// would have the same id, draw the same renewal time for a host, and order it in the same
/// minute. The host name (the pod's name) and the start time make replicas, and restarts,
/// draw apart.
fn instance_seed() -> u64 {
    let host = nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_default();
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    seed_of(&host, std::process::id(), started)
}

fn seed_of(host: &str, pid: u32, started_ns: u128) -> u64 {
    use sha2::Digest;
    let mut hash = sha2::Sha256::new();
    hash.update(host.as_bytes());
    hash.update(pid.to_le_bytes());
    hash.update(started_ns.to_le_bytes());
    let digest = hash.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_le_bytes(first)
}

/// SIGTERM and SIGINT, installed once.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> std::io::Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
    }

    async fn recv(&mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::seed_of;

    /// Two replicas: the same process id (each the first of its PID namespace), started in the
    /// same nanosecond, on pods of different names.
    #[test]
    fn replicas_that_share_a_process_id_draw_different_seeds() {
        let a = seed_of("private-ingress-0", 1, 1_800_000_000_000_000_000);
        let b = seed_of("private-ingress-1", 1, 1_800_000_000_000_000_000);
        assert_ne!(a, b);
        assert_eq!(
            a,
            seed_of("private-ingress-0", 1, 1_800_000_000_000_000_000)
        );
        assert_ne!(
            a,
            seed_of("private-ingress-0", 1, 1_800_000_000_000_000_001)
        );
    }
}
