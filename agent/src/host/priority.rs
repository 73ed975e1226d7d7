//! Host work runs at a lower CPU priority than the threads that answer gRPC.
//!
//! On a busy node (the bench: 16 stages at once on 2 CPUs) the threads doing host work and the
//! tools they start (e2fsck, mkfs) keep every CPU busy. A Probe from the kubelet's liveness check
//! then waits for a CPU behind them, although answering it takes microseconds. Host work runs
//! at nice `HOST_WORK_NICE` and the tools inherit it; the async workers stay at the agent's own
//! level, so they are scheduled first when they wake. Nothing is starved: nice only weighs the
//! shares.

use std::cell::Cell;

/// Five steps below normal: a nice-0 thread gets about three times the CPU share of a nice-5 one.
pub const HOST_WORK_NICE: i32 = 5;

thread_local! {
    static LOWERED: Cell<bool> = const { Cell::new(false) };
}

/// Lowers the calling thread's priority once for its life (the blocking pool reuses threads).
/// Relative to the process's level, so an agent already started under `nice` keeps its order.
/// A failure (a seccomp filter, say) leaves the thread as it was: this is a preference.
pub fn lower_this_thread() {
    if LOWERED.with(|l| l.replace(true)) {
        return;
    }
    // Linux applies PRIO_PROCESS with who = 0 to the calling thread only.
    let base = rustix::process::getpriority_process(None).unwrap_or(0);
    let wanted = (base + HOST_WORK_NICE).min(19);
    if let Err(e) = rustix::process::setpriority_process(None, wanted) {
        tracing::debug!(error = %e, "could not lower the priority of a host-work thread");
    }
}
