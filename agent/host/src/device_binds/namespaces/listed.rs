//! The mount namespaces as the kernel lists them (`NS_MNT_GET_NEXT`/`PREV`, Linux 6.12): every
//! one alive, whatever keeps it so (a process or a thread in it, a bind of its nsfs file, a file
//! a process holds open on it, one opened through a bind gone since), with no walk of /proc. The
//! walk reads every thread's link and every open file of every process (about 600 calls a scan
//! on a bare test host, tens of thousands on a node with a hundred pods); the list takes one
//! call per namespace. The kernel leaves out the namespaces whose owner the caller has no
//! CAP_SYS_ADMIN over, so the list is taken only by an agent in the host's user namespace with
//! CAP_SYS_ADMIN in effect, over whom there is none. Anonymous namespaces (a detached
//! `open_tree` copy) are on neither the list nor any process's link.

use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::{AtomicU8, Ordering};

use crate::nsfs::{Step, adjoining_mount_namespace};

use super::{Found, Namespaces, read_all};

const UNKNOWN: u8 = 0;
const LISTED: u8 = 1;
const WALKED: u8 = 2;

/// Whether the list is taken: decided at the first scan, then kept (the agent's user namespace
/// and capabilities do not change, and a seccomp filter is never lifted).
static STATE: AtomicU8 = AtomicU8::new(UNKNOWN);

/// Reads every namespace on the kernel's list, after and before this agent's own. `Ok(false)`:
/// there is no list to take here (said once), and the caller walks /proc instead; the
/// namespaces already read are not read again.
pub(super) fn read_every(found: &mut Found, spaces: &mut Namespaces) -> Result<bool, String> {
    match STATE.load(Ordering::Relaxed) {
        WALKED => return Ok(false),
        UNKNOWN if !over_every_owner() => {
            walk_from_now_on(
                "this agent is not root in the host's user namespace (the kernel's list leaves out what it has no CAP_SYS_ADMIN over)",
            );
            return Ok(false);
        }
        _ => {}
    }
    let start = File::open("/proc/thread-self/ns/mnt")
        .map_err(|e| format!("this agent's mount namespace: {e}"))?;
    for step in [Step::Next, Step::Prev] {
        let mut cursor = OwnedFd::from(
            start
                .try_clone()
                .map_err(|e| format!("this agent's mount namespace: {e}"))?,
        );
        let mut first = true;
        loop {
            let next = match adjoining_mount_namespace(cursor.as_fd(), step) {
                Ok(Some(next)) => next,
                Ok(None) => break,
                Err(e) if first && not_here(&e) => {
                    walk_from_now_on(&format!(
                        "NS_MNT_GET_{step:?} answered {e} (Linux 6.12 has it; a seccomp filter may deny it)"
                    ));
                    return Ok(false);
                }
                Err(e) => return Err(format!("the kernel's list of mount namespaces: {e}")),
            };
            first = false;
            read_one(found, spaces, &next)?;
            cursor = next;
        }
    }
    STATE.store(LISTED, Ordering::Relaxed);
    Ok(true)
}

/// Reads the namespace `ns` is a file of, unless this scan has read it.
fn read_one(found: &mut Found, spaces: &mut Namespaces, ns: &OwnedFd) -> Result<(), String> {
    let file = File::from(
        ns.try_clone()
            .map_err(|e| format!("a listed mount namespace: {e}"))?,
    );
    let ino = file
        .metadata()
        .map_err(|e| format!("a listed mount namespace: {e}"))?
        .ino();
    if spaces.read.contains(&ino) {
        return Ok(());
    }
    spaces.pin(file, format!("mnt:[{ino}]"))?;
    read_all(found, spaces)
}

/// An answer that says the list is not to be had here, for good: a kernel before 6.12 (ENOTTY:
/// nsfs knows no such request), or a filter's (ENOSYS, EPERM, EACCES, EINVAL).
fn not_here(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOTTY | libc::ENOSYS | libc::EPERM | libc::EACCES | libc::EINVAL)
    )
}

/// Root in the host's user namespace, CAP_SYS_ADMIN in effect: the kernel's list then leaves
/// nothing out.
fn over_every_owner() -> bool {
    // The host's first user namespace has a fixed inode number (`PROC_USER_INIT_INO`).
    const PROC_USER_INIT_INO: u64 = 0xEFFF_FFFD;
    let host_users =
        std::fs::metadata("/proc/self/ns/user").is_ok_and(|m| m.ino() == PROC_USER_INIT_INO);
    host_users
        && caps::has_cap(
            None,
            caps::CapSet::Effective,
            caps::Capability::CAP_SYS_ADMIN,
        )
        .unwrap_or(false)
}

/// Walks /proc from now on; says why once.
fn walk_from_now_on(why: &str) {
    if STATE.swap(WALKED, Ordering::Relaxed) != WALKED {
        tracing::info!(
            why,
            fallback =
                "every process's threads and open files are walked for their mount namespaces",
            "the kernel's list of mount namespaces is not taken here; taking the fallback from now on"
        );
    }
}
