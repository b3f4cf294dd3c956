//! What comes into the state: a fact from a source, or one of the loop's timers (a resync, a
//! refused request's retry, an expiry warning, the issuer's progress). Each is taken into the
//! trackers, and what it asks of the next pass noted in a [`NextPass`]; nothing here talks to
//! sozu but a resync's read, started beside the loop.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{NextPass, Prepared, Reconciler};
use crate::plan::edit::Edit;
use crate::reconcile::backends::Drift;
use crate::reconcile::resync::{self, Reading};
use crate::reconcile::trackers::PairChange;
use crate::sources::sozu_events::SozuEvent;
use crate::sources::Fact;
use crate::sozu::{Proxy, SozuError};

impl<P: Proxy> Reconciler<P> {
    /// Takes one fact into the trackers and notes what it asks of the next pass.
    pub fn absorb(&mut self, fact: Fact, next: &mut NextPass) {
        match fact {
            Fact::Workspace(Ok(workspace)) => {
                // Not prepared beside the loop (a test's fact): worked out here.
                let edit = Edit::prepare(self.workspace.current.clone(), workspace);
                self.absorb_edit(edit, next);
            }
            Fact::Edit(edit) => {
                let edit = if edit.follows(self.workspace.current.as_ref()) {
                    *edit
                } else {
                    Edit::prepare(self.workspace.current.clone(), edit.workspace)
                };
                self.absorb_edit(edit, next);
            }
            Fact::Workspace(Err(diagnostic)) => {
                let first = diagnostic
                    .lines()
                    .find(|l| !l.trim().is_empty())
                    .unwrap_or("")
                    .to_owned();
                self.workspace.reject(diagnostic, &mut self.counters);
                self.events.emit(
                    crate::document::EventKind::WorkspaceRejected,
                    None,
                    true,
                    format!("workspace edit rejected, the last good one stays live: {first}"),
                );
                next.publish = true;
            }
            Fact::Dns(fact) => {
                let name = fact.name.clone();
                if self.dns.absorb(fact) {
                    self.announce_name(&name);
                    next.names.insert(name.clone());
                }
                self.stale_views.names.insert(name);
                next.publish = true;
            }
            Fact::Pairs(pairs) => {
                let started = std::time::Instant::now();
                let count = pairs.len();
                for (host, read) in pairs {
                    match self.certs.absorb(&host, read, &mut self.counters) {
                        PairChange::Serve => {
                            next.hosts.insert(host);
                        }
                        PairChange::Shown => {
                            self.stale_views.hosts.insert(host);
                            next.publish = true;
                        }
                        PairChange::None => {}
                    }
                }
                // A resync reads every pair again: this is its share of the loop's time.
                tracing::debug!(
                    pairs = count,
                    elapsed_ms = started.elapsed().as_secs_f64() * 1e3,
                    "certificate pairs taken up"
                );
            }
            Fact::ClientAuth(files) => {
                self.client_auth.absorb(*files);
                next.publish = true;
                next.client_auth = true;
            }
            Fact::PolicyFiles(reads) => {
                for (path, reason) in reads
                    .users
                    .iter()
                    .map(|(p, r)| (p, r.as_ref().err()))
                    .chain(reads.pages.iter().map(|(p, r)| (p, r.as_ref().err())))
                    .filter_map(|(p, r)| Some((p, r?)))
                {
                    tracing::warn!(file = %path.display(), %reason,
                        "a policy file is refused; its last good version stays");
                }
                self.policy_files.absorb(*reads);
                next.publish = true;
                next.policy_files = true;
            }
            Fact::SozuSocket => next.check_generation = true,
            Fact::Sozu(event) => self.absorb_event(event, next),
            Fact::WatchOverflow => {
                self.counters.watch_overflows += 1;
                next.publish = true;
            }
        }
    }

    /// Takes one of sozu's events: backend health and drains go to the status; a change the
    /// agent did not make to what it owns is repaired by the next pass.
    fn absorb_event(&mut self, event: SozuEvent, next: &mut NextPass) {
        let cluster_of = |backend_id: &str| {
            self.model
                .as_ref()
                .and_then(|m| m.cluster_of_backend(backend_id))
        };
        match event {
            SozuEvent::BackendUp { backend_id } => {
                if self.backends.health(&backend_id, true) {
                    self.stale_views.clusters.extend(cluster_of(&backend_id));
                }
            }
            SozuEvent::BackendDown { backend_id } => {
                if self.backends.health(&backend_id, false) {
                    self.stale_views.clusters.extend(cluster_of(&backend_id));
                }
            }
            SozuEvent::NoAvailableBackends { cluster_id } => {
                self.backends.cluster_available(&cluster_id, false);
                self.stale_views.clusters.insert(cluster_id);
            }
            SozuEvent::ClusterRecovered { cluster_id } => {
                self.backends.cluster_available(&cluster_id, true);
                self.stale_views.clusters.insert(cluster_id);
            }
            SozuEvent::BackendDrained { backend_id } => {
                if self.backends.drained(&backend_id) {
                    self.stale_views.clusters.extend(cluster_of(&backend_id));
                }
            }
            SozuEvent::Changed(change) => match self.ledger.reported(&change, Instant::now()) {
                Drift::None => return,
                Drift::Cluster(id) => {
                    tracing::info!(cluster = %id, change = %change.kind,
                        "a cluster of the agent's changed in sozu behind its back; repairing it");
                    let host = self
                        .model
                        .as_ref()
                        .and_then(|m| m.route_by_id(&id))
                        .map(|r| r.host.clone());
                    self.events.emit(
                        crate::document::EventKind::DriftRepaired,
                        host.as_deref(),
                        false,
                        format!("{id} changed in sozu behind the agent's back ({}): read again and repaired", change.kind),
                    );
                    self.counters.drift_repairs += 1;
                    next.drifted.insert(id);
                }
                Drift::Everything => {
                    tracing::info!(change = %change.kind,
                        "sozu's certificates or state changed behind the agent's back; reading it again");
                    self.events.emit(
                        crate::document::EventKind::DriftRepaired,
                        None,
                        false,
                        format!("sozu's certificates or state changed behind the agent's back ({}): reading it all again", change.kind),
                    );
                    self.counters.drift_repairs += 1;
                    next.resync = true;
                }
            },
            SozuEvent::StreamBroken => {
                self.counters.event_stream_breaks += 1;
                next.check_generation = true;
            }
        }
        next.publish = true;
    }

    /// A new workspace is live: how many routes, and how many came and went.
    /// Takes a workspace that evaluated, with what it changes from the one the loop holds
    /// (`edit` follows it).
    fn absorb_edit(&mut self, edit: Edit, next: &mut NextPass) {
        let started = std::time::Instant::now();
        let Edit {
            workspace,
            previous,
            same,
            scope,
            added,
            removed,
            upstream_names,
            gone_hosts,
            index,
        } = edit;
        next.publish = true;
        if !self.workspace.take(workspace.clone(), same) {
            return;
        }
        self.announce_workspace(added, removed);
        next.workspace = true;
        // The status of the routes that differ is built again (every route's when what they
        // share changed), here rather than only from the pass's scope: a pass that breaks off
        // after updating the model publishes too.
        self.stale_views.scope(&scope);
        // The names are few: those the workspace does not use are dropped. The hosts are as
        // many as the routes: those the previous workspace had and this one has not are
        // forgotten one by one (before the first workspace there are none).
        self.dns.retain(&upstream_names);
        self.certs.forget(&gone_hosts);
        // For the model, while it holds the workspace the scope was worked out against: edits
        // taken up between two passes add up.
        self.prepared = match (self.prepared.take(), previous) {
            (Some(mut prepared), Some(previous)) if Arc::ptr_eq(&prepared.workspace, &previous) => {
                prepared.scope.extend(scope);
                prepared.workspace = workspace;
                prepared.index = index;
                Some(prepared)
            }
            (_, Some(base)) => Some(Prepared {
                base,
                scope,
                workspace,
                index,
            }),
            (_, None) => None,
        };
        super::step_took(started, "workspace edit taken up");
    }

    fn announce_workspace(&self, added: usize, removed: usize) {
        let Some(workspace) = &self.workspace.current else {
            return;
        };
        let now = workspace.routes.len();
        self.events.emit(
            crate::document::EventKind::WorkspaceAccepted,
            None,
            false,
            format!(
                "workspace applied: {} route{} in zone {} ({added} added, {removed} removed)",
                now,
                if now == 1 { "" } else { "s" },
                workspace.zone
            ),
        );
    }

    /// An upstream name's addresses changed; the host is named when one host's routes alone
    /// use the name.
    fn announce_name(&self, name: &str) {
        let addresses = self
            .dns
            .resolved()
            .get(name)
            .map(|a| {
                a.iter()
                    .map(|ip| ip.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default();
        let hosts: BTreeSet<&str> = self
            .model
            .iter()
            .flat_map(|m| m.routes_of_name(name).map(|r| r.host.as_str()))
            .collect();
        let host = match hosts.len() {
            1 => hosts.first().copied(),
            _ => None,
        };
        self.events.emit(
            crate::document::EventKind::DnsChanged,
            host,
            false,
            if addresses.is_empty() {
                format!("{name} no longer resolves to any address in use")
            } else {
                format!("{name} now resolves to {addresses}")
            },
        );
    }

    /// A resync: sozu's state read beside the loop when the shadow is known (see
    /// [`crate::reconcile::resync`]); otherwise the next pass reads it, as it must anyway.
    pub fn start_resync(&mut self, next: &mut NextPass) {
        if self.reading.is_some() {
            return;
        }
        if !self.sozu.is_known() {
            next.check_generation = true;
            return;
        }
        self.reading = Some(Reading {
            read: self.sozu.read_state_beside(),
            journal: Vec::new(),
            generation: self.sozu.generation().cloned(),
            started: std::time::Instant::now(),
        });
    }

    /// Whether a resync's read of sozu is under way beside the loop.
    pub fn reading(&self) -> bool {
        self.reading.is_some()
    }

    /// Awaits the resync's read under way; pending for ever when there is none, so that a
    /// `select!` branch on it can be guarded by [`Reconciler::reading`].
    pub async fn read_finished(&mut self) -> Result<crate::sozu::proxy::StateRead, SozuError> {
        Reading::finished(&mut self.reading).await
    }

    /// A resync's read came back: compared with the shadow once the requests sent meanwhile
    /// are applied to it; what differs is planned, and nothing else.
    pub fn read_back(
        &mut self,
        read: Result<crate::sozu::proxy::StateRead, SozuError>,
        next: &mut NextPass,
    ) {
        if let Some(reading) = self.reading.take() {
            self.compare_read(reading, read, next);
        }
    }

    fn compare_read(
        &mut self,
        reading: Reading,
        read: Result<crate::sozu::proxy::StateRead, SozuError>,
        next: &mut NextPass,
    ) {
        let read_ms = reading.started.elapsed().as_secs_f64() * 1e3;
        let read = match read {
            Ok(read) => read,
            Err(e) => {
                self.counters.sozu_read_failures += 1;
                tracing::warn!(error = %e,
                    "a resync could not read sozu's state; rotations and edits go on from what \
                     the agent knows");
                if self.read_error.is_none() {
                    self.events.emit(
                        crate::document::EventKind::Sozu,
                        None,
                        true,
                        format!("sozu's state could not be read for a resync: {e}"),
                    );
                }
                self.read_error = Some(e.to_string());
                // A broken connection may be a new sozu: the next pass asks.
                next.check_generation = !e.is_refusal();
                next.publish = true;
                return;
            }
        };
        if !self.sozu.is_known() || self.sozu.generation() != reading.generation.as_ref() {
            tracing::debug!("a resync's read of a sozu the agent no longer talks to, dropped");
            return;
        }
        let started = std::time::Instant::now();
        self.counters.resync_worker_queries += read.worker_queries;
        self.counters.resync_frontend_listings += read.frontend_listings;
        let unread = read.unread;
        let mut read = resync::caught_up(read.actual, &reading.journal);
        let differs = self
            .sozu
            .shadow()
            .map(|shadow| resync::differences(shadow, &read, &unread))
            .unwrap_or_else(crate::plan::Scope::everything);
        self.counters.resyncs += 1;
        // The counters change: published, with no route's status built again.
        next.publish = true;
        self.read_error = None;
        if differs.is_empty() {
            tracing::debug!(
                read_ms,
                requests_meanwhile = reading.journal.len(),
                compared_ms = started.elapsed().as_secs_f64() * 1e3,
                "resync: sozu holds what the agent expects"
            );
            // Freed beside the loop: at 10,000 routes a whole state's allocations took the
            // loop some 20–30 ms after each unchanged resync, and a rotation waited for it.
            tokio::task::spawn_blocking(move || drop(read));
            return;
        }
        tracing::info!(
            read_ms,
            everything = differs.everything,
            hosts = differs.hosts.len(),
            clusters = differs.clusters.len(),
            "resync: sozu differs from what the agent expects; planning what differs"
        );
        // The parts left unread are the shadow's, in the read that replaces it.
        if let Some(shadow) = self.sozu.shadow() {
            resync::fill_unread(&mut read, &unread, shadow);
        }
        self.sozu.replace_shadow(read);
        next.differs.extend(differs);
    }

    /// How long until the next served certificate enters its expiry warning.
    pub fn next_expiry_warning(&self) -> Option<Duration> {
        let now = self.clock.unix();
        let at = self.certs.next_expiry_warning(now)?;
        let wait = u64::try_from(at.saturating_sub(now)).unwrap_or(0) + 1;
        Some(Duration::from_secs(wait))
    }

    /// A served certificate entered its expiry warning: the flag is part of each route's
    /// status, so every route's is built again (a resync rebuilds none).
    pub fn expiry_warning_reached(&mut self, next: &mut NextPass) {
        self.stale_views.all = true;
        next.publish = true;
    }

    /// When the earliest request sozu refused may be sent again.
    pub fn next_refusal_retry(&self) -> Option<Instant> {
        self.refusals.next_retry()
    }

    /// The refused requests whose retry time came at `now` are planned again.
    pub fn refusals_due(&self, now: Instant, next: &mut NextPass) {
        next.retry.extend(self.refusals.due(now));
    }

    /// Reads the issuer's progress again, when it changed: readiness follows the issuer giving
    /// up on a host.
    pub fn follow_issuer(&mut self, next: &mut NextPass) {
        if let Some((issuer, seen, stalled)) = &mut self.issuer {
            let version = issuer.version();
            if version != *seen {
                *seen = version;
                *stalled = issuer.stalled();
                next.publish = true;
            }
        }
    }

    /// Whether a sozu listens at a socket the agent has not tried yet (see
    /// [`crate::sozu::socket`]).
    pub async fn sozu_listening_again(&mut self) -> bool {
        self.sozu.listening_again().await
    }
}
