//! CPU priority: work that can wait takes a smaller share of a core than work that cannot.
//!
//! A rotation is a handful of milliseconds spread over several threads and processes (the tls
//! dir thread reading the new pair, the loop sending it, sozu's main process and worker applying
//! it), each woken in turn. Batch work beside them (a workspace's evaluation, most of a second of
//! CPU at 10,000 routes; an admin body rendered for a scrape) takes a core on equal terms unless
//! it is nicer: at [`NICE`] it gets about a tenth of the time of the rotation's steps while both
//! want a core. It does not make a woken step run at once: on Linux's EEVDF scheduler a task
//! already on a core keeps it until its slice ends or the next tick (4 ms on the reference
//! machine), nice or not, and a trace showed sozu's main process waiting 3.7 ms so behind an
//! evaluation (docs/benchmarks.md, "A rotation's event taken up at once").

/// How much nicer than the agent batch work runs. Linux's nice values run from -20 to 19; 10
/// more gives a thread about a tenth of the CPU share of the agent's other threads when both
/// want the same core. Raising one's own nice value needs no privilege.
pub const NICE: i32 = 10;

/// Raises the calling thread's nice value by [`NICE`], to at most 19. On Linux `setpriority`
/// with a thread id sets that thread's value alone; threads it starts afterwards inherit it.
pub fn lower_this_thread() -> rustix::io::Result<()> {
    let tid = rustix::thread::gettid();
    let now = rustix::process::getpriority_process(Some(tid))?;
    rustix::process::setpriority_process(Some(tid), (now + NICE).min(19))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_lowers_its_own_priority_alone() {
        let nice = || rustix::process::getpriority_process(Some(rustix::thread::gettid()));
        let caller = nice().expect("getpriority");
        let lowered = std::thread::spawn(move || {
            lower_this_thread().expect("setpriority");
            nice().expect("getpriority")
        })
        .join()
        .expect("the thread ends");
        assert!(
            lowered == 19 || lowered >= caller + NICE,
            "{lowered} against {caller}"
        );
        assert_eq!(
            nice().expect("getpriority"),
            caller,
            "the caller's is unchanged"
        );
    }
}
