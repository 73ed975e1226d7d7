//! The mounts of a namespace that its table, read from inside, leaves out: a thread that enters
//! a namespace takes the top of the mounts stacked on its root as its own root, so where a mount
//! is laid over the namespace's root (`mount -t tmpfs x /` inside it), everything below the
//! cover is missing from `/proc/thread-self/mountinfo`, binds of device nodes included, while a
//! process already in it reaches them by its old root or its working directory (a forty-fourth
//! fresh review's F3: a stage took a device bound there).
//!
//! The cover is told from the mounts' own links, not from counts (mounts made and unmounted
//! while the table was read moved a count past the table's length: a forty-fifth fresh
//! review's F1): the thread's root mount is the namespace's root only if it is its own parent.
//! Otherwise the namespace's root is found by going up the parents, and the mounts below it that
//! are not below the thread's root are asked one by one (listmount and statmount by the
//! namespace's id, Linux 6.11, and `NS_MNT_GET_INFO` for the id, 6.12). The root's own mounts
//! count too (a bind moved onto the namespace's first root, below a cover laid on it: the
//! review's F2). Before those, or under a filter that denies them, the covered tree stays unseen
//! (docs/design.md, "Known and not yet refused").

use std::collections::HashSet;
use std::fs::File;
use std::os::fd::BorrowedFd;
use std::path::Path;

use super::Found;
use super::record::{Node, devtmpfs_node, note_bind, untold};
use crate::mount::foreign::{self, Mount};
use crate::nsfs;

/// How far up a stack of mounts on a root is followed.
const MAX_STACK: usize = 64;

/// Notes the mounts of the namespace `ns` that a thread inside it, whose root is the mount `top`
/// (its unique id; `None` before Linux 6.8), could not see.
pub(super) fn read(
    found: &mut Found,
    ns: BorrowedFd<'_>,
    top: Option<u64>,
    at: &str,
) -> std::io::Result<()> {
    let Some(top) = top else {
        return Ok(());
    };
    let Some((ns_id, _)) = nsfs::mount_namespace_info(ns)? else {
        return Ok(());
    };
    let Some(hidden) = hidden(top, ns_id)? else {
        return Ok(());
    };
    let dev_dir = File::open("/dev")?;
    let place = format!("mount namespace {at}, below a mount over its root");
    for m in hidden {
        tell_hidden(
            found,
            &dev_dir,
            &m,
            &place,
            crate::nsfs::owned_by_host_users(ns),
        )?;
    }
    Ok(())
}

/// Notes a mount no path of its namespace reaches (`place` says why): its device, and the node
/// it binds, told by its name in the device filesystem; any other bind cannot be told (there is
/// no path to look through), and fails the scan where only the host's root makes mounts
/// (`host_owned`). In a namespace a user namespace owns, it is passed over: there any user can
/// bind a file and rename it away (a fifty-first fresh review's F3 refused every stage on the
/// node that way), and only a node root made and bound there could be a device's (docs/
/// design.md, "Known and not yet refused").
pub(super) fn tell_hidden(
    found: &mut Found,
    dev_dir: &File,
    m: &Mount,
    place: &str,
    host_owned: bool,
) -> std::io::Result<()> {
    found
        .any
        .entry(m.dev)
        .or_insert_with(|| format!("mounted ({place})"));
    // A root too long to be asked is no filesystem's "/": a bind. A node opened by its handle
    // with no name in the dentry cache reads "/" too, and with no path to it cannot be told
    // from a whole filesystem here (docs/design.md, "Known and not yet refused").
    let root = m.root.as_deref().unwrap_or(Path::new("//"));
    if root == Path::new("/") {
        return Ok(());
    }
    let at = format!("bound at {} ({place})", root.display());
    if m.fs_type != "devtmpfs" {
        return if host_owned { Err(untold(&at)) } else { Ok(()) };
    }
    match devtmpfs_node(dev_dir, root, m.dev) {
        Node::Block(devnum) => note_bind(found, devnum, &at),
        Node::Other => {}
        Node::Missing => return Err(untold(&at)),
    }
    Ok(())
}

/// The mounts of the namespace `ns_id` not below the mount `top`, nor `top` itself: none when
/// `top` is the namespace's root. `Ok(None)`: not available here.
fn hidden(top: u64, ns_id: u64) -> std::io::Result<Option<Vec<Mount>>> {
    let Some(mut root) = foreign::mount_of(top, ns_id)? else {
        return Ok(None);
    };
    if root.parent == root.id {
        return Ok(Some(Vec::new()));
    }
    for _ in 0..MAX_STACK {
        if root.parent == root.id {
            break;
        }
        root = match foreign::mount_of(root.parent, ns_id)? {
            Some(m) => m,
            None => return Ok(None),
        };
    }
    if root.parent != root.id {
        return Err(std::io::Error::other(format!(
            "more than {MAX_STACK} mounts stacked on its root"
        )));
    }
    let (Some(all), Some(seen)) = (
        foreign::ids_below(root.id, ns_id)?,
        foreign::ids_below(top, ns_id)?,
    ) else {
        return Ok(None);
    };
    let seen: HashSet<u64> = seen.into_iter().chain([top]).collect();
    let mut hidden = vec![root];
    for id in all.into_iter().filter(|id| !seen.contains(id)) {
        match foreign::mount_of(id, ns_id) {
            Ok(Some(m)) => hidden.push(m),
            Ok(None) => return Ok(None),
            // Unmounted since it was listed: it binds nothing now.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(Some(hidden))
}
