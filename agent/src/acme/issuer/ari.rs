//! The issuer's renewal-information polls (ACME Renewal Information, RFC 9773): asked after the
//! CA's Retry-After, bounded, the window taken within bounds ([`crate::acme::renewal_policy::renewal_time`]).

use super::*;
use crate::acme::ca::RenewalInfo;

impl<C: Ca> Issuer<C> {
    /// Asks the CA for renewal information on every host's certificate whose poll is due.
    /// Returns when the next poll is due. A CA that does not answer one poll is not asked the
    /// others this round: one hung connection costs one request's deadline, not one per host.
    pub(super) async fn poll_renewal_info(&mut self, acme: &Acme, now: i64) -> i64 {
        let mut wake = now + 86_400;
        let Some(session) = self.session.clone() else {
            return wake;
        };
        if self.ari.get(&acme.directory) == Some(&false) {
            return wake;
        }
        let hosts: Vec<String> = self.hosts.iter().cloned().collect();
        let mut unavailable = false;
        for host in hosts {
            if self.in_flight.contains(&host) {
                continue;
            }
            let Some(issued) = self
                .records
                .get(&host)
                .and_then(|r| r.issued.as_ref())
                .filter(|i| i.directory == acme.directory)
            else {
                continue;
            };
            if let Some(at) = issued.ari_next_poll.filter(|&at| at > now) {
                wake = wake.min(at);
                continue;
            }
            let answer = if unavailable {
                RenewalInfo::Unavailable("the CA did not answer another poll".into())
            } else {
                // Bounded here too, whatever the session does: the loop waits on this.
                tokio::time::timeout(
                    RENEWAL_INFO_TIMEOUT,
                    session.renewal_info(&issued.chain_pem),
                )
                .await
                .unwrap_or_else(|_| {
                    RenewalInfo::Unavailable(format!(
                        "no answer within {} s",
                        RENEWAL_INFO_TIMEOUT.as_secs()
                    ))
                })
            };
            let jitter = self.rng.f64();
            let Some(record) = self.records.get_mut(&host) else {
                continue;
            };
            let Some(issued) = record.issued.as_mut() else {
                continue;
            };
            match answer {
                RenewalInfo::Window {
                    start,
                    end,
                    retry_after,
                } => {
                    self.ari.insert(acme.directory.clone(), true);
                    let window = (start, end);
                    if issued.ari_window != Some(window) {
                        let (at, basis) = renewal_policy::renewal_time(
                            issued.not_before,
                            issued.not_after,
                            Some(window),
                            jitter,
                        );
                        tracing::info!(host, renew_at = at, "renewal window from the CA (ARI)");
                        issued.ari_window = Some(window);
                        issued.renew_at = at;
                        issued.basis = basis;
                    }
                    let next = now
                        + i64::try_from(retry_after.as_secs())
                            .unwrap_or(ARI_RETRY)
                            .clamp(MIN_ARI_POLL, 86_400);
                    issued.ari_next_poll = Some(next);
                    wake = wake.min(next);
                }
                RenewalInfo::Unsupported => {
                    tracing::info!(directory = %acme.directory,
                        "the CA offers no renewal information (ARI): renewals follow the certificates' lifetimes");
                    self.ari.insert(acme.directory.clone(), false);
                    return wake;
                }
                RenewalInfo::Unavailable(e) => {
                    if !unavailable {
                        tracing::debug!(host, error = %e, "renewal information unavailable for now");
                    }
                    unavailable = true;
                    issued.ari_next_poll = Some(now + ARI_RETRY);
                    wake = wake.min(now + ARI_RETRY);
                }
            }
            let record = record.clone();
            if let Err(e) = self.save(&host, &record).await {
                tracing::error!(host, error = %e, "cannot store the renewal window");
            }
        }
        wake
    }
}
