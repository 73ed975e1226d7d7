//! Backends turn a volume id into a block device and prove that the device is the volume.

pub mod ebs;
pub mod local;
pub mod loopback;

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::Instant;

use ebs_store::DeviceIdentity;

use crate::error::Result;
use ebs_node_core::request::VolumeId;

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

    /// The identity of the device with these numbers as the host shows it now (loop: the
    /// backing file's inode; NVMe: the controller serial). `Err` says why it cannot be told.
    fn identify(&self, devnum: (u32, u32)) -> std::result::Result<DeviceIdentity, String>;

    /// What the volume's device must show, when the backend can tell without any record of the
    /// agent's (loop: its file; EBS: the serial its id gives): lost records must still let the
    /// agent prove a mount is the volume's.
    fn expected_identity(&self, volume: &VolumeId) -> Option<DeviceIdentity>;

    /// Whether `device` (a path) still carries `identity` (stats, health, expand). `Err` says
    /// why not.
    fn still_is(
        &self,
        device: &Path,
        identity: &DeviceIdentity,
    ) -> std::result::Result<(), String> {
        let devnum = ebs_node_host::device::block_devnum(device)
            .map_err(|e| format!("{}: {e}", device.display()))?;
        self.is_at(devnum, identity)
    }

    /// Whether the device with these numbers carries `identity`.
    fn is_at(
        &self,
        devnum: (u32, u32),
        identity: &DeviceIdentity,
    ) -> std::result::Result<(), String> {
        let found = self.identify(devnum)?;
        if proves(identity, &found) {
            Ok(())
        } else {
            Err(format!(
                "device {}:{} is {}, not {}",
                devnum.0,
                devnum.1,
                describe_identity(&found),
                describe_identity(identity)
            ))
        }
    }

    /// Whether the device open as `dev` (numbers `devnum`) carries `identity`, asked of that very
    /// device where the backend can (loop: LOOP_GET_STATUS64 on the fd); by its numbers
    /// otherwise.
    fn is_open_at(
        &self,
        _dev: &File,
        devnum: (u32, u32),
        identity: &DeviceIdentity,
    ) -> std::result::Result<(), String> {
        self.is_at(devnum, identity)
    }

    /// Proves, as `is_at`, and hands back the device held open when the backend opened it to ask:
    /// while that file is open the numbers keep naming the device proven (see `host::device`),
    /// so the same call need not ask again about them.
    fn prove_at(
        &self,
        devnum: (u32, u32),
        identity: &DeviceIdentity,
    ) -> std::result::Result<Option<File>, String> {
        self.is_at(devnum, identity).map(|()| None)
    }

    /// The file that holds every byte of the device open as `dev`, when the backend has one
    /// (loop: the volume file), opened and proven to be the very file bound to `dev`: the blank
    /// proof then reads every allocated byte instead of a sample. `None`: a plain block device.
    fn backing_file(
        &self,
        _dev: &File,
        _devnum: (u32, u32),
        _identity: &DeviceIdentity,
    ) -> std::result::Result<Option<ebs_node_host::blank::BackingFile>, String> {
        Ok(None)
    }

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

/// Whether what the host shows (`found`) proves the identity a volume must have (`expected`).
/// An unverified identity proves nothing: hosts without serials rest on the agent's records
/// (see the `--allow-unverified-devices` flag).
pub fn proves(expected: &DeviceIdentity, found: &DeviceIdentity) -> bool {
    match (expected, found) {
        (
            DeviceIdentity::LoopFile {
                st_dev: d1,
                st_ino: i1,
                ..
            },
            DeviceIdentity::LoopFile {
                st_dev: d2,
                st_ino: i2,
                ..
            },
        ) => d1 == d2 && i1 == i2,
        (DeviceIdentity::NvmeSerial { serial: a }, DeviceIdentity::NvmeSerial { serial: b }) => {
            a == b
        }
        _ => false,
    }
}

/// An identity in words, for messages.
pub fn describe_identity(identity: &DeviceIdentity) -> String {
    match identity {
        DeviceIdentity::LoopFile { file, .. } => format!("loop volume file {}", file.display()),
        DeviceIdentity::NvmeSerial { serial } => format!("NVMe serial {serial}"),
        DeviceIdentity::Unverified => "a device without a readable identity".into(),
    }
}
