//! A volume's file reached through a filesystem that shows another filesystem's files under an
//! identity of its own (overlayfs here; FUSE, NFS and the like do the same): a loop device an
//! operator lays over that view reports the overlay's device number, so comparing inodes finds
//! no volume. The agent cannot tell whose bytes such a device holds, and refuses it (a
//! thirteenth fresh review's high: a handle staged a live volume's filesystem a second time,
//! read-write, and DeleteVolume removed the file under it).

use csi::volume_capability::access_mode::Mode;
use ebs_tests::csi_req::*;
use ebs_tests::*;
use tonic::Code;

use super::owners::{DetachOnDrop, SIZE, rwx_mount};

/// An overlay whose upper layer is the agent's volumes directory, unmounted on drop.
struct OverlayView {
    merged: std::path::PathBuf,
}

impl OverlayView {
    fn new(scratch: &Scratch, upper: &std::path::Path) -> OverlayView {
        let [lower, work, merged] = ["ovl/lower", "ovl/work", "ovl/merged"].map(|d| {
            let p = scratch.join(d);
            std::fs::create_dir_all(&p).expect("overlay directory");
            p
        });
        sh(&format!(
            "mount -t overlay overlay -o lowerdir={},upperdir={},workdir={} {}",
            lower.display(),
            upper.display(),
            work.display(),
            merged.display()
        ));
        OverlayView { merged }
    }
}

impl Drop for OverlayView {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg(&self.merged)
            .status();
    }
}

#[tokio::test]
async fn a_loop_device_over_a_volumes_file_seen_through_an_overlay_is_refused() {
    let _shared = crate::NAMESPACE_COPY.read().await;
    if !require_root("a_loop_device_over_a_volumes_file_seen_through_an_overlay_is_refused") {
        return;
    }
    let scratch = Scratch::new("node-local-overlay");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let v = create_attached(&agent, "v", SIZE).await;
    let staging = agent.work.join("v/staging");
    let mut node = agent.node().await;
    node.node_stage_volume(stage_req(
        &v,
        &staging,
        mount_cap("ext4", Mode::SingleNodeWriter),
    ))
    .await
    .expect("stage the volume");
    let view = OverlayView::new(&scratch, &agent.state_dir.join("volumes"));
    let file = view.merged.join(format!("{}.img", v.id));
    let laid = super::losetup("", file.display());
    let _laid = DetachOnDrop(laid.clone());
    let h = Vol {
        id: format!("local-ebs://{}", laid.trim_start_matches('/')),
        device: laid,
    };
    let h_staging = agent.work.join("h/staging");
    let e = node
        .node_stage_volume(stage_req(&h, &h_staging, rwx_mount()))
        .await
        .expect_err("a handle took a volume's file seen through an overlay");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("overlay"), "{e:?}");
    assert!(
        !super::is_mounted(&h_staging),
        "the handle's staging is mounted"
    );
    node.node_unstage_volume(unstage_req(&v, &staging))
        .await
        .expect("unstage the volume");
    // Detached by the controller, its file is still under the operator's device: DeleteVolume
    // cannot tell that device is not over this very file, and keeps it.
    let node_name = node_id(&agent).await;
    let mut ctl = agent.controller().await;
    ctl.controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest {
        volume_id: v.id.clone(),
        node_id: node_name,
        ..Default::default()
    })
    .await
    .expect("controller unpublish");
    let e = ctl
        .delete_volume(csi::DeleteVolumeRequest {
            volume_id: v.id.clone(),
            ..Default::default()
        })
        .await
        .expect_err("the volume's file was deleted under a loop device over it");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(file.exists(), "the volume's file is gone");
}
