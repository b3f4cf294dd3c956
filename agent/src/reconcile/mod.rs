//! The level-triggered loop: whatever happened, recompute the desired state from the latest
//! facts and apply the difference to sozu.
//!
//! - Sources ([`crate::sources`]) do the slow work (evaluating the workspace, DNS, reading
//!   certificate pairs, watching sozu's socket) in tasks of their own and send [`Fact`]s.
//! - [`trackers`] keep the latest facts.
//! - [`driver`] runs the loop: facts in, timers (resync, retries, expiry flags), the error
//!   [`retry_policy`], one pass at a time; facts that arrive during a pass coalesce into the next.
//! - [`pass`] is one pass: facts → desired state → plan → sozu, never waiting on DNS or a file.
//! - [`sync`] keeps what the agent knows of sozu: which sozu, and a shadow of its state;
//!   [`resync`] reads sozu again beside the loop and plans only what differs.
//! - `publish` turns it all into the status the admin endpoints serve; [`readiness`] decides
//!   `/readyz` from the same facts; [`announce`] says what changed, for `/v1/events`.
//!
//! The loop is generic over [`Proxy`] and [`CertSource`], so its timing and recovery are tested
//! against in-memory fakes with paused time, facts fed straight in; `run` wires the real ones.
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
pub mod pass;
mod publish;
pub mod readiness;
pub mod resync;
pub mod retry_policy;
pub mod route_policy_files;
pub mod sync;
pub mod trackers;

#[cfg(test)]
mod tests;

pub use driver::{Agent, Settings};
