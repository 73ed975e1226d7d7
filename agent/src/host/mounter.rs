//! mount(2) and umount(2), through sys-mount and nix. No `mount` binary: its helpers and fstab
//! lookups are exactly the surprises a node plugin must not have.
//!
//! Targets are never paths the kernel resolves anew: a mount goes onto the entry fd that was
//! checked (/proc/self/fd/N), and an unmount names the entry through its held parent directory
//! with UMOUNT_NOFOLLOW, so a component swapped for a symlink in between redirects nothing.

use std::io;
use std::path::Path;

use nix::mount::{MntFlags, umount2};
use sys_mount::{Mount, MountFlags as MsFlags};

use super::anchor::{Anchored, EntryFd};

/// Mounts a filesystem from a block device onto `target`. `vfs_bits` are validated `MS_*` bits;
/// `data` holds validated filesystem options only.
pub fn mount_device(
    device: &Path,
    target: &EntryFd,
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
    builder.mount(device, target.proc_path()).map(drop)
}

/// Bind-mounts `source` (a /proc/self/fd path of a checked mount root or device node) onto the
/// entry. A read-only bind needs a second, remount step, because the kernel ignores MS_RDONLY on
/// the first MS_BIND call; that step names the new mount through a fresh fd of the entry, and the
/// bind is taken away again if it fails, so a writable bind never outlives a read-only request.
pub fn bind(source: &Path, entry: &Anchored, read_only: bool, vfs_bits: u64) -> io::Result<()> {
    let target = entry.open_entry()?;
    let before = target.stat()?.mnt_id;
    Mount::builder()
        .fstype("none")
        .flags(MsFlags::BIND)
        .mount(source, target.proc_path())?;
    let extra = MsFlags::from_bits_retain(vfs_bits) & !MsFlags::RDONLY;
    if !read_only && extra.is_empty() {
        return Ok(());
    }
    let remount = || -> io::Result<()> {
        let bound = entry.open_entry()?;
        if before.is_some() && bound.stat()?.mnt_id == before {
            return Err(io::Error::other(
                "the new bind mount is not at the entry any more",
            ));
        }
        let mut flags = MsFlags::BIND | MsFlags::REMOUNT | extra;
        if read_only {
            flags |= MsFlags::RDONLY;
        }
        Mount::builder()
            .fstype("none")
            .flags(flags)
            .mount("none", bound.proc_path())
            .map(drop)
    };
    if let Err(e) = remount() {
        let _ = umount2(
            &entry.unmount_path(),
            MntFlags::MNT_DETACH | MntFlags::UMOUNT_NOFOLLOW,
        );
        return Err(e);
    }
    Ok(())
}

#[derive(Debug, PartialEq, Eq)]
pub enum Unmounted {
    Done,
    /// Nothing was mounted there (or the path is gone): success for an idempotent call.
    NotMounted,
    /// A dead mount (ENOTCONN/ESTALE/EIO) that could only be detached lazily.
    Detached,
}

/// Unmounts the top-most mount at the entry.
pub fn unmount(entry: &Anchored) -> io::Result<Unmounted> {
    let path = entry.unmount_path();
    match umount2(&path, MntFlags::UMOUNT_NOFOLLOW) {
        Ok(()) => Ok(Unmounted::Done),
        Err(e) => match e {
            nix::errno::Errno::EINVAL | nix::errno::Errno::ENOENT => Ok(Unmounted::NotMounted),
            nix::errno::Errno::ENOTCONN | nix::errno::Errno::ESTALE | nix::errno::Errno::EIO => {
                umount2(&path, MntFlags::MNT_DETACH | MntFlags::UMOUNT_NOFOLLOW)?;
                Ok(Unmounted::Detached)
            }
            other => Err(other.into()),
        },
    }
}
