//! The pairs named by path (the workspace's `certificates`), as the tls dir source serves them:
//! each pair's latest read, which route hosts each serves, and what a host is served. Pure: the
//! reads are done by [`super::tlsdir`], which also watches the pairs' directories.
//!
//! A pair serves every route host its certificate's DNS names cover, as a TLS client matches
//! them ([`crate::certs::names`]): in place of the host's pair in the tls dir (and of what the
//! ACME issuer writes there), because an operator who names a pair means it to serve. Where two
//! pairs cover a host, the one that names it exactly wins over a wildcard, then the first
//! listed. All the hosts of one pair get one certificate naming them all, so sozu holds it once.
//!
//! Coverage follows the last read that validated: a pair whose files are then half-written,
//! missing or mismatched keeps its hosts, which are shown why while sozu keeps the last good
//! certificate. A pair that never validated covers nothing; its hosts are served from the tls
//! dir meanwhile, and its failure is logged.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::certs::names::{match_of, Match};
use crate::certs::{CertError, Certificate};
use crate::workspace::CertificateFiles;

/// Every listed pair, in the workspace's order, and the host each serves.
#[derive(Debug, Default)]
pub struct ListedPairs {
    pairs: Vec<Listed>,
    /// Route host → the pair that serves it.
    serving: BTreeMap<String, usize>,
}

#[derive(Debug)]
struct Listed {
    files: CertificateFiles,
    /// The last read that validated (no `names`: every DNS name in `other_names`).
    good: Option<Certificate>,
    /// Why the latest read was refused; `None` when it validated (or before the first read).
    error: Option<CertError>,
}

impl ListedPairs {
    /// Takes the workspace's list. A pair still listed keeps what was read of it; returns the
    /// indices of the pairs to read (those new to the list).
    pub fn set(&mut self, list: &[CertificateFiles]) -> Vec<usize> {
        let mut old: BTreeMap<CertificateFiles, Listed> = std::mem::take(&mut self.pairs)
            .into_iter()
            .map(|l| (l.files.clone(), l))
            .collect();
        let mut new = Vec::new();
        for (index, files) in list.iter().enumerate() {
            let listed = old.remove(files).unwrap_or_else(|| {
                new.push(index);
                Listed {
                    files: files.clone(),
                    good: None,
                    error: None,
                }
            });
            self.pairs.push(listed);
        }
        new
    }

    pub fn len(&self) -> usize {
        self.pairs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }

    /// The files of pair `index`.
    pub fn files(&self, index: usize) -> Option<&CertificateFiles> {
        self.pairs.get(index).map(|l| &l.files)
    }

    /// Takes a read of pair `index`. Returns whether it says something new (another
    /// certificate, or another failure).
    pub fn read(&mut self, index: usize, read: Result<Certificate, CertError>) -> bool {
        let Some(listed) = self.pairs.get_mut(index) else {
            return false;
        };
        match read {
            Ok(certificate) => {
                let new = listed.error.take().is_some()
                    || listed.good.as_ref().map(|c| &c.fingerprint)
                        != Some(&certificate.fingerprint);
                listed.good = Some(certificate);
                new
            }
            Err(error) => {
                let new = listed.error.as_ref() != Some(&error);
                if new {
                    tracing::warn!(cert_file = %listed.files.cert_file.display(), error = %error,
                        reason = error.reason(), kept_serving = listed.good.is_some(),
                        "a certificate pair of `certificates` is refused");
                }
                listed.error = Some(error);
                new
            }
        }
    }

    /// Works out which pair serves each of `hosts` (the route hosts that terminate TLS).
    /// Returns the hosts whose pair changed: served by another pair, by one now, or by none any
    /// more (the tls dir's then).
    pub fn assign(&mut self, hosts: &BTreeSet<String>) -> BTreeSet<String> {
        // Most workspaces name no pair: an edit of ten thousand routes pays nothing for this.
        if self.serving.is_empty() && self.pairs.iter().all(|l| l.good.is_none()) {
            return BTreeSet::new();
        }
        let mut serving = BTreeMap::new();
        for host in hosts {
            let mut best: Option<(Match, usize)> = None;
            for (index, listed) in self.pairs.iter().enumerate() {
                let Some(good) = &listed.good else { continue };
                if let Some(m) = match_of(&good.other_names, host) {
                    // Better match wins; the first listed among equals.
                    if best.is_none_or(|(b, _)| m > b) {
                        best = Some((m, index));
                    }
                }
            }
            if let Some((_, index)) = best {
                serving.insert(host.clone(), index);
            }
        }
        let mut changed = BTreeSet::new();
        for host in self.serving.keys().chain(serving.keys()) {
            if self.serving.get(host) != serving.get(host) {
                changed.insert(host.clone());
            }
        }
        // A pair whose set of hosts changed has a new certificate (its names) for every host.
        for index in changed
            .iter()
            .flat_map(|h| [self.serving.get(h), serving.get(h)])
            .flatten()
            .copied()
            .collect::<BTreeSet<_>>()
        {
            changed.extend(
                serving
                    .iter()
                    .filter(|(_, i)| **i == index)
                    .map(|(h, _)| h.clone()),
            );
        }
        self.serving = serving;
        changed
    }

    /// The hosts pair `index` serves.
    pub fn hosts_of(&self, index: usize) -> impl Iterator<Item = &String> {
        self.serving
            .iter()
            .filter(move |(_, i)| **i == index)
            .map(|(h, _)| h)
    }

    /// Whether a pair serves `host`.
    pub fn serves(&self, host: &str) -> bool {
        self.serving.contains_key(host)
    }

    /// What `host` is served, when a pair serves it: the pair's certificate naming every host
    /// the pair serves, or why its latest read was refused (sozu keeps the last good one).
    pub fn pair_of(&self, host: &str) -> Option<Result<Certificate, CertError>> {
        let index = *self.serving.get(host)?;
        let listed = &self.pairs[index];
        if let Some(error) = &listed.error {
            return Some(Err(error.clone()));
        }
        let good = listed.good.as_ref()?;
        let names: BTreeSet<String> = self.hosts_of(index).cloned().collect();
        Some(Ok(Certificate {
            other_names: good
                .other_names
                .iter()
                .filter(|n| !names.contains(*n))
                .cloned()
                .collect(),
            names: names.into(),
            listed: Some(Arc::from(listed.files.cert_file.as_path())),
            ..good.clone()
        }))
    }

    /// The directories the pairs' files are in, each once: what is watched.
    pub fn dirs(&self) -> BTreeSet<PathBuf> {
        self.pairs
            .iter()
            .flat_map(|l| [&l.files.cert_file, &l.files.key_file])
            .filter_map(|p| p.parent().map(Path::to_owned))
            .collect()
    }

    /// The pairs an event about `name` in `dir` may change: those with a file of that name
    /// there, or every pair of `dir` for the link a Kubernetes volume swaps (`..data`).
    pub fn changed_by(&self, dir: &Path, name: &OsStr) -> Vec<usize> {
        let swap = name == "..data";
        self.pairs
            .iter()
            .enumerate()
            .filter(|(_, l)| {
                [&l.files.cert_file, &l.files.key_file]
                    .into_iter()
                    .any(|p| p.parent() == Some(dir) && (swap || p.file_name() == Some(name)))
            })
            .map(|(i, _)| i)
            .collect()
    }

    /// The pairs with a file in `dir`.
    pub fn in_dir(&self, dir: &Path) -> Vec<usize> {
        self.pairs
            .iter()
            .enumerate()
            .filter(|(_, l)| {
                [&l.files.cert_file, &l.files.key_file]
                    .into_iter()
                    .any(|p| p.parent() == Some(dir))
            })
            .map(|(i, _)| i)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(name: &str) -> CertificateFiles {
        CertificateFiles {
            cert_file: PathBuf::from(format!("/certs/{name}.crt")),
            key_file: PathBuf::from(format!("/certs/{name}.key")),
        }
    }

    fn cert(fingerprint: &str, sans: &[&str]) -> Certificate {
        Certificate {
            fingerprint: fingerprint.into(),
            chain: Arc::from(["chain".to_owned()]),
            key: crate::certs::KeyPem::new("key".into()),
            not_before: 0,
            not_after: 1,
            names: Default::default(),
            other_names: sans.iter().map(|s| s.to_string()).collect(),
            issuer: "CN=test".into(),
            listed: None,
        }
    }

    fn hosts(list: &[&str]) -> BTreeSet<String> {
        list.iter().map(|h| h.to_string()).collect()
    }

    #[test]
    fn a_wildcard_pair_serves_every_host_it_covers_and_an_exact_one_wins() {
        let mut pairs = ListedPairs::default();
        assert_eq!(pairs.set(&[files("wild"), files("exact")]), vec![0, 1]);
        pairs.read(0, Ok(cert("w", &["*.in.example.org"])));
        pairs.read(1, Ok(cert("e", &["b.in.example.org"])));
        let routed = hosts(&["a.in.example.org", "b.in.example.org", "c.other.org"]);
        assert_eq!(
            pairs.assign(&routed),
            hosts(&["a.in.example.org", "b.in.example.org"])
        );
        let a = pairs.pair_of("a.in.example.org").unwrap().unwrap();
        assert_eq!(&*a.fingerprint, "w");
        assert_eq!(a.names, hosts(&["a.in.example.org"]).into());
        assert_eq!(a.other_names.to_vec(), vec!["*.in.example.org".to_owned()]);
        assert_eq!(a.listed.as_deref(), Some(Path::new("/certs/wild.crt")));
        assert_eq!(
            pairs
                .pair_of("b.in.example.org")
                .unwrap()
                .unwrap()
                .fingerprint,
            "e".into()
        );
        assert!(pairs.pair_of("c.other.org").is_none(), "the tls dir's");
        // Nothing changed: nothing to publish.
        assert_eq!(pairs.assign(&routed), BTreeSet::new());
    }

    #[test]
    fn a_host_added_renames_the_certificate_of_every_host_of_its_pair() {
        let mut pairs = ListedPairs::default();
        pairs.set(&[files("wild")]);
        pairs.read(0, Ok(cert("w", &["*.in.example.org"])));
        pairs.assign(&hosts(&["a.in.example.org"]));
        let both = hosts(&["a.in.example.org", "b.in.example.org"]);
        assert_eq!(pairs.assign(&both), both, "a's certificate now names b too");
        for host in &both {
            assert_eq!(
                pairs.pair_of(host).unwrap().unwrap().names,
                both.clone().into()
            );
        }
    }

    #[test]
    fn a_refused_read_keeps_the_hosts_and_shows_why_and_a_pair_never_good_covers_nothing() {
        let mut pairs = ListedPairs::default();
        pairs.set(&[files("wild"), files("broken")]);
        let routed = hosts(&["a.in.example.org"]);
        let half = CertError::NoKey {
            path: "/certs/wild.key".into(),
        };
        assert!(pairs.read(1, Err(half.clone())));
        assert_eq!(pairs.assign(&routed), BTreeSet::new());
        pairs.read(0, Ok(cert("w", &["*.in.example.org"])));
        pairs.assign(&routed);
        assert!(pairs.read(0, Err(half.clone())));
        assert!(!pairs.read(0, Err(half.clone())), "the same failure once");
        assert_eq!(pairs.assign(&routed), BTreeSet::new(), "still its host");
        assert_eq!(pairs.pair_of("a.in.example.org"), Some(Err(half)));
        assert!(pairs.read(0, Ok(cert("w2", &["*.in.example.org"]))));
        assert_eq!(
            pairs
                .pair_of("a.in.example.org")
                .unwrap()
                .unwrap()
                .fingerprint,
            "w2".into()
        );
        // Unlisted: its hosts go back to the tls dir.
        assert_eq!(pairs.set(&[files("broken")]), Vec::<usize>::new());
        assert_eq!(pairs.assign(&routed), routed);
        assert!(pairs.pair_of("a.in.example.org").is_none());
    }

    #[test]
    fn events_are_told_apart_by_directory_and_file_name() {
        let mut pairs = ListedPairs::default();
        pairs.set(&[
            files("a"),
            CertificateFiles {
                cert_file: "/live/x/fullchain.pem".into(),
                key_file: "/live/x/privkey.pem".into(),
            },
        ]);
        let dir = Path::new("/certs");
        assert_eq!(pairs.changed_by(dir, OsStr::new("a.key")), vec![0]);
        assert_eq!(
            pairs.changed_by(dir, OsStr::new("a.key.tmp")),
            Vec::<usize>::new()
        );
        assert_eq!(pairs.changed_by(dir, OsStr::new("..data")), vec![0]);
        assert_eq!(
            pairs.changed_by(Path::new("/live/x"), OsStr::new("fullchain.pem")),
            vec![1]
        );
        assert_eq!(
            pairs.dirs(),
            BTreeSet::from([PathBuf::from("/certs"), PathBuf::from("/live/x")])
        );
    }
}
