//! Item 2: ControllerUnpublishVolume and DeleteVolume of the loop controller never pull a volume
//! from under a node call: they wait for the volume's guard (ABORTED while a node call runs) and
//! refuse a volume the node stages or publishes (FAILED_PRECONDITION).

use std::time::Duration;

use ebs_tests::csi_req::*;
use ebs_tests::*;

use csi::volume_capability::access_mode::Mode;
use tonic::Code;

use super::{MIB, backing_file, is_mounted};

const ROUNDS: u64 = 6;

#[tokio::test]
async fn controller_calls_never_pull_a_volume_from_under_a_stage() {
    let _ns = crate::NAMESPACE_COPY.read().await;
    if !require_root("controller_calls_never_pull_a_volume_from_under_a_stage") {
        return;
    }
    let scratch = Scratch::new("g-race");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let node_id = node_id(&agent).await;
    // xfs on 512 MiB: a stage that takes long enough (mkfs, then mount) for the controller
    // calls to land inside it.
    let cap = mount_cap("xfs", Mode::SingleNodeWriter);
    let mut staged_ok = 0;
    for round in 0..ROUNDS {
        let name = format!("race{round}");
        let vol = create_attached(&agent, &name, 512 * MIB).await;
        let staging = agent.work.join(format!("staging/{name}"));
        let mut node = agent.node().await;
        let stage = {
            let (mut node, req) = (node.clone(), stage_req(&vol, &staging, cap.clone()));
            tokio::spawn(async move { node.node_stage_volume(req).await })
        };
        // Each round lets the stage run a little longer before the controller starts.
        tokio::time::sleep(Duration::from_millis(round * 4)).await;
        let mut controller = agent.controller().await;
        let (mut detached, mut deleted) = (false, false);
        while !stage.is_finished() {
            let r = controller
                .controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest {
                    volume_id: vol.id.clone(),
                    node_id: node_id.clone(),
                    ..Default::default()
                })
                .await;
            match r {
                Ok(_) => detached = true,
                Err(e) => assert!(
                    matches!(e.code(), Code::Aborted | Code::FailedPrecondition),
                    "round {round}: unpublish: {e:?}"
                ),
            }
            let r = controller
                .delete_volume(csi::DeleteVolumeRequest {
                    volume_id: vol.id.clone(),
                    ..Default::default()
                })
                .await;
            match r {
                Ok(_) => deleted = true,
                Err(e) => assert!(
                    matches!(e.code(), Code::Aborted | Code::FailedPrecondition),
                    "round {round}: delete: {e:?}"
                ),
            }
        }
        let staged = stage.await.expect("stage task");
        if staged.is_err() {
            // The controller ran first: nothing of the volume may be left on the node.
            assert!(
                detached,
                "round {round}: the stage failed alone: {staged:?}"
            );
            assert!(
                !is_mounted(&staging),
                "round {round}: a failed stage left a mount"
            );
            continue;
        }
        staged_ok += 1;
        // A stage that returned OK leaves a volume that is attached, known, and unstages.
        assert!(
            !detached && !deleted,
            "round {round}: the stage returned OK, but the controller detached ({detached}) or \
             deleted ({deleted}) the volume meanwhile"
        );
        let backing = backing_file(&vol.device);
        assert!(
            backing.ends_with(&format!("{}.img", vol.id)),
            "round {round}: {} is backed by {backing:?}",
            vol.device
        );
        let status = agent.status_json().to_string();
        assert!(
            status.contains(&vol.id),
            "round {round}: status lost the volume: {status}"
        );
        // Still staged: the controller refuses until the node lets go.
        let e = controller
            .controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest {
                volume_id: vol.id.clone(),
                node_id: node_id.clone(),
                ..Default::default()
            })
            .await
            .expect_err("the volume is staged");
        assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
        let e = controller
            .delete_volume(csi::DeleteVolumeRequest {
                volume_id: vol.id.clone(),
                ..Default::default()
            })
            .await
            .expect_err("the volume is staged");
        assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
        node.node_unstage_volume(unstage_req(&vol, &staging))
            .await
            .expect("unstage");
        assert!(!is_mounted(&staging), "round {round}: unstage left a mount");
        controller
            .controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest {
                volume_id: vol.id.clone(),
                node_id: node_id.clone(),
                ..Default::default()
            })
            .await
            .expect("detach after unstage");
        controller
            .delete_volume(csi::DeleteVolumeRequest {
                volume_id: vol.id.clone(),
                ..Default::default()
            })
            .await
            .expect("delete after detach");
    }
    eprintln!("{staged_ok} of {ROUNDS} stages returned OK under the controller's calls");
    assert!(
        loops_below(&scratch.path).is_empty(),
        "loop devices left: {:?}",
        loops_below(&scratch.path)
    );
}
