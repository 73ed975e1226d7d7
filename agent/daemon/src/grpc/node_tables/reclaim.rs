//! NodeReclaimSpace at the CSI-Addons door: the same guard and the same core as the node calls.

use tonic::{Code, Request};

use super::Given::{Failing, Published, Staged, StagedBlock};
use super::{Case, Rig, VOL, run_table};
use crate::grpc::addons::ReclaimSpaceNodeService;
use ebs_proto::reclaimspace as rs;
use rs::reclaim_space_node_server::ReclaimSpaceNode;

fn reclaim_req(rig: &Rig) -> rs::NodeReclaimSpaceRequest {
    rs::NodeReclaimSpaceRequest {
        volume_id: VOL.into(),
        staging_target_path: rig.staging(),
        ..Default::default()
    }
}

fn addons_door(rig: &Rig) -> ReclaimSpaceNodeService {
    ReclaimSpaceNodeService {
        ctx: std::sync::Arc::clone(&rig.svc.ctx),
        roots: std::sync::Arc::clone(&rig.svc.roots),
    }
}

#[tokio::test]
async fn node_reclaim_space() {
    let rows: Vec<Case<rs::NodeReclaimSpaceRequest>> = vec![
        Case {
            name: "a staged filesystem is synced and trimmed",
            given: &[Staged],
            request: reclaim_req,
            code: Code::Ok,
            calls: &["syncfs vol-a", "fitrim vol-a"],
        },
        Case {
            name: "through a publication",
            given: &[Staged, Published],
            request: |r| rs::NodeReclaimSpaceRequest {
                staging_target_path: String::new(),
                volume_path: r.target(),
                ..reclaim_req(r)
            },
            code: Code::Ok,
            calls: &["syncfs mount", "fitrim mount"],
        },
        Case {
            name: "a volume never seen",
            given: &[],
            request: reclaim_req,
            code: Code::NotFound,
            calls: &[],
        },
        Case {
            name: "no volume id",
            given: &[Staged],
            request: |r| rs::NodeReclaimSpaceRequest {
                volume_id: String::new(),
                ..reclaim_req(r)
            },
            code: Code::InvalidArgument,
            calls: &[],
        },
        Case {
            name: "no path at all",
            given: &[Staged],
            request: |r| rs::NodeReclaimSpaceRequest {
                staging_target_path: String::new(),
                ..reclaim_req(r)
            },
            code: Code::InvalidArgument,
            calls: &[],
        },
        Case {
            name: "raw block: no filesystem to trim, not to be retried",
            given: &[StagedBlock],
            request: reclaim_req,
            code: Code::Unimplemented,
            calls: &[],
        },
        Case {
            name: "the trim fails",
            given: &[Staged, Failing("fitrim", "EIO")],
            request: reclaim_req,
            code: Code::Internal,
            calls: &["syncfs vol-a", "fitrim vol-a"],
        },
    ];
    run_table("CSI-Addons", rows, async |rig: &Rig, r| {
        addons_door(rig).node_reclaim_space(Request::new(r)).await
    })
    .await;
}
