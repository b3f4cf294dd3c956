//! What the commands print: standard output that a closed pipe does not turn into an error, and
//! errors and warnings on standard error with their control characters escaped.

use std::io::Write;

/// Writes `bytes` to standard output. A reader that stopped reading (`… | head`) is no error:
/// what is left is not wanted, and the command's exit status stays its own. (Rust ignores
/// SIGPIPE, so a closed pipe is an error of the write, which `println!` would turn into a panic.)
pub fn print(bytes: impl AsRef<[u8]>) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes.as_ref()).and_then(|()| out.flush()) {
        Err(err) if err.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other,
    }
}

/// Writes `kind: message` to standard error, its control characters escaped (line feeds
/// aside): an error or a warning names paths, hosts and files a workspace or a user chose, and
/// the terminal must not act on them.
pub fn say(kind: &str, message: impl std::fmt::Display) {
    say_to(&mut std::io::stderr().lock(), kind, message);
}

/// [`say`], to `err`: a command that takes its streams (`import`) says its errors as every
/// other command does.
pub fn say_to(err: &mut dyn Write, kind: &str, message: impl std::fmt::Display) {
    let _ = writeln!(
        err,
        "{kind}: {}",
        crate::text::clean(&message.to_string(), crate::text::MAX_DIAGNOSTIC_BYTES)
    );
}
