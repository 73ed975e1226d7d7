//! A backing inode pair is believed only where it names one file (the host crate's
//! `loopdev::backing_fs`): on the volume files' own filesystem, or on one that shows only its own
//! inodes. A loop device laid through overlayfs, FUSE or NFS over a volume's file reports a pair
//! that matches no volume (a thirteenth fresh review's high): whose bytes it holds cannot be told.

use ebs_node_host::loopdev::{BackingFs, backing_fs};

/// `Err(why)` when the backing file's pair, on the filesystem numbered `st_dev`, may be another
/// filesystem's file under a name of its own; `own_dev`: the volume files' filesystem.
pub fn believable(st_dev: u64, own_dev: Option<u64>) -> Result<(), String> {
    if own_dev == Some(st_dev) {
        return Ok(());
    }
    let on = |what: String| {
        format!(
            "its backing file lies on {what}, which may show another filesystem's file (a \
             volume's included) under a name of its own: whose bytes it holds cannot be told"
        )
    };
    match backing_fs(st_dev) {
        Ok(BackingFs::OwnsItsInodes) => Ok(()),
        Ok(BackingFs::MayShowAnothers(t)) => Err(on(t)),
        Ok(BackingFs::NotMountedHere(dev)) => Err(on(format!(
            "a filesystem (device {dev}) this mount namespace does not show"
        ))),
        Err(e) => Err(on(format!("a filesystem the mount table cannot say ({e})"))),
    }
}
