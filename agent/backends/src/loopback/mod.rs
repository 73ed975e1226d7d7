//! The loop backend: volumes are sparse files under the state directory, attached as loop devices
//! through the loop ioctls. It serves its own controller, so the whole CSI lifecycle runs on one
//! Linux machine with real block devices.

mod attach;
mod controller;
mod copies;
mod in_use;
mod naming;
mod paging;
mod resize;
mod snapshots;
pub mod stacked;

use ebs_node_core::DevNum;
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use ebs_node_core::records::{DeviceIdentity, LoopVolume};
use ebs_store::Store;

pub use controller::{CreateVolume, LoopController};
pub use paging::Page;
pub use snapshots::SnapshotQuery;

use ebs_node_core::error::{Error, Result};
use ebs_node_core::node::backend::{Backend, NotProven, ResolvedDevice, Shown};
use ebs_node_core::request::VolumeId;
use ebs_node_core::seam::BackingFile;
use ebs_node_host::loopdev;

/// The topology key of the loop backend: its volumes live on this host only.
pub const TOPOLOGY_KEY: &str = "loop.ebs-node-agent.io/node";

pub struct LoopBackend {
    store: Arc<Store>,
    /// Where volume files live: `<state>/volumes/<id>.img`, also when the records are lost.
    volumes_dir: PathBuf,
}

impl LoopBackend {
    pub fn new(store: Arc<Store>, state_dir: &Path) -> Self {
        LoopBackend {
            store,
            volumes_dir: state_dir.join("volumes"),
        }
    }

    fn volume(&self, id: &VolumeId) -> Result<LoopVolume> {
        self.store
            .loop_volume(id.as_str())?
            .ok_or_else(|| Error::VolumeNotFound(id.to_string()))
    }
}

/// The identity of a volume file now: its path and inode.
pub fn file_identity(file: &Path) -> std::io::Result<DeviceIdentity> {
    let (st_dev, st_ino) = file_inode(file)?;
    Ok(DeviceIdentity::LoopFile {
        file: file.to_path_buf(),
        st_dev,
        st_ino,
    })
}

/// The (st_dev, st_ino) that identify a volume file, whatever path reaches it: what a loop
/// device's LOOP_GET_STATUS64 reports for its backing file.
pub fn file_inode(file: &Path) -> std::io::Result<(u64, u64)> {
    let meta = std::fs::metadata(file)?;
    Ok((meta.dev(), meta.ino()))
}

fn backing_matches(device: &Path, st_dev: u64, st_ino: u64) -> std::result::Result<(), String> {
    let what = device.display();
    if backing_of(loopdev::backing_inode(device), &what)? == (st_dev, st_ino) {
        Ok(())
    } else {
        Err(format!(
            "{what} is backed by another file than the volume's"
        ))
    }
}

/// The loop device backed by the volume's file, found by the file's inode (in `identity`).
fn find_by_file(
    volume: &VolumeId,
    file: &Path,
    (st_dev, st_ino): (u64, u64),
    identity: DeviceIdentity,
) -> Result<ResolvedDevice> {
    match loopdev::find_by_backing_inode(st_dev, st_ino) {
        Ok(Some(path)) => Ok(ResolvedDevice { path, identity }),
        Ok(None) => Err(Error::NotAttached {
            volume: volume.to_string(),
            file: file.to_path_buf(),
        }),
        Err(e) => Err(Error::LoopDevice {
            op: "scanning loop devices".into(),
            source: Box::new(e),
        }),
    }
}

/// The loop device with these numbers, opened.
fn open_loop(devnum: DevNum) -> std::result::Result<File, String> {
    if devnum.major != loopdev::LOOP_MAJOR {
        return Err(format!("device {} is not a loop device", devnum));
    }
    ebs_node_host::device::open_devnum(devnum).map_err(|e| format!("device {}: {e}", devnum))
}

/// Whether the loop device open as `dev` is backed by the file `identity` names: one ioctl on
/// the open device; the backing file's path is read only to explain a mismatch.
fn is_loop_of(
    dev: &File,
    devnum: DevNum,
    identity: &DeviceIdentity,
) -> std::result::Result<(), NotProven> {
    let DeviceIdentity::LoopFile { st_dev, st_ino, .. } = identity else {
        return Err(NotProven::Other(format!(
            "device {} is a loop device, not {}",
            devnum,
            ebs_node_core::node::backend::describe_identity(identity)
        )));
    };
    if loop_backing(dev, devnum).map_err(NotProven::Unknown)? == (*st_dev, *st_ino) {
        return Ok(());
    }
    Err(NotProven::Other(format!(
        "device {} is loop volume file {}, not {}",
        devnum,
        loopdev::backing_file_by_devnum(devnum)
            .unwrap_or_default()
            .display(),
        ebs_node_core::node::backend::describe_identity(identity)
    )))
}

/// The (st_dev, st_ino) of the file behind a loop device (`what`, in messages), from a query.
fn backing_of(
    found: std::result::Result<Option<(u64, u64)>, impl std::fmt::Display>,
    what: &dyn std::fmt::Display,
) -> std::result::Result<(u64, u64), String> {
    match found {
        Ok(Some(inode)) => Ok(inode),
        Ok(None) => Err(format!("{what} is not attached to any file")),
        Err(e) => Err(format!("cannot read the backing file of {what}: {e}")),
    }
}

/// The backing inode of the loop device open as `dev`, asked of that very device.
/// A loop device that starts past the file's first byte (`losetup -o`) is a shifted view of
/// the volume, never the volume: what a stage wrote there would land amid its bytes. One that
/// ends before the file's end (`--sizelimit`) is a cut view: a stage would make a filesystem
/// the size of the cut (a fifteenth fresh review's F3).
fn loop_backing(dev: &File, devnum: DevNum) -> std::result::Result<(u64, u64), String> {
    let what = format_args!("loop device {}", devnum);
    match loopdev::backing_of(dev) {
        Ok(Some((_, offset))) if offset != 0 => Err(format!(
            "{what} starts at byte {offset} of its file: a shifted view, not the volume"
        )),
        Ok(Some(_)) if loopdev::size_limit_of(dev).map_or(true, |l| l != 0) => Err(format!(
            "{what} shows only part of its file (a size limit): a cut view, not the volume"
        )),
        found => backing_of(found.map(|b| b.map(|(inode, _)| inode)), &what),
    }
}

impl Backend for LoopBackend {
    fn resolve(
        &self,
        volume: &VolumeId,
        publish_context: &HashMap<String, String>,
        _volume_context: &HashMap<String, String>,
        _deadline: Instant,
    ) -> Result<ResolvedDevice> {
        let record = self.volume(volume)?;
        let (st_dev, st_ino) = file_inode(&record.file)
            .map_err(|e| Error::io(format!("volume file {}", record.file.display()), e))?;
        let identity = DeviceIdentity::LoopFile {
            file: record.file.clone(),
            st_dev,
            st_ino,
        };
        let given = publish_context.get("devicePath").map(PathBuf::from);
        if let Some(path) = &given {
            match ebs_node_host::device::block_devnum(path) {
                Ok(_) => {}
                // A reboot renumbers loop devices, so the devicePath a CO kept from before can
                // name nothing now: the backing file still says which device is the volume's.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    tracing::warn!(volume = %volume, device = %path.display(),
                        "publish_context devicePath does not exist (loop devices renumbered?); \
                         looking the volume up by its file");
                    return find_by_file(volume, &record.file, (st_dev, st_ino), identity);
                }
                Err(e) => {
                    return Err(Error::WrongDevice {
                        volume: volume.to_string(),
                        device: path.clone(),
                        reason: e.to_string(),
                    });
                }
            }
            match backing_matches(path, st_dev, st_ino) {
                Ok(()) => {
                    return Ok(ResolvedDevice {
                        path: path.clone(),
                        identity,
                    });
                }
                Err(why) => tracing::warn!(volume = %volume, device = %path.display(), %why,
                    "publish_context devicePath does not hold the volume; looking it up by its file"),
            }
        }
        find_by_file(volume, &record.file, (st_dev, st_ino), identity)
    }

    fn identify(&self, devnum: DevNum) -> std::result::Result<DeviceIdentity, NotProven> {
        let dev = open_loop(devnum).map_err(NotProven::Unknown)?;
        let (st_dev, st_ino) = loop_backing(&dev, devnum).map_err(NotProven::Unknown)?;
        // A pair that may not name one file matches no volume whoever's file it is.
        let own = file_inode(&self.volumes_dir).ok().map(|(d, _)| d);
        stacked::believable(devnum, (st_dev, st_ino), own).map_err(NotProven::Unknown)?;
        Ok(DeviceIdentity::LoopFile {
            file: loopdev::backing_file_by_devnum(devnum).unwrap_or_default(),
            st_dev,
            st_ino,
        })
    }

    /// Asked of the open device (opened here when only its numbers or path are given, and then
    /// handed back).
    fn prove(
        &self,
        device: Shown<'_>,
        identity: &DeviceIdentity,
    ) -> std::result::Result<Option<File>, NotProven> {
        if let Shown::Held(dev, devnum) = device {
            return is_loop_of(dev, devnum, identity).map(|()| None);
        }
        let devnum = device.devnum()?;
        let dev = open_loop(devnum).map_err(NotProven::Unknown)?;
        is_loop_of(&dev, devnum, identity)?;
        Ok(Some(dev))
    }

    fn volume_of(&self, identity: &DeviceIdentity) -> Option<String> {
        let DeviceIdentity::LoopFile {
            st_dev,
            st_ino,
            file,
        } = identity
        else {
            return None;
        };
        // A record that cannot be read counts as no volume: the node-local door's other checks
        // still stand, and an unreadable store fails the stage's own reads anyway.
        let is = |f: &Path| file_inode(f).ok() == Some((*st_dev, *st_ino));
        let partial = |f: &Path| is(&f.with_extension("img.partial"));
        let volumes = self.store.loop_volumes().ok()?;
        if let Some(v) = volumes.iter().find(|v| is(&v.file)) {
            return Some(v.id.clone());
        }
        // The agent's other files are nobody's volume, so no handle acts for them: a copy still
        // being made (`.partial`, renamed into place when whole), a snapshot (a restore would
        // bring back what a handle wrote), the state file, anything in the state directory.
        if let Some(v) = volumes.iter().find(|v| partial(&v.file)) {
            return Some(format!("(volume {} being made)", v.id));
        }
        if let Some(s) = self
            .store
            .loop_snapshots()
            .ok()?
            .into_iter()
            .find(|s| is(&s.file) || partial(&s.file))
        {
            return Some(format!("(snapshot {})", s.id));
        }
        if is(self.store.path()) {
            return Some("(the agent's state file)".into());
        }
        let state_dir = self.volumes_dir.parent().unwrap_or(&self.volumes_dir);
        // By inode, not by name: a hard link of a volume's file made elsewhere (the records of
        // it lost to `recover --reset`) is still the agent's file.
        if let Some(found) = inode_in_tree(state_dir, (*st_dev, *st_ino), 3) {
            return Some(format!("(a file of the agent's: {})", found.display()));
        }
        let recorded = file.to_string_lossy();
        let recorded = Path::new(recorded.trim_end_matches(" (deleted)"));
        let in_state_dir = recorded.starts_with(state_dir)
            || std::fs::canonicalize(state_dir).is_ok_and(|d| recorded.starts_with(d));
        in_state_dir.then(|| format!("(a file of the agent's: {})", recorded.display()))
    }

    fn expected_identity(&self, volume: &VolumeId) -> Option<DeviceIdentity> {
        let file = match self.store.loop_volume(volume.as_str()) {
            Ok(Some(v)) => v.file,
            // A loop volume's id is one file name; a node-local handle names no file of ours.
            _ if volume.is_local() => return None,
            _ => self
                .volumes_dir
                .join(format!("{}.img", volume.file_name()?)),
        };
        file_identity(&file).ok()
    }

    /// The file the device is bound to, opened by the volume's path (or sysfs's) and kept only if
    /// its inode is the one LOOP_GET_STATUS64 reports for the held device.
    fn backing_file(
        &self,
        dev: &File,
        devnum: DevNum,
        identity: &DeviceIdentity,
    ) -> std::result::Result<Option<BackingFile>, String> {
        let what = format_args!("loop device {}", devnum);
        let (inode, offset) = match loopdev::backing_of(dev) {
            Ok(Some(found)) => found,
            Ok(None) => return Err(format!("{what} is not attached to any file")),
            Err(e) => return Err(format!("cannot read the backing file of {what}: {e}")),
        };
        let recorded = match identity {
            DeviceIdentity::LoopFile { file, .. } => Some(file.clone()),
            _ => None,
        };
        for path in recorded
            .into_iter()
            .chain(loopdev::backing_file_by_devnum(devnum))
        {
            let Ok(file) = File::options()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&path)
            else {
                continue;
            };
            if let Ok(meta) = file.metadata()
                && (meta.dev(), meta.ino()) == inode
            {
                return Ok(Some(BackingFile { file, offset }));
            }
        }
        Err(format!(
            "the file bound to {what} cannot be opened to prove the device blank"
        ))
    }

    fn refresh_size(&self, device: &Path) -> Result<()> {
        loopdev::set_capacity(device).map_err(|e| Error::LoopDevice {
            op: format!("LOOP_SET_CAPACITY on {}", device.display()),
            source: Box::new(e),
        })
    }

    fn exists(&self, volume: &VolumeId) -> Result<Option<bool>> {
        Ok(Some(self.store.loop_volume(volume.as_str())?.is_some()))
    }

    /// The volume file is sparse and loop devices turn discards into punched holes, so its
    /// allocated blocks are exactly what the volume costs its storage.
    fn allocated_bytes(&self, identity: &DeviceIdentity) -> Option<u64> {
        let DeviceIdentity::LoopFile { file, .. } = identity else {
            return None;
        };
        // st_blocks counts 512-byte units whatever the filesystem's block size.
        std::fs::metadata(file).ok().map(|m| m.blocks() * 512)
    }
}

/// The file below `dir` (at most `depth` levels, symlinks not followed) with this inode.
fn inode_in_tree(dir: &Path, inode: (u64, u64), depth: u32) -> Option<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let Ok(meta) = entry.metadata() else {
            continue;
        };
        if (meta.dev(), meta.ino()) == inode && meta.is_file() {
            return Some(entry.path());
        }
        if meta.is_dir()
            && depth > 1
            && let Some(found) = inode_in_tree(&entry.path(), inode, depth - 1)
        {
            return Some(found);
        }
    }
    None
}
