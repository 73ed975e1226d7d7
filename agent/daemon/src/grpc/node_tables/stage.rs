//! Stage and unstage: a table each, through the v1 and the v0.3 doors.

use tonic::Code;

use super::Given::{Attached, Failing, Published, Staged, StagedBlock};
use super::{Case, Rig, VOL, block_cap, csi, mount_cap, run_table, stage_req, to_v0, v0_door};
use csi::node_server::Node;

fn unstage_req(rig: &Rig) -> csi::NodeUnstageVolumeRequest {
    csi::NodeUnstageVolumeRequest {
        volume_id: VOL.into(),
        staging_target_path: rig.staging(),
    }
}

const MKFS_AND_MOUNT: &[&str] = &["mkfs ext4 dev-vol-a", "mount ext4 dev-vol-a on vol-a"];

fn node_stage_volume_rows() -> Vec<Case<csi::NodeStageVolumeRequest>> {
    vec![
        Case {
            name: "a blank device is formatted and mounted",
            given: &[Attached],
            request: |r| stage_req(r, mount_cap("ext4")),
            code: Code::Ok,
            calls: MKFS_AND_MOUNT,
        },
        Case {
            name: "raw block mounts nothing",
            given: &[Attached],
            request: |r| stage_req(r, block_cap()),
            code: Code::Ok,
            calls: &[],
        },
        Case {
            name: "again, the same: nothing more",
            given: &[Staged],
            request: |r| stage_req(r, mount_cap("ext4")),
            code: Code::Ok,
            calls: &[],
        },
        Case {
            name: "again as raw block: another access",
            given: &[Staged],
            request: |r| stage_req(r, block_cap()),
            code: Code::AlreadyExists,
            calls: &[],
        },
        Case {
            name: "again with another filesystem",
            given: &[Staged],
            request: |r| stage_req(r, mount_cap("xfs")),
            code: Code::AlreadyExists,
            calls: &[],
        },
        Case {
            name: "again at another path",
            given: &[Staged],
            request: |r| csi::NodeStageVolumeRequest {
                staging_target_path: r.at("staging/other"),
                ..stage_req(r, mount_cap("ext4"))
            },
            code: Code::AlreadyExists,
            calls: &[],
        },
        Case {
            name: "no device attached",
            given: &[],
            request: |r| stage_req(r, mount_cap("ext4")),
            code: Code::NotFound,
            calls: &[],
        },
        Case {
            name: "no volume id",
            given: &[Attached],
            request: |r| csi::NodeStageVolumeRequest {
                volume_id: String::new(),
                ..stage_req(r, mount_cap("ext4"))
            },
            code: Code::InvalidArgument,
            calls: &[],
        },
        Case {
            name: "no staging path",
            given: &[Attached],
            request: |r| csi::NodeStageVolumeRequest {
                staging_target_path: String::new(),
                ..stage_req(r, mount_cap("ext4"))
            },
            code: Code::InvalidArgument,
            calls: &[],
        },
        Case {
            name: "no capability",
            given: &[Attached],
            request: |r| csi::NodeStageVolumeRequest {
                volume_capability: None,
                ..stage_req(r, mount_cap("ext4"))
            },
            code: Code::InvalidArgument,
            calls: &[],
        },
        Case {
            name: "a filesystem the agent does not make",
            given: &[Attached],
            request: |r| stage_req(r, mount_cap("ntfs")),
            code: Code::InvalidArgument,
            calls: &[],
        },
        Case {
            name: "a staging path outside the allowed roots",
            given: &[Attached],
            request: |r| csi::NodeStageVolumeRequest {
                staging_target_path: "/etc/staging".into(),
                ..stage_req(r, mount_cap("ext4"))
            },
            code: Code::InvalidArgument,
            calls: &[],
        },
        Case {
            name: "a relative staging path",
            given: &[Attached],
            request: |r| csi::NodeStageVolumeRequest {
                staging_target_path: "staging/vol-a".into(),
                ..stage_req(r, mount_cap("ext4"))
            },
            code: Code::InvalidArgument,
            calls: &[],
        },
        Case {
            name: "mkfs fails: nothing mounted",
            given: &[Attached, Failing("mkfs", "EIO")],
            request: |r| stage_req(r, mount_cap("ext4")),
            code: Code::Internal,
            calls: &["mkfs ext4 dev-vol-a"],
        },
        Case {
            name: "the mount fails",
            given: &[Attached, Failing("mount", "EIO")],
            request: |r| stage_req(r, mount_cap("ext4")),
            code: Code::Internal,
            calls: MKFS_AND_MOUNT,
        },
    ]
}

through_both_doors!(
    node_stage_volume,
    node_stage_volume_rows,
    NodeStageVolumeRequest
);

fn node_unstage_volume_rows() -> Vec<Case<csi::NodeUnstageVolumeRequest>> {
    vec![
        Case {
            name: "a staged volume is unmounted",
            given: &[Staged],
            request: unstage_req,
            code: Code::Ok,
            calls: &["unmount vol-a"],
        },
        Case {
            name: "raw block: nothing to unmount",
            given: &[StagedBlock],
            request: unstage_req,
            code: Code::Ok,
            calls: &[],
        },
        Case {
            name: "still published",
            given: &[Staged, Published],
            request: unstage_req,
            code: Code::FailedPrecondition,
            calls: &[],
        },
        Case {
            name: "a volume never seen: done already",
            given: &[],
            request: unstage_req,
            code: Code::Ok,
            calls: &[],
        },
        Case {
            name: "no volume id",
            given: &[Staged],
            request: |r| csi::NodeUnstageVolumeRequest {
                volume_id: String::new(),
                ..unstage_req(r)
            },
            code: Code::InvalidArgument,
            calls: &[],
        },
        Case {
            name: "no staging path",
            given: &[Staged],
            request: |r| csi::NodeUnstageVolumeRequest {
                staging_target_path: String::new(),
                ..unstage_req(r)
            },
            code: Code::InvalidArgument,
            calls: &[],
        },
        Case {
            name: "the unmount fails",
            given: &[Staged, Failing("unmount", "EIO")],
            request: unstage_req,
            code: Code::Internal,
            calls: &["unmount vol-a"],
        },
    ]
}

through_both_doors!(
    node_unstage_volume,
    node_unstage_volume_rows,
    NodeUnstageVolumeRequest
);
