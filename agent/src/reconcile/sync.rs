//! What the agent knows of sozu: which sozu it is ([`Generation`]) and a shadow of what it
//! holds. The shadow is read from sozu itself at start, after any reconnect, when its workers
//! change and on every resync; in between it advances with each request sozu accepted, so a
//! rotation costs one request, not a read of sozu's whole state.

use crate::plan::{self, Op, Outcome};
use crate::sozu::generation::{should_resync, Generation};
use crate::sozu::Proxy;
use crate::sozu::SozuError;
use crate::sozu_state::Actual;

pub struct SozuSync<P> {
    proxy: P,
    shadow: Option<Actual>,
    generation: Option<Generation>,
}

impl<P: Proxy> SozuSync<P> {
    pub fn new(proxy: P) -> SozuSync<P> {
        SozuSync {
            proxy,
            shadow: None,
            generation: None,
        }
    }

    pub fn into_proxy(self) -> P {
        self.proxy
    }

    /// Forgets the shadow: the next pass reads sozu's state again.
    pub fn invalidate(&mut self) {
        self.shadow = None;
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
        self.shadow = None;
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
        tracing::debug!(
            requests = ops.len(),
            elapsed_ms = started.elapsed().as_secs_f64() * 1e3,
            "changes sent"
        );
        let mut broken = false;
        let done: Vec<(Op, Outcome, bool)> = ops
            .into_iter()
            .zip(delivered.outcomes)
            .zip(delivered.in_file)
            .map(|((op, outcome), in_file)| (op, outcome, in_file))
            .collect();
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
        }
        (done, delivered.files)
    }
}
