//! A release the CO was told of survives a crash: a NodeUnstageVolume (and a NodeUnpublishVolume)
//! answered OK, then a kill -9 before any later durable commit, and the volume is free at the
//! restart: ControllerUnpublishVolume and DeleteVolume succeed. Their records were lazy, so the
//! stage came back at the restart (a raw block staging leaves nothing on the host to say it went;
//! a filesystem stage whose completion was still lazy came back "interrupted") and the volume
//! stayed in use for good (a twenty-fourth fresh review's F2).

use super::*;

async fn detach_and_delete(agent: &Agent, id: &str) {
    let node_id = node_id(agent).await;
    let mut ctl = agent.controller().await;
    ctl.controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest {
        volume_id: id.into(),
        node_id,
        ..Default::default()
    })
    .await
    .expect("the detach after an acknowledged release and a crash");
    ctl.delete_volume(csi::DeleteVolumeRequest {
        volume_id: id.into(),
        ..Default::default()
    })
    .await
    .expect("the delete after an acknowledged release and a crash");
}

#[tokio::test]
async fn acknowledged_releases_survive_a_crash() {
    if !require_root("acknowledged_releases_survive_a_crash") {
        return;
    }
    let scratch = Scratch::new("releases-survive");
    let mut agent = Agent::start(&scratch, AgentOpts::default()).await;
    let cases = [
        ("block", block_cap(Mode::SingleNodeWriter), true),
        (
            "block-unpublished",
            block_cap(Mode::SingleNodeWriter),
            false,
        ),
        ("fs", mount_cap("ext4", Mode::SingleNodeWriter), true),
    ];
    for (name, cap, stage_only) in cases {
        let vol = create_attached(&agent, name, 64 << 20).await;
        let staging = agent.work.join(format!("{name}/staging"));
        let target = agent.work.join(format!("{name}/target"));
        let mut node = agent.node().await;
        node.node_stage_volume(stage_req(&vol, &staging, cap.clone()))
            .await
            .expect("stage");
        if !stage_only {
            node.node_publish_volume(publish_req(&vol, &staging, &target, cap, false))
                .await
                .expect("publish");
            node.node_unpublish_volume(unpublish_req(&vol, &target))
                .await
                .expect("unpublish");
        }
        node.node_unstage_volume(unstage_req(&vol, &staging))
            .await
            .expect("unstage");
        drop(node);
        agent.restart(None).await;
        detach_and_delete(&agent, &vol.id).await;
    }
}

/// A reboot takes a raw block publication's bind but not the file the agent made at its target:
/// kubelet's re-publish after it must bind again. Start-up recovery dropped the record of the
/// gone bind, and the retry then refused the file as not the agent's (found by the simulation
/// once its restarts ran start-up recovery).
#[tokio::test]
async fn a_block_publication_is_published_again_after_its_bind_went() {
    if !require_root("a_block_publication_is_published_again_after_its_bind_went") {
        return;
    }
    let scratch = Scratch::new("block-republish");
    let mut agent = Agent::start(&scratch, AgentOpts::default()).await;
    let cap = block_cap(Mode::SingleNodeWriter);
    let vol = create_attached(&agent, "b", 64 << 20).await;
    let staging = agent.work.join("b/staging");
    let target = agent.work.join("b/target");
    let mut node = agent.node().await;
    node.node_stage_volume(stage_req(&vol, &staging, cap.clone()))
        .await
        .expect("stage");
    node.node_publish_volume(publish_req(&vol, &staging, &target, cap.clone(), false))
        .await
        .expect("publish");
    // A later durable commit (another volume's stage intent) makes the completion durable.
    let other = create_attached(&agent, "other", 64 << 20).await;
    let other_staging = agent.work.join("other/staging");
    node.node_stage_volume(stage_req(&other, &other_staging, cap.clone()))
        .await
        .expect("stage another");
    drop(node);
    agent.kill();
    // What a reboot does to the publication: the bind goes, the file stays.
    sh(&format!("umount {}", target.display()));
    agent.restart(None).await;
    let mut node = agent.node().await;
    node.node_publish_volume(publish_req(&vol, &staging, &target, cap, false))
        .await
        .expect("the re-publish after the bind went");
    assert_eq!(mount_count(&target), 1);
    node.node_unpublish_volume(unpublish_req(&vol, &target))
        .await
        .expect("unpublish");
    node.node_unstage_volume(unstage_req(&vol, &staging))
        .await
        .expect("unstage");
    node.node_unstage_volume(unstage_req(&other, &other_staging))
        .await
        .expect("unstage another");
}

/// An acknowledged raw block unpublish, a crash before any later commit, and a file someone else
/// put at the target meanwhile: the file is not the one the publish made (that one is empty), so
/// it vouches for no publication, and the volume is free at the restart (a twenty-fifth fresh
/// review's F5: the record came back as an interrupted publish, for good).
#[tokio::test]
async fn a_foreign_file_at_a_released_block_target_vouches_for_nothing() {
    if !require_root("a_foreign_file_at_a_released_block_target_vouches_for_nothing") {
        return;
    }
    let scratch = Scratch::new("block-foreign-file");
    let mut agent = Agent::start(&scratch, AgentOpts::default()).await;
    let cap = block_cap(Mode::SingleNodeWriter);
    let vol = create_attached(&agent, "f", 64 << 20).await;
    let staging = agent.work.join("f/staging");
    let target = agent.work.join("f/target");
    let mut node = agent.node().await;
    node.node_stage_volume(stage_req(&vol, &staging, cap.clone()))
        .await
        .expect("stage");
    node.node_publish_volume(publish_req(&vol, &staging, &target, cap, false))
        .await
        .expect("publish");
    node.node_unpublish_volume(unpublish_req(&vol, &target))
        .await
        .expect("unpublish");
    drop(node);
    agent.kill();
    std::fs::write(&target, "foreign").expect("someone's file");
    agent.restart(None).await;
    agent
        .node()
        .await
        .node_unstage_volume(unstage_req(&vol, &staging))
        .await
        .expect("unstage");
    detach_and_delete(&agent, &vol.id).await;
    assert_eq!(
        std::fs::read_to_string(&target).ok().as_deref(),
        Some("foreign"),
        "the foreign file was touched"
    );
}
