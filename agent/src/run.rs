//! `private-ingress run`: wires the real sozu client, resolver, workspace loader, watches and
//! admin server around the reconcile loop, and stops cleanly on SIGTERM or SIGINT.

use std::time::Duration;

use tokio::sync::mpsc;

use crate::cli::{LogFormat, RunArgs};
use crate::reconcile::{Agent, Settings, SharedStatus};
use crate::resolve::SystemResolver;
use crate::sandbox::SandboxLoader;
use crate::sozu::{SozuClient, SozuProxy};
use crate::watch;

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("cannot locate the private-ingress executable: {0}")]
    Exe(std::io::Error),
    #[error(transparent)]
    Watch(#[from] watch::WatchError),
    #[error("admin server on {address}: {source}")]
    Admin {
        address: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot install signal handlers: {0}")]
    Signals(std::io::Error),
    #[error(transparent)]
    Acme(#[from] crate::acme::AcmeError),
}

pub fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
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
        "starting"
    );
    let status = SharedStatus::default();
    let (tx, rx) = mpsc::unbounded_channel();

    // Watch the workspace's directory (ConfigMap `..data` swaps), the socket's (a restarted sozu
    // re-creates its socket) and, once known, the tls dir and its host directories.
    let dirs = watch::Dirs {
        workspace: watch::parent_dir(&args.workspace),
        socket: watch::parent_dir(&args.sozu_socket),
        socket_file: watch::parent_dir(&args.sozu_socket)
            .join(args.sozu_socket.file_name().unwrap_or_default()),
    };
    let (tls_dir_updates, watches) = watch::spawn(dirs.clone(), tx.clone())?;

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let listener = tokio::net::TcpListener::bind(args.admin_address)
        .await
        .map_err(|source| RunError::Admin {
            address: args.admin_address,
            source,
        })?;
    let admin_status = status.clone();
    let mut admin_stop = stop_rx.clone();
    let admin = tokio::spawn(async move {
        let shutdown = async move {
            let _ = admin_stop.wait_for(|stop| *stop).await;
        };
        axum::serve(listener, crate::admin::router(admin_status))
            .with_graceful_shutdown(shutdown)
            .await
    });

    let exe = std::env::current_exe().map_err(RunError::Exe)?;
    let loader = SandboxLoader {
        exe,
        path: args.workspace.clone(),
        limits: args.eval.limits(),
    };
    let timeout = Duration::from_millis(args.sozu_timeout_ms);
    // Bulk changes go as a state file beside the socket: the one directory sozu surely shares.
    let proxy = SozuProxy::new(
        (0..args.sozu_connections)
            .map(|_| SozuClient::new(&args.sozu_socket, timeout))
            .collect(),
    )
    .with_batches(dirs.socket.clone());
    let settings = Settings {
        tls_dir: args.tls_dir.clone(),
        resync: (args.resync_interval > 0).then(|| Duration::from_secs(args.resync_interval)),
        dns_interval: Duration::from_secs(args.dns_interval),
        expiry_warning: Duration::from_secs(args.expiry_warning_days.saturating_mul(86_400)),
        ..Settings::default()
    };
    let (workspace_tx, workspace_rx) = tokio::sync::watch::channel(None);
    let agent = Agent::new(proxy, SystemResolver, loader, settings, status.clone())
        .announce_tls_dir(tls_dir_updates)
        .publish_workspace(workspace_tx);
    let agent_task = tokio::spawn(agent.run(rx));
    let mut issuer = tokio::spawn(issue_when_sozu_managed(
        workspace_rx,
        args.tls_dir.clone(),
        tx.clone(),
        status.clone(),
    ));

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
    // Closing every sender ends the loop after the reconcile in flight, if any (the issuer holds
    // one: it goes first).
    if !issuer_done {
        issuer.abort();
        let _ = issuer.await;
    }
    drop(tx);
    watches.abort();
    let _ = agent_task.await;
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
async fn issue_when_sozu_managed(
    mut workspaces: tokio::sync::watch::Receiver<
        Option<std::sync::Arc<crate::workspace::Workspace>>,
    >,
    tls_dir: Option<std::path::PathBuf>,
    triggers: mpsc::UnboundedSender<crate::reconcile::Trigger>,
    status: SharedStatus,
) -> Result<(), crate::acme::AcmeError> {
    use crate::workspace::TlsRotation;
    let sozu_managed = |w: &Option<std::sync::Arc<crate::workspace::Workspace>>| {
        w.as_ref()
            .is_some_and(|w| w.tls_rotation == TlsRotation::SozuManaged)
    };
    if workspaces.wait_for(sozu_managed).await.is_err() {
        return Ok(());
    }
    let options = crate::acme::Options {
        tls_dir,
        knobs: crate::acme::Knobs::from_env(),
        triggers: Some(triggers),
        status: crate::acme::IssuerHandle::default(),
        on_status: Box::new(move |issuer| {
            status.write().unwrap_or_else(|p| p.into_inner()).issuer = Some(issuer.clone());
        }),
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
