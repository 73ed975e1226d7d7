//! A mounted filesystem's usage (statvfs, in bytes and inodes) and syncfs: what
//! NodeGetVolumeStats, ReclaimSpace and the loop controller's capacity read. Products saturate
//! instead of wrapping: a filesystem (a FUSE one, say) may report any numbers.

use std::io;
use std::os::fd::AsFd;
use std::path::Path;

use nix::sys::statvfs::{Statvfs, fstatvfs, statvfs};

use ebs_node_core::seam::FsUsage;

fn from_statvfs(st: Statvfs) -> FsUsage {
    let frsize: u64 = st.fragment_size();
    let blocks: u64 = st.blocks();
    let files: u64 = st.files();
    FsUsage {
        total_bytes: blocks.saturating_mul(frsize),
        available_bytes: st.blocks_available().saturating_mul(frsize),
        used_bytes: blocks
            .saturating_sub(st.blocks_free())
            .saturating_mul(frsize),
        total_inodes: files,
        available_inodes: st.files_available(),
        used_inodes: files.saturating_sub(st.files_free()),
    }
}

/// The usage of the filesystem `path` is on.
pub fn usage(path: &Path) -> io::Result<FsUsage> {
    Ok(from_statvfs(statvfs(path)?))
}

/// The usage of the filesystem the open `fd` is on (a held mount root: the answer is about it).
pub fn usage_of(fd: impl AsFd) -> io::Result<FsUsage> {
    Ok(from_statvfs(fstatvfs(fd)?))
}

/// Writes the filesystem the open `fd` is on back to its device (syncfs).
pub fn sync(fd: impl AsFd) -> io::Result<()> {
    Ok(nix::unistd::syncfs(fd)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_root_filesystems_usage_adds_up() {
        let u = usage(Path::new("/")).expect("statvfs /");
        assert!(u.total_bytes > 0);
        assert!(u.used_bytes <= u.total_bytes);
        assert!(u.available_bytes <= u.total_bytes);
        let dir = std::fs::File::open("/").expect("open /");
        assert_eq!(usage_of(&dir).expect("fstatvfs").total_bytes, u.total_bytes);
        sync(&dir).expect("syncfs");
    }
}
