//! glibc malloc tuning for a long-lived agent whose blocking pool briefly runs many threads.
//! By default each such thread gets its own arena, and buffers of a few hundred KiB (libblkid
//! reads 256 KiB at a time) move from mmap into those arenas once the dynamic mmap threshold has
//! risen; freed, they stay in the arenas, so the agent's RSS after a burst of 128 stages stayed
//! about four times its idle size. Two arenas, a fixed mmap threshold and a periodic trim give the
//! memory back.
//!
//! The threshold is 1 MiB, above libblkid's 256 KiB read buffers: at 128 KiB every probe mapped,
//! faulted in, zeroed and unmapped four of them (the unmap a TLB shootdown on every CPU), which the
//! bench measured at about 0.5 ms of CPU per volume cycle; from the arenas they are reused.
//!
//! Reused only if free does not hand them straight back: fixing the mmap threshold also fixes
//! the trim threshold, at glibc's default of 128 KiB, so a freed buffer at the top of an arena
//! was returned to the kernel at once (brk, or madvise for the second arena), and the next
//! allocation faulted and zeroed its pages again: malloc, page faults and page clearing were
//! about a tenth of the agent's CPU in a concurrency-16 cycle. The trim threshold is 8 MiB, a
//! few dozen such buffers; what is held above the working set goes back at the periodic trim
//! below (`malloc_trim` ignores the threshold), within 10 s of a burst.
/// Applies the settings; call once, before any thread starts. Failures are harmless (the
/// defaults stay), so they are only logged.
pub fn tune() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        for (name, param, value) in [
            ("M_ARENA_MAX", libc::M_ARENA_MAX, 2),
            // Fixing the threshold also turns off its dynamic growth.
            ("M_MMAP_THRESHOLD", libc::M_MMAP_THRESHOLD, 1024 * 1024),
            ("M_TRIM_THRESHOLD", libc::M_TRIM_THRESHOLD, 8 * 1024 * 1024),
        ] {
            // SAFETY: mallopt only changes allocator parameters; it takes plain integers and is
            // called before the runtime starts other threads.
            let ok = unsafe { libc::mallopt(param, value) };
            if ok != 1 {
                tracing::debug!(name, value, "mallopt refused the setting");
            }
        }
    }
}

/// Returns free pages inside the arenas to the kernel (glibc's `malloc_trim`), so that memory a
/// burst of calls used does not stay resident once the agent is idle again.
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim walks the allocator's own free lists under its locks; the pad argument
    // is a plain size.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Trims every `period` for the life of the runtime: cheap when nothing was freed.
pub fn spawn_periodic_release(period: std::time::Duration) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(period);
        tick.tick().await;
        loop {
            tick.tick().await;
            let _ = tokio::task::spawn_blocking(release_free_memory).await;
        }
    });
}
