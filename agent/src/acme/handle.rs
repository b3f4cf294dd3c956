//! Where the issuer publishes its status ([`crate::document::IssuerStatus`]: per host, the
//! certificate's validity, when it renews and why, the orders placed and failed by reason, a
//! back-off in force), for the admin server to read. None of it holds a key or a credential: only
//! names, times, counts and messages built from them.

use std::sync::{Arc, OnceLock, RwLock};

use crate::document::IssuerStatus;

/// The issuer's status, shared with the admin server, and how many times it was published.
#[derive(Clone, Default)]
pub struct IssuerHandle(
    Arc<RwLock<(u64, Option<IssuerStatus>)>>,
    Arc<OnceLock<Watcher>>,
);

/// Told of each change, with the status before it: `run` announces orders on `/v1/events`
/// through it, so that the issuer needs to know nothing of the admin server.
type Watcher = Box<dyn Fn(Option<&IssuerStatus>, &IssuerStatus) + Send + Sync>;

impl std::fmt::Debug for IssuerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("IssuerHandle")
            .field(&self.0)
            .finish_non_exhaustive()
    }
}

impl IssuerHandle {
    /// Calls `watcher` at each change from now on (once: a second watcher is ignored).
    pub fn watch(&self, watcher: Watcher) {
        let _ = self.1.set(watcher);
    }

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
            if let Some(watcher) = self.1.get() {
                watcher(slot.1.as_ref(), &status);
            }
            slot.1 = Some(status);
        }
    }
}
