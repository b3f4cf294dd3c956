//! Several connections to one sozu, each shared by the thread that uses it, and a plan's requests
//! sent over all of them ([`super::phases`]): what a cold start and a bulk change are made of.

use std::sync::{Arc, Mutex};

use super::phases::{send_in_phases, SendError};
use super::{SozuClient, SozuError};
use crate::plan::{Op, Outcome};

/// One connection, shared by the thread that uses it.
pub type Lane = Arc<Mutex<SozuClient>>;

/// The connection, whatever a thread that panicked holding it left behind (a client's state is
/// only a socket, which the next request finds out about).
pub fn lock(lane: &Lane) -> std::sync::MutexGuard<'_, SozuClient> {
    lane.lock().unwrap_or_else(|p| p.into_inner())
}

/// Sends `ops` over every lane, phase after phase, one request each.
pub fn send_over(lanes: &[Lane], ops: &[Op]) -> Vec<Outcome> {
    send_in_phases(ops, lanes.len(), |lane, op| {
        match lock(&lanes[lane]).apply(op) {
            Ok(answer) => Ok(answer),
            Err(SozuError::Refused { message, .. }) => Err(SendError::Refused(message)),
            Err(e) => Err(SendError::Broken(e.to_string())),
        }
    })
}
