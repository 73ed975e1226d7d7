//! The read-only (nosuid, nodev, noexec, atime) bind without the new mount API (Linux before
//! 5.12, or a seccomp filter denying open_tree, move_mount or mount_setattr).
//!
//! mount(2) ignores those bits on the first MS_BIND call, and a later remount changes only the
//! agent's own copy: a shared target (kubelet's directory under Bidirectional propagation) has
//! already cloned the bind, writable, into every peer. So the bind is made and remounted first
//! in a private place of the agent's own (a tmpfs below the state directory, made private, so
//! nothing mounted in it propagates anywhere), and only the finished mount is bound onto the
//! target: a bind copies the mount's flags, and so does every clone made for the target's peers.
//! The private place's own tmpfs is made once per boot; if the state directory's mount is
//! shared, its peers get an empty copy of that tmpfs, nothing else.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use rustix::mount::{MountFlags as MsFlags, MountPropagationFlags, UnmountFlags};
use rustix::mount::{mount_bind, mount_change, mount_remount, unmount};

use super::table::MountTable;
use crate::anchor::EntryFd;

/// The private tmpfs's source name, how a later process of the agent recognises it.
const SOURCE: &str = "ebs-node-agent-binds";

static DIR: OnceLock<PathBuf> = OnceLock::new();
static READY: Mutex<bool> = Mutex::new(false);
static NEXT: AtomicU64 = AtomicU64::new(0);

/// Where the private place is (the state directory's `binds`); set once at start.
pub fn set_dir(dir: PathBuf) {
    let _ = DIR.set(dir);
}

/// Binds `source` onto `target` with `flags` (MS_RDONLY and per-mount bits) already on the
/// mount when it appears at the target, in this namespace and in every peer of it.
pub fn bind_with(source: &Path, target: &EntryFd, flags: MsFlags) -> io::Result<()> {
    let dir = prepared()?;
    let place = dir.join(format!(
        "{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    if std::fs::metadata(source)?.is_dir() {
        std::fs::create_dir(&place)?;
    } else {
        std::fs::File::create_new(&place)?;
    }
    let made = (|| -> io::Result<()> {
        mount_bind(source, &place)?;
        mount_remount(&place, MsFlags::BIND | flags, "")?;
        Ok(mount_bind(&place, target.proc_path())?)
    })();
    // The private copy goes in every case; the target's stays.
    let _ = unmount(&place, UnmountFlags::DETACH);
    let _ = std::fs::remove_file(&place).or_else(|_| std::fs::remove_dir(&place));
    made
}

/// Detaches what a crash between a private bind and its detach left in the private place, if
/// the place is there: at every start, whether the fallback will be needed or not (a
/// seventy-third fresh review's F2: left by a run under a filter that denies the new mount API,
/// and a run without it never looked, the leftover bind kept the volume's filesystem mounted,
/// and its unstage was refused for good). How many were detached.
pub fn sweep() -> io::Result<usize> {
    // No place made: nothing to read the whole mount table for at start-up.
    let Some(dir) = DIR.get().filter(|d| d.is_dir()) else {
        return Ok(0);
    };
    let table = MountTable::read().map_err(io::Error::other)?;
    let before = leftovers(&table, dir).count();
    detach_leftovers(&table, dir);
    Ok(before)
}

/// The mounts in the private place, deepest first.
fn leftovers<'a>(
    table: &'a MountTable,
    dir: &'a Path,
) -> impl Iterator<Item = &'a super::table::MountEntry> {
    let ours = table.at(dir).is_some_and(|m| m.source == SOURCE);
    table
        .entries()
        .iter()
        .rev()
        .filter(move |m| ours && m.mount_point.parent() == Some(dir))
}

/// Detaches the leftovers of the private place; whether the place is the agent's tmpfs.
fn detach_leftovers(table: &MountTable, dir: &Path) -> bool {
    for m in leftovers(table, dir) {
        let _ = unmount(&m.mount_point, UnmountFlags::DETACH);
        let _ =
            std::fs::remove_file(&m.mount_point).or_else(|_| std::fs::remove_dir(&m.mount_point));
    }
    table.at(dir).is_some_and(|m| m.source == SOURCE)
}

/// Makes the private place now (start-up, where the fallback is known to be needed).
pub fn prepare() -> io::Result<()> {
    prepared().map(drop)
}

/// The private place, made (or taken over from an earlier process, its leftovers detached) at
/// the first use.
fn prepared() -> io::Result<PathBuf> {
    let dir = DIR
        .get()
        .ok_or_else(|| io::Error::other("no private place for a read-only bind was set"))?;
    let mut ready = READY.lock().unwrap_or_else(|p| p.into_inner());
    if *ready {
        return Ok(dir.clone());
    }
    std::fs::create_dir_all(dir)?;
    let table = MountTable::read().map_err(io::Error::other)?;
    if !detach_leftovers(&table, dir) {
        rustix::mount::mount(
            SOURCE,
            dir,
            "tmpfs",
            MsFlags::NOSUID | MsFlags::NODEV | MsFlags::NOEXEC,
            c"mode=0700,size=64k",
        )?;
    }
    // Private every time (also a tmpfs taken over): nothing below it may propagate.
    mount_change(dir, MountPropagationFlags::PRIVATE)?;
    *ready = true;
    Ok(dir.clone())
}
