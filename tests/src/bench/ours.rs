//! private-ingress + sozu 2.3.3: the pinned sozu (one worker) and the agent, as the integration
//! tests run them ([`Stack`]); the agent notices the `..data` rename itself.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;

use super::process::version_line;
use super::{Start, System, START_TIMEOUT};
use crate::live::{atomic_write, RouteSpec, Stack};
use crate::{agent_bin, sozu_bin};

pub struct Ours {
    stack: Stack,
}

pub fn version() -> Result<String, String> {
    let agent = version_line(
        Command::new(agent_bin()).arg("--version"),
        "private-ingress",
    )?;
    let sozu = version_line(Command::new(sozu_bin()).arg("--version"), "sozu")?;
    // "sozu 2.3.3 ()"
    Ok(format!(
        "{agent}, {}",
        sozu.trim_end_matches("()").trim_end()
    ))
}

pub fn start(start: &Start) -> Result<Box<dyn System>, String> {
    let stack = serve(
        &[(super::HOST.to_owned(), start.first)],
        start.backend.address,
    )?;
    Ok(Box::new(Ours { stack }))
}

/// sozu and the agent serving one route per host, each host's directory written the AtomicWriter
/// way with its pair; returns once `/readyz` answers. Also used by the mass renewal.
pub fn serve(
    hosts: &[(String, &super::workload::Pair)],
    backend: SocketAddr,
) -> Result<Stack, String> {
    let mut stack = Stack::new();
    let routes: Vec<RouteSpec> = hosts
        .iter()
        .map(|(host, pair)| {
            atomic_write(&stack.tls_dir().join(host), &pair.crt, &pair.key, 0);
            RouteSpec {
                host: host.clone(),
                upstream: backend.ip().to_string(),
                port: Some(backend.port()),
            }
        })
        .collect();
    stack.write_workspace(&stack.workspace_text(&routes));
    stack.start_sozu();
    // Warnings only: the agent logs every rotation at info level, which is not what is measured.
    stack.start_agent_with(&[], &[("RUST_LOG", "warn")]);
    let timeout = START_TIMEOUT + std::time::Duration::from_millis(20 * hosts.len() as u64);
    let deadline = std::time::Instant::now() + timeout;
    while !stack.ready() {
        if std::time::Instant::now() > deadline {
            return Err(format!(
                "the agent was not ready after {timeout:?}: {}",
                stack.logs()
            ));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    Ok(stack)
}

impl System for Ours {
    fn https(&self) -> SocketAddr {
        self.stack.https
    }

    fn cert_dir(&self) -> PathBuf {
        self.stack.tls_dir().join(super::HOST)
    }

    fn logs(&self) -> String {
        self.stack.logs()
    }
}
