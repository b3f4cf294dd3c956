//! The desired state, kept between passes and updated where a fact changes it: a host's
//! certificate, a name's addresses, the routes a workspace edit added, changed or removed. A
//! pass about one host then costs the same at 10,000 routes as at 10: the host's routes are
//! found through an index, and the plan covers that host alone ([`Scope`]). A new sozu, a
//! resync, or an edit of what every route shares (listeners, zone, the workspace's policies) or
//! of a route of its own port build it whole.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::plan::desired::{self, Held};
use crate::plan::state::{Actual, Desired};
use crate::plan::Scope;
use crate::workspace::{Route, Workspace};

use super::client_auth::ClientAuthTracker;
use super::route_policy_files::PolicyFilesTracker;
use super::trackers::{CertTracker, DnsTracker};

pub struct Model {
    workspace: Arc<Workspace>,
    desired: Desired,
    held: BTreeMap<String, Held>,
    /// Indexes into `workspace.routes`.
    routes_by_host: BTreeMap<String, Vec<usize>>,
    routes_by_name: BTreeMap<String, Vec<usize>>,
    routes_by_id: BTreeMap<String, usize>,
    /// Upstream names that have not resolved yet.
    unresolved: BTreeSet<String>,
    /// The client-auth tracker's generation the desired state follows; `None` when built.
    client_auth_generation: Option<u64>,
    /// The policy-files tracker's generation the desired state follows.
    policy_files_generation: u64,
    /// The users files and error pages the workspace names: readiness asks at every publish
    /// whether each was read, and the workspace's routes are not walked for it each time.
    policy_files: Vec<PathBuf>,
}

impl Model {
    pub fn build(
        workspace: Arc<Workspace>,
        dns: &DnsTracker,
        certs: &CertTracker,
        files: &PolicyFilesTracker,
        actual: &Actual,
    ) -> Model {
        let (desired, held) = desired::build(
            &workspace,
            dns.resolved(),
            certs.last_good(),
            files.files(),
            Some(actual),
        );
        let mut model = Model {
            workspace,
            desired,
            held,
            routes_by_host: BTreeMap::new(),
            routes_by_name: BTreeMap::new(),
            routes_by_id: BTreeMap::new(),
            unresolved: BTreeSet::new(),
            client_auth_generation: None,
            policy_files_generation: files.generation(),
            policy_files: Vec::new(),
        };
        model.index(dns);
        model
    }

    /// Takes `workspace` in place of the model's and returns the scope to plan. When only routes
    /// that terminate TLS were added, changed or removed (see [`changes`]), the desired state is
    /// updated for those routes and their hosts alone, by the functions [`Model::build`] runs
    /// over every route, so it ends equal to a build from scratch; anything else builds it whole.
    ///
    /// Why: a pass holds the loop, and a rotation that comes meanwhile waits for it. Built whole,
    /// an edit of one route at 10,000 routes held the loop about 230 ms.
    pub fn update(
        &mut self,
        workspace: Arc<Workspace>,
        dns: &DnsTracker,
        certs: &CertTracker,
        files: &PolicyFilesTracker,
        actual: &Actual,
    ) -> Scope {
        let scope = changes(&self.workspace, &workspace);
        if scope.everything {
            *self = Model::build(workspace, dns, certs, files, actual);
            return scope;
        }
        let new_ids = by_id(&workspace);
        let desired = &mut self.desired;
        for id in &scope.clusters {
            match new_ids.get(id.as_str()) {
                Some(route) => {
                    desired::cluster(desired, route, dns.resolved(), Some(actual));
                    let policy = desired::cluster_policy(route, files.files());
                    if policy.is_empty() {
                        desired.cluster_policies.remove(id);
                    } else {
                        desired
                            .cluster_policies
                            .insert(id.clone(), Arc::new(policy));
                    }
                }
                None => {
                    desired::forget_cluster(desired, id);
                    self.held.remove(id);
                }
            }
        }
        let mut new_by_host: BTreeMap<&str, Vec<&Route>> = BTreeMap::new();
        for route in workspace.routes.iter() {
            if scope.hosts.contains(&route.host) && route.terminates_tls() {
                new_by_host.entry(&route.host).or_default().push(route);
            }
        }
        for host in &scope.hosts {
            // A changed route's frontends are other frontends: the host's are set again whole.
            desired::forget_frontends(desired, host);
            match new_by_host.get(host.as_str()) {
                Some(routes) => desired::host(
                    desired,
                    &mut self.held,
                    host,
                    routes,
                    &workspace,
                    certs.last_good().get(host),
                    Some(actual),
                ),
                None => desired.clear_certificate(host),
            }
        }
        self.workspace = workspace;
        self.index(dns);
        scope
    }

    /// The indexes into the workspace's routes, the names not resolved yet and the files the
    /// policies name, from the workspace: a walk over its routes without building anything of
    /// the desired state.
    fn index(&mut self, dns: &DnsTracker) {
        let mut routes_by_host: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        let mut routes_by_name: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        let mut routes_by_id = BTreeMap::new();
        for (i, route) in self.workspace.routes.iter().enumerate() {
            routes_by_id.insert(route.id.clone(), i);
            match routes_by_host.get_mut(&route.host) {
                Some(list) => list.push(i),
                None => {
                    routes_by_host.insert(route.host.clone(), vec![i]);
                }
            }
            let mut names: Vec<&str> = route.upstream_names().collect();
            names.sort_unstable();
            names.dedup();
            for name in names {
                match routes_by_name.get_mut(name) {
                    Some(list) => list.push(i),
                    None => {
                        routes_by_name.insert(name.to_owned(), vec![i]);
                    }
                }
            }
        }
        self.unresolved = routes_by_name
            .keys()
            .filter(|n| !dns.resolved().contains_key(*n))
            .cloned()
            .collect();
        let (users, pages) = desired::policy_file_paths(&self.workspace);
        self.policy_files = users.into_iter().chain(pages).map(Path::to_owned).collect();
        self.routes_by_host = routes_by_host;
        self.routes_by_name = routes_by_name;
        self.routes_by_id = routes_by_id;
    }

    /// The users files and error pages the workspace names.
    pub fn policy_files(&self) -> &[PathBuf] {
        &self.policy_files
    }

    /// The clusters' and listeners' policies, with the files as `tracker` last read them good,
    /// when the tracker moved since: the clusters whose policy changed, and every listener
    /// when their error pages did.
    pub fn follow_policy_files(&mut self, tracker: &PolicyFilesTracker) -> Scope {
        if self.policy_files_generation == tracker.generation() {
            return Scope::default();
        }
        self.policy_files_generation = tracker.generation();
        let before = std::mem::take(&mut self.desired.cluster_policies);
        let listeners_before = self.desired.listener_answers.clone();
        desired::policies(&mut self.desired, &self.workspace, tracker.files());
        let after = &self.desired.cluster_policies;
        let mut scope = Scope {
            everything: listeners_before != self.desired.listener_answers,
            ..Scope::default()
        };
        for id in before.keys().chain(after.keys()) {
            if before.get(id) != after.get(id) {
                scope.clusters.insert(id.clone());
            }
        }
        scope
    }

    /// The HTTPS listener's client certificates, as `tracker` wants them, taken when the model
    /// was just built or the tracker moved since (not at every pass: the PEMs are cloned); true
    /// when that changes the desired state (every listener is then planned).
    pub fn follow_client_auth(&mut self, tracker: &ClientAuthTracker) -> bool {
        if self.client_auth_generation == Some(tracker.generation()) {
            return false;
        }
        self.client_auth_generation = Some(tracker.generation());
        let (wanted, known) = tracker.wanted(&self.workspace.listener_policy.client_auth);
        let desired = &mut self.desired;
        if desired.listener_settings.client_auth == wanted && desired.client_auth_known == known {
            return false;
        }
        desired.listener_settings.client_auth = wanted;
        desired.client_auth_known = known;
        true
    }

    pub fn workspace(&self) -> &Arc<Workspace> {
        &self.workspace
    }

    pub fn desired(&self) -> &Desired {
        &self.desired
    }

    pub fn held(&self) -> &BTreeMap<String, Held> {
        &self.held
    }

    /// Upstream names that have not resolved yet.
    pub fn unresolved(&self) -> &BTreeSet<String> {
        &self.unresolved
    }

    pub fn routes_of_host<'a>(&'a self, host: &str) -> impl Iterator<Item = &'a Route> + 'a {
        let routes = &self.workspace.routes;
        self.routes_by_host
            .get(host)
            .into_iter()
            .flatten()
            .map(move |&i| &routes[i])
    }

    pub fn route_by_id(&self, id: &str) -> Option<&Route> {
        self.routes_by_id
            .get(id)
            .map(|&i| &self.workspace.routes[i])
    }

    /// The cluster a backend id of the agent's belongs to: the id up to its last `-` (an
    /// address holds none; see [`crate::plan::desired::backend_id`]).
    pub fn cluster_of_backend(&self, backend_id: &str) -> Option<String> {
        let (cluster, _) = backend_id.rsplit_once('-')?;
        self.routes_by_id
            .contains_key(cluster)
            .then(|| cluster.to_owned())
    }

    pub fn routes_of_name<'a>(&'a self, name: &str) -> impl Iterator<Item = &'a Route> + 'a {
        let routes = &self.workspace.routes;
        self.routes_by_name
            .get(name)
            .into_iter()
            .flatten()
            .map(move |&i| &routes[i])
    }

    /// The certificate to serve for `host` changed: sets it, with the host's frontends.
    pub fn host_changed(&mut self, host: &str, certs: &CertTracker, actual: &Actual) -> Scope {
        let routes: Vec<&Route> = self
            .routes_by_host
            .get(host)
            .into_iter()
            .flatten()
            .map(|&i| &self.workspace.routes[i])
            .collect();
        if routes.is_empty() {
            return Scope::default();
        }
        desired::host(
            &mut self.desired,
            &mut self.held,
            host,
            &routes,
            &self.workspace,
            certs.last_good().get(host),
            Some(actual),
        );
        Scope {
            hosts: BTreeSet::from([host.to_owned()]),
            ..Scope::default()
        }
    }

    /// The addresses of `name` changed: sets the backends of the routes it is the upstream of.
    pub fn name_changed(&mut self, name: &str, dns: &DnsTracker, actual: &Actual) -> Scope {
        let mut scope = Scope::default();
        for &i in self.routes_by_name.get(name).into_iter().flatten() {
            let route = &self.workspace.routes[i];
            desired::cluster(&mut self.desired, route, dns.resolved(), Some(actual));
            scope.clusters.insert(route.id.clone());
        }
        if self.routes_by_name.contains_key(name) {
            if dns.resolved().contains_key(name) {
                self.unresolved.remove(name);
            } else {
                self.unresolved.insert(name.to_owned());
            }
        }
        scope
    }
}

/// What differs between two workspaces, as a plan's scope: every route added, removed or
/// changed, by its cluster and its host; everything when the listeners (their addresses or
/// their policy), the zone or the listener's HSTS policy changed, or a route of its own port
/// did (its listener and frontend are planned with every listener's).
pub fn changes(old: &Workspace, new: &Workspace) -> Scope {
    if old.listeners != new.listeners
        || old.listener_policy != new.listener_policy
        || old.zone != new.zone
        || old.hsts != new.hsts
        || old.headers != new.headers
        || old.error_pages != new.error_pages
    {
        return Scope::everything();
    }
    let (before, after) = (by_id(old), by_id(new));
    let mut scope = Scope::default();
    for (id, route) in before.iter().chain(after.iter()) {
        if before.get(id) != after.get(id) {
            if !route.terminates_tls() {
                return Scope::everything();
            }
            scope.clusters.insert((*id).to_owned());
            scope.hosts.insert(route.host.clone());
        }
    }
    scope
}

fn by_id(workspace: &Workspace) -> BTreeMap<&str, &Route> {
    workspace
        .routes
        .iter()
        .map(|r| (r.id.as_str(), r))
        .collect()
}
