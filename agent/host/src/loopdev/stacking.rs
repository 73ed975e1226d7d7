//! What a device's bytes come from and what is built on them, one level each way (the core's
//! `HostOps::lies_on` and `built_on`): a loop device's block backing (`lo_rdevice`), the device
//! whose filesystem holds its backing file (`lo_device`), and sysfs's `slaves` and `holders`
//! (device-mapper, md). The core walks the levels. Each answer costs a few syscalls, never a
//! scan of every loop device (about 10 µs a device here).

use std::io;
use std::path::Path;

use ebs_node_core::DevNum;
use ebs_node_core::node::host::Under;
use nix::errno::Errno;

use super::backing_fs::{BackingFs, backing_fs_of_loop, devices_under};
use super::overlay::decode_dev;
use super::{LOOP_MAJOR, query};

/// The levels under `devnum`.
pub fn lies_on(devnum: DevNum) -> io::Result<Vec<Under>> {
    let mut out: Vec<Under> = linked(devnum, "slaves")?
        .into_iter()
        .map(Under::Device)
        .collect();
    let Some((rdevice, fs_dev, pair)) = backing(devnum)? else {
        return Ok(out);
    };
    if rdevice != DevNum::new(0, 0) {
        out.push(Under::Device(rdevice));
        return Ok(out);
    }
    // An anonymous filesystem (tmpfs, overlayfs, FUSE, NFS) has no device of its own: it is
    // believed only where it shows nothing but its own files.
    if fs_dev.major != 0 {
        out.push(Under::Device(fs_dev));
    } else {
        match backing_fs_of_loop(devnum, pair.0, pair.1)? {
            // btrfs, bcachefs and ZFS sit on block devices yet show an anonymous number: the
            // devices under them are found from the file's mount (a seventeenth fresh review's
            // F1: a loop device over a file in a btrfs on another volume's device).
            BackingFs::OwnsItsInodes => match devices_under(devnum, pair.0, pair.1) {
                Ok(devices) => out.extend(devices.into_iter().map(Under::Device)),
                Err(why) => out.push(Under::Unknown(format!(
                    "backing file lies on a filesystem whose devices cannot be told: {why}"
                ))),
            },
            BackingFs::MayShowAnothers(t) => out.push(Under::Unknown(format!(
                "backing file lies on {t}, which may show another filesystem's file (a \
                 volume's included) under a name of its own"
            ))),
            BackingFs::NotMountedHere(d) => out.push(Under::Unknown(format!(
                "backing file lies on a filesystem ({d}) this mount namespace does not show"
            ))),
        }
    }
    Ok(out)
}

/// The devices built on `devnum` that sysfs links to it: its `holders` (device-mapper, md). A
/// loop device laid over it is no holder; the core finds those from the other side.
pub fn built_on(devnum: DevNum) -> io::Result<Vec<DevNum>> {
    linked(devnum, "holders")
}

/// A loop device's backing file as (st_dev, st_ino); `None`: not a loop device bound to a file.
pub fn loop_backing(devnum: DevNum) -> Option<(u64, u64)> {
    if devnum.major != LOOP_MAJOR {
        return None;
    }
    let dev = crate::device::open_devnum(devnum).ok()?;
    match query::status(&dev) {
        Ok(Some(info)) if info.lo_rdevice == 0 => Some((info.lo_device, info.lo_inode)),
        _ => None,
    }
}

/// The other loop devices over the same file as `devnum` (an operator's second `losetup` of it,
/// another agent's attachment): the same bytes under other numbers, whose mounts and claims no
/// check of `devnum` itself sees (a twenty-fourth fresh review's F1: a handle staged a loop
/// device while its sibling was mounted read-write, and the filesystem was mounted twice).
/// Empty for anything but a file-backed loop device. From the walk of the loop devices the
/// views check takes (`views::siblings_of`), shared with the calls asking at once; one whose
/// status does not come counts as a sibling.
pub fn siblings(devnum: DevNum) -> io::Result<Vec<DevNum>> {
    if devnum.major != LOOP_MAJOR {
        return Ok(Vec::new());
    }
    super::views::siblings_of(devnum)
}

/// A bound loop device's block backing and its backing file's filesystem; `None`: not a loop
/// device, or not bound (or gone meanwhile).
#[allow(clippy::type_complexity)] // three plain values: block backing, file's fs, file's pair
fn backing(devnum: DevNum) -> io::Result<Option<(DevNum, DevNum, (u64, u64))>> {
    if devnum.major != LOOP_MAJOR {
        return Ok(None);
    }
    let dev = match crate::device::open_devnum(devnum) {
        Ok(dev) => dev,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    match query::status(&dev) {
        Ok(Some(info)) => Ok(Some((
            decode_dev(info.lo_rdevice),
            decode_dev(info.lo_device),
            (info.lo_device, info.lo_inode),
        ))),
        Ok(None) | Err(Errno::ENXIO) => Ok(None),
        Err(e) => Err(io::Error::from(e)),
    }
}

/// The devices a sysfs link directory (`slaves`, `holders`) of `devnum` names.
fn linked(devnum: DevNum, what: &str) -> io::Result<Vec<DevNum>> {
    let dir = format!("/sys/dev/block/{devnum}/{what}");
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for e in entries.flatten() {
        if let Some(d) = read_dev(&e.path().join("dev"))? {
            out.push(d);
        }
    }
    Ok(out)
}

/// A sysfs `dev` file; `None`: gone meanwhile.
fn read_dev(path: &Path) -> io::Result<Option<DevNum>> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(DevNum::parse(&text)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// A loop device's backing file, reached by the name sysfs gives and believed only when it is
/// the very inode the device reports: its path and its metadata. `None` otherwise.
fn verified_backing_file(devnum: DevNum) -> Option<(std::path::PathBuf, std::fs::Metadata)> {
    use std::os::unix::fs::MetadataExt;
    let backing = loop_backing(devnum)?;
    let path = query::backing_file_by_devnum(devnum)?;
    let meta = std::fs::metadata(&path).ok()?;
    ((meta.dev(), meta.ino()) == backing).then_some((path, meta))
}

/// What a loop device's backing file says of who made the device (the core's `LoopOrigin`
/// without the name): the agent state directory it lies in (the file is `volumes/<f>` or
/// `snapshots/<f>` of a directory holding `state.redb` or `instance-id`; unlike the device's
/// name, a workload holding the device cannot change this), and how many names the file has.
/// Both from one verified read of the file (`verified_backing_file`).
pub fn backing_signs(devnum: DevNum) -> (Option<ebs_node_core::node::host::Place>, u64) {
    use std::os::unix::fs::MetadataExt;
    let Some((path, meta)) = verified_backing_file(devnum) else {
        return (None, 0);
    };
    (agent_state_dir(&path), meta.nlink())
}

fn agent_state_dir(path: &Path) -> Option<ebs_node_core::node::host::Place> {
    let dir = path.parent()?;
    if !matches!(dir.file_name()?.to_str()?, "volumes" | "snapshots") {
        return None;
    }
    let state = dir.parent()?;
    let marked = ["state.redb", "instance-id"]
        .iter()
        .any(|f| state.join(f).is_file());
    if !marked {
        return None;
    }
    crate::anchor::place_of(state).ok()
}
