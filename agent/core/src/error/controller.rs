//! The controller side's refusals: the loop backend's volumes, snapshots and attachments, each
//! naming the volume, snapshot, name or node (codes chosen in `grpc::to_status`).

#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    #[error("snapshot {id} does not exist")]
    SnapshotNotFound { id: String },
    /// A content source (`kind`: snapshot or volume) that is not there.
    #[error("source {kind} {id} does not exist")]
    SourceNotFound { kind: &'static str, id: String },
    #[error("source snapshot {snapshot} is still being taken; retry shortly")]
    SourceNotReady { snapshot: String },
    #[error("node {node:?} does not exist: the loop backend serves only node {serves:?}")]
    UnknownNode { node: String, serves: String },
    #[error("starting_token {token:?} is not a token this plugin gave out")]
    UnknownStartingToken { token: String },
    #[error("a node operation is using the device of volume {volume} right now; retry later")]
    DeviceOfVolumeBusy { volume: String },
    #[error("snapshot {name:?} exists as {existing}, of volume {of_volume}")]
    SnapshotNameTaken {
        name: String,
        existing: String,
        of_volume: String,
    },
    #[error(
        "volume {name:?} exists as {existing} with {bytes} bytes and other parameters or another \
         source"
    )]
    VolumeNameTaken {
        name: String,
        existing: String,
        bytes: u64,
    },
    #[error(
        "volume {volume} is already attached to node {node} with readonly={readonly}; \
         ControllerUnpublishVolume it before attaching it with readonly={asked}"
    )]
    AttachedWithOtherReadonly {
        volume: String,
        node: String,
        readonly: bool,
        asked: bool,
    },
    #[error(
        "node {node} already has {attached} volumes attached, its limit (--volume-attach-limit \
         {limit}); detach one first"
    )]
    AttachLimitReached {
        node: String,
        attached: usize,
        limit: u32,
    },
    /// A volume or snapshot file that does not fit the volume directory's filesystem (ENOSPC,
    /// EDQUOT): the CO may retry after space is freed.
    #[error("{op}: {source}")]
    NoSpace { op: String, source: std::io::Error },
    /// A mounted volume whose filesystem cannot be frozen for a consistent copy.
    #[error(
        "{} is mounted, but its filesystem cannot be frozen for a consistent copy ({why}); retry \
         once the mount is reachable", .device.display()
    )]
    CannotFreeze {
        device: std::path::PathBuf,
        why: String,
    },
}
