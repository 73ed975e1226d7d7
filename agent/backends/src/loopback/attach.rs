//! Attaching and detaching loop volume files (ControllerPublishVolume and its undo), the
//! node's attach limit, and re-attaching after a reboot.

use std::path::{Path, PathBuf};

use ebs_node_core::records::{
    ClaimDoor, DeviceClaim, DeviceIdentity, Durability, LoopAttachment, LoopVolume, claim_key,
    now_unix_ms,
};

use super::LoopController;
use ebs_node_core::error::{ControllerError, Error, Result};
use ebs_node_core::node::device_claim;
use ebs_node_host::mount::at_path::read_table;
use ebs_node_host::{freeze, loopdev};

/// Attaches on a device whose number no bind holds anywhere (a workload may detach its own loop
/// device, which needs no privilege, and a bind of its node would then reach the new volume),
/// named `name`: this agent's tag for the volume, so that another agent on the host tells it
/// from a free device (`ro_tag::AgentTag::attached_tag`).
fn attach(file: &Path, name: Option<&str>, readonly: bool) -> Result<PathBuf> {
    let uses = ebs_node_host::device_binds::Uses::scan(ebs_node_host::device_binds::WITHIN);
    if let Some(why) = uses.failed() {
        return Err(Error::BindsUnknown {
            op: format!("attaching {}", file.display()),
            why: why.to_string(),
        });
    }
    loopdev::attach_avoiding(file, name, readonly, &|d| uses.bound(d).is_some()).map_err(|e| {
        Error::LoopDevice {
            op: format!("attaching {}", file.display()),
            source: Box::new(e),
        }
    })
}

impl LoopController {
    fn check_node(&self, node_id: &str) -> Result<()> {
        if node_id != self.node_id {
            return Err(ControllerError::UnknownNode {
                node: node_id.to_string(),
                serves: self.node_id.clone(),
            }
            .into());
        }
        Ok(())
    }

    /// Attaches the volume file as a loop device; idempotent. A read-only publication attaches
    /// a read-only device. A volume attached in another way (read-only or not) is ALREADY_EXISTS,
    /// one more attachment than the node's limit is RESOURCE_EXHAUSTED.
    pub fn publish(&self, id: &str, node_id: &str, readonly: bool) -> Result<PathBuf> {
        let _guard = self.lock();
        let mut volume = self
            .store
            .loop_volume(id)?
            .ok_or_else(|| Error::VolumeNotFound(id.into()))?;
        self.check_node(node_id)?;
        self.refuse_if_making(id)?;
        if let Some(att) = &volume.attachment {
            if att.node_id != node_id {
                return Err(Error::AttachedElsewhere {
                    volume: id.to_string(),
                    node: att.node_id.clone(),
                });
            }
            if att.readonly != readonly {
                return Err(ControllerError::AttachedWithOtherReadonly {
                    volume: id.to_string(),
                    node: node_id.to_string(),
                    readonly: att.readonly,
                    asked: readonly,
                }
                .into());
            }
        } else {
            self.check_attach_limit(node_id)?;
        }
        let (st_dev, st_ino) = super::file_inode(&volume.file)
            .map_err(|e| Error::io(format!("volume file {}", volume.file.display()), e))?;
        // One owner per device: a device the node holds for another id (a node-local handle
        // naming the file's loop device, not acting for this volume) is not attached for it.
        let (_, claim) = controller_claim(&volume, st_dev, st_ino);
        // Held through the claim's commit: a node door's check and claim of this device run
        // under the same key (`VolumeDevice::take_for_node`).
        let node_key = claim_key(ClaimDoor::Node, &claim.identity, None);
        // Only a new attachment can race a node door: an existing one's claim is there already.
        let fresh = volume.attachment.is_none();
        let _device_turn =
            match (self.device_locks.get(), &node_key) {
                (Some(locks), Some(key)) if fresh => {
                    Some(locks.try_lock(key).ok_or_else(|| {
                        ControllerError::DeviceOfVolumeBusy {
                            volume: id.to_string(),
                        }
                    })?)
                }
                _ => None,
            };
        if let Err(owner) = device_claim::controller_may_take(&*self.store, id, &claim.identity) {
            return Err(Error::DeviceClaimed {
                device: volume.file.clone(),
                volume: id.to_string(),
                owner,
                door: device_claim::door_words(ClaimDoor::Node),
            });
        }
        // A retry hands out the attachment's own device while it still is the file's whole
        // device with the access asked; never another one found first (a sixteenth fresh
        // review's F1: a retried read-only attachment handed out a writable device someone laid
        // over the file at a lower number).
        let recorded = volume
            .attachment
            .as_ref()
            .map(|att| att.device.clone())
            .filter(|dev| whole_view(dev, (st_dev, st_ino), readonly));
        let found = match recorded {
            Some(dev) => Some(dev),
            None => {
                loopdev::find_by_backing_inode(st_dev, st_ino).map_err(|e| Error::LoopDevice {
                    op: "scanning loop devices".into(),
                    source: Box::new(e),
                })?
            }
        };
        let device = match found {
            // A device someone else made over the file is adopted only as asked: a read-only
            // attachment never hands out a writable device (nor the reverse).
            Some(dev) if read_only(&dev) != Some(readonly) => {
                return Err(Error::VolumeInUse {
                    volume: id.to_string(),
                    why: format!(
                        "{} already holds its file with read-only={}, not as asked; detach it \
                         first",
                        dev.display(),
                        !readonly
                    ),
                });
            }
            // A device over the whole file under this agent's own name for the volume is the one
            // an attach killed before its record made (a twenty-first fresh review's F3): ours,
            // so unpublish detaches it and DeleteVolume is not refused for good.
            Some(dev) => {
                let ours = self.named_ours(id, &dev, (st_dev, st_ino), readonly);
                // Someone else's device in use (mounted, claimed) is not handed out as the
                // volume's attachment: a raw block workload would write under that filesystem
                // (a thirtieth fresh review's F1).
                let in_use = || {
                    ebs_node_host::device::block_devnum(&dev)
                        .is_ok_and(ebs_node_host::device::still_claimed)
                };
                let recorded = matches!(&volume.attachment, Some(att) if att.device == dev);
                if !ours && !recorded && in_use() {
                    return Err(Error::VolumeInUse {
                        volume: id.to_string(),
                        why: format!(
                            "{} already holds its file and is mounted or claimed; it is not \
                             handed out as the volume's device",
                            dev.display()
                        ),
                    });
                }
                (dev, ours)
            }
            None => (
                attach(&volume.file, self.name_for(id).as_deref(), readonly)?,
                true,
            ),
        };
        // Made now: ours. Found: ours only if the attachment this call renews made it (a device
        // found under a name that is not the attachment's, or first seen now, is someone else's).
        let made = device.1
            || matches!(&volume.attachment, Some(att) if att.device == device.0 && att.made);
        let device = device.0;
        if made {
            self.keep_named(id, &device);
        }
        volume.attachment = Some(LoopAttachment {
            node_id: node_id.into(),
            device: device.clone(),
            readonly,
            made,
        });
        // The device is the volume's from the attachment's own commit (one owner per device:
        // a node-local handle naming it is refused unless it acts for this volume).
        let (key, claim) = controller_claim(&volume, st_dev, st_ino);
        self.store.write(Durability::Immediate, |w| {
            w.put_loop_volume(&volume)?;
            w.put_claim(&key, &claim)
        })?;
        Ok(device)
    }

    /// The node's limit (`--volume-attach-limit`, advertised as NodeGetInfo's
    /// max_volumes_per_node): the volumes the records say are attached to it.
    fn check_attach_limit(&self, node_id: &str) -> Result<()> {
        if self.max_attachments == 0 {
            return Ok(());
        }
        let attached = self
            .store
            .loop_volumes()?
            .iter()
            .filter(|v| v.attachment.as_ref().is_some_and(|a| a.node_id == node_id))
            .count();
        if attached >= self.max_attachments as usize {
            return Err(ControllerError::AttachLimitReached {
                node: node_id.to_string(),
                attached,
                limit: self.max_attachments,
            }
            .into());
        }
        Ok(())
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
            // Only the device still backed by this volume's file is ours to detach.
            let ours = super::file_inode(&volume.file).is_ok_and(|inode| {
                loopdev::backing_inode(&att.device).ok().flatten() == Some(inode)
            });
            if ours {
                super::in_use::refuse_if_in_use(&self.store, id, &att.device)?;
            }
            // A device someone else made over the file stays theirs: the attachment ends, the
            // device is left as it was found.
            if ours && att.made {
                loopdev::detach(&att.device).map_err(|e| Error::LoopDevice {
                    op: format!("detaching {}", att.device.display()),
                    source: Box::new(e),
                })?;
            }
            volume.attachment = None;
            let claim = super::file_inode(&volume.file)
                .ok()
                .map(|(st_dev, st_ino)| controller_claim(&volume, st_dev, st_ino).0);
            self.store.write(Durability::Immediate, |w| {
                w.put_loop_volume(&volume)?;
                match &claim {
                    Some(key) => w.delete_claim(key),
                    None => Ok(()),
                }
            })?;
        }
        Ok(())
    }

    /// After a reboot the loop devices are gone while the records say attached: attach again,
    /// so that what the controller reported stays true.
    pub fn reattach_all(&self) -> Result<usize> {
        let _guard = self.lock();
        let mut count = 0;
        // One volume that cannot be attached (its file made immutable, say) leaves the others
        // re-attached and their records true (a twenty-first fresh review's F2).
        let mut first_error = None;
        for volume in self.store.loop_volumes()? {
            match self.reattach(volume) {
                Ok(true) => count += 1,
                Ok(false) => {}
                Err(e) => {
                    tracing::error!(error = %e, "recovery: a loop volume file could not be re-attached");
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(count),
        }
    }

    /// `reattach_all` for one volume: whether it attached it anew.
    fn reattach(&self, mut volume: LoopVolume) -> Result<bool> {
        let Some(att) = volume.attachment.clone() else {
            return Ok(false);
        };
        let identity = match super::file_inode(&volume.file) {
            Ok(inode) => inode,
            Err(_) => {
                tracing::warn!(volume = %volume.id, file = %volume.file.display(),
                    "recovery: the volume file is missing; attachment dropped");
                volume.attachment = None;
                self.store
                    .write(Durability::Immediate, |w| w.put_loop_volume(&volume))?;
                return Ok(false);
            }
        };
        // Attachments recorded before device claims existed get theirs.
        let (key, claim) = controller_claim(&volume, identity.0, identity.1);
        if self.store.claim(&key)?.is_none() {
            self.store
                .write(Durability::Immediate, |w| w.put_claim(&key, &claim))?;
        }
        // The attachment's own device, still the file's whole device as recorded (an agent
        // restart without a reboot): kept.
        if whole_view(&att.device, identity, att.readonly) {
            if att.made {
                self.keep_named(&volume.id, &att.device);
            }
            return Ok(false);
        }
        // Another one someone laid over the file is adopted only with the access recorded,
        // and as someone else's: never detached as the agent's, never writable for a
        // read-only attachment (a sixteenth fresh review's F1).
        if let Ok(Some(dev)) = loopdev::find_by_backing_inode(identity.0, identity.1)
            && read_only(&dev) == Some(att.readonly)
        {
            let made = self.named_ours(&volume.id, &dev, identity, att.readonly);
            volume.attachment = Some(LoopAttachment {
                device: dev,
                made,
                ..att
            });
            self.store
                .write(Durability::Immediate, |w| w.put_loop_volume(&volume))?;
            return Ok(false);
        }
        let device = attach(
            &volume.file,
            self.name_for(&volume.id).as_deref(),
            att.readonly,
        )?;
        tracing::info!(volume = %volume.id, device = %device.display(), "recovery: re-attached the volume file");
        volume.attachment = Some(LoopAttachment {
            device,
            made: true,
            ..att
        });
        self.store
            .write(Durability::Immediate, |w| w.put_loop_volume(&volume))?;
        Ok(true)
    }

    /// A snapshot interrupted by a crash leaves its volume's filesystem frozen, and every writer
    /// of it waiting; thaw the mounts of attached volumes at start-up (one that is not frozen is
    /// left as it is).
    pub fn thaw_attached(&self) -> Result<usize> {
        let table = read_table().map_err(|e| Error::io("reading the mount table", e))?;
        let mut thawed = 0;
        let volumes = self.store.loop_volumes()?;
        // Only a volume a copy was interrupted from (an unready snapshot of it, or a clone of it
        // whose file is not there yet): any other freeze is someone else's (a twenty-second fresh
        // review's F3: an operator's backup freeze was broken).
        let mut copied_from: std::collections::HashSet<String> = (self.store.loop_snapshots()?)
            .into_iter()
            .filter(|s| !s.ready)
            .map(|s| s.source_volume_id)
            .collect();
        for v in &volumes {
            if let Some(ebs_node_core::records::LoopSource::Volume { id }) = &v.content_source
                && !v.file.exists()
            {
                copied_from.insert(id.clone());
            }
        }
        for volume in volumes {
            if !copied_from.contains(&volume.id) {
                continue;
            }
            // Every device the copy froze: those that show the file's bytes (over the file, or
            // laid over one), the kernel's answer by inode, not a recorded number (a twenty-first
            // fresh review's F2: a foreign freeze was broken through a stale one).
            let devices = match super::copies::devices_showing(&volume.file) {
                Ok(d) => d,
                Err(e) => {
                    tracing::warn!(volume = %volume.id, error = %e,
                        "recovery: the devices over the volume's file cannot be listed; a filesystem a snapshot left frozen stays so");
                    continue;
                }
            };
            for dev in devices {
                // Through the first mount point whose directory is on the device (a mount laid
                // over one is never thawed: the twenty-second review's F1).
                for m in table.mounts_of_device(dev.major, dev.minor) {
                    match freeze::thaw_if_frozen(&m.mount_point, dev) {
                        Ok(true) => {
                            tracing::warn!(volume = %volume.id, path = %m.mount_point.display(),
                                "recovery: thawed a filesystem a snapshot had left frozen");
                            thawed += 1;
                            break;
                        }
                        Ok(false) => break,
                        Err(e) => tracing::warn!(volume = %volume.id, error = %e,
                            "recovery: could not check whether the filesystem is frozen"),
                    }
                }
            }
        }
        Ok(thawed)
    }
}

/// The loop controller's claim on a volume's device (its file's inode), with its key.
fn controller_claim(volume: &LoopVolume, st_dev: u64, st_ino: u64) -> (String, DeviceClaim) {
    let identity = DeviceIdentity::LoopFile {
        file: volume.file.clone(),
        st_dev,
        st_ino,
    };
    let key = claim_key(ClaimDoor::Controller, &identity, None)
        .unwrap_or_else(|| format!("controller/loop:{st_dev}:{st_ino}"));
    let claim = DeviceClaim {
        volume_id: volume.id.clone(),
        door: ClaimDoor::Controller,
        identity,
        at_unix_ms: now_unix_ms(),
        acts_for: None,
    };
    (key, claim)
}

/// Whether `dev` is a loop device over the whole file with this inode (no offset, no size
/// limit), read-only as asked.
pub(super) fn whole_view(dev: &Path, inode: (u64, u64), readonly: bool) -> bool {
    let Ok(file) = std::fs::File::open(dev) else {
        return false;
    };
    matches!(loopdev::backing_of(&file), Ok(Some((found, 0))) if found == inode)
        && loopdev::size_limit_of(&file).is_ok_and(|l| l == 0)
        && read_only(dev) == Some(readonly)
}

/// Whether a loop device is read-only, from sysfs (`None`: it cannot be told).
fn read_only(dev: &Path) -> Option<bool> {
    loopdev::read_only(dev)
}
