//! Secrets (a TSIG key, an API token, an EAB HMAC key) are only ever read from files the workspace
//! names, at the moment they are used, so a rotated Secret mount takes effect on the next order.
//! A [`Secret`] prints as `<redacted>`, and a read error names the file, never its content.

use std::path::{Path, PathBuf};

use base64::Engine;

/// A secret file is a few dozen bytes; anything larger is not one.
const MAX_SECRET_BYTES: u64 = 64 * 1024;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error("cannot read the secret file {}: {reason}", path.display())]
    Unreadable { path: PathBuf, reason: String },
    #[error("the secret file {} is empty", path.display())]
    Empty { path: PathBuf },
    #[error("the secret file {} does not hold {expected}", path.display())]
    Malformed {
        path: PathBuf,
        expected: &'static str,
    },
}

/// Secret text, trimmed of surrounding whitespace (files written by `echo` end in a newline),
/// wiped from memory when dropped.
#[derive(Clone)]
pub struct Secret(zeroize::Zeroizing<String>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

impl Secret {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

pub fn read(path: &Path) -> Result<Secret, SecretError> {
    use std::io::Read;
    let unreadable = |reason: String| SecretError::Unreadable {
        path: path.to_owned(),
        reason,
    };
    let file = std::fs::File::open(path).map_err(|e| unreadable(e.kind().to_string()))?;
    let mut text = zeroize::Zeroizing::new(String::new());
    file.take(MAX_SECRET_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| unreadable(e.kind().to_string()))?;
    if text.len() as u64 > MAX_SECRET_BYTES {
        return Err(unreadable(format!("larger than {MAX_SECRET_BYTES} bytes")));
    }
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err(SecretError::Empty {
            path: path.to_owned(),
        });
    }
    Ok(Secret(zeroize::Zeroizing::new(trimmed.to_owned())))
}

/// A base64 key: standard alphabet (what `tsig-keygen` prints) or URL-safe (what CAs hand out
/// as EAB keys), padded or not.
pub fn read_base64(path: &Path) -> Result<zeroize::Zeroizing<Vec<u8>>, SecretError> {
    use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
    let secret = read(path)?;
    let text = secret.expose();
    [STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD]
        .iter()
        .find_map(|engine| engine.decode(text).ok())
        .map(zeroize::Zeroizing::new)
        .filter(|bytes| !bytes.is_empty())
        .ok_or(SecretError::Malformed {
            path: path.to_owned(),
            expected: "a base64 key",
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_trimmed_decoded_and_never_shown() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "s3cr3t-token-value\n").unwrap();
        let secret = read(&path).unwrap();
        assert_eq!(secret.expose(), "s3cr3t-token-value");
        assert_eq!(format!("{secret:?}"), "<redacted>");

        std::fs::write(&path, "AAECAwQ=\n").unwrap();
        assert_eq!(read_base64(&path).unwrap().as_slice(), [0, 1, 2, 3, 4]);
        std::fs::write(&path, "_-8\n").unwrap();
        assert_eq!(read_base64(&path).unwrap().as_slice(), [0xff, 0xef]);

        std::fs::write(&path, "not base64 at all: s3cr3t!").unwrap();
        let err = read_base64(&path).unwrap_err().to_string();
        assert!(err.contains("base64") && !err.contains("s3cr3t"), "{err}");
        std::fs::write(&path, " \n").unwrap();
        assert!(matches!(read(&path), Err(SecretError::Empty { .. })));
        let err = read(&dir.path().join("missing")).unwrap_err().to_string();
        assert!(err.contains("missing"), "{err}");
    }
}
