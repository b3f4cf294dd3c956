//! What the agent crate's test binaries share: the binary under test, running it, golden files.

use std::path::Path;
use std::process::{Command, Output};

pub fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_private-ingress"))
}

/// Runs `cmd` and returns (exit code, stdout, stderr); the command line goes with any panic.
pub fn run(cmd: &mut Command) -> (i32, String, String) {
    let Output {
        status,
        stdout,
        stderr,
    } = cmd
        .output()
        .unwrap_or_else(|err| panic!("cannot run {cmd:?}: {err} (scripts/test installs it)"));
    (
        status.code().unwrap_or(-1),
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&stderr).into_owned(),
    )
}

/// Asserts `actual` equals the golden file at `path`; `UPDATE_GOLDEN=1` rewrites it instead.
pub fn assert_golden(path: &Path, actual: &str, what: &str) {
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(path, actual).unwrap();
    }
    let expected = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e} (UPDATE_GOLDEN=1 writes it)", path.display()));
    assert_eq!(
        actual,
        expected,
        "{what} output drifted from {}",
        path.display()
    );
}
