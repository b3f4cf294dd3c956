//! Writes an issued pair into `<tls_dir>/<host>/` exactly as cert-manager's CSI driver (and
//! kubelet's AtomicWriter) does, so the agent's one serving path (watch → read `..data` once →
//! validate → ReplaceCertificate) serves it like any other:
//!
//! 1. a new `..<UTC timestamp>.<random>/` holding `tls.crt` and `tls.key`, synced;
//! 2. a `..data_tmp` link to it, renamed over `..data` (the atomic switch);
//! 3. the visible links `tls.crt -> ..data/tls.crt` and `tls.key -> ..data/tls.key`;
//! 4. the previous timestamped directory removed.
//!
//! A host directory that does not exist yet is built complete under a temporary name and renamed
//! into the tls dir, so the directory's appearance (which the watcher turns into a read) never
//! shows a half-written pair. An identical pair is not written again.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
#[error("cannot write the certificate pair of {host} into {}: {error}", dir.display())]
pub struct WriteError {
    host: String,
    dir: PathBuf,
    error: std::io::Error,
}

/// Whether the pair was written, or already there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    New,
    Unchanged,
}

pub fn write_pair(
    tls_dir: &Path,
    host: &str,
    chain_pem: &str,
    key_pem: &str,
) -> Result<Written, WriteError> {
    let dir = tls_dir.join(host);
    let fail = |error| WriteError {
        host: host.to_owned(),
        dir: dir.clone(),
        error,
    };
    if crate::certs::read_pair(&dir).is_ok_and(|pair| {
        pair.crt == chain_pem.as_bytes() && pair.key.as_slice() == key_pem.as_bytes()
    }) {
        return Ok(Written::Unchanged);
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(tls_dir)
        .map_err(fail)?;
    if std::fs::symlink_metadata(&dir).is_err() {
        // Built aside, then renamed into place in one step.
        let staging = tempfile::Builder::new()
            .prefix(&format!(".{host}."))
            .tempdir_in(tls_dir)
            .map_err(fail)?;
        swap_in(staging.path(), chain_pem, key_pem).map_err(fail)?;
        let staged = staging.keep();
        std::fs::set_permissions(&staged, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .map_err(fail)?;
        if let Err(e) = std::fs::rename(&staged, &dir) {
            let _ = std::fs::remove_dir_all(&staged);
            return Err(fail(e));
        }
        sync_dir(tls_dir).map_err(fail)?;
        return Ok(Written::New);
    }
    swap_in(&dir, chain_pem, key_pem).map_err(fail)?;
    Ok(Written::New)
}

fn swap_in(dir: &Path, chain_pem: &str, key_pem: &str) -> std::io::Result<()> {
    let now = time::OffsetDateTime::now_utc();
    let stamp = format!(
        "..{:04}_{:02}_{:02}_{:02}_{:02}_{:02}.{}",
        now.year(),
        u8::from(now.month()),
        now.day(),
        now.hour(),
        now.minute(),
        now.second(),
        rand::random::<u32>()
    );
    let new = dir.join(&stamp);
    std::fs::DirBuilder::new().mode(0o755).create(&new)?;
    write_file(&new.join("tls.crt"), chain_pem.as_bytes(), 0o644)?;
    write_file(&new.join("tls.key"), key_pem.as_bytes(), 0o600)?;
    sync_dir(&new)?;

    let old = std::fs::read_link(dir.join("..data")).ok();
    let tmp = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(&stamp, &tmp)?;
    std::fs::rename(&tmp, dir.join("..data"))?;
    for name in ["tls.crt", "tls.key"] {
        let visible = dir.join(name);
        let link = PathBuf::from("..data").join(name);
        match std::fs::read_link(&visible) {
            Ok(target) if target == link => {}
            // Missing, or a plain file from another writer: replaced by the link in one rename.
            _ => {
                let tmp = dir.join(format!("..{name}_tmp"));
                let _ = std::fs::remove_file(&tmp);
                std::os::unix::fs::symlink(&link, &tmp)?;
                std::fs::rename(&tmp, &visible)?;
            }
        }
    }
    sync_dir(dir)?;
    if let Some(old) = old.filter(|old| old.as_os_str() != stamp.as_str()) {
        let old = dir.join(old);
        // Only a timestamped directory of ours, never something a link could point outside.
        if old.parent() == Some(dir) {
            let _ = std::fs::remove_dir_all(old);
        }
    }
    Ok(())
}

fn write_file(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(host: &str) -> (String, String) {
        let c = rcgen::generate_simple_self_signed(vec![host.to_owned()]).unwrap();
        (c.cert.pem(), c.signing_key.serialize_pem())
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_pair_lands_the_csi_way_and_validates_through_the_serving_path() {
        let tls = tempfile::tempdir().unwrap();
        let host = "a.in.example.org";
        let (crt, key) = pair(host);
        assert_eq!(
            write_pair(tls.path(), host, &crt, &key).unwrap(),
            Written::New
        );
        let dir = tls.path().join(host);
        let names = entries(&dir);
        assert_eq!(names.len(), 4, "{names:?}");
        assert!(names[0].starts_with("..20"), "{names:?}");
        assert_eq!(&names[1..], ["..data", "tls.crt", "tls.key"]);
        assert_eq!(entries(tls.path()), [host], "no staging directory left");
        crate::certs::read_pair(&tls.path().join(host))
            .and_then(|pair| pair.parse(host, 1_800_000_000))
            .expect("the serving path reads it");

        // The same pair again: nothing written.
        assert_eq!(
            write_pair(tls.path(), host, &crt, &key).unwrap(),
            Written::Unchanged
        );
        // A new pair: a new timestamped directory, the old one gone, the links unchanged.
        let (crt2, key2) = pair(host);
        write_pair(tls.path(), host, &crt2, &key2).unwrap();
        let after = entries(&dir);
        assert_eq!(after.len(), 4, "{after:?}");
        assert_ne!(after[0], names[0]);
        assert_eq!(std::fs::read_to_string(dir.join("tls.crt")).unwrap(), crt2);
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(dir.join("tls.key"))
                .unwrap()
                .permissions(),
        );
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn plain_files_left_by_another_writer_become_links() {
        let tls = tempfile::tempdir().unwrap();
        let host = "b.in.example.org";
        let dir = tls.path().join(host);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("tls.crt"), "old").unwrap();
        std::fs::write(dir.join("tls.key"), "old").unwrap();
        let (crt, key) = pair(host);
        write_pair(tls.path(), host, &crt, &key).unwrap();
        assert_eq!(
            std::fs::read_link(dir.join("tls.key")).unwrap(),
            Path::new("..data/tls.key")
        );
        assert_eq!(std::fs::read_to_string(dir.join("tls.key")).unwrap(), key);
    }
}
