use std::io::Write;
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;

use private_ingress::cli::exit::{
    INVALID as EXIT_INVALID, IO as EXIT_IO, NOT_READY as EXIT_NOT_READY,
    NO_ANSWER as EXIT_NO_ANSWER,
};
use private_ingress::cli::status::StatusError;
use private_ingress::cli::{Cli, Command, EvalArgs, Format};
use private_ingress::deploy;
use private_ingress::evaluate::contract::{ContractError, SCHEMA};
use private_ingress::evaluate::imports::Root;
use private_ingress::evaluate::input::Input;
use private_ingress::evaluate::sandbox::{self, SandboxError};
use private_ingress::render::alerts::{self, AlertSettings};
use private_ingress::render::{self, SozuSettings};
use private_ingress::sources;
use private_ingress::workspace::Workspace;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(err) => {
            // Each cause once: an error that shows its cause is not followed by it again.
            eprintln!(
                "error: {}",
                private_ingress::text::error_chain(err.as_ref())
            );
            ExitCode::from(EXIT_IO)
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Check { workspace, eval } => {
            let workspace = Input::open(&workspace)?;
            let ws = match load(&workspace, &eval)? {
                Ok(ws) => ws,
                Err(code) => return Ok(code),
            };
            let tree = Root::of(&workspace.path(), eval.workspace_root.as_deref())
                .context("cannot find the workspace's directory")?;
            let (unreadable, refused) = sources::route_policy_files::check(&ws, &tree);
            if !refused.is_empty() {
                for reason in refused {
                    eprintln!("error: {reason}");
                }
                return Ok(ExitCode::from(EXIT_INVALID));
            }
            for reason in unreadable {
                eprintln!("warning: {reason} (the agent refuses it until it can read it)");
            }
            print(format!(
                "ok: {} — {} route{} in zone {}, tls_rotation {}\n",
                workspace.name(),
                ws.routes.len(),
                if ws.routes.len() == 1 { "" } else { "s" },
                ws.zone,
                ws.tls_rotation
            ))?;
            for warning in deploy::warnings(&ws) {
                eprintln!("warning: {warning}");
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Render {
            workspace,
            format,
            output,
            sozu_socket,
            alert_for_scale,
            eval,
        } => {
            let workspace = Input::open(&workspace)?;
            let mut limits = eval.limits();
            if format == Format::SozuToml {
                limits.target = private_ingress::evaluate::contract::Target::SozuToml;
            }
            let ws = match load_with(&workspace, &limits)? {
                Ok(ws) => ws,
                Err(code) => return Ok(code),
            };
            let alerts = AlertSettings {
                for_scale: alert_for_scale,
            };
            let text = match format {
                Format::Json => render::json(&ws)?,
                Format::PrometheusRules => alerts::rules_file(&alerts)?,
                Format::SozuToml => {
                    let settings = SozuSettings {
                        command_socket: sozu_socket,
                        ..SozuSettings::default()
                    };
                    for warning in render::sozu_toml_warnings(&ws) {
                        eprintln!("warning: {warning}");
                    }
                    // The pages go into the file whole, read and checked as the agent would.
                    let tree = Root::of(&workspace.path(), eval.workspace_root.as_deref())
                        .context("cannot find the workspace's directory")?;
                    let pages = match sources::route_policy_files::pages(&ws, &tree) {
                        Ok(pages) => pages,
                        Err(reasons) => {
                            for reason in reasons {
                                eprintln!("error: {reason}");
                            }
                            return Ok(ExitCode::from(EXIT_INVALID));
                        }
                    };
                    match render::sozu_toml(&ws, &pages, &settings) {
                        Ok(text) => text,
                        Err(err) if err.is_invalid_workspace() => {
                            eprintln!("error: {err}");
                            return Ok(ExitCode::from(EXIT_INVALID));
                        }
                        Err(err) => return Err(err.into()),
                    }
                }
                Format::K8s | Format::Dns => {
                    let rendered = if format == Format::K8s {
                        for warning in deploy::warnings(&ws) {
                            eprintln!("warning: {warning}");
                        }
                        deploy::WorkspaceFiles::of(&workspace, eval.workspace_root.as_deref())
                            .and_then(|files| deploy::k8s(&ws, &files, &alerts))
                    } else {
                        deploy::dns(&ws)
                    };
                    match rendered {
                        Ok(text) => text,
                        Err(err) if err.is_invalid_workspace() => {
                            eprintln!("error: {err}");
                            return Ok(ExitCode::from(EXIT_INVALID));
                        }
                        Err(err) => return Err(err.into()),
                    }
                }
            };
            match output {
                Some(path) if path.as_os_str() != "-" => {
                    render::write_atomic(&path, text.as_bytes())?
                }
                _ => print(text)?,
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Run(args) => {
            // Before any thread starts: see `use_one_heap`.
            private_ingress::memory::use_one_heap();
            private_ingress::run::init_logging(args.log_format);
            let runtime =
                tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
            let result = runtime.block_on(private_ingress::run::run(args));
            // A blocking call still in flight (a request to a sozu that is gone, an
            // evaluation) does not hold the exit: each has its own deadline, and the process
            // is leaving anyway.
            runtime.shutdown_timeout(std::time::Duration::from_secs(1));
            result?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Status {
            admin_address,
            json,
            timeout,
        } => {
            let timeout = std::time::Duration::from_secs_f64(timeout);
            let (body, status) = match private_ingress::cli::status::fetch(&admin_address, timeout)
            {
                Ok(fetched) => fetched,
                Err(err @ StatusError::NoAnswer { .. }) => {
                    eprintln!("error: {err}");
                    return Ok(ExitCode::from(EXIT_NO_ANSWER));
                }
                Err(err) => return Err(err.into()),
            };
            if json {
                print(format!("{body}\n"))?;
            } else {
                print(private_ingress::cli::status::table(&status))?;
            }
            // A script or a check can tell a ready agent from one that is not.
            Ok(if status.ready {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(EXIT_NOT_READY)
            })
        }
        Command::Top {
            admin_address,
            refresh,
            once,
            pane,
            ascii,
            timeout,
            size,
        } => {
            use private_ingress::cli::top::{self, TopError};
            let options = top::Options {
                admin_address,
                refresh: std::time::Duration::from_secs_f64(refresh),
                timeout: std::time::Duration::from_secs_f64(timeout),
                pane: pane.into(),
                theme: top::model::Theme {
                    // NO_COLOR, CLICOLOR and a terminal, as for help and logs.
                    color: anstream::AutoStream::choice(&std::io::stdout())
                        != anstream::ColorChoice::Never,
                    ascii,
                },
            };
            let outcome = if once {
                let (width, height) = size.unwrap_or_else(frame_size);
                top::once(&options, width, height).map(|(text, ready)| (Some(text), ready))
            } else {
                top::run(&options).map(|_| (None, true))
            };
            match outcome {
                Ok((Some(text), ready)) => {
                    print(text)?;
                    Ok(if ready {
                        ExitCode::SUCCESS
                    } else {
                        ExitCode::from(EXIT_NOT_READY)
                    })
                }
                Ok((None, _)) => Ok(ExitCode::SUCCESS),
                Err(TopError::Agent(err @ StatusError::NoAnswer { .. })) => {
                    eprintln!("error: {err}");
                    Ok(ExitCode::from(EXIT_NO_ANSWER))
                }
                Err(err) => Err(err.into()),
            }
        }
        Command::Schema => {
            print(SCHEMA)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Completions { shell } => {
            let mut script = Vec::new();
            private_ingress::cli::manual::completions(shell, &mut script);
            print(script)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Man => {
            let mut page = Vec::new();
            private_ingress::cli::manual::man(&mut page).context("cannot render the manual")?;
            print(page)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::EvaluateWorkspace {
            memory_limit,
            root,
            name,
            for_sozu_toml,
            workspace,
        } => {
            let target = if for_sozu_toml {
                private_ingress::evaluate::contract::Target::SozuToml
            } else {
                private_ingress::evaluate::contract::Target::Agent
            };
            let code = sandbox::child_main(
                &workspace,
                root.as_deref(),
                memory_limit,
                name.as_deref(),
                target,
            );
            Ok(ExitCode::from(u8::try_from(code).unwrap_or(3)))
        }
    }
}

/// `top --once`'s frame: the terminal's size when standard output is one, else `COLUMNS` and
/// `LINES` when set, else 120 × 40.
fn frame_size() -> (u16, u16) {
    use std::io::IsTerminal;
    if std::io::stdout().is_terminal() {
        if let Ok(size) = crossterm::terminal::size() {
            return size;
        }
    }
    let var = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u16>().ok());
    (
        var("COLUMNS").unwrap_or(120).clamp(20, 1000),
        var("LINES").unwrap_or(40).clamp(10, 1000),
    )
}

/// Writes `bytes` to standard output. A reader that stopped reading (`… | head`) is no error:
/// what is left is not wanted, and the command's exit status stays its own. (Rust ignores
/// SIGPIPE, so a closed pipe is an error of the write, which `println!` would turn into a panic.)
fn print(bytes: impl AsRef<[u8]>) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes.as_ref()).and_then(|()| out.flush()) {
        Err(err) if err.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other.context("cannot write to stdout"),
    }
}

/// Evaluates the workspace in the sandbox. An invalid workspace is reported here and becomes the
/// exit code; other failures propagate as errors.
fn load(input: &Input, eval: &EvalArgs) -> anyhow::Result<Result<Workspace, ExitCode>> {
    load_with(input, &eval.limits())
}

fn load_with(
    input: &Input,
    limits: &sandbox::Limits,
) -> anyhow::Result<Result<Workspace, ExitCode>> {
    let exe = std::env::current_exe().context("cannot locate the private-ingress executable")?;
    match sandbox::evaluate_input(&exe, input, limits) {
        Ok(ws) => Ok(Ok(ws)),
        Err(SandboxError::Contract(ContractError::Invalid { diagnostic })) => {
            eprint!("{diagnostic}");
            if !diagnostic.ends_with('\n') {
                eprintln!();
            }
            Ok(Err(ExitCode::from(EXIT_INVALID)))
        }
        Err(err) if err.is_invalid_workspace() => {
            eprintln!("error: {err}");
            Ok(Err(ExitCode::from(EXIT_INVALID)))
        }
        Err(err) => Err(err.into()),
    }
}
