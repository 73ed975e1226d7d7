//! Tools die with the agent. mkfs and e2fsck run in their own process group (so a timeout kills
//! whatever they forked), which also keeps them out of a signal sent to the agent's group; if the
//! agent is killed outside systemd or a container, they would go on writing while a restarted
//! agent's retry starts a second one. The kernel's parent-death signal ends them instead.
//!
//! FFI: this module holds the one `unsafe` block of the tool runner.

use std::os::unix::process::CommandExt;
use std::process::Command;

/// Makes the child get SIGKILL when the thread that started it dies (the tool runs on that
/// thread until it exits, so in practice: when the agent dies).
pub fn die_with_parent(cmd: &mut Command) {
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs in the child between fork and exec. It calls only prctl(2),
    // getppid(2) and _exit(2), which are async-signal-safe, allocates nothing and takes no lock.
    // It reads `parent`, a plain integer copied into the closure.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            // The agent died between fork and prctl: the signal will never come.
            if libc::getppid() != parent {
                libc::_exit(137);
            }
            Ok(())
        });
    }
}
