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
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use super::Found;
use super::mount_point::{AtMountPoint, is_whole, told_at_mount_point};
use super::unveil::Covered;
use crate::mount::table::{MountEntry, MountTable};
use crate::nsfs::open_ns_file;
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
    (proc_dir, dev_dir): (&File, &File),
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
            // A pin its mount point does not lead to (a mount laid over it with anything at its
            // name: nothing, a file where a directory was, a link loop; a path past PATH_MAX;
            // unmounted since) is hidden: the kernel's list has its namespace, and without the
            // list the scan fails (`Found::hidden_pins`; a fifty-fifth fresh review's F1: any
            // user refused every stage with a file laid where its directory was). A pin the
            // agent cannot open for want of its own resources fails the scan, which would
            // pass over its namespace.
            let pin = open_ns_file(proc_dir.as_fd(), &m.mount_point, false, Some(m.mount_id));
            match pin {
                Ok(Some(f)) => {
                    let at = format!("pinned at {}", place(&m.mount_point));
                    out.pins.push((f, at));
                }
                Err(e) if out_of_resources(&e) => {
                    out.failed = Some(format!("{}: {e}", place(&m.mount_point)))
                }
                Ok(None) => found.hidden_pins.push(format!(
                    "{}: its place leads to something else (a mount laid over it?)",
                    place(&m.mount_point)
                )),
                Err(e) => found
                    .hidden_pins
                    .push(format!("{}: {e}", place(&m.mount_point))),
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

/// The agent's own files or memory ran out: nothing said about the place.
fn out_of_resources(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOMEM)
    )
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
