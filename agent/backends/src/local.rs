//! Node-local volumes (`local-ebs://dev/<name>`, upstream v1.53+): a disk pre-attached to every
//! node at the same device name. Any backend serves them: the handle names the device, the
//! backend tells its identity (loop: the backing file; EBS: the NVMe serial), and upstream's
//! `publish_context["volumeID"]`, when given, is the volume that device must be.
//!
//! A handle is a path a request chose, so before anything is done with it the device must be a
//! block device and free: neither it, its whole disk nor any partition of that disk mounted
//! anywhere but at this volume's own recorded paths (the root disk never is), and, when none of
//! them is mounted here, not claimed by the kernel either (a mount in another namespace, swap,
//! device-mapper, RAID). Everything else is delegated to the wrapped backend.

use ebs_node_core::DevNum;
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use ebs_node_core::records::DeviceIdentity;
use ebs_store::Store;

use ebs_node_core::error::{Error, Result};
use ebs_node_core::node::backend::{
    Backend, NotProven, ResolvedDevice, Shown, describe_identity, proves,
};
use ebs_node_core::request::{ValidationError, VolumeId};
use ebs_node_host::device::{devnum_of, still_claimed};

/// The publish_context key upstream's controller sets to the real EBS volume id.
pub const VOLUME_ID_KEY: &str = "volumeID";

/// A backend that also serves node-local handles.
pub struct WithLocalVolumes {
    inner: Arc<dyn Backend>,
    store: Arc<Store>,
}

impl WithLocalVolumes {
    pub fn new(inner: Arc<dyn Backend>, store: Arc<Store>) -> Self {
        WithLocalVolumes { inner, store }
    }

    fn resolve_local(
        &self,
        volume: &VolumeId,
        device: &Path,
        publish_context: &HashMap<String, String>,
        staging: Option<&Path>,
    ) -> Result<ResolvedDevice> {
        let real = real_volume(publish_context)?;
        let node = device_node(volume, device)?;
        let devnum = node.1;
        // A loop device whose detach the kernel deferred (autoclear) is going away: nothing to
        // stage, whatever it still shows.
        if ebs_node_host::raw_use::kernel_name(devnum).is_some_and(|name| {
            std::fs::read_to_string(format!("/sys/block/{name}/loop/autoclear"))
                .is_ok_and(|a| a.trim() == "1")
        }) {
            return Err(Error::DeviceClaimed {
                device: node.0.clone(),
                volume: volume.to_string(),
                owner: "(none: the loop device is being detached)".into(),
                door: "a loop device on its way out",
            });
        }
        // A loop device laid over another block device is a second name of that device's bytes,
        // with an identity of its own (the node it lies on): a handle names the disk itself.
        if let Some(under) = laid_over(devnum) {
            return Err(Error::DeviceClaimed {
                device: node.0.clone(),
                volume: volume.to_string(),
                owner: format!("(the device it lies over, {under})"),
                door: "a loop device laid over another block device",
            });
        }
        self.check_free(volume, &node.0, devnum, staging)?;
        let identity = self
            .inner
            .identify(devnum)
            .map_err(|why| Error::IndistinctDevice {
                volume: volume.to_string(),
                device: device.to_path_buf(),
                why: why.to_string(),
            })?;
        // A device that is one of the backend's own volumes (loop: a volume file, attached by
        // the controller or by anyone, a crash's leftover included) is that volume's, whoever
        // made the device: a handle takes it only acting for that volume.
        if let Some(owner) = self.inner.volume_of(&identity)
            && real.as_ref().map(VolumeId::as_str) != Some(owner.as_str())
        {
            return Err(Error::DeviceClaimed {
                device: device.to_path_buf(),
                volume: volume.to_string(),
                owner,
                door: "the device is that volume's file",
            });
        }
        if let Some(real) = &real {
            match self.inner.expected_identity(real) {
                // A disk without a serial (Xen) cannot be asked which volume it is: the handle,
                // the operator's explicit choice, decides, as upstream's FindDevicePath does.
                Some(_) if identity == DeviceIdentity::Unverified => {
                    tracing::warn!(volume = %volume, real = %real,
                        "node-local volume: the disk has no serial; volumeID cannot be checked")
                }
                Some(expected) if !proves(&expected, &identity) => {
                    return Err(Error::WrongDevice {
                        volume: volume.to_string(),
                        device: device.to_path_buf(),
                        reason: format!(
                            "publish_context volumeID {real} is {}, but the device is {}",
                            describe_identity(&expected),
                            describe_identity(&identity)
                        ),
                    });
                }
                Some(_) => {}
                None => tracing::warn!(volume = %volume, real = %real,
                    "node-local volume: the backend cannot tell what volumeID must show; the device is used as the handle names it"),
            }
        }
        Ok(ResolvedDevice {
            path: node.0,
            identity,
        })
    }

    /// The device, its whole disk and the disk's partitions are mounted nowhere but at this
    /// volume's recorded staging and target paths; when none is mounted here, the kernel shows no
    /// claim on the disk either.
    fn check_free(
        &self,
        volume: &VolumeId,
        node: &Path,
        devnum: DevNum,
        staging: Option<&Path>,
    ) -> Result<()> {
        // A read-only device an agent laid over a volume's for a read-only block publication is
        // that volume's bytes: never a handle's.
        if let Ok(Some(o)) = ebs_node_host::loopdev::overlay::status_by_devnum(devnum)
            && o.tag.starts_with(ebs_node_core::node::ro_tag::TAG_PREFIX)
        {
            return Err(Error::DeviceClaimed {
                device: node.to_path_buf(),
                volume: volume.to_string(),
                owner: format!("(the read-only block publication {})", o.tag),
                door: "a read-only device laid over a volume's",
            });
        }
        let (whole, mut family) = ebs_node_host::raw_use::disk_family(devnum);
        // Other loop devices over the same file show the same bytes: their mounts, binds and
        // claims are this device's too (a twenty-fourth fresh review's F1).
        let siblings = ebs_node_host::loopdev::stacking::siblings(devnum).map_err(|e| {
            // A loop device with no file behind it is attached to nothing (a forty-eighth fresh
            // review's F3: INTERNAL before).
            if e.kind() == std::io::ErrorKind::NotFound {
                return Error::DeviceNotAttached {
                    backend: "node-local",
                    volume: volume.to_string(),
                    device: node.to_path_buf(),
                    why: format!("no file is attached to the loop device ({e})"),
                };
            }
            Error::io(
                format!("finding the loop devices beside {}", node.display()),
                e,
            )
        })?;
        family.extend(siblings.iter().copied());
        // The stage's own staging path counts as the handle's only where its name says it was
        // made for this handle: a retry whose records were lost (`recover --reset`) finds its
        // mount there, which the stage then proves and adopts. A mount at any other staging path
        // with no record is someone else's (an operator's, another agent's sharing the prefix:
        // a nineteenth fresh review's F3 and F1), never adopted nor later unmounted.
        let mut ours: Vec<PathBuf> = staging
            .filter(|s| crate::kubelet_names::named_for(volume, s))
            .map(Path::to_path_buf)
            .into_iter()
            .collect();
        if let Some(staged) = self.store.staged(volume.as_str())? {
            ours.push(staged.staging_path);
        }
        ours.extend(
            self.store
                .publications(volume.as_str())?
                .into_iter()
                .map(|p| p.target_path),
        );
        let table = ebs_node_host::mount::at_path::read_table()
            .map_err(|e| Error::io("reading the mount table", e))?;
        let mut mounted_here = false;
        for m in table.entries() {
            if !family.contains(&DevNum::new(m.major, m.minor)) {
                continue;
            }
            if ours.contains(&m.mount_point) {
                mounted_here = true;
                continue;
            }
            let what = if m.mount_point == Path::new("/") {
                "the root filesystem".to_string()
            } else {
                format!("a filesystem mounted at {}", m.mount_point.display())
            };
            return Err(Error::HostDisk {
                volume: volume.to_string(),
                device: node.to_path_buf(),
                devnum: DevNum::new(m.major, m.minor),
                what,
            });
        }
        // Raw use the kernel's claim does not show (a bound device node, a holder) is the
        // core's to refuse, for every door (`HostOps::raw_use`); a loop device laid over it is a
        // view (`node::views`).
        if let Some(&busy) = siblings.iter().find(|d| still_claimed(**d)) {
            return Err(Error::DiskClaimed {
                volume: volume.to_string(),
                device: node.to_path_buf(),
                disk: busy,
            });
        }
        if !mounted_here && still_claimed(whole) {
            return Err(Error::DiskClaimed {
                volume: volume.to_string(),
                device: node.to_path_buf(),
                disk: whole,
            });
        }
        Ok(())
    }
}

/// The block device a loop device is laid over, when it is laid over one: as the kernel keeps
/// it (`lo_rdevice`), not as the path it recorded, which may be deleted or of another mount
/// namespace.
fn laid_over(devnum: DevNum) -> Option<String> {
    let o = ebs_node_host::loopdev::overlay::status_by_devnum(devnum)
        .ok()
        .flatten()?;
    (o.backing != DevNum::new(0, 0)).then(|| o.backing.to_string())
}

/// The `volumeID` upstream's controller puts in the publish context, parsed; a node-local handle
/// there is no volume.
fn real_volume(publish_context: &HashMap<String, String>) -> Result<Option<VolumeId>> {
    let Some(raw) = publish_context.get(VOLUME_ID_KEY).filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    let id = VolumeId::parse(raw).map_err(|_| {
        ValidationError::bad("publish_context volumeID", raw.as_str(), "not a volume id")
    })?;
    if id.is_local() {
        return Err(ValidationError::bad(
            "publish_context volumeID",
            raw.as_str(),
            "it must be the volume's own id, not a node-local handle",
        )
        .into());
    }
    Ok(Some(id))
}

/// The block device node the handle names (links followed: `/dev/xvdbz` is a udev link on Nitro
/// instances), and its numbers. NOT_FOUND when no block device is there.
fn device_node(volume: &VolumeId, device: &Path) -> Result<(PathBuf, DevNum)> {
    let not_here = |why: String| Error::DeviceNotAttached {
        backend: "node-local",
        volume: volume.to_string(),
        device: device.to_path_buf(),
        why,
    };
    let node = match std::fs::canonicalize(device) {
        Ok(p) => p,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(not_here("no such device".into()));
        }
        Err(e) => return Err(Error::io(format!("resolving {}", device.display()), e)),
    };
    let meta = std::fs::metadata(&node)
        .map_err(|e| Error::io(format!("examining {}", node.display()), e))?;
    if !node.starts_with("/dev") || !meta.file_type().is_block_device() {
        return Err(not_here(format!(
            "{} is not a block device",
            node.display()
        )));
    }
    Ok((node, devnum_of(meta.rdev())))
}

impl Backend for WithLocalVolumes {
    fn resolve(
        &self,
        volume: &VolumeId,
        publish_context: &HashMap<String, String>,
        volume_context: &HashMap<String, String>,
        deadline: Instant,
    ) -> Result<ResolvedDevice> {
        match volume.local_device() {
            Some(device) => self.resolve_local(volume, device, publish_context, None),
            None => self
                .inner
                .resolve(volume, publish_context, volume_context, deadline),
        }
    }

    fn resolve_at(
        &self,
        volume: &VolumeId,
        publish_context: &HashMap<String, String>,
        volume_context: &HashMap<String, String>,
        staging: &Path,
        deadline: Instant,
    ) -> Result<ResolvedDevice> {
        match volume.local_device() {
            Some(device) => self.resolve_local(volume, device, publish_context, Some(staging)),
            None => self
                .inner
                .resolve(volume, publish_context, volume_context, deadline),
        }
    }

    fn identify(&self, devnum: DevNum) -> std::result::Result<DeviceIdentity, NotProven> {
        self.inner.identify(devnum)
    }

    /// A handle names a place, not a volume: only the records say what its device must show.
    fn expected_identity(&self, volume: &VolumeId) -> Option<DeviceIdentity> {
        if volume.is_local() {
            return None;
        }
        self.inner.expected_identity(volume)
    }

    fn prove(
        &self,
        device: Shown<'_>,
        identity: &DeviceIdentity,
    ) -> std::result::Result<Option<File>, NotProven> {
        self.inner.prove(device, identity)
    }

    fn backing_file(
        &self,
        dev: &File,
        devnum: DevNum,
        identity: &DeviceIdentity,
    ) -> std::result::Result<Option<ebs_node_core::seam::BackingFile>, String> {
        self.inner.backing_file(dev, devnum, identity)
    }

    fn refresh_size(&self, device: &Path) -> Result<()> {
        self.inner.refresh_size(device)
    }

    fn allocated_bytes(&self, identity: &DeviceIdentity) -> Option<u64> {
        self.inner.allocated_bytes(identity)
    }

    fn volume_of(&self, identity: &DeviceIdentity) -> Option<String> {
        self.inner.volume_of(identity)
    }

    /// Whether a node-local volume exists only resolving can tell.
    fn exists(&self, volume: &VolumeId) -> Result<Option<bool>> {
        if volume.is_local() {
            return Ok(None);
        }
        self.inner.exists(volume)
    }
}
