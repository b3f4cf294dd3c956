//! Rotation at scale (ours only): the agent serving `n` routes, each with its own certificate,
//! then single rotations of hosts drawn from a seed, each timed from the AtomicWriter swap to the
//! first handshake presenting the new certificate (idle, then with `/metrics` scraped back to back
//! beside them), and one route appended to the workspace, timed to its first handshake beside the
//! agent's own evaluation of that workspace.
//!
//! Run at 10, 1,000 and 10,000 routes in one process, the figures of each size are measured on
//! the machine in the same state: the ratios between sizes are what the bench is for.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use super::ours::{self, Ours};
use super::workload::{handshake, Pair};
use crate::live::{atomic_write, Backend, RouteSpec};

pub struct ScaleOutcome {
    pub routes: usize,
    /// From starting the agent to `/readyz`.
    pub cold_start: Duration,
    /// The agent's resident memory after the start and 10 s idle, in MiB.
    pub rss_rest: f64,
    /// At the same moment, sozu's main process and its workers (summed), in MiB.
    pub sozu_rss_rest: (f64, f64),
    /// Swaps started the moment `/readyz` answered 200, 50 ms apart: the first is the one a
    /// start-up still under way would hold.
    pub after_ready: Vec<Duration>,
    pub rotations: Vec<Duration>,
    /// Rotations while `/metrics` is scraped back to back.
    pub rotations_scraped: Vec<Duration>,
    /// Each scrape's duration, and the size of the last.
    pub scrapes: Vec<Duration>,
    pub scrape_bytes: usize,
    /// One scrape each way, every route having served a request (traffic families included):
    /// the agent's CPU per scrape (user + system) and the bytes, plain text then gzip.
    pub scrape_cpu: [(Duration, usize); 2],
    /// From the workspace with one more route renamed into place to its host's first handshake.
    pub append_served: Duration,
    /// The agent's own evaluation of that workspace (its debug log).
    pub append_evaluated: Option<Duration>,
}

pub fn host(i: usize) -> String {
    format!("s{i}.in.example.org")
}

/// xorshift64*, for the hosts to rotate.
pub struct Rng(pub u64);

impl Rng {
    pub fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n as u64) as usize
    }
}

pub fn run(n: usize, rotations: usize, seed: u64) -> Result<ScaleOutcome, String> {
    let backend = Backend::start("app");
    let firsts: Vec<Pair> = (0..n).map(|i| Pair::new(&host(i))).collect();
    let mut rng = Rng(seed.max(1));
    let renewals: Vec<(usize, Pair)> = (0..2 * rotations + AFTER_READY)
        .map(|_| {
            let i = rng.below(n);
            (i, Pair::new(&host(i)))
        })
        .collect();
    let appended = Pair::new(&host(n));
    let hosts: Vec<(String, &Pair)> = firsts
        .iter()
        .enumerate()
        .map(|(i, p)| (host(i), p))
        .collect();

    let started = Instant::now();
    // `SCALE_AGENT_LOG` adds to the agent's log filter (debug timings, for a figure to explain).
    let log = match std::env::var("SCALE_AGENT_LOG") {
        Ok(more) => format!("warn,private_ingress::sources::workspace=debug,{more}"),
        Err(_) => "warn,private_ingress::sources::workspace=debug".to_owned(),
    };
    let ours = ours::serve_sending_traffic(&hosts, backend.address, &log)?;
    let cold_start = started.elapsed();
    let (right_after, renewals) = renewals.split_at(AFTER_READY);
    let after_ready = rotate(&ours, ours.stack.https, right_after, 0, APART)?;
    std::thread::sleep(super::mass::REST);
    let rss_rest = super::mass::rss_mib(ours.stack.agent_pid());
    let sozu_rss_rest = (
        super::mass::rss_mib(ours.stack.sozu_pid()),
        ours.stack
            .sozu_worker_pids()
            .into_iter()
            .map(|w| super::mass::rss_mib(Some(w)))
            .sum(),
    );
    let https = ours.stack.https;

    let (idle, scraped) = renewals.split_at(rotations);
    let rotations = rotate(&ours, https, idle, AFTER_READY_SWAPS, APART)?;
    let scrape_cpu = scrape_cost(&ours, n)?;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let scraper = {
        let (stop, admin) = (stop.clone(), ours.stack.admin);
        std::thread::spawn(move || {
            let mut took = Vec::new();
            let mut bytes = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let t = Instant::now();
                // As Prometheus asks for it.
                let body = scrape(admin, true);
                took.push(t.elapsed());
                bytes = body.map_or(0, |b| b.len());
            }
            (took, bytes)
        })
    };
    let rotations_scraped = rotate(
        &ours,
        https,
        scraped,
        AFTER_READY_SWAPS + idle.len() as u32,
        APART,
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (scrapes, scrape_bytes) = scraper.join().map_err(|_| "the scraper panicked")?;
    let rotations_scraped = rotations_scraped?;

    // One more route: its certificate first, then the workspace, renamed into place as a
    // ConfigMap update is (written in place, a half-written file would be evaluated first).
    atomic_write(
        &ours.certs.path().join(host(n)),
        &appended.crt,
        &appended.key,
        0,
    );
    let text = workspace_text(&ours, backend.address, n + 1)?;
    let evaluations_before = evaluations(&ours.stack.agent_logs()).len();
    let staged = ours.stack.workspace_path().with_extension("next");
    std::fs::write(&staged, text).map_err(|e| format!("write the workspace: {e}"))?;
    let renamed = Instant::now();
    std::fs::rename(&staged, ours.stack.workspace_path())
        .map_err(|e| format!("rename the workspace: {e}"))?;
    let deadline = renamed + Duration::from_secs(60);
    loop {
        if let Ok((fp, done)) = handshake(https, &host(n)) {
            if fp == appended.fingerprint {
                let append_served = done.duration_since(renamed);
                if std::env::var_os("SCALE_AGENT_LOG").is_some() {
                    let own = agent_own_lines(&ours);
                    eprintln!("--- the agent's log, whole run\n{}", own.join("\n"));
                }
                let append_evaluated = evaluations(&ours.stack.agent_logs())
                    .get(evaluations_before)
                    .copied();
                return Ok(ScaleOutcome {
                    routes: n,
                    cold_start,
                    rss_rest,
                    sozu_rss_rest,
                    after_ready,
                    rotations,
                    rotations_scraped,
                    scrapes,
                    scrape_bytes,
                    scrape_cpu,
                    append_served,
                    append_evaluated,
                });
            }
        }
        if Instant::now() > deadline {
            return Err(format!(
                "the appended route was not served\n{}",
                failure_logs(&ours)
            ));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The workspace of the first `routes` hosts ([`host`]), each to `backend`, with the tls_dir the
/// agent serves from now (the certificate root, not the stack's own).
pub fn workspace_text(ours: &Ours, backend: SocketAddr, routes: usize) -> Result<String, String> {
    let mut specs: Vec<RouteSpec> = (0..routes)
        .map(|i| RouteSpec {
            host: host(i),
            upstream: backend.ip().to_string(),
            port: Some(backend.port()),
        })
        .collect();
    specs.sort_by(|a, b| a.host.cmp(&b.host));
    let current = std::fs::read_to_string(ours.stack.workspace_path())
        .map_err(|e| format!("the workspace: {e}"))?;
    let tls_dir = current
        .lines()
        .find(|l| l.trim_start().starts_with("tls_dir"))
        .ok_or("the workspace names no tls_dir")?
        .to_owned();
    let mut text = ours.stack.workspace_text(&specs);
    if let Some(line) = text.lines().find(|l| l.trim_start().starts_with("tls_dir")) {
        text = text.replace(line, &tls_dir);
    }
    Ok(text)
}

/// The agent's own log lines: its access-log records (JSON, one per request) left out, as at
/// 10,000 routes they are most of the log.
fn agent_own_lines(ours: &Ours) -> Vec<String> {
    ours.stack
        .agent_logs()
        .lines()
        .filter(|l| !l.starts_with('{'))
        .map(str::to_owned)
        .collect()
}

/// The end of the agent's own lines and of sozu's log, for a failure's message.
fn failure_logs(ours: &Ours) -> String {
    let own = agent_own_lines(ours);
    let sozu = std::fs::read_to_string(ours.stack.dir.path().join("sozu.log")).unwrap_or_default();
    let sozu: Vec<&str> = sozu.lines().collect();
    format!(
        "--- the agent's log, its last 200 lines of its own\n{}\n--- sozu's log, its last 40 lines\n{}",
        own[own.len().saturating_sub(200)..].join("\n"),
        sozu[sozu.len().saturating_sub(40)..].join("\n")
    )
}

/// Apart, so that each rotation is measured alone.
const APART: Pace = Pace::Apart(Duration::from_millis(50));

/// How many swaps start the moment the agent is ready.
const AFTER_READY: usize = 10;
/// The generation of the first swap after them.
const AFTER_READY_SWAPS: u32 = AFTER_READY as u32;

/// How rotations follow one another.
#[derive(Clone, Copy)]
pub enum Pace {
    /// Each swap this long after the previous one was served, so that each is measured alone.
    Apart(Duration),
    /// One swap every this long (the previous one served by then), as renewals come in.
    Every(Duration),
}

/// Swaps each host's pair in turn; for each, the time to the first handshake presenting it.
/// `generation` counts the swaps made before, so that each writes a directory of its own.
pub fn rotate(
    ours: &Ours,
    https: SocketAddr,
    renewals: &[(usize, Pair)],
    mut generation: u32,
    pace: Pace,
) -> Result<Vec<Duration>, String> {
    let mut latencies = Vec::new();
    for (i, pair) in renewals {
        generation += 1;
        let dir = ours.certs.path().join(host(*i));
        let swapped = Instant::now();
        let swapped_at = std::time::SystemTime::now();
        atomic_write(&dir, &pair.crt, &pair.key, generation);
        // Long enough that a stall is measured, not cut short.
        let deadline = swapped + Duration::from_secs(120);
        loop {
            match handshake(https, &host(*i)) {
                Ok((fp, done)) if fp == pair.fingerprint => {
                    let took = done.duration_since(swapped);
                    report_slow(&host(*i), swapped_at, took);
                    latencies.push(took);
                    break;
                }
                _ if Instant::now() > deadline => {
                    return Err(format!(
                        "{} not rotated after 120 s\n{}",
                        host(*i),
                        failure_logs(ours)
                    ));
                }
                _ => {}
            }
        }
        std::thread::sleep(match pace {
            Pace::Apart(gap) => gap,
            Pace::Every(every) => every.saturating_sub(swapped.elapsed()),
        });
    }
    Ok(latencies)
}

/// `ROTATION_SLOW_MS=M`: each rotation served after more than M ms is printed with the time of
/// its swap (UTC, as the agent's log writes it) and its host, to be found in the agent's log.
fn report_slow(host: &str, swapped_at: std::time::SystemTime, took: Duration) {
    let Some(slow) = std::env::var("ROTATION_SLOW_MS")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
    else {
        return;
    };
    if took.as_secs_f64() * 1e3 > slow {
        let at = time::OffsetDateTime::from(swapped_at)
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default();
        println!(
            "slow rotation: {host} swapped at {at}, served {:.1} ms after",
            took.as_secs_f64() * 1e3
        );
    }
}

/// One `/metrics` body as sent: gzip-encoded when `gzip` (not decoded here).
fn scrape(admin: SocketAddr, gzip: bool) -> Result<Vec<u8>, ureq::Error> {
    let mut request = ureq::get(&format!("http://{admin}/metrics"));
    if gzip {
        request = request.header("Accept-Encoding", "gzip");
    }
    request
        .call()?
        .body_mut()
        .with_config()
        .limit(u64::MAX)
        .read_to_vec()
}

/// Scrapes to average the agent's CPU over (10 ms ticks).
const SCRAPES: usize = 20;

/// Sends one request to every route, so that each has traffic families, then scrapes
/// [`SCRAPES`] times each way, one after the other: the agent's CPU per scrape and the bytes.
fn scrape_cost(ours: &Ours, n: usize) -> Result<[(Duration, usize); 2], String> {
    for i in 0..n {
        crate::live::https_get(ours.stack.https, &host(i), "/")
            .map_err(|e| format!("a request to {}: {e}", host(i)))?;
    }
    let pid = ours.stack.agent_pid().ok_or("the agent is not running")?;
    let admin = ours.stack.admin;
    // The traffic records reach the agent over UDP: wait until the last route's are counted.
    let last = format!("host=\"{}\"", host(n - 1));
    let deadline = Instant::now() + Duration::from_secs(60);
    while !String::from_utf8_lossy(&scrape(admin, false).map_err(|e| e.to_string())?)
        .lines()
        .any(|l| l.starts_with("private_ingress_http_requests_total") && l.contains(&last))
    {
        if Instant::now() > deadline {
            return Err("the last route's request never showed in /metrics".into());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut out = [(Duration::ZERO, 0); 2];
    for (k, gzip) in [false, true].into_iter().enumerate() {
        let before = super::mass::cpu(pid);
        let mut bytes = 0;
        for _ in 0..SCRAPES {
            bytes = scrape(admin, gzip).map_err(|e| e.to_string())?.len();
        }
        out[k] = (
            super::mass::cpu(pid).saturating_sub(before) / SCRAPES as u32,
            bytes,
        );
    }
    Ok(out)
}

/// Every "workspace evaluated" time in the agent's log, in order.
fn evaluations(log: &str) -> Vec<Duration> {
    ours::split_lines(log, "workspace evaluated")
        .into_iter()
        .map(|ms| Duration::from_secs_f64(ms / 1e3))
        .collect()
}
