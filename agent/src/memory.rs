//! The places the agent tells glibc's allocator how to behave. All are plain foreign calls
//! with no safe wrapper, and this module is the crate's only exception to `deny(unsafe_code)`.

/// Returns freed heap pages to the system. glibc keeps what a bulk pass freed as part of the
/// process's resident memory otherwise, and a sidecar is sized by its resident memory at rest.
#[allow(unsafe_code)]
pub fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes no pointers; it only walks and releases glibc's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// What glibc's heap holds: bytes in use by the program, and bytes freed but kept (in the heap's
/// free lists, part of the resident memory until trimmed or reused). `None` off glibc.
///
/// Logged after each trim, so that a figure of resident memory can be split between what the
/// agent keeps alive and what the allocator keeps for it.
#[allow(unsafe_code)]
pub fn heap_usage() -> Option<(usize, usize)> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallinfo2 takes nothing and returns a plain struct by value.
        let info = unsafe { libc::mallinfo2() };
        Some((info.uordblks + info.hblkhd, info.fordblks))
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    None
}

/// Makes every thread of this process allocate from the main heap. Call it before the first
/// thread starts.
///
/// The evaluation child allocates almost everything on its one evaluation thread. glibc gives
/// such a thread a heap of its own, which it grows a few pages at a time with one `mprotect`
/// each; the main heap grows by `brk` with room to spare. At 1,000 routes that was 6–8 ms of a
/// 75 ms evaluation.
///
/// The agent (`run`) too: its passes, its scrapes and its readers run on several threads, and
/// glibc gave each its own heap (up to 8 per core). What one pass frees in one heap the next,
/// on another thread, does not reuse, and a page of a heap holding any live allocation stays
/// resident after a trim: at 10,000 routes, one heap held the agent 17 MiB lower at rest and
/// 25 MiB lower after renewing every certificate (docs/benchmarks.md, "Memory after a full
/// renewal at 10,000 routes"), rotations as fast.
#[allow(unsafe_code)]
pub fn use_one_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt takes two integers and only changes a glibc setting; nothing allocated
    // before the call is affected.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// The size from which an allocation gets pages of its own (`mmap`), handed back to the system
/// when it is freed.
const MAPPED_FROM: i32 = 4 << 20;

/// How much free space at the heap's top glibc keeps before handing it back on a `free`.
const KEPT_AT_TOP: i32 = 8 << 20;

/// Makes buffers of [`MAPPED_FROM`] bytes or more pages of their own, returned to the system
/// when freed, for the agent's life. Call it before the first thread starts.
///
/// A scrape of `/metrics` writes megabytes (11 MB at 10,000 routes, 56 MB with traffic) into
/// a buffer freed once it is sent. glibc maps the first such buffer, and on its free raises its
/// threshold for mapping to that size, and the size it keeps at the heap's top to twice that:
/// every later body is carved from the heap, and its pages stay resident after the response.
/// At 10,000 routes after a full renewal that was up to 30 MiB a `malloc_trim(0)` could still
/// hand back (docs/benchmarks.md, "One copy each"). A fixed threshold turns that adjustment off.
#[allow(unsafe_code)]
pub fn map_big_buffers() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt takes two integers and only changes a glibc setting; nothing allocated
    // before the call is affected.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MAPPED_FROM);
        libc::mallopt(libc::M_TRIM_THRESHOLD, KEPT_AT_TOP);
    }
}

/// Frees small chunks straight into glibc's bins, merged with their free neighbours at once,
/// instead of into its "fast bins", for the agent's life. Call it before the first thread
/// starts.
///
/// With one heap for every thread ([`use_one_heap`]), what one thread frees in fast bins is
/// merged by whichever thread next asks for a larger block (`malloc_consolidate`, a walk over
/// every chunk in them). An edit at 10,000 routes frees hundreds of thousands of small chunks
/// (the last workspace, its indexes); the next rotation's pair read asked for a few KiB and
/// paid for all of them: 3–10 ms of CPU on the tls dir thread for a read that takes 0.3 ms,
/// with the rotation waiting (docs/benchmarks.md, "The edits alone, a faithful floor, and the
/// allocator's bill"). Without fast bins
/// each free does its own small merge, on the thread that frees; glibc's per-thread cache still
/// serves the commonest small sizes as before.
#[allow(unsafe_code)]
pub fn merge_on_free() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt takes two integers and only changes a glibc setting; nothing allocated
    // before the call is affected.
    unsafe {
        libc::mallopt(libc::M_MXFAST, 0);
    }
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    use super::*;

    /// Bytes in glibc's fast bins, over every heap.
    #[allow(unsafe_code)]
    fn in_fast_bins() -> usize {
        // SAFETY: mallinfo2 takes nothing and returns a plain struct by value.
        unsafe { libc::mallinfo2() }.fsmblks
    }

    #[test]
    fn small_chunks_freed_wait_in_no_fast_bin() {
        // For the whole test process: the other tests only allocate a little differently.
        merge_on_free();
        // What anything freed into fast bins before the setting is merged by the trim.
        release_freed_memory();
        // Few enough that their list is freed under 64 KiB: a larger free merges the fast bins.
        let chunks: Vec<Box<[u8; 24]>> = (0..2_000)
            .map(|i| std::hint::black_box(Box::new([i as u8; 24])))
            .collect();
        drop(std::hint::black_box(chunks));
        assert_eq!(in_fast_bins(), 0, "bytes freed into fast bins");
    }
}
