//! Every mount namespace's table, read for the binds of device nodes in it: the namespaces a
//! process is in (`/proc/<pid>/mountinfo`), and those no process is in, which a bind of their
//! nsfs file pins (`unshare --mount=FILE`) or a process holds open: those are entered by a thread of their own (it first
//! stops sharing its filesystem attributes, which `setns` requires, and ends after), which reads
//! the table through the `/proc` opened before it entered. One that cannot be read makes the
//! whole scan fail: then every device counts as used.

use std::collections::HashSet;
use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use ebs_node_core::DevNum;
use ebs_node_host::device::devnum_of;
use ebs_node_host::mount::table::MountTable;
use nix::fcntl::{OFlag, openat};
use nix::sched::{CloneFlags, setns, unshare};
use nix::sys::stat::Mode;

use super::Found;

/// A namespace no process is in, to enter: its nsfs file, and where it is pinned.
struct Pinned {
    ns: OwnedFd,
    at: String,
}

/// The devices every mount namespace's table binds or mounts, with where.
pub(super) fn scan() -> Result<Found, String> {
    let mut found = Found::default();
    let mut seen = HashSet::new();
    let mut pinned = Vec::new();
    let pids = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok());
    // This agent's own namespace first, by its own paths.
    for pid in std::iter::once(None).chain(pids.map(Some)) {
        let proc_dir = pid.map_or_else(
            || PathBuf::from("/proc/self"),
            |p| PathBuf::from(format!("/proc/{p}")),
        );
        if pid.is_some() {
            pinned.extend(held_open(&proc_dir));
        }
        let Ok(ns) = std::fs::metadata(proc_dir.join("ns/mnt")) else {
            continue;
        };
        if !seen.insert((ns.dev(), ns.ino())) {
            continue;
        }
        let Ok(text) = std::fs::read(proc_dir.join("mountinfo")) else {
            continue;
        };
        let Ok(table) = MountTable::parse_bytes(&text) else {
            continue;
        };
        let root = pid.map(|_| proc_dir.join("root"));
        let place = |mp: &Path| match pid {
            None => mp.display().to_string(),
            Some(p) => format!("{} (mount namespace of pid {p})", mp.display()),
        };
        pinned.extend(record(&mut found, &table, root.as_deref(), &place));
    }
    while let Some(pin) = pinned.pop() {
        let id = nix::sys::stat::fstat(pin.ns.as_fd())
            .map_err(|e| format!("the mount namespace pinned at {}: {e}", pin.at))?;
        if !seen.insert((id.st_dev, id.st_ino)) {
            continue;
        }
        let entered = std::thread::scope(|s| s.spawn(|| enter(&pin)).join());
        let (theirs, nested) = match entered {
            Ok(Ok(read)) => read,
            Ok(Err(e)) => return Err(format!("the mount namespace pinned at {}: {e}", pin.at)),
            Err(_) => return Err(format!("the mount namespace pinned at {}", pin.at)),
        };
        for (devnum, at) in theirs.any {
            found.any.entry(devnum).or_insert(at);
        }
        for (devnum, at) in theirs.bound {
            found.bound.entry(devnum).or_insert(at);
        }
        pinned.extend(nested);
    }
    Ok(found)
}

/// The mount namespaces a process holds open (an fd of a `/proc/<pid>/ns/mnt` it is not in).
fn held_open(proc_dir: &Path) -> Vec<Pinned> {
    let mut held = Vec::new();
    for e in std::fs::read_dir(proc_dir.join("fd"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let is_mnt_ns =
            std::fs::read_link(e.path()).is_ok_and(|l| l.to_string_lossy().starts_with("mnt:["));
        if is_mnt_ns && let Ok(f) = File::open(e.path()) {
            held.push(Pinned {
                ns: OwnedFd::from(f),
                at: format!("{} (held open)", e.path().display()),
            });
        }
    }
    held
}

/// In a thread of its own: enters the pinned namespace and reads its table there (paths then
/// resolve in it). The thread ends after; nothing else runs in it.
fn enter(pin: &Pinned) -> std::io::Result<(Found, Vec<Pinned>)> {
    // Opened before entering: the table is the one of the namespace this thread is in when it
    // opens the file, through the agent's own /proc.
    let proc_dir = File::open("/proc")?;
    unshare(CloneFlags::CLONE_FS)?;
    setns(pin.ns.as_fd(), CloneFlags::CLONE_NEWNS)?;
    let fd = openat(
        proc_dir.as_fd(),
        "thread-self/mountinfo",
        OFlag::O_RDONLY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    let mut text = Vec::new();
    std::io::Read::read_to_end(&mut File::from(fd), &mut text)?;
    let table = MountTable::parse_bytes(&text)
        .map_err(|e| std::io::Error::other(format!("its mount table: {e}")))?;
    let mut found = Found::default();
    let place = |mp: &Path| format!("{} (mount namespace pinned at {})", mp.display(), pin.at);
    let nested = record(&mut found, &table, None, &place);
    Ok((found, nested))
}

/// Notes each mount of `table` and each bind of a device node in it; returns the namespaces
/// with no process that the table pins. `root`: where the table's paths are reached from here
/// (another process's namespace), or None (this thread's own).
fn record(
    found: &mut Found,
    table: &MountTable,
    root: Option<&Path>,
    place: &dyn Fn(&Path) -> String,
) -> Vec<Pinned> {
    let mut pins = Vec::new();
    for m in table.entries() {
        found
            .any
            .entry(DevNum::new(m.major, m.minor))
            .or_insert_with(|| format!("mounted at {}", place(&m.mount_point)));
        let path = match root {
            None => m.mount_point.clone(),
            Some(r) => r.join(m.mount_point.strip_prefix("/").unwrap_or(&m.mount_point)),
        };
        if m.fs_type == "nsfs" && m.root.to_string_lossy().starts_with("mnt:[") {
            if let Ok(f) = File::open(&path) {
                pins.push(Pinned {
                    ns: OwnedFd::from(f),
                    at: place(&m.mount_point),
                });
            }
            continue;
        }
        // A bind of a device node has the node as its root, never a filesystem's "/".
        if m.root == Path::new("/") {
            continue;
        }
        let at = format!("bound at {}", place(&m.mount_point));
        // A node of the device filesystem is known by its name there, even when something is
        // mounted over the bind (the mount point then shows the cover, not the node).
        if m.fs_type == "devtmpfs"
            && let Ok(meta) = std::fs::symlink_metadata(
                Path::new("/dev").join(m.root.strip_prefix("/").unwrap_or(&m.root)),
            )
            && meta.file_type().is_block_device()
        {
            note_bind(found, devnum_of(meta.rdev()), &at);
        }
        if let Ok(meta) = std::fs::symlink_metadata(&path)
            && meta.file_type().is_block_device()
        {
            note_bind(found, devnum_of(meta.rdev()), &at);
        }
    }
    pins
}

fn note_bind(found: &mut Found, devnum: DevNum, at: &str) {
    found.bound.entry(devnum).or_insert_with(|| at.to_string());
    found.any.entry(devnum).or_insert_with(|| at.to_string());
}
