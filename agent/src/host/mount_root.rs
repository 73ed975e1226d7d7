//! Whether anything can be mounted at a path, asked of statx(2) instead of the mount table.
//! Reading /proc/self/mountinfo makes the kernel print every mount of the namespace (hundreds on
//! a node with many pods), and most calls ask about a path where nothing is mounted yet: a
//! staging path before its first stage, a target before its publish.

use std::io;
use std::path::Path;

use rustix::fs::{AtFlags, CWD, StatxAttributes, StatxFlags, statx};

/// What statx says about `path`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MountRoot {
    /// Nothing is mounted at the path: it does not exist, or it is not the root of a mount.
    NotMounted,
    /// The path is the root of a mount (which one, only the mount table says).
    Mounted,
    /// The kernel cannot tell (before 5.8, or the path cannot be examined: a dead NFS or FUSE
    /// mount answers ENOTCONN or ESTALE); read the mount table.
    Unknown,
}

pub fn mount_root(path: &Path) -> MountRoot {
    // Not following a final symlink: the mount table names mount points by their real path, so
    // a symlink is never one of its entries either.
    let flags = AtFlags::SYMLINK_NOFOLLOW | AtFlags::NO_AUTOMOUNT;
    match statx(CWD, path, flags, StatxFlags::empty()) {
        Ok(st) if st.stx_attributes_mask.contains(StatxAttributes::MOUNT_ROOT) => {
            if st.stx_attributes.contains(StatxAttributes::MOUNT_ROOT) {
                MountRoot::Mounted
            } else {
                MountRoot::NotMounted
            }
        }
        Ok(_) => MountRoot::Unknown,
        Err(e) if io::Error::from(e).kind() == io::ErrorKind::NotFound => MountRoot::NotMounted,
        Err(_) => MountRoot::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::loopdev::test_support::TempDir;

    #[test]
    fn a_missing_path_has_nothing_mounted() {
        let dir = TempDir::new("missing");
        assert_eq!(mount_root(&dir.0.join("not-there")), MountRoot::NotMounted);
    }

    #[test]
    fn a_plain_directory_is_not_a_mount_root_but_a_mount_point_is() {
        let dir = TempDir::new("plain");
        // Not "/": in a chroot (a package builder's) the root is a plain directory. The proc
        // mount this process reads its mount table through is a mount point anywhere.
        let table = crate::host::mountinfo::MountTable::read().unwrap();
        let proc_mount = table
            .entries()
            .iter()
            .find(|e| e.fs_type == "proc")
            .map(|e| e.mount_point.clone())
            .unwrap();
        // Kernels before 5.8 cannot say; then both are Unknown and callers read the table.
        match mount_root(&proc_mount) {
            MountRoot::Mounted => assert_eq!(mount_root(&dir.0), MountRoot::NotMounted),
            other => assert_eq!(other, MountRoot::Unknown),
        }
    }
}
