//! The latest facts, one tracker per source: what the loop decides from. Absorbing a fact says
//! whether it changes what sozu should hold (a pass is needed) or only what is shown.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

use crate::certs::CertError;
use crate::document::Counters;
use crate::plan::state::Certificate;
use crate::sources::NameFact;
use crate::workspace::Workspace;

/// The workspace the loop applies, and why the latest edit was refused.
#[derive(Debug, Default)]
pub struct WorkspaceTracker {
    pub current: Option<Arc<Workspace>>,
    pub last_error: Option<String>,
}

impl WorkspaceTracker {
    /// Takes a workspace that evaluated; `same` when it equals the live one. Returns whether
    /// the live workspace changed.
    pub fn take(&mut self, workspace: Arc<Workspace>, same: bool) -> bool {
        self.last_error = None;
        if same {
            return false;
        }
        self.current = Some(workspace);
        true
    }

    /// Takes an edit that was rejected: the last good workspace stays live.
    pub fn reject(&mut self, diagnostic: String, counters: &mut Counters) {
        counters.workspace_errors += 1;
        self.last_error = Some(diagnostic);
    }
}

/// Each upstream name's addresses in use, and the failure of its latest lookup.
#[derive(Debug, Default)]
pub struct DnsTracker {
    resolved: BTreeMap<String, Vec<IpAddr>>,
    errors: BTreeMap<String, String>,
}

impl DnsTracker {
    /// Returns whether the name's addresses changed.
    pub fn absorb(&mut self, fact: NameFact) -> bool {
        match fact.error {
            Some(error) => self.errors.insert(fact.name.clone(), error),
            None => self.errors.remove(&fact.name),
        };
        let addresses: Option<Vec<IpAddr>> = fact.addresses.map(|a| a.to_vec());
        if self.resolved.get(&fact.name) == addresses.as_ref() {
            return false;
        }
        match addresses {
            Some(addresses) => self.resolved.insert(fact.name, addresses),
            None => self.resolved.remove(&fact.name),
        };
        true
    }

    /// Forgets names no longer used.
    pub fn retain(&mut self, names: &BTreeSet<String>) {
        self.resolved.retain(|n, _| names.contains(n));
        self.errors.retain(|n, _| names.contains(n));
    }

    pub fn resolved(&self) -> &BTreeMap<String, Vec<IpAddr>> {
        &self.resolved
    }

    pub fn error(&self, name: &str) -> Option<&str> {
        self.errors.get(name).map(String::as_str)
    }
}

/// Each host's pair: the last good one, which is what serves, and why the one on disk is refused.
#[derive(Debug, Default)]
pub struct CertTracker {
    /// A served certificate with less than this many seconds left is flagged.
    warning: i64,
    /// The last pair of each host that loaded and validated: it keeps serving while the files on
    /// disk are missing, half-written or invalid.
    last_good: BTreeMap<String, Certificate>,
    /// The validity of each host's previous last good certificate (fingerprint, not before, not
    /// after): sozu may still serve it while its replacement waits (refused, or not sent yet),
    /// and the expiry alert needs the served certificate's lifetime, not the one on disk.
    replaced: BTreeMap<String, (Arc<str>, i64, i64)>,
    /// The current failure of each host's pair on disk (message, reason), so each is logged and
    /// counted once, and shown until fixed.
    failures: BTreeMap<String, (String, &'static str)>,
    /// Replacements per host: (count, Unix seconds of the last).
    rotations: BTreeMap<String, (u64, u64)>,
    /// When each served certificate enters its expiry warning (Unix seconds), by time: the next
    /// one to enter is the first entry, whatever the number of hosts.
    expiry: BTreeSet<(i64, String)>,
    /// Up to when (Unix seconds) certificates entering their warning have been reported.
    reported_until: Option<i64>,
}

/// Whether a pair changes what sozu should serve, or only what is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PairChange {
    None,
    /// The certificate to serve changed (a first one, or a new one).
    Serve,
    /// Only the shown failure changed: the last good certificate keeps serving.
    Shown,
}

impl CertTracker {
    /// `warning`: seconds before expiry from which a served certificate is flagged.
    pub fn new(warning: i64) -> CertTracker {
        CertTracker {
            warning,
            ..CertTracker::default()
        }
    }

    /// Takes a pair read from disk. A valid pair becomes the host's last good one; a refused pair
    /// leaves the last good one serving and is reported until fixed, logged and counted once per
    /// distinct failure rather than once per read.
    pub fn absorb(
        &mut self,
        host: &str,
        read: Result<Certificate, CertError>,
        counters: &mut Counters,
    ) -> PairChange {
        match read {
            Ok(certificate) => {
                let shown = self.failures.remove(host).is_some();
                if shown {
                    tracing::info!(host, "certificate pair valid again");
                }
                if self.last_good.get(host) == Some(&certificate) {
                    return if shown {
                        PairChange::Shown
                    } else {
                        PairChange::None
                    };
                }
                let at = certificate.not_after.saturating_sub(self.warning);
                if let Some(old) = self.last_good.insert(host.to_owned(), certificate) {
                    self.replaced.insert(
                        host.to_owned(),
                        (old.fingerprint, old.not_before, old.not_after),
                    );
                    self.expiry
                        .remove(&(old.not_after.saturating_sub(self.warning), host.to_owned()));
                }
                if self.reported_until.is_some_and(|until| at <= until) {
                    self.warn_expiring(host);
                }
                self.expiry.insert((at, host.to_owned()));
                PairChange::Serve
            }
            Err(e) => {
                let message = e.to_string();
                if self.failures.get(host).map(|(m, _)| m) == Some(&message) {
                    return PairChange::None;
                }
                tracing::warn!(host, reason = e.reason(), error = %message,
                    kept_serving = self.last_good.contains_key(host),
                    "certificate pair refused");
                counters.certificate_errors += 1;
                *counters
                    .certificate_errors_by_reason
                    .entry(e.reason().to_owned())
                    .or_default() += 1;
                self.failures.insert(host.to_owned(), (message, e.reason()));
                PairChange::Shown
            }
        }
    }

    /// Forgets hosts no longer routed.
    /// Forgets `gone`, hosts no route has any more: what an edit removed, looked up one by one
    /// rather than every host kept walked.
    pub fn forget(&mut self, gone: &[String]) {
        if gone.is_empty() {
            return;
        }
        for host in gone {
            self.last_good.remove(host);
            self.failures.remove(host);
            self.replaced.remove(host);
            self.rotations.remove(host);
        }
        self.expiry.retain(|(_, h)| !gone.contains(h));
    }

    pub fn last_good(&self) -> &BTreeMap<String, Certificate> {
        &self.last_good
    }

    /// The validity (not before, not after, Unix seconds) of the host's certificate of this
    /// fingerprint, when the agent read it: the last good one or the one it replaced.
    pub fn validity(&self, host: &str, fingerprint: &str) -> Option<(i64, i64)> {
        if let Some(c) = self
            .last_good
            .get(host)
            .filter(|c| *c.fingerprint == *fingerprint)
        {
            return Some((c.not_before, c.not_after));
        }
        self.replaced
            .get(host)
            .filter(|(f, _, _)| **f == *fingerprint)
            .map(|(_, from, to)| (*from, *to))
    }

    /// Why the host's pair on disk is refused: (message, reason).
    pub fn failure(&self, host: &str) -> Option<(&str, &'static str)> {
        self.failures.get(host).map(|(m, r)| (m.as_str(), *r))
    }

    /// A certificate naming `names` replaced another in sozu at `now` (Unix seconds).
    pub fn rotated(&mut self, names: &crate::certs::Names, now: u64) {
        for name in names {
            let entry = self.rotations.entry(name.clone()).or_default();
            entry.0 += 1;
            entry.1 = now;
        }
    }

    /// (count, Unix seconds of the last) of the host's replacements.
    pub fn rotations(&self, host: &str) -> Option<(u64, u64)> {
        self.rotations.get(host).copied()
    }

    /// Whether the host's served certificate is within its expiry warning at `now`.
    pub fn expiring_soon(&self, certificate: &Certificate, now: i64) -> bool {
        expiring_soon(certificate, now, self.warning)
    }

    /// The hosts whose served certificate entered its expiry warning since the last call (all
    /// of those within it, the first time), each logged once.
    pub fn entered_warning(&mut self, now: i64) -> Vec<String> {
        let since = self
            .reported_until
            .map_or(i64::MIN, |t| t.saturating_add(1));
        self.reported_until = Some(now);
        let hosts: Vec<String> = self
            .expiry
            .range((since, String::new())..)
            .take_while(|(at, _)| *at < now)
            .map(|(_, host)| host.clone())
            .collect();
        for host in &hosts {
            self.warn_expiring(host);
        }
        hosts
    }

    fn warn_expiring(&self, host: &str) {
        if let Some(c) = self.last_good.get(host) {
            tracing::warn!(host, fingerprint = %c.fingerprint, not_after = c.not_after,
                "the certificate served expires soon; its renewal is overdue");
        }
    }

    /// When (Unix seconds) the next served certificate enters its expiry warning.
    pub fn next_expiry_warning(&self, now: i64) -> Option<i64> {
        self.expiry
            .range((now, String::new())..)
            .map(|(at, _)| *at)
            .find(|&at| at >= now)
    }
}

/// Whether `certificate` has less than `warning` seconds left at `now`.
pub fn expiring_soon(certificate: &Certificate, now: i64, warning: i64) -> bool {
    certificate.not_after.saturating_sub(now) < warning
}
