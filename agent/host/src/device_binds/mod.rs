//! What the host shows still uses a read-only block device, before recovery takes one away. The
//! records and the tag say whose a device is; only the host says whether a workload still has
//! it: a bind of its device node (the publication itself, kubelet's and the runtime's binds of
//! it), in this or any other mount namespace a process shows; a filesystem mounted from it; a
//! holder (device mapper) or an O_EXCL claim. A bind of a device node does not open the device,
//! so the node's device numbers in the mount tables are the only trace it leaves. The tables
//! are those of every mount namespace a process is in, and of every one a bind of its nsfs file
//! pins with no process in it (`namespaces`).

use std::collections::HashMap;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::flight::{Flight, Lead};

use ebs_node_core::DevNum;

mod namespaces;

/// How long the mount tables may take to read and examine (a stat below a dead NFS mount
/// hangs): past it, every device counts as used.
pub const WITHIN: Duration = Duration::from_secs(5);

/// Waits (`limit` at most) until no private copy of a mount namespace this agent's scans made
/// may still hold a mount (`namespaces::copies`); whether one might have held one meanwhile, so
/// that a device seen claimed is worth asking again.
pub fn own_copies_settled(limit: Duration) -> bool {
    namespaces::copies_settled(limit)
}

/// Where each device is bound or mounted, as the mount tables of every namespace show.
pub struct Uses {
    found: Arc<Result<Found, String>>,
}

/// Where each device is mounted or bound (`any`), and where its node is bound (`bound`).
#[derive(Default)]
struct Found {
    any: HashMap<DevNum, String>,
    bound: HashMap<DevNum, String>,
    /// Binds of a mount namespace's file whose mount point leads elsewhere (`namespaces`).
    hidden_pins: Vec<String>,
}

/// The tables, looked at again (a few times, briefly) while a namespace another process holds
/// open could not be entered: another agent's own scan holds the namespaces it looks into for
/// the moment it looks, and one may be gone before this scan enters it (seen as EINVAL from
/// setns when agents scanned side by side: the loop controller's attach was refused
/// UNAVAILABLE). So is a namespace whose last process left between the scan's entering it and
/// its asking the kernel for the mounts below its root (ENOENT: the rehearsal's Kubernetes
/// reboot, pods going as the agent started, left a loop volume file unattached for good). One
/// held longer, or gone on every look, still counts as a use.
fn scan_settled() -> Result<Found, String> {
    let mut last = namespaces::scan();
    for _ in 0..3 {
        match &last {
            Err(why) if why.contains("(held open)") || why.contains("(os error 2)") => {
                std::thread::sleep(Duration::from_millis(25));
                last = namespaces::scan();
            }
            _ => break,
        }
    }
    last
}

/// The scans of this agent, one at a time, shared by the callers that asked while one ran
/// (`flight`): sixteen stages at once each scanned every process's open files and every
/// namespace's table, several times a stage.
static SCANS: Flight<Result<Found, String>> = Flight::new();

impl Uses {
    /// Reads the mount tables (or takes a read that started after this call), waiting
    /// `within` at most.
    pub fn scan(within: Duration) -> Uses {
        let failed = || Err("the mount tables could not be examined".to_string());
        match SCANS.look(Lead::Detached(within), scan_settled, failed) {
            Some(found) => Uses { found },
            None => Uses::failed_with(format!(
                "the mount tables could not be examined within {} s",
                within.as_secs()
            )),
        }
    }

    fn failed_with(why: String) -> Uses {
        Uses {
            found: Arc::new(Err(why)),
        }
    }

    /// What uses the device `device` (numbers `devnum`), or None when the host shows nothing.
    pub fn of(&self, device: &Path, devnum: DevNum) -> Option<String> {
        match &*self.found {
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

    /// Why the mount tables could not be examined, when they could not (then every device
    /// counts as used).
    pub fn failed(&self) -> Option<&str> {
        self.found.as_ref().as_ref().err().map(String::as_str)
    }

    /// Where a node of the device is bound (a raw use no claim shows), in any namespace; what
    /// went wrong when the tables could not be read (then every device counts as bound).
    pub fn bound(&self, devnum: DevNum) -> Option<String> {
        match &*self.found {
            Err(why) => Some(why.clone()),
            Ok(found) => found.bound.get(&devnum).cloned(),
        }
    }
}

/// The devices stacked on the device (device mapper, md), if any.
fn holders(devnum: DevNum) -> Option<String> {
    // A list that cannot be read counts as a holder: nothing is taken on a read that failed
    // (the agent's files run out).
    let names = match std::fs::read_dir(format!("/sys/dev/block/{devnum}/holders"))
        .and_then(|d| d.collect::<std::io::Result<Vec<_>>>())
    {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Some(format!("(its holders could not be read: {e})")),
    };
    let names: Vec<String> = names
        .into_iter()
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
