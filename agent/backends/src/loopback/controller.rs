//! The loop backend's controller: create and delete volume files (blank or copies of a
//! snapshot or another volume), list, grow. Attaching is in `attach`, snapshots in `snapshots`.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use ebs_node_core::records::{Durability, LoopSource, LoopVolume, now_unix_ms};
use ebs_store::Store;

use super::paging::{Page, page};
use ebs_node_core::error::{CapacityError, ControllerError, Error, Result};
use ebs_node_host::loopdev;

pub const DEFAULT_CAPACITY: u64 = 1 << 30;
const ALIGN: u64 = 1 << 20;
/// The volume_context key of the filesystem type; the format options' keys are the node's own
/// (`request::format_keys`), so that every option NodeStageVolume reads can be passed.
const FS_TYPE: &str = "fsType";

pub struct CreateVolume {
    pub name: String,
    pub required_bytes: u64,
    pub limit_bytes: u64,
    pub parameters: HashMap<String, String>,
    pub source: Option<LoopSource>,
    /// The filesystems the capabilities ask for: a size mkfs would refuse is refused here.
    pub filesystems: Vec<ebs_node_core::request::FsType>,
}

pub struct LoopController {
    pub(super) store: Arc<Store>,
    pub(super) volumes_dir: PathBuf,
    pub(super) snapshots_dir: PathBuf,
    pub(super) node_id: String,
    /// ControllerPublishVolume's limit per node; 0 = none.
    pub(super) max_attachments: u32,
    /// Create and delete scan and change the volume set: one at a time keeps names unique.
    catalogue: Mutex<()>,
    /// The node's per-device locks (`NodeCtx::device_locks`), shared once the node is wired: an
    /// attach takes the device's node-claim key while it checks and writes its claim, as a node
    /// door does, so the two never both take one device.
    pub(super) device_locks: std::sync::OnceLock<ebs_node_core::node::VolumeLocks>,
    /// The node's agent tag, once the node is wired: the loop devices it attaches carry it.
    pub(super) agent_tag: std::sync::OnceLock<ebs_node_core::node::ro_tag::AgentTag>,
    /// Volumes whose first contents are being made now (a clone's or a restore's copy): a
    /// DeleteVolume of one is ABORTED, not let through to unlink the file being written (a
    /// twenty-second fresh review's F4). In memory: a copy a crash cut is deleted as usual.
    making: Mutex<std::collections::HashSet<String>>,
}

impl LoopController {
    pub fn new(
        store: Arc<Store>,
        state_dir: &std::path::Path,
        node_id: String,
        max_attachments: u32,
    ) -> Self {
        LoopController {
            store,
            volumes_dir: state_dir.join("volumes"),
            snapshots_dir: state_dir.join("snapshots"),
            node_id,
            max_attachments,
            catalogue: Mutex::new(()),
            device_locks: std::sync::OnceLock::new(),
            agent_tag: std::sync::OnceLock::new(),
            making: Mutex::default(),
        }
    }

    /// Joins the node: shares its per-device locks (see `device_locks`) and its agent tag.
    pub fn join_node(
        &self,
        locks: ebs_node_core::node::VolumeLocks,
        agent_tag: ebs_node_core::node::ro_tag::AgentTag,
    ) {
        let _ = self.device_locks.set(locks);
        let _ = self.agent_tag.set(agent_tag);
    }

    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, ()> {
        self.catalogue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Creates a volume (blank, or a copy of a snapshot or another volume), or returns the one
    /// of that name when it matches the request. The caller holds the node guard of the name
    /// (and of a source volume), so no two calls make the same file at once.
    pub fn create(&self, req: CreateVolume) -> Result<LoopVolume> {
        let parameters = passed_parameters(&req.parameters)?;
        let capacity = match &req.source {
            None => capacity_for(req.required_bytes, req.limit_bytes)?,
            Some(source) => {
                let (_, _, size) = self.source_file(source)?;
                capacity_from_source(req.required_bytes, req.limit_bytes, size)?
            }
        };
        for &fs in &req.filesystems {
            ebs_node_host::fs_limits::SizeLimits::of(fs, None, None)
                .check(fs, capacity)
                .map_err(|e| CapacityError::FilesystemLimit {
                    fs,
                    source: Box::new(e),
                })?;
        }
        let volume = {
            let _guard = self.lock();
            match self
                .store
                .loop_volumes()?
                .into_iter()
                .find(|v| v.name == req.name)
            {
                Some(existing) => {
                    let fits = existing.capacity_bytes >= req.required_bytes
                        && (req.limit_bytes == 0 || existing.capacity_bytes <= req.limit_bytes);
                    if !fits
                        || existing.parameters != parameters
                        || existing.content_source != req.source
                    {
                        return Err(ControllerError::VolumeNameTaken {
                            name: req.name.clone(),
                            existing: existing.id.clone(),
                            bytes: existing.capacity_bytes,
                        }
                        .into());
                    }
                    existing
                }
                None => {
                    ebs_node_host::private::ensure_dir(&self.volumes_dir).map_err(|e| {
                        Error::io(format!("creating {}", self.volumes_dir.display()), e)
                    })?;
                    let id = format!("lv-{}", random_hex()?);
                    let volume = LoopVolume {
                        file: self.volumes_dir.join(format!("{id}.img")),
                        id,
                        name: req.name,
                        capacity_bytes: capacity,
                        parameters,
                        attachment: None,
                        created_unix_ms: now_unix_ms(),
                        content_source: req.source,
                    };
                    // Record first, then the file: a crash in between leaves a record whose
                    // file is made on the retry, never an orphan file nobody knows.
                    self.store
                        .write(Durability::Immediate, |w| w.put_loop_volume(&volume))?;
                    volume
                }
            }
        };
        let made = {
            let _making = Making::mark(&self.making, &volume.id);
            self.materialise(&volume)
        };
        if let Err(e) = made {
            // Nothing was made (files appear only whole, by rename): the record goes too, so a
            // corrected retry (another size) is not held to this one. The caller holds the
            // name's guard; a record with a file (a retry of a made volume) is kept.
            if !volume.file.exists() && volume.attachment.is_none() {
                let _guard = self.lock();
                self.store
                    .write(Durability::Immediate, |w| w.delete_loop_volume(&volume.id))?;
            }
            return Err(e);
        }
        Ok(volume)
    }

    pub fn delete(&self, id: &str) -> Result<()> {
        let _guard = self.lock();
        let Some(volume) = self.store.loop_volume(id)? else {
            return Ok(());
        };
        self.refuse_if_making(id)?;
        // The node's records of the volume are its own: a delete never drops them while the
        // node stages or publishes the volume (status would lose it, unstage would refuse it).
        super::in_use::refuse_if_recorded(&self.store, id)?;
        super::in_use::refuse_if_held_elsewhere(&self.store, id, &volume.file)?;
        if let Some(att) = &volume.attachment
            && loopdev::backing_file(&att.device).ok().flatten().is_some()
        {
            return Err(Error::StillAttached {
                volume: id.to_string(),
                node: att.node_id.clone(),
                device: att.device.clone(),
            });
        }
        super::in_use::refuse_if_any_loop_over(id, &volume.file)?;
        match std::fs::remove_file(&volume.file) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io(format!("removing {}", volume.file.display()), e)),
        }
        super::copies::remove_partial(&volume.file)?;
        self.store.write(Durability::Immediate, |w| {
            w.delete_loop_volume(id)?;
            w.forget_volume(id)
        })?;
        Ok(())
    }

    /// ABORTED while the volume's first contents are being copied: an attach, an expansion, a
    /// snapshot or a clone of a file still being written would use half a copy (a twenty-third
    /// fresh review's low: they answered INTERNAL, the file not being there yet).
    pub(super) fn refuse_if_making(&self, id: &str) -> Result<()> {
        if (self.making.lock().unwrap_or_else(|p| p.into_inner())).contains(id) {
            return Err(Error::Busy(id.to_string()));
        }
        Ok(())
    }

    pub fn get(&self, id: &str) -> Result<LoopVolume> {
        self.store
            .loop_volume(id)?
            .ok_or_else(|| Error::VolumeNotFound(id.into()))
    }

    /// Volumes in id order, one page at a time (see `paging`).
    pub fn list(&self, max_entries: usize, starting_token: &str) -> Result<Page<LoopVolume>> {
        page(
            self.store.loop_volumes()?,
            |v| v.id.as_str(),
            "lv-",
            max_entries,
            starting_token,
        )
    }

    /// Free bytes on the filesystem that holds the volume files.
    pub fn capacity(&self) -> Result<u64> {
        ebs_node_host::private::ensure_dir(&self.volumes_dir)
            .map_err(|e| Error::io(format!("creating {}", self.volumes_dir.display()), e))?;
        let u = ebs_node_host::fs_usage::usage(&self.volumes_dir)
            .map_err(|e| Error::io("statvfs on the volume directory", e))?;
        Ok(u.available_bytes)
    }
}

/// A volume marked as being made (`LoopController::making`) until dropped, panics included.
struct Making<'a> {
    set: &'a Mutex<std::collections::HashSet<String>>,
    volume: String,
}

impl<'a> Making<'a> {
    fn mark(set: &'a Mutex<std::collections::HashSet<String>>, volume: &str) -> Self {
        let mut making = set.lock().unwrap_or_else(|p| p.into_inner());
        making.insert(volume.to_string());
        Making {
            set,
            volume: volume.to_string(),
        }
    }
}

impl Drop for Making<'_> {
    fn drop(&mut self) {
        let mut making = self.set.lock().unwrap_or_else(|p| p.into_inner());
        making.remove(&self.volume);
    }
}

/// CreateVolume's parameters that NodeStageVolume reads, under the spelling it reads them by
/// (keys compare without case, as upstream's do); the external-provisioner's own
/// (`csi.storage.k8s.io/…`) are dropped, except its fstype.
fn passed_parameters(given: &HashMap<String, String>) -> Result<BTreeMap<String, String>> {
    use ebs_node_core::request::{ValidationError, format_keys};
    let mut parameters = BTreeMap::new();
    // In key order, so that a refusal names the same key on every try.
    let mut given: Vec<_> = given.iter().collect();
    given.sort();
    for (k, v) in given {
        let name = if k.eq_ignore_ascii_case(FS_TYPE) || k == "csi.storage.k8s.io/fstype" {
            FS_TYPE
        } else if let Some(name) = format_keys::key(k) {
            name
        } else if k.starts_with("csi.storage.k8s.io/") {
            continue;
        } else {
            let known: Vec<&str> = std::iter::once(FS_TYPE)
                .chain(format_keys::KEYS.iter().copied())
                .collect();
            return Err(ValidationError::bad(
                "parameters",
                k.clone(),
                format!("unknown parameter; known: {}", known.join(", ")),
            )
            .into());
        };
        if let Some(other) = parameters.insert(name.to_string(), v.clone())
            && other != *v
        {
            return Err(ValidationError::bad(
                "parameters",
                k.clone(),
                format!(
                    "{name} is given twice, as {other:?} and as {v:?} (under keys that differ in \
                     case, or as csi.storage.k8s.io/fstype)"
                ),
            )
            .into());
        }
    }
    Ok(parameters)
}

/// The size of a volume made from a source of `source` bytes: the source's size, or more when
/// the request asks for more; never less (a copy cannot be cut), so a limit below it is
/// OUT_OF_RANGE.
pub fn capacity_from_source(required: u64, limit: u64, source: u64) -> Result<u64> {
    if limit != 0 && limit < source {
        return Err(CapacityError::SmallerThanSource {
            limit,
            source_bytes: source,
        }
        .into());
    }
    if required <= source {
        return Ok(source);
    }
    capacity_for(required, limit)
}

/// Rounds the request up to whole MiB, within the limit.
pub fn capacity_for(required: u64, limit: u64) -> Result<u64> {
    if limit != 0 && required > limit {
        return Err(CapacityError::RequiredOverLimit { required, limit }.into());
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
        return Err(CapacityError::BelowMinimum { min: ALIGN }.into());
    }
    // CSI sizes are int64: a volume it cannot name is none the CO could use.
    if size > i64::MAX as u64 {
        return Err(CapacityError::BeyondInt64 { size }.into());
    }
    Ok(size)
}

pub(super) fn random_hex() -> Result<String> {
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
    fn copies_are_never_smaller_than_their_source() {
        let src = 16 * ALIGN;
        assert_eq!(capacity_from_source(0, 0, src).unwrap(), src);
        assert_eq!(capacity_from_source(src, src, src).unwrap(), src);
        assert_eq!(capacity_from_source(src + 1, 0, src).unwrap(), 17 * ALIGN);
        assert!(matches!(
            capacity_from_source(0, src - ALIGN, src),
            Err(Error::Capacity(CapacityError::SmallerThanSource { .. }))
        ));
    }

    /// Every format option NodeStageVolume reads from the volume context passes through
    /// CreateVolume's parameters (it listed its own copy, which lacked ext4EncryptionSupport),
    /// whatever the key's case, under the spelling the node reads.
    #[test]
    fn every_format_option_passes_through_create_volume() {
        let given: HashMap<String, String> = [
            ("ext4EncryptionSupport", "true"),
            ("BLOCKSIZE", "4096"),
            ("fstype", "xfs"),
            ("csi.storage.k8s.io/pvc/name", "data"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let passed = passed_parameters(&given).expect("known keys");
        let keys: Vec<&str> = passed.keys().map(String::as_str).collect();
        assert_eq!(keys, ["blockSize", "ext4EncryptionSupport", "fsType"]);
        let unknown: HashMap<String, String> = [("blockSizes".to_string(), "1".to_string())].into();
        assert!(passed_parameters(&unknown).is_err());
        let twice: HashMap<String, String> = [
            ("blockSize".to_string(), "1024".to_string()),
            ("BlockSize".to_string(), "4096".to_string()),
        ]
        .into();
        assert!(passed_parameters(&twice).is_err(), "two values for one key");
        let fs_twice = |a: &str, b: &str| -> HashMap<String, String> {
            [
                ("fsType".to_string(), a.to_string()),
                ("csi.storage.k8s.io/fstype".to_string(), b.to_string()),
            ]
            .into()
        };
        assert!(passed_parameters(&fs_twice("xfs", "xfs")).is_ok());
        let e = passed_parameters(&fs_twice("ext4", "xfs")).unwrap_err();
        assert!(e.to_string().contains("given twice"), "{e}");
    }

    #[test]
    fn capacity_rounding() {
        assert_eq!(capacity_for(0, 0).unwrap(), DEFAULT_CAPACITY);
        assert_eq!(capacity_for(1, 0).unwrap(), ALIGN);
        assert_eq!(capacity_for(ALIGN + 1, 0).unwrap(), 2 * ALIGN);
        assert!(capacity_for(10, 5).is_err());
        assert!(capacity_for(0, 100).is_err());
    }
}
