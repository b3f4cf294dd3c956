//! What the agent knows of sozu: which sozu it is ([`Generation`]) and a shadow of what it
//! holds. The shadow is read from sozu itself at start, after any reconnect, when its workers
//! change and on every resync; in between it advances with each request sozu accepted, so a
//! rotation costs one request, not a read of sozu's whole state.

use std::collections::BTreeSet;

use crate::plan::state::{Actual, ClusterState};
use crate::plan::{self, Op, Outcome};
use crate::sozu::generation::{should_resync, Generation};
use crate::sozu::proxy::SendBeside;
use crate::sozu::SozuError;
use crate::sozu::{Delivered, Proxy};
use crate::workspace::ID_PREFIX;

pub struct SozuSync<P> {
    proxy: P,
    shadow: Option<Actual>,
    generation: Option<Generation>,
    /// Owned clusters a state file created since sozu's state was last read, and that nobody
    /// but the agent has changed since, as far as it knows: what the shadow holds of them is
    /// taken as read after each state file that touches them (see [`Self::remember_created`]).
    created: BTreeSet<String>,
}

impl<P: Proxy> SozuSync<P> {
    pub fn new(proxy: P) -> SozuSync<P> {
        SozuSync {
            proxy,
            shadow: None,
            generation: None,
            created: BTreeSet::new(),
        }
    }

    pub fn into_proxy(self) -> P {
        self.proxy
    }

    /// Forgets the shadow: the next pass reads sozu's state again.
    pub fn invalidate(&mut self) {
        self.shadow = None;
        self.created.clear();
    }

    /// True when a pass can plan without asking sozu anything first.
    pub fn is_known(&self) -> bool {
        self.shadow.is_some() && self.generation.is_some()
    }

    pub fn generation(&self) -> Option<&Generation> {
        self.generation.as_ref()
    }

    pub fn shadow(&self) -> Option<&Actual> {
        self.shadow.as_ref()
    }

    /// Asks sozu who it is. A sozu other than the one the shadow describes drops the shadow.
    /// Returns true when sozu changed under a shadow the agent had (a restart, a reconnect).
    pub async fn check(&mut self) -> Result<bool, SozuError> {
        let now = self.proxy.generation().await?;
        if !should_resync(self.generation.as_ref(), &now) {
            return Ok(false);
        }
        let changed = self.generation.is_some();
        if changed {
            tracing::info!(generation = %now, "sozu changed; reading its state again");
        }
        self.invalidate();
        self.generation = Some(now);
        Ok(changed)
    }

    /// The shadow, read from sozu first when there is none.
    pub async fn actual(&mut self) -> Result<&Actual, SozuError> {
        if self.shadow.is_none() {
            let started = std::time::Instant::now();
            let state = self.proxy.read_state().await?;
            tracing::debug!(
                elapsed_ms = started.elapsed().as_secs_f64() * 1e3,
                "sozu's state read"
            );
            self.shadow = Some(state);
        }
        Ok(self.shadow.get_or_insert_with(Actual::default))
    }

    /// A read of sozu's whole state that runs beside the loop (see [`super::resync`]).
    pub fn read_state_beside(&mut self) -> crate::sozu::proxy::ReadBeside {
        self.proxy.read_state_beside()
    }

    /// A resync's read, caught up with the requests sent during it, in place of the shadow.
    pub fn replace_shadow(&mut self, read: Actual) {
        if self.shadow.is_some() {
            self.shadow = Some(read);
        }
    }

    /// Whether a sozu listens at a socket not tried yet: see [`crate::sozu::socket`].
    pub async fn listening_again(&mut self) -> bool {
        self.proxy.listening_again().await
    }

    /// Reads cluster `id` from sozu again and puts it in the shadow in place of what the
    /// shadow held: the cluster changed behind the agent's back. `hosts` are the hosts whose
    /// frontends may route to it.
    pub async fn refresh_cluster(&mut self, id: &str, hosts: &[&str]) -> Result<(), SozuError> {
        let state = self.proxy.read_cluster(id.to_owned()).await?;
        if let Some(shadow) = &mut self.shadow {
            shadow.replace_cluster(id, state, hosts);
        }
        Ok(())
    }

    /// Sends `ops` and says what became of each, and whether it went inside a state file, and
    /// how many state files sozu loaded. Each request sozu applied advances the shadow; a broken
    /// connection drops both the shadow and the generation (whoever answers next may be a new
    /// sozu, and the request cut off may or may not have been applied).
    pub async fn apply(&mut self, ops: Vec<Op>) -> (Vec<(Op, Outcome, bool)>, usize) {
        let started = std::time::Instant::now();
        let delivered = self.proxy.apply(ops.clone()).await;
        log_sent(&ops, started, "changes sent");
        self.sent(ops, delivered).await
    }

    /// As [`Self::apply`], past a send beside the loop that is under way (see
    /// [`Proxy::apply_past`]).
    pub async fn apply_past(&mut self, ops: Vec<Op>) -> (Vec<(Op, Outcome, bool)>, usize) {
        let started = std::time::Instant::now();
        let delivered = self.proxy.apply_past(ops.clone()).await;
        log_sent(&ops, started, "changes sent past the change under way");
        self.sent(ops, delivered).await
    }

    /// Sends `ops` beside the loop, or hands them back when they go in bulk (see
    /// [`Proxy::send_beside`]). Once the send is over, [`Self::sent`] says what became of each.
    pub fn send_beside(&mut self, ops: Vec<Op>) -> Result<SendBeside, Vec<Op>> {
        self.proxy.send_beside(ops)
    }

    /// What became of `ops`, sent as `delivered` says, as [`Self::apply`] says it; the shadow
    /// advances with each request sozu applied.
    pub async fn sent(
        &mut self,
        ops: Vec<Op>,
        delivered: Delivered,
    ) -> (Vec<(Op, Outcome, bool)>, usize) {
        let mut broken = false;
        let done: Vec<(Op, Outcome, bool)> = ops
            .into_iter()
            .zip(delivered.outcomes)
            .zip(delivered.in_file)
            .map(|((op, outcome), in_file)| (op, outcome, in_file))
            .collect();
        let created = self.created_in_bulk(&done);
        for (op, outcome, _) in &done {
            match outcome {
                Outcome::Applied | Outcome::Closing(_) => {
                    if let Some(shadow) = &mut self.shadow {
                        plan::apply(shadow, op);
                    }
                }
                Outcome::NotSent(_) => broken = true,
                Outcome::Refused(_) | Outcome::Skipped => {}
            }
        }
        if broken {
            self.shadow = None;
            self.generation = None;
            self.created.clear();
        } else if delivered.files > 0 {
            // Clusters created before and changed by this change are taken as read again.
            let touched: BTreeSet<String> = done
                .iter()
                .filter(|(_, outcome, _)| matches!(outcome, Outcome::Applied))
                .filter_map(|(op, _, _)| cluster_of(op))
                .filter(|id| self.created.contains(*id))
                .map(str::to_owned)
                .collect();
            let mut remember = created;
            remember.extend(touched);
            if !remember.is_empty() {
                self.remember_created(remember).await;
            }
        }
        (done, delivered.files)
    }

    /// The owned clusters a state file created from nothing: ones the shadow, before `done`
    /// advances it, does not hold.
    fn created_in_bulk(&self, done: &[(Op, Outcome, bool)]) -> BTreeSet<String> {
        let Some(shadow) = &self.shadow else {
            return BTreeSet::new();
        };
        done.iter()
            .filter_map(|(op, outcome, in_file)| match op {
                Op::AddCluster { id, .. } => (*in_file
                    && matches!(outcome, Outcome::Applied)
                    && id.starts_with(ID_PREFIX)
                    && !shadow.clusters.contains(id))
                .then(|| id.clone()),
                // No other request creates a cluster.
                Op::AddListener { .. }
                | Op::PatchListener { .. }
                | Op::ActivateListener { .. }
                | Op::SetClientAuth { .. }
                | Op::SetListenerHsts { .. }
                | Op::SetListenerAnswers { .. }
                | Op::SwapFrontend { .. }
                | Op::SetHealthCheck { .. }
                | Op::RemoveHealthCheck { .. }
                | Op::AddBackend { .. }
                | Op::AddCertificate { .. }
                | Op::ReplaceCertificate { .. }
                | Op::RemoveCertificate { .. }
                | Op::RemoveFrontend(_)
                | Op::AddFrontend(_)
                | Op::AddStreamFrontend(_)
                | Op::RemoveStreamFrontend(_)
                | Op::DeactivateListener { .. }
                | Op::RemoveListener { .. }
                | Op::RemoveBackend { .. }
                | Op::CloseSessions { .. }
                | Op::RemoveCluster { .. } => None,
            })
            .collect()
    }

    /// Hands the proxy what the shadow now holds of the clusters bulk changes created, so that
    /// the next resync does not read them back one by one (see
    /// [`crate::sozu::SozuClient::remember_created`]). A start creates its clusters in one
    /// state file and their frontends, which sozu's cluster hash covers, in the next, once the
    /// certificates are read. Failing costs only that read.
    async fn remember_created(&mut self, ids: BTreeSet<String>) {
        let Some(shadow) = &self.shadow else {
            return;
        };
        // A cluster the change removed is forgotten.
        self.created.retain(|id| shadow.clusters.contains(id));
        let created: Vec<(String, ClusterState)> = ids
            .into_iter()
            .filter(|id| shadow.clusters.contains(id))
            .map(|id| {
                self.created.insert(id.clone());
                let state = shadow.cluster_state(&id);
                (id, state)
            })
            .collect();
        let (count, started) = (created.len(), std::time::Instant::now());
        match self.proxy.remember_created(created).await {
            Ok(()) => tracing::debug!(
                clusters = count,
                elapsed_ms = started.elapsed().as_secs_f64() * 1e3,
                "clusters created in bulk taken as read"
            ),
            Err(e) => tracing::debug!(error = %e,
                "could not take the clusters created in bulk as read; the next resync reads them"),
        }
    }
}

/// Logs at debug how long sending `ops` took.
fn log_sent(ops: &[Op], started: std::time::Instant, what: &str) {
    tracing::debug!(
        requests = ops.len(),
        elapsed_ms = started.elapsed().as_secs_f64() * 1e3,
        "{what}"
    );
}

/// The cluster whose configuration `op` changes, if any: what sozu's hash of it covers. Every
/// kind of request is named, so that a new one is placed here by whoever adds it.
fn cluster_of(op: &Op) -> Option<&str> {
    match op {
        Op::AddCluster { id, .. } | Op::RemoveCluster { id } => Some(id),
        Op::AddBackend { cluster_id, .. }
        | Op::RemoveBackend { cluster_id, .. }
        | Op::SetHealthCheck { cluster_id, .. }
        | Op::RemoveHealthCheck { cluster_id } => Some(cluster_id),
        Op::SwapFrontend { frontend, .. } => frontend.cluster_id.as_deref(),
        Op::AddFrontend(f) | Op::RemoveFrontend(f) => f.cluster_id.as_deref(),
        Op::AddStreamFrontend(f) | Op::RemoveStreamFrontend(f) => Some(&f.cluster_id),
        // Closing a backend's sessions changes no configuration; listeners and certificates
        // belong to no cluster.
        Op::CloseSessions { .. }
        | Op::AddListener { .. }
        | Op::PatchListener { .. }
        | Op::ActivateListener { .. }
        | Op::SetClientAuth { .. }
        | Op::SetListenerHsts { .. }
        | Op::SetListenerAnswers { .. }
        | Op::AddCertificate { .. }
        | Op::ReplaceCertificate { .. }
        | Op::RemoveCertificate { .. }
        | Op::DeactivateListener { .. }
        | Op::RemoveListener { .. } => None,
    }
}
