//! Whether a loop device's backing inode names one file. LOOP_GET_STATUS64 reports the backing
//! file as the (device, inode) pair of the filesystem the device was laid through. On most
//! filesystems that pair is the file. A stacking or remote filesystem (overlayfs, FUSE, NFS,
//! 9p, ...) shows another filesystem's files under a device number of its own: a loop device
//! laid over a volume's file seen through one reports a pair that matches no volume. So only
//! the filesystems listed here are believed; anything else cannot be told apart from any file of
//! the agent's. The filesystem is asked of the backing file itself (opened by sysfs's name and
//! kept only if it is the very inode the device reports, then `fstatfs`), since a btrfs
//! subvolume's files carry a device number the mount table never shows; the mount table is the
//! fallback for a name that no longer leads to the file.

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

/// The filesystem of the loop device `loop_dev`'s backing file, whose pair is (`st_dev`,
/// `st_ino`).
pub fn backing_fs_of_loop(
    loop_dev: DevNum,
    st_dev: u64,
    st_ino: u64,
) -> std::io::Result<BackingFs> {
    if let Some(path) = super::query::backing_file_by_devnum(loop_dev)
        && let Some(kind) = fs_of_inode(&path, st_dev, st_ino)
    {
        return Ok(kind);
    }
    backing_fs(st_dev)
}

/// The filesystem at `path` (a directory the operator named, such as the state directory).
pub fn fs_of_path(path: &std::path::Path) -> std::io::Result<BackingFs> {
    let st = rustix::fs::statfs(path)?;
    Ok(by_magic(u64::try_from(st.f_type).unwrap_or(0)))
}

/// The filesystem of the file at `path`, if it is the inode (`st_dev`, `st_ino`): asked through
/// one descriptor, so a name swapped meanwhile answers nothing.
fn fs_of_inode(path: &std::path::Path, st_dev: u64, st_ino: u64) -> Option<BackingFs> {
    let fd = proven(path, st_dev, st_ino)?;
    let fs = rustix::fs::fstatfs(&fd).ok()?;
    Some(by_magic(u64::try_from(fs.f_type).unwrap_or(0)))
}

/// The file at `path` held (O_PATH), if it is the inode (`st_dev`, `st_ino`).
fn proven(path: &std::path::Path, st_dev: u64, st_ino: u64) -> Option<rustix::fd::OwnedFd> {
    use rustix::fs::{Mode, OFlags};
    let fd = rustix::fs::open(
        path,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .ok()?;
    let st = rustix::fs::fstat(&fd).ok()?;
    ((st.st_dev, st.st_ino) == (st_dev, st_ino)).then_some(fd)
}

/// The block devices under the filesystem that holds loop device `loop_dev`'s backing file, when
/// that filesystem has no device number of its own (btrfs, bcachefs, ZFS report an anonymous
/// one): the source of the mount the file is reached through (statx's mount id, looked up in the
/// mount table), and for btrfs every device of that filesystem (`/sys/fs/btrfs/*/devices`). A
/// memory filesystem (tmpfs, ramfs) has none. `Err(why)`: they cannot be told.
pub fn devices_under(loop_dev: DevNum, st_dev: u64, st_ino: u64) -> Result<Vec<DevNum>, String> {
    use rustix::fs::{AtFlags, StatxFlags};
    let path = super::query::backing_file_by_devnum(loop_dev)
        .ok_or_else(|| "its backing file's name cannot be read".to_string())?;
    let fd = proven(&path, st_dev, st_ino)
        .ok_or_else(|| format!("{} is no longer its backing file", path.display()))?;
    let magic = rustix::fs::fstatfs(&fd)
        .map(|f| u64::try_from(f.f_type).unwrap_or(0))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if MEMORY.contains(&magic) {
        return Ok(Vec::new());
    }
    let st = rustix::fs::statx(&fd, "", AtFlags::EMPTY_PATH, StatxFlags::MNT_ID)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let table = MountTable::read().map_err(|e| e.to_string())?;
    let source = table
        .entries()
        .iter()
        .find(|m| u64::from(m.mount_id) == st.stx_mnt_id)
        .map(|m| m.source.clone())
        .ok_or_else(|| format!("the mount of {} is not in the mount table", path.display()))?;
    let device = crate::device::block_devnum(std::path::Path::new(&source))
        .map_err(|e| format!("its filesystem's device {source}: {e}"))?;
    let mut out = vec![device];
    if magic == BTRFS {
        out.extend(btrfs_siblings(device));
    }
    Ok(out)
}

/// The other devices of the btrfs filesystem that `device` belongs to.
fn btrfs_siblings(device: DevNum) -> Vec<DevNum> {
    let dev_of = |p: std::path::PathBuf| {
        std::fs::read_to_string(p.join("dev"))
            .ok()
            .and_then(|t| DevNum::parse(&t))
    };
    let Ok(filesystems) = std::fs::read_dir("/sys/fs/btrfs") else {
        return Vec::new();
    };
    for fs in filesystems.flatten() {
        let Ok(devices) = std::fs::read_dir(fs.path().join("devices")) else {
            continue;
        };
        let all: Vec<DevNum> = devices.flatten().filter_map(|d| dev_of(d.path())).collect();
        if all.contains(&device) {
            return all.into_iter().filter(|d| *d != device).collect();
        }
    }
    Vec::new()
}

const BTRFS: u64 = 0x9123_683E;
/// tmpfs (and devtmpfs), ramfs: memory, no device under them.
const MEMORY: &[u64] = &[0x0102_1994, 0x8584_58F6];

/// Filesystems by their magic number (`statfs`'s `f_type`): whether they show only their own
/// inodes, and a name for the ones that may not.
fn by_magic(magic: u64) -> BackingFs {
    const OWN: &[u64] = &[
        0xEF53,      // ext2, ext3, ext4
        0x5846_5342, // xfs
        0x9123_683E, // btrfs
        0x0102_1994, // tmpfs, devtmpfs
        0x8584_58F6, // ramfs
        0xF2F5_2010, // f2fs
        0x3153_464A, // jfs
        0x5265_4973, // reiserfs
        0x4D44,      // vfat, msdos
        0x2011_BAB0, // exfat
        0x7366_746E, // ntfs3
        0x482B,      // hfsplus
        0x3434,      // nilfs2
        0xCA45_1A4E, // bcachefs
        0x2FC1_2FC1, // zfs
        0x1501_3346, // udf
        0x9660,      // iso9660
        0x7371_7368, // squashfs
        0xE0F5_E1E2, // erofs
    ];
    const NAMED: &[(u64, &str)] = &[
        (0x794C_7630, "overlay"),
        (0x6573_5546, "fuse"),
        (0x6969, "nfs"),
        (0xFF53_4D42, "cifs"),
        (0xFE53_4D42, "smb2"),
        (0x0102_1997, "9p"),
        (0x6E73_6673, "nsfs"),
        (0xF15F, "ecryptfs"),
        (0x00C3_6400, "ceph"),
    ];
    if OWN.contains(&magic) {
        return BackingFs::OwnsItsInodes;
    }
    let name = NAMED.iter().find(|(m, _)| *m == magic).map_or_else(
        || format!("a filesystem of type {magic:#x}"),
        |(_, n)| (*n).to_string(),
    );
    BackingFs::MayShowAnothers(name)
}

/// Whether a filesystem of this type shows only its own inodes.
pub(super) fn owns_its_inodes(fs_type: &str) -> bool {
    OWN_THEIR_INODES.contains(&fs_type)
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
    fn filesystems_are_told_by_their_magic() {
        assert_eq!(by_magic(0xEF53), BackingFs::OwnsItsInodes);
        assert_eq!(by_magic(0x9123_683E), BackingFs::OwnsItsInodes);
        assert_eq!(
            by_magic(0x794C_7630),
            BackingFs::MayShowAnothers("overlay".into())
        );
        assert_eq!(
            by_magic(0x1234),
            BackingFs::MayShowAnothers("a filesystem of type 0x1234".into())
        );
        assert_eq!(
            fs_of_path(std::path::Path::new("/")).ok(),
            Some(BackingFs::OwnsItsInodes)
        );
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
