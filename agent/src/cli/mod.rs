//! Command-line interface: the arguments of every subcommand ([`status`] is `status`'s own
//! code). Every flag documented here is public interface: keep names stable.

pub mod check;
pub mod evaluation;
pub mod exit;
pub mod import;
pub mod manual;
pub mod output;
pub mod render;
pub mod status;
pub mod top;

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};

/// Keeps a sozu reverse proxy equal to a Nickel routes workspace.
///
/// Exit codes: 0 success; 1 the workspace is invalid (syntax, contract, evaluation failure or
/// limit), or for `status`, the agent answers but is not ready; 2 a file cannot be read or
/// written, the agent cannot be reached, the command line is wrong, or `run` stopped on a
/// failure; 3 `status` got no answer within `--timeout`.
///
/// A workspace given as `-` is read from standard input; one that is not a regular file (a
/// pipe, /dev/stdin) is read once. Either way its imports resolve from the current directory.
/// NO_COLOR (set and not empty) turns colour off, on a terminal too.
#[derive(Debug, Parser)]
#[command(name = "private-ingress", version, about, long_about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Check a workspace against the contract and print a one-line summary.
    Check(CheckArgs),
    /// Render a workspace: its normalised model, a sozu configuration, Kubernetes manifests, DNS
    /// records or alert rules.
    Render(RenderArgs),
    /// Keep a running sozu equal to the workspace, and serve the admin endpoints.
    Run(RunArgs),
    /// Show, per route, what the agent wants and what sozu holds (reads a running agent's
    /// `/v1/state`).
    Status {
        /// The running agent's admin address.
        #[arg(long, env = "PRIVATE_INGRESS_ADMIN_ADDRESS", default_value = DEFAULT_ADMIN_ADDRESS)]
        admin_address: String,
        /// Print the raw JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// Seconds to wait for the agent's answer; none by then exits 3.
        #[arg(long, default_value_t = 5.0, value_parser = positive_seconds)]
        timeout: f64,
    },
    /// A live, full-screen view of a running agent: its routes, certificates, listeners and
    /// events as they happen (reads its admin API, as `status` does; read only). `?` lists the
    /// keys, `q` quits.
    Top {
        /// The running agent's admin address.
        #[arg(long, env = "PRIVATE_INGRESS_ADMIN_ADDRESS", default_value = DEFAULT_ADMIN_ADDRESS)]
        admin_address: String,
        /// Seconds between two reads of the agent's state (an unchanged state costs the agent
        /// a 304).
        #[arg(long, default_value_t = 2.0, value_parser = refresh_seconds)]
        refresh: f64,
        /// Print one frame as plain text and exit: 0 when the agent is ready, 1 when not, as
        /// `status` (for scripts and bug reports).
        #[arg(long)]
        once: bool,
        /// The pane to show first (and the one `--once` prints).
        #[arg(long, value_enum, default_value_t = top::model::Pane::Routes)]
        pane: top::model::Pane,
        /// ASCII alone: no box-drawing or block characters (for terminals and fonts without
        /// them).
        #[arg(long, env = "PRIVATE_INGRESS_TOP_ASCII")]
        ascii: bool,
        /// Seconds to wait for the agent's first answer; none by then exits 3.
        #[arg(long, default_value_t = 5.0, value_parser = positive_seconds)]
        timeout: f64,
        /// `--once`: the frame's size, COLUMNSxROWS (default: the terminal's, else 120x40).
        #[arg(long, value_parser = frame_size)]
        size: Option<(u16, u16)>,
    },
    /// Write a workspace from Kubernetes routes: `Ingress` objects with their ingress-nginx
    /// annotations, or Gateway API routes. What cannot be carried is left out, said object by
    /// object on stderr and in the workspace; exit 1 when anything was, 2 when an input cannot
    /// be read.
    #[command(subcommand)]
    Import(ImportCommand),
    /// Print the bundled contract, to vendor next to a workspace for editor support.
    Schema,
    /// Print the completion script for a shell.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff), every subcommand and flag in one page.
    Man,
    /// Internal: evaluate a workspace in this (child) process and print a JSON report.
    #[command(name = "__evaluate-workspace", hide = true)]
    EvaluateWorkspace {
        #[arg(long)]
        memory_limit: u64,
        #[arg(long)]
        root: Option<PathBuf>,
        /// The workspace is the text on standard input, called this.
        #[arg(long)]
        name: Option<String>,
        /// The workspace is rendered as sozu's configuration file, which holds less.
        #[arg(long)]
        for_sozu_toml: bool,
        /// The workspace is rendered as Kubernetes manifests.
        #[arg(long, conflicts_with = "for_sozu_toml")]
        for_k8s: bool,
        /// The agent's admin port, which no route may take.
        #[arg(long, default_value_t = crate::evaluate::contract::DEFAULT_ADMIN_PORT)]
        admin_port: u16,
        workspace: PathBuf,
    },
}

/// The route languages `import` reads.
#[derive(Debug, Subcommand)]
pub enum ImportCommand {
    /// `Ingress` objects (networking.k8s.io/v1) as `kubectl get ingress -A -o yaml` writes them,
    /// with the Services (named ports) and Secrets (basic-auth users) they refer to.
    Ingress(ImportArgs),
    /// Gateway API v1 `Gateway`s and their `HTTPRoute`, `GRPCRoute`, `TLSRoute`, `TCPRoute` and
    /// `UDPRoute`s, with the Services, Namespaces and ReferenceGrants they refer to.
    Gateway(ImportArgs),
    /// Traefik 3.x dynamic configuration: the file provider's YAML or TOML files (a directory
    /// is read as the file provider reads it), or an HTTP provider's saved answer (JSON).
    Traefik(TraefikImportArgs),
}

#[derive(Debug, Clone, clap::Args)]
pub struct TraefikImportArgs {
    /// Files (YAML, TOML, or JSON as an HTTP provider answers) or directories (every `.yml`,
    /// `.yaml` and `.toml` under them, as the file provider reads them); `-` reads standard
    /// input (YAML or JSON).
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// The workspace's zone: a host outside it is left out.
    #[arg(long)]
    pub zone: String,
    /// The host of TCP `HostSNI(`*`)` and UDP routers, which name none.
    #[arg(long)]
    pub host: Option<String>,
    /// The workspace's `cluster_issuer` (`internal-ca`, a placeholder, when not given).
    #[arg(long)]
    pub cluster_issuer: Option<String>,
    /// What an entry point is, as `NAME=https`, `NAME=http` or `NAME=PORT` (the port of the
    /// ingress a TCP or UDP router listens on); repeated. `websecure=https` and `web=http`
    /// unless given.
    #[arg(long = "entry-point", value_parser = entry_point)]
    pub entry_points: Vec<(String, crate::translate::traefik::EntryPoint)>,
    /// Write the workspace here (atomically); by default it goes to stdout.
    #[arg(long, short)]
    pub output: Option<PathBuf>,
}

/// `NAME=https|http|PORT`.
fn entry_point(s: &str) -> Result<(String, crate::translate::traefik::EntryPoint), String> {
    use crate::translate::traefik::EntryPoint;
    let (name, what) = s
        .split_once('=')
        .ok_or("expected NAME=https, NAME=http or NAME=PORT")?;
    let point = match what {
        "https" => EntryPoint::Https,
        "http" => EntryPoint::Http,
        port => EntryPoint::Port(
            port.parse::<u16>()
                .ok()
                .filter(|p| *p > 0)
                .ok_or_else(|| format!("`{port}` is not https, http or a port from 1 to 65535"))?,
        ),
    };
    if name.is_empty() {
        return Err("the entry point has no name".into());
    }
    Ok((name.to_owned(), point))
}

#[derive(Debug, Clone, clap::Args)]
pub struct ImportArgs {
    /// YAML files of Kubernetes objects (several documents, `List`s); `-` reads standard input.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// The workspace's zone: a host outside it is left out.
    #[arg(long)]
    pub zone: String,
    /// The host of the routes that name none (and whose listener names none).
    #[arg(long)]
    pub host: Option<String>,
    /// The workspace's `cluster_issuer` (by default the objects' `cert-manager.io/cluster-issuer`
    /// when they agree).
    #[arg(long)]
    pub cluster_issuer: Option<String>,
    /// Write the workspace here (atomically), and the basic-auth users files beside it; by
    /// default the workspace goes to stdout and the users files to the current directory.
    #[arg(long, short)]
    pub output: Option<PathBuf>,
}

/// The longest interval a duration flag takes: a day. Every interval becomes an instant on a
/// monotonic clock, which has no room for 2^63 seconds.
const DAY_SECONDS: u64 = 86_400;

/// Where the admin endpoints listen unless told otherwise. Loopback: in a pod, set
/// `--admin-address 0.0.0.0:9180` so that the kubelet's probes reach it.
pub const DEFAULT_ADMIN_ADDRESS: &str = "127.0.0.1:9180";

#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// The workspace file; its directory is watched, so a ConfigMap mount's `..data` swap is seen.
    #[arg(long, env = "PRIVATE_INGRESS_WORKSPACE", value_parser = watched_file)]
    pub workspace: PathBuf,
    /// sozu's command socket. The agent waits for it, so it may start before sozu.
    #[arg(long, env = "PRIVATE_INGRESS_SOZU_SOCKET")]
    pub sozu_socket: PathBuf,
    /// The user sozu runs as, when it is not the agent's: the process at the other end of the
    /// socket must be one or the other (it is sent private keys).
    #[arg(long, env = "PRIVATE_INGRESS_SOZU_UID")]
    pub sozu_uid: Option<u32>,
    /// Certificates are read from `<tls-dir>/<host>/{tls.crt,tls.key}`; overrides the workspace's
    /// `tls_dir`.
    #[arg(long, env = "PRIVATE_INGRESS_TLS_DIR")]
    pub tls_dir: Option<PathBuf>,
    /// Address of /healthz, /readyz, /metrics and /v1/state.
    #[arg(long, env = "PRIVATE_INGRESS_ADMIN_ADDRESS", default_value = DEFAULT_ADMIN_ADDRESS)]
    pub admin_address: std::net::SocketAddr,
    /// A host name the admin server answers to, besides IP addresses and `localhost` (a
    /// Service's name, say); repeat, or separate with commas. A request naming any other host is
    /// refused, which keeps a DNS-rebinding page from reading it.
    #[arg(
        long,
        env = "PRIVATE_INGRESS_ADMIN_ALLOWED_HOSTS",
        value_delimiter = ','
    )]
    pub admin_allowed_host: Vec<String>,
    /// Seconds between full resyncs (re-read sozu's state, repair drift); 0 disables. At most a
    /// day.
    #[arg(long, env = "PRIVATE_INGRESS_RESYNC_INTERVAL", default_value_t = 60, value_parser = clap::value_parser!(u64).range(0..=DAY_SECONDS))]
    pub resync_interval: u64,
    /// The longest an upstream name goes without being resolved again, in seconds. An answer's
    /// TTL brings the next lookup sooner (never sooner than 5 s after it, or this interval if
    /// shorter). At most a day.
    #[arg(long, env = "PRIVATE_INGRESS_DNS_INTERVAL", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=DAY_SECONDS))]
    pub dns_interval: u64,
    /// Milliseconds an upstream name lookup may take before it counts as failed (the last good
    /// addresses stay in use). At most a minute.
    #[arg(long, env = "PRIVATE_INGRESS_DNS_TIMEOUT_MS", default_value_t = 5000, value_parser = clap::value_parser!(u64).range(1..=60_000))]
    pub dns_timeout_ms: u64,
    /// Days before expiry from which a served certificate is flagged (status, metric, a log line):
    /// by then its renewal is overdue. At most ten years.
    #[arg(
        long,
        env = "PRIVATE_INGRESS_EXPIRY_WARNING_DAYS",
        default_value_t = 14,
        value_parser = clap::value_parser!(u64).range(0..=3_650)
    )]
    pub expiry_warning_days: u64,
    /// Milliseconds sozu may take to answer one request. At most ten minutes.
    #[arg(long, env = "PRIVATE_INGRESS_SOZU_TIMEOUT_MS", default_value_t = 5000, value_parser = clap::value_parser!(u64).range(1..=600_000))]
    pub sozu_timeout_ms: u64,
    /// Connections to sozu over which independent requests are spread (a cold start or a mass
    /// renewal is bound by round trips).
    #[arg(long, env = "PRIVATE_INGRESS_SOZU_CONNECTIONS", default_value_t = 32, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub sozu_connections: u16,
    /// What `/readyz` waits for: `serving`, every route that can be served (a route whose pair
    /// is refused or missing, or whose upstream names do not resolve, is reported and not waited
    /// for); `strict`, every route.
    #[arg(long, env = "PRIVATE_INGRESS_READINESS", value_enum, default_value_t = Readiness::Serving)]
    pub readiness: Readiness,
    /// Log format.
    #[arg(long, env = "PRIVATE_INGRESS_LOG_FORMAT", value_enum, default_value_t = LogFormat::Human)]
    pub log_format: LogFormat,
    #[command(flatten)]
    pub eval: EvalArgs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Readiness {
    Serving,
    Strict,
}

impl From<Readiness> for crate::document::ReadinessMode {
    fn from(readiness: Readiness) -> Self {
        match readiness {
            Readiness::Serving => crate::document::ReadinessMode::Serving,
            Readiness::Strict => crate::document::ReadinessMode::Strict,
        }
    }
}

/// `check`'s arguments.
#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    /// The workspace file (.ncl, or plain .json/.yaml/.toml data); `-` reads standard input.
    pub workspace: PathBuf,
    /// The admin address the agent runs with (`run --admin-address`): no route may listen on
    /// its port.
    #[arg(long, env = "PRIVATE_INGRESS_ADMIN_ADDRESS", default_value = DEFAULT_ADMIN_ADDRESS)]
    pub admin_address: std::net::SocketAddr,
    #[command(flatten)]
    pub eval: EvalArgs,
}

/// `render`'s arguments.
#[derive(Debug, clap::Args)]
pub struct RenderArgs {
    /// The workspace file (.ncl, or plain .json/.yaml/.toml data); `-` reads standard input.
    pub workspace: PathBuf,
    /// What to produce.
    #[arg(long, value_enum)]
    pub format: Format,
    /// Write here (atomically: a failure leaves the previous file untouched) instead of stdout;
    /// `-` is stdout.
    #[arg(long, short)]
    pub output: Option<PathBuf>,
    /// sozu-toml: the control socket path written into the configuration.
    #[arg(
        long,
        env = "PRIVATE_INGRESS_SOZU_SOCKET",
        default_value = "/var/run/sozu/sozu.sock"
    )]
    pub sozu_socket: PathBuf,
    /// prometheus-rules, k8s: multiply every alert's `for:` by this factor (at least 1 s
    /// each). 1 in production; a small factor makes alerts fire in seconds, for a test or a
    /// staging Prometheus.
    #[arg(long, default_value_t = 1.0, value_parser = for_scale)]
    pub alert_for_scale: f64,
    /// The admin address the agent runs with (`run --admin-address`): no route may listen on
    /// its port. k8s: the rendered pod's admin port, 9180, is refused too.
    #[arg(long, env = "PRIVATE_INGRESS_ADMIN_ADDRESS", default_value = DEFAULT_ADMIN_ADDRESS)]
    pub admin_address: std::net::SocketAddr,
    #[command(flatten)]
    pub eval: EvalArgs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Human,
    Json,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// The normalised workspace model.
    Json,
    /// A complete sozu 2.3.3 configuration file.
    SozuToml,
    /// Kubernetes manifests: sozu with the agent as a native sidecar, a LoadBalancer Service and
    /// one certificate volume per route host (multi-document YAML).
    K8s,
    /// The split-horizon DNS records: one A/AAAA record per route host → `lb_ip`.
    Dns,
    /// Prometheus alert rules on the agent's `/metrics` (a rules file; runbook in
    /// docs/operations.md).
    PrometheusRules,
}

#[derive(Debug, Clone, clap::Args)]
pub struct EvalArgs {
    /// Seconds a workspace evaluation may take before it is stopped.
    #[arg(long, env = "PRIVATE_INGRESS_EVAL_TIMEOUT", default_value_t = 30.0, value_parser = positive_seconds)]
    pub eval_timeout: f64,
    /// Memory (MiB of address space) a workspace evaluation may use at most; in a container
    /// with a memory limit, no more than the container has left beside the agent.
    #[arg(long, env = "PRIVATE_INGRESS_EVAL_MEMORY_MIB", default_value_t = 4096,
          value_parser = clap::value_parser!(u64).range(256..))]
    pub eval_memory_mib: u64,
    /// The directory tree the workspace may import from and read error pages from (after
    /// symlinks); by default the workspace file's own directory. An import or a page outside it
    /// is refused.
    #[arg(long, env = "PRIVATE_INGRESS_WORKSPACE_ROOT")]
    pub workspace_root: Option<PathBuf>,
}

impl EvalArgs {
    /// The evaluation's limits, beside an agent whose admin server is at `admin_address`.
    pub fn limits(&self, admin_address: std::net::SocketAddr) -> crate::evaluate::sandbox::Limits {
        crate::evaluate::sandbox::Limits {
            timeout: Duration::from_secs_f64(self.eval_timeout),
            memory_bytes: self.eval_memory_mib.saturating_mul(1 << 20),
            root: self.workspace_root.clone(),
            target: crate::evaluate::contract::Target::Agent,
            admin_port: admin_address.port(),
        }
    }
}

/// `run` reads its workspace again at every change: standard input cannot be.
fn watched_file(s: &str) -> Result<PathBuf, String> {
    if s == "-" {
        return Err("run reads its workspace again at every change: give a file, not `-`".into());
    }
    Ok(PathBuf::from(s))
}

fn for_scale(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v <= 100.0 => Ok(v),
        _ => Err(format!("`{s}` is not a factor above 0 and at most 100")),
    }
}

/// `top --refresh`: from a tenth of a second (more often reads faster than the agent's
/// figures move) to an hour.
fn refresh_seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && (0.1..=3_600.0).contains(&v) => Ok(v),
        _ => Err(format!("`{s}` is not a number of seconds from 0.1 to 3600")),
    }
}

/// `COLUMNSxROWS`, each from 20 to 1000.
fn frame_size(s: &str) -> Result<(u16, u16), String> {
    let parsed = s
        .split_once(['x', 'X'])
        .and_then(|(w, h)| Some((w.trim().parse::<u16>().ok()?, h.trim().parse::<u16>().ok()?)));
    match parsed {
        Some((w, h)) if (20..=1000).contains(&w) && (10..=1000).contains(&h) => Ok((w, h)),
        _ => Err(format!(
            "`{s}` is not a size COLUMNSxROWS (from 20x10 to 1000x1000)"
        )),
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
            Command::Render(RenderArgs { format, output, .. }) => {
                assert_eq!(format, Format::SozuToml);
                assert_eq!(output, Some(PathBuf::from("out.toml")));
            }
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn durations_are_bounded() {
        let run = |flag: &str, value: &str| {
            Cli::try_parse_from([
                "private-ingress",
                "run",
                "--workspace",
                "ws.ncl",
                "--sozu-socket",
                "s.sock",
                flag,
                value,
            ])
        };
        for flag in [
            "--resync-interval",
            "--dns-interval",
            "--dns-timeout-ms",
            "--sozu-timeout-ms",
            "--expiry-warning-days",
        ] {
            let error = run(flag, "9223372036854775808").unwrap_err().to_string();
            assert!(
                error.contains(flag) && error.contains("is not in"),
                "{error}"
            );
        }
        assert!(run("--resync-interval", "86400").is_ok());
        assert!(run("--resync-interval", "0").is_ok());
    }

    #[test]
    fn the_default_admin_address_has_the_default_admin_port() {
        let address: std::net::SocketAddr = DEFAULT_ADMIN_ADDRESS.parse().unwrap();
        assert_eq!(
            address.port(),
            crate::evaluate::contract::DEFAULT_ADMIN_PORT
        );
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
