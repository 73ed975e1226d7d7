//! What one namespace's table says of the devices: every mount's device, and every bind of a
//! device node, told by the node's name in the device filesystem and by a stat of the bind's
//! mount point. Runs in a thread inside the namespace whose table it is (paths resolve there).
//!
//! A bind of a device-filesystem node that names nothing in the agent's /dev (a node deleted
//! since: a device removed, whose number the next one takes; one made below a mount in the
//! agent's /dev) and whose mount point shows no block device either (a mount laid over it, or
//! over the namespace's root) is a bind of a device this agent cannot tell: the scan fails, and
//! every device counts as used until it goes (a forty-fifth fresh review's F3; both need root).

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path};

use nix::fcntl::{AtFlags, OFlag, openat};
use nix::sys::stat::{Mode, fstatat};

use super::Found;
use crate::device::devnum_of;
use crate::mount::table::MountTable;
use ebs_node_core::DevNum;

/// What a device-filesystem name is in the agent's /dev.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Node {
    Block(DevNum),
    /// Something else (a character device, a directory).
    Other,
    /// Nothing by that name.
    Missing,
}

/// Notes each mount of `table` and each bind of a device node in it; returns the namespaces
/// with no process that the table pins.
pub(super) fn record(
    found: &mut Found,
    table: &MountTable,
    dev_dir: &File,
    place: &dyn Fn(&Path) -> String,
) -> io::Result<Vec<(File, String)>> {
    let mut pins = Vec::new();
    for m in table.entries() {
        found
            .any
            .entry(DevNum::new(m.major, m.minor))
            .or_insert_with(|| format!("mounted at {}", place(&m.mount_point)));
        if m.fs_type == "nsfs" && m.root.to_string_lossy().starts_with("mnt:[") {
            if let Ok(f) = File::open(&m.mount_point) {
                pins.push((f, format!("pinned at {}", place(&m.mount_point))));
            }
            continue;
        }
        // A bind of a device node has the node as its root, never a filesystem's "/".
        if m.root == Path::new("/") {
            continue;
        }
        let at = format!("bound at {}", place(&m.mount_point));
        // A node of the device filesystem is known by its name there, even when something is
        // mounted over the bind (the mount point then shows the cover, not the node).
        let named = if m.fs_type == "devtmpfs" {
            devtmpfs_node(dev_dir, &m.root)
        } else {
            Node::Other
        };
        if let Node::Block(devnum) = named {
            note_bind(found, devnum, &at);
        }
        let stated = block_at(&m.mount_point);
        if let Some(devnum) = stated {
            note_bind(found, devnum, &at);
        }
        if named == Node::Missing && stated.is_none() {
            return Err(io::Error::other(format!(
                "a device node no longer in /dev (or below a mount there) is {at}, under a \
                 cover: the device cannot be told, so every device counts as used"
            )));
        }
    }
    Ok(pins)
}

/// What the node at `root` of the device filesystem is, looked up in the agent's own /dev.
pub(super) fn devtmpfs_node(dev_dir: &File, root: &Path) -> Node {
    match fstatat(
        dev_dir.as_fd(),
        root.strip_prefix("/").unwrap_or(root),
        AtFlags::AT_SYMLINK_NOFOLLOW,
    ) {
        Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFBLK => Node::Block(devnum_of(st.st_rdev)),
        Ok(_) => Node::Other,
        Err(_) => Node::Missing,
    }
}

pub(super) fn note_bind(found: &mut Found, devnum: DevNum, at: &str) {
    found.bound.entry(devnum).or_insert_with(|| at.to_string());
    found.any.entry(devnum).or_insert_with(|| at.to_string());
}

/// The device numbers of the block device node at `path` (not followed if a symlink), if it is
/// one. A path longer than the kernel resolves in one call is walked a component at a time (a
/// bind at 20 levels of 250-character names was passed over: the review's F4).
fn block_at(path: &Path) -> Option<DevNum> {
    let st = match nix::sys::stat::lstat(path) {
        Ok(st) => st,
        Err(nix::errno::Errno::ENAMETOOLONG) => lstat_walked(path)?,
        Err(_) => return None,
    };
    (st.st_mode & libc::S_IFMT == libc::S_IFBLK).then(|| devnum_of(st.st_rdev))
}

fn lstat_walked(path: &Path) -> Option<nix::sys::stat::FileStat> {
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
    fstatat(dir.as_fd(), last.as_bytes(), AtFlags::AT_SYMLINK_NOFOLLOW).ok()
}
