//! What sozu holds once a request is applied: how the agent's shadow of sozu's state advances
//! with each request sozu accepted (and how the tests' in-memory sozu applies them). Pure.

use std::net::SocketAddr;
use std::sync::Arc;

use super::Op;
use crate::plan::state::{Actual, Certificate};

/// Applies `ops` to `actual` as sozu would, for the in-memory proxy used in tests and for keeping
/// a shadow of what was applied.
pub fn apply(actual: &mut Actual, op: &Op) {
    match op {
        Op::AddListener {
            protocol,
            address,
            settings,
        } => {
            actual
                .listeners
                .entry(*address)
                .or_insert((*protocol, false));
            actual
                .listener_settings
                .entry(*address)
                .or_insert_with(|| (**settings).clone());
        }
        Op::SetClientAuth {
            address,
            client_auth,
        } => {
            if let Some(current) = actual.listener_settings.get_mut(address) {
                current.client_auth = client_auth.as_deref().cloned();
            }
        }
        Op::PatchListener {
            protocol,
            address,
            settings,
        } => {
            if let Some(current) = actual.listener_settings.get_mut(address) {
                current.expect_proxy = settings.expect_proxy;
                current.timeouts = settings.timeouts;
                if *protocol == crate::plan::state::Protocol::Https {
                    current.http2 = settings.http2;
                }
                if *protocol == crate::plan::state::Protocol::Udp {
                    current.max_datagram_size = settings.max_datagram_size;
                }
            }
        }
        Op::ActivateListener { address, .. } => {
            if let Some(l) = actual.listeners.get_mut(address) {
                l.1 = true;
            }
        }
        Op::AddCluster { id, policy } => {
            actual.clusters.insert(id.clone());
            actual.backends.entry(id.clone()).or_default();
            // sozu keeps an error page it is not sent again (see `crate::plan`).
            let held = actual.cluster_policies.remove(id);
            let mut now = policy.as_deref().cloned().unwrap_or_default();
            for (status, page) in held.iter().flat_map(|p| p.answers.iter()) {
                now.answers
                    .entry(status.clone())
                    .or_insert_with(|| page.clone());
            }
            if !now.is_empty() {
                actual
                    .cluster_policies
                    .insert(id.clone(), std::sync::Arc::new(now));
            }
        }
        Op::SetListenerAnswers {
            address, answers, ..
        } => {
            let held = actual.listener_answers.entry(*address).or_default();
            for (status, page) in answers {
                held.insert(status.clone(), page.clone());
            }
        }
        Op::SwapFrontend {
            frontend,
            add: true,
            ..
        } => {
            actual.frontends.insert(frontend.clone());
        }
        Op::SwapFrontend {
            frontend,
            add: false,
            ..
        } => {
            actual.frontends.remove(frontend);
        }
        Op::AddBackend {
            cluster_id,
            backend,
        } => {
            actual
                .backends
                .entry(cluster_id.clone())
                .or_default()
                .insert(backend.clone());
        }
        Op::RemoveBackend {
            cluster_id,
            backend,
        } => {
            if let Some(b) = actual.backends.get_mut(cluster_id) {
                b.remove(&backend.id);
            }
        }
        Op::AddStreamFrontend(f) => {
            actual.stream_frontends.insert(f.clone());
        }
        Op::RemoveStreamFrontend(f) => {
            actual.stream_frontends.remove(f);
        }
        Op::DeactivateListener { address, .. } => {
            if let Some(l) = actual.listeners.get_mut(address) {
                l.1 = false;
            }
        }
        Op::RemoveListener { address, .. } => {
            actual.listeners.remove(address);
            actual.listener_settings.remove(address);
            actual.listener_answers.remove(address);
        }
        Op::RemoveCluster { id } => {
            actual.clusters.remove(id);
            actual.backends.remove(id);
            actual.health_checks.remove(id);
            actual.cluster_policies.remove(id);
            // sozu takes the cluster's frontends with it (`ConfigState::remove_cluster`); a
            // resync that leaves the frontends unread takes them from this shadow.
            actual
                .frontends
                .retain(|f| f.cluster_id.as_deref() != Some(id.as_str()));
            actual.stream_frontends.retain(|f| &f.cluster_id != id);
        }
        Op::SetListenerHsts { address, hsts } => match hsts {
            Some(hsts) => {
                actual.hsts.insert(*address, *hsts);
            }
            None => {
                actual.hsts.remove(address);
            }
        },
        Op::SetHealthCheck { cluster_id, check } => {
            actual
                .health_checks
                .insert(cluster_id.clone(), check.clone());
        }
        Op::RemoveHealthCheck { cluster_id } => {
            actual.health_checks.remove(cluster_id);
        }
        Op::CloseSessions { .. } => {}
        Op::AddFrontend(f) => {
            actual.frontends.insert(f.clone());
        }
        Op::RemoveFrontend(f) => {
            actual.frontends.remove(f);
        }
        Op::AddCertificate {
            address,
            certificate,
        } => add_summary(actual, *address, certificate),
        Op::ReplaceCertificate {
            address,
            old_fingerprint,
            certificate,
        } => {
            // Removed first: a certificate replaced by itself under new names stays.
            remove_summary(actual, *address, old_fingerprint);
            add_summary(actual, *address, certificate);
        }
        Op::RemoveCertificate {
            address,
            fingerprint,
        } => remove_summary(actual, *address, fingerprint),
    }
}

/// Why sozu would refuse `op` given what it holds, where that can be told beforehand: sozu keys
/// an HTTP or HTTPS frontend by its listener, its hostname as spelled and its path, and refuses
/// a second one under a key it holds, whatever the two carry ("HttpsFrontend … already
/// exists"). The tests' in-memory sozu refuses as sozu does, and the plan's tests check that no
/// plan asks it.
pub fn refusal(actual: &Actual, op: &Op) -> Option<String> {
    let (Op::AddFrontend(new)
    | Op::SwapFrontend {
        frontend: new,
        add: true,
        ..
    }) = op
    else {
        return None;
    };
    crate::plan::state::frontends_of(&actual.frontends, &new.hostname)
        .find(|f| {
            f.protocol == new.protocol
                && f.address == new.address
                && f.alias == new.alias
                && f.same_match(new)
        })
        .map(|_| {
            format!(
                "{:?} frontend {}{} on {} already exists",
                new.protocol,
                new.sozu_hostname(),
                new.match_label(),
                new.address
            )
        })
}

fn add_summary(actual: &mut Actual, address: SocketAddr, certificate: &Certificate) {
    actual.certificates.entry(address).or_default().insert(
        Arc::clone(&certificate.fingerprint),
        certificate.names.clone(),
    );
}

fn remove_summary(actual: &mut Actual, address: SocketAddr, fingerprint: &str) {
    if let Some(held) = actual.certificates.get_mut(&address) {
        held.remove(fingerprint);
    }
}
