//! A node-local volume's whole life through each door, its data checked across them.

use ebs_tests::csi_req::*;
use ebs_tests::legacy::*;
use ebs_tests::*;

use csi::volume_capability::access_mode::Mode;
use tonic::Code;
use v0::volume_capability::access_mode::Mode as Mode0;

use super::{Disk, is_mounted};

const SIZE: u64 = 64 << 20;

/// Upstream's access mode for node-local volumes: MULTI_NODE_MULTI_WRITER, mounted.
fn rwx() -> csi::VolumeCapability {
    mount_cap("ext4", Mode::MultiNodeMultiWriter)
}

#[tokio::test]
async fn a_node_local_volume_lives_through_v1_v0_and_v01() {
    let _shared = crate::NAMESPACE_COPY.read().await;
    if !require_root("a_node_local_volume_lives_through_v1_v0_and_v01") {
        return;
    }
    let scratch = Scratch::new("node-local-life");
    let mut agent = Agent::start(&scratch, AgentOpts::default()).await;
    let disk = Disk::new(&scratch, "cache", SIZE);
    let vol = disk.vol();

    // v1: stage (formats the blank disk), two pods publish it at once, both see one filesystem.
    let staging = agent.work.join("v1/staging");
    let targets = [
        agent.work.join("v1/pods/a/mount"),
        agent.work.join("v1/pods/b/mount"),
    ];
    let mut node = agent.node().await;
    for _ in 0..2 {
        node.node_stage_volume(stage_req(&vol, &staging, rwx()))
            .await
            .expect("v1 stage of a node-local handle");
    }
    assert!(is_mounted(&staging));
    let uuid = fs_uuid(&vol.device);
    for t in &targets {
        node.node_publish_volume(publish_req(&vol, &staging, t, rwx(), false))
            .await
            .expect("v1 publish");
    }
    std::fs::write(targets[0].join("cache.bin"), b"from pod a").unwrap();
    assert_eq!(
        std::fs::read(targets[1].join("cache.bin")).unwrap(),
        b"from pod a"
    );
    // A crash with the volume staged and published: the restarted agent recovers the handle's
    // records from its journal and the host, and the calls below go on from there.
    drop(node);
    agent.restart(None).await;
    let mut node = agent.node().await;
    node.node_stage_volume(stage_req(&vol, &staging, rwx()))
        .await
        .expect("stage retried after the restart");
    // Another handle for the same disk (a link to it, as udev makes): its disk holds this
    // volume's staging mount, so FAILED_PRECONDITION, and nothing is stacked on it.
    let alias = super::DevLink::new(&disk.dev);
    let mut r = stage_req(&vol, &agent.work.join("v1/alias"), rwx());
    r.volume_id = alias.handle();
    let e = node.node_stage_volume(r).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert_eq!(
        mounts_below(&agent.work).len(),
        3,
        "the staging mount and two binds"
    );
    drop(alias);
    // A second stage path for the same handle: the spec's ALREADY_EXISTS.
    let e = node
        .node_stage_volume(stage_req(&vol, &agent.work.join("v1/other"), rwx()))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::AlreadyExists, "{e:?}");
    for t in &targets {
        for _ in 0..2 {
            node.node_unpublish_volume(unpublish_req(&vol, t))
                .await
                .expect("v1 unpublish");
        }
        assert!(!t.exists());
    }
    for _ in 0..2 {
        node.node_unstage_volume(unstage_req(&vol, &staging))
            .await
            .expect("v1 unstage");
    }
    assert!(!is_mounted(&staging));

    // v0.3: the same disk, the data and the filesystem kept (never formatted twice).
    let info = disk.publish_context();
    let staging0 = agent.work.join("v0/staging");
    let target0 = agent.work.join("v0/pods/p/mount");
    let mut node0 = v0_node(&agent).await;
    let mut stage0 = v0_stage(&vol.id, &info, &staging0, "ext4");
    stage0.volume_capability = Some(v0_mount_cap("ext4", Mode0::MultiNodeMultiWriter));
    node0.node_stage_volume(stage0).await.expect("v0.3 stage");
    let mut publish0 = v0_publish(&vol.id, &info, &staging0, &target0, "ext4");
    publish0.volume_capability = Some(v0_mount_cap("ext4", Mode0::MultiNodeMultiWriter));
    node0
        .node_publish_volume(publish0)
        .await
        .expect("v0.3 publish");
    assert_eq!(
        std::fs::read(target0.join("cache.bin")).unwrap(),
        b"from pod a"
    );
    std::fs::write(target0.join("v0.bin"), b"from v0.3").unwrap();
    node0
        .node_unpublish_volume(v0::NodeUnpublishVolumeRequest {
            volume_id: vol.id.clone(),
            target_path: target0.display().to_string(),
        })
        .await
        .expect("v0.3 unpublish");
    node0
        .node_unstage_volume(v0::NodeUnstageVolumeRequest {
            volume_id: vol.id.clone(),
            staging_target_path: staging0.display().to_string(),
        })
        .await
        .expect("v0.3 unstage");
    assert!(!is_mounted(&staging0) && !target0.exists());

    // v0.1: staged inside publish, in a directory named by the escaped handle: one component
    // below the agent's v0.1 directory, never the handle's own path.
    let target01 = agent.work.join("v01/pods/p/mount");
    let v01_dir = agent.state_dir.join("v01-staging");
    let own = v01_dir.join(format!(
        "local-ebs:{}",
        disk.dev
            .display()
            .to_string()
            .trim_start_matches('/')
            .replace('/', ":")
    ));
    let mut node01 = v01_node(&agent).await;
    for _ in 0..2 {
        node01
            .node_publish_volume(v01_publish(&vol.id, &info, &target01, "ext4"))
            .await
            .expect("v0.1 publish");
    }
    assert!(is_mounted(&own), "v0.1 stages at {}", own.display());
    assert_eq!(
        std::fs::read_dir(&v01_dir).unwrap().count(),
        1,
        "one directory, no nesting"
    );
    assert_eq!(
        std::fs::read(target01.join("v0.bin")).unwrap(),
        b"from v0.3"
    );
    for _ in 0..2 {
        node01
            .node_unpublish_volume(v01_unpublish(&vol.id, &target01))
            .await
            .expect("v0.1 unpublish");
    }
    assert!(!own.exists() && !target01.exists());
    assert!(mounts_below(&agent.work).is_empty() && mounts_below(&agent.state_dir).is_empty());
    assert_eq!(
        fs_uuid(&vol.device),
        uuid,
        "formatted once, at the first stage"
    );
}

/// MULTI_NODE_MULTI_WRITER in mount mode is upstream's mode for node-local handles, and only
/// for them: an opaque id (an EBS volume, which several nodes would share) is refused it through
/// v1 and v0.3 alike, with nothing mounted, while block keeps it (io2 Multi-Attach).
#[tokio::test]
async fn multi_node_writer_mounts_are_for_node_local_handles_only() {
    let _shared = crate::NAMESPACE_COPY.read().await;
    if !require_root("multi_node_writer_mounts_are_for_node_local_handles_only") {
        return;
    }
    let scratch = Scratch::new("node-local-modes");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let shared = create_attached(&agent, "shared", SIZE as i64).await;
    let staging = agent.work.join("staging/shared");
    let mut node = agent.node().await;
    let e = node
        .node_stage_volume(stage_req(&shared, &staging, rwx()))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    let mut node0 = v0_node(&agent).await;
    let mut stage0 = v0_stage(&shared.id, &shared.publish_context(), &staging, "ext4");
    stage0.volume_capability = Some(v0_mount_cap("ext4", Mode0::MultiNodeMultiWriter));
    let e = node0.node_stage_volume(stage0).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(mounts_below(&agent.work).is_empty());
    assert!(
        blkid_type(&shared.device).is_none(),
        "the refused volume was not formatted"
    );
    node.node_stage_volume(stage_req(
        &shared,
        &staging,
        block_cap(Mode::MultiNodeMultiWriter),
    ))
    .await
    .expect("block keeps MULTI_NODE_MULTI_WRITER");
    node.node_unstage_volume(unstage_req(&shared, &staging))
        .await
        .expect("unstage");

    // The handle: allowed, and the publish context's volumeID is honoured (next test).
    let disk = Disk::new(&scratch, "local", SIZE);
    let local = disk.vol();
    let staging = agent.work.join("staging/local");
    node.node_stage_volume(stage_req(&local, &staging, rwx()))
        .await
        .expect("a handle mounts MULTI_NODE_MULTI_WRITER");
    node.node_unstage_volume(unstage_req(&local, &staging))
        .await
        .expect("unstage");
}

/// Upstream's controller puts the real volume id in the publish context; the device the handle
/// names must be that volume (loop backend: the volume's file), else FAILED_PRECONDITION and
/// nothing is touched.
#[tokio::test]
async fn the_publish_contexts_volume_id_must_be_the_device() {
    let _shared = crate::NAMESPACE_COPY.read().await;
    if !require_root("the_publish_contexts_volume_id_must_be_the_device") {
        return;
    }
    let scratch = Scratch::new("node-local-volid");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let real = create_attached(&agent, "real", SIZE as i64).await;
    let other = create_attached(&agent, "other", SIZE as i64).await;
    let handle = format!("local-ebs://{}", real.device.trim_start_matches('/'));
    let mut node = agent.node().await;
    let staging = agent.work.join("staging/v");
    let stage = |volume_id: &str| {
        let mut r = stage_req(&real, &staging, rwx());
        r.volume_id = handle.clone();
        r.publish_context
            .insert("volumeID".into(), volume_id.to_string());
        r
    };
    let before = checksum(std::path::Path::new(&real.device));
    let e = node.node_stage_volume(stage(&other.id)).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    let e = node.node_stage_volume(stage(&handle)).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert_eq!(before, checksum(std::path::Path::new(&real.device)));
    assert!(mounts_below(&agent.work).is_empty());
    node.node_stage_volume(stage(&real.id))
        .await
        .expect("the volumeID that is the device");
    node.node_unstage_volume(csi::NodeUnstageVolumeRequest {
        volume_id: handle.clone(),
        staging_target_path: staging.display().to_string(),
    })
    .await
    .expect("unstage");
}

fn blkid_type(device: &str) -> Option<String> {
    let out = std::process::Command::new("blkid")
        .args(["-p", "-o", "value", "-s", "TYPE", device])
        .output()
        .ok()?;
    let t = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (!t.is_empty()).then_some(t)
}
