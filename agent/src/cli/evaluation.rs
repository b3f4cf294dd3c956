//! A workspace evaluated for `check` and `render`: in the sandboxed child, as `run` evaluates it,
//! with an invalid workspace's diagnostic printed and turned into its exit code; and the errors
//! those commands meet that are not the workspace's.

use std::process::ExitCode;

use super::exit::INVALID as EXIT_INVALID;
use super::output::say;
use crate::deploy::DeployError;
use crate::evaluate::contract::ContractError;
use crate::evaluate::input::{Input, InputError};
use crate::evaluate::sandbox::{self, SandboxError};
use crate::render::alerts::AlertsError;
use crate::render::RenderError;
use crate::workspace::Workspace;

/// What stops `check` or `render` other than an invalid workspace (which is an exit code).
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error(transparent)]
    Input(#[from] InputError),
    #[error("cannot locate the private-ingress executable: {0}")]
    Executable(std::io::Error),
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    #[error("cannot find the workspace's directory: {0}")]
    Tree(std::io::Error),
    #[error(transparent)]
    Render(#[from] RenderError),
    #[error(transparent)]
    Alerts(#[from] AlertsError),
    #[error(transparent)]
    Deploy(#[from] DeployError),
    #[error("cannot write to stdout: {0}")]
    Stdout(std::io::Error),
}

/// Evaluates the workspace in the sandbox. An invalid workspace is reported here and becomes the
/// exit code; other failures are errors.
pub fn evaluate(
    input: &Input,
    limits: &sandbox::Limits,
) -> Result<Result<Workspace, ExitCode>, CommandError> {
    let exe = std::env::current_exe().map_err(CommandError::Executable)?;
    match sandbox::evaluate_input(&exe, input, limits) {
        Ok(ws) => Ok(Ok(ws)),
        Err(SandboxError::Contract(ContractError::Invalid { diagnostic })) => {
            // Cleaned by the sandbox already (`text::clean`), line feeds kept.
            eprint!("{diagnostic}");
            if !diagnostic.ends_with('\n') {
                eprintln!();
            }
            Ok(Err(ExitCode::from(EXIT_INVALID)))
        }
        Err(err) if err.is_invalid_workspace() => {
            say("error", err);
            Ok(Err(ExitCode::from(EXIT_INVALID)))
        }
        Err(err) => Err(err.into()),
    }
}

/// The workspace with the routes of its `traefik` record's files, joined as the agent joins
/// them ([`crate::translate::traefik::join::merge`]), and what to say of them: each file that does
/// not parse and each router refused (errors), and that the endpoint is read live only.
pub fn join_traefik(ws: Workspace, admin_port: u16) -> (Workspace, Vec<String>, Vec<String>) {
    use crate::sources::traefik::{read_once, Settings};
    let Some(traefik) = ws.traefik.as_deref() else {
        return (ws, Vec::new(), Vec::new());
    };
    let settings = Settings {
        traefik: traefik.clone(),
        zone: ws.zone.clone(),
    };
    let update = read_once(&settings);
    let joined = crate::translate::traefik::join::merge(
        &ws,
        &update.routes,
        &update.certificates,
        update.refused,
        update.status,
        admin_port,
    );
    let mut errors = Vec::new();
    let mut notes = Vec::new();
    if let Some(live) = &joined.traefik_live {
        for source in &live.status.sources {
            match (source.kind.as_str(), &source.error) {
                ("endpoint", _) => notes.push(format!(
                    "traefik endpoint {} is read live only: the agent polls it every {} s; its routes are not in this output",
                    source.source, traefik.poll_interval_secs
                )),
                (_, Some(error)) => errors.push(format!("traefik: {error}")),
                _ => {}
            }
        }
        errors.extend(live.status.refused.iter().map(|r| format!("traefik: {r}")));
    }
    (joined, errors, notes)
}
