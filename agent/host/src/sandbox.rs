//! Which of the newer syscalls this process may use. The kernel having a syscall is not enough: a
//! seccomp filter can deny it. systemd 252 (Debian 12, Amazon Linux 2023) does not know statmount
//! and listmount, so `SystemCallFilter=` answers them with `SystemCallErrorNumber=` (EPERM);
//! `RestrictSUIDSGID=` answers openat2 with ENOSYS (systemd cannot look into `struct open_how`),
//! and systemd before 248 answered it with EPERM. A denied syscall means "not available here",
//! never "refuse the volume": each has a fallback that keeps every guarantee (see `Newer`).
//!
//! Each syscall is probed once, with arguments the kernel rejects before doing anything (an
//! invalid flag or size: EINVAL), so the answer tells the kernel from a filter: EINVAL is the
//! kernel's, ENOSYS means absent (an old kernel, or a filter saying so), anything else is a filter's
//! deny. The answer is kept for the life of the process: a filter cannot be lifted, and only the
//! process itself could add one (the agent adds none). A no is logged once.
//!
//! FFI: raw syscalls (libc has no wrappers for statmount and listmount); the only `unsafe` here.

use std::io;
use std::sync::atomic::{AtomicU8, Ordering};

/// A syscall the agent prefers but can do without.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Newer {
    /// One mount's facts by its id (Linux 6.8); without it the mount table is read as text.
    Statmount,
    /// The mounts of a namespace (Linux 6.8; by the namespace's id, 6.11): asked only of a
    /// namespace whose table, read from inside, shows fewer mounts than it has.
    Listmount,
    /// Path resolution confined below a directory in one call (Linux 5.6); without it the path is
    /// walked one component at a time with O_NOFOLLOW, as race-free.
    Openat2,
    /// A detached copy of a mount (Linux 5.2): with `MountSetattr` and `MoveMount`, a bind that
    /// is read-only (and nosuid/nodev/noexec) before it is attached, so every propagated copy is.
    OpenTree,
    /// Attaches a detached tree (Linux 5.2).
    MoveMount,
    /// Per-mount attributes of a detached tree (Linux 5.12).
    MountSetattr,
}

pub const ALL: [Newer; 6] = [
    Newer::Statmount,
    Newer::Listmount,
    Newer::Openat2,
    Newer::OpenTree,
    Newer::MoveMount,
    Newer::MountSetattr,
];

/// The three calls of a bind made read-only before it is attached.
pub const MOUNT_API: [Newer; 3] = [Newer::OpenTree, Newer::MoveMount, Newer::MountSetattr];

const SYS_STATMOUNT: libc::c_long = 457;
const SYS_LISTMOUNT: libc::c_long = 458;
/// A flag no kernel defines: statmount, listmount and the mount API calls reject it with EINVAL before reading
/// anything.
const NO_SUCH_FLAG: libc::c_uint = 0x8000_0000;

impl Newer {
    pub fn name(self) -> &'static str {
        match self {
            Newer::Statmount => "statmount",
            Newer::Listmount => "listmount",
            Newer::Openat2 => "openat2",
            Newer::OpenTree => "open_tree",
            Newer::MoveMount => "move_mount",
            Newer::MountSetattr => "mount_setattr",
        }
    }

    /// The first kernel release that has it.
    pub fn since(self) -> (u32, u32) {
        match self {
            Newer::Statmount | Newer::Listmount => (6, 8),
            Newer::Openat2 => (5, 6),
            Newer::OpenTree | Newer::MoveMount => (5, 2),
            Newer::MountSetattr => (5, 12),
        }
    }

    /// What the agent does without it.
    pub fn fallback(self) -> &'static str {
        match self {
            Newer::Statmount => {
                "mount facts come from /proc/self/mountinfo (statx's mount id, then the table line)"
            }
            Newer::Listmount => {
                "a mount namespace whose own root has a mount laid over it is read as a thread \
                 inside it sees it, which leaves the covered mounts out"
            }
            Newer::Openat2 => {
                "paths are resolved one component at a time with O_NOFOLLOW (as confined, a few \
                 more syscalls)"
            }
            Newer::OpenTree | Newer::MoveMount | Newer::MountSetattr => {
                "a bind gets its read-only and nosuid/nodev/noexec bits by a remount in a private \
                 place below the state directory and is bound from there, so the copies a shared \
                 target propagates it to have them too"
            }
        }
    }

    fn index(self) -> usize {
        self as usize
    }

    /// The harmless call: the kernel answers EINVAL before it looks at anything else.
    fn call_invalid(self) -> io::Error {
        // SAFETY: every pointer argument is NULL and the kernel rejects the call on its flags
        // (statmount, listmount, open_tree, move_mount, mount_setattr) or its size argument (openat2: a size below `struct open_how`'s
        // first version) before it dereferences any; nothing is read or written in this process.
        let rc = unsafe {
            match self {
                Newer::Statmount | Newer::Listmount => libc::syscall(
                    if self == Newer::Statmount {
                        SYS_STATMOUNT
                    } else {
                        SYS_LISTMOUNT
                    },
                    std::ptr::null::<u8>(),
                    std::ptr::null_mut::<u8>(),
                    0usize,
                    NO_SUCH_FLAG,
                ),
                Newer::Openat2 => libc::syscall(
                    libc::SYS_openat2,
                    libc::AT_FDCWD,
                    std::ptr::null::<libc::c_char>(),
                    std::ptr::null::<u8>(),
                    0usize,
                ),
                Newer::OpenTree => libc::syscall(
                    libc::SYS_open_tree,
                    libc::AT_FDCWD,
                    std::ptr::null::<libc::c_char>(),
                    NO_SUCH_FLAG,
                ),
                Newer::MoveMount => libc::syscall(
                    libc::SYS_move_mount,
                    libc::AT_FDCWD,
                    std::ptr::null::<libc::c_char>(),
                    libc::AT_FDCWD,
                    std::ptr::null::<libc::c_char>(),
                    NO_SUCH_FLAG,
                ),
                Newer::MountSetattr => libc::syscall(
                    libc::SYS_mount_setattr,
                    libc::AT_FDCWD,
                    std::ptr::null::<libc::c_char>(),
                    NO_SUCH_FLAG,
                    std::ptr::null::<u8>(),
                    0usize,
                ),
            }
        };
        if rc >= 0 {
            // Not expected from any kernel; treat it as "the kernel answered".
            return io::Error::from_raw_os_error(libc::EINVAL);
        }
        io::Error::last_os_error()
    }
}

/// What the probe found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Probe {
    /// The kernel has it and this process may call it.
    Usable,
    /// ENOSYS: the kernel lacks it, or a filter pretends so.
    Absent,
    /// A filter denies it with this errno (EPERM under systemd's `SystemCallErrorNumber=EPERM`).
    Denied(i32),
}

impl Probe {
    pub fn usable(self) -> bool {
        self == Probe::Usable
    }

    /// The answer, for a log or `doctor`: "EPERM (Operation not permitted)".
    pub fn answer(self) -> String {
        match self {
            Probe::Usable => "available".into(),
            Probe::Absent => errno_text(libc::ENOSYS),
            Probe::Denied(e) => errno_text(e),
        }
    }
}

fn errno_text(errno: i32) -> String {
    let name = match errno {
        libc::ENOSYS => "ENOSYS",
        libc::EPERM => "EPERM",
        libc::EACCES => "EACCES",
        _ => "errno",
    };
    format!("{name} ({})", io::Error::from_raw_os_error(errno))
}

/// Asks the kernel now (`doctor`; the agent itself asks through `usable`, once).
pub fn probe(call: Newer) -> Probe {
    match call.call_invalid().raw_os_error() {
        Some(libc::EINVAL) | Some(libc::EFAULT) | Some(libc::E2BIG) => Probe::Usable,
        Some(libc::ENOSYS) => Probe::Absent,
        Some(e) => Probe::Denied(e),
        None => Probe::Usable,
    }
}

const UNKNOWN: u8 = 0;
const USABLE: u8 = 1;
const UNUSABLE: u8 = 2;

static STATE: [AtomicU8; ALL.len()] = [const { AtomicU8::new(UNKNOWN) }; ALL.len()];

/// Whether the agent may use `call`: probed on first use, then remembered.
pub fn usable(call: Newer) -> bool {
    match STATE[call.index()].load(Ordering::Relaxed) {
        USABLE => true,
        UNUSABLE => false,
        _ => settle(call, probe(call)),
    }
}

/// Probes every syscall the agent uses, so that what is unavailable is logged at start-up rather
/// than at the first call that needs it.
pub fn survey() {
    for call in [Newer::Statmount, Newer::Openat2] {
        usable(call);
    }
    mount_api_usable();
}

/// Whether a bind can be made read-only before it is attached (all three calls usable). Probed
/// in order and stopped at the first no, so one missing call is logged once, not three times.
pub fn mount_api_usable() -> bool {
    MOUNT_API.iter().all(|&call| usable(call))
}

/// A real call of `call` answered `errno`: whether that means "not available here" (then the
/// fallback is taken, now and from now on) rather than the kernel's answer about the arguments.
/// ENOSYS always does; EPERM only when the harmless probe is denied too, so a real EPERM (a
/// path the kernel refuses) keeps its meaning.
pub fn unavailable(call: Newer, errno: Option<i32>) -> bool {
    match errno {
        Some(libc::ENOSYS) => !settle(call, Probe::Absent),
        Some(libc::EPERM) | Some(libc::EACCES) => {
            let p = probe(call);
            !p.usable() && !settle(call, p)
        }
        _ => false,
    }
}

/// Records the first answer; whoever records a no logs it, so it is said exactly once.
fn settle(call: Newer, found: Probe) -> bool {
    let value = if found.usable() { USABLE } else { UNUSABLE };
    match STATE[call.index()].compare_exchange(UNKNOWN, value, Ordering::Relaxed, Ordering::Relaxed)
    {
        Ok(_) => {
            if !found.usable() {
                log_unavailable(call, found);
            }
            found.usable()
        }
        Err(UNUSABLE) => false,
        Err(_) if found.usable() => true,
        // Probed usable before, but a call now found it gone: cannot happen with seccomp (a
        // filter is only ever added by the process itself), but the call's answer wins.
        Err(_) => {
            if STATE[call.index()]
                .compare_exchange(USABLE, UNUSABLE, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
            {
                log_unavailable(call, found);
            }
            false
        }
    }
}

fn log_unavailable(call: Newer, found: Probe) {
    let (answer, why, fallback) = (found.answer(), why(call, found), call.fallback());
    let message = "syscall not available here; taking the fallback from now on";
    // An old kernel is expected; a filter on a kernel that has the call deserves a look.
    if kernel_predates(call) {
        tracing::info!(syscall = call.name(), %answer, %why, fallback, "{message}");
    } else {
        tracing::warn!(syscall = call.name(), %answer, %why, fallback, "{message}");
    }
}

fn kernel_predates(call: Newer) -> bool {
    kernel_version(&kernel_release()).is_some_and(|v| v < call.since())
}

/// Why a syscall is unavailable, in words: the kernel's age or a filter.
pub fn why(call: Newer, found: Probe) -> String {
    let release = kernel_release();
    let old = kernel_predates(call);
    match found {
        Probe::Usable => String::new(),
        Probe::Absent if old => format!(
            "kernel {release} predates it ({}.{}+)",
            call.since().0,
            call.since().1
        ),
        _ if seccomp_mode() == Some(2) => {
            "a seccomp filter denies it (systemd's SystemCallFilter= or RestrictSUIDSGID=, or a \
             container runtime's profile)"
                .into()
        }
        _ => format!("kernel {release} refuses it"),
    }
}

pub fn kernel_release() -> String {
    nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// `6.18.44-fc` → (6, 18).
pub fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// The `Seccomp:` field of /proc/self/status: 0 none, 1 strict, 2 filter.
pub fn seccomp_mode() -> Option<u32> {
    status_field("Seccomp:")
}

/// How many seccomp filters this process runs under (Linux 5.9+).
pub fn seccomp_filters() -> Option<u32> {
    status_field("Seccomp_filters:")
}

fn status_field(name: &str) -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(name))?
        .trim()
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_releases() {
        assert_eq!(kernel_version("6.18.44-fc-v782"), Some((6, 18)));
        assert_eq!(kernel_version("5.4.0-1103-aws"), Some((5, 4)));
        assert_eq!(kernel_version("weird"), None);
    }

    /// Outside a filter (the test runner has none), the probe matches the kernel's release.
    #[test]
    fn the_probe_matches_the_kernel_outside_a_filter() {
        if seccomp_mode() != Some(0) {
            return;
        }
        let Some(v) = kernel_version(&kernel_release()) else {
            return;
        };
        for call in ALL {
            let expected = if v >= call.since() {
                Probe::Usable
            } else {
                Probe::Absent
            };
            assert_eq!(probe(call), expected, "{}", call.name());
        }
    }

    #[test]
    fn a_real_answer_is_not_a_denial() {
        if seccomp_mode() != Some(0) {
            return;
        }
        // EPERM from a call while the probe is allowed: the kernel's own answer, kept.
        assert!(!unavailable(Newer::Openat2, Some(libc::EPERM)));
        assert!(!unavailable(Newer::Openat2, Some(libc::EXDEV)));
        assert!(!unavailable(Newer::Statmount, Some(libc::ENOENT)));
    }
}
