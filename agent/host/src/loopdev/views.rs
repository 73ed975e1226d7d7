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

fn scan() -> io::Result<Vec<Loop>> {
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
    let loops = scan()?;
    let mut seen = BTreeSet::from([devnum]);
    let mut queue = vec![devnum];
    while let Some(d) = queue.pop() {
        let mut next: Vec<DevNum> = loops
            .iter()
            .filter(|l| l.over_device == d)
            .map(|l| l.devnum)
            .collect();
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
        return Some(format!("its device node is bound at {at}"));
    }
    let holders = format!("/sys/dev/block/{d}/holders");
    std::fs::read_dir(holders)
        .ok()
        .and_then(|mut it| it.next())
        .and_then(|e| e.ok())
        .map(|h| format!("held by {}", h.file_name().to_string_lossy()))
}

/// Claims each of `views` exclusively, so nothing mounts them while the call runs; EBUSY names
/// the one in use.
pub fn hold(views: &[DevNum]) -> io::Result<Vec<File>> {
    views
        .iter()
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
