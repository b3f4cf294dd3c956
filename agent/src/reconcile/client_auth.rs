//! The client certificates to hold on the HTTPS listener: the last good CA and the last good
//! version of each CRL, as the client-auth source read them. A file that turns bad (half
//! written, expired, signed by another CA, one sozu would refuse) is refused with its reason, and
//! its last good version stays; a file never read good keeps sozu's client certificates as they
//! are, so a CRL is never dropped for want of a good read.
//!
//! The CRLs are also checked together, as sozu builds them into one verifier
//! ([`client_ca::check_set`]): a new version that would make the set one sozu refuses (two CRLs
//! of one CA for overlapping certificates) is refused like a bad file, naming the other file.
//!
//! sozu may still refuse a set the agent validated (a last good CRL whose `nextUpdate` has passed
//! since, sent beside a new CRL of another file). sozu then keeps enforcing the set it held
//! before, which the tracker remembers ([`ClientAuthTracker::sozu_took`]), and the status says
//! so with sozu's reason, instead of showing the files' versions as in force.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::certs::client_ca::{self, ClientCa, Crl};
use crate::document::{ClientAuthStatus, ClientCaStatus, ClientCrlStatus};
use crate::plan::state::{ClientAuthState, ListenerSettings};
use crate::sources::client_auth::ClientAuthFiles;
use crate::workspace::{ClientAuth, ClientAuthMode};

#[derive(Debug, Default)]
pub struct ClientAuthTracker {
    /// Counts what the source said: the model takes the tracker's wants again only when it moved.
    generation: u64,
    ca: Option<(PathBuf, ClientCa)>,
    ca_problem: Option<String>,
    /// Each CRL file: its last good version and why the latest read was refused.
    crls: BTreeMap<PathBuf, (Option<Crl>, Option<String>)>,
    /// The CA and the CRLs (by file) of the set sozu last took from the agent: what it keeps
    /// enforcing while it refuses a newer one.
    in_sozu: InSozu,
    /// sozu's reason for refusing the latest set sent, until it takes one.
    sozu_refusal: Option<String>,
}

#[derive(Debug, Default)]
struct InSozu {
    ca: Option<ClientCa>,
    crls: BTreeMap<PathBuf, Crl>,
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

    /// sozu took `sent` (a listener made with it, or its replacement accepted): the files'
    /// versions in it are the ones it enforces from now on.
    pub fn sozu_took(&mut self, sent: &ClientAuthState) {
        self.in_sozu = InSozu {
            ca: self
                .ca
                .as_ref()
                .map(|(_, ca)| ca)
                .filter(|ca| holds_ca(sent, ca))
                .cloned(),
            crls: self
                .crls
                .iter()
                .filter_map(|(path, (good, _))| {
                    good.as_ref()
                        .filter(|crl| holds_crl(sent, crl))
                        .map(|crl| (path.clone(), crl.clone()))
                })
                .collect(),
        };
        self.sozu_refusal = None;
    }

    /// sozu refused the set sent, for `reason`: it keeps the one it held.
    pub fn sozu_refused(&mut self, reason: String) {
        self.sozu_refusal = Some(reason);
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

    /// What `status` and `/v1/state` show, given the HTTPS listener as sozu holds it (`None`:
    /// sozu has none). Each file shows the version sozu enforces: its last good one, unless sozu
    /// refused the set it is in; then the one sozu kept, when the agent sent it.
    pub fn status(
        &self,
        auth: &ClientAuth,
        listener: Option<&ListenerSettings>,
    ) -> Option<ClientAuthStatus> {
        if auth.mode == ClientAuthMode::Off {
            return None;
        }
        // Moot once sozu holds what the files hold (they went back to it), or has no listener.
        // (Built only while sozu refuses: `wanted` copies every PEM, and a publish is frequent.)
        let sozu_refused = self.sozu_refusal.clone().filter(|_| {
            let (wanted, known) = self.wanted(auth);
            known
                && listener.is_some_and(|l| match (&l.client_auth, &wanted) {
                    (Some(held), Some(wanted)) => !held.same_as(wanted),
                    (None, None) => false,
                    _ => true,
                })
        });
        let held = listener.and_then(|l| l.client_auth.as_ref());
        let ca = auth.ca_file.as_ref().map(|path| {
            let good = self
                .ca
                .as_ref()
                .filter(|(p, _)| p == path)
                .map(|(_, ca)| ca);
            let in_force = match (&sozu_refused, held) {
                (None, _) => good,
                (Some(_), Some(held)) => [good, self.in_sozu.ca.as_ref()]
                    .into_iter()
                    .flatten()
                    .find(|ca| holds_ca(held, ca)),
                (Some(_), None) => None,
            };
            ClientCaStatus {
                file: path.display().to_string(),
                subject: in_force.map(|ca| ca.subject.clone()),
                not_after: in_force.map(|ca| ca.not_after),
                problem: self.ca_problem.clone(),
            }
        });
        let crls = auth
            .crl_files
            .iter()
            .map(|path| {
                let (good, problem) = self.crls.get(path).cloned().unwrap_or_default();
                let in_force = match (&sozu_refused, held) {
                    (None, _) => good.as_ref(),
                    (Some(_), Some(held)) => [good.as_ref(), self.in_sozu.crls.get(path)]
                        .into_iter()
                        .flatten()
                        .find(|crl| holds_crl(held, crl)),
                    (Some(_), None) => None,
                };
                ClientCrlStatus {
                    file: path.display().to_string(),
                    next_update: in_force.map(|c| c.next_update),
                    revoked: in_force.map(|c| c.revoked),
                    problem,
                }
            })
            .collect();
        Some(ClientAuthStatus {
            mode: auth.mode.to_string(),
            ca,
            crls,
            sozu_refused,
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

/// `held` holds every certificate of `ca` (sozu keeps PEMs as sent, whitespace aside).
fn holds_ca(held: &ClientAuthState, ca: &ClientCa) -> bool {
    ca.pems
        .iter()
        .all(|pem| held.cas.iter().any(|h| h.trim() == pem.trim()))
}

fn holds_crl(held: &ClientAuthState, crl: &Crl) -> bool {
    held.crls.iter().any(|h| h.trim() == crl.pem.trim())
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
        let status = tracker.status(&auth(), None).unwrap();
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
        let status = tracker.status(&auth(), None).unwrap();
        assert!(
            status.crls.iter().all(|c| c.problem.is_none()),
            "{status:?}"
        );
    }

    /// While sozu refuses the set the files make, each file shows the version sozu kept (the
    /// one it last took from the agent) beside sozu's reason, and no file is said to be refused;
    /// once sozu holds what the files hold, the reason is gone. An agent that never sent what
    /// sozu holds does not claim to know it.
    #[test]
    fn while_sozu_refuses_the_files_set_the_status_shows_what_sozu_kept_and_why() {
        let devices = ca("devices");
        let laptops =
            |revoked: &[u64]| crl_scoped(&devices, Some("http://crl.example/laptops.crl"), revoked);
        let tablets = || crl_scoped(&devices, Some("http://crl.example/tablets.crl"), &[]);
        let listener = |held: &ClientAuthState| ListenerSettings {
            client_auth: Some(held.clone()),
            ..ListenerSettings::default()
        };
        let revoked =
            |status: &ClientAuthStatus| status.crls.iter().map(|c| c.revoked).collect::<Vec<_>>();
        let reason = "failed to configure client certificate authentication (mTLS): CRL #2 \
                      (counted across client_ca_crls) expired 3 seconds ago";
        let mut tracker = ClientAuthTracker::default();
        tracker.absorb(files(&devices.pem(), &laptops(&[]), &tablets()));
        let first = tracker.wanted(&auth()).0.unwrap();
        tracker.sozu_took(&first);
        tracker.absorb(files(&devices.pem(), &laptops(&[42]), &tablets()));
        let second = tracker.wanted(&auth()).0.unwrap();
        tracker.sozu_refused(reason.into());

        let status = tracker.status(&auth(), Some(&listener(&first))).unwrap();
        assert_eq!(status.sozu_refused.as_deref(), Some(reason));
        assert_eq!(revoked(&status), [Some(0), Some(0)], "what sozu kept");
        assert!(
            status.crls.iter().all(|c| c.problem.is_none()),
            "{status:?}"
        );
        assert_eq!(
            status.ca.and_then(|ca| ca.subject).as_deref(),
            Some("CN=devices")
        );
        // sozu holding what the files hold (it was restarted with them, say): nothing refused.
        let status = tracker.status(&auth(), Some(&listener(&second))).unwrap();
        assert_eq!((revoked(&status)[0], status.sozu_refused), (Some(1), None));
        // No listener in sozu: nothing is enforced instead of the files' set.
        let status = tracker.status(&auth(), None).unwrap();
        assert_eq!(status.sozu_refused, None);

        // An agent started beside a sozu that holds a set it never sent.
        let mut restarted = ClientAuthTracker::default();
        restarted.absorb(files(&devices.pem(), &laptops(&[42]), &tablets()));
        restarted.sozu_refused(reason.into());
        let status = restarted.status(&auth(), Some(&listener(&first))).unwrap();
        assert_eq!(status.sozu_refused.as_deref(), Some(reason));
        assert_eq!(revoked(&status), [None, None]);

        // sozu takes the files' set.
        tracker.sozu_took(&second);
        let status = tracker.status(&auth(), Some(&listener(&second))).unwrap();
        assert_eq!(revoked(&status), [Some(1), Some(0)]);
        assert_eq!(status.sozu_refused, None);
    }
}
