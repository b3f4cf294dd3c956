//! The status the admin endpoints serve, from the trackers and the shadow of sozu's state.

use std::collections::BTreeMap;

use super::driver::Agent;
use super::trackers::expiring_soon;
use super::Proxy;
use crate::api::{CertificateStatus, RouteState, RouteStatus, Waiting};
use crate::sources::CertSource;
use crate::state::Address;
use crate::workspace::Upstream;

impl<P: Proxy, C: CertSource> Agent<P, C> {
    /// Publishes the status: readiness, the workspace, sozu, every route.
    pub(super) fn publish(&mut self) {
        let now = self.clock.unix();
        let warning = self.expiry_warning_seconds();
        self.certs.warn_expiring(now, warning);
        let workspace = self.workspace.current.clone();
        let https = workspace.as_ref().map(|w| w.listeners.https);
        let served = self
            .sozu
            .shadow()
            .zip(https)
            .and_then(|(shadow, address)| shadow.certificates.get(&address))
            .map(|held| held.by_name());
        // What sozu refused, by the host or cluster id it concerns.
        let mut refused: BTreeMap<&str, &str> = BTreeMap::new();
        for refusal in self.refusals.iter() {
            for key in &refusal.concerns {
                refused.entry(key).or_insert(&refusal.message);
            }
        }
        let unreachable = self.sozu_error.is_some();
        // Built before taking the lock: readers of /readyz and /v1/state wait on it.
        let routes: Vec<RouteStatus> = workspace
            .as_deref()
            .map(|w| &w.routes[..])
            .unwrap_or_default()
            .iter()
            .map(|route| {
                let backends_desired: Vec<String> = match &route.upstream {
                    Upstream::Dns { name, port } => self
                        .dns
                        .resolved()
                        .get(name)
                        .into_iter()
                        .flatten()
                        .map(|ip| std::net::SocketAddr::new(*ip, *port).to_string())
                        .collect(),
                    other => vec![other.to_string()],
                };
                let backends_actual: Vec<String> = self
                    .sozu
                    .shadow()
                    .and_then(|s| s.backends.get(&route.id))
                    .map(|b| {
                        b.values()
                            .map(|b| match &b.address {
                                Address::Ip(address) => address.to_string(),
                                other => other.to_string(),
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                let disk = self.certs.last_good().get(&route.host);
                let served_fingerprints = served
                    .iter()
                    .flat_map(|served| served.named(&route.host))
                    .map(|(fingerprint, _)| fingerprint.to_owned())
                    .collect();
                let dns_error = match &route.upstream {
                    Upstream::Dns { name, .. } => self
                        .dns
                        .error(name)
                        .map(|e| format!("resolving {name}: {e}")),
                    _ => None,
                };
                let cert_error = self.certs.failure(&route.host);
                let rotation = self.certs.rotations(&route.host);
                let refusal = refused
                    .get(route.host.as_str())
                    .or_else(|| refused.get(route.id.as_str()))
                    .map(|m| (*m).to_owned());
                let last_error = cert_error
                    .map(|(m, _)| m.to_owned())
                    .or(refusal)
                    .or(dns_error);
                let mut waiting_for = Vec::new();
                if self.held.contains_key(&route.id) {
                    waiting_for.push(Waiting::Certificate);
                }
                if backends_desired.is_empty() {
                    waiting_for.push(Waiting::Dns);
                }
                let state = if !waiting_for.is_empty() {
                    RouteState::Pending
                } else if last_error.is_some() || unreachable {
                    RouteState::Error
                } else {
                    RouteState::Ok
                };
                RouteStatus {
                    id: route.id.clone(),
                    host: route.host.clone(),
                    path_prefix: route.path_prefix.clone(),
                    upstream: route.upstream.to_string(),
                    backends_desired,
                    backends_actual,
                    certificate: CertificateStatus {
                        disk_fingerprint: disk.map(|c| c.fingerprint.clone()),
                        disk_not_before: disk.map(|c| c.not_before),
                        disk_not_after: disk.map(|c| c.not_after),
                        expiring_soon: disk.is_some_and(|c| expiring_soon(c, now, warning)),
                        served_fingerprints,
                        error: cert_error.map(|(m, _)| m.to_owned()),
                        error_reason: cert_error.map(|(_, r)| r.to_owned()),
                        rotations: rotation.map_or(0, |r| r.0),
                        last_rotation: rotation.map(|r| r.1),
                    },
                    state,
                    waiting_for,
                    last_error,
                }
            })
            .collect();
        let names_resolved = workspace.as_deref().is_some_and(|w| {
            crate::desired::upstream_names(w)
                .iter()
                .all(|n| self.dns.resolved().contains_key(n))
        });
        let ready = workspace.is_some()
            && !unreachable
            && self.sozu.is_known()
            && self.refusals.is_empty()
            && self.held.is_empty()
            && names_resolved;
        let generation = self.sozu.generation().map(|g| g.to_string());
        let mut status = self.status.write().unwrap_or_else(|p| p.into_inner());
        status.ready = ready;
        status.counters = self.counters.clone();
        status.workspace.loaded = workspace.is_some();
        status.workspace.zone = workspace.as_ref().map(|w| w.zone.clone());
        status.workspace.last_error = self.workspace.last_error.clone();
        if generation.is_some() {
            status.sozu.generation = generation;
            status.sozu.connected = true;
        }
        status.sozu.last_error = self.sozu_error.clone();
        status.sozu.last_converged = self.last_converged;
        status.routes = routes;
    }
}
