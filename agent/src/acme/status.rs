//! What the issuer shows: per host, the certificate's validity, when it renews and why, the
//! orders placed and failed by reason, and a back-off in force with its reason and end. Kept in a
//! shareable [`IssuerHandle`]; `/v1/state` carries a snapshot under `issuer`, `private-ingress
//! status` prints [`table`], and `/metrics` gets [`write_metrics`]. None of it holds a key or a
//! credential: only names, times, counts and messages built from them.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, RwLock};

use serde::{Deserialize, Serialize};

use super::policy::Basis;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct IssuerStatus {
    /// The ACME directory orders go to.
    pub directory: String,
    /// The account is known to the CA and stored.
    pub account_ready: bool,
    /// Whether the CA offers ACME Renewal Information; unknown until asked.
    pub ari_supported: Option<bool>,
    /// How the configured profile was handled when the CA does not offer it.
    pub profile_note: Option<String>,
    /// A failure that holds back every host (the account, the state directory).
    pub last_error: Option<String>,
    pub hosts: BTreeMap<String, HostStatus>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HostStatus {
    /// `valid` (served, renewal scheduled), `ordering`, `waiting` (no certificate yet, an order
    /// held back) or `backing_off`.
    pub state: String,
    pub fingerprint: Option<String>,
    /// notAfter of the certificate in hand, Unix seconds.
    pub valid_until: Option<i64>,
    /// When it is to be renewed, Unix seconds, and why then.
    pub renewal_due: Option<i64>,
    pub renewal_basis: Option<Basis>,
    /// Orders placed since the agent started.
    pub orders_placed: u64,
    pub certificates_issued: u64,
    /// Failed orders since the agent started, by reason.
    pub orders_failed: BTreeMap<String, u64>,
    pub backoff: Option<Backoff>,
    pub last_error: Option<String>,
    /// How long the last successful order took, from placing it to the validated chain.
    pub last_order_seconds: Option<f64>,
}

/// No order for a host before `until`, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Backoff {
    pub reason: String,
    /// Unix seconds.
    pub until: i64,
    /// Consecutive failures so far (0 for a rate limit reached without a failure).
    pub failures: u32,
}

/// The issuer's status, shared with the admin server, and how many times it was published.
#[derive(Debug, Clone, Default)]
pub struct IssuerHandle(Arc<RwLock<(u64, Option<IssuerStatus>)>>);

impl IssuerHandle {
    pub fn snapshot(&self) -> Option<IssuerStatus> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).1.clone()
    }

    /// Counts the changes: a body rendered from the status is rendered again when it moved.
    pub fn version(&self) -> u64 {
        self.0.read().unwrap_or_else(|p| p.into_inner()).0
    }

    pub fn publish(&self, status: IssuerStatus) {
        let mut slot = self.0.write().unwrap_or_else(|p| p.into_inner());
        if slot.1.as_ref() != Some(&status) {
            slot.0 += 1;
            slot.1 = Some(status);
        }
    }
}

/// The issuer's section of `private-ingress status`: one row per host.
pub fn table(status: &IssuerStatus, now: i64) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "acme: {}   account: {}   renewal info (ARI): {}",
        status.directory,
        if status.account_ready {
            "ready"
        } else {
            "not yet"
        },
        match status.ari_supported {
            Some(true) => "offered",
            Some(false) => "not offered (renewal at a fraction of the lifetime)",
            None => "not asked yet",
        }
    );
    if let Some(note) = &status.profile_note {
        let _ = writeln!(out, "profile: {note}");
    }
    if let Some(e) = &status.last_error {
        let _ = writeln!(out, "acme error: {e}");
    }
    let headers = [
        "HOST",
        "STATE",
        "VALID UNTIL",
        "RENEWAL DUE",
        "ORDERS",
        "FAILED",
        "BACK-OFF",
        "LAST ERROR",
    ];
    let rows: Vec<[String; 8]> = status
        .hosts
        .iter()
        .map(|(host, h)| {
            let failed: u64 = h.orders_failed.values().sum();
            let failed = if failed == 0 {
                "0".to_owned()
            } else {
                let reasons: Vec<String> = h
                    .orders_failed
                    .iter()
                    .map(|(r, n)| format!("{r}={n}"))
                    .collect();
                format!("{failed} ({})", reasons.join(","))
            };
            [
                host.clone(),
                h.state.clone(),
                h.valid_until.map_or("-".into(), datetime),
                match (h.renewal_due, h.renewal_basis) {
                    (Some(t), Some(basis)) => format!("{} ({basis})", datetime(t)),
                    (Some(t), None) => datetime(t),
                    _ => "-".into(),
                },
                h.orders_placed.to_string(),
                failed,
                match &h.backoff {
                    Some(b) => format!(
                        "{} until {} ({})",
                        b.reason,
                        datetime(b.until),
                        in_words(b.until - now)
                    ),
                    None => "-".into(),
                },
                h.last_error.clone().unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    crate::status::write_table(&mut out, &headers, &rows);
    out
}

fn datetime(unix: i64) -> String {
    match time::OffsetDateTime::from_unix_timestamp(unix) {
        Ok(t) => format!(
            "{:04}-{:02}-{:02} {:02}:{:02}Z",
            t.year(),
            u8::from(t.month()),
            t.day(),
            t.hour(),
            t.minute()
        ),
        Err(_) => unix.to_string(),
    }
}

fn in_words(seconds: i64) -> String {
    match seconds {
        s if s <= 0 => "now".into(),
        s if s < 120 => format!("in {s} s"),
        s if s < 2 * 3600 => format!("in {} min", s / 60),
        s => format!("in {} h", s / 3600),
    }
}

/// The issuer's families, one series per host, appended to the `/metrics` text.
pub fn write_metrics(out: &mut String, status: &IssuerStatus) {
    use crate::api::metrics::{header, sample};
    let hosts = &status.hosts;
    if hosts.is_empty() {
        return;
    }
    type Value = fn(&HostStatus) -> Option<i64>;
    let gauges: [(&str, &str, Value); 4] = [
        (
            "private_ingress_acme_certificate_not_after_seconds",
            "notAfter of the certificate the issuer holds for the host, Unix seconds",
            |h| h.valid_until,
        ),
        (
            "private_ingress_acme_renewal_due_seconds",
            "When the host's certificate is to be renewed, Unix seconds",
            |h| h.renewal_due,
        ),
        (
            "private_ingress_acme_renewal_from_ari",
            "1 when the renewal time comes from the CA's renewal information (ARI), 0 when from the lifetime",
            |h| h.renewal_due.map(|_| i64::from(h.renewal_basis == Some(Basis::Ari))),
        ),
        (
            "private_ingress_acme_backoff_until_seconds",
            "End of the back-off (or rate-limit hold) in force for the host, Unix seconds; 0 when none",
            |h| Some(h.backoff.as_ref().map_or(0, |b| b.until)),
        ),
    ];
    for (name, help, value) in gauges {
        let values: Vec<(&str, i64)> = hosts
            .iter()
            .filter_map(|(host, h)| value(h).map(|v| (host.as_str(), v)))
            .collect();
        if !values.is_empty() {
            header(out, name, "gauge", help);
            for (host, v) in values {
                sample(out, name, &[("host", host)], v);
            }
        }
    }
    let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    type Count = fn(&HostStatus) -> u64;
    let counters: [(&str, &str, Count); 2] = [
        (
            "private_ingress_acme_orders_total",
            "ACME orders placed for the host since the agent started",
            |h| h.orders_placed,
        ),
        (
            "private_ingress_acme_certificates_issued_total",
            "Certificates issued for the host since the agent started",
            |h| h.certificates_issued,
        ),
    ];
    for (name, help, value) in counters {
        header(out, name, "counter", help);
        for (host, h) in hosts {
            sample(out, name, &[("host", host)], count(value(h)));
        }
    }
    let failures: Vec<(&str, &str, u64)> = hosts
        .iter()
        .flat_map(|(host, h)| {
            h.orders_failed
                .iter()
                .map(move |(reason, n)| (host.as_str(), reason.as_str(), *n))
        })
        .collect();
    if !failures.is_empty() {
        let name = "private_ingress_acme_order_failures_total";
        header(
            out,
            name,
            "counter",
            "Failed ACME orders since the agent started, by host and reason",
        );
        for (host, reason, n) in failures {
            sample(out, name, &[("host", host), ("reason", reason)], count(n));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> IssuerStatus {
        let mut hosts = BTreeMap::new();
        hosts.insert(
            "a.in.example.org".to_owned(),
            HostStatus {
                state: "valid".into(),
                valid_until: Some(1_900_000_000),
                renewal_due: Some(1_890_000_000),
                renewal_basis: Some(Basis::Lifetime),
                orders_placed: 1,
                certificates_issued: 1,
                ..HostStatus::default()
            },
        );
        hosts.insert(
            "b.in.example.org".to_owned(),
            HostStatus {
                state: "backing_off".into(),
                orders_placed: 2,
                orders_failed: BTreeMap::from([("dns_update".to_owned(), 2)]),
                backoff: Some(Backoff {
                    reason: "dns_update".into(),
                    until: 1_800_000_600,
                    failures: 2,
                }),
                last_error: Some("NOTAUTH".into()),
                ..HostStatus::default()
            },
        );
        IssuerStatus {
            directory: "https://ca/dir".into(),
            account_ready: true,
            ari_supported: Some(false),
            hosts,
            ..IssuerStatus::default()
        }
    }

    #[test]
    fn the_table_shows_renewal_time_and_reason_and_the_back_off() {
        let text = table(&sample(), 1_800_000_000);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].contains("not offered"), "{text}");
        let a = lines.iter().find(|l| l.starts_with("a.in")).unwrap();
        assert!(
            a.contains("2029-11-22 ") && a.contains("(lifetime)"),
            "{text}"
        );
        let b = lines.iter().find(|l| l.starts_with("b.in")).unwrap();
        assert!(
            b.contains("2 (dns_update=2)")
                && b.contains("dns_update until")
                && b.contains("in 10 min"),
            "{text}"
        );
        assert!(b.ends_with("NOTAUTH"), "{text}");
    }

    #[test]
    fn metrics_carry_one_series_per_host() {
        let mut text = String::new();
        write_metrics(&mut text, &sample());
        assert!(
            text.contains(
                "private_ingress_acme_renewal_due_seconds{host=\"a.in.example.org\"} 1890000000"
            ),
            "{text}"
        );
        assert!(text.contains("private_ingress_acme_order_failures_total{host=\"b.in.example.org\",reason=\"dns_update\"} 2"), "{text}");
        assert!(
            text.contains(
                "private_ingress_acme_backoff_until_seconds{host=\"b.in.example.org\"} 1800000600"
            ),
            "{text}"
        );
    }
}
