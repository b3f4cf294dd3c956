//! `render`: the files made from a workspace (the normalised model, sozu's configuration, the
//! Kubernetes manifests, the DNS records, the alert rules), on standard output or written
//! atomically.

use std::process::ExitCode;

use super::evaluation::{evaluate, join_traefik, CommandError};
use super::exit::INVALID as EXIT_INVALID;
use super::output::{print, say};
use super::{Format, RenderArgs};
use crate::deploy;
use crate::evaluate::contract::Target;
use crate::evaluate::imports::Root;
use crate::evaluate::input::Input;
use crate::render::alerts::{self, AlertSettings};
use crate::render::{self, SozuSettings};
use crate::sources::route_policy_files;

pub fn run(args: &RenderArgs) -> Result<ExitCode, CommandError> {
    let workspace = Input::open(&args.workspace)?;
    let mut limits = args.eval.limits(args.admin_address);
    limits.target = match args.format {
        Format::SozuToml => Target::SozuToml,
        Format::K8s => Target::K8s,
        Format::Json | Format::Dns | Format::PrometheusRules => Target::Agent,
    };
    let ws = match evaluate(&workspace, &limits)? {
        Ok(ws) => ws,
        Err(code) => return Ok(code),
    };
    // The Traefik files' routes are rendered with the workspace's own; what is not served is
    // said, as `check` says it.
    let (ws, traefik_errors, traefik_notes) = join_traefik(ws, limits.admin_port);
    for warning in traefik_errors.into_iter().chain(traefik_notes) {
        say("warning", warning);
    }
    let alerts = AlertSettings {
        for_scale: args.alert_for_scale,
    };
    let text = match args.format {
        Format::Json => render::json(&ws)?,
        Format::PrometheusRules => alerts::rules_file(&alerts)?,
        Format::SozuToml => {
            let settings = SozuSettings {
                command_socket: args.sozu_socket.clone(),
                ..SozuSettings::default()
            };
            for warning in render::sozu_toml_warnings(&ws) {
                say("warning", warning);
            }
            // The pages go into the file whole, read and checked as the agent would.
            let tree = Root::of(&workspace.path(), args.eval.workspace_root.as_deref())
                .map_err(CommandError::Tree)?;
            let pages = match route_policy_files::pages(&ws, &tree) {
                Ok(pages) => pages,
                Err(reasons) => {
                    for reason in reasons {
                        say("error", reason);
                    }
                    return Ok(ExitCode::from(EXIT_INVALID));
                }
            };
            match render::sozu_toml(&ws, &pages, &settings) {
                Ok(text) => text,
                Err(err) if err.is_invalid_workspace() => {
                    say("error", err);
                    return Ok(ExitCode::from(EXIT_INVALID));
                }
                Err(err) => return Err(err.into()),
            }
        }
        Format::K8s | Format::Dns => {
            let rendered = if args.format == Format::K8s {
                for warning in deploy::warnings(&ws) {
                    say("warning", warning);
                }
                // The agent in the pod reads the Traefik files itself: they are not rendered.
                if let Some(t) = ws.traefik.as_deref() {
                    if let Some(path) = t.directory.as_ref().or(t.file.as_ref()) {
                        say(
                            "warning",
                            format!(
                                "traefik: the rendered pod does not hold {}: mount it into the agent container at the path the workspace names (a relative path is the workspace directory's, /etc/private-ingress/workspace in the pod), and list the ports of upstreams its routes may add later in deploy.extra_egress_ports (docs/deploy.md, \"Traefik's configuration\")",
                                path.display()
                            ),
                        );
                    }
                }
                deploy::WorkspaceFiles::of(&workspace, args.eval.workspace_root.as_deref())
                    .and_then(|files| deploy::k8s(&ws, &files, &alerts))
            } else {
                deploy::dns(&ws)
            };
            match rendered {
                Ok(text) => text,
                Err(err) if err.is_invalid_workspace() => {
                    say("error", err);
                    return Ok(ExitCode::from(EXIT_INVALID));
                }
                Err(err) => return Err(err.into()),
            }
        }
    };
    match &args.output {
        Some(path) if path.as_os_str() != "-" => render::write_atomic(path, text.as_bytes())?,
        _ => print(text).map_err(CommandError::Stdout)?,
    }
    Ok(ExitCode::SUCCESS)
}
