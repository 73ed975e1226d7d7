//! Binds whose mount point leads elsewhere (a mount laid over the bind, or over a directory
//! above it) and whose node no name tells: a node made with mknod outside the device filesystem
//! (a forty-seventh fresh review's F1, the thirty-second's F4: a stage took the device), or a
//! device-filesystem node whose name no longer names it. They are told in a private copy of the
//! namespace, made by the thread that entered it as its last act: the covers are lazily
//! unmounted there, one at a time, until the mount point leads to the bind itself.
//!
//! The copy is the agent's alone: its mounts are made private before anything is unmounted, so
//! no unmount reaches the namespace it was copied from (nor its peers), and it ends with the
//! thread. A cover the kernel will not unmount leaves the bind untold: every device then counts
//! as used until the bind goes. Only namespaces the host's user namespace owns are copied: a
//! copy of one a user namespace owns has every mount locked (the kernel locks a copy's mounts
//! whenever its owner changes), so no cover would come off (`mod.rs` `enter`).
//!
//! While the copy lives it holds every mount of the namespace, and a filesystem it holds stays
//! claimed past its unmount elsewhere: a copy is made only for a bind that is still mounted.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use nix::fcntl::{OFlag, openat};
use nix::sched::{CloneFlags, unshare};
use nix::sys::stat::Mode;
use rustix::mount::{MountPropagationFlags, UnmountFlags, mount_change, unmount};

use super::Found;
use super::mount_point::{AtMountPoint, is_whole, told_at_mount_point};
use super::record::{note_bind, untold};
use crate::mount::table::{MountEntry, MountTable};
use ebs_node_core::DevNum;

/// How many covers are taken off one bind before it counts as untold.
const MAX_COVERS: usize = 64;

/// A bind to tell in the copy: found by its place, its root and its filesystem's device, which
/// name the same node in the copy (the copy shares the original's dentries).
pub(super) struct Covered {
    pub mount_point: PathBuf,
    pub root: PathBuf,
    pub dev: DevNum,
    pub at: String,
    /// Its old id in the namespace's table.
    pub old_id: u32,
    /// Whether it is a node of the device filesystem (any user can bind one).
    pub devtmpfs: bool,
}

/// What is known of the namespace the copy is made of: its id (Linux 6.12), and the unique ids
/// of its table's mounts by their old ids (from the kernel's list, Linux 6.8).
pub(super) struct Originals {
    pub ns_id: Option<u64>,
    pub unique: HashMap<u32, u64>,
}

impl Originals {
    /// Whether the bind is still mounted in the namespace the copy was made of; `None`: not
    /// known here.
    fn still_mounted(&self, bind: &Covered) -> Option<bool> {
        let (ns_id, id) = (self.ns_id?, *self.unique.get(&bind.old_id)?);
        match crate::mount::foreign::old_id_of(id, ns_id) {
            Ok(Some(_)) => Some(true),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Some(false),
            Ok(None) | Err(_) => None,
        }
    }
}

/// The binds of `covered` whose mount point still leads elsewhere, in the namespace's table as
/// it is now (this thread still in it): a mount made or unmounted while the table was read (the
/// agent's own publications) reaches this far, and the copy holds every mount of the namespace
/// while it lives, so a filesystem it holds stays claimed past its unmount (a stage's unstage
/// was refused as "still mounted elsewhere" in the bench). Mounts gone since bind nothing.
pub(super) fn still_covered(
    found: &mut Found,
    proc_dir: &File,
    covered: Vec<Covered>,
) -> io::Result<Vec<Covered>> {
    let now = table(proc_dir)?;
    let mut still = Vec::new();
    for bind in covered {
        let Some(m) = now
            .entries()
            .iter()
            .find(|m| m.mount_id == bind.old_id && bind.is(m))
        else {
            continue;
        };
        match told_at_mount_point(found, &now, m, &bind.at) {
            AtMountPoint::Told => {}
            AtMountPoint::Nowhere if is_whole(m) => {}
            AtMountPoint::Nowhere | AtMountPoint::Elsewhere => still.push(bind),
        }
    }
    Ok(still)
}

impl Covered {
    pub fn of(m: &MountEntry, at: String) -> Self {
        Covered {
            mount_point: m.mount_point.clone(),
            root: m.root.clone(),
            dev: DevNum::new(m.major, m.minor),
            at,
            old_id: m.mount_id,
            devtmpfs: m.fs_type == "devtmpfs",
        }
    }

    fn is(&self, m: &MountEntry) -> bool {
        m.mount_point == self.mount_point
            && m.root == self.root
            && DevNum::new(m.major, m.minor) == self.dev
    }
}

/// Moves this thread (it must share no filesystem attributes, and must do nothing after) to a
/// private copy of its mount namespace and tells each bind there. A bind the copy shows
/// nowhere was unmounted since the table was read (a container going: it binds nothing now),
/// or its place was renamed (a forty-ninth fresh review's F2: a rename loop got a stage
/// through): the namespace it was copied from is asked which, by the bind's unique id, and a
/// bind still mounted there fails the scan. Where that cannot be asked (before Linux 6.12), it
/// counts as gone: failing the scan there refused another volume's unpublish while a test's
/// bind was being unmounted (seen in the suite).
pub(super) fn tell(
    found: &mut Found,
    proc_dir: &File,
    covered: &[Covered],
    originals: &Originals,
) -> io::Result<()> {
    unshare(CloneFlags::CLONE_NEWNS)?;
    mount_change(
        "/",
        MountPropagationFlags::PRIVATE | MountPropagationFlags::REC,
    )?;
    for bind in covered {
        let table = table(proc_dir)?;
        let copies: Vec<u32> = table
            .entries()
            .iter()
            .filter(|m| bind.is(m))
            .map(|m| m.mount_id)
            .collect();
        // A whole filesystem's mount the copy cannot tell (its places renamed as the copy
        // looks) is passed over, as where its mount point leads nowhere (`record.rs`).
        let whole = bind.root == Path::new("/");
        if copies.is_empty() && originals.still_mounted(bind) == Some(true) && !whole {
            return Err(io::Error::other(format!(
                "{}: its place changed since the table was read",
                untold(&bind.at)
            )));
        }
        for id in copies {
            match uncovered(proc_dir, id, &bind.mount_point) {
                Ok(Some(devnum)) => note_bind(found, devnum, &bind.at),
                Ok(None) => {}
                // Only where its place is gone or renamed as the copy looks: a node the copy
                // reaches and cannot ask (a shut-down XFS: a fifty-third fresh review's F3) fails.
                Err(e) if whole && e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io::Error::other(format!("{}: {e}", untold(&bind.at)))),
            }
        }
    }
    Ok(())
}

/// The block device the copy's mount `id` binds (`None`: no block device), once every mount
/// laid over it is unmounted in the copy.
fn uncovered(proc_dir: &File, id: u32, mount_point: &Path) -> io::Result<Option<DevNum>> {
    for _ in 0..MAX_COVERS {
        let reached = reach(mount_point)?;
        if reached.mount_id == u64::from(id) {
            return Ok(reached.block);
        }
        let table = table(proc_dir)?;
        let cover = first_off_the_way(&table, id, reached.mount_id)?;
        unmount(&cover, UnmountFlags::DETACH).map_err(|e| {
            io::Error::other(format!(
                "the mount over it at {} stays: {e}",
                cover.display()
            ))
        })?;
    }
    Err(io::Error::other(format!(
        "more than {MAX_COVERS} mounts over it"
    )))
}

/// Where a walk of the bind's path goes astray: of the mounts the walk went through to the
/// mount it reached (`reached`), the first that is not the bind nor a mount the bind is below;
/// its mount point is a place on the bind's path reached through the bind's own ancestors.
fn first_off_the_way(table: &MountTable, id: u32, reached: u64) -> io::Result<PathBuf> {
    let by_id = |i: u64| table.entries().iter().find(|m| u64::from(m.mount_id) == i);
    let mut way = HashSet::new();
    let mut at = Some(u64::from(id));
    while let Some(i) = at.filter(|i| way.insert(*i)) {
        at = by_id(i).map(|m| u64::from(m.parent_id));
    }
    let mut off = by_id(reached).filter(|m| !way.contains(&u64::from(m.mount_id)));
    for _ in 0..table.entries().len() {
        let Some(m) = off else { break };
        if way.contains(&u64::from(m.parent_id)) {
            return Ok(m.mount_point.clone());
        }
        off = by_id(u64::from(m.parent_id));
    }
    Err(io::Error::new(
        io::ErrorKind::NotFound,
        "its path leads to no mount laid over it (its mount point is gone or renamed)",
    ))
}

/// What a walk of `path` reaches.
struct Reached {
    /// The mount of the last place the walk reached (the path's end, or where it stopped).
    mount_id: u64,
    /// The device node at the path's end, if it reached its end and that is a block device.
    block: Option<DevNum>,
}

/// Walks `path` a component at a time, following no symbolic link (a cover may put one where a
/// directory was); stops where a component cannot be reached.
fn reach(path: &Path) -> io::Result<Reached> {
    let parts: Vec<&std::ffi::OsStr> = path
        .components()
        .filter_map(|c| match c {
            Component::Normal(p) => Some(p),
            _ => None,
        })
        .collect();
    let mut at: OwnedFd = File::open("/")?.into();
    for (i, part) in parts.iter().enumerate() {
        let last = i + 1 == parts.len();
        let dir = if last {
            OFlag::empty()
        } else {
            OFlag::O_DIRECTORY
        };
        let flags = OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | dir;
        match openat(at.as_fd(), part.as_bytes(), flags, Mode::empty()) {
            Ok(next) => at = next,
            Err(_) => {
                let (mount_id, _) = looked(&at)?;
                return Ok(Reached {
                    mount_id,
                    block: None,
                });
            }
        }
    }
    let (mount_id, block) = looked(&at)?;
    Ok(Reached { mount_id, block })
}

/// The mount id of what `fd` is, and the device if it is a block device node.
fn looked(fd: &OwnedFd) -> io::Result<(u64, Option<DevNum>)> {
    use rustix::fs::{AtFlags as Flags, StatxFlags, statx};
    let mask = StatxFlags::TYPE | StatxFlags::MNT_ID;
    let flags = Flags::EMPTY_PATH | Flags::SYMLINK_NOFOLLOW | Flags::STATX_DONT_SYNC;
    let st = statx(fd, "", flags, mask)?;
    if !StatxFlags::from_bits_retain(st.stx_mask).contains(StatxFlags::MNT_ID) {
        return Err(io::Error::other("no mount id from statx"));
    }
    let block = (u32::from(st.stx_mode) & libc::S_IFMT == libc::S_IFBLK)
        .then(|| DevNum::new(st.stx_rdev_major, st.stx_rdev_minor));
    Ok((st.stx_mnt_id, block))
}

/// The copy's table, as this thread sees it.
fn table(proc_dir: &File) -> io::Result<MountTable> {
    super::own_table(proc_dir).map(|(_, table)| table)
}
