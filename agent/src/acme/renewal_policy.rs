//! When to order: renewal times, back-off after failures, and the CA's rate limits. Pure: time
//! comes in as Unix seconds and randomness as a number in `[0, 1)`, so every rule is tested with
//! the clock and the dice fixed.
//!
//! - **Renewal.** Inside the CA's ARI window (RFC 9773) when it offers one, at a random point of
//!   it. Otherwise when a third of the lifetime is left (half for certificates of ten days or
//!   less, such as Let's Encrypt's 6-day `shortlived` profile, whose renewal must survive a
//!   failure or two), made up to a tenth of that margin earlier at random, so that hosts issued
//!   together do not all renew in the same second.
//! - **Back-off.** 1 min, 10 min, 100 min, then every 6 h for as long as it takes, each ±10%, and
//!   never before a `Retry-After` the CA sent.
//! - **Limits.** Let's Encrypt's: at most 5 certificates per exact set of names per 7 days, and 5
//!   failed authorisations per name per hour. An order placed inside an ARI window is exempt from
//!   the first, as Let's Encrypt exempts it.

use serde::{Deserialize, Serialize};

pub const MINUTE: i64 = 60;
pub const HOUR: i64 = 3_600;
pub const DAY: i64 = 86_400;
pub const WEEK: i64 = 7 * DAY;

/// Certificates for one exact set of names per [`WEEK`] (Let's Encrypt "duplicate certificate"
/// limit).
pub const CERTIFICATES_PER_WEEK: usize = 5;
/// Failed authorisations per name per [`HOUR`].
pub const FAILED_AUTHORIZATIONS_PER_HOUR: usize = 5;

/// Certificates living this long or less renew at half their lifetime, not a third.
const SHORT_LIVED: i64 = 10 * DAY;

/// The back-off steps after 1, 2, 3 and 4 or more consecutive failures.
const BACKOFF_STEPS: [i64; 4] = [MINUTE, 10 * MINUTE, 100 * MINUTE, 6 * HOUR];

/// Why a renewal is due when it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Basis {
    /// Inside the window the CA suggested through ACME Renewal Information.
    Ari,
    /// At a fraction of the certificate's lifetime (the CA offers no ARI, or has not answered).
    Lifetime,
}

impl std::fmt::Display for Basis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Basis::Ari => "ari",
            Basis::Lifetime => "lifetime",
        })
    }
}

/// When a certificate valid from `not_before` to `not_after` is to be renewed, and why.
///
/// `ari` is the CA's suggested window (start, end), when it offered one; `jitter` in `[0, 1)`.
/// A window is trusted within bounds only: it is moved to end no later than a tenth of the
/// lifetime (an hour at least) before expiry, so that a CA's mistaken or hostile window never
/// schedules a renewal after the certificate has expired, with room for a failed attempt.
pub fn renewal_time(
    not_before: i64,
    not_after: i64,
    ari: Option<(i64, i64)>,
    jitter: f64,
) -> (i64, Basis) {
    let jitter = jitter.clamp(0.0, 1.0);
    if let Some((start, end)) = ari.filter(|(start, end)| end >= start) {
        let latest = not_after.saturating_sub(((not_after - not_before) / 10).max(HOUR));
        let end = end.min(latest);
        let start = start.min(end);
        let span = end.saturating_sub(start);
        return (
            start.saturating_add((span as f64 * jitter) as i64),
            Basis::Ari,
        );
    }
    let lifetime = (not_after - not_before).max(0);
    let margin = if lifetime <= SHORT_LIVED {
        lifetime / 2
    } else {
        lifetime / 3
    };
    let earlier = (margin as f64 / 10.0 * jitter) as i64;
    (not_after - margin - earlier, Basis::Lifetime)
}

/// How long to wait after the `failures`-th consecutive failure (`failures` ≥ 1), `jitter` in
/// `[0, 1)` spreading it ±10%, and never less than the CA's `retry_after` (seconds from now).
pub fn backoff(failures: u32, retry_after: Option<i64>, jitter: f64) -> i64 {
    let index = (failures.max(1) as usize - 1).min(BACKOFF_STEPS.len() - 1);
    let step = BACKOFF_STEPS[index] as f64;
    let spread = step * (0.9 + 0.2 * jitter.clamp(0.0, 1.0));
    (spread as i64).max(retry_after.unwrap_or(0))
}

/// What was ordered for one name set, for the rate limits. Timestamps are Unix seconds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ledger {
    /// When each certificate was issued (those of the last week are kept).
    pub issued: Vec<i64>,
    /// When each authorisation failed at the CA (those of the last hour are kept).
    pub failed_authorizations: Vec<i64>,
}

/// Which limit holds an order back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Limit {
    /// [`CERTIFICATES_PER_WEEK`] for this exact set of names.
    CertificatesPerWeek,
    /// [`FAILED_AUTHORIZATIONS_PER_HOUR`] for this name.
    FailedAuthorizationsPerHour,
}

impl std::fmt::Display for Limit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Limit::CertificatesPerWeek => write!(
                f,
                "{CERTIFICATES_PER_WEEK} certificates for this name in 7 days"
            ),
            Limit::FailedAuthorizationsPerHour => write!(
                f,
                "{FAILED_AUTHORIZATIONS_PER_HOUR} failed authorisations for this name in an hour"
            ),
        }
    }
}

impl Ledger {
    pub fn record_issued(&mut self, now: i64) {
        self.forget(now);
        self.issued.push(now);
    }

    pub fn record_failed_authorization(&mut self, now: i64) {
        self.forget(now);
        self.failed_authorizations.push(now);
    }

    /// Drops what no limit counts any more.
    pub fn forget(&mut self, now: i64) {
        self.issued.retain(|&t| t > now - WEEK);
        self.failed_authorizations.retain(|&t| t > now - HOUR);
    }

    /// The earliest time at or after `now` when an order is within the limits, and the limit
    /// that held it back if that is later than `now`. `ari_directed` orders are exempt from the
    /// weekly limit.
    pub fn allowed_from(&self, now: i64, ari_directed: bool) -> (i64, Option<Limit>) {
        let mut at = now;
        let mut limit = None;
        let mut hold = |times: &[i64], window: i64, max: usize, which: Limit| {
            let mut recent: Vec<i64> = times
                .iter()
                .copied()
                .filter(|&t| t > now - window)
                .collect();
            if recent.len() >= max {
                recent.sort_unstable();
                // The oldest of the last `max` leaves the window first.
                let free = recent[recent.len() - max] + window;
                if free > at {
                    at = free;
                    limit = Some(which);
                }
            }
        };
        if !ari_directed {
            hold(
                &self.issued,
                WEEK,
                CERTIFICATES_PER_WEEK,
                Limit::CertificatesPerWeek,
            );
        }
        hold(
            &self.failed_authorizations,
            HOUR,
            FAILED_AUTHORIZATIONS_PER_HOUR,
            Limit::FailedAuthorizationsPerHour,
        );
        (at, limit)
    }
}

/// What a host's schedule says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Order now.
    Order(Why),
    /// Nothing to do before `at` (Unix seconds).
    Wait { at: i64, why: Why },
}

/// Why an order is placed, or awaited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// There is no valid certificate (none yet, expired, or issued by another CA).
    NoCertificate,
    /// The renewal time came, on this basis.
    Renewal(Basis),
    /// Waiting out a back-off after failures.
    Backoff,
    /// Waiting for a rate limit to allow the order.
    Limit(Limit),
}

impl std::fmt::Display for Why {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Why::NoCertificate => f.write_str("no valid certificate"),
            Why::Renewal(Basis::Ari) => f.write_str("renewal (ARI window)"),
            Why::Renewal(Basis::Lifetime) => f.write_str("renewal (lifetime)"),
            Why::Backoff => f.write_str("back-off"),
            Why::Limit(limit) => write!(f, "rate limit: {limit}"),
        }
    }
}

/// A host's certificate as the schedule sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Current {
    pub not_after: i64,
    /// When it is to be renewed (computed once per certificate, with its jitter).
    pub renew_at: i64,
    pub basis: Basis,
}

/// Decides what to do about one host at `now`: order at once, or wait until when and why.
///
/// `backoff_until` is the end of a back-off in force after failures. The limits apply to every
/// order; an order due from an ARI window is exempt from the weekly one.
pub fn next(
    now: i64,
    current: Option<Current>,
    backoff_until: Option<i64>,
    ledger: &Ledger,
) -> Next {
    let (due, why) = match current {
        Some(c) if c.not_after > now => (c.renew_at, Why::Renewal(c.basis)),
        _ => (now, Why::NoCertificate),
    };
    let mut at = due.max(now);
    let mut reason = why;
    if let Some(until) = backoff_until.filter(|&u| u > at) {
        at = until;
        reason = Why::Backoff;
    }
    let ari = matches!(why, Why::Renewal(Basis::Ari));
    let (allowed, limit) = ledger.allowed_from(at, ari);
    if let Some(limit) = limit.filter(|_| allowed > at) {
        at = allowed;
        reason = Why::Limit(limit);
    }
    if at <= now {
        Next::Order(why)
    } else {
        Next::Wait { at, why: reason }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: i64 = 1_800_000_000;

    /// A window past expiry (a CA's mistake, or a hostile one) is pulled back before it.
    #[test]
    fn an_ari_window_never_reaches_past_expiry() {
        let not_after = T0 + 90 * DAY;
        for window in [
            (not_after + DAY, not_after + 2 * DAY),
            (T0 + 80 * DAY, i64::MAX),
            (i64::MAX - 1, i64::MAX),
        ] {
            for jitter in [0.0, 0.5, 0.999] {
                let (at, basis) = renewal_time(T0, not_after, Some(window), jitter);
                assert_eq!(basis, Basis::Ari);
                assert!(at <= not_after - 9 * DAY, "{window:?} {jitter}: {at}");
            }
        }
    }

    #[test]
    fn a_90_day_certificate_renews_with_a_third_of_its_life_left() {
        let (at, basis) = renewal_time(T0, T0 + 90 * DAY, None, 0.0);
        assert_eq!((at, basis), (T0 + 60 * DAY, Basis::Lifetime));
        // Jitter only ever brings it forward, by at most a tenth of the margin (3 days).
        let (earliest, _) = renewal_time(T0, T0 + 90 * DAY, None, 0.999_999);
        assert!(
            (T0 + 57 * DAY..T0 + 60 * DAY).contains(&earliest),
            "{earliest}"
        );
    }

    #[test]
    fn certificates_of_ten_days_or_less_renew_at_half_their_life() {
        for days in [6, 10] {
            let (at, _) = renewal_time(T0, T0 + days * DAY, None, 0.0);
            assert_eq!(at, T0 + days * DAY / 2, "{days} days");
        }
        let (at, _) = renewal_time(T0, T0 + 45 * DAY, None, 0.0);
        assert_eq!(at, T0 + 30 * DAY, "45 days: a third");
    }

    #[test]
    fn an_ari_window_wins_over_the_lifetime_and_is_sampled_uniformly() {
        let window = (T0 + 10 * DAY, T0 + 12 * DAY);
        assert_eq!(
            renewal_time(T0, T0 + 90 * DAY, Some(window), 0.0),
            (window.0, Basis::Ari)
        );
        assert_eq!(
            renewal_time(T0, T0 + 90 * DAY, Some(window), 0.5),
            (T0 + 11 * DAY, Basis::Ari)
        );
        // A window ending before it starts is no window.
        let (_, basis) = renewal_time(T0, T0 + 90 * DAY, Some((window.1, window.0)), 0.5);
        assert_eq!(basis, Basis::Lifetime);
    }

    #[test]
    fn back_off_goes_from_a_minute_to_six_hours_and_stays_there() {
        let schedule: Vec<i64> = (1..=7).map(|n| backoff(n, None, 0.5)).collect();
        assert_eq!(
            schedule,
            [
                MINUTE,
                10 * MINUTE,
                100 * MINUTE,
                6 * HOUR,
                6 * HOUR,
                6 * HOUR,
                6 * HOUR
            ]
        );
        assert_eq!(backoff(1, None, 0.0), 54);
        assert_eq!(backoff(1, None, 0.999_999), 65);
    }

    #[test]
    fn retry_after_is_honoured_when_longer_than_the_back_off() {
        assert_eq!(backoff(1, Some(3 * HOUR), 0.5), 3 * HOUR);
        assert_eq!(backoff(4, Some(30), 0.5), 6 * HOUR);
    }

    #[test]
    fn the_sixth_certificate_of_a_week_waits_for_the_oldest_to_age_out() {
        let mut ledger = Ledger::default();
        for day in 0..5 {
            ledger.record_issued(T0 + day * DAY);
        }
        let now = T0 + 5 * DAY;
        assert_eq!(
            ledger.allowed_from(now, false),
            (T0 + WEEK, Some(Limit::CertificatesPerWeek))
        );
        // Renewals inside an ARI window are exempt.
        assert_eq!(ledger.allowed_from(now, true), (now, None));
        // A week after the first, one is allowed again.
        assert_eq!(
            ledger.allowed_from(T0 + WEEK + 1, false),
            (T0 + WEEK + 1, None)
        );
    }

    #[test]
    fn five_failed_authorisations_in_an_hour_hold_the_name_back() {
        let mut ledger = Ledger::default();
        for minute in 0..4 {
            ledger.record_failed_authorization(T0 + minute * MINUTE);
        }
        assert_eq!(ledger.allowed_from(T0 + 5 * MINUTE, false).1, None);
        ledger.record_failed_authorization(T0 + 5 * MINUTE);
        assert_eq!(
            ledger.allowed_from(T0 + 6 * MINUTE, true),
            (T0 + HOUR, Some(Limit::FailedAuthorizationsPerHour))
        );
        ledger.forget(T0 + 2 * HOUR);
        assert!(ledger.failed_authorizations.is_empty());
    }

    #[test]
    fn a_host_without_a_certificate_orders_at_once() {
        assert_eq!(
            next(T0, None, None, &Ledger::default()),
            Next::Order(Why::NoCertificate)
        );
        // An expired one counts as none.
        let expired = Current {
            not_after: T0 - 1,
            renew_at: T0 - 10,
            basis: Basis::Lifetime,
        };
        assert_eq!(
            next(T0, Some(expired), None, &Ledger::default()),
            Next::Order(Why::NoCertificate)
        );
    }

    #[test]
    fn a_valid_certificate_waits_for_its_renewal_time() {
        let current = Current {
            not_after: T0 + 90 * DAY,
            renew_at: T0 + 60 * DAY,
            basis: Basis::Lifetime,
        };
        assert_eq!(
            next(T0, Some(current), None, &Ledger::default()),
            Next::Wait {
                at: T0 + 60 * DAY,
                why: Why::Renewal(Basis::Lifetime)
            }
        );
        assert_eq!(
            next(T0 + 60 * DAY, Some(current), None, &Ledger::default()),
            Next::Order(Why::Renewal(Basis::Lifetime))
        );
    }

    #[test]
    fn a_back_off_and_then_a_limit_push_the_order_later() {
        let mut ledger = Ledger::default();
        assert_eq!(
            next(T0, None, Some(T0 + MINUTE), &ledger),
            Next::Wait {
                at: T0 + MINUTE,
                why: Why::Backoff
            }
        );
        for i in 0..5 {
            ledger.record_failed_authorization(T0 - 30 * MINUTE + i);
        }
        assert_eq!(
            next(T0, None, Some(T0 + MINUTE), &ledger),
            Next::Wait {
                at: T0 + 30 * MINUTE,
                why: Why::Limit(Limit::FailedAuthorizationsPerHour)
            }
        );
    }
}
