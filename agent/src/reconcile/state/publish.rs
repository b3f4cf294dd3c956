//! The status the admin endpoints serve, kept route by route: a pass or a fact updates the
//! routes it concerns, and publishing hands out a snapshot that shares every other route with the
//! previous one. A rotation at 10,000 routes updates one route's status, not ten thousand.

use std::collections::BTreeSet;
use std::sync::Arc;

use super::Reconciler;
use crate::api::{Head, RouteKey, RouteView, Snapshot};
use crate::document::{
    BackendHealth, BackendStatus, CertificateStatus, ListenersStatus, RouteState, RouteStatus,
    UpstreamStatus, Waiting,
};
use crate::plan::desired::{self, DnsUpstreams};
use crate::reconcile::announce;
use crate::reconcile::backends::Drain;
use crate::reconcile::readiness;
use crate::sozu::Proxy;
use crate::workspace::{Route, RouteKind, RouteUpstream, Upstream};

impl<P: Proxy> Reconciler<P> {
    /// Publishes the status: readiness, the workspace, sozu, and the routes whose status is
    /// stale. `settling`: a bulk pass made readiness wait (see [`crate::reconcile::phase`]).
    pub fn publish(&mut self, settling: bool) {
        let now = self.clock.unix();
        for host in self.certs.entered_warning(now) {
            self.stale_views.hosts.insert(host);
        }
        let stale = std::mem::take(&mut self.stale_views);
        // What was shown, to announce what changed (`announce`): cheap, the maps are shared.
        let shown_routes = self.route_views.clone();
        let shown = self.status.load();
        let mut rebuilt: Vec<RouteKey> = Vec::new();
        match &self.model {
            None => self.route_views = imbl::OrdMap::new(),
            Some(model) if stale.all => {
                let mut routes = imbl::OrdMap::new();
                let mut previous_host = None;
                for route in &model.workspace().routes {
                    // Routes are sorted with a host's HTTPS routes first: the first carries the
                    // host's certificate metrics, unless the host has none (no HTTPS route).
                    let first = previous_host != Some(&route.host) && route.terminates_tls();
                    previous_host = Some(&route.host);
                    routes.insert(key(route), Arc::new(self.route_view(route, first, now)));
                }
                self.route_views = routes;
                rebuilt.extend(self.route_views.keys().cloned());
            }
            Some(model) => {
                let mut hosts: BTreeSet<&str> = stale.hosts.iter().map(String::as_str).collect();
                for id in &stale.clusters {
                    hosts.extend(model.route_by_id(id).map(|r| r.host.as_str()));
                }
                for name in &stale.names {
                    hosts.extend(model.routes_of_name(name).map(|r| r.host.as_str()));
                }
                // A host's routes go together: the first of them carries the host's metrics.
                // What the host showed before goes first: a workspace edit may have removed a
                // route or moved it to another path.
                for host in hosts {
                    let shown: Vec<RouteKey> = self
                        .route_views
                        .range((host.to_owned(), String::new())..)
                        .take_while(|(k, _)| k.0 == host)
                        .map(|(k, _)| k.clone())
                        .collect();
                    for key in shown {
                        self.route_views.remove(&key);
                    }
                    for (i, route) in model.routes_of_host(host).enumerate() {
                        let view = self.route_view(route, i == 0 && route.terminates_tls(), now);
                        rebuilt.push(key(route));
                        self.route_views.insert(key(route), Arc::new(view));
                    }
                }
            }
        }
        let workspace = self.workspace.current.as_deref();
        let sozu_problem = match &self.sozu_error {
            Some(error) => Some(error.as_str()),
            None if !self.sozu.is_known() => Some("not reached yet"),
            None => None,
        };
        let readiness = readiness::decide(
            self.readiness,
            &readiness::Facts {
                model: self.model.as_ref(),
                latest_applied: self.model.as_ref().is_some_and(|model| {
                    workspace.is_some_and(|w| std::ptr::eq(w, &**model.workspace()))
                }),
                sozu_problem,
                certs: &self.certs,
                dns: &self.dns,
                policy_files: &self.policy_files,
                refusals: &self.refusals,
                issuer: self
                    .issuer
                    .as_ref()
                    .filter(|_| {
                        self.model.as_ref().is_some_and(|m| {
                            m.workspace().tls_rotation == crate::workspace::TlsRotation::SozuManaged
                        })
                    })
                    .map(|(_, _, stalled)| stalled),
                settling,
            },
        );
        self.ready = readiness.ready;
        let mut head = Head {
            readiness,
            counters: self.counters.clone(),
            ..Head::default()
        };
        head.workspace.loaded = workspace.is_some();
        head.workspace.zone = workspace.map(|w| w.zone.clone());
        head.workspace.last_error = self.workspace.last_error.clone();
        head.workspace.listeners = workspace.map(listeners);
        head.workspace.traefik = workspace
            .and_then(|w| w.traefik_live.as_ref())
            .map(|live| live.status.clone());
        if let Some(generation) = self.sozu.generation() {
            head.sozu.generation = Some(generation.to_string());
            head.sozu.connected = true;
        }
        head.sozu.last_error = self.sozu_error.clone();
        head.sozu.last_read_error = self.read_error.clone();
        head.sozu.last_converged = self.last_converged;
        head.sozu.listeners_need_restart = self.listeners_need_restart.clone();
        head.sozu.https_listener = workspace.and_then(|w| {
            let held = self
                .sozu
                .shadow()
                .and_then(|s| s.listener_settings.get(&w.listeners.https))?;
            Some(crate::document::HttpsListenerStatus {
                http2: held.http2.to_string(),
                front_timeout: held.timeouts[0],
                back_timeout: held.timeouts[1],
            })
        });
        head.sozu.client_auth = workspace.and_then(|w| {
            let listener = self
                .sozu
                .shadow()
                .and_then(|s| s.listener_settings.get(&w.listeners.https));
            self.client_auth
                .status(&w.listener_policy.client_auth, listener)
        });
        head.sozu.policy_files_refused = self.policy_files.problems().values().cloned().collect();
        let mut said = Vec::new();
        let mut hosts_done = BTreeSet::new();
        for key in &rebuilt {
            if let (Some(old), Some(new)) = (shown_routes.get(key), self.route_views.get(key)) {
                if !Arc::ptr_eq(old, new) {
                    announce::route(&old.status, &new.status, &mut hosts_done, &mut said);
                }
            }
        }
        // The first publish has nothing to compare with: a start is not news.
        if shown.head.workspace.loaded || shown.head.sozu.last_error.is_some() {
            announce::head(&shown.head, &head, &mut said);
        }
        self.status.store(Snapshot {
            head,
            routes: self.route_views.clone(),
        });
        for a in said {
            self.events
                .emit(a.kind, a.host.as_deref(), a.problem, a.message);
        }
    }

    /// One route's status; `first` carries its host's metrics.
    fn route_view(&self, route: &Route, first: bool, now: i64) -> RouteView {
        let names = DnsUpstreams::Resolved(self.dns.resolved());
        let backends_desired: Vec<String> = desired::backends(route, names)
            .values()
            .map(|b| b.address.to_string())
            .collect();
        let upstreams: Vec<UpstreamStatus> = route
            .upstreams
            .iter()
            .map(|u| self.upstream_status(route, u, names))
            .collect();
        let in_rotation = upstreams.iter().filter(|u| !u.drain);
        // A redirecting route has no upstream: it needs no backend.
        let no_available_backend = !upstreams.is_empty() && upstreams.iter().all(|u| u.drain)
            || self.backends.no_available(&route.id)
            || in_rotation
                .flat_map(|u| &u.backends)
                .all(|b| b.health == BackendHealth::Down)
                && !backends_desired.is_empty();
        let shadow = self.sozu.shadow();
        let backends_actual: Vec<String> = shadow
            .and_then(|s| s.backends.get(&route.id))
            .map(|b| b.values().map(|b| b.address.to_string()).collect())
            .unwrap_or_default();
        // A route of its own port holds no certificate: its host's (an HTTPS route's) is not its.
        let tls = route.terminates_tls();
        let https = self
            .workspace
            .current
            .as_ref()
            .map(|w| w.listeners.https)
            .filter(|_| tls);
        let served_fingerprints: Vec<Arc<str>> = shadow
            .zip(https)
            .and_then(|(shadow, address)| shadow.certificates.get(&address))
            .map(|held| {
                held.named(&route.host)
                    .map(|(f, _)| Arc::clone(f))
                    .collect()
            })
            .unwrap_or_default();
        let disk = self.certs.last_good().get(&route.host).filter(|_| tls);
        let served_validity = served_fingerprints
            .iter()
            .filter_map(|f| self.certs.validity(&route.host, f))
            .min_by_key(|(_, not_after)| *not_after);
        let dns_error = route.upstream_names().find_map(|name| {
            self.dns
                .error(name)
                .map(|e| format!("resolving {name}: {e}"))
        });
        let cert_error = self.certs.failure(&route.host).filter(|_| tls);
        let rotation = self.certs.rotations(&route.host).filter(|_| tls);
        let refusal = self
            .refusals
            .iter()
            .find(|r| {
                (tls && r.scope.hosts.contains(&route.host))
                    || r.scope.clusters.contains(&route.id)
                    || r.routes.contains(&route.id)
            })
            .map(|r| r.message.clone());
        let policy = route.policy();
        let file_problem = policy
            .basic_auth
            .iter()
            .map(|a| &a.users_file)
            .chain(policy.error_pages.values())
            .find_map(|path| self.policy_files.problems().get(path))
            .map(|reason| format!("policy file refused (its last good version stays): {reason}"));
        let last_error = cert_error
            .map(|(m, _)| m.to_owned())
            .or(refusal)
            .or(file_problem)
            .or(dns_error)
            .or_else(|| {
                no_available_backend.then(|| {
                    if upstreams.iter().all(|u| u.drain) {
                        "every upstream is drained: sozu answers 503".to_owned()
                    } else {
                        "every backend is reported down: sozu still tries them (fail-open) and answers 503 when none connects"
                            .to_owned()
                    }
                })
            });
        let mut waiting_for = Vec::new();
        if self
            .model
            .as_ref()
            .is_some_and(|m| m.held().contains_key(&route.id))
        {
            waiting_for.push(Waiting::Certificate);
        }
        let unresolved = route
            .upstreams
            .iter()
            .filter(|u| !u.drain)
            .any(|u| matches!(&u.upstream, Upstream::Dns { name, .. } if !self.dns.resolved().contains_key(name)));
        if backends_desired.is_empty() && unresolved {
            waiting_for.push(Waiting::Dns);
        }
        let state = if !waiting_for.is_empty() {
            RouteState::Pending
        } else if last_error.is_some() || self.sozu_error.is_some() || no_available_backend {
            RouteState::Error
        } else {
            RouteState::Ok
        };
        let warnings: Vec<String> = self
            .workspace
            .current
            .as_deref()
            .and_then(|w| w.client_auth_exemption(route))
            .into_iter()
            .collect();
        let status = RouteStatus {
            id: route.id.clone(),
            host: route.host.clone(),
            path_prefix: route.path_prefix().to_owned(),
            matches: match &route.kind {
                RouteKind::Http(http) if !http.prefix_only() => http.place(),
                _ => String::new(),
            },
            protocol: route.protocol().to_owned(),
            listen_port: route.listen_port(),
            upstream: route.upstreams_label(),
            backends_desired,
            backends_actual,
            certificate: CertificateStatus {
                disk_fingerprint: disk.map(|c| c.fingerprint.clone()),
                disk_not_before: disk.map(|c| c.not_before),
                disk_not_after: disk.map(|c| c.not_after),
                expiring_soon: disk.is_some_and(|c| self.certs.expiring_soon(c, now)),
                served_fingerprints,
                served_not_before: served_validity.map(|v| v.0),
                served_not_after: served_validity.map(|v| v.1),
                disk_issuer: disk.map(|c| Arc::clone(&c.issuer)),
                error: cert_error.map(|(m, _)| m.to_owned()),
                error_reason: cert_error.map(|(_, r)| r.to_owned()),
                other_names: disk.map(|c| c.other_names.to_vec()).unwrap_or_default(),
                file: disk
                    .and_then(|c| c.listed.as_deref())
                    .map(|p| p.display().to_string()),
                rotations: rotation.map_or(0, |r| r.0),
                last_rotation: rotation.map(|r| r.1),
            },
            state,
            waiting_for,
            last_error,
            policy: route.policy_summary(),
            upstreams,
            no_available_backend,
            warnings,
            origin: self
                .workspace
                .current
                .as_deref()
                .and_then(|w| w.traefik_live.as_ref()?.origins.get(&route.id).cloned()),
        };
        RouteView {
            status,
            host_wide: first,
        }
    }

    /// One upstream of `route`: its backends' health, and where its drain stands.
    fn upstream_status(
        &self,
        route: &Route,
        upstream: &RouteUpstream,
        names: DnsUpstreams<'_>,
    ) -> UpstreamStatus {
        let ids: Vec<(String, String)> = desired::addresses(&upstream.upstream, names)
            .iter()
            .map(|a| (desired::backend_id(&route.id, a), a.to_string()))
            .collect();
        let backends: Vec<BackendStatus> = ids
            .iter()
            .map(|(id, address)| {
                let (health, transitions) = self.backends.health_of(id);
                BackendStatus {
                    id: id.clone(),
                    address: address.clone(),
                    health,
                    transitions,
                }
            })
            .collect();
        let state = if !upstream.drain {
            "in rotation".to_owned()
        } else {
            let draining: Vec<Option<u64>> = ids
                .iter()
                .filter_map(|(id, _)| match self.backends.drain_of(id) {
                    Some(Drain::Draining(sessions)) => Some(sessions),
                    Some(Drain::Drained) | None => None,
                })
                .collect();
            if draining.is_empty() {
                "drained".to_owned()
            } else if draining.iter().all(Option::is_none) {
                // Its sessions were not closed, so sozu gave no count (a route of its own
                // port, or see `Desired::hsts_clusters`): they end when their connections do.
                "draining".to_owned()
            } else {
                let sessions: u64 = draining.iter().flatten().sum();
                format!(
                    "draining ({sessions} session{})",
                    if sessions == 1 { "" } else { "s" }
                )
            }
        };
        UpstreamStatus {
            upstream: upstream.upstream.to_string(),
            weight: upstream.weight,
            drain: upstream.drain,
            state,
            backends,
        }
    }
}

/// The workspace's listeners, as `/v1/state` shows them.
fn listeners(workspace: &crate::workspace::Workspace) -> ListenersStatus {
    let policy = &workspace.listener_policy;
    let t = policy.timeouts;
    ListenersStatus {
        https: workspace.listeners.https.to_string(),
        http: workspace.listeners.http.to_string(),
        min_tls_version: policy.min_tls_version.to_string(),
        expect_proxy: policy.expect_proxy,
        interface: policy.interface.clone(),
        timeouts: [
            ("front", t.front),
            ("back", t.back),
            ("connect", t.connect),
            ("request", t.request),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect(),
    }
}

fn key(route: &Route) -> RouteKey {
    (route.host.clone(), route.place())
}
