//! Problem 1: unstage and unpublish must leave alone every mount that is not the volume's.

use ebs_tests::csi_req::*;
use ebs_tests::*;

use super::{MIB, is_mounted, published};

#[tokio::test]
async fn other_ids_never_unmount_a_volume() {
    if !require_root("other_ids_never_unmount_a_volume") {
        return;
    }
    let scratch = Scratch::new("own-other-ids");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let (a, a_staging, a_target) = published(&agent, "a").await;
    let b = create_attached(&agent, "b", 64 * MIB).await;
    let mut node = agent.node().await;
    for id in ["vol-never-created", b.id.as_str()] {
        let r = node
            .node_unpublish_volume(unpublish_by_id(id, &a_target))
            .await;
        assert!(r.is_ok(), "{id} is not published there: {r:?}");
        let r = node
            .node_unstage_volume(csi::NodeUnstageVolumeRequest {
                volume_id: id.into(),
                staging_target_path: a_staging.display().to_string(),
            })
            .await;
        assert!(r.is_ok(), "{id} is not staged there: {r:?}");
        assert!(is_mounted(&a_target), "{id}: a's publication must stay");
        assert!(is_mounted(&a_staging), "{id}: a's staging mount must stay");
        assert_eq!(std::fs::read(a_target.join("data.txt")).unwrap(), b"a");
    }
    // Its own id still takes it down.
    node.node_unpublish_volume(unpublish_req(&a, &a_target))
        .await
        .unwrap();
    node.node_unstage_volume(unstage_req(&a, &a_staging))
        .await
        .unwrap();
    assert!(!is_mounted(&a_target) && !is_mounted(&a_staging));
}

#[tokio::test]
async fn foreign_mounts_are_left_alone() {
    if !require_root("foreign_mounts_are_left_alone") {
        return;
    }
    let scratch = Scratch::new("own-foreign");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let (a, a_staging, _a_target) = published(&agent, "a").await;
    // Another pod's volume: a tmpfs mounted twice (stacked) at a path below the prefix.
    let other = agent.work.join("pods/other/mount");
    std::fs::create_dir_all(&other).unwrap();
    sh(&format!(
        "mount -t tmpfs other {0} && mount -t tmpfs other2 {0}",
        other.display()
    ));
    std::fs::write(other.join("theirs"), b"x").unwrap();
    let mut node = agent.node().await;
    let r = node.node_unpublish_volume(unpublish_req(&a, &other)).await;
    assert!(r.is_ok(), "a is not published there: {r:?}");
    let r = node
        .node_unstage_volume(csi::NodeUnstageVolumeRequest {
            volume_id: a.id.clone(),
            staging_target_path: other.display().to_string(),
        })
        .await;
    assert!(
        r.is_ok()
            || r.as_ref()
                .is_err_and(|e| e.code() == tonic::Code::FailedPrecondition),
        "{r:?}"
    );
    assert_eq!(
        mounts_below(&other).len(),
        2,
        "both foreign mounts must still be there"
    );
    assert!(other.join("theirs").exists());
    assert!(is_mounted(&a_staging));
    sh(&format!("umount {0}; umount {0}", other.display()));
}

#[tokio::test]
async fn lost_records_still_take_down_the_volumes_own_mounts() {
    if !require_root("lost_records_still_take_down_the_volumes_own_mounts") {
        return;
    }
    let scratch = Scratch::new("own-lost");
    let mut agent = Agent::start(&scratch, AgentOpts::default()).await;
    let (a, a_staging, a_target) = published(&agent, "a").await;
    agent.terminate().await;
    let out = std::process::Command::new(agent_bin())
        .args(["recover", "--reset", "--state-dir"])
        .arg(&agent.state_dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    agent.spawn().await;
    let mut node = agent.node().await;
    node.node_unpublish_volume(unpublish_req(&a, &a_target))
        .await
        .expect("unpublish with lost records");
    assert!(!is_mounted(&a_target));
    node.node_unstage_volume(unstage_req(&a, &a_staging))
        .await
        .expect("unstage with lost records");
    assert!(!is_mounted(&a_staging));
}
