//! Where a workspace given on the command line comes from: a file, or text read once.
//!
//! `-` is standard input. A path that is not a regular file (`/dev/stdin`, a named pipe, a shell's
//! `<(…)`) can be read only once, and evaluating reads a workspace more than once (the import
//! check, then Nickel, in a child process that has descriptors of its own), so such a workspace,
//! and any of this process's descriptors (`/dev/stdin`, `/dev/fd/N`), is read into memory here,
//! once, and evaluated from that text. It has no directory of its own: its imports resolve from the current directory, the
//! default root of what it may import. Messages call it `<stdin>`, or `<NAME>` after the pipe's
//! file name (`/dev/fd/63` is `<63>`); Nickel resolves imports from the directory of a source's
//! name, so the name holds no `/`.

use std::io::Read;
use std::path::{Path, PathBuf};

/// A workspace on standard input or in a pipe that cannot be read.
#[derive(Debug, thiserror::Error)]
#[error("cannot read workspace {}: {reason}", path.display())]
pub struct InputError {
    pub path: PathBuf,
    pub reason: String,
}

/// What `-` reads, and what messages call it.
pub const STDIN: &str = "<stdin>";

/// A workspace on standard input or in a pipe is read up to this size (64 MiB, the bound of the
/// evaluation's report too).
pub const MAX_TEXT_BYTES: u64 = 64 << 20;

/// A workspace to evaluate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// A regular file, read where it is (and again at every change, by `run`).
    File(PathBuf),
    /// A workspace already read: `name` (no `/` in it) is what messages call it.
    Text { name: String, text: String },
}

impl Input {
    /// `path` as given on the command line: `-` reads standard input, a path that is not a
    /// regular file is read now, once; any other path stays a path.
    pub fn open(path: &Path) -> Result<Input, InputError> {
        if path == Path::new("-") {
            return read(path, STDIN.to_owned(), std::io::stdin().lock());
        }
        match std::fs::metadata(path) {
            // A descriptor of this process names something else in the evaluating child, even
            // when it is a regular file (`check /dev/stdin < workspace.ncl`).
            Ok(metadata) if !metadata.is_dir() && (!metadata.is_file() || descriptor(path)) => {
                let name = match path.file_name() {
                    Some(name) if descriptor(path) && (name == "stdin" || name == "0") => {
                        STDIN.to_owned()
                    }
                    Some(name) => format!("<{}>", name.to_string_lossy()),
                    None => STDIN.to_owned(),
                };
                let file = std::fs::File::open(path).map_err(|err| InputError {
                    path: path.to_owned(),
                    reason: err.to_string(),
                })?;
                read(path, name, file)
            }
            // A missing file, a directory and a regular file are the evaluation's to report.
            _ => Ok(Input::File(path.to_owned())),
        }
    }

    /// What messages call the workspace: its path, or its name.
    pub fn name(&self) -> String {
        match self {
            Input::File(path) => path.display().to_string(),
            Input::Text { name, .. } => name.clone(),
        }
    }

    /// The path messages use for the workspace.
    pub fn path(&self) -> PathBuf {
        match self {
            Input::File(path) => path.clone(),
            Input::Text { name, .. } => PathBuf::from(name),
        }
    }
}

/// Whether `path` names one of this process's file descriptors.
fn descriptor(path: &Path) -> bool {
    path == Path::new("/dev/stdin")
        || ["/dev/fd", "/proc/self/fd", "/proc/thread-self/fd"]
            .iter()
            .any(|dir| path.parent() == Some(Path::new(dir)))
}

fn read(path: &Path, name: String, source: impl Read) -> Result<Input, InputError> {
    let unreadable = |reason: String| InputError {
        path: path.to_owned(),
        reason,
    };
    let mut bytes = Vec::new();
    source
        .take(MAX_TEXT_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|err| unreadable(err.to_string()))?;
    if bytes.len() as u64 > MAX_TEXT_BYTES {
        return Err(unreadable(format!(
            "it is longer than {MAX_TEXT_BYTES} bytes"
        )));
    }
    let text = String::from_utf8(bytes).map_err(|_| unreadable("it is not UTF-8 text".into()))?;
    Ok(Input::Text { name, text })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pipe_is_read_once_and_named_without_a_slash() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("ws.fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let writer = {
            let fifo = fifo.clone();
            std::thread::spawn(move || std::fs::write(fifo, "{ zone = \"a.b\" }"))
        };
        let input = Input::open(&fifo).unwrap();
        writer.join().unwrap().unwrap();
        assert_eq!(
            input,
            Input::Text {
                name: "<ws.fifo>".into(),
                text: "{ zone = \"a.b\" }".into()
            }
        );
        let file = dir.path().join("ws.ncl");
        std::fs::write(&file, "{}").unwrap();
        assert_eq!(Input::open(&file).unwrap(), Input::File(file));
        assert_eq!(
            Input::open(dir.path()).unwrap(),
            Input::File(dir.path().to_owned())
        );
    }
}
