//! A backing inode pair is believed only where it names one file (the host crate's
//! `loopdev::backing_fs`): on the volume files' own filesystem, or on one that shows only its own
//! inodes. A loop device laid through overlayfs, FUSE or NFS over a volume's file reports a pair
//! that matches no volume (a thirteenth fresh review's high): whose bytes it holds cannot be told.

use ebs_node_core::DevNum;
use ebs_node_host::loopdev::{BackingFs, backing_fs_of_loop, fs_of_path};

/// `Err(why)` when the state directory lies on a filesystem that may show another's files (a
/// sixteenth fresh review's F3): every volume file's loop device there would be refused as
/// indistinct at its first stage, so the loop backend refuses to start on it instead.
pub fn check_state_dir(state_dir: &std::path::Path) -> Result<(), StateDirOnStackedFs> {
    match fs_of_path(state_dir) {
        Ok(BackingFs::MayShowAnothers(fs)) => Err(StateDirOnStackedFs {
            dir: state_dir.to_path_buf(),
            fs,
        }),
        _ => Ok(()),
    }
}

/// The loop backend's refusal to start on a state directory whose files cannot be told apart.
#[derive(Debug, thiserror::Error)]
#[error(
    "the state directory {} lies on {fs}, which may show another filesystem's files under names \
     of its own: the loop backend's volume files there cannot be told apart from others; put \
     --state-dir on a local filesystem (ext4, xfs, btrfs, tmpfs)", .dir.display()
)]
pub struct StateDirOnStackedFs {
    pub dir: std::path::PathBuf,
    pub fs: String,
}

/// `Err(why)` when the backing file's pair of the loop device `loop_dev`, (`st_dev`, `st_ino`),
/// may be another filesystem's file under a name of its own; `own_dev`: the volume files'
/// filesystem.
pub fn believable(
    loop_dev: DevNum,
    (st_dev, st_ino): (u64, u64),
    own_dev: Option<u64>,
) -> Result<(), String> {
    if own_dev == Some(st_dev) {
        return Ok(());
    }
    let on = |what: String| {
        format!(
            "its backing file lies on {what}, which may show another filesystem's file (a \
             volume's included) under a name of its own: whose bytes it holds cannot be told"
        )
    };
    match backing_fs_of_loop(loop_dev, st_dev, st_ino) {
        Ok(BackingFs::OwnsItsInodes) => Ok(()),
        Ok(BackingFs::MayShowAnothers(t)) => Err(on(t)),
        Ok(BackingFs::NotMountedHere(dev)) => Err(on(format!(
            "a filesystem (device {dev}) this mount namespace does not show"
        ))),
        Err(e) => Err(on(format!("a filesystem the mount table cannot say ({e})"))),
    }
}
