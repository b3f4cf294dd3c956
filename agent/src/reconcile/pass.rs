//! One pass: the latest facts → the desired state → the plan → sozu. Nothing here waits on DNS,
//! a file or an evaluation; the only I/O is sozu's socket.

use std::time::Instant;

use tokio::time::Instant as TokioInstant;

use super::driver::{Agent, Work};
use super::Proxy;
use std::collections::BTreeMap;

use crate::desired::{self, Held};
use crate::plan::{self, Op, Outcome};
use crate::sources::CertSource;
use crate::state::Desired;
use crate::workspace::Workspace;

/// How a pass ended, for the loop's error policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PassOutcome {
    /// As far as it could go: converged, or some requests refused (each retried on its own).
    Done,
    /// sozu could not be reached, or the connection broke: the loop backs off.
    Unreachable,
}

/// A pass that sent at least this many requests was a bulk one (a start, a restarted sozu, a big
/// edit): the memory it used for the plan and its copies is handed back to the system afterwards.
const BULK_REQUESTS: u64 = 256;

impl<P: Proxy, C: CertSource> Agent<P, C> {
    pub(super) async fn pass(&mut self, work: Work) -> PassOutcome {
        self.counters.reconciles += 1;
        if work.resync {
            self.counters.resyncs += 1;
            self.sozu.invalidate();
        }
        let Some(workspace) = self.workspace.current.clone() else {
            self.publish();
            return PassOutcome::Done;
        };
        let started = Instant::now();
        let (mut want, mut held) =
            desired::build(&workspace, self.dns.resolved(), self.certs.last_good());
        step_took(started, "desired state built");

        // A pass for certificates alone trusts the shadow: a restart announces itself (a socket
        // event, a broken connection), so a rotation costs one request, not two.
        let only_certificates =
            !work.full && !work.check_generation && !work.resync && !work.hosts.is_empty();
        let sent_before = self.counters.sozu_requests;
        let synced = self
            .sync(&workspace, &mut want, &mut held, !only_certificates)
            .await;
        self.held = held;
        let outcome = match synced {
            Ok(refused) => {
                self.sozu_error = None;
                if refused {
                    self.counters.reconcile_errors += 1;
                } else {
                    self.last_converged = u64::try_from(self.clock.unix()).ok();
                }
                PassOutcome::Done
            }
            Err(e) => {
                self.counters.reconcile_errors += 1;
                self.sozu_error = Some(e);
                PassOutcome::Unreachable
            }
        };
        drop(want);
        let started = Instant::now();
        self.publish();
        step_took(started, "status published");
        // Last, once readiness is published: returning pages is not worth a later /readyz.
        if self.counters.sozu_requests - sent_before >= BULK_REQUESTS {
            let started = Instant::now();
            crate::memory::release_freed_memory();
            step_took(started, "freed memory returned");
        }
        outcome
    }

    /// Brings sozu to `want`: asks who it is (unless the shadow is trusted), reads its state when
    /// the shadow is gone, plans, holds back what waits for a retry, applies. Returns whether a
    /// request was refused; an error means sozu could not be reached.
    async fn sync(
        &mut self,
        workspace: &Workspace,
        want: &mut Desired,
        held: &mut BTreeMap<String, Held>,
        check_generation: bool,
    ) -> Result<bool, String> {
        if check_generation || !self.sozu.is_known() {
            let started = Instant::now();
            if self.sozu.check().await.map_err(|e| e.to_string())? {
                self.counters.sozu_reconnects += 1;
            }
            step_took(started, "sozu's generation checked");
        }
        let actual = self.sozu.actual().await.map_err(|e| e.to_string())?;
        let started = Instant::now();
        desired::adopt(want, held, workspace, actual);
        let planned = plan::plan(actual, want);
        step_took(started, "changes planned");
        let now = TokioInstant::now();
        let (ops, held) = self.refusals.hold_back(planned, now);
        if !held.is_empty() {
            tracing::debug!(requests = held.len(), "held back until their retry");
        }
        if ops.is_empty() {
            return Ok(!held.is_empty());
        }
        tracing::info!(requests = ops.len(), summary = ?plan::summary(&ops), "applying changes to sozu");
        let mut broken = None;
        let mut refused = !held.is_empty();
        for (op, outcome) in self.sozu.apply(ops).await {
            match outcome {
                Outcome::Applied => {
                    self.counters.sozu_requests += 1;
                    self.refusals.applied(&op);
                    if let Op::ReplaceCertificate { certificate, .. } = &op {
                        let at = u64::try_from(self.clock.unix()).unwrap_or(0);
                        self.certs.rotated(&certificate.names, at);
                        tracing::info!(fingerprint = %certificate.fingerprint,
                            names = ?certificate.names, "certificate replaced");
                    }
                }
                Outcome::Refused(reason) => {
                    self.counters.sozu_requests += 1;
                    tracing::warn!(request = %op.describe(), %reason, "sozu refused a request");
                    self.refusals.refused(&op, reason, now);
                    refused = true;
                }
                Outcome::Skipped => refused = true,
                Outcome::NotSent(reason) => {
                    broken.get_or_insert(format!("{}: {reason}", op.describe()));
                }
            }
        }
        match broken {
            Some(reason) => Err(reason),
            None => Ok(refused),
        }
    }
}

/// Logs at debug how long a step of a pass took: the breakdown the cold-start figures come from.
pub(super) fn step_took(started: Instant, step: &str) {
    tracing::debug!(elapsed_ms = started.elapsed().as_secs_f64() * 1e3, "{step}");
}
