//! `check`: a workspace evaluated with the bundled contract as the agent would, the files its
//! policies name read and checked, and a one-line summary; or the diagnostic and exit code 1.

use std::process::ExitCode;

use super::evaluation::{evaluate, join_traefik, CommandError};
use super::exit::INVALID as EXIT_INVALID;
use super::output::{print, say};
use super::CheckArgs;
use crate::deploy;
use crate::evaluate::imports::Root;
use crate::evaluate::input::Input;
use crate::sources::route_policy_files;
use crate::text::{clean_line, MAX_LINE_BYTES};

pub fn run(args: &CheckArgs) -> Result<ExitCode, CommandError> {
    let workspace = Input::open(&args.workspace)?;
    let limits = args.eval.limits(args.admin_address);
    let ws = match evaluate(&workspace, &limits)? {
        Ok(ws) => ws,
        Err(code) => return Ok(code),
    };
    // The Traefik files' routes are checked as the agent would join them: a file that does not
    // parse or a router refused is an error here (the agent would serve the rest).
    let (ws, traefik_errors, traefik_notes) = join_traefik(ws, limits.admin_port);
    for note in traefik_notes {
        say("note", note);
    }
    if !traefik_errors.is_empty() {
        for error in traefik_errors {
            say("error", error);
        }
        return Ok(ExitCode::from(EXIT_INVALID));
    }
    let tree = Root::of(&workspace.path(), args.eval.workspace_root.as_deref())
        .map_err(CommandError::Tree)?;
    let (unreadable, refused) = route_policy_files::check(&ws, &tree);
    if !refused.is_empty() {
        for reason in refused {
            say("error", reason);
        }
        return Ok(ExitCode::from(EXIT_INVALID));
    }
    for reason in unreadable {
        say(
            "warning",
            format!("{reason} (the agent refuses it until it can read it)"),
        );
    }
    let from_traefik = ws
        .traefik_live
        .as_ref()
        .map(|live| format!(" ({} from traefik)", live.status.routes))
        .unwrap_or_default();
    print(format!(
        "ok: {} — {} route{}{from_traefik} in zone {}, tls_rotation {}\n",
        clean_line(&workspace.name(), MAX_LINE_BYTES),
        ws.routes.len(),
        if ws.routes.len() == 1 { "" } else { "s" },
        ws.zone,
        ws.tls_rotation
    ))
    .map_err(CommandError::Stdout)?;
    for warning in deploy::warnings(&ws) {
        say("warning", warning);
    }
    Ok(ExitCode::SUCCESS)
}
