//! The records the agent keeps. Plain data: the store persists them, the agent gives them meaning
//! (the store keeps them under these names: `ebs_node_core::records::StagedVolume`).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Milliseconds since the Unix epoch, the one clock every record uses.
pub fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// How soon a write must be on disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// On disk when the commit returns: for records that must precede a host change.
    Immediate,
    /// Outlives the agent's crash when the commit returns, not the machine's (the store's boot
    /// log, or an fsync when the log cannot take it): for an intent that guards only what a
    /// reboot takes away with it, a mount.
    Boot,
    /// Persisted by the next immediate commit: for bookkeeping that can be re-derived.
    Lazy,
}

/// What proves that a block device is the volume: checked before anything touches the device.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum DeviceIdentity {
    /// A loop device backed by this file (inode checked, not only the path).
    LoopFile {
        file: PathBuf,
        st_dev: u64,
        st_ino: u64,
    },
    /// An NVMe namespace whose controller serial is this (EBS: the volume id without its dash).
    NvmeSerial { serial: String },
    /// A device that carries no identity we can read (Xen instances): the path is all we have.
    Unverified,
}

/// A volume of the loop backend: a sparse file under the state directory.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct LoopVolume {
    pub id: String,
    pub name: String,
    pub capacity_bytes: u64,
    pub file: PathBuf,
    pub parameters: BTreeMap<String, String>,
    pub attachment: Option<LoopAttachment>,
    pub created_unix_ms: u64,
    /// What the volume was created from (a snapshot or another volume); none for a blank one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_source: Option<LoopSource>,
}

/// The source of a loop volume's first contents.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum LoopSource {
    Snapshot { id: String },
    Volume { id: String },
}

/// A snapshot of a loop volume: a point-in-time copy of its file under the state directory,
/// independent of the volume once taken.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct LoopSnapshot {
    pub id: String,
    pub name: String,
    pub source_volume_id: String,
    pub size_bytes: u64,
    pub file: PathBuf,
    pub created_unix_ms: u64,
    /// False from the record's creation until the copy is complete and durable.
    pub ready: bool,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct LoopAttachment {
    pub node_id: String,
    pub device: PathBuf,
    pub readonly: bool,
    /// Whether the controller made the device (and so detaches it); a device someone else had
    /// already made over the file is used, never detached. Records before this field: made.
    #[serde(default = "made_by_default")]
    pub made: bool,
}

fn made_by_default() -> bool {
    true
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum FormatState {
    /// mkfs is about to run or was interrupted: the device may be formatted again, with this UUID.
    Intent,
    /// mkfs finished: the volume must never be formatted again.
    Done,
}

/// The fact that guards data: this volume was formatted by us with this filesystem and UUID.
/// Kept after unstage, so that a later stage on a different or wiped device is refused.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct FormatRecord {
    pub volume_id: String,
    pub fs_type: String,
    pub uuid: String,
    pub identity: DeviceIdentity,
    pub state: FormatState,
    pub at_unix_ms: u64,
    /// Which attachment of the device an intent was journaled on (the boot's id and the
    /// kernel's disk sequence number, `boot:diskseq`). An intent licenses redoing its mkfs only
    /// on that same attachment: a device detached in between may have been written anywhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attachment: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum AccessRecord {
    Block,
    Mount {
        fs_type: String,
        mount_flags: Vec<String>,
    },
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Progress {
    /// The operation started and has not finished: a retry resumes it.
    InProgress,
    /// The operation finished.
    Complete,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct StagedVolume {
    pub volume_id: String,
    pub staging_path: PathBuf,
    pub device: PathBuf,
    /// The device's numbers when it was staged: a device that vanished since can no longer be
    /// asked its identity, and its path may be gone too.
    #[serde(default)]
    pub devnum: Option<(u32, u32)>,
    pub identity: DeviceIdentity,
    pub access: AccessRecord,
    pub access_mode: i32,
    pub readonly: bool,
    pub progress: Progress,
    pub at_unix_ms: u64,
    /// For a device with no identity to prove (`DeviceIdentity::Unverified`): which attachment
    /// it was staged on (`boot:diskseq`, as `FormatRecord::attachment`). Recovery keeps a raw
    /// block staging of such a device only while the same attachment is at its numbers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attachment: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Publication {
    pub volume_id: String,
    pub target_path: PathBuf,
    pub staging_path: PathBuf,
    pub block: bool,
    pub readonly: bool,
    pub access_mode: i32,
    pub mount_flags: Vec<String>,
    pub progress: Progress,
    pub at_unix_ms: u64,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Intent,
    Done,
    Failed,
}

/// One line of a volume's step journal: what the agent was about to do or did to the host.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct StepRecord {
    pub seq: u64,
    pub op: String,
    pub step: String,
    pub phase: Phase,
    pub at_unix_ms: u64,
    pub detail: BTreeMap<String, String>,
}

/// Which door took a device for a volume id (see `node::device_claim`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ClaimDoor {
    /// The node: a stage (format intent, mount intent, raw block staging), a node-local handle,
    /// recovery's adoption. Live while its volume has a staged record, a publication or a
    /// format intent: the volume's own records end it, so unstage writes nothing more.
    Node,
    /// The loop controller's attach; ended by its detach or the volume's deletion.
    Controller,
}

/// A device held by one volume id through one door, keyed by the device's identity (the loop
/// volume file's inode, the NVMe serial; the numbers only for a device without one): a device
/// has at most one owner per door, and the node's owner is the controller's volume or acts for
/// it (see `node::device_claim`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct DeviceClaim {
    pub volume_id: String,
    pub door: ClaimDoor,
    pub identity: DeviceIdentity,
    pub at_unix_ms: u64,
    /// The volume a node-local handle's claim acts for (its publish context's `volumeID`): the
    /// loop controller may attach that volume's device while the handle holds it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acts_for: Option<String>,
}

impl DeviceClaim {
    /// The claim's key: its door and its device's identity.
    pub fn key(&self, devnum: Option<crate::DevNum>) -> Option<String> {
        claim_key(self.door, &self.identity, devnum)
    }
}

/// The key of `door`'s claim on the device with `identity` (and, for a device without one,
/// these numbers; `None` then without numbers).
pub fn claim_key(
    door: ClaimDoor,
    identity: &DeviceIdentity,
    devnum: Option<crate::DevNum>,
) -> Option<String> {
    let door = match door {
        ClaimDoor::Node => "node",
        ClaimDoor::Controller => "controller",
    };
    let device = match identity {
        DeviceIdentity::LoopFile { st_dev, st_ino, .. } => format!("loop:{st_dev}:{st_ino}"),
        DeviceIdentity::NvmeSerial { serial } => format!("nvme:{serial}"),
        DeviceIdentity::Unverified => format!("dev:{}", devnum?),
    };
    Some(format!("{door}/{device}"))
}
