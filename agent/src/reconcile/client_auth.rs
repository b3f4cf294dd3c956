//! The client certificates to hold on the HTTPS listener: the last good CA and the last good
//! version of each CRL, as the client-auth source read them. A file that turns bad (half
//! written, expired, signed by another CA, one sozu would refuse) is refused with its reason, and
//! its last good version stays; a file never read good keeps sozu's client certificates as they
//! are, so a CRL is never dropped for want of a good read.
//!
//! The CRLs are also checked together, as sozu builds them into one verifier
//! ([`client_ca::check_set`]): a new version that would make the set one sozu refuses (two CRLs
//! of one CA for overlapping certificates) is refused like a bad file, naming the other file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::certs::client_ca::{self, ClientCa, Crl};
use crate::document::{ClientAuthStatus, ClientCaStatus, ClientCrlStatus};
use crate::sources::client_auth::ClientAuthFiles;
use crate::sozu_state::ClientAuthState;
use crate::workspace::{ClientAuth, ClientAuthMode};

#[derive(Debug, Default)]
pub struct ClientAuthTracker {
    /// Counts what the source said: the model takes the tracker's wants again only when it moved.
    generation: u64,
    ca: Option<(PathBuf, ClientCa)>,
    ca_problem: Option<String>,
    /// Each CRL file: its last good version and why the latest read was refused.
    crls: BTreeMap<PathBuf, (Option<Crl>, Option<String>)>,
}

/// A CRL file while its new read is weighed against the set.
struct Weighed {
    path: PathBuf,
    good: Option<Crl>,
    problem: Option<String>,
    /// Read good on its own, not yet taken into the set.
    new: Option<Crl>,
}

impl ClientAuthTracker {
    /// Takes what the files say now.
    pub fn absorb(&mut self, files: ClientAuthFiles) {
        self.generation += 1;
        match files.ca {
            Some((path, Ok(ca))) => {
                self.ca = Some((path, ca));
                self.ca_problem = None;
            }
            Some((path, Err(e))) => {
                if self.ca.as_ref().is_some_and(|(p, _)| *p != path) {
                    self.ca = None;
                }
                self.ca_problem = Some(e.to_string());
            }
            None => {
                self.ca = None;
                self.ca_problem = None;
            }
        }
        let mut weighed: Vec<Weighed> = files
            .crls
            .into_iter()
            .map(|(path, read)| {
                let good = self.crls.remove(&path).and_then(|(good, _)| good);
                match read {
                    Ok(crl) => Weighed {
                        path,
                        good,
                        problem: None,
                        new: Some(crl),
                    },
                    Err(e) => Weighed {
                        path,
                        good,
                        problem: Some(e.to_string()),
                        new: None,
                    },
                }
            })
            .collect();
        match &self.ca {
            Some((ca_path, ca)) => take_as_a_set(ca_path, ca, &mut weighed),
            // The source refuses every CRL while the CA file is not valid: nothing is new.
            None => {
                for file in &mut weighed {
                    file.good = file.new.take().or(file.good.take());
                }
            }
        }
        self.crls = weighed
            .into_iter()
            .map(|f| (f.path, (f.good, f.problem)))
            .collect();
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// What the HTTPS listener must hold for `auth`, and whether it is known: `None` and known
    /// with client certificates off; unknown until the CA and every CRL were read good once.
    pub fn wanted(&self, auth: &ClientAuth) -> (Option<ClientAuthState>, bool) {
        if auth.mode == ClientAuthMode::Off {
            return (None, true);
        }
        let state = ClientAuthState {
            required: auth.mode == ClientAuthMode::Required,
            cas: Vec::new(),
            crls: Vec::new(),
        };
        let ca = self
            .ca
            .as_ref()
            .filter(|(path, _)| auth.ca_file.as_ref() == Some(path));
        let crls: Option<Vec<String>> = auth
            .crl_files
            .iter()
            .map(|path| {
                self.crls
                    .get(path)
                    .and_then(|(good, _)| good.as_ref())
                    .map(|crl| crl.pem.clone())
            })
            .collect();
        match (ca, crls) {
            (Some((_, ca)), Some(crls)) => (
                Some(ClientAuthState {
                    cas: ca.pems.clone(),
                    crls,
                    ..state
                }),
                true,
            ),
            _ => (Some(state), false),
        }
    }

    /// What `status` and `/v1/state` show.
    pub fn status(&self, auth: &ClientAuth) -> Option<ClientAuthStatus> {
        if auth.mode == ClientAuthMode::Off {
            return None;
        }
        let ca = auth.ca_file.as_ref().map(|path| {
            let good = self
                .ca
                .as_ref()
                .filter(|(p, _)| p == path)
                .map(|(_, ca)| ca);
            ClientCaStatus {
                file: path.display().to_string(),
                subject: good.map(|ca| ca.subject.clone()),
                not_after: good.map(|ca| ca.not_after),
                problem: self.ca_problem.clone(),
            }
        });
        let crls = auth
            .crl_files
            .iter()
            .map(|path| {
                let (good, problem) = self.crls.get(path).cloned().unwrap_or_default();
                ClientCrlStatus {
                    file: path.display().to_string(),
                    next_update: good.as_ref().map(|c| c.next_update),
                    revoked: good.as_ref().map(|c| c.revoked),
                    problem,
                }
            })
            .collect();
        Some(ClientAuthStatus {
            mode: auth.mode.to_string(),
            ca,
            crls,
        })
    }
}

/// Takes the CRLs newly read good into the set: all of them when the set they make with the
/// other files' last good versions passes [`client_ca::check_set`]; otherwise one at a time, in
/// the workspace's order, each against the set as it stands, so that a file whose new version
/// the set refuses keeps its last good one, with the reason, and holds up no other file.
fn take_as_a_set(ca_path: &Path, ca: &ClientCa, files: &mut [Weighed]) {
    let whole: Vec<(&Path, &Crl)> = files
        .iter()
        .filter_map(|f| Some((f.path.as_path(), f.new.as_ref().or(f.good.as_ref())?)))
        .collect();
    if client_ca::check_set(ca_path, ca, &whole).is_ok() {
        for file in files.iter_mut() {
            file.good = file.new.take().or(file.good.take());
        }
        return;
    }
    for i in 0..files.len() {
        let Some(new) = files[i].new.take() else {
            continue;
        };
        if files[i].good.as_ref() == Some(&new) {
            continue;
        }
        let tried: Vec<(&Path, &Crl)> = files
            .iter()
            .enumerate()
            .filter_map(|(j, f)| {
                let crl = if j == i { Some(&new) } else { f.good.as_ref() };
                Some((f.path.as_path(), crl?))
            })
            .collect();
        let verdict = client_ca::check_set(ca_path, ca, &tried);
        match verdict {
            Ok(()) => files[i].good = Some(new),
            Err(e) => files[i].problem = Some(e.about(&files[i].path).to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::certs::client_ca::tests::{ca, crl_scoped};
    use crate::certs::client_ca::{parse_ca, parse_crl};
    use x509_parser::prelude::FromDer;

    const CA: &str = "/etc/devices/ca.crt";
    const ONE: &str = "/etc/devices/one.crl";
    const TWO: &str = "/etc/devices/two.crl";

    fn now() -> i64 {
        time::OffsetDateTime::now_utc().unix_timestamp()
    }

    fn auth() -> ClientAuth {
        ClientAuth {
            mode: ClientAuthMode::Required,
            ca_file: Some(CA.into()),
            crl_files: vec![ONE.into(), TWO.into()],
        }
    }

    /// The source's reads: the CA, then each CRL file, each valid on its own.
    fn files(ca_pem: &str, one: &str, two: &str) -> ClientAuthFiles {
        let parsed = parse_ca(ca_pem.as_bytes(), Path::new(CA), now()).unwrap();
        let crl = |path: &str, pem: &str| {
            let read = parse_crl(pem.as_bytes(), Path::new(path), &parsed, now());
            assert!(read.is_ok(), "{read:?}");
            (PathBuf::from(path), read)
        };
        ClientAuthFiles {
            crls: vec![crl(ONE, one), crl(TWO, two)],
            ca: Some((CA.into(), Ok(parsed))),
        }
    }

    /// How many certificates each CRL the listener must hold revokes.
    fn revoked_wanted(tracker: &ClientAuthTracker) -> Vec<usize> {
        let (wanted, known) = tracker.wanted(&auth());
        assert!(known);
        let wanted = wanted.unwrap_or_default();
        wanted
            .crls
            .iter()
            .map(|pem| {
                let (_, der) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap();
                let (_, crl) = x509_parser::revocation_list::CertificateRevocationList::from_der(
                    &der.contents,
                )
                .unwrap();
                crl.iter_revoked_certificates().count()
            })
            .collect()
    }

    /// A new CRL that would make a set sozu refuses (the same CA's as another file's, for
    /// overlapping certificates) is refused with the other file named, and its file's last good
    /// version stays; another file's new version in the same read is taken all the same. Two
    /// files that change their scopes together are taken together.
    #[test]
    fn a_new_crl_overlapping_another_files_is_refused_and_its_last_good_version_stays() {
        let devices = ca("devices");
        let laptops =
            |revoked: &[u64]| crl_scoped(&devices, Some("http://crl.example/laptops.crl"), revoked);
        let tablets =
            |revoked: &[u64]| crl_scoped(&devices, Some("http://crl.example/tablets.crl"), revoked);
        let mut tracker = ClientAuthTracker::default();
        tracker.absorb(files(&devices.pem(), &laptops(&[]), &tablets(&[])));
        assert_eq!(revoked_wanted(&tracker), [0, 0]);

        // TWO now covers everything the CA issued, ONE's laptops included; ONE revokes a laptop.
        let whole = crl_scoped(&devices, None, &[7, 8]);
        tracker.absorb(files(&devices.pem(), &laptops(&[42]), &whole));
        assert_eq!(
            revoked_wanted(&tracker),
            [1, 0],
            "TWO's last good version stays"
        );
        let status = tracker.status(&auth()).unwrap();
        assert_eq!(status.crls[0].problem, None);
        assert_eq!(status.crls[1].revoked, Some(0));
        let problem = status.crls[1].problem.clone().unwrap_or_default();
        assert!(
            problem.starts_with(
                "/etc/devices/two.crl: this CRL and the one of /etc/devices/one.crl are the \
                 same CA's for overlapping certificates"
            ),
            "{problem}"
        );

        // The scopes swapped in one write: each alone would overlap the other file's last good
        // version, together they do not.
        tracker.absorb(files(&devices.pem(), &tablets(&[3]), &laptops(&[42, 43])));
        assert_eq!(revoked_wanted(&tracker), [1, 2]);
        let status = tracker.status(&auth()).unwrap();
        assert!(
            status.crls.iter().all(|c| c.problem.is_none()),
            "{status:?}"
        );
    }
}
