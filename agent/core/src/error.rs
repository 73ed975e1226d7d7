//! The one domain error enum. Domain code returns it; the daemon's `grpc::to_status` maps it to a
//! gRPC code in one place, so the CSI-specified codes are decided once. Variants name what went
//! wrong, never which code to send.

use crate::DevNum;
use std::path::PathBuf;

use crate::format::FormatError;
use crate::ledger::LedgerError;
use crate::request::ValidationError;
use crate::seam::{CommandError, FsToolError};

mod capacity;
mod controller;
pub use capacity::CapacityError;
pub use controller::ControllerError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    #[error("volume {0} does not exist")]
    VolumeNotFound(String),
    #[error("nothing of volume {volume} is at {path}")]
    PathNotFound { volume: String, path: PathBuf },
    /// ReclaimSpace for a volume with no completed staging on this node.
    #[error("volume {volume} is not staged on this node")]
    StagedVolumeNotFound { volume: String },
    /// The device a volume's handle names is not on this node.
    #[error(
        "{backend} volume {volume}: {why}; the volume is not attached to this node at {}",
        .device.display()
    )]
    DeviceNotAttached {
        backend: &'static str,
        volume: String,
        device: PathBuf,
        why: String,
    },
    #[error(
        "{volume} is not an EBS volume id (vol-<hex>): the ebs backend cannot have it on this node"
    )]
    NotAnEbsVolumeId { volume: String },
    /// No NVMe device with the volume's serial showed up before the deadline.
    #[error(
        "volume {volume} did not appear within {:.1}s: no NVMe device with model {model:?} and \
         serial {serial}; seen: {seen}. Check that ControllerPublishVolume attached the volume to \
         this instance (the volume's attachment state in EC2), that the kernel sees it (ls \
         /sys/block; dmesg | grep nvme), and --ebs-model if this is not an EBS controller",
        .waited.as_secs_f64()
    )]
    DeviceNotAppeared {
        volume: String,
        waited: std::time::Duration,
        model: String,
        serial: String,
        seen: String,
    },
    #[error("{} is no disk the kernel shows", .device.display())]
    NoSuchDisk { device: PathBuf },
    #[error("another operation on volume {0} is in progress; retry later")]
    Busy(String),
    /// kubelet asked for the stats of a volume path whose last call has not returned.
    #[error(
        "a NodeGetVolumeStats call for volume {volume} at {} is still running (the path or the \
         device may be hanging); retry later", .path.display()
    )]
    StatsInFlight { volume: String, path: PathBuf },
    /// A controller call's guard (a volume, snapshot or name) is held by another call.
    #[error(
        "an operation on {key} is pending (a node or controller call is using it); retry later"
    )]
    OperationPending { key: String },
    /// The controller side's refusals (the loop backend's volumes, snapshots and attachments).
    #[error(transparent)]
    Controller(#[from] ControllerError),
    /// A size or range no volume, device or file can take.
    #[error(transparent)]
    Capacity(#[from] CapacityError),
    /// NodePublishVolume without a staging path: this plugin always stages.
    #[error("staging_target_path is required: this plugin stages volumes (STAGE_UNSTAGE_VOLUME)")]
    StagingPathRequired,
    /// The node's identity is not known yet (the hint says how to give it).
    #[error("{hint}")]
    NodeIdentityUnknown { hint: String },
    /// A read-only block publication's loop device kept its old size after an expansion.
    #[error(
        "volume {volume} grew to {size} bytes, but its read-only block device {} (a \
         publication's) did not follow: {why}", .device.display()
    )]
    ReadOnlyDeviceDidNotFollow {
        volume: String,
        size: u64,
        device: PathBuf,
        why: String,
    },
    // The node pipeline's refusals, each named for what it found; `grpc::to_status` chooses
    // their codes.
    /// Something other than the volume is mounted where the volume is to go.
    #[error(
        "{path} already holds {what}, which is not volume {volume}; refusing to stack another mount on it"
    )]
    ForeignMount {
        path: PathBuf,
        what: String,
        volume: String,
    },
    /// The staging path a publish would bind from holds something else.
    #[error("the staging path {path} holds {what}, not volume {volume}; refusing to publish it")]
    ForeignStaging {
        path: PathBuf,
        what: String,
        volume: String,
    },
    /// Another device showing the device's bytes is in use (`node::views`).
    #[error(
        "refusing {device} for volume {volume}: its bytes are in use through device {view} ({what}); \
         nothing was changed"
    )]
    BytesInUseElsewhere {
        volume: String,
        device: PathBuf,
        view: DevNum,
        what: String,
    },
    #[error("volume {volume} is not staged on this node; call NodeStageVolume first")]
    NotStaged { volume: String },
    #[error("volume {volume} is staged at {at}, not at {asked}")]
    StagedElsewhere {
        volume: String,
        at: PathBuf,
        asked: String,
    },
    #[error("volume {volume} is already staged at {at}")]
    AlreadyStagedAt { volume: String, at: PathBuf },
    #[error("volume {volume} is already staged at {at} with another capability")]
    StagedWithOtherCapability { volume: String, at: PathBuf },
    #[error("volume {volume} is still published at {targets}; unpublish it first")]
    StillPublished { volume: String, targets: String },
    #[error("volume {volume} is already published at {path} with other arguments")]
    PublishedWithOtherArguments { volume: String, path: PathBuf },
    /// Another call is using the staging or target path (whatever volume it names).
    #[error("another operation (volume {volume}) is using {} right now; retry later", .path.display())]
    PathBusy { path: PathBuf, volume: String },
    /// Another call holds the device (two volume ids resolving to one device).
    #[error("another operation is using device {path} ({devnum}) right now; retry later")]
    DeviceBusy { path: PathBuf, devnum: DevNum },
    /// Another volume id holds the device (staged, published, raw-bound, a format intent, or
    /// attached by the loop controller): a device has one owner.
    #[error(
        "device {device} of volume {volume} is held by volume {owner} ({door}); a device has one \
         owner: release it there first (NodeUnstageVolume, NodeUnpublishVolume or \
         ControllerUnpublishVolume of {owner}); nothing was changed"
    )]
    DeviceClaimed {
        device: PathBuf,
        volume: String,
        owner: String,
        door: &'static str,
    },
    /// Another agent on this host made the device (or one it lies on), and named it so
    /// (`ro_tag::ATTACHED_PREFIX`, `TAG_PREFIX`): that agent's records, which this one cannot
    /// read, say whose it is.
    #[error(
        "device {} of volume {volume} is another agent's: {} ({evidence}) is another \
         ebs-node-agent's on this host, whose records this agent cannot read; nothing was changed",
        .device.display(), .level.display()
    )]
    AnotherAgentsDevice {
        device: PathBuf,
        volume: String,
        level: PathBuf,
        evidence: String,
    },
    /// The kernel refused the agent's exclusive claim: mounted elsewhere, or claimed.
    #[error(
        "{path} is in use ({why}): mounted elsewhere, or claimed by another process (a mkfs \
         still running?); nothing was formatted or mounted"
    )]
    DeviceInUse { path: PathBuf, why: String },
    /// A bind of the device's node lives on (in this or another mount namespace): freeing the
    /// device, or giving it to another volume, would hand that bind the next device's bytes.
    #[error(
        "{device} is still in raw use ({at}): it is kept, and given to no other volume, until \
         nothing binds it; release it there first"
    )]
    DeviceStillBound { device: PathBuf, at: String },
    #[error("internal error: {path} is still mounted after repeated unmounts")]
    StillMounted { path: PathBuf },
    #[error("volume {volume} was staged for another access type than this publish asks for")]
    StagedForOtherAccess { volume: String },
    #[error(
        "volume {volume} is already published at {at}; its access mode allows one publication \
         on this node"
    )]
    SinglePublication { volume: String, at: PathBuf },
    /// A mount of the volume found where the agent would have made its own, but not as it
    /// would have made it (`node::adopted`).
    #[error(
        "volume {volume} is already mounted at {path}, but not as this agent mounts it \
         ({differs}); refusing to take it as the volume's: unmount it, and the call makes its own"
    )]
    MountedNotAsMade {
        volume: String,
        path: PathBuf,
        differs: String,
    },
    #[error("volume {volume} is already mounted at {path} with readonly={readonly}")]
    PublishedWithOtherReadonly {
        volume: String,
        path: PathBuf,
        readonly: bool,
    },
    #[error(
        "volume {volume} is no longer the device {device} it was staged on: {reason}; unstage \
         and stage it again"
    )]
    NoLongerTheDevice {
        volume: String,
        device: PathBuf,
        reason: String,
    },
    #[error(
        "nothing is mounted at the staging path {path}: the volume's filesystem is not there \
         (unmounted behind the agent's back?); stage the volume again"
    )]
    StagingEmpty { path: PathBuf },
    /// Something else covers (or replaced) a mount the records give the volume: the volume's
    /// own mount may lie beneath it, so nothing there is unmounted.
    #[error(
        "{path} holds {found}, which is not {expected}: it covers or replaced the volume's {what}; \
         not unmounting it"
    )]
    CoveredMount {
        path: PathBuf,
        found: String,
        expected: String,
        what: &'static str,
    },
    /// The staging mount is gone but the kernel still claims the volume's device.
    #[error(
        "the filesystem of volume {volume} is still mounted elsewhere (a publication the agent \
         has no record of?); its staging mount was removed, the volume stays staged until \
         nothing else uses it: unpublish it first"
    )]
    FilesystemInUse { volume: String },
    /// A staging or target stopped holding the volume's filesystem between its check and an act on
    /// it (a grow, the attributes of a mount adopted).
    #[error("{path} no longer holds volume {volume}'s filesystem; it was left as it is")]
    StagingChanged { path: PathBuf, volume: String },
    /// What is mounted at a path cannot be read (EIO, ENOTCONN below a dead mount, EACCES).
    #[error("cannot tell what is mounted at {path} ({source}); refusing to act on it")]
    MountUnreadable {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A request or recorded path cannot be walked for another reason than a symlink.
    #[error(
        "{field} {path} cannot be examined ({source}); refusing to act on a path that cannot be \
         proven safe (a dead NFS or FUSE mount above it?)"
    )]
    PathUnexaminable {
        field: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    /// A staging or target path that is, or nests with, another volume's.
    #[error(
        "{path} {how} the {usage} of volume {volume} ({theirs}); a volume's paths never overlap \
         another's"
    )]
    PathOfAnotherVolume {
        path: PathBuf,
        how: &'static str,
        usage: &'static str,
        volume: String,
        theirs: PathBuf,
    },
    /// The staging directory could not be made.
    #[error("staging path {path:?}: {source}")]
    StagingNotCreated {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A publish target could not be created.
    #[error("creating {path}: {source}")]
    TargetNotCreated {
        path: PathBuf,
        source: std::io::Error,
    },
    // NodeExpandVolume's refusals.
    #[error("staging of volume {volume} has not completed; stage it again before expanding")]
    StagingIncomplete { volume: String },
    #[error(
        "the device {} of volume {volume} is not the volume any more ({reason}); it cannot be \
         expanded", .device.display()
    )]
    NotTheVolumeAnyMore {
        volume: String,
        device: PathBuf,
        reason: String,
    },
    /// resize2fs on a mounted ext filesystem needs CAP_SYS_RESOURCE.
    #[error(
        "growing the mounted {fs} filesystem on {} needs CAP_SYS_RESOURCE, which the agent does \
         not have (run it privileged, or grant the capability); resize2fs said: {stderr}",
        .device.display()
    )]
    GrowNeedsCapability {
        fs: crate::request::FsType,
        device: PathBuf,
        stderr: String,
    },
    #[error(
        "volume {volume} is recorded as staged at {}, but its filesystem is not mounted there \
         (the node rebooted, or it was unmounted behind the agent's back); stage it again before \
         expanding", .at.display()
    )]
    StagingNotMounted { volume: String, at: PathBuf },
    #[error(
        "the filesystem of volume {volume} is mounted read-only at {}; it cannot be grown online",
        .at.display()
    )]
    MountedReadOnly { volume: String, at: PathBuf },
    /// ReclaimSpace on a read-only mount.
    #[error("{} is mounted read-only; free space cannot be discarded", .path.display())]
    ReadOnlyNoDiscard { path: PathBuf },
    /// A volume whose records could not be checked against the host (see `node::attention`).
    #[error(
        "volume {volume} needs attention: {reason}; nothing was done ({failed_checks} failed \
         check(s) of its records against the host; {when}); fix the cause, see `ebs-node-agent \
         status`"
    )]
    NeedsAttention {
        volume: String,
        reason: String,
        failed_checks: u32,
        when: String,
    },
    // The backends' refusals.
    /// The loop controller never detaches a volume the node stages or publishes.
    #[error(
        "volume {volume} is still in use on this node ({why}); NodeUnpublishVolume and \
         NodeUnstageVolume first"
    )]
    VolumeInUse { volume: String, why: String },
    #[error(
        "volume {volume} is still attached to node {node} as {}; ControllerUnpublishVolume first",
        .device.display()
    )]
    StillAttached {
        volume: String,
        node: String,
        device: PathBuf,
    },
    #[error("volume {volume} is attached to node {node}")]
    AttachedElsewhere { volume: String, node: String },
    #[error(
        "volume {volume} is not attached to this node (no loop device is backed by {}); call \
         ControllerPublishVolume first", .file.display()
    )]
    NotAttached { volume: String, file: PathBuf },
    #[error(
        "volume {volume}: {} cannot be told apart from other devices: {why}",
        .device.display()
    )]
    IndistinctDevice {
        volume: String,
        device: PathBuf,
        why: String,
    },
    #[error(
        "node-local volume {volume}: {} ({devnum}) is not free: its disk holds {what}; a host \
         disk is never a volume", .device.display()
    )]
    HostDisk {
        volume: String,
        device: PathBuf,
        devnum: DevNum,
        what: String,
    },
    #[error(
        "node-local volume {volume}: {} is in use (its disk {disk} is claimed: a mount in another \
         namespace, swap, device-mapper or RAID); refusing to touch it", .device.display()
    )]
    DiskClaimed {
        volume: String,
        device: PathBuf,
        disk: DevNum,
    },
    #[error(
        "volume {volume} (serial {serial}) matches several devices: {matches}; refusing to guess"
    )]
    AmbiguousSerial {
        volume: String,
        serial: String,
        matches: String,
    },
    /// A publish target that exists and is not what the bind may go onto.
    #[error("{path} {why}")]
    UnusableTarget { path: PathBuf, why: &'static str },
    #[error("{}", crate::format::wrong_device_text(.volume, .device, .reason))]
    WrongDevice {
        volume: String,
        device: PathBuf,
        reason: String,
    },
    /// The never-format rule refused, or could not judge (the core's words).
    #[error(transparent)]
    Format(#[from] FormatError),
    /// A filesystem tool failed, or is missing (the host's words).
    #[error(transparent)]
    FsTool(#[from] FsToolError),
    // ReclaimSpace's refusals of what it cannot do.
    #[error(
        "volume {volume} is staged for block access: the agent reclaims space only from a \
         filesystem it mounted (discard a raw device from the workload itself); do not retry"
    )]
    ReclaimOfBlockVolume { volume: String },
    #[error(
        "{}: the filesystem or device does not support discard; do not retry",
        .path.display()
    )]
    DiscardUnsupported { path: PathBuf },
    #[error("{}: {fs} does not implement FITRIM; do not retry", .path.display())]
    TrimUnimplemented { path: PathBuf, fs: String },
    // Refusals for now: retrying later may succeed.
    #[error("the agent is starting (start-up recovery is running); retry shortly")]
    Starting,
    #[error("volume {volume} is being checked; retry shortly")]
    BeingChecked { volume: String },
    /// The mount tables could not all be read, so no loop device number is known to be free of
    /// binds (`device_binds`).
    #[error("{op}: no device number can be told free of binds: {why}")]
    BindsUnknown { op: String, why: String },
    #[error(transparent)]
    Command(#[from] CommandError),
    #[error("{context}: {source}")]
    Io {
        context: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Store(#[from] LedgerError),
    /// A loop device call failed (the host's `LoopError`, boxed: the core cannot name it).
    #[error("internal error: {op}: {source}")]
    LoopDevice { op: String, source: BoxedError },
    /// libblkid failed on the device (the host's `BlkidError`).
    #[error("internal error: probing {}: {source}", .device.display())]
    Probe { device: PathBuf, source: BoxedError },
    #[error("internal error: {} changed right after it was laid over {}", .device.display(), .over.display())]
    ReadOnlyDeviceChanged { device: PathBuf, over: PathBuf },
    #[error(
        "internal error: the storage allocation of volume {volume} could not be read after the \
         trim"
    )]
    AllocationUnreadable { volume: String },
    #[error("internal error: the {record} record of {volume} is damaged: {source}")]
    DamagedRecord {
        record: &'static str,
        volume: String,
        source: ValidationError,
    },
    /// A blocking task did not return (it panicked, or the runtime shut down).
    #[error("internal error: blocking task failed: {source}")]
    BlockingTaskFailed { source: BoxedError },
    #[error("internal error: {what} panicked")]
    Panicked { what: String },
}

/// A lower layer's error the core cannot name (the host crate's), kept as the source.
pub type BoxedError = Box<dyn std::error::Error + Send + Sync + 'static>;

impl Error {
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
