//! The client certificates to hold on the HTTPS listener: the last good CA and the last good
//! version of each CRL, as the client-auth source read them. A file that turns bad (half
//! written, expired, signed by another CA) is refused with its reason, and its last good version
//! stays; a file never read good keeps sozu's client certificates as they are, so a CRL is never
//! dropped for want of a good read.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::certs::client_ca::{ClientCa, Crl};
use crate::document::{ClientAuthStatus, ClientCaStatus, ClientCrlStatus};
use crate::sources::client_auth::ClientAuthFiles;
use crate::sozu::state::ClientAuthState;
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
        let mut crls = BTreeMap::new();
        for (path, read) in files.crls {
            let last_good = self.crls.remove(&path).and_then(|(good, _)| good);
            crls.insert(
                path,
                match read {
                    Ok(crl) => (Some(crl), None),
                    Err(e) => (last_good, Some(e.to_string())),
                },
            );
        }
        self.crls = crls;
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
