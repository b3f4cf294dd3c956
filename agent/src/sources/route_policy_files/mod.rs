//! The policy-files source: the basic-auth users files and the error pages the workspace's route
//! policies name, read and checked ([`crate::sources::route_policy_files::parse`]) on a [`super::watched_files`] thread.
//!
//! A page is read from the workspace's tree only (its directory, or `--workspace-root`), after
//! links, at every read: sozu sends it to every client of its route, so a page that is a link out
//! of the tree, put in place after the workspace was checked, is refused like one named outside
//! it. A users file is a Secret mounted where the deployment puts it, outside the tree; the
//! agent reads it wherever it is, and shows nothing of what it holds (docs/security.md).

pub mod parse;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::watched_files::{read_capped, FileSet};
use super::Fact;
use crate::evaluate::imports::Root;
use crate::plan::desired::PolicyFiles;
use crate::workspace::Workspace;
use parse::{parse_page, parse_users, MAX_PAGE_BYTES, MAX_USERS_BYTES};

/// Each file as last read: what it held, or why it is refused (naming the file, and the line
/// where there is one).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PolicyFileReads {
    pub users: BTreeMap<PathBuf, Result<Arc<[String]>, String>>,
    pub pages: BTreeMap<PathBuf, Result<Arc<str>, String>>,
}

/// Which files to read: users files, and pages with the status each is read for (a page file
/// named for two statuses is read for the first; its status line says which it answers).
#[derive(Debug, Default)]
struct Wanted {
    users: BTreeSet<PathBuf>,
    pages: BTreeMap<PathBuf, u16>,
}

fn wanted(workspace: &Workspace) -> Wanted {
    let mut wanted = Wanted::default();
    let mut page = |status: u16, path: &Path| {
        wanted.pages.entry(path.to_owned()).or_insert(status);
    };
    for (status, path) in &workspace.error_pages {
        page(*status, path);
    }
    for route in &workspace.routes {
        let policy = route.policy();
        for (status, path) in &policy.error_pages {
            page(*status, path);
        }
        if let Some(auth) = &policy.basic_auth {
            wanted.users.insert(auth.users_file.clone());
        }
    }
    wanted
}

/// The users files and pages of the latest workspace.
pub struct Files {
    wanted: Wanted,
    tree: Tree,
}

impl Files {
    /// For the workspace at `workspace`, whose tree is its directory, or `root`.
    pub fn new(workspace: PathBuf, root: Option<PathBuf>) -> Files {
        Files {
            wanted: Wanted::default(),
            tree: Tree { workspace, root },
        }
    }
}

/// Where the workspace's tree is: found again at each read, as the directory may appear (or
/// move) after the agent starts.
struct Tree {
    workspace: PathBuf,
    root: Option<PathBuf>,
}

impl Tree {
    fn find(&self) -> Result<Root, String> {
        Root::of(&self.workspace, self.root.as_deref())
            .map_err(|e| format!("cannot find the workspace's tree: {e}"))
    }
}

impl FileSet for Files {
    type Reads = PolicyFileReads;
    const NAME: &'static str = "policy-files";

    fn follow(&mut self, workspace: Option<&Workspace>) -> Vec<PathBuf> {
        self.wanted = workspace.map(wanted).unwrap_or_default();
        let files = self.wanted.users.iter().chain(self.wanted.pages.keys());
        files.cloned().collect()
    }

    fn read(&self) -> PolicyFileReads {
        read_all(&self.wanted, &self.tree.find())
    }

    fn fact(reads: PolicyFileReads) -> Fact {
        Fact::PolicyFiles(Box::new(reads))
    }
}

/// Reads every file the workspace's policies name, as the agent will (`tree` is the
/// workspace's): the files that cannot be read (one only a deployed agent sees, say), and the
/// reasons of those refused.
pub fn check(workspace: &Workspace, tree: &Root) -> (Vec<String>, Vec<String>) {
    let reads = read_all(&wanted(workspace), &Ok(tree.clone()));
    let (mut unreadable, mut refused) = (Vec::new(), Vec::new());
    let reasons = reads
        .users
        .into_iter()
        .filter_map(|(p, r)| Some((p, r.err()?)))
        .chain(
            reads
                .pages
                .into_iter()
                .filter_map(|(p, r)| Some((p, r.err()?))),
        );
    for (path, reason) in reasons {
        if path.exists() {
            refused.push(reason);
        } else {
            unreadable.push(reason);
        }
    }
    (unreadable, refused)
}

/// The workspace's error pages as sozu is sent them, for a configuration file sozu loads
/// itself (`render --format sozu-toml`): every page must read good, as no agent beside that
/// sozu would send a better one. Else the reasons, each naming its file.
pub fn pages(workspace: &Workspace, tree: &Root) -> Result<PolicyFiles, Vec<String>> {
    let wanted = Wanted {
        users: BTreeSet::new(),
        ..wanted(workspace)
    };
    let mut files = PolicyFiles::default();
    let mut refused = Vec::new();
    for (path, read) in read_all(&wanted, &Ok(tree.clone())).pages {
        match read {
            Ok(page) => {
                files.pages.insert(path, page);
            }
            Err(reason) => refused.push(reason),
        }
    }
    if refused.is_empty() {
        Ok(files)
    } else {
        Err(refused)
    }
}

fn read_all(wanted: &Wanted, tree: &Result<Root, String>) -> PolicyFileReads {
    let users = wanted
        .users
        .iter()
        .map(|path| {
            let read = read(path, MAX_USERS_BYTES).and_then(|b| parse_users(&b, path));
            (path.clone(), read.map(Arc::from))
        })
        .collect();
    let pages = wanted
        .pages
        .iter()
        .map(|(path, status)| {
            let read = inside(tree, path)
                .and_then(|real| read(&real, MAX_PAGE_BYTES))
                .and_then(|b| parse_page(&b, path, *status));
            (path.clone(), read.map(Arc::from))
        })
        .collect();
    PolicyFileReads { users, pages }
}

/// Where the page at `path` (absolute) really is, when that is in the workspace's tree.
fn inside(tree: &Result<Root, String>, path: &Path) -> Result<PathBuf, String> {
    let refused = |reason: &str| {
        format!(
            "{}: not read: {reason}; an error page is read from the workspace's tree only",
            path.display()
        )
    };
    let tree = tree.as_ref().map_err(|e| refused(e))?;
    tree.confine(Path::new("/"), path).map_err(|e| refused(&e))
}

/// A file's bytes, one more than `max` at most (the checks then say it is too large).
fn read(path: &Path, max: usize) -> Result<Vec<u8>, String> {
    read_capped(path, max as u64).map_err(|e| format!("{}: cannot read: {e}", path.display()))
}
