//! `recover --from-mounts` keeps a read-only attachment read-only (a twenty-second fresh
//! review's F2): rebuilt as writable, the next start laid a writable loop device beside the
//! read-only one, and the volume published read-only was then mounted and written read-write.

use ebs_tests::csi::volume_capability::access_mode::Mode;
use ebs_tests::csi_req::*;
use ebs_tests::*;

#[tokio::test]
async fn a_rebuilt_read_only_attachment_stays_read_only() {
    if !require_root("a_rebuilt_read_only_attachment_stays_read_only") {
        return;
    }
    let scratch = Scratch::new("rebuild-ro");
    // The node id is the host name: what `recover --from-mounts` records.
    let node = ebs_node_backends::nodeinfo::hostname();
    let mut opts = AgentOpts::default();
    opts.args.extend(["--node-id".to_string(), node.clone()]);
    let mut agent = Agent::start(&scratch, opts).await;
    let id = create_volume(&agent, "ro", 64 << 20, &[]).await;
    let cap = mount_cap("ext4", Mode::SingleNodeWriter);
    // A filesystem first, written read-write.
    let v = attach(&agent, &id).await;
    let staging = agent.work.join("ro/staging");
    let mut n = agent.node().await;
    n.node_stage_volume(stage_req(&v, &staging, cap))
        .await
        .expect("stage");
    n.node_unstage_volume(unstage_req(&v, &staging))
        .await
        .expect("unstage");
    let mut c = agent.controller().await;
    c.controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest {
        volume_id: id.clone(),
        node_id: node.clone(),
        ..Default::default()
    })
    .await
    .expect("detach");
    // Attached read-only, staged read-only.
    let ro_cap = mount_cap("ext4", Mode::SingleNodeReaderOnly);
    let r = c
        .controller_publish_volume(csi::ControllerPublishVolumeRequest {
            volume_id: id.clone(),
            node_id: node.clone(),
            volume_capability: Some(ro_cap.clone()),
            readonly: true,
            ..Default::default()
        })
        .await
        .expect("attach read-only")
        .into_inner();
    let v = Vol {
        id: id.clone(),
        device: r.publish_context["devicePath"].clone(),
    };
    n.node_stage_volume(stage_req(&v, &staging, ro_cap))
        .await
        .expect("stage read-only");
    drop((n, c));
    agent.kill();
    agent.recover("--from-mounts");
    agent.restart(None).await;
    let _ = agent.identity().await;
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let file = agent.state_dir.join(format!("volumes/{id}.img"));
    let out = sh(&format!("losetup -j {} -O NAME -n", file.display()));
    let devices = String::from_utf8_lossy(&out.stdout).to_string();
    for dev in devices.split_whitespace() {
        let name = dev.trim_start_matches("/dev/");
        let ro = std::fs::read_to_string(format!("/sys/block/{name}/ro")).expect("ro");
        assert_eq!(
            ro.trim(),
            "1",
            "a writable device over the read-only volume: {dev}"
        );
    }
}
