//! Mass renewal (ours only): a workspace of `n` routes, each with its own certificate directory;
//! all `n` renewed the AtomicWriter way as fast as one thread can write them, while a probe
//! thread sweeps the hosts already renewed (in renewal order) until each one's handshake presents
//! its new certificate.
//!
//! A sweep costs one handshake per pending host, so the "all served" time is an upper bound,
//! late by at most one sweep over the hosts still pending; [`MassOutcome::sweep`] (one sweep over
//! all `n` hosts once everything is served) is the floor of what this method can show.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use super::workload::{handshake, percentile, Pair};
use crate::live::{atomic_write, Backend};

pub struct MassOutcome {
    pub hosts: usize,
    /// Writing all `n` swaps, first to last.
    pub renew_span: Duration,
    /// From the first swap until every host presented its new certificate.
    pub from_first: Duration,
    /// From the last swap until then.
    pub from_last: Duration,
    /// Per host, from its own swap to its first handshake with the new certificate.
    pub per_host_p50: Duration,
    pub per_host_p99: Duration,
    /// One handshake with every host, once all are served: the method's floor.
    pub sweep: Duration,
    pub not_switched: usize,
    /// From the first swap to the agent logging the last certificate replaced (sozu's answer to
    /// it), by the wall clock.
    pub agent_last: Option<Duration>,
    /// The agent's timed steps during the renewal (see [`super::ours::split`]).
    pub passes: Vec<(String, f64, usize)>,
    /// The agent's overflow, resync and reconnect counters afterwards (from `/metrics`).
    pub counters: String,
    /// inotify watches the agent holds, and the limits they count against.
    pub inotify: String,
    /// The agent's resident memory at rest (after [`REST`] idle), in MiB: after its start, and
    /// after the renewal.
    pub rss_started: f64,
    pub rss_renewed: f64,
}

/// How long the agent is left alone before its memory at rest is read.
pub const REST: Duration = Duration::from_secs(10);

/// The resident memory of `pid` now (`VmRSS:`), in MiB.
pub fn rss_mib(pid: Option<u32>) -> f64 {
    pid.and_then(|pid| std::fs::read_to_string(format!("/proc/{pid}/status")).ok())
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

/// A process's CPU time so far (user + system, all its threads), from /proc: 10 ms ticks.
pub fn cpu(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("");
    let fields: Vec<u64> = after
        .split_whitespace()
        .filter_map(|f| f.parse().ok())
        .collect();
    // After the command: state is field 3 (not a number), utime 14, stime 15 → indexes 10, 11
    // among the numeric fields that follow it.
    let ticks = fields.get(10).copied().unwrap_or(0) + fields.get(11).copied().unwrap_or(0);
    Duration::from_millis(ticks * 10)
}

pub fn host(i: usize) -> String {
    format!("svc{i}.in.example.org")
}

/// Renews `firsts.len()` hosts from `firsts[i]` to `renewed[i]`.
pub fn run(firsts: &[Pair], renewed: &[Pair], timeout: Duration) -> Result<MassOutcome, String> {
    let n = firsts.len();
    let backend = Backend::start("app");
    let hosts: Vec<(String, &Pair)> = firsts
        .iter()
        .enumerate()
        .map(|(i, p)| (host(i), p))
        .collect();
    let ours = super::ours::serve(&hosts, backend.address, "warn,private_ingress=debug")?;
    let https = ours.stack.https;
    // Every host serves its first certificate before the clock starts.
    for (host, pair) in &hosts {
        match handshake(https, host) {
            Ok((fp, _)) if fp == pair.fingerprint => {}
            other => {
                return Err(format!(
                    "{host} does not serve its first certificate: {other:?}"
                ))
            }
        }
    }
    let inotify = inotify_report(ours.stack.agent_pid());
    std::thread::sleep(REST);
    let rss_started = rss_mib(ours.stack.agent_pid());
    eprintln!(
        "  at rest after the start: {}",
        memory_split(ours.stack.agent_pid(), &ours.stack.agent_logs())
    );

    let renamed: Arc<Vec<OnceLock<Instant>>> = Arc::new((0..n).map(|_| OnceLock::new()).collect());
    let written = Arc::new(AtomicUsize::new(0));
    let wanted: Vec<String> = renewed.iter().map(|p| p.fingerprint.clone()).collect();
    let prober = {
        let (renamed, written) = (renamed.clone(), written.clone());
        std::thread::spawn(move || probe_until_all(https, &wanted, &renamed, &written, timeout))
    };
    let tls_dir = ours.certs.path().to_owned();
    let first_wall = std::time::SystemTime::now();
    for (i, pair) in renewed.iter().enumerate() {
        let _ = renamed[i].set(Instant::now());
        atomic_write(&tls_dir.join(host(i)), &pair.crt, &pair.key, 1);
        written.store(i + 1, Ordering::Release);
    }
    let seen = prober.join().map_err(|_| "the probe thread panicked")?;
    let first = *renamed[0].get().expect("set");
    let last = *renamed[n - 1].get().expect("set");
    let not_switched = seen.iter().filter(|s| s.is_none()).count();
    let latest = seen.iter().flatten().max().copied().unwrap_or(first);
    let per_host: Vec<Duration> = seen
        .iter()
        .zip(renamed.iter())
        .filter_map(|(s, r)| Some(s.as_ref()?.duration_since(*r.get()?)))
        .collect();
    // The agent's view: its last "certificate replaced" (logged once sozu acknowledged it, which
    // sozu does once its worker applied it), timed from the first swap by the wall clock.
    let agent_last = super::ours::last_logged(&ours.stack.agent_logs(), "certificate replaced")
        .map(|at| {
            let since = (at - super::ours::seconds_of_day(first_wall)).rem_euclid(86_400.0);
            Duration::from_secs_f64(since)
        });
    // Why a pass re-read sozu's whole state, if one did: the agent's counters of watcher
    // overflows, resyncs and reconnects.
    let counters = ours
        .stack
        .metrics()
        .lines()
        .filter(|l| {
            !l.starts_with('#')
                && ["overflow", "resync", "reconnect"]
                    .iter()
                    .any(|w| l.contains(w))
        })
        .collect::<Vec<_>>()
        .join(", ");
    let sweep_start = Instant::now();
    for i in 0..n {
        let _ = handshake(https, &host(i));
    }
    let sweep = sweep_start.elapsed();
    let passes = super::ours::split(&ours.stack.agent_logs());
    std::thread::sleep(REST);
    let rss_renewed = rss_mib(ours.stack.agent_pid());
    eprintln!(
        "  at rest after the renewal: {}",
        memory_split(ours.stack.agent_pid(), &ours.stack.agent_logs())
    );
    drop(ours);
    Ok(MassOutcome {
        hosts: n,
        renew_span: last - first,
        from_first: latest - first,
        from_last: latest.saturating_duration_since(last),
        per_host_p50: percentile(&per_host, 50.0).unwrap_or_default(),
        per_host_p99: percentile(&per_host, 99.0).unwrap_or_default(),
        sweep,
        not_switched,
        agent_last,
        passes,
        counters,
        inotify,
        rss_started,
        rss_renewed,
    })
}

/// Sweeps the hosts already renewed, in renewal order, until each has presented its new
/// certificate once (or `timeout`); the completion time of that handshake, per host.
fn probe_until_all(
    https: SocketAddr,
    wanted: &[String],
    renamed: &[OnceLock<Instant>],
    written: &AtomicUsize,
    timeout: Duration,
) -> Vec<Option<Instant>> {
    let n = wanted.len();
    let mut seen: Vec<Option<Instant>> = vec![None; n];
    let mut pending = n;
    let deadline = Instant::now() + timeout;
    while pending > 0 && Instant::now() < deadline {
        let upto = written.load(Ordering::Acquire);
        if upto == 0 || seen[..upto].iter().all(Option::is_some) {
            std::thread::yield_now();
            continue;
        }
        for i in 0..upto {
            if seen[i].is_some() || renamed[i].get().is_none() {
                continue;
            }
            if let Ok((fp, done)) = handshake(https, &host(i)) {
                if fp == wanted[i] {
                    seen[i] = Some(done);
                    pending -= 1;
                }
            }
        }
    }
    seen
}

/// The agent's inotify watches (from /proc/<pid>/fdinfo) beside the kernel's per-user limits.
fn inotify_report(pid: Option<u32>) -> String {
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .unwrap_or_default()
            .trim()
            .to_owned()
    };
    let watches = pid.map_or(0, |pid| {
        std::fs::read_dir(format!("/proc/{pid}/fdinfo"))
            .map(|d| {
                d.filter_map(Result::ok)
                    .map(|e| {
                        std::fs::read_to_string(e.path())
                            .unwrap_or_default()
                            .lines()
                            .filter(|l| l.starts_with("inotify wd:"))
                            .count()
                    })
                    .sum()
            })
            .unwrap_or(0)
    });
    format!(
        "the agent holds {watches} inotify watches; limits: max_user_watches {}, max_user_instances {}, max_queued_events {}",
        read("/proc/sys/fs/inotify/max_user_watches"),
        read("/proc/sys/fs/inotify/max_user_instances"),
        read("/proc/sys/fs/inotify/max_queued_events"),
    )
}

/// Where a process's resident memory is, for a reader splitting it: the anonymous and file-backed
/// parts of its resident set (`/proc/<pid>/smaps_rollup`), its thread count, and the agent's last
/// account of glibc's heap (logged at debug level after each trim: bytes in use, bytes freed but
/// kept).
pub fn memory_split(pid: Option<u32>, agent_logs: &str) -> String {
    let Some(pid) = pid else {
        return "no agent".to_owned();
    };
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    let field = |name: &str| {
        rollup
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<f64>().ok())
            .map_or(f64::NAN, |kb| kb / 1024.0)
    };
    let threads = std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, Iterator::count);
    let heap = agent_logs
        .lines()
        .rev()
        .find(|l| l.contains("freed memory returned"))
        .map(|l| {
            let value = |key: &str| {
                l.split_whitespace()
                    .find_map(|w| w.strip_prefix(key))
                    .and_then(|v| v.parse::<f64>().ok())
                    .map_or(f64::NAN, |kib| kib / 1024.0)
            };
            format!(
                "heap in use {:.1} MiB, freed but kept {:.1} MiB (last trim)",
                value("heap_in_use_kib="),
                value("heap_free_kept_kib=")
            )
        })
        .unwrap_or_else(|| "no trim logged".to_owned());
    let mut text = format!(
        "RSS {:.1} MiB (anonymous {:.1}, file {:.1}), {threads} threads; {heap}",
        field("Rss:"),
        field("Anonymous:"),
        field("Rss:") - field("Anonymous:"),
    );
    // `BENCH_GDB_TRIM=1` (a diagnosis, needs gdb): glibc's `malloc_trim(0)` called in the agent
    // from outside, and its resident set read again: what a trim now would hand back, against
    // what stays (live data, and free space in pages that also hold live data).
    if std::env::var_os("BENCH_GDB_TRIM").is_some_and(|v| !v.is_empty()) {
        let trimmed = std::process::Command::new("gdb")
            .args([
                "-p",
                &pid.to_string(),
                "-batch",
                "-ex",
                "call (int) malloc_trim(0)",
            ])
            .stdin(std::process::Stdio::null())
            .output()
            .is_ok_and(|o| o.status.success());
        text.push_str(&format!(
            "; after malloc_trim(0) from gdb ({}): RSS {:.1} MiB",
            if trimmed { "done" } else { "failed" },
            rss_mib(Some(pid))
        ));
    }
    text
}
