//! mount(2) and umount(2), and binds through the new mount API (open_tree, mount_setattr,
//! move_mount) where the kernel and any seccomp filter allow it: every mount call through one
//! crate, rustix. No `mount` binary: its helpers and fstab lookups are exactly the surprises a
//! node plugin must not have.
//!
//! Targets are never paths the kernel resolves anew: a mount goes onto the entry fd that was
//! checked (/proc/self/fd/N), and an unmount names the entry through its held parent directory
//! with UMOUNT_NOFOLLOW, so a component swapped for a symlink in between redirects nothing.

use std::io;
use std::path::Path;

use rustix::fs::CWD;
use rustix::io::Errno;
use rustix::mount::{MountFlags as MsFlags, UnmountFlags, mount_bind, unmount as umount2};
use rustix::mount::{MoveMountFlags, OpenTreeFlags, move_mount, open_tree};

use super::private_bind;
use super::setattr;
use crate::anchor::{Anchored, EntryFd};
use crate::sandbox::{self, Newer};

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
    let mut flags = ms_flags(vfs_bits)?;
    if read_only {
        flags |= MsFlags::RDONLY;
    }
    let data = std::ffi::CString::new(data.join(","))
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL in mount options"))?;
    let data = (!data.is_empty()).then_some(data.as_c_str());
    Ok(rustix::mount::mount(
        device,
        target.proc_path(),
        fs_type,
        flags,
        data,
    )?)
}

/// Validated `MS_*` bits as mount(2)'s flags word (they all fit its 32 bits).
fn ms_flags(vfs_bits: u64) -> io::Result<MsFlags> {
    u32::try_from(vfs_bits)
        .map(MsFlags::from_bits_retain)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "mount flags beyond 32 bits"))
}

/// Bind-mounts `source` (a /proc/self/fd path of a checked mount root or device node) onto the
/// entry, read-only when asked and with the per-mount bits of `vfs_bits` (nosuid, nodev, noexec,
/// atime). The bind is made with those attributes while still detached (open_tree, then
/// mount_setattr) and only then attached (move_mount onto the entry's fd): a shared target (the
/// kubelet directory under Bidirectional propagation) clones the mount into its peers as it is
/// attached, flags included, so no namespace ever sees it writable.
pub fn bind(source: &Path, entry: &Anchored, read_only: bool, vfs_bits: u64) -> io::Result<()> {
    let target = entry.open_entry()?;
    if sandbox::mount_api_usable() {
        match bind_detached(source, &target, read_only, vfs_bits) {
            Ok(()) => return Ok(()),
            Err(Attach::Failed(e)) => return Err(e),
            Err(Attach::Unavailable) => {}
        }
    }
    bind_without_mount_api(source, &target, read_only, vfs_bits)
}

enum Attach {
    /// A call of the new mount API is missing or denied (logged once by `sandbox`); nothing was
    /// attached.
    Unavailable,
    Failed(io::Error),
}

fn bind_detached(
    source: &Path,
    target: &EntryFd,
    read_only: bool,
    vfs_bits: u64,
) -> Result<(), Attach> {
    let fail = |call: Newer, e: Errno| {
        if sandbox::unavailable(call, Some(e.raw_os_error())) {
            Attach::Unavailable
        } else {
            Attach::Failed(e.into())
        }
    };
    // The magic link is followed (no AT_SYMLINK_NOFOLLOW): the clone is of what the fd names.
    // Not recursive, as MS_BIND without MS_REC. Dropped unattached, the tree is dissolved.
    let tree = open_tree(
        CWD,
        source,
        OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC,
    )
    .map_err(|e| fail(Newer::OpenTree, e))?;
    let attr = setattr::attr_from_ms(vfs_bits, read_only);
    if attr != setattr::MountAttr::default()
        && let Err(e) = setattr::set_attr(&tree, &attr)
    {
        let errno = Errno::from_io_error(&e).unwrap_or(Errno::INVAL);
        return Err(fail(Newer::MountSetattr, errno));
    }
    // Onto the checked entry through its fd, as mount(2) onto its /proc/self/fd path did.
    move_mount(
        &tree,
        "",
        target,
        "",
        MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH | MoveMountFlags::MOVE_MOUNT_T_EMPTY_PATH,
    )
    .map_err(|e| fail(Newer::MoveMount, e))
}

/// Without the new mount API (Linux before 5.12, or a seccomp filter denying it): a plain bind
/// when no attribute is asked for; otherwise the bind gets its attributes in the agent's private
/// place and only then is bound onto the entry (`private_bind`), so that a shared target's peers
/// clone it with them too (a remount at the target would change the agent's copy alone).
fn bind_without_mount_api(
    source: &Path,
    target: &EntryFd,
    read_only: bool,
    vfs_bits: u64,
) -> io::Result<()> {
    let mut flags = ms_flags(vfs_bits)? & !MsFlags::RDONLY;
    if !read_only && flags.is_empty() {
        return Ok(mount_bind(source, target.proc_path())?);
    }
    if read_only {
        flags |= MsFlags::RDONLY;
    }
    flags |= kept_from(source)?;
    private_bind::bind_with(source, target, flags)
}

/// What of the source mount's per-mount flags a bind remount would drop: it sets nosuid, nodev
/// and noexec to exactly what it is given, where open_tree's clone keeps the source's and
/// mount_setattr only adds to them (a thirty-fifth fresh review's F1: a read-only publication
/// of a `nosuid,nodev,noexec` staging lost all three without the mount API). The atime mode is
/// left to the kernel, which keeps the mount's own unless one is asked, as mount_setattr does;
/// read-only is not taken from here (statvfs also says so of a filesystem that went read-only on
/// an error, and a read-only staging of the agent's makes its publications read-only anyway).
fn kept_from(source: &Path) -> io::Result<MsFlags> {
    use rustix::fs::StatVfsMountFlags as St;
    let on = rustix::fs::statvfs(source)
        .map_err(|e| io::Error::new(e.kind(), format!("statvfs of the bind's source: {e}")))?
        .f_flag;
    let mut kept = MsFlags::empty();
    for (st, ms) in [
        (St::NOSUID, MsFlags::NOSUID),
        (St::NODEV, MsFlags::NODEV),
        (St::NOEXEC, MsFlags::NOEXEC),
    ] {
        if on.contains(st) {
            kept |= ms;
        }
    }
    Ok(kept)
}

use ebs_node_core::seam::Unmounted;

/// Unmounts the top-most mount at the entry.
///
/// EBUSY may be no user of the mount at all: a tool being spawned on another thread holds a copy
/// of every descriptor of the agent from clone until it closes them (`command::spawn`), and one
/// inside this mount (a handle a call held on the path a moment ago) keeps it busy meanwhile. So
/// an EBUSY is tried again past the spawns (`command::past_spawns`, as a released device is
/// waited for); one that outlasts them is a real user, and is returned.
pub fn unmount(entry: &Anchored) -> io::Result<Unmounted> {
    let path = entry.unmount_path();
    let unmount = || umount2(&path, UnmountFlags::NOFOLLOW);
    let first = match unmount() {
        Err(Errno::BUSY) => crate::command::past_spawns(unmount, |r| *r == Err(Errno::BUSY)),
        other => other,
    };
    match first {
        Ok(()) => Ok(Unmounted::Done),
        Err(e) => match e {
            Errno::INVAL | Errno::NOENT => Ok(Unmounted::NotMounted),
            Errno::NOTCONN | Errno::STALE | Errno::IO => {
                umount2(&path, UnmountFlags::DETACH | UnmountFlags::NOFOLLOW)?;
                Ok(Unmounted::Detached)
            }
            other => Err(other.into()),
        },
    }
}
