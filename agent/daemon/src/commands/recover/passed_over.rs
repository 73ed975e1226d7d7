//! The mounts `--from-mounts` never takes for a volume's staging or publication, whatever device
//! they show: the agent's own private place below the state directory, a bind of a subdirectory
//! (the agent binds a staging's root), a place outside the allowed prefixes the agent is given,
//! and a copy the kernel propagated from a mount already taken (host `mount/copies.rs`; a
//! seventy-third fresh review's F1: a shared directory's peer showed the staging and every
//! publication a second time, each rebuilt as a publication of a single-writer volume; its
//! repeat publish and its unstage were refused for good, and an unpublish of a copy inside the
//! prefix took the staging down; a seventy-fourth's F2: copies below a peer made of a
//! subdirectory, and two slaves down, were still rebuilt).

use std::path::{Path, PathBuf};

use ebs_node_host::mount::table::{MountEntry, MountTable};

/// What `--from-mounts` is told of the agent it rebuilds for.
pub(super) struct Bounds<'a> {
    pub state_dir: &'a Path,
    /// The agent's allowed prefixes; none given: any place.
    pub prefixes: &'a [PathBuf],
}

/// Why `m` is none of a volume's mounts, or `None`. `taken`: the mounts taken so far.
pub(super) fn passed_over(
    m: &MountEntry,
    block_bind: bool,
    table: &MountTable,
    taken: &[&MountEntry],
    bounds: &Bounds,
) -> Option<String> {
    if m.mount_point.starts_with(bounds.state_dir) {
        return Some("it lies in the agent's state directory".into());
    }
    if !bounds.prefixes.is_empty() && !bounds.prefixes.iter().any(|p| m.mount_point.starts_with(p))
    {
        return Some("it lies outside the allowed path prefixes".into());
    }
    if !block_bind && m.root != Path::new("/") {
        return Some(format!("it binds a subdirectory ({})", m.root.display()));
    }
    let copies = ebs_node_host::mount::copies::corresponding(table, m);
    taken
        .iter()
        .find(|t| copies.iter().any(|c| c.mount_id == t.mount_id))
        .map(|t| format!("it is the kernel's copy of {}", t.mount_point.display()))
}
