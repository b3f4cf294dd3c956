//! Where a rotation's time goes, hop by hop (ours only), from timestamps on both sides: the
//! bench's own (the `..data` rename, the first handshake presenting the new certificate), the
//! agent's debug log and sozu's debug log, all on this machine's wall clock (microseconds).
//!
//! | hop | from | to |
//! |---|---|---|
//! | inotify | the rename | the agent's certificate thread taking the change up (`pair changes seen`) |
//! | read | that | the pair read and validated (`certificate pairs read`) |
//! | loop | that | the request leaving for sozu (`changes sent`, less its `elapsed_ms`) |
//! | to sozu | that | sozu's main process dispatching it (its first `AUDIT` line for it) |
//! | sozu's fan-out | that | every worker having applied it (its second `AUDIT` line, `fanout=ok`) |
//! | ack | that | the agent reading sozu's answer (`changes sent`) |
//!
//! and, beside them, from sozu's dispatch to the first handshake presenting the new certificate
//! (within a probe's time; the worker applies it somewhere in the fan-out: sozu 2.3.3 as built
//! logs nothing at the worker without its debug logs compiled in).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::workload::{handshake, Pair};
use super::HOST;
use crate::live::{atomic_write, Backend};

pub const HOPS: [&str; 7] = [
    "inotify",
    "read",
    "loop",
    "to sozu",
    "sozu's fan-out",
    "ack",
    "dispatch → handshake",
];

/// Per hop, its duration in each rotation where every timestamp was found.
pub struct HopsOutcome {
    pub hops: Vec<Vec<Duration>>,
    pub totals: Vec<Duration>,
    /// Rotations with a timestamp missing (not counted in `hops`).
    pub incomplete: usize,
}

/// `routes` in all: the rotated host and as many others as it takes, each with a certificate of
/// its own, so that the same hops can be compared between a small and a large workspace.
/// `bin` is another build of the agent to time instead of this one (a baseline).
pub fn run(
    bin: Option<&std::path::Path>,
    pairs: &[Pair],
    rotations: usize,
    routes: usize,
) -> Result<HopsOutcome, String> {
    let backend = Backend::start("app");
    let others: Vec<(String, Pair)> = (1..routes.max(1))
        .map(|i| {
            let host = super::scale::host(i);
            let pair = Pair::new(&host);
            (host, pair)
        })
        .collect();
    let hosts: Vec<(String, &Pair)> = std::iter::once((HOST.to_owned(), &pairs[0]))
        .chain(others.iter().map(|(h, p)| (h.clone(), p)))
        .collect();
    let ours = super::ours::serve_with(
        bin,
        &hosts,
        backend.address,
        "warn,private_ingress=debug",
        Some("debug"),
    )?;
    super::workload::wait_serving(
        ours.stack.https,
        &pairs[0].fingerprint,
        super::START_TIMEOUT,
    )?;
    let mut marks = Vec::new();
    for (generation, pair) in pairs.iter().enumerate().skip(1).take(rotations) {
        let renamed = atomic_write(
            &ours.certs.path().join(HOST),
            &pair.crt,
            &pair.key,
            generation as u32,
        );
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let seen = loop {
            if let Ok((fp, _)) = handshake(ours.stack.https, HOST) {
                if fp == pair.fingerprint {
                    break SystemTime::now();
                }
            }
            if std::time::Instant::now() > deadline {
                return Err(format!("rotation {generation} not served after 10 s"));
            }
        };
        marks.push((renamed, seen));
        std::thread::sleep(Duration::from_millis(100));
    }
    let agent = ours.stack.agent_logs();
    // `HOPS_AGENT_LOG=1` prints the agent's debug log, to read a hop's lines around it.
    if std::env::var_os("HOPS_AGENT_LOG").is_some() {
        eprintln!("{agent}");
    }
    let sozu = std::fs::read_to_string(ours.stack.dir.path().join("sozu.log")).unwrap_or_default();
    let at = |log: &str, needle: &str| -> Vec<(f64, String)> {
        log.lines()
            .filter(|l| l.contains(needle))
            .filter_map(|l| Some((timestamp(l)?, l.to_owned())))
            .collect()
    };
    let seen = at(&agent, "pair changes seen");
    let read = at(&agent, "certificate pairs read");
    let sent = at(&agent, "changes sent");
    let replaced = at(&sozu, "verb=certificate_replaced");
    let (done, dispatched): (Vec<_>, Vec<_>) = replaced
        .into_iter()
        .partition(|(_, l)| l.contains("fanout="));
    let mut outcome = HopsOutcome {
        hops: vec![Vec::new(); HOPS.len()],
        totals: Vec::new(),
        incomplete: 0,
    };
    for (k, (renamed, handshake)) in marks.iter().enumerate() {
        let from = seconds(*renamed);
        let until = marks.get(k + 1).map_or(f64::MAX, |(r, _)| seconds(*r));
        let first = |events: &[(f64, String)], after: f64| {
            events
                .iter()
                .find(|(t, _)| *t >= after && *t < until)
                .cloned()
        };
        let Some(t_seen) = first(&seen, from) else {
            outcome.incomplete += 1;
            continue;
        };
        let Some(t_read) = first(&read, t_seen.0) else {
            outcome.incomplete += 1;
            continue;
        };
        let Some((t_sent, line)) = first(&sent, t_read.0) else {
            outcome.incomplete += 1;
            continue;
        };
        let t_send = t_sent - elapsed_ms(&line).unwrap_or(f64::NAN) / 1e3;
        // sozu stamps its lines as it handles them; the request left the agent just before.
        let (Some(t_main), Some(t_done)) = (
            first(&dispatched, t_send - 0.001),
            first(&done, t_send - 0.001),
        ) else {
            outcome.incomplete += 1;
            continue;
        };
        let t_handshake = seconds(*handshake);
        let stamps = [from, t_seen.0, t_read.0, t_send, t_main.0, t_done.0, t_sent];
        for (hop, pair) in stamps.windows(2).enumerate() {
            outcome.hops[hop].push(Duration::from_secs_f64((pair[1] - pair[0]).max(0.0)));
        }
        outcome.hops[6].push(Duration::from_secs_f64((t_handshake - t_main.0).max(0.0)));
        outcome
            .totals
            .push(Duration::from_secs_f64((t_handshake - from).max(0.0)));
    }
    Ok(outcome)
}

/// Seconds since the epoch of a log line's leading `YYYY-MM-DDTHH:MM:SS.ffffffZ` (both the agent
/// and sozu start their lines with one; colour codes are skipped).
fn timestamp(line: &str) -> Option<f64> {
    let start = line.find("20")?;
    let stamp = line[start..].split_whitespace().next()?;
    let stamp = stamp.split('\u{1b}').next()?;
    let parsed =
        time::OffsetDateTime::parse(stamp, &time::format_description::well_known::Rfc3339).ok()?;
    Some(parsed.unix_timestamp_nanos() as f64 / 1e9)
}

fn elapsed_ms(line: &str) -> Option<f64> {
    let after = line.split_once("elapsed_ms")?.1;
    let digits: String = after
        .chars()
        .skip_while(|c| !c.is_ascii_digit())
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    digits.parse().ok()
}

fn seconds(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}
