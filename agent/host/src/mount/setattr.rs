//! mount_setattr(2) (Linux 5.12), the one call of the new mount API that rustix does not wrap.
//! With open_tree(OPEN_TREE_CLONE) and move_mount (rustix) it lets a bind mount get its
//! per-mount attributes (read-only, nosuid, nodev, noexec, atime) while it is still detached, so
//! that it is attached, and cloned into every peer of a shared target, with them.
//!
//! FFI: one raw syscall (libc has its number but no wrapper); the only `unsafe` here.

use std::io;
use std::os::fd::{AsFd, AsRawFd};

pub const MOUNT_ATTR_RDONLY: u64 = 0x0000_0001;
pub const MOUNT_ATTR_NOSUID: u64 = 0x0000_0002;
pub const MOUNT_ATTR_NODEV: u64 = 0x0000_0004;
pub const MOUNT_ATTR_NOEXEC: u64 = 0x0000_0008;
/// The atime mode's bits: one of RELATIME (0), NOATIME, STRICTATIME, not a bitmap.
pub const MOUNT_ATTR_ATIME_MASK: u64 = 0x0000_0070;
pub const MOUNT_ATTR_RELATIME: u64 = 0x0000_0000;
pub const MOUNT_ATTR_NOATIME: u64 = 0x0000_0010;
pub const MOUNT_ATTR_STRICTATIME: u64 = 0x0000_0020;
pub const MOUNT_ATTR_NODIRATIME: u64 = 0x0000_0080;

/// `struct mount_attr`, version 0 (MOUNT_ATTR_SIZE_VER0, 32 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MountAttr {
    pub attr_set: u64,
    pub attr_clr: u64,
    pub propagation: u64,
    pub userns_fd: u64,
}

/// The attributes a bind gets from validated `MS_*` bits: MS_RDONLY (when `read_only`),
/// MS_NOSUID/NODEV/NOEXEC, and the atime mode. The atime rules are those of a bind remount
/// (`mount -o remount,bind`): no atime flag keeps the source's; any atime flag sets the mode
/// (relatime unless noatime, strictatime winning) and nodiratime as given. Superblock flags
/// (sync, dirsync, lazytime) are not per-mount and are ignored by both, as by the remount.
pub fn attr_from_ms(vfs_bits: u64, read_only: bool) -> MountAttr {
    let mut a = MountAttr::default();
    if read_only {
        a.attr_set |= MOUNT_ATTR_RDONLY;
    }
    for (ms, attr) in [
        (libc::MS_NOSUID, MOUNT_ATTR_NOSUID),
        (libc::MS_NODEV, MOUNT_ATTR_NODEV),
        (libc::MS_NOEXEC, MOUNT_ATTR_NOEXEC),
    ] {
        if vfs_bits & ms != 0 {
            a.attr_set |= attr;
        }
    }
    let atime = libc::MS_NOATIME | libc::MS_NODIRATIME | libc::MS_RELATIME | libc::MS_STRICTATIME;
    if vfs_bits & atime != 0 {
        a.attr_clr |= MOUNT_ATTR_ATIME_MASK | MOUNT_ATTR_NODIRATIME;
        a.attr_set |= if vfs_bits & libc::MS_STRICTATIME != 0 {
            MOUNT_ATTR_STRICTATIME
        } else if vfs_bits & libc::MS_NOATIME != 0 {
            MOUNT_ATTR_NOATIME
        } else {
            MOUNT_ATTR_RELATIME
        };
        if vfs_bits & libc::MS_NODIRATIME != 0 {
            a.attr_set |= MOUNT_ATTR_NODIRATIME;
        }
    }
    a
}

/// mount_setattr(fd, "", AT_EMPTY_PATH, attr): changes the mount `fd` is the root of (a tree
/// from open_tree), not anything a path would resolve to.
pub fn set_attr(fd: impl AsFd, attr: &MountAttr) -> io::Result<()> {
    // SAFETY: the path is a NUL-terminated static empty string, `attr` points to a live
    // `repr(C)` struct of exactly the size passed, which the kernel only reads; `fd` is borrowed
    // for the duration of the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            fd.as_fd().as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH as libc::c_uint,
            attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_struct_is_version_0() {
        assert_eq!(std::mem::size_of::<MountAttr>(), 32);
    }

    #[test]
    fn ms_bits_map_as_a_bind_remount_would() {
        let a = attr_from_ms(libc::MS_RDONLY | libc::MS_NOEXEC, false);
        assert_eq!(
            a.attr_set, MOUNT_ATTR_NOEXEC,
            "MS_RDONLY alone is not read_only"
        );
        assert_eq!(a.attr_clr, 0, "no atime flag keeps the source's");
        let a = attr_from_ms(libc::MS_NOSUID | libc::MS_NODEV, true);
        assert_eq!(
            a.attr_set,
            MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV
        );
        let a = attr_from_ms(libc::MS_NOATIME | libc::MS_NODIRATIME, false);
        assert_eq!(a.attr_set, MOUNT_ATTR_NOATIME | MOUNT_ATTR_NODIRATIME);
        assert_eq!(a.attr_clr, MOUNT_ATTR_ATIME_MASK | MOUNT_ATTR_NODIRATIME);
        let a = attr_from_ms(libc::MS_NOATIME | libc::MS_STRICTATIME, false);
        assert_eq!(a.attr_set, MOUNT_ATTR_STRICTATIME);
        let a = attr_from_ms(libc::MS_NODIRATIME, false);
        assert_eq!(a.attr_set, MOUNT_ATTR_RELATIME | MOUNT_ATTR_NODIRATIME);
        let a = attr_from_ms(libc::MS_SYNCHRONOUS | libc::MS_LAZYTIME, false);
        assert_eq!(a, MountAttr::default());
    }
}
