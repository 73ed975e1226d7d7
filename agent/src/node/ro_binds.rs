//! What the host shows still uses a read-only block device, before recovery takes one away. The
//! records and the tag say whose a device is; only the host says whether a workload still has
//! it: a bind of its device node (the publication itself, kubelet's and the runtime's binds of
//! it), in this or any other mount namespace a process shows; a filesystem mounted from it; a
//! holder (device mapper) or an O_EXCL claim. A bind of a device node does not open the device,
//! so the node's device numbers in the mount tables are the only trace it leaves.

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use ebs_node_core::DevNum;
use ebs_node_host::device::devnum_of;
use ebs_node_host::mount::table::MountTable;

/// How long the mount tables may take to read and examine (a stat below a dead NFS mount
/// hangs): past it, every device counts as used.
pub const WITHIN: Duration = Duration::from_secs(5);

/// Where each device is bound or mounted, as the mount tables of every namespace show.
pub struct Uses {
    found: Result<Found, String>,
}

/// Where each device is mounted or bound (`any`), and where its node is bound (`bound`).
#[derive(Default)]
struct Found {
    any: HashMap<DevNum, String>,
    bound: HashMap<DevNum, String>,
}

impl Uses {
    /// Reads the mount tables, waiting `within` at most.
    pub fn scan(within: Duration) -> Uses {
        let (tx, rx) = mpsc::channel();
        // A hung stat keeps this thread; nobody waits for it past `within`.
        let spawned = std::thread::Builder::new()
            .name("ro-binds".into())
            .spawn(move || {
                let _ = tx.send(scan_namespaces());
            });
        let found = match spawned {
            Err(e) => Err(format!("the mount tables could not be examined: {e}")),
            Ok(_) => rx.recv_timeout(within).map_err(|_| {
                format!(
                    "the mount tables could not be examined within {} s",
                    within.as_secs()
                )
            }),
        };
        Uses { found }
    }

    /// What uses the device `device` (numbers `devnum`), or None when the host shows nothing.
    pub fn of(&self, device: &Path, devnum: DevNum) -> Option<String> {
        match &self.found {
            Err(why) => return Some(why.clone()),
            Ok(found) => {
                if let Some(at) = found.any.get(&devnum) {
                    return Some(at.clone());
                }
            }
        }
        if let Some(names) = holders(devnum) {
            return Some(format!("held by {names}"));
        }
        claimed(device)
    }

    /// Where a node of the device is bound (a raw use no claim shows), in any namespace; what
    /// went wrong when the tables could not be read (then every device counts as bound).
    pub fn bound(&self, devnum: DevNum) -> Option<String> {
        match &self.found {
            Err(why) => Some(why.clone()),
            Ok(found) => found.bound.get(&devnum).cloned(),
        }
    }
}

/// The devices the mount tables of every visible namespace bind or mount, with where.
fn scan_namespaces() -> Found {
    let mut found = Found::default();
    let mut seen = HashSet::new();
    let pids = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok());
    // This agent's own namespace first, by its own paths.
    let own = std::iter::once(None).chain(pids.map(Some));
    for pid in own {
        let proc_dir = pid.map_or_else(
            || PathBuf::from("/proc/self"),
            |p| PathBuf::from(format!("/proc/{p}")),
        );
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
        for m in table.entries() {
            found
                .any
                .entry(DevNum::new(m.major, m.minor))
                .or_insert_with(|| format!("mounted at {}", place(&m.mount_point)));
            // A bind of a device node has the node as its root, never a filesystem's "/".
            if m.root == Path::new("/") {
                continue;
            }
            let path = match &root {
                None => m.mount_point.clone(),
                Some(r) => r.join(m.mount_point.strip_prefix("/").unwrap_or(&m.mount_point)),
            };
            if let Ok(meta) = std::fs::symlink_metadata(&path)
                && meta.file_type().is_block_device()
            {
                let at = format!("bound at {}", place(&m.mount_point));
                let devnum = devnum_of(meta.rdev());
                found.bound.entry(devnum).or_insert_with(|| at.clone());
                found.any.entry(devnum).or_insert(at);
            }
        }
    }
    found
}

/// The devices stacked on the device (device mapper, md), if any.
fn holders(devnum: DevNum) -> Option<String> {
    let names: Vec<String> = std::fs::read_dir(format!("/sys/dev/block/{devnum}/holders"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    (!names.is_empty()).then(|| names.join(", "))
}

/// Whether the kernel refuses an exclusive open of the device (a mount, a tool's O_EXCL).
fn claimed(device: &Path) -> Option<String> {
    let open = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_EXCL | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(device);
    match open {
        Ok(_) => None,
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
            Some("claimed exclusively (a mount or an O_EXCL open)".into())
        }
        // Gone, or no node: nothing the sweep could detach either.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => Some(format!("could not be examined: {e}")),
    }
}
