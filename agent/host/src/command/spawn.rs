//! Starting a tool the way posix_spawn does (vfork: the child runs on the agent's memory until it
//! execs, so nothing is copied), plus what posix_spawn cannot do: the parent-death signal, set
//! in the child, so tools die with the agent. mkfs and e2fsck also run in their own process group
//! (a timeout kills whatever they forked), which keeps them out of a signal sent to the agent's
//! group; if the agent is killed outside systemd or a container, they would otherwise go on
//! writing while a restarted agent's retry starts a second one.
//!
//! std's Command sets such a signal only in a `pre_exec` hook, and with one it forks: copying the
//! agent's page tables and making every page the agent writes next fault once cost about 0.6 ms a
//! stage (docs/performance.md, item 10).
//!
//! FFI: this module holds the `unsafe` blocks of the tool runner, each with its invariant.

use std::ffi::{CString, OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;

use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::Pid;

/// The child's stack until it execs; it runs only the few calls of `child_main`.
const STACK: usize = 64 * 1024;
/// Where tools are looked for when the agent's environment has no PATH.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// A started tool, not yet reaped: its pid (and group id) stays valid for a kill until `wait`.
#[derive(Debug)]
pub struct Tool {
    pid: Pid,
}

pub struct Spawned {
    pub tool: Tool,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
}

impl Tool {
    pub fn id(&self) -> u32 {
        self.pid.as_raw().unsigned_abs()
    }

    pub fn kill(&self) {
        let _ = kill(self.pid, Signal::SIGKILL);
    }

    /// Reaps the tool.
    pub fn wait(&mut self) -> io::Result<ExitStatus> {
        loop {
            match waitpid(self.pid, None) {
                Ok(WaitStatus::Exited(_, code)) => return Ok(ExitStatus::from_raw(code << 8)),
                Ok(WaitStatus::Signaled(_, signal, core)) => {
                    return Ok(ExitStatus::from_raw(
                        signal as i32 | if core { 0x80 } else { 0 },
                    ));
                }
                Ok(_) | Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// What the child needs, prepared by the caller: it may not allocate.
struct ChildArgs {
    path: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    stdio: [libc::c_int; 3],
    parent: libc::pid_t,
    /// The caller's signal mask, restored right before exec.
    mask: libc::sigset_t,
    /// Set by the child when a step fails; read by the caller once the child exec'd or exited.
    errno: libc::c_int,
}

extern "C" fn child_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: runs in the vfork child, on the caller's `stack`, sharing the agent's memory while
    // the calling thread is suspended until this child execs or exits. `arg` is the `ChildArgs`
    // that the suspended caller keeps alive, and every pointer in it points to data the caller
    // keeps alive too. Every signal is blocked (the caller blocked them all before clone), and
    // the handlers are this child's own copy (no CLONE_SIGHAND), so no handler of the agent runs
    // here. Only async-signal-safe calls are made; nothing allocates or takes a lock. The writes
    // to shared memory are `errno` in `ChildArgs` and the calling thread's own errno, which
    // a failing call here sets (the thread reads errno only right after a call that sets it).
    unsafe {
        let a = &mut *(arg as *mut ChildArgs);
        let fail = |a: &mut ChildArgs| -> ! {
            a.errno = *libc::__errno_location();
            libc::_exit(127)
        };
        for (fd, target) in a.stdio.into_iter().zip(0..) {
            if libc::dup2(fd, target) < 0 {
                fail(a);
            }
        }
        // This child's copies of the agent's other descriptors go first, before the caller is
        // let go: a copy of one inside a mount keeps that mount busy (an unmount on another
        // thread fails with EBUSY) for as long as it lives, and exec would close them only after
        // the vfork has released the caller (`mount::ops::unmount` counts on this order). All
        // of them are close-on-exec, so the tool loses nothing. A kernel before 5.9, or a
        // seccomp filter, refuses the call: exec closes them then, as before.
        libc::syscall(
            libc::SYS_close_range,
            3 as libc::c_uint,
            libc::c_uint::MAX,
            0 as libc::c_uint,
        );
        // Caught signals go back to their default, as exec would do; SIGPIPE too, which the Rust
        // runtime ignores and std's Command restores for its children.
        for sig in 1..65 {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, std::ptr::null(), &mut old) == 0
                && (old.sa_sigaction != libc::SIG_IGN || sig == libc::SIGPIPE)
                && old.sa_sigaction != libc::SIG_DFL
            {
                let mut dfl: libc::sigaction = std::mem::zeroed();
                dfl.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(sig, &dfl, std::ptr::null_mut());
            }
        }
        if libc::setpgid(0, 0) != 0 {
            fail(a);
        }
        if libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
            0,
            0,
            0,
        ) != 0
        {
            fail(a);
        }
        // The agent died before the prctl: the signal will never come.
        if libc::getppid() != a.parent {
            libc::_exit(137);
        }
        libc::sigprocmask(libc::SIG_SETMASK, &a.mask, std::ptr::null_mut());
        libc::execve(a.path, a.argv, a.envp);
        fail(a)
    }
}

/// Starts `program` (found on PATH unless it holds a slash) with `args`, the agent's environment
/// plus `LC_ALL=C`, stdin from /dev/null and stdout and stderr to pipes, in its own process group,
/// with SIGKILL as its parent-death signal. Returns once the tool has exec'd; ENOENT when it does
/// not exist.
pub fn spawn<S: AsRef<OsStr>>(program: &OsStr, args: &[S]) -> io::Result<Spawned> {
    let path = cstring(resolve(program)?.into_os_string())?;
    let argv: Vec<CString> = std::iter::once(program.to_os_string())
        .chain(args.iter().map(|a| a.as_ref().to_os_string()))
        .map(cstring)
        .collect::<io::Result<_>>()?;
    let mut envs: Vec<CString> = std::env::vars_os()
        .filter(|(k, _)| k != "LC_ALL")
        .map(|(mut k, v)| {
            k.push("=");
            k.push(v);
            cstring(k)
        })
        .collect::<io::Result<_>>()?;
    envs.push(cstring("LC_ALL=C".into())?);
    let argv_p = null_terminated(&argv);
    let envp_p = null_terminated(&envs);
    let stdin = File::open("/dev/null")?;
    let (out_r, out_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    let (err_r, err_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    let mut stack = vec![0u8; STACK];
    let mut args = ChildArgs {
        path: path.as_ptr(),
        argv: argv_p.as_ptr(),
        envp: envp_p.as_ptr(),
        stdio: [stdin.as_raw_fd(), out_w.as_raw_fd(), err_w.as_raw_fd()],
        parent: std::process::id().cast_signed(), // a pid fits pid_t (pid_max <= 2^22)
        // SAFETY: sigset_t is plain data; an all-zero one is a valid (empty) set.
        mask: unsafe { std::mem::zeroed() },
        errno: 0,
    };
    // SAFETY: every signal is blocked around clone so that none is handled in the child before
    // it resets its handlers, and the caller's mask is restored right after. CLONE_VFORK suspends
    // this thread until the child execs or exits, so `stack`, `args` and everything they point to
    // outlive the child's use of them; the stack top is 16-byte aligned as the ABI requires.
    // `args` escapes through the raw pointer, so the read of `errno` below sees the child's write.
    let (pid, errno) = unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut args.mask);
        let top = stack.as_mut_ptr().add(STACK);
        let top = top.sub(top as usize % 16) as *mut libc::c_void;
        let pid = libc::clone(
            child_main,
            top,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            (&raw mut args).cast(),
        );
        let clone_error = io::Error::last_os_error();
        libc::pthread_sigmask(libc::SIG_SETMASK, &args.mask, std::ptr::null_mut());
        if pid < 0 {
            return Err(clone_error);
        }
        (pid, std::ptr::read_volatile(&args.errno))
    };
    drop((stdin, out_w, err_w, stack));
    let mut tool = Tool {
        pid: Pid::from_raw(pid),
    };
    if errno != 0 {
        let _ = tool.wait();
        return Err(io::Error::from_raw_os_error(errno));
    }
    Ok(Spawned {
        tool,
        stdout: out_r,
        stderr: err_r,
    })
}

fn cstring(s: OsString) -> io::Result<CString> {
    CString::new(s.into_vec()).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "an argument or variable holds a NUL byte",
        )
    })
}

fn null_terminated(strings: &[CString]) -> Vec<*const libc::c_char> {
    strings
        .iter()
        .map(|s| s.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect()
}

/// `program` itself when it names a path, else the first executable file of that name on PATH.
fn resolve(program: &OsStr) -> io::Result<PathBuf> {
    if program.as_bytes().contains(&b'/') {
        return Ok(PathBuf::from(program));
    }
    let search = std::env::var_os("PATH").unwrap_or_else(|| DEFAULT_PATH.into());
    std::env::split_paths(&search)
        .filter(|dir| dir.is_absolute())
        .map(|dir| dir.join(program))
        .find(|candidate| is_executable(candidate))
        .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
}

fn is_executable(path: &Path) -> bool {
    path.is_file() && nix::unistd::access(path, nix::unistd::AccessFlags::X_OK).is_ok()
}
