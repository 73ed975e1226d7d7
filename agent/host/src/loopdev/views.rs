//! Every other device that shows some of a device's bytes (the core's `HostOps::views_of`): the
//! loop devices over the same file (at any offset), the loop devices laid over it or over any of
//! those, and the device a loop device is laid over; closed under the same steps. A mount, a
//! claim, a device-node bind or a holder of any of them is a use of the same bytes, which no check
//! of the device itself sees (a twenty-fourth and a twenty-fifth fresh review's F1 to F4: the
//! same filesystem mounted twice read-write, a writable raw device under a mounted filesystem).
//! One scan of the loop devices; nothing more when the device has no other view.

use std::collections::BTreeSet;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use ebs_node_core::DevNum;
use ebs_node_core::node::host::View;

use super::overlay::decode_dev;
use super::query;

/// At most this many views are followed (a loop device over a loop device over ... ).
const MOST: usize = 64;

struct Loop {
    devnum: DevNum,
    /// The block device it is laid over ((0, 0): a file).
    over_device: DevNum,
    /// Its backing file (st_dev, st_ino) when that is a file.
    over_file: Option<(u64, u64)>,
    name: String,
}

/// Loop devices whose status did not come within `WITHIN` once (LOOP_GET_STATUS64 stats the
/// backing file: one on a stopped FUSE daemon or a dead NFS server hangs, and every stage with
/// it, a twenty-sixth fresh review's F2). Skipped from then on: a file on such a filesystem has
/// another st_dev than any volume's file, so it is no view by inode, and it lies over no device.
static HUNG: Mutex<BTreeSet<DevNum>> = Mutex::new(BTreeSet::new());
const WITHIN: Duration = Duration::from_secs(2);

/// `scan` on a thread of its own, waited for `WITHIN` at most; a device that keeps it past
/// that joins `HUNG` and the scan starts again without it.
fn scan_bounded() -> io::Result<Vec<Loop>> {
    for _ in 0..4 {
        let skip = HUNG.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let current = Arc::new(Mutex::new(None));
        let (tx, rx) = mpsc::channel();
        let at = Arc::clone(&current);
        std::thread::Builder::new()
            .name("loop-views".into())
            .spawn(move || {
                let _ = tx.send(scan(&skip, &at));
            })?;
        match rx.recv_timeout(WITHIN) {
            Ok(found) => return found,
            Err(_) => {
                let stuck = *current.lock().unwrap_or_else(|p| p.into_inner());
                let Some(stuck) = stuck else { break };
                tracing::warn!(device = %stuck, "a loop device's status did not come within 2 s (its backing file hangs?); it is left out of the search for other devices showing a volume's bytes");
                HUNG.lock().unwrap_or_else(|p| p.into_inner()).insert(stuck);
            }
        }
    }
    Err(io::Error::new(
        io::ErrorKind::TimedOut,
        "the loop devices' status could not be read within the time allowed",
    ))
}

fn scan(skip: &BTreeSet<DevNum>, current: &Mutex<Option<DevNum>>) -> io::Result<Vec<Loop>> {
    let sys_block = Path::new("/sys/block");
    let mut found = Vec::new();
    for entry in std::fs::read_dir(sys_block)?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("loop") || !entry.path().join("loop").exists() {
            continue;
        }
        let Some(devnum) = std::fs::read_to_string(entry.path().join("dev"))
            .ok()
            .and_then(|s| DevNum::parse(s.trim()))
        else {
            continue;
        };
        if skip.contains(&devnum) {
            continue;
        }
        *current.lock().unwrap_or_else(|p| p.into_inner()) = Some(devnum);
        // Detached in between: not a view.
        let Ok(dev) = crate::device::open_devnum(devnum) else {
            continue;
        };
        let Ok(Some(info)) = query::status(&dev) else {
            continue;
        };
        let over_device = decode_dev(info.lo_rdevice);
        let name = info
            .lo_file_name
            .split(|b| *b == 0)
            .next()
            .unwrap_or_default();
        found.push(Loop {
            devnum,
            over_device,
            over_file: (info.lo_rdevice == 0).then_some((info.lo_device, info.lo_inode)),
            name: String::from_utf8_lossy(name).into_owned(),
        });
    }
    Ok(found)
}

/// The other views of `devnum`, each with its loop name and what uses it (`None`: nothing the
/// host shows).
pub fn views_of(devnum: DevNum) -> io::Result<Vec<View>> {
    let loops = scan_bounded()?;
    let mut seen = BTreeSet::from([devnum]);
    let mut queue = vec![devnum];
    while let Some(d) = queue.pop() {
        let mut next: Vec<DevNum> = loops
            .iter()
            .filter(|l| l.over_device == d)
            .map(|l| l.devnum)
            .collect();
        // A partition shows part of its disk's bytes, a disk all of its partitions': a loop
        // device laid over a partition of a view, or a bind of its node, uses the same bytes (a
        // twenty-sixth fresh review's F1). The disk's other partitions come along (as the
        // node-local door's disk family does): never the same bytes, but never taken apart.
        next.extend(disk_relatives(d));
        if let Some(l) = loops.iter().find(|l| l.devnum == d) {
            if l.over_device != DevNum::new(0, 0) {
                next.push(l.over_device);
            }
            if let Some(file) = l.over_file {
                next.extend(
                    (loops.iter())
                        .filter(|m| m.over_file == Some(file))
                        .map(|m| m.devnum),
                );
            }
        }
        for n in next {
            if seen.len() < MOST && seen.insert(n) {
                queue.push(n);
            }
        }
    }
    seen.remove(&devnum);
    if seen.is_empty() {
        return Ok(Vec::new());
    }
    let binds = crate::device_binds::Uses::scan(crate::device_binds::WITHIN);
    Ok(seen
        .into_iter()
        .map(|d| View {
            devnum: d,
            name: (loops.iter().find(|l| l.devnum == d))
                .map(|l| l.name.clone())
                .unwrap_or_default(),
            in_use: use_of(d, &binds),
        })
        .collect())
}

fn use_of(d: DevNum, binds: &crate::device_binds::Uses) -> Option<String> {
    if crate::device::still_claimed(d) {
        return Some("mounted or claimed exclusively".into());
    }
    if let Some(at) = binds.bound(d) {
        return Some(format!("its device node is {at}"));
    }
    let holders = format!("/sys/dev/block/{d}/holders");
    std::fs::read_dir(holders)
        .ok()
        .and_then(|mut it| it.next())
        .and_then(|e| e.ok())
        .map(|h| format!("held by {}", h.file_name().to_string_lossy()))
}

/// The whole disk of a partition, or the partitions of a whole disk, from sysfs.
fn disk_relatives(d: DevNum) -> Vec<DevNum> {
    let Ok(dir) = std::fs::canonicalize(format!("/sys/dev/block/{d}")) else {
        return Vec::new();
    };
    let read_dev = |p: &Path| {
        std::fs::read_to_string(p.join("dev"))
            .ok()
            .and_then(|s| DevNum::parse(s.trim()))
    };
    if dir.join("partition").exists() {
        return dir.parent().and_then(read_dev).into_iter().collect();
    }
    std::fs::read_dir(&dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().join("partition").exists())
        .filter_map(|e| read_dev(&e.path()))
        .collect()
}

/// Claims each of `device`'s `views` exclusively, so nothing mounts them while the call runs;
/// EBUSY names the one in use.
pub fn hold(device: DevNum, views: &[DevNum]) -> io::Result<Vec<File>> {
    let whole = disk_relatives(device);
    let is_partition =
        std::fs::exists(format!("/sys/dev/block/{device}/partition")).unwrap_or(false);
    views
        .iter()
        // The whole disk of a partition: held, it keeps the partition from being claimed.
        .filter(|d| !(is_partition && whole.contains(d)))
        .map(|d| {
            let dev = crate::device::open_devnum(*d)?;
            std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_EXCL)
                .open(format!("/proc/self/fd/{}", dev.as_raw_fd()))
                .map_err(|e| io::Error::new(e.kind(), format!("{d}: {e}")))
        })
        .collect()
}
