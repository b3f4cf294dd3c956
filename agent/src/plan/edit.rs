//! A workspace edit made ready beside the loop: what changed and the indexes of the new
//! workspace's routes, worked out by the workspace source before the loop sees the edit. Pure.
//!
//! Why: everything here is a walk over every route, and the loop did it all while a rotation
//! that came meanwhile waited. At 10,000 routes, beside a resync and the next edit's evaluation
//! on two cores, comparing the workspaces, announcing the edit, marking what changed and indexing
//! the routes held the loop 40–70 ms of an edit's 100–130. The loop now takes the results, and
//! walks the routes itself only when the edit was prepared against another workspace than the
//! one it holds (which a test's fact, sent without preparation, also is).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::plan::{desired, Scope};
use crate::workspace::{Route, Workspace};

/// A new workspace and what it changes from the one the source published before it.
#[derive(Debug, Clone)]
pub struct Edit {
    pub workspace: Arc<Workspace>,
    /// The workspace the rest was worked out against.
    pub previous: Option<Arc<Workspace>>,
    /// The two are equal: nothing to do.
    pub same: bool,
    /// The routes to plan ([`changes`]); everything without a previous workspace.
    pub scope: Scope,
    /// Routes added and removed, by id, for the edit's announcement.
    pub added: usize,
    pub removed: usize,
    /// The upstream names the new workspace uses: what the DNS tracker keeps.
    pub upstream_names: BTreeSet<String>,
    /// The TLS hosts the previous workspace had and this one has not: what the certificate
    /// tracker forgets.
    pub gone_hosts: Vec<String>,
    pub index: RouteIndex,
}

impl Edit {
    pub fn prepare(previous: Option<Arc<Workspace>>, workspace: Arc<Workspace>) -> Edit {
        if previous.as_deref() == Some(&*workspace) {
            // Evaluated again, unchanged (a file touched, a directory event): nothing to work out.
            return Edit {
                workspace,
                previous,
                same: true,
                scope: Scope::default(),
                added: 0,
                removed: 0,
                upstream_names: BTreeSet::new(),
                gone_hosts: Vec::new(),
                index: RouteIndex::default(),
            };
        }
        let (scope, added, removed, gone_hosts) = match previous.as_deref() {
            Some(old) => {
                let (before, now) = (by_id(old), by_id(&workspace));
                let tls_hosts = workspace.tls_hosts();
                (
                    changes_by_id(old, &workspace, &before, &now),
                    now.keys().filter(|id| !before.contains_key(*id)).count(),
                    before.keys().filter(|id| !now.contains_key(*id)).count(),
                    old.tls_hosts()
                        .difference(&tls_hosts)
                        .map(|h| (*h).to_owned())
                        .collect(),
                )
            }
            None => (Scope::everything(), workspace.routes.len(), 0, Vec::new()),
        };
        Edit {
            same: false,
            scope,
            added,
            removed,
            upstream_names: desired::upstream_names(&workspace),
            gone_hosts,
            index: RouteIndex::of(&workspace),
            previous,
            workspace,
        }
    }

    /// Whether this was worked out against `current`, the workspace the loop holds.
    pub fn follows(&self, current: Option<&Arc<Workspace>>) -> bool {
        match (&self.previous, current) {
            (Some(previous), Some(current)) => Arc::ptr_eq(previous, current),
            (None, None) => true,
            _ => false,
        }
    }
}

/// Indexes into a workspace's routes, and the files its policies name: what the kept desired
/// state looks a host's, a name's or an id's routes up in.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RouteIndex {
    pub by_host: BTreeMap<String, Vec<usize>>,
    pub by_name: BTreeMap<String, Vec<usize>>,
    pub by_id: BTreeMap<String, usize>,
    pub policy_files: Vec<PathBuf>,
}

impl RouteIndex {
    pub fn of(workspace: &Workspace) -> RouteIndex {
        let mut index = RouteIndex::default();
        for (i, route) in workspace.routes.iter().enumerate() {
            index.by_id.insert(route.id.clone(), i);
            match index.by_host.get_mut(&route.host) {
                Some(list) => list.push(i),
                None => {
                    index.by_host.insert(route.host.clone(), vec![i]);
                }
            }
            let mut names: Vec<&str> = route.upstream_names().collect();
            names.sort_unstable();
            names.dedup();
            for name in names {
                match index.by_name.get_mut(name) {
                    Some(list) => list.push(i),
                    None => {
                        index.by_name.insert(name.to_owned(), vec![i]);
                    }
                }
            }
        }
        let (users, pages) = desired::policy_file_paths(workspace);
        index.policy_files = users.into_iter().chain(pages).map(Path::to_owned).collect();
        index
    }
}

/// What to plan when `old` becomes `new`: the routes that differ (by id) and their hosts, or
/// everything when what every route shares changed or a route of its own port did (those are
/// planned whole: a port's listener is shared by its routes).
pub fn changes(old: &Workspace, new: &Workspace) -> Scope {
    changes_by_id(old, new, &by_id(old), &by_id(new))
}

/// [`changes`], given each workspace's routes by id.
fn changes_by_id(
    old: &Workspace,
    new: &Workspace,
    before: &BTreeMap<&str, &Route>,
    after: &BTreeMap<&str, &Route>,
) -> Scope {
    if old.listeners != new.listeners
        || old.listener_policy != new.listener_policy
        || old.zone != new.zone
        || old.hsts != new.hsts
        || old.headers != new.headers
        || old.error_pages != new.error_pages
    {
        return Scope::everything();
    }
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
