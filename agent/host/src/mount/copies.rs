//! What a mount found at a place carries that a look at its own facts does not show: mounts
//! below it, and the kernel's propagated copies of it (or of what it is a copy of) elsewhere.
//!
//! A mount attached below a shared mount appears again, as a copy, at the corresponding place
//! below every peer and slave of that parent; unmounting any one of them propagates the same
//! way. "Corresponding" is the same dentry of the parent's filesystem (its root plus the path
//! below its mount point), not the same path: a peer made by a bind of a subdirectory shows the
//! copy at a shorter path (a seventy-fourth fresh review's F1 and F2: a publish took the copy of
//! the volume's own staging for a publication, and its unpublish took the staging down).

use std::collections::HashSet;
use std::io;
use std::path::PathBuf;

use super::at_path::read_table;
use super::statmount::statmount;
use super::table::{MountEntry, MountTable};
use crate::anchor::Anchored;

/// The line of the top-most mount at `entry` in `table` (`None`: nothing is mounted there).
fn own_line<'a>(entry: &Anchored, table: &'a MountTable) -> io::Result<Option<&'a MountEntry>> {
    let Some(node) = entry.stat()? else {
        return Ok(None);
    };
    if node.mount_root == Some(false) {
        return Ok(None);
    }
    let old_id = match (node.mnt_id, node.mnt_id_unique) {
        (Some(id), true) => statmount(id)?.map(|m| m.old_id),
        (id, _) => id,
    };
    let own = match old_id {
        Some(id) => table.entries().iter().find(|e| u64::from(e.mount_id) == id),
        None => table.at(entry.path()),
    };
    own.map(Some).ok_or_else(|| {
        io::Error::other(format!(
            "the mount at {} is not in this process's mount table",
            entry.path().display()
        ))
    })
}

/// Whether anything is mounted below the top-most mount at `entry` (on a directory inside it):
/// the kernel's list of the mounts below it (listmount, 6.8), or the mount table's children of
/// its line.
pub fn has_submounts(entry: &Anchored) -> io::Result<bool> {
    if let Some(node) = entry.stat()?
        && node.mount_root != Some(false)
        && let (Some(id), true) = (node.mnt_id, node.mnt_id_unique)
        && let Some(below) = super::foreign::ids_below(id, 0)?
    {
        return Ok(!below.is_empty());
    }
    let table = read_table()?;
    Ok(own_line(entry, &table)?.is_some_and(|own| {
        table
            .entries()
            .iter()
            .any(|e| e.parent_id == own.mount_id && e.mount_id != own.mount_id)
    }))
}

/// The places where the kernel shows the top-most mount at `entry` again through propagation,
/// or the mount it is a copy of.
pub fn corresponding_at(entry: &Anchored) -> io::Result<Vec<PathBuf>> {
    let table = read_table()?;
    Ok(match own_line(entry, &table)? {
        Some(own) => corresponding(&table, own)
            .into_iter()
            .map(|m| m.mount_point.clone())
            .collect(),
        None => Vec::new(),
    })
}

/// The other mounts of `m`'s filesystem and root at the place corresponding to `m`'s below a
/// mount that propagation ties to `m`'s parent.
pub fn corresponding<'a>(table: &'a MountTable, m: &MountEntry) -> Vec<&'a MountEntry> {
    let parent = |e: &MountEntry| table.entries().iter().find(|p| p.mount_id == e.parent_id);
    let Some(here) = parent(m) else {
        return Vec::new();
    };
    let ours = family(table, here);
    if ours.is_empty() {
        return Vec::new();
    }
    let place = |p: &MountEntry, e: &MountEntry| {
        e.mount_point
            .strip_prefix(&p.mount_point)
            .ok()
            .map(|below| p.root.join(below))
    };
    let mine = place(here, m);
    table
        .entries()
        .iter()
        .filter(|o| o.mount_id != m.mount_id)
        .filter(|o| (o.major, o.minor, &o.root) == (m.major, m.minor, &m.root))
        .filter(|o| {
            parent(o).is_some_and(|there| {
                (there.major, there.minor) == (here.major, here.minor)
                    && there.mount_id != here.mount_id
                    && !family(table, there).is_disjoint(&ours)
                    && place(there, o) == mine
            })
        })
        .collect()
}

/// The peer groups `m` propagates with: its own, its master's, and their masters' in turn.
fn family(table: &MountTable, m: &MountEntry) -> HashSet<u32> {
    let mut groups = HashSet::new();
    let mut next: Vec<u32> = m.peer_group.into_iter().chain(m.master).collect();
    while let Some(g) = next.pop() {
        if groups.insert(g)
            && let Some(master) = (table.entries().iter())
                .find(|e| e.peer_group == Some(g))
                .and_then(|e| e.master)
        {
            next.push(master);
        }
    }
    groups
}
