//! Mounts below the entering thread's root that its table leaves out: the kernel writes a
//! mount into `/proc/*/mountinfo` only if the reader's root reaches its mount point by a path,
//! and a directory renamed through another mount of its filesystem takes the mounts below it
//! out of every path while they stay mounted (a forty-ninth fresh review's F1: a bind at
//! `P/dir/node`, where `P` binds `T/sub`, left every table once `T/sub/dir` was renamed to
//! `T/dir`, and a stage took its device). The kernel's own list of the mounts below the root
//! (listmount, Linux 6.8; the mount's old id by statmount) is taken first, then the table; what
//! the list has and the table lacks is asked by id (`covered::tell_hidden`). Taken in that order,
//! a mount made between the two is in the table (and told there), and one gone between is gone
//! when asked. Before 6.11 (no namespace id in the request) the list is not taken here (docs/
//! design.md, "Known and not yet refused").

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io;

use super::Found;
use super::covered::tell_hidden;
use crate::mount::foreign;
use crate::mount::table::MountTable;

/// The mounts below the thread's root `top` (its unique id), as the kernel lists them; `None`:
/// not available here. Asked before the table is read.
pub(super) fn listed(top: Option<u64>) -> io::Result<Option<Vec<u64>>> {
    match top {
        // 0: the thread's own namespace.
        Some(top) => foreign::ids_below(top, 0),
        None => Ok(None),
    }
}

/// Tells each mount of `listed` that `table` (read after) leaves out; returns the unique ids
/// of the table's mounts, by their old ids.
pub(super) fn read(
    found: &mut Found,
    listed: &[u64],
    table: &MountTable,
    dev_dir: &File,
    at: &str,
    host_owned: bool,
) -> io::Result<HashMap<u32, u64>> {
    let told: HashSet<u32> = table.entries().iter().map(|m| m.mount_id).collect();
    let mut unique = HashMap::new();
    let place = format!("mount namespace {at}, where no path reaches it");
    for &id in listed {
        match foreign::old_id_of(id, 0) {
            Ok(Some(old)) if told.contains(&old) => {
                unique.insert(old, id);
                continue;
            }
            Ok(Some(_)) => {}
            Ok(None) => return Ok(unique),
            // Unmounted since it was listed: it binds nothing now.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
            Err(e) => return Err(e),
        }
        match foreign::mount_of(id, 0) {
            Ok(Some(m)) => tell_hidden(found, dev_dir, &m, &place, host_owned)?,
            Ok(None) => return Ok(unique),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(unique)
}
