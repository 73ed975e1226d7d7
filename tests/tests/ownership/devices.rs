//! Problem 2: device paths and numbers from the past are not trusted; the loop controller never
//! detaches a device the node still uses.

use ebs_tests::csi_req::*;
use ebs_tests::*;

use csi::volume_capability::access_mode::Mode;
use tonic::Code;

use super::{MIB, fs_cap, is_mounted};

fn backing_file(device: &str) -> String {
    let name = device.trim_start_matches("/dev/");
    std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file"))
        .unwrap_or_default()
        .trim()
        .to_string()
}

#[tokio::test]
async fn a_reused_device_number_is_never_published() {
    if !require_root("a_reused_device_number_is_never_published") {
        return;
    }
    let scratch = Scratch::new("own-reuse");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let a = create_attached(&agent, "a", 16 * MIB).await;
    let b_id = create_volume(&agent, "b", 16 * MIB, &[]).await;
    let b_file = agent.state_dir.join(format!("volumes/{b_id}.img"));
    std::fs::write(&b_file, b"volume b's secret bytes").unwrap();
    let cap = block_cap(Mode::SingleNodeWriter);
    let staging = agent.work.join("staging/a");
    let target = agent.work.join("pods/a/dev");
    std::fs::create_dir_all(target.parent().unwrap()).unwrap();
    let mut node = agent.node().await;
    node.node_stage_volume(stage_req(&a, &staging, cap.clone()))
        .await
        .unwrap();
    // a's device is detached behind the agent's back and its number goes to b's file. The
    // detach completes when the last opener closes the device (a probe may still hold it for a
    // moment, seen once as EBUSY), so the re-attach is retried for a few seconds.
    sh(&format!(
        "losetup -d {0} && for i in $(seq 50); do losetup {0} {1} && break; sleep 0.1; done",
        a.device,
        b_file.display()
    ));
    assert_eq!(backing_file(&a.device), b_file.display().to_string());
    let e = node
        .node_publish_volume(publish_req(&a, &staging, &target, cap, false))
        .await
        .expect_err("publishing a must not hand out b's bytes");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(!is_mounted(&target), "nothing bound at the target");
    sh(&format!("losetup -d {}", a.device));
}

#[tokio::test]
async fn the_loop_controller_never_detaches_a_device_in_use() {
    if !require_root("the_loop_controller_never_detaches_a_device_in_use") {
        return;
    }
    let scratch = Scratch::new("own-detach");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let node_id = node_id(&agent).await;
    let fs_vol = create_attached(&agent, "fs", 64 * MIB).await;
    let blk = create_attached(&agent, "blk", 16 * MIB).await;
    let mut node = agent.node().await;
    let fs_staging = agent.work.join("staging/fs");
    node.node_stage_volume(stage_req(&fs_vol, &fs_staging, fs_cap()))
        .await
        .unwrap();
    let blk_staging = agent.work.join("staging/blk");
    let blk_target = agent.work.join("pods/blk/dev");
    std::fs::create_dir_all(blk_target.parent().unwrap()).unwrap();
    let cap = block_cap(Mode::SingleNodeWriter);
    node.node_stage_volume(stage_req(&blk, &blk_staging, cap.clone()))
        .await
        .unwrap();
    node.node_publish_volume(publish_req(&blk, &blk_staging, &blk_target, cap, false))
        .await
        .unwrap();
    for vol in [&fs_vol, &blk] {
        let e = agent
            .controller()
            .await
            .controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest {
                volume_id: vol.id.clone(),
                node_id: node_id.clone(),
                ..Default::default()
            })
            .await
            .expect_err("the node still uses the volume");
        assert_eq!(e.code(), Code::FailedPrecondition, "{}: {e:?}", vol.id);
        assert!(
            backing_file(&vol.device).ends_with(&format!("{}.img", vol.id)),
            "{} must stay attached",
            vol.id
        );
    }
    assert!(is_mounted(&fs_staging) && is_mounted(&blk_target));
}
