//! The agent's long-lived tasks and threads, by name, and the first of them to end.
//!
//! Every task of a running agent (the reconcile loop, each source, the admin server, the
//! issuer) lives as long as the agent does. One that ends or panics leaves an agent that still
//! answers its probes but no longer does its work, and only a restart repairs that: so the
//! agent exits non-zero, naming the task, and the kubelet (or systemd) starts it again. A
//! panic inside a task is caught where it happened (tokio's `JoinError`, a thread's unwinding),
//! so the supervisor sees it whatever the task was doing.

use std::collections::BTreeMap;
use std::future::Future;

use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use tokio::task::{AbortHandle, Id, JoinSet};

/// How a supervised task or thread ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ended {
    pub task: &'static str,
    /// `None`: it returned; else what it panicked with.
    pub panic: Option<String>,
}

impl std::fmt::Display for Ended {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.panic {
            None => write!(f, "the {} task ended", self.task),
            Some(message) => write!(f, "the {} task panicked: {message}", self.task),
        }
    }
}

/// The tasks and threads watched.
pub struct Supervisor {
    tasks: JoinSet<&'static str>,
    names: BTreeMap<Id, &'static str>,
    threads: UnboundedSender<Ended>,
    thread_ends: UnboundedReceiver<Ended>,
    live_threads: usize,
}

impl Default for Supervisor {
    fn default() -> Self {
        let (threads, thread_ends) = unbounded_channel();
        Supervisor {
            tasks: JoinSet::new(),
            names: BTreeMap::new(),
            threads,
            thread_ends,
            live_threads: 0,
        }
    }
}

impl Supervisor {
    /// Runs `future` as the task `name`.
    pub fn spawn<F>(&mut self, name: &'static str, future: F) -> AbortHandle
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let future = faults::inject(name, future);
        let handle = self.tasks.spawn(async move {
            future.await;
            name
        });
        self.names.insert(handle.id(), name);
        handle
    }

    /// Watches a task already running (one a source spawned itself).
    pub fn adopt(&mut self, name: &'static str, task: tokio::task::JoinHandle<()>) {
        self.spawn(name, async move {
            if let Err(e) = task.await {
                if let Ok(panic) = e.try_into_panic() {
                    std::panic::resume_unwind(panic);
                }
            }
        });
    }

    /// A guard that a thread holds for its whole life: when the thread returns or unwinds, the
    /// guard is dropped and the supervisor learns it.
    pub fn thread(&mut self, name: &'static str) -> ThreadGuard {
        self.live_threads += 1;
        ThreadGuard {
            task: name,
            ended: self.threads.clone(),
        }
    }

    /// The first task or thread to end from now on. Pending for ever when none is watched.
    pub async fn ended(&mut self) -> Ended {
        loop {
            tokio::select! {
                Some(done) = self.tasks.join_next_with_id(), if !self.tasks.is_empty() => {
                    return match done {
                        Ok((id, task)) => {
                            self.names.remove(&id);
                            Ended { task, panic: None }
                        }
                        Err(e) => {
                            let task = self.names.remove(&e.id()).unwrap_or("unnamed");
                            let panic = if e.is_panic() {
                                panic_message(e.into_panic())
                            } else {
                                "cancelled".to_owned()
                            };
                            Ended { task, panic: Some(panic) }
                        }
                    };
                }
                Some(ended) = self.thread_ends.recv(), if self.live_threads > 0 => {
                    self.live_threads -= 1;
                    return ended;
                }
                else => std::future::pending::<()>().await,
            }
        }
    }

    /// Stops every task (threads stop on their own once the channels they read close).
    pub fn abort_all(&mut self) {
        self.tasks.abort_all();
    }
}

/// Held by a supervised thread; see [`Supervisor::thread`].
pub struct ThreadGuard {
    task: &'static str,
    ended: UnboundedSender<Ended>,
}

impl Drop for ThreadGuard {
    fn drop(&mut self) {
        let panic = std::thread::panicking().then(|| "see the panic message above".to_owned());
        let _ = self.ended.send(Ended {
            task: self.task,
            panic,
        });
    }
}

/// A panic's payload as text.
fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    match payload.downcast::<String>() {
        Ok(text) => *text,
        Err(payload) => match payload.downcast::<&'static str>() {
            Ok(text) => (*text).to_owned(),
            Err(_) => "a panic without a message".to_owned(),
        },
    }
}

/// Faults the integration tests inject into a running agent (a build with the `test-hooks`
/// feature only): `PRIVATE_INGRESS_TEST_FAULT=<task>:panic` makes the task panic, and
/// `<task>:wedge` makes it stop being polled while it still holds everything it holds, each at
/// the first SIGUSR1.
#[cfg(feature = "test-hooks")]
mod faults {
    use std::future::Future;
    use std::pin::Pin;

    pub fn inject<F>(name: &'static str, future: F) -> Pin<Box<dyn Future<Output = ()> + Send>>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let fault = std::env::var("PRIVATE_INGRESS_TEST_FAULT").unwrap_or_default();
        let Some((task, kind)) = fault.split_once(':') else {
            return Box::pin(future);
        };
        if task != name {
            return Box::pin(future);
        }
        let kind = kind.to_owned();
        tracing::warn!(task, fault = %kind, "a fault will be injected at SIGUSR1 (test build)");
        let mut signal =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined1()) {
                Ok(signal) => signal,
                Err(_) => return Box::pin(future),
            };
        Box::pin(async move {
            let mut future = std::pin::pin!(future);
            tokio::select! {
                () = &mut future => {}
                _ = signal.recv() => {
                    if kind == "wedge" {
                        tracing::warn!(task = name, "fault injected: the task is wedged");
                        std::future::pending::<()>().await;
                    }
                    panic!("fault injected into the {name} task");
                }
            }
        })
    }
}

#[cfg(not(feature = "test-hooks"))]
mod faults {
    pub fn inject<F>(_: &'static str, future: F) -> F {
        future
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_task_that_ends_or_panics_is_named() {
        let mut supervisor = Supervisor::default();
        let (go, wait) = tokio::sync::oneshot::channel::<()>();
        supervisor.spawn("dns", async move {
            let _ = wait.await;
        });
        supervisor.spawn("reconcile", async {
            tokio::task::yield_now().await;
            panic!("boom");
        });
        assert_eq!(
            supervisor.ended().await,
            Ended {
                task: "reconcile",
                panic: Some("boom".into())
            }
        );
        drop(go);
        assert_eq!(
            supervisor.ended().await,
            Ended {
                task: "dns",
                panic: None
            }
        );
    }

    #[tokio::test]
    async fn a_thread_that_ends_or_panics_is_named() {
        let mut supervisor = Supervisor::default();
        let guard = supervisor.thread("tls-dir");
        std::thread::spawn(move || {
            let _guard = guard;
            panic!("boom");
        });
        let ended = supervisor.ended().await;
        assert_eq!(ended.task, "tls-dir");
        assert!(ended.panic.is_some());
        let guard = supervisor.thread("sozu-events");
        std::thread::spawn(move || drop(guard));
        assert_eq!(
            supervisor.ended().await,
            Ended {
                task: "sozu-events",
                panic: None
            }
        );
    }

    #[tokio::test]
    async fn an_adopted_task_s_panic_is_its_own() {
        let mut supervisor = Supervisor::default();
        supervisor.adopt(
            "workspace",
            tokio::spawn(async {
                panic!("bad");
            }),
        );
        assert_eq!(
            supervisor.ended().await,
            Ended {
                task: "workspace",
                panic: Some("bad".into())
            }
        );
    }
}
