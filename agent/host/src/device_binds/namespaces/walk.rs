//! The mount namespaces found by a walk of /proc: the namespace of every thread of every
//! process (a thread may have one of its own, and a process whose first thread has exited shows
//! its namespace only through the others), read where the thread is when the walk comes to it;
//! and, where the kernel gives no list of them (before Linux 6.12, a filter that denies the list,
//! an agent outside the host's user namespace), those no thread is in that a process holds open.
//! Each is read as soon as it is found, process by process.

use std::fs::File;
use std::os::fd::AsFd;
use std::path::Path;

use super::{Found, Namespaces, read_all};

/// Reads the namespace of every thread, and (`open_files`) every one a process holds open.
pub(super) fn read_every(
    found: &mut Found,
    spaces: &mut Namespaces,
    open_files: bool,
) -> Result<(), String> {
    // Every error but a process gone fails the scan: a walk cut short by the agent's files
    // running out (a user holding thousands of namespaces open: a forty-fifth fresh review's
    // F7) passed over what it had not reached yet.
    let pids: Vec<u32> = std::fs::read_dir("/proc")
        .and_then(|d| d.collect::<std::io::Result<Vec<_>>>())
        .map_err(|e| format!("the processes in /proc: {e}"))?
        .into_iter()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .collect();
    // This agent's own threads are in its namespace (it never makes one) or, for a moment,
    // in one a scan entered, and the namespace files it holds are its scans': the namespaces
    // of other processes. Its own hundred files and threads are not looked at on every scan.
    // Its number as this /proc shows it (not its own PID namespace's).
    let own = std::fs::read_link("/proc/self")
        .ok()
        .and_then(|p| p.to_str()?.parse::<u32>().ok());

    // The agent's own /proc, through which a held-open namespace file is opened for real.
    let proc = match open_files {
        true => Some(File::open("/proc").map_err(|e| format!("/proc: {e}"))?),
        false => None,
    };
    for pid in pids.into_iter().filter(|p| Some(*p) != own) {
        let proc_dir = Path::new("/proc").join(pid.to_string());
        if let Some(proc) = &proc {
            held_open(proc, &proc_dir, spaces)?;
        }
        let tasks = match std::fs::read_dir(proc_dir.join("task")) {
            Ok(tasks) => tasks,
            Err(e) if gone(&e) => continue,
            Err(e) => return Err(format!("the threads of pid {pid}: {e}")),
        };
        for task in tasks {
            let task = match task {
                Ok(task) => task,
                Err(e) if gone(&e) => continue,
                Err(e) => return Err(format!("the threads of pid {pid}: {e}")),
            };
            let link = task.path().join("ns/mnt");
            if spaces.known(&link) {
                continue;
            }
            // A thread or process that is gone, or a zombie's, has nothing to show. One the
            // agent may not look into even with CAP_SYS_PTRACE (a process of a user namespace
            // above the agent's: the agent then runs in a container's) is passed over, and
            // said once; any other error fails the scan.
            match File::open(&link) {
                Ok(f) => spaces.pin(f, format!("of pid {pid}"))?,
                Err(e) if gone(&e) => {}
                Err(e) if e.raw_os_error() == Some(libc::EACCES) => denied(pid),
                Err(e) => return Err(format!("the mount namespace of pid {pid}: {e}")),
            }
        }
        read_all(found, spaces)?;
    }
    read_all(found, spaces)
}

/// Says once that a process's namespace could not be looked into.
fn denied(pid: u32) {
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
        tracing::warn!(
            pid,
            "the mount namespace of a process is closed to this agent even as root (it runs in a user namespace below that process's); binds there are not seen"
        );
    }
}

/// A process or thread that exited while it was looked at (or a zombie's namespace).
fn gone(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESRCH)
}

/// The mount namespaces a process holds open (an fd of a namespace file it is not in), those not
/// known yet. Each fd is asked which file it is open on, not what its link reads: a file opened
/// through a bind of a namespace file reads as the bind's path ("/" once the bind is gone), not
/// `mnt:[N]` (a thirty-fourth fresh review's F1: a device bound in a namespace only such a file
/// kept alive was formatted, handed out raw and detached under its bind). A file on nsfs is
/// asked its kind of namespace once a scan.
fn held_open(proc: &File, proc_dir: &Path, spaces: &mut Namespaces) -> Result<(), String> {
    let fds = match std::fs::read_dir(proc_dir.join("fd")) {
        Ok(fds) => fds,
        Err(e) if gone(&e) || e.raw_os_error() == Some(libc::EACCES) => return Ok(()),
        Err(e) => return Err(format!("the open files of {}: {e}", proc_dir.display())),
    };
    for e in fds {
        let e = match e {
            Ok(e) => e,
            Err(e) if gone(&e) => return Ok(()),
            Err(e) => return Err(format!("the open files of {}: {e}", proc_dir.display())),
        };
        // An fd closed meanwhile is not a namespace held open. A process whose fds are closed to
        // this agent (one of a user namespace above it) shows none of them.
        let (dev, ino) = match crate::nsfs::cached_file_id(&e.path()) {
            Ok(id) => id,
            Err(e) if e.raw_os_error() == Some(libc::EACCES) => return Ok(()),
            Err(_) => continue,
        };
        if dev != spaces.nsfs_dev
            || spaces.read.contains(&ino)
            || spaces.opened.contains(&ino)
            || spaces.other_kinds.contains(&ino)
        {
            continue;
        }
        // Opened only once it is known to be on nsfs: the fd may be closed and taken by a
        // FIFO or a device since it was asked (`nsfs::open_ns_file`).
        let f = match crate::nsfs::open_ns_file(proc.as_fd(), &e.path(), true, None) {
            Ok(Some(f)) => f,
            // Closed since it was listed, or another file now.
            Ok(None) => continue,
            Err(err) if gone(&err) => continue,
            Err(err) if err.raw_os_error() == Some(libc::EACCES) => return Ok(()),
            Err(err) => return Err(format!("{}: {err}", e.path().display())),
        };
        if crate::nsfs::is_mount_namespace(f.as_fd()) {
            spaces.pin(f, format!("{} (held open)", e.path().display()))?;
        } else {
            spaces.other_kinds.insert(ino);
            spaces.kept.push(f.into());
        }
    }
    Ok(())
}
