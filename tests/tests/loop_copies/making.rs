//! DeleteVolume of a volume whose first contents are still being copied (a clone) is ABORTED:
//! it unlinked the file the copy was writing, and the CreateVolume then failed INTERNAL (a
//! twenty-second fresh review's F4). So is every other controller call on it: an attach, an
//! expansion, a snapshot and a clone of a file still being written answered INTERNAL (a
//! twenty-third fresh review's low).

use super::*;

#[tokio::test]
async fn a_volume_still_being_made_is_not_deleted_under_its_copy() {
    if !require_root("a_volume_still_being_made_is_not_deleted_under_its_copy") {
        return;
    }
    let scratch = Scratch::new("delete-making");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let src = create_volume(&agent, "src", 1024 * MIB, &[]).await;
    let (v, staging, target) = mount(&agent, &src, "src").await;
    sh(&format!(
        "dd if=/dev/urandom of={}/data bs=1M count=400 status=none; sync",
        target.display()
    ));
    unmount(&agent, &v, &staging, &target).await;
    let node = node_id(&agent).await;
    let mut seen_during_copy = 0;
    for round in 0..3 {
        let name = format!("clone-{round}");
        let req = from_source(&name, 1024 * MIB, of_volume(&src));
        let mut c = agent.controller().await;
        let creating = tokio::spawn(async move { c.create_volume(req).await });
        // The new id, as ListVolumes shows it while the copy runs.
        let mut id = None;
        while id.is_none() && !creating.is_finished() {
            let listed = agent
                .controller()
                .await
                .list_volumes(csi::ListVolumesRequest::default())
                .await
                .expect("list")
                .into_inner();
            id = listed
                .entries
                .iter()
                .filter_map(|e| e.volume.as_ref())
                .find(|vol| vol.volume_id != src && !vol.volume_id.is_empty())
                .map(|vol| vol.volume_id.clone());
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        let Some(id) = id else { continue };
        let others = calls_on_a_volume_being_made(&agent, &id, &node, round).await;
        let deleted = agent
            .controller()
            .await
            .delete_volume(csi::DeleteVolumeRequest {
                volume_id: id.clone(),
                ..Default::default()
            })
            .await;
        let created = creating.await.expect("join");
        if deleted.is_ok() && created.is_ok() {
            // The copy had finished first: nothing to learn from this round; the next one.
            continue;
        }
        seen_during_copy += 1;
        let e = deleted.expect_err("deleted under its copy");
        assert_eq!(e.code(), Code::Aborted, "{e:?}");
        for (call, got) in others {
            assert!(
                matches!(got, Code::Aborted | Code::Ok),
                "{call} of a volume still being copied: {got:?}"
            );
        }
        created.expect("the copy finished despite the delete");
        break;
    }
    assert!(
        seen_during_copy > 0,
        "no delete landed during a copy in three rounds"
    );
}

/// ControllerPublishVolume, ControllerExpandVolume, CreateSnapshot and a clone of a volume
/// whose copy is running: each is ABORTED, or OK when the copy finished first.
async fn calls_on_a_volume_being_made(
    agent: &Agent,
    id: &str,
    node: &str,
    round: usize,
) -> Vec<(&'static str, Code)> {
    let mut ctl = agent.controller().await;
    let attach = ctl
        .controller_publish_volume(csi::ControllerPublishVolumeRequest {
            volume_id: id.into(),
            node_id: node.into(),
            volume_capability: Some(ext4()),
            ..Default::default()
        })
        .await;
    let expand = ctl
        .controller_expand_volume(csi::ControllerExpandVolumeRequest {
            volume_id: id.into(),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: 1100 * MIB,
                limit_bytes: 0,
            }),
            ..Default::default()
        })
        .await;
    let snap = ctl
        .create_snapshot(csi::CreateSnapshotRequest {
            source_volume_id: id.into(),
            name: format!("of-half-{round}"),
            ..Default::default()
        })
        .await;
    let clone = ctl
        .create_volume(from_source(
            &format!("of-half-{round}"),
            1024 * MIB,
            of_volume(id),
        ))
        .await;
    // Whatever succeeded because the copy had finished is undone, so the volume can go.
    if attach.is_ok() {
        ctl.controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest {
            volume_id: id.into(),
            node_id: node.into(),
            ..Default::default()
        })
        .await
        .expect("detach");
    }
    vec![
        ("ControllerPublishVolume", code(attach)),
        ("ControllerExpandVolume", code(expand)),
        ("CreateSnapshot", code(snap)),
        ("CreateVolume from it", code(clone)),
    ]
}
