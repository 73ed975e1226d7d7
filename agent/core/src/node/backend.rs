//! What the node pipeline needs of a backend: turn a volume id into a block device and prove
//! that a device is the volume. The backends themselves (EBS, node-local, loop) live in the
//! daemon, where they can read sysfs and the instance's metadata.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::DevNum;
use crate::error::Result;
use crate::records::DeviceIdentity;
use crate::request::VolumeId;
use crate::seam::BackingFile;

/// A device found for a volume, with what proves it is the volume.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResolvedDevice {
    pub path: PathBuf,
    pub identity: DeviceIdentity,
}

/// A device as a proof asks about it.
#[derive(Clone, Copy, Debug)]
pub enum Shown<'a> {
    /// Held open by the caller, with its numbers: asked through the fd where the backend can.
    Held(&'a File, DevNum),
    /// Only its numbers: the backend may open it to ask, and hands back what it opened.
    Numbers(DevNum),
    /// Its path (recovery of a block staging, stats, health, expand), with the numbers the
    /// caller read there (`None`: not a block device, or unreadable).
    Path(&'a Path, Option<DevNum>),
}

impl Shown<'_> {
    /// The device's numbers (a path's, read now).
    pub fn devnum(&self) -> std::result::Result<DevNum, NotProven> {
        match self {
            Shown::Held(_, devnum) | Shown::Numbers(devnum) => Ok(*devnum),
            Shown::Path(path, devnum) => devnum.ok_or_else(|| {
                NotProven::Unknown(format!(
                    "{}: not a block device, or it cannot be read",
                    path.display()
                ))
            }),
        }
    }
}

/// Why a device is not proven to be the volume's. The text says what was seen; it becomes the
/// reason of a wrong-device refusal.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotProven {
    /// The device shows another identity (another volume file, another serial).
    #[error("{0}")]
    Other(String),
    /// What the device is cannot be told now: gone, not the backend's kind, unreadable.
    #[error("{0}")]
    Unknown(String),
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

    /// `resolve` for a stage at `staging`: a backend that checks the device is free may take a
    /// mount of it at that very path as the stage's own (a retry whose records were lost).
    fn resolve_at(
        &self,
        volume: &VolumeId,
        publish_context: &HashMap<String, String>,
        volume_context: &HashMap<String, String>,
        _staging: &Path,
        deadline: Instant,
    ) -> Result<ResolvedDevice> {
        self.resolve(volume, publish_context, volume_context, deadline)
    }

    /// The identity of the device with these numbers as the host shows it now (loop: the
    /// backing file's inode; NVMe: the controller serial).
    fn identify(&self, devnum: DevNum) -> std::result::Result<DeviceIdentity, NotProven>;

    /// What the volume's device must show, when the backend can tell without any record of the
    /// agent's (loop: its file; EBS: the serial its id gives): lost records must still let the
    /// agent prove a mount is the volume's.
    fn expected_identity(&self, volume: &VolumeId) -> Option<DeviceIdentity>;

    /// Proves that `device` carries `identity`, asked of the very device where the backend can
    /// (loop: LOOP_GET_STATUS64 on the held fd), by its numbers otherwise. For a device shown by
    /// its numbers, hands back the device held open when the backend opened it to ask: while
    /// that file is open the numbers keep naming the device proven (see the host crate's
    /// `ebs_node_host::device`), so the same call need not ask again.
    fn prove(
        &self,
        device: Shown<'_>,
        identity: &DeviceIdentity,
    ) -> std::result::Result<Option<File>, NotProven> {
        let devnum = device.devnum()?;
        let found = self.identify(devnum)?;
        if proves(identity, &found) {
            Ok(None)
        } else {
            Err(NotProven::Other(format!(
                "device {} is {}, not {}",
                devnum,
                describe_identity(&found),
                describe_identity(identity)
            )))
        }
    }

    /// The file that holds every byte of the device open as `dev`, when the backend has one
    /// (loop: the volume file), opened and proven to be the very file bound to `dev`: the blank
    /// proof then reads every allocated byte instead of a sample. `None`: a plain block device.
    fn backing_file(
        &self,
        _dev: &File,
        _devnum: DevNum,
        _identity: &DeviceIdentity,
    ) -> std::result::Result<Option<BackingFile>, String> {
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

    /// The volume a device with this identity is, when the backend's own records say so (loop:
    /// the volume whose file it is). A node-local handle may take such a device only acting for
    /// that volume (its publish context's `volumeID`), attached or not.
    fn volume_of(&self, _identity: &DeviceIdentity) -> Option<String> {
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
