//! Every mount namespace's table, read for the binds of device nodes in it: those a process or
//! a thread is in (`walk`), and those no thread is in, which a bind of their nsfs file pins
//! (`unshare --mount=FILE`) or a file keeps alive: the kernel lists them all (`listed`, Linux
//! 6.12); before it, the walk also reads every process's open files. Each is entered by a thread
//! of its own (it first stops sharing its filesystem attributes, which `setns` requires, and ends
//! after) and its table read there, through the `/proc` opened before it entered: the whole
//! table, whatever root the namespace's processes were given (`chroot` hides the mounts outside
//! it from `/proc/<pid>/mountinfo`). A namespace that cannot be read fails the whole scan, and so
//! does an agent that cannot see every process (a container's PID namespace, as a pod without
//! `hostPID`): then every device counts as used.

use std::collections::HashSet;
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::mount::table::MountTable;
use nix::fcntl::{OFlag, openat};
use nix::sched::{CloneFlags, setns, unshare};
use nix::sys::stat::Mode;

use super::Found;

mod copies;
mod covered;
mod listed;
mod mount_point;
mod record;
mod settle;
mod unreachable;
mod unveil;
mod walk;

pub(super) use copies::settled as copies_settled;
use record::record;

/// A namespace to enter: its nsfs file, and whose it is.
struct Pinned {
    ns: OwnedFd,
    at: String,
}

/// The namespaces of one scan: those read, and those opened to be read. Every mount namespace
/// file is on the one nsfs, so its inode number names it, as `readlink` shows it (`mnt:[N]`):
/// a namespace already read or opened is known by its link and never opened again. Before,
/// every thread and every held-open file was opened first and sorted out after, and scans side
/// by side in one agent each opened the others' open files: 16 stages at once ran an agent
/// with 20,000 files allowed out of them (the bench at 128 volumes, concurrency 16).
#[derive(Default)]
struct Namespaces {
    read: HashSet<u64>,
    opened: HashSet<u64>,
    /// nsfs files of other kinds of namespace (network, PID, …) that processes hold open.
    other_kinds: HashSet<u64>,
    /// The device of nsfs, where every namespace file is.
    nsfs_dev: u64,
    pinned: Vec<Pinned>,
    /// A file of every namespace this scan has read or sorted out, open until the scan ends: a
    /// namespace lives while a file of it is open, so its inode number names no other namespace
    /// meanwhile. The kernel gives a freed number to the next namespace made (three made one
    /// after another had the same one), and a scan that knew namespaces by a number it had let
    /// go passed over a new namespace that took it: a bind's holder moved into a copy of its
    /// namespace as the number of one already read came free (a forty-fourth fresh review's F2).
    kept: Vec<OwnedFd>,
    /// The table of every namespace read, open since just before it was read (`settle`).
    watched: Vec<settle::Watched>,
}

impl Namespaces {
    /// Whether the namespace a link names (`/proc/<pid>/task/<tid>/ns/mnt`, an fd's link) is
    /// read or opened already. A link that cannot be read is not known.
    fn known(&self, link: &Path) -> bool {
        std::fs::read_link(link)
            .ok()
            .and_then(|l| nsfs_inode(&l.to_string_lossy()))
            .is_some_and(|ino| self.read.contains(&ino) || self.opened.contains(&ino))
    }

    /// Keeps an opened namespace file to be read, unless its namespace is known (it changed
    /// since its link was read).
    fn pin(&mut self, f: File, at: String) -> Result<(), String> {
        let ino = f
            .metadata()
            .map_err(|e| format!("the mount namespace {at}: {e}"))?
            .ino();
        if !self.read.contains(&ino) && self.opened.insert(ino) {
            self.pinned.push(Pinned {
                ns: OwnedFd::from(f),
                at,
            });
        }
        Ok(())
    }
}

/// The inode number a namespace link names: `mnt:[4026531841]`.
fn nsfs_inode(link: &str) -> Option<u64> {
    link.strip_prefix("mnt:[")?.strip_suffix(']')?.parse().ok()
}

/// The devices every mount namespace's table binds or mounts, with where. The namespaces are
/// taken from the kernel's list of them where it gives one (`listed`), else found by a walk of
/// every process's threads and open files (`walk`).
pub(super) fn scan() -> Result<Found, String> {
    if let Some(why) = not_every_process_seen() {
        return Err(why);
    }
    let started = std::time::Instant::now();
    let mut found = Found::default();
    let own_ns = Path::new("/proc/thread-self/ns/mnt");
    let (nsfs_dev, _) = crate::nsfs::cached_file_id(own_ns)
        .map_err(|e| format!("this agent's mount namespace: {e}"))?;
    let mut spaces = Namespaces {
        nsfs_dev,
        ..Namespaces::default()
    };
    // This agent's own namespace first.
    let own = File::open(own_ns).map_err(|e| format!("this agent's mount namespace: {e}"))?;
    spaces.pin(own, "this agent's".into())?;
    read_all(&mut found, &mut spaces)?;
    let listed = listed::read_every(&mut found, &mut spaces)?;
    // Every thread's namespace is read where it is when the walk comes to it, even with the
    // list: a process that moves to a copy of its namespace (unshare) during the scan takes its
    // binds along, and the copy's place on the list (by an id the kernel hands out in batches
    // per CPU, not in order) may be behind the list's cursor while the namespace it left dies
    // ahead of it (a forty-fourth fresh review's F1). The open files need no walk when the list
    // is taken: every namespace a file keeps alive is on it.
    walk::read_every(&mut found, &mut spaces, !listed)?;
    settle::read_changed(&mut found, &mut spaces, started)?;
    // A namespace pinned by a bind of its file that its mount point does not lead to (a mount
    // laid over it) is on the kernel's list; without the list it was read nowhere.
    if let Some(at) = found.hidden_pins.first().filter(|_| !listed) {
        return Err(format!(
            "a namespace pinned at {at}: the pin cannot be opened, and without the kernel's \
             list of mount namespaces (Linux 6.12) the namespace is read nowhere"
        ));
    }
    Ok(found)
}

/// Reads every namespace pinned and not read yet (and those their tables pin), and closes it.
fn read_all(found: &mut Found, spaces: &mut Namespaces) -> Result<(), String> {
    while let Some(pin) = spaces.pinned.pop() {
        let ino = nix::sys::stat::fstat(pin.ns.as_fd())
            .map_err(|e| format!("the mount namespace {}: {e}", pin.at))?
            .st_ino;
        spaces.opened.remove(&ino);
        if !spaces.read.insert(ino) {
            continue;
        }
        let (table, nested) = read_one(found, pin.ns.as_fd(), &pin.at)?;
        for (f, at) in nested {
            spaces.pin(f, at)?;
        }
        spaces.watched.push(settle::Watched {
            table,
            ns: spaces.kept.len(),
            at: pin.at,
        });
        spaces.kept.push(pin.ns);
    }
    Ok(())
}

/// Reads the namespace `ns` (`at` says whose) into `found`: its table file, open since just
/// before the table was read, and the namespaces with no process the table pins.
fn read_one(found: &mut Found, ns: BorrowedFd<'_>, at: &str) -> Result<ReadOne, String> {
    // Dropped only once the thread is joined: a copy it made counts until then (`copies`).
    let slot = copies::Slot::default();
    let entered = std::thread::scope(|s| s.spawn(|| enter(ns, at, &slot)).join());
    let Entered {
        found: mut theirs,
        nested,
        top,
        table,
    } = match entered {
        Ok(Ok(read)) => read,
        Ok(Err(e)) => return Err(format!("the mount namespace {at}: {e}")),
        Err(_) => return Err(format!("the mount namespace {at}")),
    };
    covered::read(&mut theirs, ns, top, at)
        .map_err(|e| format!("the mounts of the mount namespace {at}: {e}"))?;
    for (devnum, at) in theirs.any {
        found.any.entry(devnum).or_insert(at);
    }
    for (devnum, at) in theirs.bound {
        found.bound.entry(devnum).or_insert(at);
    }
    found.hidden_pins.extend(theirs.hidden_pins);
    Ok((table, nested))
}

/// A namespace's table file, and the namespaces its table pins.
type ReadOne = (File, Vec<(File, String)>);

/// Why this agent cannot see every process on the host, if it cannot: it runs as a container's
/// first process in a PID namespace of its own (a pod without `hostPID`, a Nomad task without
/// `pid_mode = "host"`): the agent is PID 1 there, or a container's init is (`pause`, `tini`).
/// A nested PID namespace alone says nothing: a host that is itself a container (this project's
/// CI machine) has one, and sees every process of its own. The kernel's first PID namespace
/// has a fixed inode number (`PROC_PID_INIT_INO`).
fn not_every_process_seen() -> Option<String> {
    const PROC_PID_INIT_INO: u64 = 0xEFFF_FFFC;
    const INITS: [&str; 5] = ["pause", "tini", "dumb-init", "catatonit", "docker-init"];
    let nested =
        std::fs::metadata("/proc/self/ns/pid").map_or(true, |m| m.ino() != PROC_PID_INIT_INO);
    let first = std::process::id() == 1
        || std::fs::read_to_string("/proc/1/comm").is_ok_and(|c| INITS.contains(&c.trim()));
    (nested && first).then(|| {
        "this agent runs in a container's PID namespace and cannot see every process's mounts \
         (run it in the host's: hostPID: true in Kubernetes, pid_mode = \"host\" in Nomad)"
            .to_string()
    })
}

/// What a namespace's table shows: its mounts and binds, the namespaces with no process it pins,
/// and the mount the table was read from.
struct Entered {
    found: Found,
    nested: Vec<(File, String)>,
    /// The unique id of the mount that is the entering thread's root (Linux 6.8).
    top: Option<u64>,
    /// The table's file, opened before it was read: the kernel says through it whether the
    /// namespace's mounts changed since (`settle`).
    table: File,
}

/// In a thread of its own: enters the pinned namespace and reads its table there (paths then
/// resolve in it); also says which mount the thread's root is. The thread ends after; nothing
/// else runs in it.
fn enter(ns: BorrowedFd<'_>, at: &str, slot: &copies::Slot) -> std::io::Result<Entered> {
    // Opened before entering: the table is the one of the namespace this thread is in when it
    // opens the file, through the agent's own /proc; device-filesystem names are looked up in
    // the agent's own /dev (a container's /dev is often a tmpfs of its own).
    let proc_dir = File::open("/proc")?;
    let dev_dir = File::open("/dev")?;
    unshare(CloneFlags::CLONE_FS)?;
    setns(ns, CloneFlags::CLONE_NEWNS)?;
    let top = root_mount_id();
    let listed = unreachable::listed(top)?;
    let (table_file, table) = own_table(&proc_dir)?;
    let mut found = Found::default();
    let place = |mp: &Path| format!("{} (mount namespace {at})", mp.display());
    let recorded = record(&mut found, &table, (&proc_dir, &dev_dir), &place);
    if let Some(why) = recorded.failed {
        return Err(std::io::Error::other(format!(
            "a namespace pinned at {why}"
        )));
    }
    let host_owned = crate::nsfs::owned_by_host_users(ns);
    let unique = match listed {
        Some(listed) => unreachable::read(&mut found, &listed, &table, &dev_dir, at, host_owned)?,
        None => Default::default(),
    };
    // The thread's last act: it leaves the namespace for a copy of it.
    if host_owned && !recorded.covered.is_empty() {
        let covered = unveil::still_covered(&mut found, &proc_dir, recorded.covered)?;
        if !covered.is_empty() {
            let ns_id = crate::nsfs::mount_namespace_info(ns)?.map(|(id, _)| id);
            let originals = unveil::Originals { ns_id, unique };
            slot.made();
            unveil::tell(&mut found, &proc_dir, &covered, &originals)?;
        }
    } else if recorded.covered.iter().any(|bind| bind.devtmpfs) {
        // A copy of a namespace a user namespace owns has every mount locked, so no cover
        // would come off there (and any user could make the agent copy a thousand covered
        // mounts at every scan: a fifty-second fresh review). A plain file any user binds and
        // covers is passed over (the fifty-first's F3), and is not asked again; a node of the
        // device filesystem whose name no longer names it fails the scan, as where no path
        // reaches it (`covered.rs`): any user can bind a disk's node and cover it, and the
        // number is the next disk's once the first goes (the fifty-second's F1).
        let devtmpfs = recorded.covered.into_iter().filter(|bind| bind.devtmpfs);
        let covered = unveil::still_covered(&mut found, &proc_dir, devtmpfs.collect())?;
        if let Some(bind) = covered.first() {
            return Err(record::untold(&bind.at));
        }
    }
    Ok(Entered {
        found,
        nested: recorded.pins,
        top,
        table: table_file,
    })
}

/// The table of the namespace this thread is in, through the agent's `/proc` (`proc_dir`), and
/// its file, open since just before it was read.
fn own_table(proc_dir: &File) -> std::io::Result<(File, MountTable)> {
    let fd = openat(
        proc_dir.as_fd(),
        "thread-self/mountinfo",
        OFlag::O_RDONLY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    let mut file = File::from(fd);
    let mut text = Vec::new();
    std::io::Read::read_to_end(&mut file, &mut text)?;
    let table = MountTable::parse_bytes(&text)
        .map_err(|e| std::io::Error::other(format!("its mount table: {e}")))?;
    Ok((file, table))
}

/// The unique id of the mount this thread's root is on (the top of the mounts stacked on its
/// namespace's root), from the kernel's cached attributes (a FUSE root is not asked).
fn root_mount_id() -> Option<u64> {
    use rustix::fs::{AtFlags, CWD, StatxFlags, statx};
    let unique = StatxFlags::from_bits_retain(crate::anchor::STATX_MNT_ID_UNIQUE);
    let st = statx(CWD, "/", AtFlags::STATX_DONT_SYNC, unique).ok()?;
    StatxFlags::from_bits_retain(st.stx_mask)
        .contains(unique)
        .then_some(st.stx_mnt_id)
}
