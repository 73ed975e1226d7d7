//! mount(2) and umount(2), through sys-mount. No `mount` binary: its helpers and fstab lookups are
//! exactly the surprises a node plugin must not have.

use std::io;
use std::path::Path;

use sys_mount::{Mount, MountFlags as MsFlags, UnmountFlags};

/// Mounts a filesystem from a block device. `vfs_bits` are validated `MS_*` bits; `data` holds
/// validated filesystem options only.
pub fn mount_device(
    device: &Path,
    target: &Path,
    fs_type: &str,
    vfs_bits: u64,
    data: &[String],
    read_only: bool,
) -> io::Result<()> {
    let mut flags = MsFlags::from_bits_retain(vfs_bits);
    if read_only {
        flags |= MsFlags::RDONLY;
    }
    let data = data.join(",");
    let mut builder = Mount::builder().fstype(fs_type).flags(flags);
    if !data.is_empty() {
        builder = builder.data(&data);
    }
    builder.mount(device, target).map(drop)
}

/// Bind-mounts `source` onto `target`; a read-only bind needs a second, remount step, because
/// the kernel ignores MS_RDONLY on the first MS_BIND call.
pub fn bind(source: &Path, target: &Path, read_only: bool, vfs_bits: u64) -> io::Result<()> {
    Mount::builder()
        .fstype("none")
        .flags(MsFlags::BIND)
        .mount(source, target)?;
    let extra = MsFlags::from_bits_retain(vfs_bits) & !MsFlags::RDONLY;
    if read_only || !extra.is_empty() {
        let mut flags = MsFlags::BIND | MsFlags::REMOUNT | extra;
        if read_only {
            flags |= MsFlags::RDONLY;
        }
        if let Err(e) = Mount::builder()
            .fstype("none")
            .flags(flags)
            .mount("none", target)
        {
            // Never leave a writable bind behind a failed read-only request.
            let _ = sys_mount::unmount(target, UnmountFlags::DETACH);
            return Err(e);
        }
    }
    Ok(())
}

#[derive(Debug, PartialEq, Eq)]
pub enum Unmounted {
    Done,
    /// Nothing was mounted there (or the path is gone): success for an idempotent call.
    NotMounted,
    /// A dead mount (ENOTCONN/ESTALE) that could only be detached lazily.
    Detached,
}

/// Unmounts `target`. A path that is not a mount point, or does not exist, is not an error.
pub fn unmount(target: &Path) -> io::Result<Unmounted> {
    match sys_mount::unmount(target, UnmountFlags::empty()) {
        Ok(()) => Ok(Unmounted::Done),
        Err(e) => match e.raw_os_error() {
            Some(libc::EINVAL) | Some(libc::ENOENT) => Ok(Unmounted::NotMounted),
            Some(libc::ENOTCONN) | Some(libc::ESTALE) | Some(libc::EIO) => {
                sys_mount::unmount(target, UnmountFlags::DETACH)?;
                Ok(Unmounted::Detached)
            }
            _ => Err(e),
        },
    }
}
