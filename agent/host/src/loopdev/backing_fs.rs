//! Whether a loop device's backing inode names one file. LOOP_GET_STATUS64 reports the backing
//! file as the (device, inode) pair of the filesystem the device was laid through. On most
//! filesystems that pair is the file. A stacking or remote filesystem (overlayfs, FUSE, NFS,
//! 9p, ...) shows another filesystem's files under a device number of its own: a loop device
//! laid over a volume's file seen through one reports a pair that matches no volume. So only
//! the filesystems listed here are believed; anything else, and a device number the mount
//! table does not show, cannot be told apart from any file of the agent's.

use ebs_node_core::DevNum;

use crate::mount::table::MountTable;

/// Local filesystems that show only their own inodes.
const OWN_THEIR_INODES: &[&str] = &[
    "ext2", "ext3", "ext4", "xfs", "btrfs", "tmpfs", "devtmpfs", "ramfs", "f2fs", "jfs",
    "reiserfs", "vfat", "msdos", "exfat", "ntfs3", "hfsplus", "nilfs2", "bcachefs", "zfs", "udf",
    "iso9660", "squashfs", "erofs",
];

/// What the filesystem holding a loop device's backing file is.
#[derive(Debug, PartialEq, Eq)]
pub enum BackingFs {
    /// One of the filesystems that show only their own inodes.
    OwnsItsInodes,
    /// Mounted here as this type, which may show another filesystem's files.
    MayShowAnothers(String),
    /// No mount in this process's table has this device number.
    NotMountedHere(DevNum),
}

/// The filesystem whose device number is `st_dev` (LOOP_GET_STATUS64's `lo_device`, encoded as
/// `st_dev` is), as this process's mount table shows it.
pub fn backing_fs(st_dev: u64) -> std::io::Result<BackingFs> {
    // Numbers wider than the kernel's 32 bits name no mount: refused as not shown here.
    fs_kind(DevNum::new(
        u32::try_from(nix::sys::stat::major(st_dev)).unwrap_or(u32::MAX),
        u32::try_from(nix::sys::stat::minor(st_dev)).unwrap_or(u32::MAX),
    ))
}

/// The same by the filesystem's numbers.
pub fn fs_kind(dev: DevNum) -> std::io::Result<BackingFs> {
    let table = MountTable::read().map_err(std::io::Error::other)?;
    Ok(classify(
        dev,
        table
            .mounts_of_device(dev.major, dev.minor)
            .next()
            .map(|m| m.fs_type.as_str()),
    ))
}

fn classify(dev: DevNum, fs_type: Option<&str>) -> BackingFs {
    match fs_type {
        None => BackingFs::NotMountedHere(dev),
        Some(t) if OWN_THEIR_INODES.contains(&t) => BackingFs::OwnsItsInodes,
        Some(t) => BackingFs::MayShowAnothers(t.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_listed_local_filesystems_are_believed() {
        let d = DevNum::new(0, 39);
        assert_eq!(classify(d, Some("ext4")), BackingFs::OwnsItsInodes);
        assert_eq!(classify(d, Some("tmpfs")), BackingFs::OwnsItsInodes);
        for t in [
            "overlay",
            "fuse.bindfs",
            "fuseblk",
            "nfs4",
            "9p",
            "virtiofs",
            "ecryptfs",
        ] {
            assert_eq!(classify(d, Some(t)), BackingFs::MayShowAnothers(t.into()));
        }
        assert_eq!(classify(d, None), BackingFs::NotMountedHere(d));
    }

    #[test]
    fn the_root_filesystem_is_found_by_its_number() {
        use std::os::unix::fs::MetadataExt;
        let dev = std::fs::metadata("/").expect("stat /").dev();
        assert!(matches!(
            backing_fs(dev).expect("mount table"),
            BackingFs::OwnsItsInodes | BackingFs::MayShowAnothers(_)
        ));
    }
}
