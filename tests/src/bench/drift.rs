//! Drift repair: at `n` routes (each with its own certificate), something sozu holds for a
//! route is taken away with sozu's own command line, as someone else with access to its socket
//! would, and the time until the route answers again through sozu is measured (from the command
//! line's return to the first `200` from the route's backend):
//!
//! - *a frontend removed*: sozu's event stream says so (`FRONTEND_REMOVED`), and the agent reads
//!   that cluster again;
//! - *a backend removed*: no event says so in sozu 2.3.3; the next resync finds it (with a
//!   resync every [`RESYNC_EVERY`] seconds, so up to that long, plus the read).
//!
//! The agent's count of the queries its resyncs sent to sozu's workers is read at the end (a
//! baseline without the metric reads nothing).

use std::path::Path;
use std::time::{Duration, Instant};

use super::ours::{self, Ours};
use super::scale::{host, Rng};
use super::workload::Pair;
use crate::live::{https_get, sample, Backend};

/// The resync interval, in seconds.
pub const RESYNC_EVERY: &str = "5";
/// How long a route may stay broken before the run gives up.
const GIVE_UP: Duration = Duration::from_secs(60);

pub struct DriftOutcome {
    pub routes: usize,
    /// Each frontend removed: until the route answers again.
    pub frontend: Vec<Duration>,
    /// Each backend removed: until the route answers again.
    pub backend: Vec<Duration>,
    /// `private_ingress_resync_worker_queries_total` at the end, when the build has it.
    pub worker_queries: Option<f64>,
    /// `private_ingress_resyncs_total` at the end.
    pub resyncs: Option<f64>,
}

pub fn run(
    bin: Option<&Path>,
    n: usize,
    repeats: usize,
    seed: u64,
) -> Result<DriftOutcome, String> {
    let backend = Backend::start("app");
    let pairs: Vec<Pair> = (0..n).map(|i| Pair::new(&host(i))).collect();
    let hosts: Vec<(String, &Pair)> = pairs
        .iter()
        .enumerate()
        .map(|(i, p)| (host(i), p))
        .collect();
    let ours = ours::serve_as(
        &hosts,
        backend.address,
        &ours::Options {
            bin,
            log: "warn",
            args: &["--resync-interval", RESYNC_EVERY],
            ..ours::Options::default()
        },
    )?;
    let mut rng = Rng(seed.max(1));
    let mut outcome = DriftOutcome {
        routes: n,
        frontend: Vec::new(),
        backend: Vec::new(),
        worker_queries: None,
        resyncs: None,
    };
    let address = backend.address.to_string();
    for _ in 0..repeats {
        let h = host(rng.below(n));
        let id = format!("pi-{h}");
        let https = ours.stack.https.to_string();
        sozu_cli(
            &ours,
            &[
                "frontend",
                "https",
                "remove",
                "--address",
                &https,
                "--hostname",
                &h,
                "--path-prefix",
                "/",
                "id",
                &id,
            ],
        )?;
        outcome.frontend.push(until_served(&ours, &h)?);
    }
    for _ in 0..repeats {
        let h = host(rng.below(n));
        let id = format!("pi-{h}");
        let backend_id = format!("{id}-{address}");
        sozu_cli(
            &ours,
            &[
                "backend",
                "remove",
                "--id",
                &id,
                "--address",
                &address,
                "--backend-id",
                &backend_id,
            ],
        )?;
        outcome.backend.push(until_served(&ours, &h)?);
    }
    let metrics = ours.stack.metrics();
    outcome.worker_queries = sample(&metrics, "private_ingress_resync_worker_queries_total");
    outcome.resyncs = sample(&metrics, "private_ingress_resyncs_total");
    Ok(outcome)
}

/// Runs sozu's command line against the stack's sozu.
fn sozu_cli(ours: &Ours, args: &[&str]) -> Result<(), String> {
    let out = std::process::Command::new(crate::sozu_bin())
        .arg("-c")
        .arg(ours.stack.dir.path().join("sozu.toml"))
        .args(args)
        .output()
        .map_err(|e| format!("run sozu's command line: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "sozu {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(())
}

/// From now until `host` answers through sozu from its backend again.
fn until_served(ours: &Ours, host: &str) -> Result<Duration, String> {
    let started = Instant::now();
    loop {
        if https_get(ours.stack.https, host, "/").is_ok_and(|s| s.status == 200 && s.body == "app")
        {
            return Ok(started.elapsed());
        }
        if started.elapsed() > GIVE_UP {
            return Err(format!(
                "{host} not served again {GIVE_UP:?} after the change"
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}
