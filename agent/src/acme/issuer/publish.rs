//! What the issuer shows of each host ([`crate::document::IssuerStatus`]), published through its
//! handle for `/v1/state`, `status` and `/metrics`.

use super::*;

impl<C: Ca> Issuer<C> {
    pub(super) fn publish(&self) {
        let now = self.now();
        let directory = self
            .acme
            .as_ref()
            .map(|a| a.directory.clone())
            .unwrap_or_default();
        let hosts = self
            .hosts
            .iter()
            .map(|host| {
                let default = HostRecord::default();
                let record = self.records.get(host).unwrap_or(&default);
                let counts = self.counts.get(host).cloned().unwrap_or_default();
                let issued = record.issued.as_ref().filter(|i| i.directory == directory);
                let valid = issued.filter(|i| i.not_after > now);
                let mut backoff = record
                    .backoff_until
                    .filter(|&until| until > now)
                    .map(|until| Backoff {
                        reason: record.backoff_reason.clone().unwrap_or_default(),
                        until,
                        failures: record.failures,
                    });
                if let (None, Some(acme)) = (&backoff, &self.acme) {
                    if let Next::Wait {
                        at,
                        why: Why::Limit(limit),
                    } = self.next(host, acme, now)
                    {
                        backoff = Some(Backoff {
                            reason: format!("rate_limit: {limit}"),
                            until: at,
                            failures: record.failures,
                        });
                    }
                }
                let state = if self.in_flight.contains(host) {
                    "ordering"
                } else if backoff.is_some() {
                    "backing_off"
                } else if valid.is_some() {
                    "valid"
                } else {
                    "waiting"
                };
                let status = HostStatus {
                    state: state.into(),
                    fingerprint: valid.map(|i| i.fingerprint.clone()),
                    valid_until: valid.map(|i| i.not_after),
                    renewal_due: valid.map(|i| i.renew_at),
                    renewal_basis: valid.map(|i| match i.basis {
                        renewal_policy::Basis::Ari => RenewalBasis::Ari,
                        renewal_policy::Basis::Lifetime => RenewalBasis::Lifetime,
                    }),
                    orders_placed: counts.placed,
                    certificates_issued: counts.issued,
                    orders_failed: counts.failed,
                    backoff,
                    last_error: counts.last_error,
                    last_order_seconds: counts.last_order_seconds,
                };
                (host.clone(), status)
            })
            .collect();
        let status = IssuerStatus {
            directory,
            account_ready: self.session.is_some(),
            ari_supported: self
                .acme
                .as_ref()
                .and_then(|a| self.ari.get(&a.directory).copied()),
            profile_note: self.session.as_ref().and_then(|s| s.profile_note()),
            last_error: self.ca_error.clone(),
            hosts,
        };
        self.options.status.publish(status);
    }
}
