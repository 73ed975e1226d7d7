//! What kind of namespace an nsfs file is (`NS_GET_NSTYPE`, Linux 4.11). A file opened through a
//! bind of a namespace file, the bind then gone (`unshare --mount=FILE`, `umount -l FILE`),
//! shows no `mnt:[N]` in its fd's link: only its path then ("/"). Its kind is asked of the
//! kernel instead of read from the link text (a thirty-fourth fresh review's F1: a bind in a
//! namespace that only such a file kept alive was never seen).

use std::os::fd::{AsRawFd, BorrowedFd};

mod sys {
    // NSIO 0xb7; NS_GET_NSTYPE _IO(NSIO, 0x3).
    nix::ioctl_none!(ns_get_nstype, 0xb7, 0x3);
}

/// Whether the open file is a mount namespace's nsfs file (false for any other file, or any
/// other kind of namespace).
pub fn is_mount_namespace(fd: BorrowedFd<'_>) -> bool {
    // SAFETY: fd is a live descriptor borrowed for the call; NS_GET_NSTYPE takes no argument
    // and only returns the namespace's CLONE_NEW* flag (ENOTTY on a file that is none).
    let kind = unsafe { sys::ns_get_nstype(fd.as_raw_fd()) };
    kind == Ok(libc::CLONE_NEWNS)
}

/// The device and inode of the file `path` names (a `/proc/<pid>/fd/<n>` link is followed to
/// the open file), from the attributes the kernel holds: `AT_STATX_DONT_SYNC` asks no network
/// filesystem's server, so a process's file on a dead NFS mount does not hang the caller.
pub fn cached_file_id(path: &std::path::Path) -> std::io::Result<(u64, u64)> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes())?;
    let mut buf = std::mem::MaybeUninit::<libc::statx>::zeroed();
    // SAFETY: c_path is a NUL-terminated path that outlives the call; buf is a writable statx
    // buffer of the right size that outlives it.
    let rc = unsafe {
        libc::statx(
            libc::AT_FDCWD,
            c_path.as_ptr(),
            libc::AT_STATX_DONT_SYNC | libc::AT_NO_AUTOMOUNT,
            libc::STATX_INO,
            buf.as_mut_ptr(),
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: statx returned 0, so the kernel filled the buffer.
    let st = unsafe { buf.assume_init() };
    Ok((
        libc::makedev(st.stx_dev_major, st.stx_dev_minor),
        st.stx_ino,
    ))
}
