//! Point-in-time copies of a volume's file, for snapshots and clones, and the files of volumes
//! created from a source.
//!
//! Consistency: when the source volume's device is mounted (staged), its filesystem is frozen
//! for the copy, which flushes it down into the file and holds writers still, so the copy is a
//! clean image. A device that is attached but not mounted (a raw block volume, or a volume
//! between stage calls) is flushed (fsync of the device: its page cache, then the loop driver's
//! flush of the file) before the copy: with a reflink, which is atomic, that makes a
//! crash-consistent copy; a sparse copy of a block volume that is being written is not atomic
//! and may tear, so quiesce such a workload, or keep the state directory on a reflink
//! filesystem (XFS with reflink, btrfs).
//!
//! Durability: a copy is made under a `.partial` name, synced, then renamed into place, so a
//! file with the final name is always complete; a crash leaves at most a `.partial` file, which
//! the next attempt replaces.

use std::path::{Path, PathBuf};

use ebs_node_core::DevNum;

use ebs_node_core::records::{LoopSource, LoopVolume};

use super::LoopController;
use ebs_node_core::error::{CapacityError, ControllerError, Error, Result};
use ebs_node_host::file_copy::{self, CopyKind};
use ebs_node_host::{freeze, loopdev};

fn partial(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".partial");
    PathBuf::from(p)
}

/// Copies `src` to `dst` through a `.partial` file and a rename; `len` as in `copy_file`.
pub fn copy_into_place(src: &Path, dst: &Path, len: u64) -> Result<CopyKind> {
    let tmp = partial(dst);
    match std::fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(Error::io(format!("removing {}", tmp.display()), e)),
    }
    let kind = file_copy::copy_file(src, &tmp, len).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        let what = format!("copying {} to {}", src.display(), tmp.display());
        // The spec's code for a copy that does not fit: the CO may retry after freeing space.
        if e.kind() == std::io::ErrorKind::StorageFull {
            ControllerError::NoSpace {
                op: what,
                source: e,
            }
            .into()
        } else {
            Error::io(what, e)
        }
    })?;
    std::fs::rename(&tmp, dst)
        .map_err(|e| Error::io(format!("renaming {} into place", tmp.display()), e))?;
    sync_dir(dst)?;
    Ok(kind)
}

/// Makes an empty sparse file of `len` bytes at `dst` the way a copy is made: sized and synced
/// under the `.partial` name, then renamed, so a file with the final name always has its size
/// (a failed sizing used to leave a 0-byte volume that a retry returned as made).
pub fn blank_into_place(dst: &Path, len: u64) -> Result<()> {
    let tmp = partial(dst);
    // A volume image: private whatever the umask (host::private).
    let made = ebs_node_host::private::open_file(
        &tmp,
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true),
    )
    .and_then(|f| {
        f.set_len(len)?;
        f.sync_all()
    });
    if let Err(e) = made {
        let _ = std::fs::remove_file(&tmp);
        let what = format!("making the {len}-byte file {}", dst.display());
        return Err(match e.raw_os_error() {
            // Beyond the largest file the volume directory's filesystem holds.
            Some(libc::EFBIG) | Some(libc::EINVAL) => CapacityError::FileTooLarge {
                op: what,
                source: e,
            }
            .into(),
            Some(libc::ENOSPC) | Some(libc::EDQUOT) => ControllerError::NoSpace {
                op: what,
                source: e,
            }
            .into(),
            _ if e.kind() == std::io::ErrorKind::InvalidInput => CapacityError::FileTooLarge {
                op: what,
                source: e,
            }
            .into(),
            _ => Error::io(what, e),
        });
    }
    std::fs::rename(&tmp, dst)
        .map_err(|e| Error::io(format!("renaming {} into place", tmp.display()), e))?;
    sync_dir(dst)
}

/// Removes what an interrupted or failed making of `file` may have left (its `.partial` file).
pub fn remove_partial(file: &Path) -> Result<()> {
    let tmp = partial(file);
    match std::fs::remove_file(&tmp) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(format!("removing {}", tmp.display()), e)),
    }
}

fn sync_dir(file: &Path) -> Result<()> {
    let dir = file.parent().unwrap_or(Path::new("/"));
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io(format!("syncing {}", dir.display()), e))
}

/// The filesystem on `dev` frozen, if it is mounted: through the first of its mount points whose
/// directory is on the device (a twenty-second fresh review's F1: a mount laid over the first one
/// was frozen instead, and the volume copied live). `Err` when it is mounted and no mount point
/// can be held.
fn freeze_mounted(dev: DevNum) -> Result<Option<freeze::Frozen>> {
    let table = ebs_node_host::mount::at_path::read_table()
        .map_err(|e| Error::io("reading the mount table", e))?;
    let mut why = None;
    for m in table.mounts_of_device(dev.major, dev.minor) {
        match freeze::freeze(&m.mount_point, dev) {
            Ok(frozen) => return Ok(Some(frozen)),
            Err(e) => {
                why.get_or_insert(format!("{}: {e}", m.mount_point.display()));
            }
        }
    }
    match why {
        Some(why) => Err(ControllerError::CannotFreeze {
            device: PathBuf::from(format!("/dev/block/{dev}")),
            why,
        }
        .into()),
        None => Ok(None),
    }
}

/// Every loop device that shows the file's bytes: over the file (at any offset), or laid over
/// one of those. Each one's filesystem is frozen for a copy (a twenty-ninth fresh review's F1:
/// only the first device over the file was asked; a second one mounted and written, an
/// operator's or a node-local handle's acting for the volume, was copied live).
pub(super) fn devices_showing(file: &Path) -> Result<Vec<DevNum>> {
    let (st_dev, st_ino) = super::file_inode(file)
        .map_err(|e| Error::io(format!("volume file {}", file.display()), e))?;
    let scan = |e: &dyn std::fmt::Display| {
        Error::io(
            "listing the loop devices",
            std::io::Error::other(e.to_string()),
        )
    };
    let mut devs: Vec<DevNum> = loopdev::every_view_of_inode(st_dev, st_ino)
        .map_err(|e| scan(&e))?
        .iter()
        .filter_map(|p| ebs_node_host::device::block_devnum(p).ok())
        .collect();
    if devs.is_empty() {
        return Ok(devs);
    }
    let loops = loopdev::overlay::tagged("").map_err(|e| scan(&e))?;
    loop {
        let before = devs.len();
        let over: Vec<DevNum> = (loops.iter())
            .filter(|o| devs.contains(&o.backing))
            .filter_map(|o| ebs_node_host::device::block_devnum(&o.device).ok())
            .collect();
        for n in over {
            if !devs.contains(&n) {
                devs.push(n);
            }
        }
        if devs.len() == before {
            return Ok(devs);
        }
    }
}

impl LoopController {
    /// A consistent copy of `volume`'s file at `dst` (see the module comment). The caller holds
    /// the volume's node guard, so no stage or unstage runs meanwhile.
    pub(super) fn copy_volume(
        &self,
        volume: &LoopVolume,
        dst: &Path,
        len: u64,
    ) -> Result<CopyKind> {
        let devices = devices_showing(&volume.file)?;
        let mut frozen = Vec::new();
        for dev in &devices {
            // A failure thaws what was frozen so far (dropping a `Frozen` thaws it).
            if let Some(f) = freeze_mounted(*dev)? {
                frozen.push(f);
            }
        }
        if frozen.is_empty() {
            for dev in &devices {
                ebs_node_host::device::open_devnum(*dev)
                    .and_then(|f| f.sync_all())
                    .map_err(|e| Error::io(format!("flushing {dev}"), e))?;
            }
        }
        let was_frozen = !frozen.is_empty();
        let frozen_at = (frozen.iter())
            .map(|f| f.path().display().to_string())
            .collect::<Vec<_>>()
            .join(",");
        let copied = copy_into_place(&volume.file, dst, len);
        for f in frozen.into_iter().rev() {
            f.thaw()
                .map_err(|e| Error::io("thawing the filesystem after a snapshot", e))?;
        }
        let kind = copied?;
        tracing::info!(volume = %volume.id, copy = %dst.display(), how = kind.name(),
            frozen = was_frozen, %frozen_at, "copied a volume file");
        Ok(kind)
    }

    /// The source's file and size, as a new volume's first contents.
    pub(super) fn source_file(
        &self,
        source: &LoopSource,
    ) -> Result<(Option<LoopVolume>, PathBuf, u64)> {
        match source {
            LoopSource::Snapshot { id } => {
                let snap = self.store.loop_snapshot(id)?.ok_or_else(|| {
                    Error::from(ControllerError::SourceNotFound {
                        kind: "snapshot",
                        id: id.clone(),
                    })
                })?;
                if !snap.ready {
                    return Err(ControllerError::SourceNotReady {
                        snapshot: id.clone(),
                    }
                    .into());
                }
                Ok((None, snap.file, snap.size_bytes))
            }
            LoopSource::Volume { id } => {
                let v =
                    self.store
                        .loop_volume(id)?
                        .ok_or_else(|| ControllerError::SourceNotFound {
                            kind: "volume",
                            id: id.clone(),
                        })?;
                self.refuse_if_making(id)?;
                let (file, size) = (v.file.clone(), v.capacity_bytes);
                Ok((Some(v), file, size))
            }
        }
    }

    /// Makes the file of a recorded volume, when it is not there yet (the first attempt, or a
    /// retry after a crash between the record and the file): a copy of its source, or an empty
    /// sparse file.
    pub(super) fn materialise(&self, volume: &LoopVolume) -> Result<()> {
        match std::fs::metadata(&volume.file) {
            // An empty file where a blank volume should be: what an earlier agent left when
            // its sizing failed. Nothing is in it; it is made again.
            Ok(m) if m.len() == 0 && volume.content_source.is_none() => {}
            Ok(_) => return Ok(()),
            Err(_) => {}
        }
        match &volume.content_source {
            Some(source) => {
                let (live, file, _) = self.source_file(source)?;
                match live {
                    Some(v) => self.copy_volume(&v, &volume.file, volume.capacity_bytes)?,
                    None => copy_into_place(&file, &volume.file, volume.capacity_bytes)?,
                };
            }
            None => blank_into_place(&volume.file, volume.capacity_bytes)?,
        }
        Ok(())
    }
}
