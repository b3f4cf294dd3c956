//! The desired state, kept between passes and updated where a fact changes it: a host's
//! certificate, a name's addresses, the routes a workspace edit added, changed or removed. A
//! pass about one host then costs the same at 10,000 routes as at 10: the host's routes are
//! found through an index, and the plan covers that host alone ([`Scope`]). A new sozu, a
//! resync, or an edit of what every route shares (listeners, zone, the workspace's policies) or
//! of a route of its own port build it whole.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;

use crate::plan::desired::{self, HeldBack};
use crate::plan::edit::{changes, RouteIndex};
use crate::plan::state::{Actual, Desired};
use crate::plan::Scope;
use crate::workspace::{Route, Workspace};

use super::client_auth::ClientAuthTracker;
use super::route_policy_files::PolicyFilesTracker;
use super::trackers::{CertTracker, DnsTracker};

pub struct Model {
    workspace: Arc<Workspace>,
    desired: Desired,
    held: BTreeMap<String, HeldBack>,
    /// Indexes into `workspace.routes`, and the files its policies name.
    index: RouteIndex,
    /// Upstream names that have not resolved yet.
    unresolved: BTreeSet<String>,
    /// The client-auth tracker's generation the desired state follows; `None` when built.
    client_auth_generation: Option<u64>,
    /// The policy-files tracker's generation the desired state follows.
    policy_files_generation: u64,
    /// The workspace and index an edit replaced, for the caller to free beside the loop.
    retired: Option<(Arc<Workspace>, RouteIndex)>,
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
            index: RouteIndex::default(),
            unresolved: BTreeSet::new(),
            client_auth_generation: None,
            policy_files_generation: files.generation(),
            retired: None,
        };
        model.take_index(RouteIndex::of(&model.workspace), dns);
        model
    }

    /// Takes `workspace` in place of the model's and returns the scope to plan. When only routes
    /// that terminate TLS were added, changed or removed (see [`changes`]), the desired state is
    /// updated for those routes and their hosts alone, by the functions [`Model::build`] runs
    /// over every route, so it ends equal to a build from scratch; anything else builds it whole.
    ///
    /// Why: a pass holds the loop, and a rotation that comes meanwhile waits for it. Built whole,
    /// an edit of one route at 10,000 routes held the loop about 230 ms.
    ///
    /// `prepared` is the scope and the new workspace's index when the workspace source worked
    /// them out beside the loop ([`crate::plan::edit`]) against the workspace the model holds;
    /// without it the loop walks the routes for them.
    pub fn update(
        &mut self,
        workspace: Arc<Workspace>,
        prepared: Option<(Scope, RouteIndex)>,
        dns: &DnsTracker,
        certs: &CertTracker,
        files: &PolicyFilesTracker,
        actual: &Actual,
    ) -> Scope {
        let (scope, index) = match prepared {
            Some(prepared) => prepared,
            None => (
                changes(&self.workspace, &workspace),
                RouteIndex::of(&workspace),
            ),
        };
        if scope.everything {
            *self = Model::build(workspace, dns, certs, files, actual);
            return scope;
        }
        let desired = &mut self.desired;
        for id in &scope.clusters {
            match index.by_id.get(id).map(|&i| &workspace.routes[i]) {
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
        for host in &scope.hosts {
            // A changed route's frontends are other frontends: the host's are set again whole.
            desired::forget_frontends(desired, host);
            let routes: Vec<&Route> = index
                .by_host
                .get(host)
                .into_iter()
                .flatten()
                .map(|&i| &workspace.routes[i])
                .filter(|route| route.terminates_tls())
                .collect();
            if routes.is_empty() {
                desired.clear_certificate(host);
            } else {
                desired::host(
                    desired,
                    &mut self.held,
                    host,
                    &routes,
                    &workspace,
                    certs.last_good().get(host),
                    Some(actual),
                );
            }
        }
        let old = std::mem::replace(&mut self.workspace, workspace);
        let old_index = std::mem::take(&mut self.index);
        self.retired = Some((old, old_index));
        self.take_index(index, dns);
        scope
    }

    /// The workspace and index the last edit replaced: at 10,000 routes, milliseconds of
    /// freeing that need not hold the loop (the model may hold the workspace's last reference).
    pub fn retired(&mut self) -> Option<(Arc<Workspace>, RouteIndex)> {
        self.retired.take()
    }

    /// Takes `index` (of the model's workspace) and works out the names not resolved yet.
    fn take_index(&mut self, index: RouteIndex, dns: &DnsTracker) {
        self.unresolved = index
            .by_name
            .keys()
            .filter(|n| !dns.resolved().contains_key(*n))
            .cloned()
            .collect();
        self.index = index;
    }

    /// The users files and error pages the workspace names.
    pub fn policy_files(&self) -> &[PathBuf] {
        &self.index.policy_files
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

    pub fn held(&self) -> &BTreeMap<String, HeldBack> {
        &self.held
    }

    /// Upstream names that have not resolved yet.
    pub fn unresolved(&self) -> &BTreeSet<String> {
        &self.unresolved
    }

    pub fn routes_of_host<'a>(&'a self, host: &str) -> impl Iterator<Item = &'a Route> + 'a {
        let routes = &self.workspace.routes;
        self.index
            .by_host
            .get(host)
            .into_iter()
            .flatten()
            .map(move |&i| &routes[i])
    }

    pub fn route_by_id(&self, id: &str) -> Option<&Route> {
        self.index.by_id.get(id).map(|&i| &self.workspace.routes[i])
    }

    /// The cluster a backend id of the agent's belongs to: the id up to its last `-` (an
    /// address holds none; see [`crate::plan::desired::backend_id`]).
    pub fn cluster_of_backend(&self, backend_id: &str) -> Option<String> {
        let (cluster, _) = backend_id.rsplit_once('-')?;
        self.index
            .by_id
            .contains_key(cluster)
            .then(|| cluster.to_owned())
    }

    pub fn routes_of_name<'a>(&'a self, name: &str) -> impl Iterator<Item = &'a Route> + 'a {
        let routes = &self.workspace.routes;
        self.index
            .by_name
            .get(name)
            .into_iter()
            .flatten()
            .map(move |&i| &routes[i])
    }

    /// The certificate to serve for `host` changed: sets it, with the host's frontends.
    pub fn host_changed(&mut self, host: &str, certs: &CertTracker, actual: &Actual) -> Scope {
        let routes: Vec<&Route> = self
            .index
            .by_host
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
        for &i in self.index.by_name.get(name).into_iter().flatten() {
            let route = &self.workspace.routes[i];
            desired::cluster(&mut self.desired, route, dns.resolved(), Some(actual));
            scope.clusters.insert(route.id.clone());
        }
        if self.index.by_name.contains_key(name) {
            if dns.resolved().contains_key(name) {
                self.unresolved.remove(name);
            } else {
                self.unresolved.insert(name.to_owned());
            }
        }
        scope
    }
}
