//! Reading a host's pair from its directory, consistently and bounded: the one place of
//! [`super`] that touches files.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::Certificate;
use super::{parse, CertError};

/// Files larger than this are refused unread: a chain is a few KiB.
pub const MAX_FILE_BYTES: u64 = 1 << 20;

/// How many times a read is retried when the volume's `..data` link moves under it.
const READ_ATTEMPTS: usize = 5;

/// A pair's bytes as read, consistently, from one host directory.
#[derive(Clone, PartialEq, Eq)]
pub struct RawPair {
    pub crt: Vec<u8>,
    /// Wiped from memory when the read is done with.
    pub key: zeroize::Zeroizing<Vec<u8>>,
    /// The visible paths (`<dir>/tls.crt`, `<dir>/tls.key`), which errors name.
    pub crt_path: PathBuf,
    pub key_path: PathBuf,
}

impl RawPair {
    /// [`super::parse_named`] of these bytes: a pair named by path, for the hosts it covers.
    pub fn parse_named(&self, now: i64) -> Result<Certificate, CertError> {
        super::parse_named(&self.crt, &self.crt_path, &self.key, &self.key_path, now)
    }

    pub fn parse(&self, host: &str, now: i64) -> Result<Certificate, CertError> {
        parse(
            &self.crt,
            &self.crt_path,
            &self.key,
            &self.key_path,
            host,
            now,
        )
    }

    /// A digest of both files' bytes: equal digests, equal pairs. Kept instead of the bytes, so
    /// no key lingers in memory to compare a later read with.
    pub fn digest(&self) -> [u8; 32] {
        let mut digest = Sha256::new();
        for part in [&self.crt, &self.key] {
            digest.update((part.len() as u64).to_le_bytes());
            digest.update(part);
        }
        digest.finalize().into()
    }
}

impl std::fmt::Debug for RawPair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawPair")
            .field("crt_path", &self.crt_path)
            .field("key_path", &self.key_path)
            .finish_non_exhaustive()
    }
}

/// Reads `<dir>/tls.crt` and `<dir>/tls.key` as one pair: the one function here that reads files.
///
/// A Kubernetes volume (cert-manager's CSI driver, a Secret) swaps a `..data` symlink to a new
/// timestamped directory and removes the old one at once. Reading `tls.crt` and then `tls.key`
/// through the visible links could straddle a swap and pair one renewal's certificate with
/// another's key; so `..data` is resolved once, both files are read from the directory it
/// names, and the link is checked again afterwards (a moved link or a vanished file means a swap
/// was under way: read again). [`RawPair::parse`] then validates it, without I/O.
pub fn read_pair(dir: &Path) -> Result<RawPair, CertError> {
    let data = dir.join("..data");
    for _ in 0..READ_ATTEMPTS {
        let target = std::fs::read_link(&data).ok();
        let base = match &target {
            Some(target) => dir.join(target),
            None => dir.to_owned(),
        };
        let (crt_path, key_path) = (base.join("tls.crt"), base.join("tls.key"));
        let pair = read_bounded(&crt_path).and_then(|crt| Ok((crt, read_bounded(&key_path)?)));
        let moved = target.is_some() && std::fs::read_link(&data).ok() != target;
        match pair {
            Ok(_) if moved => continue,
            Ok((crt, key)) => {
                // Errors name the visible paths, which are what an operator looks at.
                return Ok(RawPair {
                    crt,
                    key: key.into(),
                    crt_path: dir.join("tls.crt"),
                    key_path: dir.join("tls.key"),
                });
            }
            // A file gone because the link moved is a swap under way: read again. A file missing
            // behind a link that stayed put is simply missing.
            Err(CertError::Unreadable { .. }) if moved => continue,
            Err(e) => return Err(visible(e, dir)),
        }
    }
    Err(CertError::Unstable {
        dir: dir.to_owned(),
    })
}

/// Reads a pair named by path (`certificates`): `crt_path`, then `key_path`, then `crt_path`
/// again, until the certificate read before the key is the one read after it. A renewal that
/// swaps links or renames files between the two reads (certbot re-points its `live/` links one
/// by one) is read again rather than paired with the other's key; what is still mismatched
/// after [`READ_ATTEMPTS`] is refused by the validation ([`RawPair::parse`]), and read again at
/// the next change.
pub fn read_files(crt_path: &Path, key_path: &Path) -> Result<RawPair, CertError> {
    for _ in 0..READ_ATTEMPTS {
        let crt = read_bounded(crt_path)?;
        let key = read_bounded(key_path)?;
        if read_bounded(crt_path)? != crt {
            continue;
        }
        return Ok(RawPair {
            crt,
            key: key.into(),
            crt_path: crt_path.to_owned(),
            key_path: key_path.to_owned(),
        });
    }
    Err(CertError::Unstable {
        dir: crt_path.parent().unwrap_or(crt_path).to_owned(),
    })
}

/// Names the visible file (`<dir>/tls.crt`) rather than the timestamped directory behind it.
fn visible(err: CertError, dir: &Path) -> CertError {
    match err {
        CertError::Unreadable { path, reason } => CertError::Unreadable {
            path: dir.join(path.file_name().unwrap_or_default()),
            reason,
        },
        other => other,
    }
}

/// Reads a regular file of at most [`MAX_FILE_BYTES`]. Anything else is refused without blocking:
/// opening a named pipe with no writer would stall the loop, and `/dev/zero` never ends.
fn read_bounded(path: &Path) -> Result<Vec<u8>, CertError> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let unreadable = |reason: String| CertError::Unreadable {
        path: path.to_owned(),
        reason,
    };
    let too_big = |len: u64| {
        unreadable(format!(
            "{len} bytes or more, more than the {MAX_FILE_BYTES} a certificate file may have"
        ))
    };
    // Non-blocking, so that even a pipe swapped in after a check cannot block the open; checked
    // on the descriptor itself, so what is checked is what is read.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| unreadable(io_reason(&e)))?;
    let meta = file.metadata().map_err(|e| unreadable(io_reason(&e)))?;
    if !meta.is_file() {
        return Err(unreadable("not a regular file".into()));
    }
    if meta.len() > MAX_FILE_BYTES {
        return Err(too_big(meta.len()));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| unreadable(io_reason(&e)))?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(too_big(bytes.len() as u64));
    }
    Ok(bytes)
}

fn io_reason(err: &std::io::Error) -> String {
    match err.kind() {
        std::io::ErrorKind::NotFound => "no such file".into(),
        std::io::ErrorKind::PermissionDenied => "permission denied".into(),
        _ => err.to_string(),
    }
}
