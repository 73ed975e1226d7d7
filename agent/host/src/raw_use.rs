//! Raw use of a block device, as the host shows it: its device node (or a node of a device of
//! its disk's family, or of another loop device over the same file) bound onto a file in any
//! mount namespace, or a holder (device-mapper, RAID). The kernel's
//! exclusive claim shows none of these, so a device used only raw looks free to O_EXCL: the
//! core's first take of a device asks here (`HostOps::raw_use`), for every door.

use ebs_node_core::DevNum;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use crate::device::devnum_of;
use crate::mount::table::MountEntry;

/// What uses `device` (numbers `devnum`) raw, or its disk's family, or another loop device over
/// the same file; `Err` when the host cannot be read (a caller refuses then).
pub fn raw_use(device: &Path, devnum: DevNum) -> std::io::Result<Option<String>> {
    let (_, mut family) = disk_family(devnum);
    family.extend(crate::loopdev::stacking::siblings(devnum)?);
    let table = crate::mount::at_path::read_table()?;
    Ok(shown(device, &family, table.entries()))
}

/// What uses the device (or its disk's family) raw, as the host shows it: a bind of its device
/// node (a devtmpfs mount whose root is the node's name; or any bound node of it, in any mount
/// namespace), a holder.
pub fn shown(node: &Path, family: &[DevNum], mounts: &[MountEntry]) -> Option<String> {
    let names: Vec<PathBuf> = family
        .iter()
        .filter_map(|d| kernel_name(*d))
        .chain(node.file_name().map(|n| n.to_string_lossy().into_owned()))
        .map(|n| Path::new("/").join(n))
        .collect();
    if let Some(m) = mounts
        .iter()
        .find(|m| m.fs_type == "devtmpfs" && names.contains(&m.root))
    {
        return Some(format!(
            "(a bind of its device node at {})",
            m.mount_point.display()
        ));
    }
    // A node made elsewhere (mknod in a container's /dev, a tmpfs) and bound: only the bound
    // file itself tells its device numbers. A device-node bind is never of a filesystem's root,
    // and network filesystems are left out (a stat there may hang; this call alone would).
    let network = |t: &str| {
        ["nfs", "cifs", "smb", "fuse", "ceph", "9p"]
            .iter()
            .any(|n| t.starts_with(n))
    };
    if let Some(m) = mounts.iter().find(|m| {
        m.root != Path::new("/")
            && m.fs_type != "devtmpfs"
            && !network(&m.fs_type)
            && std::fs::symlink_metadata(&m.mount_point).is_ok_and(|meta| {
                meta.file_type().is_block_device() && family.contains(&devnum_of(meta.rdev()))
            })
    }) {
        return Some(format!(
            "(a bind of a node of it at {})",
            m.mount_point.display()
        ));
    }
    // A bind of a node of it that only another mount namespace shows (a container's copy of
    // a raw block volume, another driver's): every namespace's table, by the bound node's
    // numbers. Unreadable tables within the bound time count as a use.
    let uses = crate::device_binds::Uses::scan(crate::device_binds::WITHIN);
    if let Some(why) = uses.failed() {
        return Some(format!("as far as the host shows: {why}"));
    }
    if let Some(at) = family.iter().find_map(|d| uses.bound(*d)) {
        return Some(format!("(its device node is {at})"));
    }
    // A loop device laid over it is a view of its bytes (`loopdev::views`): refused while used,
    // held while the call runs otherwise; not raw use in itself.
    for d in family {
        let holders = PathBuf::from(format!("/sys/dev/block/{d}/holders"));
        if let Some(h) = std::fs::read_dir(holders)
            .ok()
            .and_then(|mut it| it.next())
            .and_then(|e| e.ok())
        {
            return Some(format!("(held by {})", h.file_name().to_string_lossy()));
        }
    }
    None
}

/// The kernel's name of a block device (`loop2`, `nvme1n1p1`), from sysfs.
pub fn kernel_name(devnum: DevNum) -> Option<String> {
    let dir = std::fs::canonicalize(format!("/sys/dev/block/{devnum}")).ok()?;
    Some(dir.file_name()?.to_string_lossy().into_owned())
}

/// The whole disk a device belongs to (itself unless it is a partition), and the numbers of the
/// disk and all its partitions, from sysfs. A device sysfs does not describe is its own family.
pub fn disk_family(devnum: DevNum) -> (DevNum, Vec<DevNum>) {
    let sys = PathBuf::from(format!("/sys/dev/block/{}", devnum));
    let Ok(dir) = std::fs::canonicalize(&sys) else {
        return (devnum, vec![devnum]);
    };
    let whole_dir = if dir.join("partition").exists() {
        dir.parent().map(Path::to_path_buf).unwrap_or(dir)
    } else {
        dir
    };
    let whole = read_dev(&whole_dir).unwrap_or(devnum);
    let mut family = vec![whole, devnum];
    family.extend(partitions_in(&whole_dir));
    (whole, family)
}

/// The partitions of the whole disk whose sysfs directory is `whole_dir`. The kernel names a
/// partition after its disk (`sda1`, `nvme0n1p1`, `loop0p1`), so only the entries named so are
/// asked whether they are one: a loop device's directory has twenty others, and each was
/// stat'ed on every stage.
pub fn partitions_in(whole_dir: &Path) -> Vec<DevNum> {
    let Some(disk) = whole_dir.file_name() else {
        return Vec::new();
    };
    let disk = disk.as_encoded_bytes();
    std::fs::read_dir(whole_dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| {
            let name = e.file_name();
            name.as_encoded_bytes().starts_with(disk) && name.as_encoded_bytes() != disk
        })
        .filter(|e| e.path().join("partition").exists())
        .filter_map(|e| read_dev(&e.path()))
        .collect()
}

/// A sysfs block directory's `dev` attribute (`maj:min`).
pub fn read_dev(dir: &Path) -> Option<DevNum> {
    DevNum::parse(&std::fs::read_to_string(dir.join("dev")).ok()?)
}
