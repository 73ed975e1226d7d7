//! Stats (with volume condition), expansion, capabilities and node info: one table each.

use tonic::{Code, Request};

use super::Given::{Failing, Grown, Published, Staged, StagedBlock};
use super::{Case, GIB, Rig, VOL, csi, run_table};
use csi::node_server::Node;

fn stats_req(rig: &Rig) -> csi::NodeGetVolumeStatsRequest {
    csi::NodeGetVolumeStatsRequest {
        volume_id: VOL.into(),
        volume_path: rig.target(),
        staging_target_path: rig.staging(),
    }
}

fn expand_req(rig: &Rig) -> csi::NodeExpandVolumeRequest {
    csi::NodeExpandVolumeRequest {
        volume_id: VOL.into(),
        volume_path: rig.staging(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: 2 * GIB as i64,
            limit_bytes: 0,
        }),
        ..Default::default()
    }
}

#[tokio::test]
async fn node_get_volume_stats() {
    let rows: Vec<Case<csi::NodeGetVolumeStatsRequest>> = vec![
        Case {
            name: "a publication's usage: read only",
            given: &[Staged, Published],
            request: stats_req,
            code: Code::Ok,
            calls: &[],
        },
        Case {
            name: "at the staging path",
            given: &[Staged],
            request: |r| csi::NodeGetVolumeStatsRequest {
                volume_path: r.staging(),
                ..stats_req(r)
            },
            code: Code::Ok,
            calls: &[],
        },
        Case {
            name: "a path where the volume is not",
            given: &[Staged],
            request: stats_req,
            code: Code::NotFound,
            calls: &[],
        },
        Case {
            name: "a volume never seen",
            given: &[],
            request: stats_req,
            code: Code::NotFound,
            calls: &[],
        },
        Case {
            name: "no volume id",
            given: &[Staged, Published],
            request: |r| csi::NodeGetVolumeStatsRequest {
                volume_id: String::new(),
                ..stats_req(r)
            },
            code: Code::InvalidArgument,
            calls: &[],
        },
        Case {
            name: "no volume path",
            given: &[Staged, Published],
            request: |r| csi::NodeGetVolumeStatsRequest {
                volume_path: String::new(),
                ..stats_req(r)
            },
            code: Code::InvalidArgument,
            calls: &[],
        },
        Case {
            name: "a path outside the allowed roots is not the volume's",
            given: &[Staged, Published],
            request: |r| csi::NodeGetVolumeStatsRequest {
                volume_path: "/etc".into(),
                ..stats_req(r)
            },
            code: Code::NotFound,
            calls: &[],
        },
    ];
    run_table("v1", rows, async |rig: &Rig, r| {
        rig.svc.node_get_volume_stats(Request::new(r)).await
    })
    .await;
}

#[tokio::test]
async fn node_expand_volume() {
    let rows: Vec<Case<csi::NodeExpandVolumeRequest>> = vec![
        Case {
            name: "a mounted filesystem grows online",
            given: &[Staged, Grown],
            request: expand_req,
            code: Code::Ok,
            calls: &["grow ext4 dev-vol-a mounted"],
        },
        Case {
            name: "raw block: the device's size, nothing grown",
            given: &[StagedBlock, Grown],
            request: expand_req,
            code: Code::Ok,
            calls: &[],
        },
        Case {
            name: "the grow tool fails",
            given: &[Staged, Grown, Failing("grow", "EIO")],
            request: expand_req,
            code: Code::Internal,
            calls: &["grow ext4 dev-vol-a mounted"],
        },
        Case {
            name: "a limit below what is required",
            given: &[Staged, Grown],
            request: |r| csi::NodeExpandVolumeRequest {
                capacity_range: Some(csi::CapacityRange {
                    required_bytes: 2 * GIB as i64,
                    limit_bytes: GIB as i64,
                }),
                ..expand_req(r)
            },
            code: Code::OutOfRange,
            calls: &[],
        },
        Case {
            name: "a volume never seen",
            given: &[],
            request: expand_req,
            code: Code::NotFound,
            calls: &[],
        },
        Case {
            name: "no volume id",
            given: &[Staged, Grown],
            request: |r| csi::NodeExpandVolumeRequest {
                volume_id: String::new(),
                ..expand_req(r)
            },
            code: Code::InvalidArgument,
            calls: &[],
        },
        Case {
            name: "no volume path",
            given: &[Staged, Grown],
            request: |r| csi::NodeExpandVolumeRequest {
                volume_path: String::new(),
                ..expand_req(r)
            },
            code: Code::InvalidArgument,
            calls: &[],
        },
        Case {
            name: "a path where the volume is not",
            given: &[Staged, Grown],
            request: |r| csi::NodeExpandVolumeRequest {
                volume_path: r.target(),
                ..expand_req(r)
            },
            code: Code::NotFound,
            calls: &[],
        },
    ];
    run_table("v1", rows, async |rig: &Rig, r| {
        rig.svc.node_expand_volume(Request::new(r)).await
    })
    .await;
}

#[tokio::test]
async fn capabilities_and_info_touch_nothing() {
    let rig = Rig::new();
    let caps = rig
        .svc
        .node_get_capabilities(Request::new(Default::default()))
        .await
        .expect("capabilities")
        .into_inner();
    assert_eq!(caps.capabilities.len(), 5, "{caps:?}");
    let info = rig
        .svc
        .node_get_info(Request::new(Default::default()))
        .await
        .expect("info")
        .into_inner();
    assert_eq!(
        (info.node_id.as_str(), info.max_volumes_per_node),
        ("node-1", 25)
    );
    assert_eq!(rig.h.host.calls(), Vec::<String>::new());
}
