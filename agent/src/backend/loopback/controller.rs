//! The loop backend's controller: create, delete, attach and detach volume files.

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use ebs_store::{Durability, LoopAttachment, LoopVolume, Store, now_unix_ms};

use crate::error::{Error, Result};
use crate::host::{loopdev, mountinfo::MountTable};

pub const DEFAULT_CAPACITY: u64 = 1 << 30;
const ALIGN: u64 = 1 << 20;
/// volume_context keys that CreateVolume parameters may carry through to NodeStageVolume.
const PASSED_PARAMETERS: &[&str] = &[
    "fsType",
    "blockSize",
    "inodeSize",
    "bytesPerInode",
    "numberOfInodes",
    "ext4BigAlloc",
    "ext4ClusterSize",
];

pub struct CreateVolume {
    pub name: String,
    pub required_bytes: u64,
    pub limit_bytes: u64,
    pub parameters: HashMap<String, String>,
    /// The filesystems the capabilities ask for: a size mkfs would refuse is refused here.
    pub filesystems: Vec<crate::request::FsType>,
}

pub struct VolumePage {
    pub volumes: Vec<LoopVolume>,
    pub next_token: String,
}

pub struct LoopController {
    store: Arc<Store>,
    volumes_dir: PathBuf,
    node_id: String,
    /// Create and delete scan and change the volume set: one at a time keeps names unique.
    catalogue: Mutex<()>,
}

impl LoopController {
    pub fn new(store: Arc<Store>, state_dir: &std::path::Path, node_id: String) -> Self {
        LoopController {
            store,
            volumes_dir: state_dir.join("volumes"),
            node_id,
            catalogue: Mutex::new(()),
        }
    }

    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ()> {
        self.catalogue.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn create(&self, req: CreateVolume) -> Result<LoopVolume> {
        let capacity = capacity_for(req.required_bytes, req.limit_bytes)?;
        for &fs in &req.filesystems {
            crate::host::fs_limits::SizeLimits::of(fs, None, None)
                .check(fs, capacity)
                .map_err(Error::OutOfRange)?;
        }
        let mut parameters = BTreeMap::new();
        for (k, v) in &req.parameters {
            if PASSED_PARAMETERS.contains(&k.as_str()) {
                parameters.insert(k.clone(), v.clone());
            } else if k == "csi.storage.k8s.io/fstype" {
                parameters.insert("fsType".into(), v.clone());
            } else if !k.starts_with("csi.storage.k8s.io/") {
                return Err(crate::request::ValidationError::bad(
                    "parameters",
                    k.clone(),
                    format!("unknown parameter; known: {}", PASSED_PARAMETERS.join(", ")),
                )
                .into());
            }
        }
        let _guard = self.lock();
        if let Some(existing) = self
            .store
            .loop_volumes()?
            .into_iter()
            .find(|v| v.name == req.name)
        {
            let fits = existing.capacity_bytes >= req.required_bytes
                && (req.limit_bytes == 0 || existing.capacity_bytes <= req.limit_bytes);
            if fits && existing.parameters == parameters {
                return Ok(existing);
            }
            return Err(Error::AlreadyExists(format!(
                "volume {:?} exists as {} with {} bytes and other parameters",
                req.name, existing.id, existing.capacity_bytes
            )));
        }
        std::fs::create_dir_all(&self.volumes_dir)
            .map_err(|e| Error::io(format!("creating {}", self.volumes_dir.display()), e))?;
        let id = format!("lv-{}", random_hex()?);
        let file = self.volumes_dir.join(format!("{id}.img"));
        let volume = LoopVolume {
            id,
            name: req.name,
            capacity_bytes: capacity,
            file: file.clone(),
            parameters,
            attachment: None,
            created_unix_ms: now_unix_ms(),
        };
        // Record first, then create the file: a crash in between leaves a record whose file
        // is created on the retry, never an orphan file nobody knows.
        self.store
            .write(Durability::Immediate, |w| w.put_loop_volume(&volume))?;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(&file)
            .map_err(|e| Error::io(format!("creating {}", file.display()), e))?;
        f.set_len(capacity)
            .map_err(|e| Error::io(format!("sizing {}", file.display()), e))?;
        Ok(volume)
    }

    pub fn delete(&self, id: &str) -> Result<()> {
        let _guard = self.lock();
        let Some(volume) = self.store.loop_volume(id)? else {
            return Ok(());
        };
        if let Some(att) = &volume.attachment
            && loopdev::backing_file(&att.device).ok().flatten().is_some()
        {
            return Err(Error::Precondition(format!(
                "volume {id} is still attached to node {} as {}; ControllerUnpublishVolume first",
                att.node_id,
                att.device.display()
            )));
        }
        match std::fs::remove_file(&volume.file) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io(format!("removing {}", volume.file.display()), e)),
        }
        self.store.write(Durability::Immediate, |w| {
            w.delete_loop_volume(id)?;
            w.forget_volume(id)
        })?;
        Ok(())
    }

    fn check_node(&self, node_id: &str) -> Result<()> {
        if node_id != self.node_id {
            return Err(Error::NotFound(format!(
                "node {node_id:?} does not exist: the loop backend serves only node {:?}",
                self.node_id
            )));
        }
        Ok(())
    }

    /// Attaches the volume file as a loop device; idempotent.
    pub fn publish(&self, id: &str, node_id: &str, readonly: bool) -> Result<PathBuf> {
        let _guard = self.lock();
        let mut volume = self
            .store
            .loop_volume(id)?
            .ok_or_else(|| Error::VolumeNotFound(id.into()))?;
        self.check_node(node_id)?;
        if let Some(att) = &volume.attachment {
            if att.node_id != node_id {
                return Err(Error::Precondition(format!(
                    "volume {id} is attached to node {}",
                    att.node_id
                )));
            }
            if att.readonly != readonly {
                return Err(Error::AlreadyExists(format!(
                    "volume {id} is attached with readonly={}",
                    att.readonly
                )));
            }
        }
        let (st_dev, st_ino) = super::file_inode(&volume.file)
            .map_err(|e| Error::io(format!("volume file {}", volume.file.display()), e))?;
        let device = match loopdev::find_by_backing_inode(st_dev, st_ino)
            .map_err(|e| Error::Internal(format!("scanning loop devices: {e}")))?
        {
            Some(dev) => dev,
            None => loopdev::attach(&volume.file).map_err(|e| {
                Error::Internal(format!("attaching {}: {e}", volume.file.display()))
            })?,
        };
        volume.attachment = Some(LoopAttachment {
            node_id: node_id.into(),
            device: device.clone(),
            readonly,
        });
        self.store
            .write(Durability::Immediate, |w| w.put_loop_volume(&volume))?;
        Ok(device)
    }

    /// Detaches the volume's loop device; idempotent. Refused while the device is mounted.
    pub fn unpublish(&self, id: &str, node_id: &str) -> Result<()> {
        let _guard = self.lock();
        let Some(mut volume) = self.store.loop_volume(id)? else {
            return Ok(());
        };
        if !node_id.is_empty() && node_id != self.node_id {
            return Ok(());
        }
        if let Some(att) = &volume.attachment {
            if let Ok((major, minor)) = crate::backend::block_dev_numbers(&att.device)
                && loopdev::backing_file(&att.device).ok().flatten().is_some()
            {
                let table = MountTable::read()
                    .map_err(|e| Error::Internal(format!("reading the mount table: {e}")))?;
                if let Some(m) = table.mounts_of_device(major, minor).next() {
                    return Err(Error::Precondition(format!(
                        "volume {id} is still mounted at {}; unstage it first",
                        m.mount_point.display()
                    )));
                }
                loopdev::detach(&att.device).map_err(|e| {
                    Error::Internal(format!("detaching {}: {e}", att.device.display()))
                })?;
            }
            volume.attachment = None;
            self.store
                .write(Durability::Immediate, |w| w.put_loop_volume(&volume))?;
        }
        Ok(())
    }

    /// After a reboot the loop devices are gone while the records say attached: attach again,
    /// so that what the controller reported stays true.
    pub fn reattach_all(&self) -> Result<usize> {
        let _guard = self.lock();
        let mut count = 0;
        for mut volume in self.store.loop_volumes()? {
            let Some(att) = volume.attachment.clone() else {
                continue;
            };
            let identity = match super::file_inode(&volume.file) {
                Ok(inode) => inode,
                Err(_) => {
                    tracing::warn!(volume = %volume.id, file = %volume.file.display(),
                        "recovery: the volume file is missing; attachment dropped");
                    volume.attachment = None;
                    self.store
                        .write(Durability::Immediate, |w| w.put_loop_volume(&volume))?;
                    continue;
                }
            };
            if let Ok(Some(dev)) = loopdev::find_by_backing_inode(identity.0, identity.1) {
                if dev != att.device {
                    volume.attachment = Some(LoopAttachment { device: dev, ..att });
                    self.store
                        .write(Durability::Immediate, |w| w.put_loop_volume(&volume))?;
                }
                continue;
            }
            let device = loopdev::attach(&volume.file).map_err(|e| {
                Error::Internal(format!("re-attaching {}: {e}", volume.file.display()))
            })?;
            tracing::info!(volume = %volume.id, device = %device.display(), "recovery: re-attached the volume file");
            volume.attachment = Some(LoopAttachment { device, ..att });
            self.store
                .write(Durability::Immediate, |w| w.put_loop_volume(&volume))?;
            count += 1;
        }
        Ok(count)
    }

    pub fn get(&self, id: &str) -> Result<LoopVolume> {
        self.store
            .loop_volume(id)?
            .ok_or_else(|| Error::VolumeNotFound(id.into()))
    }

    /// Pages through volumes in id order; the token is the id to start after.
    pub fn list(&self, max_entries: usize, starting_token: &str) -> Result<VolumePage> {
        let all = self.store.loop_volumes()?;
        let start = if starting_token.is_empty() {
            0
        } else {
            match all.iter().position(|v| v.id == starting_token) {
                Some(i) => i + 1,
                None => {
                    return Err(Error::Aborted(format!(
                        "starting_token {starting_token:?} does not match any volume"
                    )));
                }
            }
        };
        let take = if max_entries == 0 {
            usize::MAX
        } else {
            max_entries
        };
        let volumes: Vec<LoopVolume> = all.into_iter().skip(start).take(take).collect();
        let remaining = self.store.loop_volumes()?.len() > start + volumes.len();
        let next_token = match (remaining, volumes.last()) {
            (true, Some(last)) => last.id.clone(),
            _ => String::new(),
        };
        Ok(VolumePage {
            volumes,
            next_token,
        })
    }

    /// Free bytes on the filesystem that holds the volume files.
    pub fn capacity(&self) -> Result<u64> {
        std::fs::create_dir_all(&self.volumes_dir)
            .map_err(|e| Error::io(format!("creating {}", self.volumes_dir.display()), e))?;
        let st = nix::sys::statvfs::statvfs(&self.volumes_dir)
            .map_err(|e| Error::io("statvfs on the volume directory", e.into()))?;
        Ok(st.blocks_available() as u64 * st.fragment_size() as u64)
    }

    /// Grows a volume file; returns the new size. Shrinking is never done.
    pub fn expand(&self, id: &str, required: u64, limit: u64) -> Result<u64> {
        let _guard = self.lock();
        let mut volume = self
            .store
            .loop_volume(id)?
            .ok_or_else(|| Error::VolumeNotFound(id.into()))?;
        let wanted = super::resize::expansion_size(required, limit, volume.capacity_bytes)?;
        if wanted > volume.capacity_bytes {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(&volume.file)
                .map_err(|e| Error::io(format!("opening {}", volume.file.display()), e))?;
            f.set_len(wanted)
                .map_err(|e| Error::io(format!("growing {}", volume.file.display()), e))?;
            volume.capacity_bytes = wanted;
            self.store
                .write(Durability::Immediate, |w| w.put_loop_volume(&volume))?;
        }
        // An attached EBS volume shows its new size to the instance by itself; the loop device
        // does so once told. Best effort: NodeExpandVolume refreshes again before growing.
        if let Some(att) = &volume.attachment
            && let Ok(meta) = std::fs::metadata(&volume.file)
            && loopdev::backing_inode(&att.device).ok().flatten() == Some((meta.dev(), meta.ino()))
            && let Err(e) = loopdev::set_capacity(&att.device)
        {
            tracing::warn!(volume = id, device = %att.device.display(), error = %e,
                "could not refresh the attached device's size");
        }
        Ok(volume.capacity_bytes)
    }
}

/// Rounds the request up to whole MiB, within the limit.
pub fn capacity_for(required: u64, limit: u64) -> Result<u64> {
    if limit != 0 && required > limit {
        return Err(Error::OutOfRange(format!(
            "required_bytes {required} is larger than limit_bytes {limit}"
        )));
    }
    let base = if required == 0 {
        if limit != 0 {
            limit.min(DEFAULT_CAPACITY)
        } else {
            DEFAULT_CAPACITY
        }
    } else {
        required
    };
    let rounded = base.div_ceil(ALIGN) * ALIGN;
    let size = if limit != 0 && rounded > limit {
        base
    } else {
        rounded
    };
    if size < ALIGN {
        return Err(Error::OutOfRange(format!(
            "the loop backend's smallest volume is {ALIGN} bytes"
        )));
    }
    Ok(size)
}

fn random_hex() -> Result<String> {
    let mut buf = [0u8; 8];
    let f =
        std::fs::File::open("/dev/urandom").map_err(|e| Error::io("opening /dev/urandom", e))?;
    std::io::Read::read_exact(&mut &f, &mut buf)
        .map_err(|e| Error::io("reading /dev/urandom", e))?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_rounding() {
        assert_eq!(capacity_for(0, 0).unwrap(), DEFAULT_CAPACITY);
        assert_eq!(capacity_for(1, 0).unwrap(), ALIGN);
        assert_eq!(capacity_for(ALIGN + 1, 0).unwrap(), 2 * ALIGN);
        assert!(capacity_for(10, 5).is_err());
        assert!(capacity_for(0, 100).is_err());
    }
}
