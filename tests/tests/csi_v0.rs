//! CSI v0.3 (`csi.v0`) and v0.1 (`csi`) on the same socket as v1, driven at the same time through
//! the whole lifecycle on loop devices: v0.1's stage-inside-publish, idempotency, the codes of
//! refused steps, and one view of a volume across versions. Refusals of bad requests and
//! `--csi-versions` are in csi_v0_refusals.rs.

// NodeGetId is deprecated by the v0.3 spec itself; v0.3 plugins must still serve it.
#![allow(deprecated)]

use std::collections::HashMap;
use std::path::Path;

use ebs_tests::csi_req::*;
use ebs_tests::legacy::*;
use ebs_tests::*;

use csi::volume_capability::access_mode::Mode;
use tonic::Code;
use v0::volume_capability::access_mode::Mode as Mode0;

const SIZE: i64 = 64 << 20;

fn is_mounted(path: &Path) -> bool {
    path.parent()
        .is_some_and(|p| mounts_below(p).iter().any(|m| m == path))
}

async fn v1_lifecycle(agent: &Agent, vol: &Vol) {
    let staging = agent.work.join("v1/staging");
    let target = agent.work.join("v1/pods/p/mount");
    let cap = mount_cap("ext4", Mode::SingleNodeWriter);
    let mut node = agent.node().await;
    node.node_stage_volume(stage_req(vol, &staging, cap.clone()))
        .await
        .unwrap();
    node.node_publish_volume(publish_req(vol, &staging, &target, cap, false))
        .await
        .unwrap();
    std::fs::write(target.join("v1.txt"), b"v1").unwrap();
    node.node_unpublish_volume(unpublish_req(vol, &target))
        .await
        .unwrap();
    node.node_unstage_volume(unstage_req(vol, &staging))
        .await
        .unwrap();
}

async fn v0_lifecycle(agent: &Agent, id: &str, info: &HashMap<String, String>) {
    let staging = agent.work.join("v0/staging");
    let target = agent.work.join("v0/pods/p/mount");
    let mut node = v0_node(agent).await;
    for _ in 0..2 {
        node.node_stage_volume(v0_stage(id, info, &staging, "ext4"))
            .await
            .unwrap();
    }
    assert!(is_mounted(&staging), "v0.3 stage mounts the staging path");
    for _ in 0..2 {
        node.node_publish_volume(v0_publish(id, info, &staging, &target, "ext4"))
            .await
            .unwrap();
    }
    std::fs::write(target.join("v0.txt"), b"v0").unwrap();
    // Same target, other arguments: the spec's ALREADY_EXISTS.
    let mut ro = v0_publish(id, info, &staging, &target, "ext4");
    ro.readonly = true;
    let e = node.node_publish_volume(ro).await.unwrap_err();
    assert_eq!(e.code(), Code::AlreadyExists, "{e:?}");
    // Unstage while published: refused, nothing changes.
    let unstage = v0::NodeUnstageVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging.display().to_string(),
    };
    let e = node.node_unstage_volume(unstage.clone()).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(is_mounted(&target));
    for _ in 0..2 {
        node.node_unpublish_volume(v0::NodeUnpublishVolumeRequest {
            volume_id: id.into(),
            target_path: target.display().to_string(),
        })
        .await
        .unwrap();
    }
    assert!(!target.exists(), "unpublish removes the target");
    for _ in 0..2 {
        node.node_unstage_volume(unstage.clone()).await.unwrap();
    }
    assert!(!is_mounted(&staging));
}

async fn v01_lifecycle(agent: &Agent, id: &str, info: &HashMap<String, String>) {
    let target = agent.work.join("v01/pods/p/mount");
    let staging = agent.state_dir.join("v01-staging").join(id);
    let mut node = v01_node(agent).await;
    // A publish that fails after its internal stage unwinds the stage.
    let file = agent.work.join("v01/not-a-dir");
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    std::fs::write(&file, b"").unwrap();
    let e = node
        .node_publish_volume(v01_publish(id, info, &file.join("mount"), "ext4"))
        .await
        .unwrap_err();
    eprintln!("v0.1 publish under a file: {e:?}");
    assert!(!staging.exists(), "failed publish leaves no staging behind");
    for _ in 0..2 {
        node.node_publish_volume(v01_publish(id, info, &target, "ext4"))
            .await
            .unwrap();
    }
    assert!(is_mounted(&staging), "v0.1 publish stages internally");
    assert!(is_mounted(&target), "and bind-mounts the target");
    std::fs::write(target.join("v01.txt"), b"v0.1").unwrap();
    assert_eq!(
        std::fs::read(staging.join("v01.txt")).unwrap(),
        b"v0.1",
        "the target is a bind mount of the internal staging"
    );
    for _ in 0..2 {
        node.node_unpublish_volume(v01_unpublish(id, &target))
            .await
            .unwrap();
    }
    assert!(!target.exists(), "unpublish removes the target");
    assert!(
        !staging.exists(),
        "the last unpublish unstages and removes our directory"
    );
    assert!(mounts_below(&agent.state_dir.join("v01-staging")).is_empty());

    // Again: the filesystem is not formatted twice, the data is there.
    node.node_publish_volume(v01_publish(id, info, &target, "ext4"))
        .await
        .unwrap();
    assert_eq!(std::fs::read(target.join("v01.txt")).unwrap(), b"v0.1");
    node.node_unpublish_volume(v01_unpublish(id, &target))
        .await
        .unwrap();
    assert!(!staging.exists());
}

#[tokio::test]
async fn three_versions_one_socket_at_once() {
    if !require_root("three_versions_one_socket_at_once") {
        return;
    }
    let scratch = Scratch::new("csi-v0-all");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let node = node_id(&agent).await;

    // Each version provisions and attaches its own volume through its own Controller.
    let a = create_attached(&agent, "v1-vol", SIZE).await;
    let mut c0 = v0_controller(&agent).await;
    let b = c0
        .create_volume(v0::CreateVolumeRequest {
            name: "v0-vol".into(),
            capacity_range: Some(v0::CapacityRange {
                required_bytes: SIZE,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![v0_mount_cap("ext4", Mode0::SingleNodeWriter)],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert!(b.capacity_bytes >= SIZE);
    let b_info = c0
        .controller_publish_volume(v0::ControllerPublishVolumeRequest {
            volume_id: b.id.clone(),
            node_id: node.clone(),
            volume_capability: Some(v0_mount_cap("ext4", Mode0::SingleNodeWriter)),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .publish_info;
    assert!(b_info.contains_key("devicePath"), "{b_info:?}");
    let mut c01 = v01_controller(&agent).await;
    let c = c01
        .create_volume(v01::CreateVolumeRequest {
            version: v01_version(),
            name: "v01-vol".into(),
            capacity_range: Some(v01::CapacityRange {
                required_bytes: SIZE as u64,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![v01_mount_cap("ext4")],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .volume_info
        .unwrap();
    let c_info = c01
        .controller_publish_volume(v01::ControllerPublishVolumeRequest {
            version: v01_version(),
            volume_id: c.id.clone(),
            node_id: node.clone(),
            volume_capability: Some(v01_mount_cap("ext4")),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .publish_volume_info;

    tokio::join!(
        v1_lifecycle(&agent, &a),
        v0_lifecycle(&agent, &b.id, &b_info),
        v01_lifecycle(&agent, &c.id, &c_info),
    );
    assert!(
        mounts_below(&scratch.path).is_empty(),
        "nothing left mounted"
    );

    // Every version lists all three volumes.
    let listed = c01
        .list_volumes(v01::ListVolumesRequest {
            version: v01_version(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut ids: Vec<String> = listed
        .entries
        .iter()
        .map(|e| e.volume_info.as_ref().unwrap().id.clone())
        .collect();
    ids.sort();
    let mut want = vec![a.id.clone(), b.id.clone(), c.id.clone()];
    want.sort();
    assert_eq!(ids, want);

    // And tears down what it made.
    c0.controller_unpublish_volume(v0::ControllerUnpublishVolumeRequest {
        volume_id: b.id.clone(),
        node_id: node.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    for _ in 0..2 {
        c0.delete_volume(v0::DeleteVolumeRequest {
            volume_id: b.id.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    }
    c01.controller_unpublish_volume(v01::ControllerUnpublishVolumeRequest {
        version: v01_version(),
        volume_id: c.id.clone(),
        node_id: node.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    c01.delete_volume(v01::DeleteVolumeRequest {
        version: v01_version(),
        volume_id: c.id.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    let left = v0_controller(&agent)
        .await
        .list_volumes(v0::ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner();
    let left: Vec<&str> = left
        .entries
        .iter()
        .map(|e| e.volume.as_ref().unwrap().id.as_str())
        .collect();
    assert_eq!(left, [a.id.as_str()]);
}

#[tokio::test]
async fn volume_staged_through_v1_seen_through_v0() {
    if !require_root("volume_staged_through_v1_seen_through_v0") {
        return;
    }
    let scratch = Scratch::new("csi-v0-view");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let vol = create_attached(&agent, "view", SIZE).await;
    let staging = agent.work.join("staging/view");
    let target = agent.work.join("pods/view/mount");
    agent
        .node()
        .await
        .node_stage_volume(stage_req(
            &vol,
            &staging,
            mount_cap("ext4", Mode::SingleNodeWriter),
        ))
        .await
        .unwrap();

    // One node identity in every version.
    let id1 = node_id(&agent).await;
    let mut n0 = v0_node(&agent).await;
    let info0 = n0
        .node_get_info(v0::NodeGetInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info0.node_id, id1);
    assert!(info0.accessible_topology.is_some());
    let old0 = n0.node_get_id(v0::NodeGetIdRequest {}).await.unwrap();
    assert_eq!(old0.into_inner().node_id, id1);
    let mut n01 = v01_node(&agent).await;
    let id01 = n01
        .get_node_id(v01::GetNodeIdRequest {
            version: v01_version(),
        })
        .await
        .unwrap()
        .into_inner()
        .node_id;
    assert_eq!(id01, id1);
    let caps0 = n0
        .node_get_capabilities(v0::NodeGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner()
        .capabilities;
    assert_eq!(caps0.len(), 1, "STAGE_UNSTAGE_VOLUME only: {caps0:?}");

    // The v1 staging is the v0 staging: staging again is a no-op, publishing from it works.
    let info = vol.publish_context();
    n0.node_stage_volume(v0_stage(&vol.id, &info, &staging, "ext4"))
        .await
        .unwrap();
    let other = agent.work.join("staging/elsewhere");
    let e = n0
        .node_stage_volume(v0_stage(&vol.id, &info, &other, "ext4"))
        .await
        .unwrap_err();
    assert!(
        matches!(e.code(), Code::AlreadyExists | Code::FailedPrecondition),
        "staged elsewhere already: {e:?}"
    );
    n0.node_publish_volume(v0_publish(&vol.id, &info, &staging, &target, "ext4"))
        .await
        .unwrap();
    std::fs::write(target.join("x"), b"x").unwrap();
    assert_eq!(std::fs::read(staging.join("x")).unwrap(), b"x");

    // The controller's view is the same in v0.3 and v0.1.
    let listed0 = v0_controller(&agent)
        .await
        .list_volumes(v0::ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner();
    let v = listed0.entries[0].volume.as_ref().unwrap();
    assert_eq!(v.id, vol.id);
    let listed01 = v01_controller(&agent)
        .await
        .list_volumes(v01::ListVolumesRequest {
            version: v01_version(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let v01v = listed01.entries[0].volume_info.as_ref().unwrap();
    assert_eq!(v01v.id, vol.id);
    assert_eq!(v01v.capacity_bytes as i64, v.capacity_bytes);

    // v1 refuses to unstage what v0 published; v0 unpublishes, v1 unstages.
    let e = agent
        .node()
        .await
        .node_unstage_volume(unstage_req(&vol, &staging))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    n0.node_unpublish_volume(v0::NodeUnpublishVolumeRequest {
        volume_id: vol.id.clone(),
        target_path: target.display().to_string(),
    })
    .await
    .unwrap();
    agent
        .node()
        .await
        .node_unstage_volume(unstage_req(&vol, &staging))
        .await
        .unwrap();
    assert!(mounts_below(&scratch.path).is_empty());
}
