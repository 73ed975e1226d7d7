//! What one namespace's table says of the devices: every mount's device, and every bind of a
//! device node. Runs in a thread inside the namespace whose table it is (paths resolve there).
//!
//! A bind is told by its mount point where that leads to the bind itself (the kernel's mount id
//! of what the path reaches is the bind's): a block device node there is the device, anything
//! else proves no device is bound (a character device removed since, a directory). Where the
//! mount point leads elsewhere (a mount laid over it, or over a directory above it), a node of
//! the device filesystem is told by its name in the agent's /dev, if that name still names it
//! (not deleted since, not reached through a mount on the agent's /dev: forty-fifth and
//! forty-sixth fresh reviews); any other bind is told in a copy of the namespace with the
//! covers taken off (`unveil`).

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path};

use nix::fcntl::{OFlag, openat};
use nix::sys::stat::Mode;

use super::Found;
use super::unveil::Covered;
use crate::mount::table::{MountEntry, MountTable};
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

/// What one table showed beyond the devices it notes.
#[derive(Default)]
pub(super) struct Recorded {
    /// The namespaces with no process that the table pins.
    pub pins: Vec<(File, String)>,
    /// The binds no mount point nor name tells, to be told in a copy of the namespace
    /// (`unveil`).
    pub covered: Vec<Covered>,
    /// A namespace the table pins that could not be opened.
    pub failed: Option<String>,
}

/// Notes each mount of `table` and each bind of a device node in it that its mount point or
/// its name tells.
pub(super) fn record(
    found: &mut Found,
    table: &MountTable,
    dev_dir: &File,
    place: &dyn Fn(&Path) -> String,
) -> Recorded {
    let mut out = Recorded::default();
    let network_places: Vec<&Path> = table
        .entries()
        .iter()
        .filter(|n| is_network(&n.fs_type))
        .map(|n| n.mount_point.as_path())
        .collect();
    for m in table.entries() {
        found
            .any
            .entry(DevNum::new(m.major, m.minor))
            .or_insert_with(|| format!("mounted at {}", place(&m.mount_point)));
        if m.fs_type == "nsfs" && m.root.to_string_lossy().starts_with("mnt:[") {
            // A pin that cannot be opened (the agent's files run out) fails the scan, which
            // would pass over its namespace; one unmounted since pins nothing.
            match File::open(&m.mount_point) {
                Ok(f) => {
                    let at = format!("pinned at {}", place(&m.mount_point));
                    out.pins.push((f, at));
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => out.failed = Some(format!("{}: {e}", place(&m.mount_point))),
            }
            continue;
        }
        // "/" is a whole filesystem's root, or a node opened by its handle with no name in the
        // dentry cache (a fifty-first fresh review's F1: passed over, a stage took the device
        // such a bind held): told by its mount point too, on a filesystem that can hold one.
        if is_whole(m) && !may_be_a_node(&network_places, m) {
            continue;
        }
        let at = format!("bound at {}", place(&m.mount_point));
        match told_at_mount_point(found, table, m, &at) {
            AtMountPoint::Told => continue,
            // A whole filesystem's mount point that leads nowhere while its places are renamed
            // (the agent's own confinement tests swap a symlink in along a publication's path):
            // only root, racing, could hide a node opened by its handle that way (docs/
            // design.md, "Known and not yet refused"); failing the scan there refused other
            // volumes' calls.
            AtMountPoint::Nowhere if is_whole(m) => continue,
            AtMountPoint::Nowhere | AtMountPoint::Elsewhere => {}
        }
        // Covered: a node of the device filesystem is known by its name there, if the name
        // still names it; any other is told in a copy of the namespace with the covers off.
        let named = (m.fs_type == "devtmpfs")
            .then(|| devtmpfs_node(dev_dir, &m.root, DevNum::new(m.major, m.minor)));
        match named {
            Some(Node::Block(devnum)) => note_bind(found, devnum, &at),
            Some(Node::Other) => {}
            Some(Node::Missing) | None => out.covered.push(Covered::of(m, at)),
        }
    }
    out
}

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

/// Filesystems that hold no block device node (they have no mknod, or make their own
/// files only).
const NO_NODES: [&str; 17] = [
    "autofs",
    "binfmt_misc",
    "bpf",
    "cgroup",
    "cgroup2",
    "configfs",
    "debugfs",
    "devpts",
    "efivarfs",
    "fusectl",
    "mqueue",
    "nsfs",
    "proc",
    "pstore",
    "securityfs",
    "sysfs",
    "tracefs",
];

/// Whether the mount whose root reads "/" may be a bind of a block device node, and can be asked
/// at its mount point: not on a filesystem that holds none; not a network or FUSE filesystem,
/// nor at or below the mount point of one, whose lookups may hang (a server that never answers
/// laid over a publication's directory took every scan past its 5 s in the suite: docs/
/// design.md, "Known and not yet refused"). The rest are asked as a bind is; `nodev` is no
/// exception, as it is none for a bind: a remount takes it off the very mount (a fifty-second
/// fresh review's F4).
fn may_be_a_node(network_places: &[&Path], m: &MountEntry) -> bool {
    !NO_NODES.contains(&m.fs_type.as_str())
        && !is_network(&m.fs_type)
        && !network_places.iter().any(|p| m.mount_point.starts_with(p))
}

fn is_network(fs_type: &str) -> bool {
    NETWORK.contains(&fs_type) || fs_type.starts_with("fuse.")
}

/// Filesystem types whose lookups ask a server (a stat below one may hang), with `fuse.*`;
/// by the whole name (`fusectl` and `nfsd` are local: a fifty-third fresh review's F4).
const NETWORK: [&str; 9] = [
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "ceph", "9p", "fuse", "fuseblk",
];

/// What the node at `root` of the device filesystem (whose device is `devtmpfs`) is, looked up
/// by its name in the agent's own /dev: `Missing` when the name cannot be trusted to name it (a
/// node deleted since: `//deleted` ends its name; one the lookup reaches only through a mount
/// laid on the agent's /dev, such as its devpts or shm: a forty-sixth fresh review's F1 and F2).
pub(super) fn devtmpfs_node(dev_dir: &File, root: &Path, devtmpfs: DevNum) -> Node {
    use rustix::fs::{AtFlags as Flags, StatxFlags, statx};
    if root.as_os_str().as_bytes().ends_with(b"//deleted") {
        return Node::Missing;
    }
    let mask = StatxFlags::TYPE | StatxFlags::MNT_ID;
    let flags = Flags::SYMLINK_NOFOLLOW | Flags::STATX_DONT_SYNC;
    let name = root.strip_prefix("/").unwrap_or(root);
    // The name must reach the node in /dev's own mount: a mount on the agent's /dev (its devpts,
    // or a mask such as `mount --bind /dev/null /dev/X`) shows something else by that name (a
    // forty-seventh fresh review's F2).
    // The filesystem's own root ("/": a bind of the whole /dev, which any user may make in a
    // namespace of its own and cover: a fifty-third fresh review's F1) is /dev itself.
    let empty = name.as_os_str().is_empty();
    let at = |name: &Path| {
        let flags = if empty {
            flags | Flags::EMPTY_PATH
        } else {
            flags
        };
        statx(dev_dir, name, flags, mask)
    };
    let (Ok(dev), Ok(st)) = (
        statx(dev_dir, "", flags | Flags::EMPTY_PATH, mask),
        at(name),
    ) else {
        return Node::Missing;
    };
    let has_ids = |m: u32| StatxFlags::from_bits_retain(m).contains(StatxFlags::MNT_ID);
    if !has_ids(dev.stx_mask)
        || !has_ids(st.stx_mask)
        || st.stx_mnt_id != dev.stx_mnt_id
        || DevNum::new(st.stx_dev_major, st.stx_dev_minor) != devtmpfs
    {
        return Node::Missing;
    }
    if u32::from(st.stx_mode) & libc::S_IFMT == libc::S_IFBLK {
        Node::Block(DevNum::new(st.stx_rdev_major, st.stx_rdev_minor))
    } else {
        Node::Other
    }
}

/// The error of a bind whose device cannot be told.
pub(super) fn untold(at: &str) -> io::Error {
    io::Error::other(format!(
        "the node {at} cannot be told (its mount point leads elsewhere, and no name of it in \
         /dev is sure): every device counts as used until it goes"
    ))
}

pub(super) fn note_bind(found: &mut Found, devnum: DevNum, at: &str) {
    found.bound.entry(devnum).or_insert_with(|| at.to_string());
    found.any.entry(devnum).or_insert_with(|| at.to_string());
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
