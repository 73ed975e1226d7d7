//! The order in which every CSI call is checked, read off the spec's field comments and error
//! tables, in one table for v1, v0 and v0.1 alike (the older versions are translated into v1
//! requests and run through the very v1 handlers, so they meet the same rules):
//!
//! 1. A field the spec marks REQUIRED is missing: INVALID_ARGUMENT, naming the first missing
//!    field in the order listed here. Nothing else is looked at.
//! 2. The volume is unknown: NOT_FOUND (`LOOKUP`). Unknown to whom depends on the call (see
//!    `node::Known`); teardown calls have none, since theirs must succeed for anything gone.
//! 3. Then the shape of paths and values, then the state of the host and the store.
//!
//! A plugin that checked a path before the volume would tell a CO that asked about a deleted
//! volume "your path is malformed" and send it looking in the wrong place; one that checked a
//! state before a missing field would say FAILED_PRECONDITION to a request no retry can mend.

use ebs_proto::csi::v1 as csi;

use ebs_node_core::node::Known;
use ebs_node_core::request::ValidationError;

/// A REQUIRED field: its name, and whether a request carries it.
pub type Field<R> = (&'static str, fn(&R) -> bool);

/// What a request type must carry, and how its volume is looked up.
pub trait Rule: Sized + 'static {
    const RPC: &'static str;
    /// The REQUIRED fields, in the order they are checked.
    const REQUIRED: &'static [Field<Self>];
    /// Where an unknown volume is NOT_FOUND, before any path or state check; `None` where the
    /// call has no such error (teardown, or a lookup the controller makes itself).
    const LOOKUP: Option<Known> = None;
}

/// Step 1: the first REQUIRED field that is missing.
pub fn required<R: Rule>(r: &R) -> Result<(), ValidationError> {
    match R::REQUIRED.iter().find(|(_, present)| !present(r)) {
        Some((field, _)) => Err(ValidationError::Missing(field)),
        None => Ok(()),
    }
}

macro_rules! rules {
    ($($req:ident: $rpc:literal, lookup $lookup:expr, [$($field:ident: $present:expr),* $(,)?];)*) => {
        $(impl Rule for csi::$req {
            const RPC: &'static str = $rpc;
            const REQUIRED: &'static [Field<Self>] =
                &[$((stringify!($field), $present)),*];
            const LOOKUP: Option<Known> = $lookup;
        })*

        /// The table as text, for the docs and the tests: `RPC: fields (lookup)`.
        pub fn table() -> Vec<String> {
            vec![$(format!("{}: {} ({:?})", $rpc,
                <csi::$req as Rule>::REQUIRED.iter().map(|(f, _)| *f).collect::<Vec<_>>().join(", "),
                <csi::$req as Rule>::LOOKUP)),*]
        }
    };
}

rules! {
    NodeStageVolumeRequest: "NodeStageVolume", lookup Some(Known::ByBackend), [
        volume_id: |r| !r.volume_id.is_empty(),
        staging_target_path: |r| !r.staging_target_path.is_empty(),
        volume_capability: |r| r.volume_capability.is_some(),
    ];
    NodeUnstageVolumeRequest: "NodeUnstageVolume", lookup None, [
        volume_id: |r| !r.volume_id.is_empty(),
        staging_target_path: |r| !r.staging_target_path.is_empty(),
    ];
    // staging_target_path is optional in the spec; this plugin stages, so its absence is a
    // state problem (FAILED_PRECONDITION, "stage first"), checked after the volume.
    NodePublishVolumeRequest: "NodePublishVolume", lookup Some(Known::ByBackend), [
        volume_id: |r| !r.volume_id.is_empty(),
        target_path: |r| !r.target_path.is_empty(),
        volume_capability: |r| r.volume_capability.is_some(),
    ];
    NodeUnpublishVolumeRequest: "NodeUnpublishVolume", lookup None, [
        volume_id: |r| !r.volume_id.is_empty(),
        target_path: |r| !r.target_path.is_empty(),
    ];
    NodeGetVolumeStatsRequest: "NodeGetVolumeStats", lookup Some(Known::StagedHere), [
        volume_id: |r| !r.volume_id.is_empty(),
        volume_path: |r| !r.volume_path.is_empty(),
    ];
    NodeExpandVolumeRequest: "NodeExpandVolume", lookup Some(Known::StagedHere), [
        volume_id: |r| !r.volume_id.is_empty(),
        volume_path: |r| !r.volume_path.is_empty(),
    ];
    CreateVolumeRequest: "CreateVolume", lookup None, [
        name: |r| !r.name.is_empty(),
        volume_capabilities: |r| !r.volume_capabilities.is_empty(),
    ];
    DeleteVolumeRequest: "DeleteVolume", lookup None, [
        volume_id: |r| !r.volume_id.is_empty(),
    ];
    ControllerPublishVolumeRequest: "ControllerPublishVolume", lookup None, [
        volume_id: |r| !r.volume_id.is_empty(),
        node_id: |r| !r.node_id.is_empty(),
        volume_capability: |r| r.volume_capability.is_some(),
    ];
    ControllerUnpublishVolumeRequest: "ControllerUnpublishVolume", lookup None, [
        volume_id: |r| !r.volume_id.is_empty(),
    ];
    ValidateVolumeCapabilitiesRequest: "ValidateVolumeCapabilities", lookup None, [
        volume_id: |r| !r.volume_id.is_empty(),
        volume_capabilities: |r| !r.volume_capabilities.is_empty(),
    ];
    ControllerExpandVolumeRequest: "ControllerExpandVolume", lookup None, [
        volume_id: |r| !r.volume_id.is_empty(),
        capacity_range: |r| r.capacity_range.is_some(),
    ];
    ControllerGetVolumeRequest: "ControllerGetVolume", lookup None, [
        volume_id: |r| !r.volume_id.is_empty(),
    ];
    CreateSnapshotRequest: "CreateSnapshot", lookup None, [
        source_volume_id: |r| !r.source_volume_id.is_empty(),
        name: |r| !r.name.is_empty(),
    ];
    DeleteSnapshotRequest: "DeleteSnapshot", lookup None, [
        snapshot_id: |r| !r.snapshot_id.is_empty(),
    ];
    GetSnapshotRequest: "GetSnapshot", lookup None, [
        snapshot_id: |r| !r.snapshot_id.is_empty(),
    ];
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_missing_field_in_spec_order() {
        let r = csi::NodePublishVolumeRequest::default();
        assert_eq!(required(&r), Err(ValidationError::Missing("volume_id")));
        let r = csi::NodePublishVolumeRequest {
            volume_id: "v".into(),
            staging_target_path: "/s".into(),
            ..Default::default()
        };
        assert_eq!(required(&r), Err(ValidationError::Missing("target_path")));
        let r = csi::NodePublishVolumeRequest {
            volume_id: "v".into(),
            target_path: "/t".into(),
            ..Default::default()
        };
        assert_eq!(
            required(&r),
            Err(ValidationError::Missing("volume_capability"))
        );
    }

    #[test]
    fn the_table_names_every_call() {
        let t = table();
        assert!(
            t.iter()
                .any(|l| l.starts_with("NodeGetVolumeStats: volume_id, volume_path"))
        );
        assert_eq!(t.len(), 16);
    }
}
