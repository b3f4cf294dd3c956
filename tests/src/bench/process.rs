//! Peer processes: each in its own process group with its output in a log file, so that dropping
//! it (also while a panic unwinds) ends the whole group — nginx's workers, a watcher script's
//! inotifywait and any socat it has running — and reaps the leader.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A process group led by a child of ours.
pub struct Group {
    child: Child,
    pub log: PathBuf,
}

impl Group {
    /// Starts `cmd` as the leader of a new process group, stdout and stderr to `log`.
    pub fn spawn(cmd: &mut Command, log: &Path) -> Result<Group, String> {
        let out =
            std::fs::File::create(log).map_err(|e| format!("create {}: {e}", log.display()))?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0)
            .spawn()
            .map_err(|e| format!("cannot start {cmd:?}: {e}"))?;
        Ok(Group {
            child,
            log: log.to_owned(),
        })
    }

    /// `Err` with the log's tail when the leader has already exited.
    pub fn check_running(&mut self) -> Result<(), String> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(format!("exited ({status}): {}", self.log_tail(5))),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Waits until the log contains `needle` (a process saying it is ready).
    pub fn wait_for_log(&mut self, needle: &str, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        loop {
            if std::fs::read_to_string(&self.log).is_ok_and(|t| t.contains(needle)) {
                return Ok(());
            }
            self.check_running()?;
            if Instant::now() > deadline {
                return Err(format!("no {needle:?} in its log after {timeout:?}"));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The last `lines` lines of the log, on one line.
    pub fn log_tail(&self, lines: usize) -> String {
        tail(&self.log, lines)
    }
}

impl Group {
    /// Sends `signal` to every process of the group (its id is the leader's pid).
    fn signal_group(&self, signal: &str) {
        let _ = Command::new("kill")
            .args([signal, "--", &format!("-{}", self.child.id())])
            .stderr(Stdio::null())
            .status();
    }
}

impl Drop for Group {
    /// SIGTERM to the group, so that servers exit cleanly and a watcher script reaps its
    /// pipeline; SIGKILL to whatever is left after a second; the leader reaped either way.
    fn drop(&mut self) {
        self.signal_group("-TERM");
        let deadline = Instant::now() + Duration::from_secs(1);
        while Instant::now() < deadline && matches!(self.child.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(10));
        }
        self.signal_group("-KILL");
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The last `lines` lines of a file, joined with " | ".
pub fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut last: Vec<&str> = text.lines().rev().take(lines).collect();
    last.reverse();
    last.join(" | ")
}

/// Runs a version command and returns the first line that mentions `word` (stdout or stderr).
pub fn version_line(cmd: &mut Command, word: &str) -> Result<String, String> {
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    text.lines()
        .find(|l| l.to_lowercase().contains(word))
        .map(|l| l.trim().to_owned())
        .ok_or_else(|| format!("{cmd:?} printed no version: {text}"))
}
