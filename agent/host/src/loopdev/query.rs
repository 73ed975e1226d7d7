//! What a loop device is bound to: asked of the kernel by device path, by open device, or by
//! the inode of a backing file.

use ebs_node_core::DevNum;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;

use super::{LoopError, LoopInfo64, ioctl_err, loop_name, open, sys};
use crate::flight::{Flight, Lead};

/// The backing file path as the kernel reports it (it may end in
/// " (deleted)" if the file was unlinked). None when not attached.
pub fn backing_file(device: &Path) -> Result<Option<PathBuf>, LoopError> {
    let path = PathBuf::from(format!(
        "/sys/block/{}/loop/backing_file",
        loop_name(device)?
    ));
    match read_backing_file(&path) {
        Ok(file) => Ok(Some(file)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(LoopError::Sysfs { path, source }),
    }
}

/// (st_dev, st_ino) of the backing file, comparable with `MetadataExt::dev()`
/// and `ino()`. None when the device is not attached.
pub fn backing_inode(device: &Path) -> Result<Option<(u64, u64)>, LoopError> {
    let dev = open(device, false)?;
    status_inode(&dev).map_err(ioctl_err("LOOP_GET_STATUS64", device))
}

/// (st_dev, st_ino) of the backing file of the loop device open as `dev`: asked of the very
/// device the caller holds, not of whatever a path names now.
pub fn backing_inode_of(dev: &File) -> io::Result<Option<(u64, u64)>> {
    backing_of(dev).map(|b| b.map(|(inode, _)| inode))
}

/// (st_dev, st_ino) of the backing file of the loop device open as `dev`, and the offset in that
/// file at which the device starts.
pub fn backing_of(dev: &File) -> io::Result<Option<((u64, u64), u64)>> {
    status(dev)
        .map(|i| i.map(|i| ((i.lo_device, i.lo_inode), i.lo_offset)))
        .map_err(io::Error::from)
}

/// How many bytes of its file the loop device open as `dev` shows (`losetup --sizelimit`); 0:
/// up to the file's end.
pub fn size_limit_of(dev: &File) -> io::Result<u64> {
    status(dev)
        .map(|i| i.map_or(0, |i| i.lo_sizelimit))
        .map_err(io::Error::from)
}

fn status_inode(dev: &File) -> Result<Option<(u64, u64)>, Errno> {
    status(dev).map(|i| i.map(|i| (i.lo_device, i.lo_inode)))
}

pub(super) fn status(dev: &File) -> Result<Option<LoopInfo64>, Errno> {
    let mut info = LoopInfo64::zeroed();
    // SAFETY: dev is an open fd; &mut info is a valid, writable loop_info64 that outlives the
    // call.
    match unsafe { sys::loop_get_status64(dev.as_raw_fd(), &mut info) } {
        Ok(_) => Ok(Some(info)),
        Err(Errno::ENXIO) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Whether the block device at `dev` is read-only, from sysfs (`None`: it cannot be told).
pub fn read_only(dev: &Path) -> Option<bool> {
    let name = dev.file_name()?.to_str()?;
    let ro = std::fs::read_to_string(format!("/sys/block/{name}/ro")).ok()?;
    Some(ro.trim() == "1")
}

/// The backing file's path as sysfs shows it for a device number (for messages only: the inode
/// from `backing_inode_of` is what identifies).
pub fn backing_file_by_devnum(devnum: DevNum) -> Option<PathBuf> {
    read_backing_file(Path::new(&format!(
        "/sys/dev/block/{}/loop/backing_file",
        devnum
    )))
    .ok()
}

/// A sysfs `loop/backing_file`, without its newline.
fn read_backing_file(path: &Path) -> io::Result<PathBuf> {
    let mut bytes = std::fs::read(path)?;
    if bytes.last() == Some(&b'\n') {
        bytes.pop();
    }
    Ok(PathBuf::from(std::ffi::OsString::from_vec(bytes)))
}

/// Finds the loop device backed by the given inode, e.g. to re-adopt a device
/// after an agent restart even if the backing file was renamed.
pub fn find_by_backing_inode(dev: u64, ino: u64) -> Result<Option<PathBuf>, LoopError> {
    Ok(all_by_backing_inode(dev, ino, true)?.into_iter().next())
}

/// Every loop device over the whole file with this inode (no offset, no size limit), by number.
pub fn all_over_inode(dev: u64, ino: u64) -> Result<Vec<PathBuf>, LoopError> {
    all_by_backing_inode(dev, ino, false)
}

/// Every loop device over the file with this inode, shifted or cut views included: each shows
/// some of the file's bytes.
pub fn every_view_of_inode(dev: u64, ino: u64) -> Result<Vec<PathBuf>, LoopError> {
    views_of_inode(dev, ino, false, false)
}

fn all_by_backing_inode(dev: u64, ino: u64, first: bool) -> Result<Vec<PathBuf>, LoopError> {
    views_of_inode(dev, ino, first, true)
}

fn views_of_inode(
    dev: u64,
    ino: u64,
    first: bool,
    whole_only: bool,
) -> Result<Vec<PathBuf>, LoopError> {
    let over = |info: &LoopInfo64| {
        // A device that starts past the file's first byte is a shifted view, never the file's
        // device: an operator's `losetup -o`, not one to adopt. Nor one cut short (`losetup
        // --sizelimit`): a stage would make a filesystem the size of the cut, not of the volume.
        (info.lo_device, info.lo_inode) == (dev, ino)
            && !(whole_only && (info.lo_offset != 0 || info.lo_sizelimit != 0))
    };
    if first {
        // The first match ends the walk: this caller's own.
        let mut found = None;
        walk(&mut |device, info| {
            let hit = over(info);
            if hit {
                found = Some(device.to_path_buf());
            }
            hit
        })?;
        return Ok(found.into_iter().collect());
    }
    // Every match: a whole walk, shared with the callers asking at once (`flight`).
    let failed = || Err("the loop devices could not be walked".to_string());
    let walked = WALKS
        .look(Lead::Inline, walk_all, failed)
        .ok_or_else(|| "the loop devices could not be walked".to_string())
        .and_then(|w| match &*w {
            Ok(all) => Ok(all
                .iter()
                .filter(|(_, info)| over(info))
                .map(|(device, _)| device.clone())
                .collect()),
            Err(why) => Err(why.clone()),
        });
    walked.map_err(|why| LoopError::Sysfs {
        path: PathBuf::from("/sys/block"),
        source: io::Error::other(why),
    })
}

type Walked = Result<Vec<(PathBuf, LoopInfo64)>, String>;

static WALKS: Flight<Walked> = Flight::new();

fn walk_all() -> Walked {
    let mut all = Vec::new();
    walk(&mut |device, info| {
        all.push((device.to_path_buf(), *info));
        false
    })
    .map_err(|e| e.to_string())?;
    Ok(all)
}

/// Every attached loop device in number order, with its status, until `stop` says so. One open
/// and one LOOP_GET_STATUS64 an attached device: its backing inode, offset and size limit at
/// once (one detached meanwhile answers ENXIO). The sysfs reads this replaced (whether attached, offset,
/// size limit, then the ioctl) were a fifth of the agent's time in the bench at 128 loop
/// volumes.
fn walk(stop: &mut dyn FnMut(&Path, &LoopInfo64) -> bool) -> Result<(), LoopError> {
    let sys_block = Path::new("/sys/block");
    let entries = std::fs::read_dir(sys_block).map_err(|source| LoopError::Sysfs {
        path: sys_block.to_path_buf(),
        source,
    })?;
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with("loop"))
        .collect();
    names.sort_by_key(|n| n[4..].parse::<u64>().unwrap_or(u64::MAX));
    for name in names {
        // An unattached device has no loop/ directory: passed over without an open.
        if !sys_block.join(&name).join("loop").exists() {
            continue;
        }
        let device = PathBuf::from(format!("/dev/{name}"));
        let status = match open(&device, false) {
            Ok(dev) => status(&dev).map_err(ioctl_err("LOOP_GET_STATUS64", &device))?,
            // No /dev node (container): the sysfs attributes and a stat of the backing file.
            Err(LoopError::Open { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
                sysfs_status(sys_block, &name, &device)?
            }
            // Gone between the listing and the open.
            Err(LoopError::Open { .. }) => None,
            Err(e) => return Err(e),
        };
        if let Some(info) = status
            && stop(&device, &info)
        {
            break;
        }
    }
    Ok(())
}

/// Where a loop device has no /dev node (a container's /dev): its offset and size limit from
/// sysfs, and its backing file's inode from a stat of the path sysfs names. None when it is not
/// attached.
fn sysfs_status(
    sys_block: &Path,
    name: &str,
    device: &Path,
) -> Result<Option<LoopInfo64>, LoopError> {
    let attr = |a: &str| {
        std::fs::read_to_string(sys_block.join(name).join("loop").join(a))
            .ok()
            .and_then(|o| o.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    let Some(meta) = backing_file(device)?.and_then(|p| std::fs::metadata(p).ok()) else {
        return Ok(None);
    };
    let mut info = LoopInfo64::zeroed();
    info.lo_device = meta.dev();
    info.lo_inode = meta.ino();
    info.lo_offset = attr("offset");
    info.lo_sizelimit = attr("sizelimit");
    Ok(Some(info))
}
