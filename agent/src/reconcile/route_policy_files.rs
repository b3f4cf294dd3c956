//! The contents of the policies' files to hold in sozu: the last good version of each users
//! file and error page, as the policy-files source read them. A file that turns bad (half
//! written, a malformed line, a page of another status) is refused with its reason, and its
//! last good version stays; a users file never read good gives its route no credentials, so
//! every request of the route is refused (basic auth fails closed).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::plan::desired::PolicyFiles;
use crate::sources::route_policy_files::PolicyFileReads;

#[derive(Debug, Default)]
pub struct PolicyFilesTracker {
    /// Counts what the source said: the model takes the files again only when it moved.
    generation: u64,
    good: PolicyFiles,
    /// Why the latest read of each file was refused.
    problems: BTreeMap<PathBuf, String>,
}

impl PolicyFilesTracker {
    /// Takes what the files say now; files no longer named are forgotten.
    pub fn absorb(&mut self, reads: PolicyFileReads) {
        self.generation += 1;
        self.problems.clear();
        let mut good = PolicyFiles::default();
        for (path, read) in reads.users {
            match read {
                Ok(users) => {
                    good.users.insert(path, users);
                }
                Err(reason) => {
                    if let Some(last) = self.good.users.remove(&path) {
                        good.users.insert(path.clone(), last);
                    }
                    self.problems.insert(path, reason);
                }
            }
        }
        for (path, read) in reads.pages {
            match read {
                Ok(page) => {
                    good.pages.insert(path, page);
                }
                Err(reason) => {
                    if let Some(last) = self.good.pages.remove(&path) {
                        good.pages.insert(path.clone(), last);
                    }
                    self.problems.insert(path, reason);
                }
            }
        }
        self.good = good;
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The last good contents.
    pub fn files(&self) -> &PolicyFiles {
        &self.good
    }

    /// Whether the source has read `path` at all, good or refused. Until then the routes naming
    /// it are applied without it (a users file: no credentials, every request refused), which
    /// readiness waits out.
    pub fn has_read(&self, path: &Path) -> bool {
        // Each file of the latest reads is either good (or kept from its last good read), or
        // refused, or both.
        self.good.users.contains_key(path)
            || self.good.pages.contains_key(path)
            || self.problems.contains_key(path)
    }

    /// Why files were refused, by path (for the status).
    pub fn problems(&self) -> &BTreeMap<PathBuf, String> {
        &self.problems
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_refused_file_keeps_its_last_good_version_and_says_why() {
        let path = PathBuf::from("/etc/users");
        let mut tracker = PolicyFilesTracker::default();
        let mut reads = PolicyFileReads::default();
        reads
            .users
            .insert(path.clone(), Ok(Arc::from(vec!["a:00".to_owned()])));
        tracker.absorb(reads.clone());
        assert_eq!(tracker.files().users[&path].len(), 1);
        assert!(tracker.has_read(&path));
        reads
            .users
            .insert(path.clone(), Err("/etc/users:2: bad".into()));
        tracker.absorb(reads);
        assert_eq!(tracker.files().users[&path].len(), 1, "the last good stays");
        assert_eq!(tracker.problems()[&path], "/etc/users:2: bad");
        assert!(tracker.has_read(&path), "refused is read");
        tracker.absorb(PolicyFileReads::default());
        assert!(tracker.files().users.is_empty() && tracker.problems().is_empty());
        assert!(!tracker.has_read(&path));
        assert_eq!(tracker.generation(), 3);
    }
}
