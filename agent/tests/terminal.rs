//! What a person at a terminal sees: colour where the program may, none where NO_COLOR
//! (https://no-color.org: set and not empty) says no, and none in a pipe. Each command runs on
//! a pseudo-terminal, as in a shell.

use crate::common::{bin, run};
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};

/// What `command` writes to its terminal (stdout and stderr both), and its exit code.
fn on_a_terminal(command: &mut Command) -> (i32, String) {
    let pty = nix::pty::openpty(None, None).expect("a pseudo-terminal");
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::from(pty.slave.try_clone().unwrap()))
        .stderr(Stdio::from(pty.slave))
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    // The child holds the terminal's other end now; this process must not, or reading would
    // never see its end.
    *command = Command::new("true");
    let mut screen = Vec::new();
    // Linux ends the read with EIO once the child's end is closed: that is the end of output.
    let _ = std::fs::File::from(pty.master).read_to_end(&mut screen);
    let status = child.wait().unwrap();
    (
        status.code().unwrap_or(-1),
        String::from_utf8_lossy(&screen).into_owned(),
    )
}

/// The agent's command lines that show colour, or could: help, a usage error, the logs of `run`
/// (which stops at once: its workspace's directory is not there), a diagnostic of `check`.
fn commands(env: &[(&str, &str)]) -> Vec<(&'static str, Command)> {
    let bad = Path::new(env!("CARGO_MANIFEST_DIR")).join("../schema/examples/bad/port-zero.ncl");
    let with = |args: &[&str]| {
        let mut command = bin();
        command.args(args);
        command
    };
    let bad = bad.to_string_lossy();
    let mut commands = vec![
        ("help", with(&["--help"])),
        ("usage error", with(&["--no-such-flag"])),
        (
            "run's logs",
            with(&[
                "run",
                "--workspace",
                "/nonexistent/ws.ncl",
                "--sozu-socket",
                "/nonexistent/sozu.sock",
                "--admin-address",
                "127.0.0.1:0",
            ]),
        ),
        ("a diagnostic", with(&["check", &bad])),
    ];
    for (_, command) in &mut commands {
        command
            .env("TERM", "xterm-256color")
            .env_remove("NO_COLOR")
            .env_remove("CLICOLOR")
            .env_remove("CLICOLOR_FORCE")
            .envs(env.iter().copied());
    }
    commands
}

#[test]
fn no_color_turns_colour_off_on_a_terminal() {
    // Without NO_COLOR, or with it empty (which the convention reads as unset), the help, the
    // usage error and the logs are in colour: what NO_COLOR is seen to turn off.
    for env in [&[][..], &[("NO_COLOR", "")][..]] {
        for (what, mut command) in commands(env) {
            let (_, screen) = on_a_terminal(&mut command);
            let coloured = screen.contains('\u{1b}');
            // A diagnostic is never coloured: it is also logged and served as text.
            assert_eq!(
                coloured,
                what != "a diagnostic",
                "{what} ({env:?}):\n{screen}"
            );
        }
    }
    for value in ["1", "0", "false"] {
        for (what, mut command) in commands(&[("NO_COLOR", value)]) {
            let (code, screen) = on_a_terminal(&mut command);
            assert!(!screen.is_empty() && code != -1, "{what}: {code}");
            assert!(
                !screen.contains('\u{1b}'),
                "{what} (NO_COLOR={value}):\n{screen:?}"
            );
        }
    }
}

#[test]
fn no_colour_in_a_pipe() {
    for (what, mut command) in commands(&[]) {
        let (_, out, err) = run(&mut command);
        assert!(!out.is_empty() || !err.is_empty(), "{what}");
        assert!(
            !out.contains('\u{1b}') && !err.contains('\u{1b}'),
            "{what}:\n{out}{err}"
        );
    }
}
