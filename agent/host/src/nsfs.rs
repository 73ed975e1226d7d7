//! What kind of namespace an nsfs file is (`NS_GET_NSTYPE`, Linux 4.11). A file opened through a
//! bind of a namespace file, the bind then gone (`unshare --mount=FILE`, `umount -l FILE`),
//! shows no `mnt:[N]` in its fd's link: only its path then ("/"). Its kind is asked of the
//! kernel instead of read from the link text (a thirty-fourth fresh review's F1: a bind in a
//! namespace that only such a file kept alive was never seen).
//!
//! And the kernel's own list of every mount namespace (`NS_MNT_GET_NEXT`/`PREV`, Linux 6.12):
//! each step hands over the next namespace's file, whatever keeps it alive (a process, a thread,
//! a bind of its file, an open file only), so finding them all needs no walk of /proc.

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

mod sys {
    // NSIO 0xb7; NS_GET_NSTYPE _IO(NSIO, 0x3).
    nix::ioctl_none!(ns_get_nstype, 0xb7, 0x3);
    // NS_GET_USERNS _IO(NSIO, 0x1): a new fd of the namespace's owning user namespace.
    nix::ioctl_none!(ns_get_userns, 0xb7, 0x1);
    // NS_MNT_GET_NEXT _IOR(NSIO, 11, struct mnt_ns_info); NS_MNT_GET_PREV _IOR(NSIO, 12, …).
    nix::ioctl_read!(ns_mnt_get_next, 0xb7, 11, super::MntNsInfo);
    nix::ioctl_read!(ns_mnt_get_prev, 0xb7, 12, super::MntNsInfo);
    // NS_MNT_GET_INFO _IOR(NSIO, 10, struct mnt_ns_info).
    nix::ioctl_read!(ns_mnt_get_info, 0xb7, 10, super::MntNsInfo);
}

/// `struct mnt_ns_info` (include/uapi/linux/nsfs.h, 16 bytes). The list's steps pass no
/// buffer, so the kernel fills none; `NS_MNT_GET_INFO` fills one.
#[repr(C)]
#[derive(Default)]
pub struct MntNsInfo {
    size: u32,
    nr_mounts: u32,
    mnt_ns_id: u64,
}

/// The request number of `NS_MNT_GET_NEXT`, for a test's seccomp filter.
pub const NS_MNT_GET_NEXT: u64 = 0x8010_b70b;
/// The request number of `NS_MNT_GET_PREV`.
pub const NS_MNT_GET_PREV: u64 = 0x8010_b70c;

/// Which way along the kernel's list of mount namespaces (ordered by creation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    Next,
    Prev,
}

/// The mount namespace after (or before) the one `ns` is a file of, as an nsfs file of its own;
/// `None` past the end. The kernel passes over the namespaces whose owner this process lacks
/// CAP_SYS_ADMIN over (none, for root in the host's user namespace) and those being freed.
/// ENOTTY: a kernel before 6.12 (or `ns` is no mount namespace's file).
pub fn adjoining_mount_namespace(
    ns: BorrowedFd<'_>,
    step: Step,
) -> std::io::Result<Option<OwnedFd>> {
    let info = std::ptr::null_mut::<MntNsInfo>();
    // SAFETY: ns is a live descriptor borrowed for the call; with a NULL argument the kernel
    // copies no `struct mnt_ns_info` out (it writes only when the pointer is set) and returns
    // a new descriptor it installed in this process's table, or an error.
    let rc = unsafe {
        match step {
            Step::Next => sys::ns_mnt_get_next(ns.as_raw_fd(), info),
            Step::Prev => sys::ns_mnt_get_prev(ns.as_raw_fd(), info),
        }
    };
    match rc {
        // SAFETY: the kernel just installed this descriptor for this process and nothing else
        // owns it; it is closed once, when the OwnedFd drops.
        Ok(fd) => Ok(Some(unsafe { OwnedFd::from_raw_fd(fd) })),
        Err(nix::errno::Errno::ENOENT) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Whether the open file is a mount namespace's nsfs file (false for any other file, or any
/// other kind of namespace).
pub fn is_mount_namespace(fd: BorrowedFd<'_>) -> bool {
    // SAFETY: fd is a live descriptor borrowed for the call; NS_GET_NSTYPE takes no argument
    // and only returns the namespace's CLONE_NEW* flag (ENOTTY on a file that is none).
    let kind = unsafe { sys::ns_get_nstype(fd.as_raw_fd()) };
    kind == Ok(libc::CLONE_NEWNS)
}

/// Whether the namespace `ns` is owned by the host's first user namespace (only root there
/// makes mounts in it); `false` when that cannot be asked.
pub fn owned_by_host_users(ns: BorrowedFd<'_>) -> bool {
    use std::os::fd::{FromRawFd, OwnedFd};
    // The host's first user namespace has a fixed inode number (`PROC_USER_INIT_INO`).
    const PROC_USER_INIT_INO: u64 = 0xEFFF_FFFD;
    // SAFETY: ns is a live descriptor borrowed for the call; NS_GET_USERNS takes no argument
    // and returns a new descriptor (or an error), which is owned here from then on.
    let Ok(fd) = (unsafe { sys::ns_get_userns(ns.as_raw_fd()) }) else {
        return false;
    };
    // SAFETY: fd was just returned by the kernel as a new descriptor nothing else owns.
    let owner = unsafe { OwnedFd::from_raw_fd(fd) };
    nix::sys::stat::fstat(&owner).is_ok_and(|st| st.st_ino == PROC_USER_INIT_INO)
}

/// The device and inode of the file `path` names (a `/proc/<pid>/fd/<n>` link is followed to
/// the open file), from the attributes the kernel holds: `AT_STATX_DONT_SYNC` asks no network
/// filesystem's server, so a process's file on a dead NFS mount does not hang the caller.
pub fn cached_file_id(path: &std::path::Path) -> std::io::Result<(u64, u64)> {
    use rustix::fs::{AtFlags, CWD, StatxFlags};
    let at = AtFlags::STATX_DONT_SYNC | AtFlags::NO_AUTOMOUNT;
    let st = rustix::fs::statx(CWD, path, at, StatxFlags::INO)?;
    Ok((
        libc::makedev(st.stx_dev_major, st.stx_dev_minor),
        st.stx_ino,
    ))
}

/// A mount namespace's unique id (never reused, unlike its inode number) and how many mounts it
/// has, whatever covers what; `None` before Linux 6.12 (ENOTTY).
pub fn mount_namespace_info(ns: BorrowedFd<'_>) -> std::io::Result<Option<(u64, u32)>> {
    let mut info = MntNsInfo {
        size: 16,
        ..MntNsInfo::default()
    };
    // SAFETY: ns is a live descriptor borrowed for the call; `info` is a writable
    // `struct mnt_ns_info` of the size the request number encodes (16 bytes), which the kernel
    // fills and nothing else refers to.
    match unsafe { sys::ns_mnt_get_info(ns.as_raw_fd(), &mut info) } {
        Ok(_) => Ok(Some((info.mnt_ns_id, info.nr_mounts))),
        Err(nix::errno::Errno::ENOTTY) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// The nsfs file `path` names, opened for `setns` without opening anything else on the way. A
/// path another user controls (the mount point of a bind of a namespace file, which a mount may
/// cover; another process's fd, which may be closed and reused) can lead to a FIFO, whose open
/// for reading waits for a writer for ever (every later scan then waited behind it: a
/// fifty-fourth fresh review's F3), or to a device, whose open runs its driver (a watchdog's
/// arms it). So the path is opened `O_PATH` first (nothing is opened; a final link is followed
/// only with `follow`, as `/proc/<pid>/fd/<n>` needs), checked to be on nsfs and, where
/// `mount_id` is given, to be the root of that very mount; only then is that file opened,
/// through the agent's own `/proc` (`proc_dir`). `Ok(None)`: something else is there.
pub fn open_ns_file(
    proc_dir: BorrowedFd<'_>,
    path: &std::path::Path,
    follow: bool,
    mount_id: Option<u32>,
) -> std::io::Result<Option<std::fs::File>> {
    use rustix::fs::{AtFlags, CWD, Mode, OFlags, StatxFlags};
    const NSFS_MAGIC: u64 = 0x6e73_6673;
    let mut flags = OFlags::PATH | OFlags::CLOEXEC;
    if !follow {
        flags |= OFlags::NOFOLLOW;
    }
    let fd = rustix::fs::openat(CWD, path, flags, Mode::empty())?;
    if u64::try_from(rustix::fs::fstatfs(&fd)?.f_type).ok() != Some(NSFS_MAGIC) {
        return Ok(None);
    }
    if let Some(id) = mount_id {
        let at = AtFlags::EMPTY_PATH | AtFlags::STATX_DONT_SYNC;
        let st = rustix::fs::statx(&fd, "", at, StatxFlags::MNT_ID)?;
        if st.stx_mnt_id != u64::from(id) {
            return Ok(None);
        }
    }
    let this = format!("thread-self/fd/{}", fd.as_raw_fd());
    let file = rustix::fs::openat(
        proc_dir,
        this,
        OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    Ok(Some(file.into()))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    /// The kernel's cached attributes name the same file a stat does, through a link followed
    /// (`/proc/self/ns/mnt` leads to the nsfs file) and for a plain file alike.
    #[test]
    fn cached_file_id_names_the_file_a_stat_does() {
        for path in ["/proc/self/ns/mnt", "/proc/self/exe"] {
            let st = std::fs::metadata(path).expect("stat");
            let id = super::cached_file_id(std::path::Path::new(path)).expect("statx");
            assert_eq!(id, (st.dev(), st.ino()), "{path}");
        }
        assert!(super::cached_file_id(std::path::Path::new("/nonexistent/x")).is_err());
    }
}
