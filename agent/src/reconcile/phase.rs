//! What the loop is doing between passes, as one state machine, and the numbers of its
//! back-off. Pure: each transition is given the time it happens at, so the machine is tested
//! without a clock or a sozu.
//!
//! | phase | passes | ends |
//! |---|---|---|
//! | running | whenever facts or timers ask for one | when a pass cannot reach sozu (backing off), or a bulk pass leaves readiness waiting (settling) |
//! | backing off | none: facts are still taken up, nothing is sent | at its retry time; at once on a new socket, or when a sozu is found listening at a socket not tried yet (looked for every [`PROBE_EVERY`]) |
//! | settling | only those what queued during the bulk pass asks for | once nothing queued asks for a pass: readiness may say ready from then on |
//!
//! A pass that cannot reach sozu while settling backs off and settles afterwards: a start that
//! loses sozu half-way still takes up what queued before `/readyz` says ready.

use std::time::Duration;

use tokio::time::Instant;

use super::retry_policy::Backoff;

/// The first wait after sozu could not be reached; each failure in a row doubles the ceiling
/// the wait is drawn from, up to [`RETRY_CEILING`].
pub const RETRY_FIRST: Duration = Duration::from_millis(100);
pub const RETRY_CEILING: Duration = Duration::from_secs(10);
/// How long sozu must stay reachable before the waits start again from [`RETRY_FIRST`]: a sozu
/// that answers once and fails again is not hammered.
pub const RETRY_RESET_AFTER: Duration = Duration::from_secs(30);
/// How often a wait looks at sozu's socket for a sozu listening again (a `stat`: microseconds;
/// see [`crate::sozu::socket`] for why a new socket's notification is not enough).
pub const PROBE_EVERY: Duration = Duration::from_millis(100);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Passes run as facts and timers ask for them.
    Running,
    /// A bulk pass made readiness wait: what queued during it is taken up first, and the memory
    /// it freed handed back, before readiness may say ready.
    Settling,
    /// sozu could not be reached: no pass until `retry_at`, or until a sozu listens again
    /// (looked for at `probe_at`).
    BackingOff {
        retry_at: Instant,
        probe_at: Instant,
        /// It began while settling: the settle comes once the wait is over.
        then_settle: bool,
    },
}

/// The loop's phase and the back-off's memory of failures in a row.
#[derive(Debug)]
pub struct LoopPhase {
    phase: Phase,
    backoff: Backoff,
}

impl LoopPhase {
    /// Running; `seed` seeds the back-off's jitter, so that a fleet of agents does not retry a
    /// restarting sozu in step.
    pub fn new(seed: u64) -> LoopPhase {
        LoopPhase {
            phase: Phase::Running,
            backoff: Backoff::new(RETRY_FIRST, RETRY_CEILING, RETRY_RESET_AFTER, seed),
        }
    }

    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// No pass runs while backing off.
    pub fn backing_off(&self) -> bool {
        matches!(self.phase, Phase::BackingOff { .. })
    }

    /// Readiness waits: settling, or backing off on the way to a settle.
    pub fn settling(&self) -> bool {
        match self.phase {
            Phase::Settling => true,
            Phase::BackingOff { then_settle, .. } => then_settle,
            Phase::Running => false,
        }
    }

    /// When a back-off's wait ends by itself.
    pub fn retry_at(&self) -> Option<Instant> {
        match self.phase {
            Phase::BackingOff { retry_at, .. } => Some(retry_at),
            Phase::Running | Phase::Settling => None,
        }
    }

    /// When a back-off's wait next looks at sozu's socket.
    pub fn probe_at(&self) -> Option<Instant> {
        match self.phase {
            Phase::BackingOff { probe_at, .. } => Some(probe_at),
            Phase::Running | Phase::Settling => None,
        }
    }

    /// A pass could not reach sozu at `now`: the loop backs off. Returns the wait.
    pub fn unreachable(&mut self, now: Instant) -> Duration {
        let wait = self.backoff.failed();
        self.phase = Phase::BackingOff {
            retry_at: now + wait,
            probe_at: now + PROBE_EVERY,
            then_settle: self.settling(),
        };
        wait
    }

    /// A pass reached sozu at `now`. `bulk_before_ready`: it sent a bulk change while readiness
    /// did not say ready yet, which settles.
    pub fn reached(&mut self, now: Instant, bulk_before_ready: bool) {
        self.backoff.succeeded(now);
        if bulk_before_ready {
            self.phase = match self.phase {
                Phase::Running | Phase::Settling => Phase::Settling,
                // No pass runs while backing off: nothing to change.
                backing_off @ Phase::BackingOff { .. } => backing_off,
            };
        }
    }

    /// A back-off's wait is over: its time came, a new socket appeared, or a sozu was found
    /// listening again. Nothing changes in another phase.
    pub fn wait_over(&mut self) {
        if let Phase::BackingOff { then_settle, .. } = self.phase {
            self.phase = if then_settle {
                Phase::Settling
            } else {
                Phase::Running
            };
        }
    }

    /// The socket, looked at `now`, holds no sozu the agent has not tried: it is looked at
    /// again [`PROBE_EVERY`] later.
    pub fn nobody_new_listening(&mut self, now: Instant) {
        if let Phase::BackingOff { probe_at, .. } = &mut self.phase {
            *probe_at = now + PROBE_EVERY;
        }
    }

    /// Nothing queued asks for a pass any more: the settle is over.
    pub fn settled(&mut self) {
        if self.phase == Phase::Settling {
            self.phase = Phase::Running;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backing_off(phase: &LoopPhase) -> (Instant, Instant, bool) {
        match phase.phase() {
            Phase::BackingOff {
                retry_at,
                probe_at,
                then_settle,
            } => (retry_at, probe_at, then_settle),
            other => panic!("backing off expected, {other:?}"),
        }
    }

    #[test]
    fn an_unreachable_sozu_backs_off_and_the_wait_ends_at_its_time() {
        let now = Instant::now();
        let mut phase = LoopPhase::new(7);
        assert_eq!(phase.phase(), Phase::Running);
        assert_eq!((phase.retry_at(), phase.probe_at()), (None, None));

        let wait = phase.unreachable(now);
        assert!(
            wait >= RETRY_FIRST / 2 && wait <= RETRY_FIRST,
            "the first wait is drawn from the upper half of the first ceiling: {wait:?}"
        );
        let (retry_at, probe_at, then_settle) = backing_off(&phase);
        assert_eq!(retry_at, now + wait);
        assert_eq!(probe_at, now + PROBE_EVERY);
        assert!(!then_settle);
        assert!(phase.backing_off());
        assert!(!phase.settling());

        phase.wait_over();
        assert_eq!(phase.phase(), Phase::Running);
        assert!(!phase.backing_off());
    }

    #[test]
    fn a_look_at_the_socket_that_finds_nobody_new_looks_again_later() {
        let now = Instant::now();
        let mut phase = LoopPhase::new(7);
        phase.unreachable(now);
        let (retry_at, _, _) = backing_off(&phase);

        let later = now + Duration::from_millis(130);
        phase.nobody_new_listening(later);
        let (retry_after, probe_at, _) = backing_off(&phase);
        assert_eq!(probe_at, later + PROBE_EVERY);
        assert_eq!(retry_after, retry_at, "the retry time stays");

        // Found listening: the wait ends at once.
        phase.wait_over();
        assert_eq!(phase.phase(), Phase::Running);
        // Nothing to look at while running.
        phase.nobody_new_listening(later);
        assert_eq!(phase.phase(), Phase::Running);
    }

    #[test]
    fn waits_grow_to_the_ceiling_and_start_again_only_after_a_stretch_of_health() {
        let mut now = Instant::now();
        let mut phase = LoopPhase::new(7);
        let mut waits = Vec::new();
        for _ in 0..10 {
            waits.push(phase.unreachable(now));
            phase.wait_over();
            now += Duration::from_secs(1);
        }
        for (i, wait) in waits.iter().enumerate() {
            let ceiling = (RETRY_FIRST * 2u32.pow(i as u32)).min(RETRY_CEILING);
            assert!(
                *wait >= ceiling / 2 && *wait <= ceiling,
                "{i}: {wait:?} of {ceiling:?}"
            );
        }
        // One pass that reaches sozu does not forgive.
        phase.reached(now, false);
        assert!(phase.unreachable(now) >= RETRY_CEILING / 2);
        phase.wait_over();
        // Passes that reach it for RETRY_RESET_AFTER do.
        phase.reached(now, false);
        phase.reached(now + RETRY_RESET_AFTER, false);
        assert!(phase.unreachable(now + RETRY_RESET_AFTER) <= RETRY_FIRST);
    }

    #[test]
    fn the_same_seed_draws_the_same_waits_and_another_seed_others() {
        let now = Instant::now();
        let draws = |seed| {
            let mut phase = LoopPhase::new(seed);
            (0..8)
                .map(|_| {
                    let wait = phase.unreachable(now);
                    phase.wait_over();
                    wait
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(draws(1), draws(1));
        assert_ne!(draws(1), draws(2));
    }

    #[test]
    fn a_bulk_pass_before_ready_settles_and_one_after_does_not() {
        let now = Instant::now();
        let mut phase = LoopPhase::new(7);
        phase.reached(now, false);
        assert_eq!(phase.phase(), Phase::Running);
        phase.reached(now, true);
        assert_eq!(phase.phase(), Phase::Settling);
        assert!(phase.settling());
        assert!(!phase.backing_off());
        // A pass asked for by what queued meanwhile keeps it settling.
        phase.reached(now, false);
        assert_eq!(phase.phase(), Phase::Settling);
        // A new socket while settling ends no wait: there is none.
        phase.wait_over();
        assert_eq!(phase.phase(), Phase::Settling);
        phase.settled();
        assert_eq!(phase.phase(), Phase::Running);
        assert!(!phase.settling());
    }

    #[test]
    fn a_back_off_that_began_while_settling_settles_once_over() {
        let now = Instant::now();
        let mut phase = LoopPhase::new(7);
        phase.reached(now, true);
        phase.unreachable(now);
        let (_, _, then_settle) = backing_off(&phase);
        assert!(then_settle);
        assert!(phase.settling(), "readiness still waits");
        // A settle is not over while backing off.
        phase.settled();
        assert!(phase.backing_off());
        phase.wait_over();
        assert_eq!(phase.phase(), Phase::Settling);
        phase.settled();
        assert_eq!(phase.phase(), Phase::Running);
    }
}
