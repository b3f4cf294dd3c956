use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;

use private_ingress::cli::exit::{IO as EXIT_IO, NO_ANSWER as EXIT_NO_ANSWER};
use private_ingress::cli::output::say;
use private_ingress::cli::status::StatusError;
use private_ingress::cli::{self, Cli, Command};
use private_ingress::evaluate::contract::SCHEMA;
use private_ingress::evaluate::sandbox;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(err) => {
            // Each cause once: an error that shows its cause is not followed by it again.
            say("error", private_ingress::text::error_chain(err.as_ref()));
            ExitCode::from(EXIT_IO)
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Check(args) => Ok(cli::check::run(&args)?),
        Command::Render(args) => Ok(cli::render::run(&args)?),
        Command::Run(args) => {
            // Before any thread starts: see `use_one_heap`, `map_big_buffers` and
            // `merge_on_free`.
            private_ingress::memory::use_one_heap();
            private_ingress::memory::map_big_buffers();
            private_ingress::memory::merge_on_free();
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
        } => no_answer_is_exit_3(cli::status::run(&admin_address, json, timeout)),
        Command::Top {
            admin_address,
            refresh,
            once,
            pane,
            ascii,
            timeout,
            size,
        } => {
            let options = cli::top::Options {
                admin_address,
                refresh: std::time::Duration::from_secs_f64(refresh),
                timeout: std::time::Duration::from_secs_f64(timeout),
                pane,
                theme: cli::top::model::Theme {
                    // NO_COLOR, CLICOLOR and a terminal, as for help and logs.
                    color: anstream::AutoStream::choice(&std::io::stdout())
                        != anstream::ColorChoice::Never,
                    ascii,
                },
            };
            match cli::top::command(&options, once, size) {
                Err(cli::top::TopError::Agent(err)) => no_answer_is_exit_3(Err(err)),
                other => Ok(other?),
            }
        }
        Command::Import(import) => Ok(ExitCode::from(private_ingress::cli::import::run(
            &import,
            &mut std::io::stdout().lock(),
            &mut std::io::stderr().lock(),
        ))),
        Command::Schema => {
            out(SCHEMA)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Completions { shell } => {
            let mut script = Vec::new();
            private_ingress::cli::manual::completions(shell, &mut script);
            out(script)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Man => {
            let mut page = Vec::new();
            private_ingress::cli::manual::man(&mut page).context("cannot render the manual")?;
            out(page)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::EvaluateWorkspace {
            memory_limit,
            root,
            name,
            for_sozu_toml,
            for_k8s,
            admin_port,
            workspace,
        } => {
            let target = if for_sozu_toml {
                private_ingress::evaluate::contract::Target::SozuToml
            } else if for_k8s {
                private_ingress::evaluate::contract::Target::K8s
            } else {
                private_ingress::evaluate::contract::Target::Agent
            };
            let code = sandbox::child_main(
                &workspace,
                root.as_deref(),
                memory_limit,
                name.as_deref(),
                target,
                admin_port,
            );
            Ok(ExitCode::from(u8::try_from(code).unwrap_or(3)))
        }
    }
}

/// A running agent that does not answer is exit code 3 (`status`, `top`), said on stderr; any
/// other failure is an error.
fn no_answer_is_exit_3(result: Result<ExitCode, StatusError>) -> anyhow::Result<ExitCode> {
    match result {
        Err(err @ StatusError::NoAnswer { .. }) => {
            say("error", err);
            Ok(ExitCode::from(EXIT_NO_ANSWER))
        }
        other => Ok(other?),
    }
}

/// Standard output, as every command writes it ([`cli::output::print`]).
fn out(bytes: impl AsRef<[u8]>) -> anyhow::Result<()> {
    cli::output::print(bytes).context("cannot write to stdout")
}
