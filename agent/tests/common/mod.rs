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

/// [`run`], with `input` on the command's standard input (a pipe, as `cat file | …` gives).
pub fn run_fed(cmd: &mut Command, input: &[u8]) -> (i32, String, String) {
    use std::io::Write;
    use std::process::Stdio;
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|err| panic!("cannot run {cmd:?}: {err}"));
    let mut stdin = child.stdin.take().unwrap();
    let input = input.to_vec();
    // On a thread: the command may write before it has read everything.
    let feeder = std::thread::spawn(move || stdin.write_all(&input));
    let Output {
        status,
        stdout,
        stderr,
    } = child.wait_with_output().unwrap();
    // A command that stops reading early breaks the pipe: that is its business.
    let _ = feeder.join();
    (
        status.code().unwrap_or(-1),
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&stderr).into_owned(),
    )
}
