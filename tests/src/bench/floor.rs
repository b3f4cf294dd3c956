//! The floor under the busy phase: the same sozu, the same probes and the same evaluations, with
//! no agent in the rotation's path.
//!
//! Once the busy phase ends, the agent is stopped and the bench does, straight on sozu's socket,
//! the least any agent would have to:
//!
//! - each rotation is the busy phase's swap of the host's pair (the same AtomicWriter write, that
//!   nobody watches now) followed at once by one `ReplaceCertificate` written on a connection
//!   kept open, as an agent that took no time at all would send it; timed as the busy phase
//!   times it, from the swap to the first handshake presenting the new certificate, the probe
//!   running meanwhile;
//! - every [`EDIT_EVERY`](super::busy::EDIT_EVERY), the workspace renamed into place and
//!   evaluated by `private-ingress check` (the same sandboxed child at the same priority the
//!   agent uses), then the edit's route added or taken away with the four requests sozu needs
//!   for it (cluster, backend, certificate, frontend); the route is probed from the rename on,
//!   every 2 ms through the evaluation, as the busy phase's editor probes it while the agent
//!   evaluates. (A first floor probed only once the requests were answered, so sozu's worker
//!   was spared the handshake every few milliseconds through each evaluation that the busy
//!   phase gives it.)
//!
//! No resync reads are sent: the floor is what sozu, the bench's probes and a Nickel evaluation
//! of the workspace every 2 s cost a rotation on this machine before any agent's own work. When
//! the busy phase's tail is above it, the gap is the agent's; when the floor alone is above a
//! target, no agent meets that target here.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sozu_command_lib::proto::command::request::RequestType;
use sozu_command_lib::proto::command::{
    AddBackend, AddCertificate, CertificateAndKey, Cluster, LoadBalancingParams, PathRule,
    RemoveBackend, RemoveCertificate, ReplaceCertificate, RequestHttpFrontend,
};

use super::busy::{self, PACE};
use super::scale::host;
use super::workload::{handshake, Pair};
use crate::live::{atomic_write, SozuConnection};

/// How long an answer of sozu's may take before the run gives up.
const ANSWER_WITHIN: Duration = Duration::from_secs(60);

/// The cluster the floor's edits add and take away (no agent names a cluster so).
const EDITED_CLUSTER: &str = "floor-edit";

pub struct FloorOutcome {
    /// Each rotation: from the swap to the first handshake presenting the new certificate.
    pub rotations: Vec<Duration>,
    /// Each edit that added the route: from the rename, through the evaluation and the four
    /// requests, to the route's first handshake.
    pub edits: Vec<Duration>,
}

/// What the floor needs of the busy phase's run, sozu still running with the agent stopped.
pub struct Setting<'a> {
    pub socket: &'a Path,
    pub https: SocketAddr,
    pub backend: SocketAddr,
    /// The certificates' directory, and the swaps made in it so far.
    pub certs: &'a Path,
    pub generation: u32,
    pub workspace: &'a Path,
    /// The `private-ingress` whose `check` evaluates the workspace.
    pub check: &'a Path,
    /// The two workspace texts the busy phase's editor wrote in turn.
    pub texts: [String; 2],
    /// The route the floor's edits add and take away, and its pair.
    pub edited_host: String,
    pub edited: Pair,
}

/// Rotates `renewals` (host index, new pair) in turn, one every [`PACE`], `current` holding the
/// fingerprint sozu serves for each host index.
pub fn run(
    setting: Setting<'_>,
    renewals: &[(usize, Pair)],
    current: &mut [String],
) -> Result<FloorOutcome, String> {
    let stop = Arc::new(AtomicBool::new(false));
    let editor = {
        let stop = stop.clone();
        let socket = setting.socket.to_owned();
        let (https, backend) = (setting.https, setting.backend);
        let workspace = setting.workspace.to_owned();
        let check = setting.check.to_owned();
        let texts = setting.texts.clone();
        let host = setting.edited_host.clone();
        let pair = setting.edited.clone();
        std::thread::spawn(move || {
            let mut sozu = SozuConnection::connect(&socket)?;
            busy::edit(
                &stop,
                &workspace,
                &texts,
                https,
                &host,
                &pair.fingerprint,
                |adding| {
                    evaluate(&check, &workspace)?;
                    for request in edit_requests(adding, https, backend, &host, &pair) {
                        sozu.write(request)?;
                        sozu.answer(ANSWER_WITHIN)?;
                    }
                    Ok(())
                },
            )
        })
    };
    let rotations = rotate(&setting, renewals, current);
    stop.store(true, Ordering::Relaxed);
    let edits = editor.join().map_err(|_| "the floor's editor panicked")??;
    Ok(FloorOutcome {
        rotations: rotations?,
        edits,
    })
}

fn rotate(
    setting: &Setting<'_>,
    renewals: &[(usize, Pair)],
    current: &mut [String],
) -> Result<Vec<Duration>, String> {
    let mut sozu = SozuConnection::connect(setting.socket)?;
    let mut latencies = Vec::new();
    let mut generation = setting.generation;
    for (i, pair) in renewals {
        generation += 1;
        let old = current
            .get_mut(*i)
            .ok_or_else(|| format!("no host {i} to rotate"))?;
        let request = RequestType::ReplaceCertificate(ReplaceCertificate {
            address: setting.https.into(),
            new_certificate: CertificateAndKey {
                certificate: pair.crt.clone(),
                key: pair.key.clone(),
                ..Default::default()
            },
            old_fingerprint: old.clone(),
            new_expired_at: None,
        });
        let sent = Instant::now();
        atomic_write(
            &setting.certs.join(host(*i)),
            &pair.crt,
            &pair.key,
            generation,
        );
        sozu.write(request)?;
        // Probed while sozu works, as the busy phase probes from the swap; the answer is read
        // after, from the socket's buffer.
        let deadline = sent + Duration::from_secs(120);
        loop {
            match handshake(setting.https, &host(*i)) {
                Ok((fp, done)) if fp == pair.fingerprint => {
                    latencies.push(done.duration_since(sent));
                    break;
                }
                _ if Instant::now() > deadline => {
                    return Err(format!("{} not rotated 120 s after its swap", host(*i)));
                }
                _ => {}
            }
        }
        sozu.answer(ANSWER_WITHIN)
            .map_err(|e| format!("the rotation of {}: {e}", host(*i)))?;
        *old = pair.fingerprint.clone();
        std::thread::sleep(PACE.saturating_sub(sent.elapsed()));
    }
    Ok(latencies)
}

/// `check` of the workspace, as the agent evaluates each edit (the same sandboxed child).
fn evaluate(check: &Path, workspace: &Path) -> Result<(), String> {
    let out = std::process::Command::new(check)
        .arg("check")
        .arg(workspace)
        .output()
        .map_err(|e| format!("run {}: {e}", check.display()))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "check of the edited workspace: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// The requests sozu needs for a route of its own: added in the order sozu accepts them, taken
/// away in the reverse.
fn edit_requests(
    adding: bool,
    https: SocketAddr,
    backend: SocketAddr,
    host: &str,
    pair: &Pair,
) -> Vec<RequestType> {
    let frontend = RequestHttpFrontend {
        cluster_id: Some(EDITED_CLUSTER.to_owned()),
        address: https.into(),
        hostname: host.to_owned(),
        path: PathRule::prefix(String::new()),
        ..Default::default()
    };
    let backend_id = format!("{EDITED_CLUSTER}-0");
    if adding {
        vec![
            RequestType::AddCluster(Cluster {
                cluster_id: EDITED_CLUSTER.to_owned(),
                ..Default::default()
            }),
            RequestType::AddBackend(AddBackend {
                cluster_id: EDITED_CLUSTER.to_owned(),
                backend_id,
                address: backend.into(),
                load_balancing_parameters: Some(LoadBalancingParams { weight: 100 }),
                ..Default::default()
            }),
            RequestType::AddCertificate(AddCertificate {
                address: https.into(),
                certificate: CertificateAndKey {
                    certificate: pair.crt.clone(),
                    key: pair.key.clone(),
                    ..Default::default()
                },
                expired_at: None,
            }),
            RequestType::AddHttpsFrontend(frontend),
        ]
    } else {
        vec![
            RequestType::RemoveHttpsFrontend(frontend),
            RequestType::RemoveCertificate(RemoveCertificate {
                address: https.into(),
                fingerprint: pair.fingerprint.clone(),
            }),
            RequestType::RemoveBackend(RemoveBackend {
                cluster_id: EDITED_CLUSTER.to_owned(),
                backend_id,
                address: backend.into(),
            }),
            RequestType::RemoveCluster(EDITED_CLUSTER.to_owned()),
        ]
    }
}
