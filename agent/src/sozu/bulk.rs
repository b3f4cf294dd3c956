//! A bulk change (a cold start, a restarted sozu, a large edit): listeners and certificates one
//! request each, everything else as two state files that sozu loads itself (`LoadState`), as it
//! loads its own configuration file, without a round trip per request.
//!
//! Listeners go by request because sozu loads a state file's listeners with checks of their own;
//! certificates go by request so that no key is ever written to a file (and they depend on
//! nothing but their listener). A refused certificate keeps its host's frontends out of the
//! second file.

use std::path::Path;
use std::time::{Duration, Instant};

use super::lanes::{lock, send_over, Lane};
use super::{Delivered, SozuError};
use crate::plan::{Op, Outcome};

/// From this many requests on, a change goes as state files: a cold start or a restarted sozu
/// of a dozen routes and up, never a rotation or an edit of a few routes.
pub const BATCH_MIN: usize = 64;

/// After sozu did not load a bulk change, the next ones go one request at a time for this long;
/// then a bulk change is tried again. What made a load fail (a slow sozu at the deadline, a
/// directory sozu could not read for a while, a sozu restarted as another user) may pass, and
/// one request at a time costs a cold start of 10,000 routes about 2.6 s more (8.4 against
/// 5.8 s), so bulk loading is not given up for the process's life.
pub const BULK_RETRY_FIRST: Duration = Duration::from_secs(30);
/// The longest wait: an hour, so that a sozu that can never load the agent's files costs one
/// failed load (and its deadline) an hour at most.
pub const BULK_RETRY_MAX: Duration = Duration::from_secs(3600);

/// How long bulk loading waits after `failures` failed loads in a row (at least one):
/// [`BULK_RETRY_FIRST`], doubling with each failure, up to [`BULK_RETRY_MAX`].
pub fn bulk_retry_after(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    BULK_RETRY_FIRST
        .saturating_mul(1 << doublings)
        .min(BULK_RETRY_MAX)
}

/// How one operation of a bulk change is delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Delivery {
    /// One request each: listeners (sozu checks a state file's listeners its own way) and
    /// certificates (so that no key is ever written to a file).
    Request,
    /// In the first state file, loaded while the certificates go: new clusters and backends
    /// depend on nothing and nothing routes to them yet.
    Early,
    /// In the second state file, once the certificates are in: frontends (an HTTPS frontend
    /// needs its certificate) and every removal.
    Late,
    /// One request each, once the files are loaded: what needs its cluster in place (health
    /// checks) or acts on live sessions (closing those of removed backends), which no state file
    /// carries.
    After,
}

fn delivery_of(op: &Op) -> Delivery {
    match op {
        Op::AddListener { .. }
        | Op::PatchListener { .. }
        | Op::SetClientAuth { .. }
        | Op::ActivateListener { .. }
        | Op::SetListenerHsts { .. }
        | Op::SetListenerAnswers { .. }
        | Op::SwapFrontend { .. }
        | Op::AddCertificate { .. }
        | Op::ReplaceCertificate { .. }
        | Op::RemoveCertificate { .. } => Delivery::Request,
        Op::AddCluster { .. } | Op::AddBackend { .. } => Delivery::Early,
        Op::RemoveFrontend(_)
        | Op::AddFrontend(_)
        | Op::AddStreamFrontend(_)
        | Op::RemoveStreamFrontend(_)
        | Op::RemoveBackend { .. }
        | Op::RemoveCluster { .. } => Delivery::Late,
        Op::SetHealthCheck { .. }
        | Op::RemoveHealthCheck { .. }
        | Op::CloseSessions { .. }
        | Op::DeactivateListener { .. }
        | Op::RemoveListener { .. } => Delivery::After,
    }
}

/// A bulk change (see the module): what became of each of `ops` and how it went, and why a
/// state file failed, if one did.
///
/// sozu's main process and its worker each take their turn on every certificate request, so
/// neither is busy all the time; the first file (new clusters and backends) fills those gaps
/// instead of waiting its turn after them. It goes on its own connection, the certificates on
/// the others.
pub fn send_bulk(
    clients: &[Lane],
    ops: &[Op],
    dir: &Path,
    workers: usize,
) -> (Delivered, Option<String>) {
    let pick = |delivery: Delivery| -> Vec<Op> {
        ops.iter()
            .filter(|op| delivery_of(op) == delivery)
            .cloned()
            .collect()
    };
    let (requests, early, late, after) = (
        pick(Delivery::Request),
        pick(Delivery::Early),
        pick(Delivery::Late),
        pick(Delivery::After),
    );
    let files = std::sync::atomic::AtomicUsize::new(0);
    let load = |client: &Lane, file: &[Op], what: &str| {
        if file.is_empty() {
            return Ok(());
        }
        files.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut client = lock(client);
        let started = Instant::now();
        client.load_batch(file, dir, workers)?;
        tracing::debug!(
            requests = file.len(),
            elapsed_ms = started.elapsed().as_secs_f64() * 1e3,
            "{what} loaded by sozu from a state file"
        );
        Ok::<(), SozuError>(())
    };
    let send_requests = |lanes: &[Lane]| {
        let started = Instant::now();
        let outcomes = send_over(lanes, &requests);
        tracing::debug!(
            requests = requests.len(),
            elapsed_ms = started.elapsed().as_secs_f64() * 1e3,
            "listeners and certificates sent"
        );
        outcomes
    };
    let (request_outcomes, early_result) = match clients {
        [first, rest @ ..] if !rest.is_empty() => std::thread::scope(|scope| {
            let early_load = scope.spawn(|| load(first, &early, "clusters and backends"));
            let outcomes = send_requests(rest);
            let early_result = early_load.join().unwrap_or_else(|_| {
                Err(SozuError::BatchFile {
                    dir: dir.to_owned(),
                    reason: "the loading thread panicked".into(),
                })
            });
            (outcomes, early_result)
        }),
        // One connection: one thing at a time.
        _ => {
            let early_result = clients
                .first()
                .map_or(Ok(()), |c| load(c, &early, "clusters and backends"));
            (send_requests(clients), early_result)
        }
    };

    let broken = request_outcomes.iter().find_map(|o| match o {
        Outcome::NotSent(reason) => Some(reason.clone()),
        _ => None,
    });
    // A refused certificate holds back its host's frontends, as one request at a time would.
    let refused: Vec<&Op> = requests
        .iter()
        .zip(&request_outcomes)
        .filter(|(_, o)| matches!(o, Outcome::Refused(_)))
        .map(|(op, _)| op)
        .collect();
    let held = |op: &Op| refused.iter().any(|r| crate::plan::depends_on(op, r));
    let late: Vec<Op> = late.into_iter().filter(|op| !held(op)).collect();

    let mut failure = None;
    let early_outcome = match early_result {
        Ok(()) => Outcome::Applied,
        Err(e) => {
            failure = Some(e.to_string());
            Outcome::NotSent(e.to_string())
        }
    };
    let late_outcome = match (&broken, &early_outcome) {
        (Some(reason), _) | (None, Outcome::NotSent(reason)) => Outcome::NotSent(reason.clone()),
        _ => match clients
            .first()
            .map_or(Ok(()), |c| load(c, &late, "frontends and removals"))
        {
            Ok(()) => Outcome::Applied,
            Err(e) => {
                failure = Some(e.to_string());
                Outcome::NotSent(e.to_string())
            }
        },
    };
    if failure.is_none() && broken.is_none() && (!early.is_empty() || !late.is_empty()) {
        tracing::info!(
            requests = early.len() + late.len(),
            "bulk change loaded by sozu from state files"
        );
    }

    let after_outcomes = match &late_outcome {
        Outcome::NotSent(reason) => vec![Outcome::NotSent(reason.clone()); after.len()],
        _ => send_over(clients, &after),
    };

    // Back in plan order.
    let in_file = ops
        .iter()
        .map(|op| matches!(delivery_of(op), Delivery::Early | Delivery::Late))
        .collect();
    let mut request_outcomes = request_outcomes.into_iter();
    let mut after_outcomes = after_outcomes.into_iter();
    let outcomes = ops
        .iter()
        .map(|op| match delivery_of(op) {
            Delivery::Request => request_outcomes.next().unwrap_or(Outcome::Skipped),
            Delivery::Early => early_outcome.clone(),
            Delivery::Late if held(op) => Outcome::Skipped,
            Delivery::Late => late_outcome.clone(),
            Delivery::After => after_outcomes.next().unwrap_or(Outcome::Skipped),
        })
        .collect();
    let delivered = Delivered {
        outcomes,
        in_file,
        files: files.into_inner(),
    };
    (delivered, failure)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_bulk_load_is_tried_again_later_each_time_later_up_to_an_hour() {
        let schedule: Vec<u64> = (1..=10).map(|n| bulk_retry_after(n).as_secs()).collect();
        assert_eq!(
            schedule,
            [30, 60, 120, 240, 480, 960, 1920, 3600, 3600, 3600]
        );
        // No overflow however long sozu keeps failing; zero failures waits as one.
        assert_eq!(bulk_retry_after(u32::MAX), BULK_RETRY_MAX);
        assert_eq!(bulk_retry_after(0), BULK_RETRY_FIRST);
    }
}
