//! Where the admin endpoints' bodies are rendered and deflated: one thread of its own, at a lower
//! CPU priority than the rest of the agent and than sozu.
//!
//! A scrape at 10,000 routes is tens of milliseconds of CPU (the traffic families rendered and
//! deflated at each one). On tokio's blocking pool that work competes for a core on equal terms
//! with a rotation: the tls dir thread reading the new pair, the loop sending it, and sozu's
//! processes applying it. At a nice value of [`crate::priority::NICE`] more, the scrape gets about
//! a tenth of a core's time while they want it, and takes what is left. A scraper waits a little
//! longer on a busy machine.
//!
//! One thread, so concurrent scrapes take turns; a body is cached between changes, so a second
//! scraper mostly gets the first one's bytes anyway.

use std::sync::mpsc::{channel, Sender};
use std::sync::{Mutex, OnceLock};

type Job = Box<dyn FnOnce() + Send>;

/// Runs `work` on the low-priority thread and waits for its result without holding a runtime
/// thread. A panic in `work` is resumed here, as `spawn_blocking` would. Should the thread be
/// gone (it cannot be started), the work goes to tokio's blocking pool instead: slower to yield
/// the core, never lost.
pub async fn run<T, F>(work: F) -> T
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let (done, result) = tokio::sync::oneshot::channel();
    let job: Job = Box::new(move || {
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work));
        let _ = done.send(outcome);
    });
    if let Err(job) = submit(job) {
        // The job sends its outcome on `done` like any other.
        let _ = tokio::task::spawn_blocking(job).await;
    }
    match result.await {
        Ok(Ok(value)) => value,
        Ok(Err(panic)) => std::panic::resume_unwind(panic),
        // The job was dropped unrun: only when its thread ended between taking it and running
        // it, which a caught panic does not do.
        Err(_) => panic!("the admin rendering thread dropped a job"),
    }
}

/// Hands `job` to the thread, starting it on first use; gives the job back when there is no
/// thread to take it.
fn submit(job: Job) -> Result<(), Job> {
    static THREAD: OnceLock<Option<Mutex<Sender<Job>>>> = OnceLock::new();
    let Some(sender) = THREAD.get_or_init(start) else {
        return Err(job);
    };
    let sender = sender.lock().unwrap_or_else(|p| p.into_inner());
    sender.send(job).map_err(|e| e.0)
}

fn start() -> Option<Mutex<Sender<Job>>> {
    let (jobs, received) = channel::<Job>();
    let started = std::thread::Builder::new()
        .name("admin-render".into())
        .spawn(move || {
            lower_own_priority();
            // Each job catches its own panic, so one bad render does not end the thread.
            while let Ok(job) = received.recv() {
                job();
            }
        });
    match started {
        Ok(_) => Some(Mutex::new(jobs)),
        Err(e) => {
            tracing::warn!(error = %e, "cannot start the admin rendering thread; rendering on the blocking pool");
            None
        }
    }
}

/// [`crate::priority::NICE`] more than the thread had (a new thread has its parent's).
fn lower_own_priority() {
    if let Err(e) = crate::priority::lower_this_thread() {
        tracing::warn!(error = %e, "cannot lower the admin rendering thread's priority");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nice_of_this_thread() -> rustix::io::Result<i32> {
        rustix::process::getpriority_process(Some(rustix::thread::gettid()))
    }

    /// Which thread ran the work: the rendering thread's id.
    fn this_thread() -> rustix::process::Pid {
        rustix::thread::gettid()
    }

    #[tokio::test]
    async fn work_runs_at_a_lower_priority_and_its_result_comes_back() {
        let before = nice_of_this_thread().expect("getpriority");
        let rendering = run(nice_of_this_thread).await.expect("getpriority");
        // The thread starts from the nice value of whichever thread first used it.
        assert!(
            rendering == 19 || rendering >= before + crate::priority::NICE,
            "the rendering thread runs at nice {rendering}, the caller at {before}"
        );
        assert_eq!(nice_of_this_thread().expect("getpriority"), before);
    }

    #[tokio::test]
    async fn a_panic_reaches_the_caller_and_the_thread_goes_on() {
        let thread = run(this_thread).await;
        let caught = tokio::spawn(run(|| -> u8 { panic!("render failed") })).await;
        let panic = caught
            .expect_err("the panic reaches the caller")
            .into_panic();
        assert_eq!(panic.downcast_ref::<&str>(), Some(&"render failed"));
        // The same thread, not the blocking pool taking over from a dead one.
        assert_eq!(run(this_thread).await, thread);
    }
}
