//! Rotations while the agent is busy with its own work: at `n` routes (each with its own
//! certificate), single rotations of hosts drawn from a seed, one every [`PACE`], timed from the
//! AtomicWriter swap to the first handshake presenting the new certificate, as the rotation
//! benchmark times them:
//!
//! - *quiet*: the agent started with `--resync-interval 0`, nothing else going on;
//! - *edits alone*: the same agent, resyncs still off, and the workspace edited every
//!   [`EDIT_EVERY`] meanwhile (one route added, then taken away again, in turn);
//! - *busy*: the same agent restarted with `--resync-interval 5`, and the same edits, each
//!   addition timed from the rename of the workspace to its first handshake.
//!
//! The last two differ by the resyncs alone: what a resync every 5 s costs a rotation beside the
//! edits.
//!
//! Between the last two, the agent left alone for [`UNCHANGED`]: the resyncs of a sozu that
//! holds what the agent expects, counted from `/metrics` with the requests the agent sent
//! meanwhile, and the loop's share of each from the agent's debug log.
//!
//! All phases in one run, on one sozu, so that their ratios say what the agent's own work costs
//! a rotation; with a baseline build, that build runs the same before this one.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::floor::{self, FloorOutcome};
use super::ours::{self, Ours};
use super::scale::{host, rotate, workspace_text, Pace, Rng};
use super::workload::{handshake, Pair};
use crate::live::{atomic_write, sample, Backend};

/// A rotation every this long, as the black-box measurement had it (about 0.3 s).
pub const PACE: Duration = Duration::from_millis(300);
/// A workspace edit every this long during the busy phase.
pub const EDIT_EVERY: Duration = Duration::from_secs(2);
/// The resync interval of the busy phase, in seconds.
pub const RESYNC_EVERY: &str = "5";
/// How long the agent is left alone between the phases: two resyncs and some.
pub const UNCHANGED: Duration = Duration::from_secs(12);

pub struct BusyOutcome {
    pub routes: usize,
    /// Rotations with nothing else going on.
    pub quiet: Vec<Duration>,
    /// Rotations with an edit every 2 s going on, and no resync: what the edits alone cost.
    pub edits_alone: Vec<Duration>,
    /// Rotations with an edit every 2 s and a resync every 5 s going on.
    pub busy: Vec<Duration>,
    /// Each edit that added a route: from the rename to the route's first handshake.
    pub edits: Vec<Duration>,
    /// Resyncs that completed while the agent was left alone, and the requests it sent to sozu
    /// meanwhile (none, when sozu holds what the agent expects).
    pub unchanged_resyncs: u64,
    pub unchanged_requests: u64,
    /// Resyncs that completed during the busy phase, and reads of sozu that failed.
    pub busy_resyncs: u64,
    pub read_failures: u64,
    /// From this build's debug log, for the resyncs of an unchanged sozu: each one's read (beside
    /// the loop), its comparison with the shadow (in the loop), and the loop's taking up of the
    /// pairs read again (in the loop), each batch of them: the tls dir source hands them over a
    /// slice at a time (one batch of every pair in a build before). Empty for a baseline that
    /// logs none of them.
    pub read_ms: Vec<f64>,
    pub compared_ms: Vec<f64>,
    pub pairs_taken_ms: Vec<f64>,
    /// The same rotations, probes and evaluations with the agent stopped (see [`floor`]); for
    /// the build under test only.
    pub floor: Option<FloorOutcome>,
}

/// The agent's log filter: the loop's resync and pair lines at debug level; `BUSY_AGENT_LOG`
/// adds to it (`private_ingress=debug`, to place a slow rotation).
fn log_filter() -> String {
    let base = "warn,private_ingress::reconcile::state::intake=debug";
    match std::env::var("BUSY_AGENT_LOG") {
        Ok(more) if !more.is_empty() => format!("{base},{more}"),
        _ => base.to_owned(),
    }
}

pub fn run(
    bin: Option<&Path>,
    n: usize,
    rotations: usize,
    seed: u64,
) -> Result<BusyOutcome, String> {
    let backend = Backend::start("app");
    let firsts: Vec<Pair> = (0..n).map(|i| Pair::new(&host(i))).collect();
    let mut rng = Rng(seed.max(1));
    let renewals: Vec<(usize, Pair)> = (0..4 * rotations)
        .map(|_| {
            let i = rng.below(n);
            (i, Pair::new(&host(i)))
        })
        .collect();
    // The route the edits add and take away: host(n), its pair written before any edit.
    let edited = Pair::new(&host(n));
    let hosts: Vec<(String, &Pair)> = firsts
        .iter()
        .enumerate()
        .map(|(i, p)| (host(i), p))
        .collect();

    let mut ours = ours::serve_as(
        &hosts,
        backend.address,
        &ours::Options {
            bin,
            log: &log_filter(),
            args: &["--resync-interval", "0"],
            ..ours::Options::default()
        },
    )?;
    let https = ours.stack.https;
    let (quiet_renewals, rest) = renewals.split_at(rotations);
    let (unsynced_renewals, rest) = rest.split_at(rotations);
    let (busy_renewals, floor_renewals) = rest.split_at(rotations);
    let quiet = rotate(&ours, https, quiet_renewals, 0, Pace::Every(PACE))?;

    // The workspace texts of both edits, and the edited route's pair, prepared beforehand.
    atomic_write(
        &ours.certs.path().join(host(n)),
        &edited.crt,
        &edited.key,
        0,
    );
    let texts = [
        workspace_text(&ours, backend.address, n + 1)?,
        workspace_text(&ours, backend.address, n)?,
    ];
    let editing = Editing {
        texts: &texts,
        host: host(n),
        fingerprint: &edited.fingerprint,
    };
    // The same agent, resyncs still off, with the edits going on: what the edits alone cost.
    let (edits_alone, _) = beside_edits(
        &ours,
        &editing,
        unsynced_renewals,
        quiet_renewals.len() as u32,
    )?;

    // The same agent with resyncs on.
    restart(&mut ours, bin, &["--resync-interval", RESYNC_EVERY], n)?;

    // Only what the agent logs from here: its start read every pair too.
    let logged_before = ours.stack.agent_logs().len();
    let before = counters(&ours);
    std::thread::sleep(UNCHANGED);
    let after = counters(&ours);
    let unchanged_resyncs = after.resyncs.saturating_sub(before.resyncs);
    let unchanged_requests = after.requests.saturating_sub(before.requests);
    let whole = ours.stack.agent_logs();
    let log = whole.get(logged_before..).unwrap_or_default();
    let read_ms = values(log, "resync: sozu holds what the agent expects", "read_ms");
    let compared_ms = values(
        log,
        "resync: sozu holds what the agent expects",
        "compared_ms",
    );
    // Nothing rotates meanwhile: every batch is pairs read again.
    let pairs_taken_ms: Vec<f64> = pair_lines(log).into_iter().map(|(_, ms)| ms).collect();

    let (busy, edits) = beside_edits(
        &ours,
        &editing,
        busy_renewals,
        (quiet_renewals.len() + unsynced_renewals.len()) as u32,
    )?;
    let end = counters(&ours);
    // `BUSY_KEEP_LOG=FILE`: the agent's log of every phase, kept for a figure to explain.
    if let Some(path) = std::env::var_os("BUSY_KEEP_LOG").filter(|p| !p.is_empty()) {
        std::fs::write(&path, ours.stack.agent_logs())
            .map_err(|e| format!("keep the agent's log: {e}"))?;
    }
    let floor = match bin {
        Some(_) => None,
        None => {
            if !ours.stack.stop_agent() {
                return Err("the agent did not stop on SIGTERM before the floor".into());
            }
            let mut current: Vec<String> = firsts.iter().map(|p| p.fingerprint.clone()).collect();
            for (i, pair) in quiet_renewals
                .iter()
                .chain(unsynced_renewals)
                .chain(busy_renewals)
            {
                current[*i] = pair.fingerprint.clone();
            }
            let setting = floor::Setting {
                socket: &ours.stack.socket(),
                https,
                backend: backend.address,
                certs: ours.certs.path(),
                generation: (quiet_renewals.len() + unsynced_renewals.len() + busy_renewals.len())
                    as u32,
                workspace: &ours.stack.workspace_path(),
                check: crate::agent_bin(),
                texts,
                edited_host: host(n + 1),
                edited: Pair::new(&host(n + 1)),
            };
            Some(floor::run(setting, floor_renewals, &mut current)?)
        }
    };
    Ok(BusyOutcome {
        routes: n,
        quiet,
        edits_alone,
        busy,
        edits,
        unchanged_resyncs,
        unchanged_requests,
        busy_resyncs: end.resyncs.saturating_sub(after.resyncs),
        read_failures: end.read_failures,
        read_ms,
        compared_ms,
        pairs_taken_ms,
        floor,
    })
}

/// The edits of a busy phase: the workspace's two texts (with the edited route, without it),
/// the edited route's host and the fingerprint of its pair.
struct Editing<'a> {
    texts: &'a [String; 2],
    host: String,
    fingerprint: &'a str,
}

/// `renewals` rotated (from `generation` on) while the workspace is edited every
/// [`EDIT_EVERY`]; the rotations' times and the edits'.
fn beside_edits(
    ours: &Ours,
    editing: &Editing<'_>,
    renewals: &[(usize, Pair)],
    generation: u32,
) -> Result<(Vec<Duration>, Vec<Duration>), String> {
    let https = ours.stack.https;
    let stop = AtomicBool::new(false);
    let path = ours.stack.workspace_path();
    std::thread::scope(|scope| {
        let editor = scope.spawn(|| {
            edit(
                &stop,
                &path,
                editing.texts,
                https,
                &editing.host,
                editing.fingerprint,
                |_| Ok(()),
            )
        });
        let rotations = rotate(ours, https, renewals, generation, Pace::Every(PACE));
        stop.store(true, Ordering::Relaxed);
        let edits = editor.join().map_err(|_| "the editor panicked")??;
        Ok((rotations?, edits))
    })
}

/// The agent stopped and started again with `args`, on the same sozu; returns once ready.
fn restart(ours: &mut Ours, bin: Option<&Path>, args: &[&str], n: usize) -> Result<(), String> {
    if !ours.stack.stop_agent() {
        return Err("the agent did not stop on SIGTERM".into());
    }
    let filter = log_filter();
    let env = [("RUST_LOG", filter.as_str())];
    match bin {
        Some(bin) => ours.stack.start_agent_from(bin, args, &env),
        None => ours.stack.start_agent_with(args, &env),
    }
    ours::wait_ready(&ours.stack, n)
}

/// Every [`EDIT_EVERY`] until `stop`: the workspace renamed into place, adding `host` and taking
/// it away in turn (and taking it away once more at the stop, if the last edit added it); each
/// addition timed to the first handshake presenting `fingerprint`, each removal waited for (the
/// handshake no longer presents it) so that edits do not overlap.
/// `apply(adding)` runs right after each rename, on a thread of its own while the route is
/// probed, as an agent's evaluation runs while the busy phase probes: nothing when an agent
/// watches the workspace, what the floor does in its place otherwise.
pub fn edit(
    stop: &AtomicBool,
    path: &Path,
    texts: &[String; 2],
    https: SocketAddr,
    host: &str,
    fingerprint: &str,
    mut apply: impl FnMut(bool) -> Result<(), String> + Send,
) -> Result<Vec<Duration>, String> {
    let staged: PathBuf = path.with_extension("next");
    let mut added = Vec::new();
    let mut next = Instant::now() + EDIT_EVERY;
    for k in 0.. {
        let adding = k % 2 == 0;
        let mut stopped = stop.load(Ordering::Relaxed);
        while !stopped && Instant::now() < next {
            std::thread::sleep(Duration::from_millis(20));
            stopped = stop.load(Ordering::Relaxed);
        }
        // Once stopped, the route the last edit added is taken away at once: the next phase
        // starts from the workspace this one found.
        if stopped && adding {
            return Ok(added);
        }
        next += EDIT_EVERY;
        std::fs::write(&staged, &texts[k % 2]).map_err(|e| format!("write the workspace: {e}"))?;
        let renamed = Instant::now();
        std::fs::rename(&staged, path).map_err(|e| format!("rename the workspace: {e}"))?;
        let apply = &mut apply;
        std::thread::scope(|scope| {
            let applied = scope.spawn(move || apply(adding));
            let probed = probe(https, host, fingerprint, adding, renamed);
            let applied = applied
                .join()
                .map_err(|_| "the edit's step panicked".to_string())?;
            applied.and(probed)
        })
        .map(|took| added.extend(took))?;
        if stopped {
            return Ok(added);
        }
    }
    Ok(added)
}

/// Probes `host` every 2 ms until it presents `fingerprint` (`adding`) or no longer does; the
/// time from the rename when adding.
fn probe(
    https: SocketAddr,
    host: &str,
    fingerprint: &str,
    adding: bool,
    renamed: Instant,
) -> Result<Option<Duration>, String> {
    let deadline = renamed + Duration::from_secs(60);
    loop {
        let presented = handshake(https, host).is_ok_and(|(fp, _)| fp == fingerprint);
        if presented == adding {
            return Ok(adding.then(|| renamed.elapsed()));
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{host} was not {} 60 s after the edit",
                if adding { "served" } else { "taken away" }
            ));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

struct Counters {
    resyncs: u64,
    requests: u64,
    read_failures: u64,
}

fn counters(ours: &Ours) -> Counters {
    let text = ours.stack.metrics();
    let value = |name: &str| sample(&text, name).map_or(0, |v| v as u64);
    Counters {
        resyncs: value("private_ingress_resyncs_total"),
        requests: value("private_ingress_sozu_requests_total"),
        // A baseline without the family reads 0.
        read_failures: value("private_ingress_sozu_read_failures_total"),
    }
}

/// The value of `key=` on each line of the log that holds `message`, in order.
fn values(log: &str, message: &str, key: &str) -> Vec<f64> {
    log.lines()
        .map(ours::strip_ansi)
        .filter(|l| l.contains(message))
        .filter_map(|l| field(&l, key))
        .collect()
}

fn field(line: &str, key: &str) -> Option<f64> {
    let pattern = format!("{key}=");
    let at = line.find(&pattern)? + pattern.len();
    line[at..].split(char::is_whitespace).next()?.parse().ok()
}

/// Each "certificate pairs taken up" line: how many pairs, and the loop's time for them.
fn pair_lines(log: &str) -> Vec<(usize, f64)> {
    log.lines()
        .map(ours::strip_ansi)
        .filter(|l| l.contains("certificate pairs taken up"))
        .filter_map(|l| Some((field(&l, "pairs")? as usize, field(&l, "elapsed_ms")?)))
        .collect()
}
