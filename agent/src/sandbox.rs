//! Runs workspace evaluation in a child process, bounded in time and memory.
//!
//! Nickel has no step limit and a stack overflow aborts the whole process, so a workspace that
//! recurses without end would take the agent (and the proxy's configuration with it) down. The
//! child is this same binary, re-executed with a hidden subcommand: it caps its own address space,
//! evaluates on a thread with a large stack, and prints one JSON [`Report`] on stdout. The parent
//! kills it at the deadline and turns a crash into an error that says what probably happened.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::contract::{self, ContractError};
use crate::workspace::Workspace;

/// The hidden subcommand the child runs.
pub const CHILD_SUBCOMMAND: &str = "__evaluate-workspace";

/// Stack of the evaluation thread in the child. Deep but finite workspaces (long `let` chains,
/// recursive helpers) need far more than the default 8 MiB; an endless recursion still ends, in
/// a stack overflow the parent reports.
const EVAL_STACK_BYTES: usize = 512 << 20;

#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Wall-clock time the evaluation may take.
    pub timeout: Duration,
    /// Address space the child may map (its stack included).
    pub memory_bytes: u64,
}

impl Default for Limits {
    /// 10,000 routes evaluate in about a second with ~200 MiB; these leave a wide margin.
    fn default() -> Self {
        Limits {
            timeout: Duration::from_secs(30),
            memory_bytes: 4 << 30,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error(transparent)]
    Contract(#[from] ContractError),
    #[error("evaluating {} took longer than {} s and was stopped (does the workspace recurse without end?)", path.display(), timeout.as_secs_f64())]
    TimedOut { path: PathBuf, timeout: Duration },
    #[error("evaluating {} {cause}", path.display())]
    Crashed { path: PathBuf, cause: String },
    #[error("cannot start the evaluation process {}: {source}", exe.display())]
    Spawn {
        exe: PathBuf,
        source: std::io::Error,
    },
}

impl SandboxError {
    /// True when the workspace itself is at fault (as opposed to the file being unreadable or the
    /// machine refusing to run the child).
    pub fn is_invalid_workspace(&self) -> bool {
        matches!(
            self,
            SandboxError::Contract(ContractError::Invalid { .. })
                | SandboxError::TimedOut { .. }
                | SandboxError::Crashed { .. }
        )
    }
}

/// What the child prints on stdout.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Report {
    Ok(Workspace),
    Unreadable { path: PathBuf, reason: String },
    Invalid { diagnostic: String },
}

/// Evaluates `path` in a child process running `exe` (normally `std::env::current_exe()`).
pub fn evaluate(exe: &Path, path: &Path, limits: Limits) -> Result<Workspace, SandboxError> {
    let mut child = Command::new(exe)
        .arg(CHILD_SUBCOMMAND)
        .arg("--memory-limit")
        .arg(limits.memory_bytes.to_string())
        .arg(path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| SandboxError::Spawn {
            exe: exe.to_owned(),
            source,
        })?;

    // Drain both pipes while waiting: a large report would otherwise block the child on a full pipe.
    // The child's stdout closing is its exit (or close to it): waiting on that wakes the parent
    // the moment the report is complete, where polling would add up to a poll interval to
    // every evaluation.
    let (closed_tx, closed) = std::sync::mpsc::channel();
    let stdout = child.stdout.take().map(|pipe| drain(pipe, Some(closed_tx)));
    let stderr = child.stderr.take().map(|pipe| drain(pipe, None));

    let deadline = Instant::now() + limits.timeout;
    let _ = closed.recv_timeout(limits.timeout);
    let mut pause = Duration::from_millis(1);
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(SandboxError::TimedOut {
                    path: path.to_owned(),
                    timeout: limits.timeout,
                });
            }
            // Closed its stdout but not exited yet: the last moments of the process.
            Ok(None) => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(20));
            }
            Err(source) => {
                let _ = child.kill();
                return Err(SandboxError::Spawn {
                    exe: exe.to_owned(),
                    source,
                });
            }
        }
    };
    let stdout = stdout.and_then(|h| h.join().ok()).unwrap_or_default();
    let stderr = stderr.and_then(|h| h.join().ok()).unwrap_or_default();

    match serde_json::from_slice::<Report>(&stdout) {
        Ok(Report::Ok(workspace)) if status.success() => Ok(workspace),
        Ok(Report::Unreadable { path, reason }) => {
            Err(ContractError::Unreadable { path, reason }.into())
        }
        Ok(Report::Invalid { diagnostic }) => Err(ContractError::Invalid { diagnostic }.into()),
        _ => Err(SandboxError::Crashed {
            path: path.to_owned(),
            cause: crash_cause(status, &String::from_utf8_lossy(&stderr)),
        }),
    }
}

/// Reads `pipe` to its end on a thread; says so on `closed`, if given.
fn drain(
    mut pipe: impl Read + Send + 'static,
    closed: Option<std::sync::mpsc::Sender<()>>,
) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = pipe.read_to_end(&mut buf);
        if let Some(closed) = closed {
            let _ = closed.send(());
        }
        buf
    })
}

fn crash_cause(status: ExitStatus, stderr: &str) -> String {
    if stderr.contains("overflowed its stack") {
        "overflowed the stack (does the workspace recurse without end?)".into()
    } else if stderr.contains("memory allocation") {
        "ran out of memory (does the workspace recurse or grow without end?)".into()
    } else {
        let last_line = stderr.lines().rev().find(|l| !l.trim().is_empty());
        match last_line {
            Some(line) => format!("failed ({status}): {line}"),
            None => format!("failed ({status})"),
        }
    }
}

/// The child's side: cap memory, evaluate on a big stack, print the report. Returns the process
/// exit code.
pub fn child_main(path: &Path, memory_bytes: u64) -> i32 {
    // The cap is best effort: without it the deadline still bounds the child.
    let _ = rlimit::setrlimit(rlimit::Resource::AS, memory_bytes, memory_bytes);
    crate::memory::use_one_heap();
    let path = path.to_owned();
    // The stack counts against the cap: keep it to a quarter, so a small cap still evaluates.
    let stack = EVAL_STACK_BYTES.min(usize::try_from(memory_bytes / 4).unwrap_or(usize::MAX));
    let evaluation = std::thread::Builder::new()
        .name("evaluate".into())
        .stack_size(stack)
        .spawn(move || contract::evaluate(&path));
    let report = match evaluation.map(|h| h.join()) {
        Ok(Ok(Ok(workspace))) => Report::Ok(workspace),
        Ok(Ok(Err(ContractError::Unreadable { path, reason }))) => {
            Report::Unreadable { path, reason }
        }
        Ok(Ok(Err(ContractError::Invalid { diagnostic }))) => Report::Invalid { diagnostic },
        Ok(Err(_panic)) => {
            eprintln!("the evaluation panicked");
            return 3;
        }
        Err(err) => {
            eprintln!("cannot start the evaluation thread: {err}");
            return 3;
        }
    };
    match serde_json::to_writer(std::io::stdout().lock(), &report) {
        Ok(()) => 0,
        Err(err) => {
            eprintln!("cannot write the report: {err}");
            3
        }
    }
}

/// [`LoadWorkspace`] through this sandbox, off the async runtime.
///
/// [`LoadWorkspace`]: crate::sources::workspace::LoadWorkspace
pub struct SandboxLoader {
    pub exe: PathBuf,
    pub path: PathBuf,
    pub limits: Limits,
}

impl crate::sources::workspace::LoadWorkspace for SandboxLoader {
    async fn load(&self) -> Result<Workspace, SandboxError> {
        let (exe, path, limits) = (self.exe.clone(), self.path.clone(), self.limits);
        tokio::task::spawn_blocking(move || evaluate(&exe, &path, limits))
            .await
            .map_err(|e| SandboxError::Crashed {
                path: self.path.clone(),
                cause: format!("could not be waited for: {e}"),
            })?
    }
}
