//! Problems 3, 4, 5, 6 and 9: what a failure or a crash leaves behind.

use ebs_tests::csi_req::*;
use ebs_tests::*;

use csi::volume_capability::access_mode::Mode;
use tonic::Code;

use super::{MIB, fs_cap, is_mounted, published};

#[tokio::test]
async fn a_failed_mkfs_never_licenses_formatting_over_new_data() {
    if !require_root("a_failed_mkfs_never_licenses_formatting_over_new_data") {
        return;
    }
    let scratch = Scratch::new("own-mkfs-failed");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let vol = create_attached(&agent, "v", 64 * MIB).await;
    let staging = agent.work.join("staging/v");
    let mut node = agent.node().await;
    // mke2fs refuses an inode larger than the block: the format intent is journaled, mkfs fails.
    let mut req = stage_req(&vol, &staging, fs_cap());
    req.volume_context = [("blockSize", "1024"), ("inodeSize", "4096")]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    node.node_stage_volume(req)
        .await
        .expect_err("mkfs must fail");
    // Someone writes data to the device in between.
    sh(&format!(
        "printf 'user data that must survive' | dd of={} bs=1 seek=65536 conv=notrunc status=none && sync",
        vol.device
    ));
    let before = checksum(std::path::Path::new(&vol.device));
    let e = node
        .node_stage_volume(stage_req(&vol, &staging, fs_cap()))
        .await
        .expect_err("the device is no longer blank");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert_eq!(
        checksum(std::path::Path::new(&vol.device)),
        before,
        "bytes unchanged"
    );
    assert!(!is_mounted(&staging));
}

#[tokio::test]
async fn publish_needs_the_volume_at_its_staging_path() {
    if !require_root("publish_needs_the_volume_at_its_staging_path") {
        return;
    }
    let scratch = Scratch::new("own-staging-gone");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let vol = create_attached(&agent, "v", 64 * MIB).await;
    let staging = agent.work.join("staging/v");
    let target = agent.work.join("pods/v/mount");
    let mut node = agent.node().await;
    node.node_stage_volume(stage_req(&vol, &staging, fs_cap()))
        .await
        .unwrap();
    sh(&format!("umount {}", staging.display()));
    let e = node
        .node_publish_volume(publish_req(&vol, &staging, &target, fs_cap(), false))
        .await
        .expect_err("the staging path holds the root filesystem's empty directory");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(!is_mounted(&target));
}

#[tokio::test]
async fn a_failed_stage_never_blocks_a_corrected_retry() {
    if !require_root("a_failed_stage_never_blocks_a_corrected_retry") {
        return;
    }
    let scratch = Scratch::new("own-retry");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let mut node = agent.node().await;
    // The kernel refuses inode_readahead_blks that is not a power of two: mount(2) fails.
    let bad = mount_cap_flags("ext4", Mode::SingleNodeWriter, &["inode_readahead_blks=3"]);
    for (name, retry_elsewhere) in [("same", false), ("moved", true)] {
        let vol = create_attached(&agent, name, 64 * MIB).await;
        let staging = agent.work.join(format!("staging/{name}"));
        node.node_stage_volume(stage_req(&vol, &staging, bad.clone()))
            .await
            .expect_err("mount(2) refuses the option");
        let staging = if retry_elsewhere {
            agent.work.join(format!("staging/{name}-2"))
        } else {
            staging
        };
        node.node_stage_volume(stage_req(&vol, &staging, fs_cap()))
            .await
            .unwrap_or_else(|e| panic!("{name}: the corrected retry must succeed: {e:?}"));
        assert!(is_mounted(&staging));
    }
}

#[tokio::test]
async fn a_crash_right_after_publish_leaves_a_healthy_volume() {
    if !require_root("a_crash_right_after_publish_leaves_a_healthy_volume") {
        return;
    }
    let scratch = Scratch::new("own-crash-publish");
    let mut agent = Agent::start(&scratch, AgentOpts::default()).await;
    let (vol, _staging, target) = published(&agent, "v").await;
    agent.kill();
    agent.spawn().await;
    let status = agent.status_json();
    let v = status["volumes"]
        .as_array()
        .and_then(|vs| vs.iter().find(|v| v["volume_id"] == vol.id.as_str()))
        .cloned()
        .expect("volume in status");
    assert_eq!(v["published"][0]["progress"], "complete", "{v}");
    let r = agent
        .node()
        .await
        .node_get_volume_stats(stats_req(&vol.id, &target))
        .await
        .unwrap()
        .into_inner();
    let condition = r.volume_condition.expect("condition");
    assert!(!condition.abnormal, "{}", condition.message);
}

#[tokio::test]
async fn a_failed_commit_is_visible_and_recovers_without_restart() {
    if !require_root("a_failed_commit_is_visible_and_recovers_without_restart") {
        return;
    }
    let scratch = Scratch::new("own-full-disk");
    let (agent, state) = on_a_small_state_disk(&scratch).await;
    let vol = create_attached(&agent, "v", 64 * MIB).await;
    let filler = state.join("filler");
    sh(&format!(
        "dd if=/dev/zero of={} bs=64k status=none 2>/dev/null; sync",
        filler.display()
    ));
    let create = |name: &'static str| {
        let agent = &agent;
        async move {
            agent
                .controller()
                .await
                .create_volume(csi::CreateVolumeRequest {
                    name: name.into(),
                    capacity_range: at_least(16 * MIB),
                    volume_capabilities: vec![fs_cap()],
                    ..Default::default()
                })
                .await
        }
    };
    create("full")
        .await
        .expect_err("a full state disk fails the commit");
    let probe = agent.identity().await.probe(csi::ProbeRequest {}).await;
    let not_ready = match &probe {
        Ok(r) => r.get_ref().ready == Some(false),
        Err(_) => true,
    };
    assert!(
        not_ready,
        "Probe must say the state cannot be written: {probe:?}"
    );
    std::fs::remove_file(&filler).unwrap();
    create("room-again")
        .await
        .expect("commits work again once the disk has room, without a restart");
    let probe = agent
        .identity()
        .await
        .probe(csi::ProbeRequest {})
        .await
        .expect("probe");
    assert_ne!(probe.get_ref().ready, Some(false));
    let staging = agent.work.join("staging/v");
    agent
        .node()
        .await
        .node_stage_volume(stage_req(&vol, &staging, fs_cap()))
        .await
        .expect("node work goes on");
}

/// A full state disk: the unpublish that answered OK wrote its record lazily (the unstage, durable,
/// fails until there is room), and the reopen after a failed commit rolls the file back to its
/// last durable commit (the publish's intent). The running agent checks every recorded volume against the host again (a
/// twenty-first fresh review's F4): the controller's detach is not refused for good over mounts
/// that are gone.
#[tokio::test]
async fn a_reopened_state_file_is_checked_against_the_host_again() {
    if !require_root("a_reopened_state_file_is_checked_against_the_host_again") {
        return;
    }
    let scratch = Scratch::new("own-full-rollback");
    let (agent, state) = on_a_small_state_disk(&scratch).await;
    let vol = create_attached(&agent, "v", 64 * MIB).await;
    let (staging, target) = (
        agent.work.join("staging/v"),
        agent.work.join("pods/p/mount"),
    );
    let mut node = agent.node().await;
    node.node_stage_volume(stage_req(&vol, &staging, fs_cap()))
        .await
        .expect("stage");
    node.node_publish_volume(publish_req(&vol, &staging, &target, fs_cap(), false))
        .await
        .expect("publish");
    let filler = state.join("filler");
    sh(&format!(
        "dd if=/dev/zero of={} bs=64k status=none 2>/dev/null; sync",
        filler.display()
    ));
    node.node_unpublish_volume(unpublish_req(&vol, &target))
        .await
        .expect("unpublish");
    // An unstage is durable before it answers OK (a twenty-fourth fresh review's F2): on a full
    // state disk it fails, and the retry once there is room again succeeds.
    let full = node
        .node_unstage_volume(unstage_req(&vol, &staging))
        .await
        .expect_err("an unstage answered OK with nothing durable");
    assert!(full.message().contains("No space left"), "{full:?}");
    let _ = agent
        .controller()
        .await
        .create_volume(csi::CreateVolumeRequest {
            name: "full".into(),
            capacity_range: at_least(16 * MIB),
            volume_capabilities: vec![fs_cap()],
            ..Default::default()
        })
        .await
        .expect_err("a full state disk fails the commit");
    std::fs::remove_file(&filler).unwrap();
    node.node_unstage_volume(unstage_req(&vol, &staging))
        .await
        .expect("the unstage's retry once there is room");
    let node_name = node_id(&agent).await;
    let until = std::time::Instant::now() + std::time::Duration::from_secs(15);
    loop {
        let detached = agent
            .controller()
            .await
            .controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest {
                volume_id: vol.id.clone(),
                node_id: node_name.clone(),
                ..Default::default()
            })
            .await;
        match detached {
            Ok(_) => break,
            Err(e) => assert!(
                std::time::Instant::now() < until,
                "the detach is still refused over records the reopen brought back: {e:?}"
            ),
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// An agent whose state directory is a small tmpfs (easily filled), the volume files beside it
/// on the big disk; and that state directory.
async fn on_a_small_state_disk(scratch: &Scratch) -> (Agent, std::path::PathBuf) {
    let state = scratch.join("state");
    std::fs::create_dir_all(&state).unwrap();
    sh(&format!(
        "mount -t tmpfs -o size=8m full {}",
        state.display()
    ));
    let volumes = scratch.join("volumes");
    std::fs::create_dir_all(&volumes).unwrap();
    std::os::unix::fs::symlink(&volumes, state.join("volumes")).unwrap();
    (Agent::start(scratch, AgentOpts::default()).await, state)
}
