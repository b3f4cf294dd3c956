//! Each route's requests over the last minute, for `status`: the rate, the share of 5xx and the
//! p99. Pure; the receiver owns the windows and turns them every [`SLOT`].

use std::collections::HashMap;
use std::time::Duration;

use super::stats::{BUCKETS_US, UNMATCHED};
use crate::document::RouteTraffic;

/// The window is this many slots of [`SLOT`].
pub const SLOTS: usize = 12;
pub const SLOT: Duration = Duration::from_secs(5);
/// What the figures cover: a minute.
pub const WINDOW: Duration = Duration::from_secs(SLOT.as_secs() * SLOTS as u64);

#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    requests: u32,
    errors: u32,
    buckets: [u32; BUCKETS_US.len() + 1],
}

/// One route's slots, the newest at `current`.
#[derive(Debug, Clone, Default)]
struct Window {
    slots: [Slot; SLOTS],
}

/// Every route's window, by route id (and [`UNMATCHED`]).
#[derive(Debug, Default)]
pub struct Windows {
    routes: HashMap<String, Window>,
    current: usize,
    /// Full slots the window holds besides the current one, up to `SLOTS - 1`: the rate divides
    /// by the time the window covers, which is less than a minute until the agent has run one,
    /// and between 55 and 60 s after.
    turned: usize,
}

impl Windows {
    /// Counts a request of `route` (its id, or [`UNMATCHED`]) with its status and duration.
    pub fn observe(&mut self, route: &str, status: Option<u16>, us: u64) {
        let current = self.current;
        let window = match self.routes.get_mut(route) {
            Some(w) => w,
            None => self.routes.entry(route.to_owned()).or_default(),
        };
        let slot = &mut window.slots[current];
        slot.requests = slot.requests.saturating_add(1);
        if status.is_some_and(|s| (500..600).contains(&s)) {
            slot.errors = slot.errors.saturating_add(1);
        }
        let b = super::stats::bucket(us);
        slot.buckets[b] = slot.buckets[b].saturating_add(1);
    }

    /// Starts a new slot, forgetting the oldest; routes without a request in the window are
    /// forgotten, and so are those `keep` says are gone from the workspace.
    pub fn turn(&mut self, keep: impl Fn(&str) -> bool) {
        self.current = (self.current + 1) % SLOTS;
        self.turned = (self.turned + 1).min(SLOTS - 1);
        let current = self.current;
        self.routes.retain(|id, w| {
            w.slots[current] = Slot::default();
            (id == UNMATCHED || keep(id)) && w.slots.iter().any(|s| s.requests > 0)
        });
    }

    /// Each route's figures over the window; `into_current` is how far the current slot has run.
    pub fn figures(
        &self,
        into_current: Duration,
    ) -> std::collections::BTreeMap<String, RouteTraffic> {
        let covered = SLOT
            .saturating_mul(u32::try_from(self.turned).unwrap_or(u32::MAX))
            .saturating_add(into_current.min(SLOT))
            .min(WINDOW)
            .as_secs_f64()
            .max(1.0);
        self.routes
            .iter()
            .filter_map(|(id, w)| {
                let mut total = Slot::default();
                for s in &w.slots {
                    total.requests += s.requests;
                    total.errors += s.errors;
                    for (t, b) in total.buckets.iter_mut().zip(s.buckets) {
                        *t += b;
                    }
                }
                (total.requests > 0).then(|| {
                    let requests = u64::from(total.requests);
                    (
                        id.clone(),
                        RouteTraffic {
                            requests,
                            requests_per_second: requests as f64 / covered,
                            error_ratio: f64::from(total.errors) / requests as f64,
                            p99_seconds: quantile(0.99, &total.buckets),
                        },
                    )
                })
            })
            .collect()
    }
}

/// The `q` quantile of bucketed counts, interpolated linearly within its bucket as Prometheus'
/// `histogram_quantile` does (so `status` and a dashboard agree); in the `+Inf` bucket, the
/// highest finite bound.
pub fn quantile(q: f64, buckets: &[u32; BUCKETS_US.len() + 1]) -> Option<f64> {
    let total: u64 = buckets.iter().map(|b| u64::from(*b)).sum();
    if total == 0 {
        return None;
    }
    let rank = q * total as f64;
    let mut below = 0u64;
    for (i, count) in buckets.iter().enumerate() {
        let count = u64::from(*count);
        if (below + count) as f64 >= rank && count > 0 {
            let Some(upper) = BUCKETS_US.get(i) else {
                return Some(BUCKETS_US[BUCKETS_US.len() - 1] as f64 / 1e6);
            };
            let lower = if i == 0 { 0 } else { BUCKETS_US[i - 1] };
            let within = (rank - below as f64) / count as f64;
            return Some((lower as f64 + (*upper - lower) as f64 * within) / 1e6);
        }
        below += count;
    }
    Some(BUCKETS_US[BUCKETS_US.len() - 1] as f64 / 1e6)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_says_rate_errors_and_p99() {
        let mut w = Windows::default();
        for i in 0..100 {
            let status = if i < 5 { 500 } else { 200 };
            let us = if i < 98 { 2_000 } else { 2_000_000 };
            w.observe("pi-a", Some(status), us);
        }
        let f = &w.figures(SLOT)["pi-a"];
        assert_eq!(f.requests, 100);
        assert!((f.requests_per_second - 20.0).abs() < 1e-9, "{f:?}");
        assert!((f.error_ratio - 0.05).abs() < 1e-9);
        // The 99th of 100 falls among the two slow ones, in the 1 s to 2.5 s bucket.
        let p99 = f.p99_seconds.unwrap();
        assert!((1.0..=2.5).contains(&p99), "{p99}");
    }

    #[test]
    fn a_minute_later_the_route_is_gone() {
        let mut w = Windows::default();
        w.observe("pi-a", Some(200), 1);
        for _ in 0..SLOTS - 1 {
            w.turn(|_| true);
            assert!(w.figures(Duration::ZERO).contains_key("pi-a"));
        }
        w.turn(|_| true);
        assert!(w.figures(Duration::ZERO).is_empty());
    }

    #[test]
    fn quantiles_interpolate_like_prometheus() {
        let mut buckets = [0u32; BUCKETS_US.len() + 1];
        buckets[1] = 10; // 1 ms to 2.5 ms
        assert_eq!(quantile(0.5, &buckets), Some(0.00175));
        assert_eq!(quantile(0.5, &[0; BUCKETS_US.len() + 1]), None);
    }
}
