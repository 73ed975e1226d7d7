//! What a mount's mount point shows of what the mount binds: the kernel's mount id of what the
//! path reaches says whether it leads to the mount itself (then the node there is what it
//! binds), to another mount laid over it (told in the copy, `unveil`), or nowhere (a place on it
//! renamed as the scan looks).

use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path};

use nix::fcntl::{OFlag, openat};
use nix::sys::stat::Mode;

use super::Found;
use super::record::note_bind;
use crate::mount::table::{MountEntry, MountTable};
use ebs_node_core::DevNum;

/// What a mount's mount point told.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum AtMountPoint {
    /// What it binds (noted), or that it binds no node.
    Told,
    /// It leads to another mount: one laid over it or over a directory above it.
    Elsewhere,
    /// It leads nowhere (a place on it gone or renamed since the table was read).
    Nowhere,
}

/// Whether `m`'s root reads as a whole filesystem's.
pub(super) fn is_whole(m: &MountEntry) -> bool {
    m.root == Path::new("/")
}

/// What the mount point of `m` (a mount of `table`) tells of what `m` binds, noted where told:
/// where it leads to this very mount, it shows a block device node, or proof that none is (a
/// character device, a directory).
pub(super) fn told_at_mount_point(
    found: &mut Found,
    table: &MountTable,
    m: &MountEntry,
    at: &str,
) -> AtMountPoint {
    match seen_at(&m.mount_point, m.mount_id) {
        Seen::Block(devnum) => {
            note_bind(found, devnum, at);
            AtMountPoint::Told
        }
        Seen::NotBlock => AtMountPoint::Told,
        // A mount with mounts stacked on its root, the top one a directory: its root is a
        // directory too (a mount's root is a directory exactly where what it is mounted on is
        // one), so it binds no node (a second /dev/shm laid on the first, as this project's CI
        // host has).
        Seen::Elsewhere(Some(top)) if top.dir && stacked_on(table, top.mount_id, m) => {
            AtMountPoint::Told
        }
        Seen::Elsewhere(_) | Seen::Unresolved if is_whole(m) && renamed_away(table, m) => {
            AtMountPoint::Nowhere
        }
        Seen::Elsewhere(_) | Seen::Unresolved => AtMountPoint::Elsewhere,
    }
}

/// Whether a walk of `m`'s mount point, a component at a time and following no symbolic link,
/// stays in the mounts `m` is below and ends short of `m`: a place on the path renamed or
/// swapped since the table was read. Through any other mount (a cover, with a symbolic link in
/// it leading back: a fifty-third fresh review's F2), or reaching `m` itself unasked (a stat that
/// fails there, as on a shut-down XFS: its F3), it is not.
fn renamed_away(table: &MountTable, m: &MountEntry) -> bool {
    use rustix::fs::{AtFlags as Flags, StatxFlags, statx};
    let by_id = |i: u32| table.entries().iter().find(|e| e.mount_id == i);
    let mut above = std::collections::HashSet::new();
    let mut at = by_id(m.parent_id);
    while let Some(e) = at.filter(|e| above.insert(u64::from(e.mount_id))) {
        at = by_id(e.parent_id);
    }
    let mount_of = |fd: &OwnedFd| {
        let flags = Flags::EMPTY_PATH | Flags::SYMLINK_NOFOLLOW | Flags::STATX_DONT_SYNC;
        statx(fd, "", flags, StatxFlags::MNT_ID)
            .ok()
            .filter(|st| StatxFlags::from_bits_retain(st.stx_mask).contains(StatxFlags::MNT_ID))
            .map(|st| st.stx_mnt_id)
    };
    let Ok(root) = File::open("/") else {
        return false;
    };
    let mut dir: OwnedFd = root.into();
    let parts: Vec<&std::ffi::OsStr> = m
        .mount_point
        .components()
        .filter_map(|c| match c {
            Component::Normal(p) => Some(p),
            _ => None,
        })
        .collect();
    for (i, part) in parts.iter().enumerate() {
        if !mount_of(&dir).is_some_and(|id| above.contains(&id)) {
            return false;
        }
        let kind = if i + 1 < parts.len() {
            OFlag::O_DIRECTORY
        } else {
            OFlag::empty()
        };
        let flags = OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | kind;
        dir = match openat(dir.as_fd(), part.as_bytes(), flags, Mode::empty()) {
            Ok(next) => next,
            Err(nix::errno::Errno::ENOENT | nix::errno::Errno::ENOTDIR) => return true,
            Err(_) => return false,
        };
    }
    // The walk's end: a symbolic link, or a place in the mounts above, where `m` is not.
    mount_of(&dir).is_some_and(|id| above.contains(&id))
}

/// What a bind's mount point shows.
enum Seen {
    /// The bind's own root, a block device node.
    Block(DevNum),
    /// The bind's own root, and no block device node.
    NotBlock,
    /// Something else (a mount laid over it or over a directory above it), or nothing: what the
    /// path reached, where it reached something.
    Elsewhere(Option<Top>),
    /// The path reached nothing (or nothing that could be asked).
    Unresolved,
}

/// What a mount point's path reached instead of the mount asked about.
struct Top {
    /// Its mount id (the table's kind).
    mount_id: u64,
    dir: bool,
}

/// Whether the mount `top` lies on `m`'s root through a stack of mounts at `m`'s mount point,
/// each on the root of the one below.
fn stacked_on(table: &MountTable, top: u64, m: &MountEntry) -> bool {
    let mut at = top;
    for _ in 0..table.entries().len() {
        let Some(e) = table.entries().iter().find(|e| u64::from(e.mount_id) == at) else {
            return false;
        };
        if e.mount_point != m.mount_point || e.mount_id == m.mount_id {
            return false;
        }
        if e.parent_id == m.mount_id {
            return true;
        }
        at = u64::from(e.parent_id);
    }
    false
}

/// What the mount point `path` of the mount `mount_id` (the table's id) shows, asked of the
/// kernel's cached attributes (a FUSE server is not asked). Only an answer from that very mount
/// counts: below a cover the path leads elsewhere. A path longer than the kernel resolves in one
/// call is walked a component at a time (a bind at 20 levels of 250-character names was passed
/// over: a forty-fifth fresh review's F4).
fn seen_at(path: &Path, mount_id: u32) -> Seen {
    use rustix::fs::{AtFlags as Flags, StatxFlags, statx};
    let mask = StatxFlags::TYPE | StatxFlags::MNT_ID;
    let flags = Flags::SYMLINK_NOFOLLOW | Flags::STATX_DONT_SYNC;
    let st = match statx(rustix::fs::CWD, path, flags, mask) {
        Ok(st) => st,
        Err(rustix::io::Errno::NAMETOOLONG) => {
            let Some((dir, last)) = parent_walked(path) else {
                return Seen::Elsewhere(None);
            };
            match statx(&dir, last, flags, mask) {
                Ok(st) => st,
                Err(_) => return Seen::Elsewhere(None),
            }
        }
        Err(_) => return Seen::Unresolved,
    };
    if !StatxFlags::from_bits_retain(st.stx_mask).contains(StatxFlags::MNT_ID) {
        return Seen::Elsewhere(None);
    }
    if st.stx_mnt_id != u64::from(mount_id) {
        return Seen::Elsewhere(Some(Top {
            mount_id: st.stx_mnt_id,
            dir: u32::from(st.stx_mode) & libc::S_IFMT == libc::S_IFDIR,
        }));
    }
    if u32::from(st.stx_mode) & libc::S_IFMT == libc::S_IFBLK {
        Seen::Block(DevNum::new(st.stx_rdev_major, st.stx_rdev_minor))
    } else {
        Seen::NotBlock
    }
}

/// The directory holding `path`'s last component, opened a component at a time, and that
/// component.
fn parent_walked(path: &Path) -> Option<(OwnedFd, &std::ffi::OsStr)> {
    let mut parts: Vec<&std::ffi::OsStr> = path
        .components()
        .filter_map(|c| match c {
            Component::Normal(p) => Some(p),
            _ => None,
        })
        .collect();
    let last = parts.pop()?;
    let mut dir: OwnedFd = File::open("/").ok()?.into();
    for part in parts {
        dir = openat(
            dir.as_fd(),
            part.as_bytes(),
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .ok()?;
    }
    Some((dir, last))
}
