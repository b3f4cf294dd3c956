//! The client-auth source: the device CA and the CRLs that `listeners.client_auth` names, read and
//! validated ([`crate::certs::client_ca`]) on a [`super::watched_files`] thread. Its reading once
//! a minute matters here: a CRL whose `nextUpdate` passes turns invalid without a write.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::watched_files::{read_capped, FileSet};
use super::Fact;
use crate::certs::client_ca::{self, ClientCa, ClientCaError, Crl};
use crate::certs::MAX_FILE_BYTES;
use crate::clock::Clock;
use crate::workspace::{ClientAuthMode, Workspace};

/// Each file as last read: its path and what it held, or why it is refused.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ClientAuthFiles {
    pub ca: Option<(PathBuf, Result<ClientCa, ClientCaError>)>,
    pub crls: Vec<(PathBuf, Result<Crl, ClientCaError>)>,
}

/// The CA file first, then the CRLs; empty with client certificates off.
pub struct Files {
    named: Vec<PathBuf>,
    clock: Arc<dyn Clock>,
}

impl Files {
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Files {
            named: Vec::new(),
            clock,
        }
    }
}

impl FileSet for Files {
    type Reads = ClientAuthFiles;
    const NAME: &'static str = "client-auth";

    fn follow(&mut self, workspace: Option<&Workspace>) -> Vec<PathBuf> {
        self.named = match workspace.map(|w| &w.listener_policy.client_auth) {
            Some(auth) if auth.mode != ClientAuthMode::Off => auth
                .ca_file
                .iter()
                .chain(&auth.crl_files)
                .cloned()
                .collect(),
            _ => Vec::new(),
        };
        self.named.clone()
    }

    fn read(&self) -> ClientAuthFiles {
        let now = self.clock.unix();
        let mut files = ClientAuthFiles::default();
        let mut paths = self.named.iter();
        if let Some(ca_path) = paths.next() {
            let ca = read(ca_path).and_then(|bytes| client_ca::parse_ca(&bytes, ca_path, now));
            for crl_path in paths {
                let crl = match &ca {
                    Ok(ca) => read(crl_path)
                        .and_then(|bytes| client_ca::parse_crl(&bytes, crl_path, ca, now)),
                    Err(_) => Err(ClientCaError::BadCrl {
                        path: crl_path.clone(),
                        reason: "its CA file is not valid".into(),
                    }),
                };
                files.crls.push((crl_path.clone(), crl));
            }
            files.ca = Some((ca_path.clone(), ca));
        }
        files
    }

    fn fact(reads: ClientAuthFiles) -> Fact {
        Fact::ClientAuth(Box::new(reads))
    }
}

/// A file's bytes, at most [`MAX_FILE_BYTES`] of them.
fn read(path: &Path) -> Result<Vec<u8>, ClientCaError> {
    let unreadable = |reason: String| ClientCaError::Unreadable {
        path: path.to_owned(),
        reason,
    };
    let bytes = read_capped(path, MAX_FILE_BYTES).map_err(|e| unreadable(e.to_string()))?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(unreadable(format!("larger than {MAX_FILE_BYTES} bytes")));
    }
    Ok(bytes)
}
