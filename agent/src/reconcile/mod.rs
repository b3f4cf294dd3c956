//! The level-triggered loop: whatever happened, recompute the desired state from the latest
//! facts and apply the difference to sozu.
//!
//! - Sources ([`crate::sources`]) do the slow work (evaluating the workspace, DNS, reading
//!   certificate pairs, watching sozu's socket) in tasks of their own and send [`Fact`]s.
//! - [`state`] is the reconciler's state, one value: the latest facts ([`trackers`]), the
//!   desired state ([`model`]), what the agent knows of sozu ([`sync`]: which sozu, and a
//!   shadow of its state), and the routes' status. A fact is taken into it, a pass (facts →
//!   desired state → plan → sozu, never waiting on DNS or a file) and a publish (the status the
//!   admin endpoints serve) are functions of it; [`resync`] reads sozu again beside the loop
//!   and plans only what differs; [`readiness`] decides `/readyz` from the same facts;
//!   [`announce`] says what changed, for `/v1/events`.
//! - [`driver`] runs the loop, and holds only its mechanics: facts in, timers (resync, refused
//!   requests' retries, expiry flags), the phase ([`phase`]: running, backing off from an
//!   unreachable sozu, settling after a bulk pass), memory handed back after churn, one pass at
//!   a time; facts that arrive during a pass coalesce into the next.
//!
//! The loop is generic over [`Proxy`] and [`CertSource`], so its timing and recovery are tested
//! against in-memory fakes with paused time, facts fed straight in, and a pass on the state
//! alone; `run` wires the real ones.
//!
//! [`Proxy`]: crate::sozu::Proxy
//!
//! [`Fact`]: crate::sources::Fact
//! [`CertSource`]: crate::sources::CertSource

pub mod announce;
pub mod backends;
pub mod client_auth;
pub mod driver;
pub mod model;
pub mod phase;
pub mod readiness;
pub mod resync;
pub mod retry_policy;
pub mod route_policy_files;
pub mod state;
pub mod sync;
pub mod trackers;

#[cfg(test)]
mod tests;

pub use driver::{Driver, Settings};
pub use state::Reconciler;
