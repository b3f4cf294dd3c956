//! Command-line interface. Every flag documented here is public interface: keep names stable.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};

/// Keeps a sozu reverse proxy equal to a Nickel routes workspace.
///
/// Exit codes: 0 success; 1 the workspace is invalid (syntax, contract, evaluation failure or
/// limit); 2 a file cannot be read or written, or the command line is wrong.
#[derive(Debug, Parser)]
#[command(name = "private-ingress", version, about, long_about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Check a workspace against the contract and print a one-line summary.
    Check {
        /// The workspace file (.ncl, or plain .json/.yaml/.toml data).
        workspace: PathBuf,
        #[command(flatten)]
        eval: EvalArgs,
    },
    /// Render a workspace to a normalised JSON model or a complete sozu configuration.
    Render {
        /// The workspace file (.ncl, or plain .json/.yaml/.toml data).
        workspace: PathBuf,
        /// What to produce.
        #[arg(long, value_enum)]
        format: Format,
        /// Write here (atomically: a failure leaves the previous file untouched) instead of stdout.
        #[arg(long, short)]
        output: Option<PathBuf>,
        /// sozu-toml: the control socket path written into the configuration.
        #[arg(
            long,
            env = "PRIVATE_INGRESS_SOZU_SOCKET",
            default_value = "/var/run/sozu/sozu.sock"
        )]
        sozu_socket: PathBuf,
        #[command(flatten)]
        eval: EvalArgs,
    },
    /// Print the bundled contract, to vendor next to a workspace for editor support.
    Schema,
    /// Internal: evaluate a workspace in this (child) process and print a JSON report.
    #[command(name = "__evaluate-workspace", hide = true)]
    EvaluateWorkspace {
        #[arg(long)]
        memory_limit: u64,
        workspace: PathBuf,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// The normalised workspace model.
    Json,
    /// A complete sozu 2.3.3 configuration file.
    SozuToml,
}

#[derive(Debug, Clone, clap::Args)]
pub struct EvalArgs {
    /// Seconds a workspace evaluation may take before it is stopped.
    #[arg(long, env = "PRIVATE_INGRESS_EVAL_TIMEOUT", default_value_t = 30.0, value_parser = positive_seconds)]
    pub eval_timeout: f64,
    /// Memory (MiB of address space) a workspace evaluation may use.
    #[arg(long, env = "PRIVATE_INGRESS_EVAL_MEMORY_MIB", default_value_t = 4096,
          value_parser = clap::value_parser!(u64).range(256..))]
    pub eval_memory_mib: u64,
}

impl EvalArgs {
    pub fn limits(&self) -> crate::sandbox::Limits {
        crate::sandbox::Limits {
            timeout: Duration::from_secs_f64(self.eval_timeout),
            memory_bytes: self.eval_memory_mib.saturating_mul(1 << 20),
        }
    }
}

fn positive_seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v < 86_400.0 => Ok(v),
        _ => Err(format!(
            "`{s}` is not a number of seconds between 0 and 86400"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_flags_parse() {
        let cli = Cli::try_parse_from([
            "private-ingress",
            "render",
            "ws.ncl",
            "--format",
            "sozu-toml",
            "--output",
            "out.toml",
        ])
        .unwrap();
        match cli.command {
            Command::Render { format, output, .. } => {
                assert_eq!(format, Format::SozuToml);
                assert_eq!(output, Some(PathBuf::from("out.toml")));
            }
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn eval_timeout_must_be_positive() {
        for bad in ["0", "-1", "nan", "abc"] {
            let parsed =
                Cli::try_parse_from(["private-ingress", "check", "ws.ncl", "--eval-timeout", bad]);
            assert!(parsed.is_err(), "{bad} accepted");
        }
    }
}
