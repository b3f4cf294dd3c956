//! `private-ingress run`: wires the sources, the real sozu client and the admin server around the
//! reconcile loop, and stops cleanly on SIGTERM or SIGINT.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};

use crate::api::Views;
use crate::cli::{LogFormat, RunArgs};
use crate::clock::{Clock, SystemClock};
use crate::reconcile::{Agent, Settings};
use crate::sandbox::SandboxLoader;
use crate::sources::dns::DnsSettings;
use crate::sources::resolver::SystemResolver;
use crate::sources::{self, WatchError};
use crate::sozu::{SozuClient, SozuProxy};

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("cannot locate the private-ingress executable: {0}")]
    Exe(std::io::Error),
    #[error(transparent)]
    Watch(#[from] WatchError),
    #[error("admin server on {address}: {source}")]
    Admin {
        address: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot install signal handlers: {0}")]
    Signals(std::io::Error),
    #[error("cannot start reading sozu's events: {0}")]
    Events(std::io::Error),
    #[error(transparent)]
    Acme(#[from] crate::acme::AcmeError),
}

pub fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colour codes only for a person at a terminal: in a file, a pipe or `kubectl logs` they are
    // noise in every line.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Human => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

pub async fn run(args: RunArgs) -> Result<(), RunError> {
    tracing::info!(
        workspace = %args.workspace.display(),
        sozu_socket = %args.sozu_socket.display(),
        tls_dir = ?args.tls_dir,
        admin_address = %args.admin_address,
        resync_interval_s = args.resync_interval,
        dns_interval_s = args.dns_interval,
        dns_timeout_ms = args.dns_timeout_ms,
        "starting"
    );
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let views = Views::default();
    let (facts, facts_rx) = mpsc::unbounded_channel();
    let (latest, latest_rx) = watch::channel(None);

    let exe = std::env::current_exe().map_err(RunError::Exe)?;
    let loader = SandboxLoader {
        exe,
        path: args.workspace.clone(),
        limits: args.eval.limits(),
    };
    sources::sozu_events::spawn(&args.sozu_socket, facts.clone()).map_err(RunError::Events)?;
    let mut tasks = vec![
        sources::workspace::spawn(&args.workspace, loader, facts.clone(), latest)?,
        sources::sozu_socket::spawn(&args.sozu_socket, facts.clone())?,
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
    ];
    let certs = sources::tlsdir::spawn(
        args.tls_dir.clone(),
        latest_rx.clone(),
        facts.clone(),
        clock.clone(),
    )?;

    let listener = tokio::net::TcpListener::bind(args.admin_address)
        .await
        .map_err(|source| RunError::Admin {
            address: args.admin_address,
            source,
        })?;
    let (stop_tx, mut stop_rx) = watch::channel(false);
    let router = crate::api::admin::router(views.clone());
    let admin = tokio::spawn(async move {
        axum::serve(listener, router)
            .with_graceful_shutdown(async move {
                let _ = stop_rx.wait_for(|stop| *stop).await;
            })
            .await
    });

    let timeout = Duration::from_millis(args.sozu_timeout_ms);
    // Bulk changes go as a state file beside the socket: the one directory sozu surely shares.
    let proxy = SozuProxy::new(
        (0..args.sozu_connections)
            .map(|_| SozuClient::new(&args.sozu_socket, timeout))
            .collect(),
    )
    .with_batches(sources::watcher::parent_dir(&args.sozu_socket));
    let settings = Settings {
        resync: (args.resync_interval > 0).then(|| Duration::from_secs(args.resync_interval)),
        expiry_warning: Duration::from_secs(args.expiry_warning_days.saturating_mul(86_400)),
        seed: u64::from(std::process::id()),
        ..Settings::default()
    };
    let agent = Agent::new(proxy, certs.clone(), settings, views.status.clone(), clock);
    // With tls_rotation = 'sozu_managed, the issuer writes pairs where the tls dir source reads
    // them, and tells it which host it wrote.
    let mut issuer = tokio::spawn(issue_when_sozu_managed(
        latest_rx,
        args.tls_dir.clone(),
        certs,
        views.issuer.clone(),
    ));
    drop(facts);
    let (signalled, mut signal_rx) = watch::channel(false);
    let agent_task = tokio::spawn(agent.run(facts_rx, async move {
        let _ = signal_rx.wait_for(|s| *s).await;
    }));

    // The agent runs until a signal, or until the issuer cannot run at all (its state directory
    // is another agent's).
    let mut issuer_done = false;
    let issuer_failed = loop {
        tokio::select! {
            signal = wait_for_signal() => { signal.map_err(RunError::Signals)?; break None }
            result = &mut issuer, if !issuer_done => {
                issuer_done = true;
                if let Ok(Err(e)) = result {
                    break Some(e);
                }
            }
        }
    };
    tracing::info!("stopping");
    if !issuer_done {
        issuer.abort();
        let _ = issuer.await;
    }
    // The loop stops after the pass in flight, if any; sozu keeps serving what it holds.
    let _ = signalled.send(true);
    let _ = agent_task.await;
    for task in tasks.drain(..) {
        task.abort();
    }
    let _ = stop_tx.send(true);
    let _ = admin.await;
    if let Some(e) = issuer_failed {
        tracing::error!(error = %e, "the ACME issuer cannot run");
        return Err(e.into());
    }
    tracing::info!("stopped");
    Ok(())
}

/// Runs the ACME issuer once a workspace with `tls_rotation = 'sozu_managed` is loaded.
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
    };
    crate::acme::run(workspaces, options).await
}

async fn wait_for_signal() -> std::io::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    Ok(())
}
