//! Runs workspace evaluation in a child process, bounded in time and memory, and confined.
//!
//! Nickel has no step limit and a stack overflow aborts the whole process, so a workspace that
//! recurses without end would take the agent (and the proxy's configuration with it) down. The
//! child is this same binary, re-executed with a hidden subcommand and an empty environment: it
//! caps its own address space, runs at a lower CPU priority ([`crate::priority`]), restricts its
//! file access to reading the workspace's directory tree where the kernel has Landlock (besides
//! the import check of [`crate::evaluate::imports`], which holds everywhere), evaluates on a
//! thread with a large stack, and prints one JSON [`Report`] on stdout. A workspace already read
//! (standard input, a pipe: [`crate::evaluate::input`]) reaches the child on its standard input,
//! the one copy it evaluates. The parent reads at most [`MAX_REPORT_BYTES`] of the report, kills
//! the child at the deadline, turns a crash into an error that says what probably happened, and
//! cleans the diagnostic ([`crate::text`]) before anyone logs, serves or prints it.
//!
//! The memory cap follows the container: inside a cgroup with a `memory.max`, the child may
//! use at most what the cgroup has left beside the agent, so that a workspace that grows without
//! end fails its own evaluation instead of having the whole container OOM-killed.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::evaluate::contract::{self, ContractError};
use crate::evaluate::input::Input;
use crate::workspace::Workspace;

/// The hidden subcommand the child runs.
pub const CHILD_SUBCOMMAND: &str = "__evaluate-workspace";

/// Stack of the evaluation thread in the child. Deep but finite workspaces (long `let` chains,
/// recursive helpers) need far more than the default 8 MiB; an endless recursion still ends, in
/// a stack overflow the parent reports.
const EVAL_STACK_BYTES: usize = 512 << 20;

/// The child's report (a workspace of 10,000 routes is a few MB) and its error output are read
/// up to these sizes; a child that writes more is stopped.
pub const MAX_REPORT_BYTES: u64 = crate::evaluate::input::MAX_TEXT_BYTES;
const MAX_STDERR_BYTES: u64 = 1 << 20;
/// What the agent itself is left, in a cgroup with a memory limit, when the child's cap is worked
/// out from what the cgroup has left.
const AGENT_HEADROOM_BYTES: u64 = 64 << 20;

#[derive(Debug, Clone)]
pub struct Limits {
    /// Wall-clock time the evaluation may take.
    pub timeout: Duration,
    /// Address space the child may map (its stack included), at most; less when the cgroup has
    /// less left (see the module).
    pub memory_bytes: u64,
    /// The directory tree the workspace may read: its own directory when `None`.
    pub root: Option<PathBuf>,
    /// What the workspace is evaluated for.
    pub target: crate::evaluate::contract::Target,
    /// The port of the agent's admin server (`--admin-address`): no route may take it.
    pub admin_port: u16,
}

impl Default for Limits {
    /// 10,000 routes evaluate in about a second with ~200 MiB; these leave a wide margin.
    fn default() -> Self {
        Limits {
            timeout: Duration::from_secs(30),
            memory_bytes: 4 << 30,
            root: None,
            target: crate::evaluate::contract::Target::Agent,
            admin_port: contract::DEFAULT_ADMIN_PORT,
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
    #[error("cannot start the evaluation process {}: {error}", exe.display())]
    Spawn { exe: PathBuf, error: std::io::Error },
    #[error("evaluating {} wrote more than {} bytes and was stopped", path.display(), MAX_REPORT_BYTES)]
    TooLarge { path: PathBuf },
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
                | SandboxError::TooLarge { .. }
        )
    }
}

/// What the child prints on stdout.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Report {
    Ok(Box<Workspace>),
    Unreadable { path: PathBuf, reason: String },
    Invalid { diagnostic: String },
}

/// Evaluates `path` in a child process running `exe` (normally `std::env::current_exe()`).
pub fn evaluate(exe: &Path, path: &Path, limits: &Limits) -> Result<Workspace, SandboxError> {
    evaluate_input(exe, &Input::File(path.to_owned()), limits)
}

/// [`evaluate`] for a workspace that is a file or text already read: the text goes to the child
/// on its standard input, the one copy it evaluates.
pub fn evaluate_input(
    exe: &Path,
    input: &Input,
    limits: &Limits,
) -> Result<Workspace, SandboxError> {
    let path = input.path();
    let path = path.as_path();
    let memory = cap_for_cgroup(limits.memory_bytes, cgroup_room());
    let mut command = Command::new(exe);
    command
        .env_clear()
        .arg(CHILD_SUBCOMMAND)
        .arg("--memory-limit")
        .arg(memory.to_string())
        .arg("--admin-port")
        .arg(limits.admin_port.to_string());
    if let Some(root) = &limits.root {
        command.arg("--root").arg(root);
    }
    match limits.target {
        contract::Target::Agent => {}
        contract::Target::SozuToml => {
            command.arg("--for-sozu-toml");
        }
        contract::Target::K8s => {
            command.arg("--for-k8s");
        }
    }
    let text = match input {
        Input::File(path) => {
            command.arg(path).stdin(Stdio::null());
            None
        }
        Input::Text { name, text } => {
            command
                .arg("--name")
                .arg(name)
                .arg("-")
                .stdin(Stdio::piped());
            Some(text.clone())
        }
    };
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|error| SandboxError::Spawn {
            exe: exe.to_owned(),
            error,
        })?;
    // On a thread of its own: the child may stop reading (a limit), and the deadline below
    // still holds. A child gone early fails the write, which the report then explains.
    if let (Some(text), Some(mut stdin)) = (text, child.stdin.take()) {
        std::thread::spawn(move || {
            use std::io::Write;
            let _ = stdin.write_all(text.as_bytes());
        });
    }

    // Drain both pipes while waiting: a large report would otherwise block the child on a full pipe.
    // The child's stdout closing is its exit (or close to it): waiting on that wakes the parent
    // the moment the report is complete, where polling would add up to a poll interval to
    // every evaluation.
    let (closed_tx, closed) = std::sync::mpsc::channel();
    let stdout = child
        .stdout
        .take()
        .map(|pipe| drain(pipe, MAX_REPORT_BYTES, Some(closed_tx)));
    let stderr = child
        .stderr
        .take()
        .map(|pipe| drain(pipe, MAX_STDERR_BYTES, None));

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
            Err(error) => {
                let _ = child.kill();
                return Err(SandboxError::Spawn {
                    exe: exe.to_owned(),
                    error,
                });
            }
        }
    };
    let (stdout, too_large) = stdout.and_then(|h| h.join().ok()).unwrap_or_default();
    let (stderr, _) = stderr.and_then(|h| h.join().ok()).unwrap_or_default();
    if too_large {
        return Err(SandboxError::TooLarge {
            path: path.to_owned(),
        });
    }

    match serde_json::from_slice::<Report>(&stdout) {
        Ok(Report::Ok(workspace)) if status.success() => Ok(*workspace),
        Ok(Report::Unreadable { path, reason }) => Err(ContractError::Unreadable {
            path,
            reason: crate::text::clean_line(&reason, crate::text::MAX_LINE_BYTES),
        }
        .into()),
        Ok(Report::Invalid { diagnostic }) => Err(ContractError::Invalid {
            diagnostic: crate::text::clean(&diagnostic, crate::text::MAX_DIAGNOSTIC_BYTES),
        }
        .into()),
        _ => Err(SandboxError::Crashed {
            path: path.to_owned(),
            cause: crash_cause(status, &String::from_utf8_lossy(&stderr)),
        }),
    }
}

/// Reads `pipe` to its end, or to `limit` bytes, on a thread; says so on `closed`, if given.
/// Returns what was read and whether there was more (the child is stopped then: it would block
/// on a full pipe).
fn drain(
    pipe: impl Read + Send + 'static,
    limit: u64,
    closed: Option<std::sync::mpsc::Sender<()>>,
) -> std::thread::JoinHandle<(Vec<u8>, bool)> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let mut pipe = pipe.take(limit + 1);
        let _ = pipe.read_to_end(&mut buf);
        let too_large = buf.len() as u64 > limit;
        buf.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
        if let Some(closed) = closed {
            let _ = closed.send(());
        }
        (buf, too_large)
    })
}

/// What the child may map: `configured`, or what the cgroup has left beside the agent when that
/// is less (`room`, see [`cgroup_room`]).
pub fn cap_for_cgroup(configured: u64, room: Option<u64>) -> u64 {
    match room {
        Some(room) => configured.min(room.saturating_sub(AGENT_HEADROOM_BYTES)),
        None => configured,
    }
}

/// The memory this process's cgroup has left (`memory.max` minus `memory.current`), or `None`
/// where it has no limit (or is not a cgroup v2 with the memory controller).
pub fn cgroup_room() -> Option<u64> {
    let membership = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let dir = cgroup_dir(&membership)?;
    let base = Path::new("/sys/fs/cgroup").join(dir.trim_start_matches('/'));
    let max = std::fs::read_to_string(base.join("memory.max")).ok()?;
    let current = std::fs::read_to_string(base.join("memory.current")).ok()?;
    room(&max, &current)
}

/// The cgroup v2 directory in `/proc/self/cgroup` (the `0::` line).
fn cgroup_dir(membership: &str) -> Option<&str> {
    membership.lines().find_map(|l| l.strip_prefix("0::"))
}

/// `memory.max` (`max` when unlimited) minus `memory.current`.
fn room(max: &str, current: &str) -> Option<u64> {
    let max: u64 = max.trim().parse().ok()?;
    let current: u64 = current.trim().parse().ok()?;
    Some(max.saturating_sub(current))
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

/// The child's side: cap memory, confine reads, evaluate on a big stack, print the report.
/// With a `name`, the workspace is the text on standard input, called `name`. Returns the
/// process exit code.
pub fn child_main(
    path: &Path,
    root: Option<&Path>,
    memory_bytes: u64,
    name: Option<&str>,
    target: contract::Target,
    admin_port: u16,
) -> i32 {
    // The cap is best effort: without it the deadline still bounds the child.
    let _ = rlimit::setrlimit(rlimit::Resource::AS, memory_bytes, memory_bytes);
    // An evaluation can wait: at 10,000 routes it is most of a second of CPU after each edit,
    // and at the agent's priority it held up rotations on a busy machine. Best effort, before
    // the evaluation's thread starts (it inherits it).
    let _ = crate::priority::lower_this_thread();
    crate::memory::use_one_heap();
    let input = match name {
        None => Input::File(path.to_owned()),
        Some(name) => {
            let mut text = String::new();
            if let Err(err) = std::io::stdin()
                .take(crate::evaluate::input::MAX_TEXT_BYTES)
                .read_to_string(&mut text)
            {
                eprintln!("cannot read the workspace from standard input: {err}");
                return 3;
            }
            Input::Text {
                name: name.to_owned(),
                text,
            }
        }
    };
    // Best effort too: the import check of `contract` holds without it. A workspace read as
    // text reads from the current directory.
    if let Ok(tree) = crate::evaluate::imports::Root::of(&input.path(), root) {
        let _ = confine_reads(tree.real());
    }
    let root = root.map(Path::to_owned);
    // The stack counts against the cap: keep it to a quarter, so a small cap still evaluates.
    let stack = EVAL_STACK_BYTES.min(usize::try_from(memory_bytes / 4).unwrap_or(usize::MAX));
    let evaluation = std::thread::Builder::new()
        .name("evaluate".into())
        .stack_size(stack)
        .spawn(move || {
            contract::evaluate_input_for(
                &input,
                root.as_deref(),
                target,
                admin_port,
                contract::Afterwards::LeftToExit,
            )
        });
    let report = match evaluation.map(|h| h.join()) {
        Ok(Ok(Ok(workspace))) => Report::Ok(Box::new(workspace)),
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
    // Standard output is line-buffered and the report one line: unbuffered here, it left in
    // about 1 KiB writes (1,900 at 10,000 routes), each waking the agent's reading thread.
    let mut out = std::io::BufWriter::with_capacity(REPORT_WRITES, std::io::stdout().lock());
    let written = serde_json::to_writer(&mut out, &report)
        .map_err(std::io::Error::from)
        .and_then(|()| out.flush());
    // The process exits now: the workspace is left to the exit, as its evaluation was.
    std::mem::forget(report);
    match written {
        Ok(()) => 0,
        Err(err) => {
            eprintln!("cannot write the report: {err}");
            3
        }
    }
}

/// How much of the report the child writes at a time: a pipe's default capacity, so that the
/// agent takes each in one read.
const REPORT_WRITES: usize = 64 * 1024;

/// Restricts this process (and the threads it starts after) to reading files under `tree`, and
/// to nothing else on the file system: Landlock, where the kernel has it. Returns whether it is
/// in force.
fn confine_reads(tree: &Path) -> Result<bool, landlock::RulesetError> {
    use landlock::{
        path_beneath_rules, Access, AccessFs, Ruleset, RulesetAttr, RulesetCreatedAttr,
        RulesetStatus, ABI,
    };
    let abi = ABI::V1;
    let status = Ruleset::default()
        .handle_access(AccessFs::from_all(abi))?
        .create()?
        .add_rules(path_beneath_rules([tree], AccessFs::from_read(abi)))?
        .restrict_self()?;
    Ok(status.ruleset != RulesetStatus::NotEnforced)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_is_what_the_cgroup_has_left_beside_the_agent() {
        assert_eq!(
            cgroup_dir("12:cpu:/x\n0::/kubepods/pod1/agent\n"),
            Some("/kubepods/pod1/agent")
        );
        assert_eq!(room("max\n", "1000\n"), None);
        let mib = 1 << 20;
        // A 512 MiB container whose agent uses 100 MiB: the child gets 348 MiB, not 4 GiB.
        let left = room(&format!("{}\n", 512 * mib), &format!("{}\n", 100 * mib));
        assert_eq!(cap_for_cgroup(4 << 30, left), 348 * mib);
        assert_eq!(cap_for_cgroup(256 * mib, left), 256 * mib);
        assert_eq!(cap_for_cgroup(4 << 30, None), 4 << 30);
    }
}
