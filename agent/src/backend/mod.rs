//! Backends turn a volume id into a block device and prove that the device is the volume.

pub mod ebs;
pub mod loopback;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use ebs_store::DeviceIdentity;

use crate::error::Result;
use crate::request::VolumeId;

/// A device found for a volume, with what proves it is the volume.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResolvedDevice {
    pub path: PathBuf,
    pub identity: DeviceIdentity,
}

/// What the node side needs from a backend. Blocking: called from the blocking pool.
pub trait Backend: Send + Sync {
    /// Finds the volume's device, waiting for it until `deadline`, and verifies its identity.
    /// Errors say what was seen, so an operator can act.
    fn resolve(
        &self,
        volume: &VolumeId,
        publish_context: &HashMap<String, String>,
        volume_context: &HashMap<String, String>,
        deadline: Instant,
    ) -> Result<ResolvedDevice>;

    /// Whether `device` still carries `identity` (stats, health, resume). `Err` says why not.
    fn still_is(&self, device: &Path, identity: &DeviceIdentity)
    -> std::result::Result<(), String>;

    /// Makes the kernel see a device's new size after the volume grew (loop: set capacity;
    /// NVMe: rescan the controller).
    fn refresh_size(&self, device: &Path) -> Result<()>;

    /// The bytes the volume occupies in its storage, when the backend can see that (loop: the
    /// volume file's allocated blocks). Reclaim space reports it as the volume's consumption;
    /// `None` makes it fall back to the filesystem's used bytes.
    fn allocated_bytes(&self, _identity: &DeviceIdentity) -> Option<u64> {
        None
    }

    /// Whether the volume exists, when the backend can tell from its records without waiting
    /// (loop: its volume record); `None` when only resolving can tell (EBS).
    fn exists(&self, _volume: &VolumeId) -> Result<Option<bool>> {
        Ok(None)
    }
}

/// Reads the major:minor of a block device node.
pub fn block_dev_numbers(device: &Path) -> std::io::Result<(u32, u32)> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let meta = std::fs::metadata(device)?;
    if !meta.file_type().is_block_device() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{} is not a block device", device.display()),
        ));
    }
    let rdev = meta.rdev();
    Ok((
        nix::sys::stat::major(rdev) as u32,
        nix::sys::stat::minor(rdev) as u32,
    ))
}
