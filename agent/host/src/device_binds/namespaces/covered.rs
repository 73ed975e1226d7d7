//! The mounts of a namespace that its table, read from inside, leaves out: a thread that enters
//! a namespace takes the top of the mounts stacked on its root as its own root, so where a mount
//! is laid over the namespace's root (`mount -t tmpfs x /` inside it), everything below the
//! cover is missing from `/proc/thread-self/mountinfo`, binds of device nodes included, while a
//! process already in it reaches them by its old root or its working directory (a forty-fourth
//! fresh review's F3: a stage took a device bound there). The kernel says how many mounts a
//! namespace has (`NS_MNT_GET_INFO`, Linux 6.12); where its table shows fewer, every mount of it
//! is asked by id (listmount and statmount, Linux 6.11). Before those, or under a filter that
//! denies them, the covered tree stays unseen (docs/design.md, "Known and not yet refused").

use std::fs::File;
use std::os::fd::BorrowedFd;
use std::path::Path;

use super::{Found, devtmpfs_node, note_bind};
use crate::mount::statmount;
use crate::nsfs;

/// Notes the mounts of the namespace `ns` that its table of `shown` mounts left out (all of
/// them, when some are missing: the table does not say which). Asked from the agent's own
/// namespace: from inside, listmount too starts at the caller's root, the cover.
pub(super) fn read(
    found: &mut Found,
    ns: BorrowedFd<'_>,
    shown: usize,
    at: &str,
) -> std::io::Result<()> {
    let Some((id, count)) = nsfs::mount_namespace_info(ns)? else {
        return Ok(());
    };
    if usize::try_from(count).is_ok_and(|count| count <= shown) {
        return Ok(());
    }
    let Some(mounts) = statmount::every_mount_of(id)? else {
        return Ok(());
    };
    let dev_dir = File::open("/dev")?;
    for m in mounts {
        let place = format!(
            "{} (mount namespace {at}, below a mount over its root)",
            m.mount_point.display()
        );
        found
            .any
            .entry(m.dev)
            .or_insert_with(|| format!("mounted at {place}"));
        if m.fs_type == "devtmpfs"
            && m.root != Path::new("/")
            && let Some(devnum) = devtmpfs_node(&dev_dir, &m.root)
        {
            note_bind(found, devnum, &format!("bound at {place}"));
        }
    }
    Ok(())
}
