//! The order a plan's requests go in: phases that go strictly one after the other, requests of
//! one phase independent of each other, and which request depends on which. Pure.

use super::Op;
use crate::sozu_state::Protocol;

/// Which step of the plan's order an operation belongs to. Operations of one phase are
/// independent of each other and may be sent concurrently; phases go strictly in order.
pub fn phase(op: &Op) -> u8 {
    match op {
        Op::AddListener { .. } => 0,
        Op::ActivateListener { .. } => 1,
        Op::SetListenerHsts { .. } | Op::PatchListener { .. } | Op::SetClientAuth { .. } => 2,
        Op::AddCluster { .. } => 3,
        Op::AddBackend { .. } | Op::SetHealthCheck { .. } | Op::RemoveHealthCheck { .. } => 4,
        Op::AddCertificate { .. } | Op::ReplaceCertificate { .. } => 5,
        Op::RemoveCertificate { .. } => 6,
        Op::RemoveFrontend(_) => 7,
        Op::AddFrontend(_) => 8,
        Op::RemoveBackend { .. } => 9,
        Op::CloseSessions { .. } => 10,
        Op::RemoveCluster { .. } => 11,
    }
}

/// True when `later` must not be sent once `failed` was refused: a frontend needs its cluster,
/// and an HTTPS frontend needs its host's certificate.
pub fn depends_on(later: &Op, failed: &Op) -> bool {
    if let (
        Op::SetHealthCheck { cluster_id, .. } | Op::AddBackend { cluster_id, .. },
        Op::AddCluster { id },
    ) = (later, failed)
    {
        return cluster_id == id;
    }
    let Op::AddFrontend(frontend) = later else {
        return false;
    };
    match failed {
        Op::AddCluster { id } => frontend.cluster_id.as_ref() == Some(id),
        Op::AddCertificate { certificate, .. } | Op::ReplaceCertificate { certificate, .. } => {
            frontend.protocol == Protocol::Https && certificate.names.contains(&frontend.hostname)
        }
        Op::AddListener { address, .. } | Op::ActivateListener { address, .. } => {
            frontend.address == *address
        }
        _ => false,
    }
}
