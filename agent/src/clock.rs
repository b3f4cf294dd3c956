//! Wall-clock time, injectable: certificate validity, expiry flags and rotation times are read
//! from a [`Clock`], so tests run them under tokio's paused time.

use std::time::{Duration, SystemTime};

pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> SystemTime;

    /// Seconds since the Unix epoch (0 before it).
    fn unix(&self) -> i64 {
        unix_seconds(self.now())
    }
}

/// The system's clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// A clock that starts at a given time and moves with tokio's clock, so that
/// `tokio::time::advance` (or paused time's auto-advance) moves it too.
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    start: SystemTime,
    started: tokio::time::Instant,
}

impl TokioClock {
    pub fn starting_at(start: SystemTime) -> TokioClock {
        TokioClock {
            start,
            started: tokio::time::Instant::now(),
        }
    }
}

impl Clock for TokioClock {
    fn now(&self) -> SystemTime {
        self.start + self.started.elapsed()
    }
}

pub fn unix_seconds(time: SystemTime) -> i64 {
    time.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// The time `seconds` after the epoch (the epoch itself for a negative number).
pub fn from_unix(seconds: i64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(seconds).unwrap_or(0))
}

/// CPU time the calling thread has used. Logged beside a debug timing's wall time, so that a slow
/// figure tells work apart from waiting for a core that other processes hold.
pub fn thread_cpu_time() -> Duration {
    use nix::time::{clock_gettime, ClockId};
    clock_gettime(ClockId::CLOCK_THREAD_CPUTIME_ID).map_or(Duration::ZERO, Duration::from)
}
