//! Publish and unpublish: a table each, through the v1 and the v0.3 doors.

use tonic::Code;

use super::Given::{Attached, Failing, Published, Staged, StagedBlock};
use super::{Case, Rig, VOL, block_cap, csi, mount_cap, publish_req, run_table, to_v0, v0_door};
use csi::node_server::Node;

fn unpublish_req(rig: &Rig) -> csi::NodeUnpublishVolumeRequest {
    csi::NodeUnpublishVolumeRequest {
        volume_id: VOL.into(),
        target_path: rig.target(),
    }
}

fn node_publish_volume_rows() -> Vec<Case<csi::NodePublishVolumeRequest>> {
    vec![
        Case {
            name: "a staged volume is bound at the target",
            given: &[Staged],
            request: |r| publish_req(r, mount_cap("ext4")),
            code: Code::Ok,
            calls: &["bind vol-a on mount"],
        },
        Case {
            name: "read-only",
            given: &[Staged],
            request: |r| csi::NodePublishVolumeRequest {
                readonly: true,
                ..publish_req(r, mount_cap("ext4"))
            },
            code: Code::Ok,
            calls: &["bind vol-a on mount ro"],
        },
        Case {
            name: "raw block: the device is bound",
            given: &[StagedBlock],
            request: |r| publish_req(r, block_cap()),
            code: Code::Ok,
            calls: &["bind dev-vol-a on mount"],
        },
        Case {
            name: "again, the same: nothing more",
            given: &[Staged, Published],
            request: |r| publish_req(r, mount_cap("ext4")),
            code: Code::Ok,
            calls: &[],
        },
        Case {
            name: "again read-only: incompatible",
            given: &[Staged, Published],
            request: |r| csi::NodePublishVolumeRequest {
                readonly: true,
                ..publish_req(r, mount_cap("ext4"))
            },
            code: Code::AlreadyExists,
            calls: &[],
        },
        Case {
            name: "not staged",
            given: &[Attached],
            request: |r| publish_req(r, mount_cap("ext4")),
            code: Code::FailedPrecondition,
            calls: &[],
        },
        Case {
            name: "as raw block, staged as a filesystem",
            given: &[Staged],
            request: |r| publish_req(r, block_cap()),
            code: Code::FailedPrecondition,
            calls: &[],
        },
        Case {
            name: "no staging path",
            given: &[Staged],
            request: |r| csi::NodePublishVolumeRequest {
                staging_target_path: String::new(),
                ..publish_req(r, mount_cap("ext4"))
            },
            code: Code::FailedPrecondition,
            calls: &[],
        },
        Case {
            name: "no target path",
            given: &[Staged],
            request: |r| csi::NodePublishVolumeRequest {
                target_path: String::new(),
                ..publish_req(r, mount_cap("ext4"))
            },
            code: Code::InvalidArgument,
            calls: &[],
        },
        Case {
            name: "no capability",
            given: &[Staged],
            request: |r| csi::NodePublishVolumeRequest {
                volume_capability: None,
                ..publish_req(r, mount_cap("ext4"))
            },
            code: Code::InvalidArgument,
            calls: &[],
        },
        Case {
            name: "a volume never seen: not staged",
            given: &[],
            request: |r| publish_req(r, mount_cap("ext4")),
            code: Code::FailedPrecondition,
            calls: &[],
        },
        Case {
            name: "a target outside the allowed roots",
            given: &[Staged],
            request: |r| csi::NodePublishVolumeRequest {
                target_path: "/etc/target".into(),
                ..publish_req(r, mount_cap("ext4"))
            },
            code: Code::InvalidArgument,
            calls: &[],
        },
        Case {
            name: "the bind fails",
            given: &[Staged, Failing("bind", "EIO")],
            request: |r| publish_req(r, mount_cap("ext4")),
            code: Code::Internal,
            calls: &["bind vol-a on mount"],
        },
    ]
}

through_both_doors!(
    node_publish_volume,
    node_publish_volume_rows,
    NodePublishVolumeRequest
);

fn node_unpublish_volume_rows() -> Vec<Case<csi::NodeUnpublishVolumeRequest>> {
    vec![
        Case {
            name: "a publication is unmounted",
            given: &[Staged, Published],
            request: unpublish_req,
            code: Code::Ok,
            calls: &["unmount mount"],
        },
        Case {
            name: "nothing published there: done already",
            given: &[Staged],
            request: unpublish_req,
            code: Code::Ok,
            calls: &[],
        },
        Case {
            name: "a volume never seen: done already",
            given: &[],
            request: unpublish_req,
            code: Code::Ok,
            calls: &[],
        },
        Case {
            name: "no volume id",
            given: &[Staged, Published],
            request: |r| csi::NodeUnpublishVolumeRequest {
                volume_id: String::new(),
                ..unpublish_req(r)
            },
            code: Code::InvalidArgument,
            calls: &[],
        },
        Case {
            name: "no target path",
            given: &[Staged, Published],
            request: |r| csi::NodeUnpublishVolumeRequest {
                target_path: String::new(),
                ..unpublish_req(r)
            },
            code: Code::InvalidArgument,
            calls: &[],
        },
        Case {
            name: "the unmount fails",
            given: &[Staged, Published, Failing("unmount", "EIO")],
            request: unpublish_req,
            code: Code::Internal,
            calls: &["unmount mount"],
        },
    ]
}

through_both_doors!(
    node_unpublish_volume,
    node_unpublish_volume_rows,
    NodeUnpublishVolumeRequest
);
