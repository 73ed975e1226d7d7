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

use super::owners::{DetachOnDrop, SIZE, rwx_block, rwx_mount};

/// An overlay whose upper layer is the agent's volumes directory, unmounted on drop.
pub(super) struct OverlayView {
    pub(super) merged: std::path::PathBuf,
}

impl OverlayView {
    pub(super) fn new(scratch: &Scratch, upper: &std::path::Path) -> OverlayView {
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
    /// A loop device detached just before may still be open (udev probes it on the change
    /// event), its backing file then still holding the overlay busy: tries again for a while,
    /// then detaches the overlay lazily so that it never outlives the test.
    fn drop(&mut self) {
        for _ in 0..50 {
            let unmounted = std::process::Command::new("umount")
                .arg(&self.merged)
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if unmounted {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.merged)
            .status();
    }
}

#[tokio::test]
async fn a_loop_device_over_a_volumes_file_seen_through_an_overlay_is_refused() {
    // Alone: a loop device over an overlay's file may show any file's bytes, so while this
    // test's agent holds it (its refused stage) every other test's stage of a loop device is
    // refused (seen in CI: another test's handle refused "in use through device 7:1").
    let _alone = crate::NAMESPACE_COPY.write().await;
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

/// A file inside volume X's mounted filesystem, laid on a loop device by an operator: its bytes
/// are X's, so a handle never takes it (a fourteenth fresh review's F2: the handle's stage made
/// a filesystem in X's file, X's workload read the handle's data, X could no longer unstage).
#[tokio::test]
async fn a_loop_device_over_a_file_inside_another_volumes_filesystem_is_refused() {
    let _shared = crate::NAMESPACE_COPY.read().await;
    if !require_root("a_loop_device_over_a_file_inside_another_volumes_filesystem_is_refused") {
        return;
    }
    let scratch = Scratch::new("node-local-inside");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let x = create_attached(&agent, "x", SIZE).await;
    let staging = agent.work.join("x/staging");
    let mut node = agent.node().await;
    node.node_stage_volume(stage_req(
        &x,
        &staging,
        mount_cap("ext4", Mode::SingleNodeWriter),
    ))
    .await
    .expect("stage x");
    let inner = staging.join("inner.img");
    sh(&format!("truncate -s 16M {}", inner.display()));
    let laid = DetachOnDrop(super::losetup("", inner.display()));
    let h = Vol {
        id: format!("local-ebs://{}", laid.0.trim_start_matches('/')),
        device: laid.0.clone(),
    };
    let h_staging = agent.work.join("h/staging");
    let e = node
        .node_stage_volume(stage_req(&h, &h_staging, rwx_mount()))
        .await
        .expect_err("a handle took a file inside x's filesystem");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(
        !super::is_mounted(&h_staging),
        "the handle's staging is mounted"
    );
    let name = laid.0.clone();
    drop(laid);
    wait_unbound(&name);
    node.node_unstage_volume(unstage_req(&x, &staging))
        .await
        .expect("unstage x");
}

/// On EBS with `--allow-unverified-devices` (a disk known by its numbers only), a loop device
/// laid over volume A's device is A's bytes under other numbers: B is refused on it while A is
/// staged, and A is refused while B is staged on it (a fourteenth fresh review's F1: both were
/// staged, one ext4 mounted read-write twice).
#[tokio::test]
async fn on_unverified_ebs_a_loop_device_laid_over_another_volumes_disk_is_refused() {
    let _shared = crate::NAMESPACE_COPY.read().await;
    if !require_root("on_unverified_ebs_a_loop_device_laid_over_another_volumes_disk_is_refused") {
        return;
    }
    let scratch = Scratch::new("node-local-ebs-laid");
    let img = scratch.join("a.img");
    sh(&format!("truncate -s 64M {}", img.display()));
    let la = DetachOnDrop(super::losetup("", img.display()));
    let lb = DetachOnDrop(super::losetup("", &la.0));
    let agent = ebs_agent(&scratch, &["--allow-unverified-devices"]).await;
    let a = Vol {
        id: "vol-0aaaaaaaaaaaaaaaa".into(),
        device: la.0.clone(),
    };
    let b = Vol {
        id: "vol-0bbbbbbbbbbbbbbbb".into(),
        device: lb.0.clone(),
    };
    let cap = || mount_cap("ext4", Mode::SingleNodeWriter);
    let (sa, sb) = (agent.work.join("a"), agent.work.join("b"));
    let mut node = agent.node().await;
    for (first, first_at, second, second_at) in [(&a, &sa, &b, &sb), (&b, &sb, &a, &sa)] {
        node.node_stage_volume(stage_req(first, first_at, cap()))
            .await
            .expect("the first stage");
        let e = node
            .node_stage_volume(stage_req(second, second_at, cap()))
            .await
            .expect_err("two volumes staged on one disk's bytes");
        assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
        assert!(!super::is_mounted(second_at), "the second is mounted");
        node.node_unstage_volume(unstage_req(first, first_at))
            .await
            .expect("unstage the first");
    }
    drop((lb, la));
}

/// A second loop device over volume X's file (an operator's), X's filesystem mounted from it,
/// and a loop device over a file in that filesystem: X's bytes, two levels down. A handle never
/// takes it, staged or not (a fifteenth fresh review's F1: the handle wrote into X's file).
#[tokio::test]
async fn a_loop_device_on_a_second_loop_device_of_a_volumes_file_is_refused() {
    let _shared = crate::NAMESPACE_COPY.read().await;
    if !require_root("a_loop_device_on_a_second_loop_device_of_a_volumes_file_is_refused") {
        return;
    }
    let scratch = Scratch::new("node-local-second-loop");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let x = create_attached(&agent, "x", SIZE).await;
    let file = agent.state_dir.join(format!("volumes/{}.img", x.id));
    let z = DetachOnDrop(super::losetup("", file.display()));
    sh(&format!("mkfs.ext4 -q {}", z.0));
    let zm = scratch.join("zm");
    std::fs::create_dir_all(&zm).expect("mount point");
    sh(&format!("mount {} {}", z.0, zm.display()));
    let mounted = Unmount(zm.clone());
    sh(&format!("truncate -s 8M {}", zm.join("g").display()));
    let b = DetachOnDrop(super::losetup("", zm.join("g").display()));
    let h = Vol {
        id: format!("local-ebs://{}", b.0.trim_start_matches('/')),
        device: b.0.clone(),
    };
    let h_staging = agent.work.join("h/staging");
    let e = agent
        .node()
        .await
        .node_stage_volume(stage_req(&h, &h_staging, rwx_block()))
        .await
        .expect_err("a handle took a file in x's filesystem through a second loop device");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains(&x.id), "{e:?}");
    let name = b.0.clone();
    drop(b);
    wait_unbound(&name);
    drop(mounted);
    drop(z);
}

/// On the EBS backend a loop device has no serial: two loop devices over one file are one
/// device, keyed by the file (a fifteenth fresh review's F2: two handles, one mounting the
/// file's ext4 read-write, the other taking it raw).
#[tokio::test]
async fn on_ebs_two_loop_devices_over_one_file_are_one_device() {
    let _shared = crate::NAMESPACE_COPY.read().await;
    if !require_root("on_ebs_two_loop_devices_over_one_file_are_one_device") {
        return;
    }
    let scratch = Scratch::new("node-local-ebs-one-file");
    let img = scratch.join("f.img");
    sh(&format!("truncate -s 64M {}", img.display()));
    let l1 = DetachOnDrop(super::losetup("", img.display()));
    let l2 = DetachOnDrop(super::losetup("", img.display()));
    let agent = ebs_agent(&scratch, &[]).await;
    let handle = |dev: &str| Vol {
        id: format!("local-ebs://{}", dev.trim_start_matches('/')),
        device: dev.to_string(),
    };
    let (h1, h2) = (handle(&l1.0), handle(&l2.0));
    let (s1, s2) = (agent.work.join("h1"), agent.work.join("h2"));
    let mut node = agent.node().await;
    node.node_stage_volume(stage_req(&h1, &s1, rwx_mount()))
        .await
        .expect("the first handle");
    let e = node
        .node_stage_volume(stage_req(&h2, &s2, rwx_block()))
        .await
        .expect_err("a second loop device over the same file was a second device");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    node.node_unstage_volume(unstage_req(&h1, &s1))
        .await
        .expect("unstage");
    drop((l2, l1));
}

/// The ebs backend on the real host's sysfs and /dev, node mode, IMDS off.
async fn ebs_agent(scratch: &Scratch, extra: &[&str]) -> Agent {
    let args = [
        "--backend",
        "ebs",
        "--mode",
        "node",
        "--imds-disabled",
        "--zone",
        "us-east-1a",
        "--instance-type",
        "m5.large",
        "--node-id",
        "i-0123456789abcdef0",
        "--device-wait",
        "1s",
    ];
    Agent::start(
        scratch,
        AgentOpts {
            args: args.iter().chain(extra).map(|s| s.to_string()).collect(),
            ..Default::default()
        },
    )
    .await
}

/// Acting for a volume (`volumeID` in the publish context) lifts only the loop controller's claim
/// on that volume's very device, never a device built on its staged bytes: on EBS nothing proves
/// `volumeID` for a disk without a serial (an eighteenth fresh review's F1: a handle acting for
/// a staged volume formatted a file inside its filesystem).
#[tokio::test]
async fn acting_for_a_volume_never_takes_a_device_built_on_its_staged_bytes() {
    let _shared = crate::NAMESPACE_COPY.read().await;
    if !require_root("acting_for_a_volume_never_takes_a_device_built_on_its_staged_bytes") {
        return;
    }
    let scratch = Scratch::new("node-local-acts-for");
    let img = scratch.join("a.img");
    sh(&format!("truncate -s 128M {}", img.display()));
    let la = DetachOnDrop(super::losetup("", img.display()));
    let agent = ebs_agent(&scratch, &["--allow-unverified-devices"]).await;
    let a = Vol {
        id: "vol-0aaaaaaaaaaaaaaaa".into(),
        device: la.0.clone(),
    };
    let staging = agent.work.join("a");
    let mut node = agent.node().await;
    node.node_stage_volume(stage_req(
        &a,
        &staging,
        mount_cap("ext4", Mode::SingleNodeWriter),
    ))
    .await
    .expect("stage a");
    sh(&format!(
        "truncate -s 32M {}",
        staging.join("inner.img").display()
    ));
    let lf = DetachOnDrop(super::losetup("", staging.join("inner.img").display()));
    let h = Vol {
        id: format!("local-ebs://{}", lf.0.trim_start_matches('/')),
        device: lf.0.clone(),
    };
    let h_staging = agent.work.join("h");
    let mut stage = stage_req(&h, &h_staging, rwx_mount());
    stage
        .publish_context
        .insert("volumeID".into(), a.id.clone());
    let e = node
        .node_stage_volume(stage)
        .await
        .expect_err("a handle acting for a took a file inside a's filesystem");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(
        !super::is_mounted(&h_staging),
        "the handle's staging is mounted"
    );
    let name = lf.0.clone();
    drop(lf);
    wait_unbound(&name);
    node.node_unstage_volume(unstage_req(&a, &staging))
        .await
        .expect("unstage a");
    drop(la);
}
