//! What is mounted at one staging or target path, asked of the kernel about that path alone:
//! statx says whether the entry is a mount root and which mount (its unique id, 6.8+), and
//! statmount(2) gives that mount's device, root and flags. No call on the normal path reads
//! /proc/self/mountinfo, whose size grows with every pod on the node.
//!
//! Which kernel gets which path:
//! - 6.8 and later: statx(STATX_MNT_ID_UNIQUE) + statmount; the mount table is never read.
//! - 5.8 to 6.7: statx rules a mount out (STATX_ATTR_MOUNT_ROOT); when the entry is a mount
//!   root, its line is found in the mount table by the mount id statx gave.
//! - before 5.8: the mount table, by mount point.

use ebs_node_core::DevNum;
use std::io;

use std::sync::atomic::{AtomicU64, Ordering};

use super::statmount::statmount;
use super::table::{MountEntry, MountTable};
use crate::anchor::{Anchored, EntryFd};
use ebs_node_core::seam::EntryStat;

/// How often this process read the whole mount table (a metric, and a test's witness that the
/// per-path calls do not).
static TABLE_READS: AtomicU64 = AtomicU64::new(0);

pub fn mount_table_reads() -> u64 {
    TABLE_READS.load(Ordering::Relaxed)
}

/// Reads the whole mount table: start-up recovery, the loop controller's detach check, and the
/// fallback for kernels without the per-mount calls.
pub fn read_table() -> io::Result<MountTable> {
    TABLE_READS.fetch_add(1, Ordering::Relaxed);
    MountTable::read().map_err(|e| io::Error::other(e.to_string()))
}

use ebs_node_core::seam::MountFacts;

/// The top-most mount at `entry`, if the entry is a mount root.
pub fn mounted_at(entry: &Anchored) -> io::Result<Option<MountFacts>> {
    match entry.stat()? {
        Some(node) => facts(node, entry.path(), || {
            Ok(entry.stat()?.and_then(|st| st.mnt_id))
        }),
        None => Ok(None),
    }
}

/// The mount whose root an opened entry is (the fd pins it: what is checked is what is used).
pub fn mount_of(fd: &EntryFd, path: &std::path::Path) -> io::Result<Option<MountFacts>> {
    facts(fd.stat()?, path, || Ok(fd.stat()?.mnt_id))
}

/// The mount's facts: by its unique id from statmount, or its line in the table found by the
/// mount id statx gave, never by the path's name (a directory renamed above the entry, as a
/// symlink swap does, changes the name the table shows, not the mount: looked up by name, the
/// volume's own publication read as "nothing mounted" and the retry stacked another on it).
/// `mnt_id_now` asks the entry's mount id again after the table was read: an old-style id is
/// reused once its mount is gone, so the line found is the entry's only if the id still is.
fn facts(
    node: EntryStat,
    path: &std::path::Path,
    mnt_id_now: impl Fn() -> io::Result<Option<u64>>,
) -> io::Result<Option<MountFacts>> {
    if node.mount_root == Some(false) {
        return Ok(None);
    }
    if let (Some(id), true) = (node.mnt_id, node.mnt_id_unique)
        && let Some(m) = statmount(id)?
    {
        let emergency = m.options.as_deref().is_some_and(emergency_ro);
        return Ok(Some(MountFacts {
            dev: m.dev,
            fs_type: m.fs_type,
            root: m.root,
            read_only: m.read_only,
            vfs_bits: m.vfs_bits,
            idmapped: m.idmapped,
            super_read_only: m.super_read_only || emergency,
            node,
        }));
    }
    let table = read_table()?;
    let line = match node.mnt_id {
        Some(id) if !node.mnt_id_unique => {
            let line = table.entries().iter().find(|e| u64::from(e.mount_id) == id);
            if line.is_some() && mnt_id_now()? != Some(id) {
                return Err(io::Error::other(format!(
                    "the mount at {} changed while it was examined",
                    path.display()
                )));
            }
            line
        }
        // Before Linux 5.8 statx knows no mount ids: the table by mount point.
        _ => table.at(path),
    };
    if line.is_none() && node.mount_root == Some(true) {
        // A mount root whose mount the table does not show is no "nothing mounted": acting
        // on it could stack a mount on one already there.
        return Err(io::Error::other(format!(
            "{} is a mount point, but its mount is not in this process's mount table",
            path.display()
        )));
    }
    Ok(line.map(|e| facts_of(e, node)))
}

fn facts_of(e: &MountEntry, node: EntryStat) -> MountFacts {
    MountFacts {
        dev: DevNum::new(e.major, e.minor),
        fs_type: e.fs_type.clone(),
        root: e.root.clone(),
        read_only: e.is_read_only(),
        vfs_bits: e.vfs_bits(),
        idmapped: e.idmapped(),
        super_read_only: e.super_read_only() || emergency_ro(&e.super_options),
        node,
    }
}

/// ext4 since Linux 6.x keeps its superblock "rw" after an error under errors=remount-ro and
/// adds "emergency_ro" instead; older kernels set the superblock read-only.
fn emergency_ro(options: &str) -> bool {
    options.split(',').any(|o| o == "emergency_ro")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loopdev::test_support::TempDir;

    #[test]
    fn a_plain_directory_is_no_mount_and_costs_no_table_read() {
        let dir = TempDir::new("mounts-plain");
        let entry = Anchored::prepare(&dir.0, &dir.0.join("x")).unwrap();
        entry.mkdir().unwrap();
        let before = mount_table_reads();
        assert_eq!(mounted_at(&entry).unwrap(), None);
        assert_eq!(mount_table_reads(), before);
    }

    #[test]
    fn a_tmpfs_mount_is_seen_with_its_facts() {
        if !crate::loopdev::test_support::root_or_skip("a_tmpfs_mount_is_seen_with_its_facts") {
            return;
        }
        let dir = TempDir::new("mounts-tmpfs");
        let entry = Anchored::prepare(&dir.0, &dir.0.join("m")).unwrap();
        entry.mkdir().unwrap();
        rustix::mount::mount(
            "facts",
            dir.0.join("m"),
            "tmpfs",
            rustix::mount::MountFlags::RDONLY,
            None,
        )
        .unwrap();
        let facts = mounted_at(&entry);
        let _ = rustix::mount::unmount(dir.0.join("m"), rustix::mount::UnmountFlags::DETACH);
        let facts = facts.unwrap().expect("a mount");
        assert_eq!(facts.fs_type, "tmpfs");
        assert_eq!(facts.root, std::path::PathBuf::from("/"));
        assert!(facts.read_only);
    }
}
