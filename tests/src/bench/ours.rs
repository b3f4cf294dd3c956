//! private-ingress + sozu 2.3.3: the pinned sozu (one worker) and the agent, as the integration
//! tests run them ([`Stack`]); the agent notices the `..data` rename itself.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use super::process::version_line;
use super::workload::Pair;
use super::{cert_root, Start, System, START_TIMEOUT};
use crate::live::{atomic_write, RouteSpec, Stack};
use crate::{agent_bin, sozu_bin};

/// The agent and sozu; the certificate directories sit on tmpfs ([`cert_root`]), outside the
/// stack's own directory.
pub struct Ours {
    pub stack: Stack,
    pub certs: tempfile::TempDir,
}

pub fn version() -> Result<String, String> {
    let agent = version_line(
        Command::new(agent_bin()).arg("--version"),
        "private-ingress",
    )?;
    // "sozu 2.3.3 ()"
    let sozu = version_line(Command::new(sozu_bin()).arg("--version"), "sozu")?;
    Ok(format!(
        "{agent}, {}",
        sozu.trim_end_matches("()").trim_end()
    ))
}

pub fn start(start: &Start) -> Result<Box<dyn System>, String> {
    let ours = serve(
        &[(super::HOST.to_owned(), start.first)],
        start.backend.address,
        "warn",
    )?;
    Ok(Box::new(ours))
}

/// Another build of the agent to compare with, in the same run: `PRIVATE_INGRESS_BASELINE_BIN`
/// (say, the previous release, built from an earlier commit).
pub fn baseline_bin() -> Option<PathBuf> {
    std::env::var_os("PRIVATE_INGRESS_BASELINE_BIN")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
}

/// The builds a bench measures in turn: the baseline (`PRIVATE_INGRESS_BASELINE_BIN`) when
/// set, then this build (`None`: the binary the bench runs by default).
pub fn builds(baseline: Option<&Path>) -> impl Iterator<Item = (&'static str, Option<&Path>)> {
    baseline
        .map(|b| ("baseline", Some(b)))
        .into_iter()
        .chain([("this build", None)])
}

pub fn baseline_version() -> Result<String, String> {
    let bin = baseline_bin().ok_or("PRIVATE_INGRESS_BASELINE_BIN is not set")?;
    version_line(Command::new(&bin).arg("--version"), "private-ingress")
        .map(|v| format!("{v} ({})", bin.display()))
}

pub fn baseline_start(start: &Start) -> Result<Box<dyn System>, String> {
    let bin = baseline_bin().ok_or("PRIVATE_INGRESS_BASELINE_BIN is not set")?;
    let ours = serve_with(
        Some(&bin),
        &[(super::HOST.to_owned(), start.first)],
        start.backend.address,
        "warn",
        None,
    )?;
    Ok(Box::new(ours))
}

/// sozu and the agent serving one route per host, each host's directory written the AtomicWriter
/// way with its pair (under [`cert_root`], the workspace's `tls_dir`); returns once `/readyz`
/// answers. `log` is the agent's `RUST_LOG`: warnings only when measuring (it logs every rotation
/// at info level), its debug timings for [`split`]. Also used by the mass renewal.
pub fn serve(hosts: &[(String, &Pair)], backend: SocketAddr, log: &str) -> Result<Ours, String> {
    serve_with(None, hosts, backend, log, None)
}

/// [`serve`], with sozu sending its access-log records to the agent, as a rendered
/// configuration has it: `/metrics` then carries the traffic families.
pub fn serve_sending_traffic(
    hosts: &[(String, &Pair)],
    backend: SocketAddr,
    log: &str,
) -> Result<Ours, String> {
    serve_as(
        hosts,
        backend,
        &Options {
            log,
            traffic: true,
            ..Options::default()
        },
    )
}

/// [`serve`] with the agent binary `bin` (this build's when `None`).
pub fn serve_with(
    bin: Option<&std::path::Path>,
    hosts: &[(String, &Pair)],
    backend: SocketAddr,
    log: &str,
    sozu_log: Option<&str>,
) -> Result<Ours, String> {
    serve_as(
        hosts,
        backend,
        &Options {
            bin,
            log,
            sozu_log,
            ..Options::default()
        },
    )
}

/// How [`serve_as`] starts sozu and the agent.
#[derive(Default)]
pub struct Options<'a> {
    /// The agent binary: this build's when `None`.
    pub bin: Option<&'a std::path::Path>,
    /// The agent's `RUST_LOG`.
    pub log: &'a str,
    /// sozu's log level, when not its default.
    pub sozu_log: Option<&'a str>,
    /// sozu sends its access-log records to the agent.
    pub traffic: bool,
    /// Added to the agent's command line (`--resync-interval 5`, say).
    pub args: &'a [&'a str],
    /// sozu with its own default command buffer (2,000,000 bytes), as a sozu configured without
    /// the rendered file has it; `BENCH_SOZU_DEFAULT_BUFFER=1` sets it for every bench.
    pub default_buffer: bool,
}

/// [`serve`], started as `options` say.
pub fn serve_as(
    hosts: &[(String, &Pair)],
    backend: SocketAddr,
    options: &Options,
) -> Result<Ours, String> {
    let Options {
        bin,
        log,
        sozu_log,
        traffic,
        args: more_args,
        default_buffer,
    } = *options;
    let mut stack = Stack::new();
    if traffic {
        stack.send_traffic();
    }
    if let Some(level) = sozu_log {
        stack.set_sozu_log_level(level);
    }
    if default_buffer
        || std::env::var_os("BENCH_SOZU_DEFAULT_BUFFER").is_some_and(|v| !v.is_empty())
    {
        stack.use_default_command_buffer();
    }
    let certs = cert_root();
    let routes: Vec<RouteSpec> = hosts
        .iter()
        .map(|(host, pair)| {
            atomic_write(&certs.path().join(host), &pair.crt, &pair.key, 0);
            RouteSpec {
                host: host.clone(),
                upstream: backend.ip().to_string(),
                port: Some(backend.port()),
            }
        })
        .collect();
    let tls_dir = |dir: &std::path::Path| format!("tls_dir = \"{}\"", dir.display());
    let text = stack.workspace_text(&routes);
    assert!(
        text.contains(&tls_dir(&stack.tls_dir())),
        "the workspace names its tls_dir"
    );
    stack.write_workspace(&text.replace(&tls_dir(&stack.tls_dir()), &tls_dir(certs.path())));
    stack.start_sozu();
    // `BENCH_AGENT_ARGS` adds flags to the agent's command line (`--resync-interval 5`, say).
    let extra = std::env::var("BENCH_AGENT_ARGS").unwrap_or_default();
    let args: Vec<&str> = extra
        .split_whitespace()
        .chain(more_args.iter().copied())
        .collect();
    match bin {
        Some(bin) => stack.start_agent_from(bin, &args, &[("RUST_LOG", log)]),
        None => stack.start_agent_with(&args, &[("RUST_LOG", log)]),
    }
    wait_ready(&stack, hosts.len())?;
    Ok(Ours { stack, certs })
}

/// Waits for the agent's `/readyz`, allowing for the start of `routes` routes.
pub fn wait_ready(stack: &Stack, routes: usize) -> Result<(), String> {
    let timeout = START_TIMEOUT + Duration::from_millis(20 * routes as u64);
    let deadline = Instant::now() + timeout;
    while !stack.ready() {
        if Instant::now() > deadline {
            return Err(format!(
                "the agent was not ready after {timeout:?}: {}",
                stack.logs()
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

impl System for Ours {
    fn https(&self) -> SocketAddr {
        self.stack.https
    }

    fn cert_dir(&self) -> PathBuf {
        self.certs.path().join(super::HOST)
    }

    fn logs(&self) -> String {
        self.stack.logs()
    }
}

/// Where the agent's time goes, from its debug log (`RUST_LOG=private_ingress=debug`): the p50
/// of each timed step it logs with `elapsed_ms`, by message, e.g. "certificate pairs read" and
/// "changes sent" (sozu's answers included). Empty if the agent logs no such lines.
pub fn split(agent_log: &str) -> Vec<(String, f64, usize)> {
    let mut steps: std::collections::BTreeMap<String, Vec<f64>> = Default::default();
    for line in agent_log.lines().map(strip_ansi) {
        let Some((before, after)) = line.split_once("elapsed_ms=") else {
            continue;
        };
        let Some(ms) = after.split_whitespace().next().and_then(|v| v.parse().ok()) else {
            continue;
        };
        // "<time> DEBUG <target>: <message> key=value ... elapsed_ms=<ms>"
        let text = before.rsplit_once(": ").map_or(before, |(_, m)| m);
        let name: Vec<&str> = text
            .split_whitespace()
            .take_while(|w| !w.contains('='))
            .collect();
        steps.entry(name.join(" ")).or_default().push(ms);
    }
    steps
        .into_iter()
        .map(|(name, mut v)| {
            v.sort_by(f64::total_cmp);
            (name, v[(v.len() - 1) / 2], v.len())
        })
        .collect()
}

/// Every `elapsed_ms` the agent logged with `message`, in order.
pub fn split_lines(agent_log: &str, message: &str) -> Vec<f64> {
    agent_log
        .lines()
        .map(strip_ansi)
        .filter(|l| l.contains(message))
        .filter_map(|l| {
            l.split_once("elapsed_ms=")?
                .1
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .collect()
}

/// `line` without its ANSI colour sequences (the agent colours its log when it can).
pub fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ ... final byte in @..~
            for c in chars.by_ref() {
                if ('@'..='~').contains(&c) && c != '[' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Seconds since midnight (UTC) of the last line of the agent's log that contains `message`:
/// tracing stamps lines `YYYY-MM-DDTHH:MM:SS.ffffffZ`. Compare with [`seconds_of_day`].
pub fn last_logged(agent_log: &str, message: &str) -> Option<f64> {
    let line = agent_log
        .lines()
        .rev()
        .map(strip_ansi)
        .find(|l| l.contains(message))?;
    let time = line.split_whitespace().next()?.split_once('T')?.1;
    let mut parts = time.trim_end_matches('Z').split(':');
    let (h, m, s): (f64, f64, f64) = (
        parts.next()?.parse().ok()?,
        parts.next()?.parse().ok()?,
        parts.next()?.parse().ok()?,
    );
    Some(h * 3600.0 + m * 60.0 + s)
}

/// Seconds since midnight (UTC) of `t`.
pub fn seconds_of_day(t: std::time::SystemTime) -> f64 {
    let since = t
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64();
    since % 86_400.0
}
