//! A node-local handle acting for a loop volume and the loop controller (issue 49, a fourth fresh
//! review): the controller's detach and delete never pull the volume from under the handle, in a
//! race or not; and a handle's staging that outlived its records is its own again.

use ebs_tests::csi_req::*;
use ebs_tests::*;

use csi::volume_capability::access_mode::Mode;
use tonic::Code;

use super::owners::{SIZE, handle_of, rwx_mount};

pub(super) fn detach(id: &str, node: &str) -> csi::ControllerUnpublishVolumeRequest {
    csi::ControllerUnpublishVolumeRequest {
        volume_id: id.into(),
        node_id: node.into(),
        ..Default::default()
    }
}

/// A handle's stage (acting for the volume) and the controller's detach of that volume, at once,
/// many times: never both succeed.
#[tokio::test]
async fn a_handles_stage_and_the_controllers_detach_never_both_succeed() {
    let _shared = crate::NAMESPACE_COPY.read().await;
    if !require_root("a_handles_stage_and_the_controllers_detach_never_both_succeed") {
        return;
    }
    let scratch = Scratch::new("node-local-detach-race");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let id = create_volume(&agent, "v", SIZE, &[]).await;
    let node_name = node_id(&agent).await;
    let staging = agent.work.join("h/staging");
    // How many rounds the stage lost and won: both must happen for the test to mean anything.
    let mut both = [0u32; 2];
    for round in 0..20u64 {
        let v = attach(&agent, &id).await;
        let h = handle_of(&v);
        let mut stage = stage_req(&h, &staging, rwx_mount());
        stage.publish_context.insert("volumeID".into(), id.clone());
        let (mut node, mut ctl) = (agent.node().await, agent.controller().await);
        // One call goes 0 to 57 ms after the other (`stagger`).
        let (staged, detached) = tokio::join!(
            async {
                tokio::time::sleep(super::stagger(round, true)).await;
                node.node_stage_volume(stage).await
            },
            async {
                tokio::time::sleep(super::stagger(round, false)).await;
                ctl.controller_unpublish_volume(detach(&id, &node_name))
                    .await
            }
        );
        both[usize::from(staged.is_ok())] += 1;
        assert!(
            staged.is_err() || detached.is_err(),
            "round {round}: the handle staged and the controller detached the volume under it"
        );
        if staged.is_ok() {
            node.node_unstage_volume(unstage_req(&h, &staging))
                .await
                .expect("unstage");
        }
        ctl.controller_unpublish_volume(detach(&id, &node_name))
            .await
            .expect("detach");
    }
    assert!(both[0] > 0 && both[1] > 0, "stage lost, won: {both:?}");
}

/// The operator's own loop device over a volume's file, staged through a handle acting for the
/// volume: DeleteVolume of the volume is refused while it is staged.
#[tokio::test]
async fn delete_volume_never_removes_a_file_a_handle_has_staged() {
    let _shared = crate::NAMESPACE_COPY.read().await;
    if !require_root("delete_volume_never_removes_a_file_a_handle_has_staged") {
        return;
    }
    let scratch = Scratch::new("node-local-delete");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let id = create_volume(&agent, "v", SIZE, &[]).await;
    let file = agent.state_dir.join(format!("volumes/{id}.img"));
    let dev = super::losetup("", file.display());
    let _detach = super::owners::DetachOnDrop(dev.clone());
    let h = handle_of(&Vol {
        id: id.clone(),
        device: dev,
    });
    let staging = agent.work.join("h/staging");
    let mut stage = stage_req(&h, &staging, rwx_mount());
    stage.publish_context.insert("volumeID".into(), id.clone());
    let mut node = agent.node().await;
    node.node_stage_volume(stage)
        .await
        .expect("stage the handle");
    let e = agent
        .controller()
        .await
        .delete_volume(csi::DeleteVolumeRequest {
            volume_id: id.clone(),
            ..Default::default()
        })
        .await
        .expect_err("the handle holds the file");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(
        file.exists(),
        "the volume's file was removed under the handle"
    );
    node.node_unstage_volume(unstage_req(&h, &staging))
        .await
        .expect("unstage");
}

/// A handle's stage killed after its mount, then `recover --reset`: the retried stage at the same
/// path, kubelet's staging directory named after the handle, finds its own mount and adopts it,
/// and the unstage then takes it away. At a path not named for the handle, a mount with no record
/// is nobody's to adopt (a nineteenth fresh review's F3): refused, and left mounted.
#[tokio::test]
async fn a_handles_staging_that_outlived_its_records_is_its_own_again() {
    let _shared = crate::NAMESPACE_COPY.read().await;
    if !require_root("a_handles_staging_that_outlived_its_records_is_its_own_again") {
        return;
    }
    let scratch = Scratch::new("node-local-reset-staging");
    let mut crash = AgentOpts::default();
    crash.args.push("--crash-after".into());
    crash.args.push(crash_points::done(
        crash_points::Op::Stage,
        crash_points::Step::Mount,
    ));
    let mut agent = Agent::start(&scratch, crash).await;
    let disk = super::Disk::new(&scratch, "d", SIZE as u64);
    let h = disk.vol();
    let staging = agent.work.join(format!(
        "plugins/kubernetes.io/csi/ebs.csi.aws.com/{}/globalmount",
        super::sha256_hex(&h.id)
    ));
    let _ = agent
        .node()
        .await
        .node_stage_volume(stage_req(
            &h,
            &staging,
            mount_cap("ext4", Mode::MultiNodeMultiWriter),
        ))
        .await;
    agent.kill();
    agent.recover("--reset");
    agent.restart(Some(AgentOpts::default())).await;
    let mut node = agent.node().await;
    node.node_stage_volume(stage_req(
        &h,
        &staging,
        mount_cap("ext4", Mode::MultiNodeMultiWriter),
    ))
    .await
    .expect("the retried stage adopts its own mount");
    node.node_unstage_volume(unstage_req(&h, &staging))
        .await
        .expect("unstage");
    assert_eq!(mounts_below(&agent.work), Vec::<std::path::PathBuf>::new());
    // An operator's own mount of the disk at a path a handle's stage then names.
    let theirs = agent.work.join("h/staging");
    std::fs::create_dir_all(&theirs).expect("the operator's mount point");
    sh(&format!(
        "mount {} {}",
        disk.dev.display(),
        theirs.display()
    ));
    let _mounted = Unmount(theirs.clone());
    let e = node
        .node_stage_volume(stage_req(
            &h,
            &theirs,
            mount_cap("ext4", Mode::MultiNodeMultiWriter),
        ))
        .await
        .expect_err("a handle adopted an operator's mount");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(
        super::is_mounted(&theirs),
        "the operator's mount was taken away"
    );
}

pub(super) fn attach_req(
    id: &str,
    node: &str,
    readonly: bool,
) -> csi::ControllerPublishVolumeRequest {
    let mode = if readonly {
        Mode::SingleNodeReaderOnly
    } else {
        Mode::SingleNodeWriter
    };
    csi::ControllerPublishVolumeRequest {
        volume_id: id.into(),
        node_id: node.into(),
        volume_capability: Some(mount_cap("ext4", mode)),
        readonly,
        ..Default::default()
    }
}

/// A loop device an operator made over a volume's file is that volume's bytes: a handle not
/// acting for the volume never stages it, attached by the controller or not, also racing the
/// controller's attach (many times, both orders).
#[tokio::test]
async fn a_handle_never_takes_a_volumes_file_it_does_not_act_for() {
    let _shared = crate::NAMESPACE_COPY.read().await;
    if !require_root("a_handle_never_takes_a_volumes_file_it_does_not_act_for") {
        return;
    }
    let scratch = Scratch::new("node-local-attach-race");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let id = create_volume(&agent, "v", SIZE, &[]).await;
    let node_name = node_id(&agent).await;
    let file = agent.state_dir.join(format!("volumes/{id}.img"));
    let dev = super::losetup("", file.display());
    let _detach = super::owners::DetachOnDrop(dev.clone());
    let h = handle_of(&Vol {
        id: id.clone(),
        device: dev,
    });
    let staging = agent.work.join("h/staging");
    for round in 0..20u64 {
        let (mut node, mut ctl) = (agent.node().await, agent.controller().await);
        let (staged, attached) = tokio::join!(
            async {
                tokio::time::sleep(super::stagger(round, true)).await;
                node.node_stage_volume(stage_req(&h, &staging, rwx_mount()))
                    .await
            },
            async {
                tokio::time::sleep(super::stagger(round, false)).await;
                ctl.controller_publish_volume(attach_req(&id, &node_name, false))
                    .await
            }
        );
        assert!(
            staged.is_err(),
            "round {round}: a handle not acting for {id} staged its file (attach: {:?})",
            attached.as_ref().map(drop)
        );
        if staged.is_ok() {
            node.node_unstage_volume(unstage_req(&h, &staging))
                .await
                .expect("unstage");
        }
        if attached.is_ok() {
            ctl.controller_unpublish_volume(detach(&id, &node_name))
                .await
                .expect("detach");
        }
    }
}

/// The controller adopts a loop device it did not make only if it is the file's whole device
/// with the access asked: never a shifted or cut view (`losetup -o`, `--sizelimit`), never a
/// writable one for a read-only attachment.
#[tokio::test]
async fn the_controller_never_adopts_a_shifted_or_writable_device_it_did_not_make() {
    let _shared = crate::NAMESPACE_COPY.read().await;
    if !require_root("the_controller_never_adopts_a_shifted_or_writable_device_it_did_not_make") {
        return;
    }
    let scratch = Scratch::new("node-local-adopt");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let node_name = node_id(&agent).await;
    let mut ctl = agent.controller().await;
    // A shifted or cut view (`-o`, `--sizelimit`): the controller makes its own device.
    for (name, view) in [("s", "-o 1048576"), ("c", "--sizelimit 8388608")] {
        let shifted_id = create_volume(&agent, name, SIZE, &[]).await;
        let file = agent.state_dir.join(format!("volumes/{shifted_id}.img"));
        let view = super::losetup(view, file.display());
        let _view = super::owners::DetachOnDrop(view.clone());
        let r = ctl
            .controller_publish_volume(attach_req(&shifted_id, &node_name, false))
            .await
            .expect("attach beside a shifted view")
            .into_inner();
        let device = r.publish_context["devicePath"].clone();
        assert_ne!(device, view, "the controller adopted the view {view}");
        let _own = super::owners::DetachOnDrop(device);
        ctl.controller_unpublish_volume(detach(&shifted_id, &node_name))
            .await
            .expect("detach");
        assert!(
            std::path::Path::new(&format!(
                "/sys/block/{}/loop",
                view.trim_start_matches("/dev/")
            ))
            .exists(),
            "the controller detached the operator's device"
        );
    }
    // A writable device of the operator's: a read-only attachment is refused.
    let rw_id = create_volume(&agent, "w", SIZE, &[]).await;
    let file = agent.state_dir.join(format!("volumes/{rw_id}.img"));
    let rw = super::losetup("", file.display());
    let _rw = super::owners::DetachOnDrop(rw);
    let e = ctl
        .controller_publish_volume(attach_req(&rw_id, &node_name, true))
        .await
        .expect_err("a writable device for a read-only attachment");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
}

/// The agent's own files that are nobody's volume (a snapshot) are never a handle's: a loop
/// device an operator made over one is refused, and DeleteSnapshot and DeleteVolume wait while
/// any loop device (a `mount -o loop` one included) is bound to their file.
#[tokio::test]
async fn the_agents_own_files_are_never_a_handles_nor_deleted_under_a_loop_device() {
    let _shared = crate::NAMESPACE_COPY.read().await;
    if !require_root("the_agents_own_files_are_never_a_handles_nor_deleted_under_a_loop_device") {
        return;
    }
    let scratch = Scratch::new("node-local-own-files");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let mut ctl = agent.controller().await;
    let id = create_volume(&agent, "v", SIZE, &[]).await;
    let snap = ctl
        .create_snapshot(csi::CreateSnapshotRequest {
            source_volume_id: id.clone(),
            name: "s".into(),
            ..Default::default()
        })
        .await
        .expect("snapshot")
        .into_inner()
        .snapshot
        .expect("snapshot")
        .snapshot_id;
    let snap_file = agent.state_dir.join(format!("snapshots/{snap}.img"));
    let dev = super::losetup("", snap_file.display());
    let detach_snap = super::owners::DetachOnDrop(dev.clone());
    let h = Vol {
        id: format!("local-ebs://{}", dev.trim_start_matches('/')),
        device: dev,
    };
    let e = agent
        .node()
        .await
        .node_stage_volume(stage_req(&h, &agent.work.join("h/staging"), rwx_mount()))
        .await
        .expect_err("a snapshot's file");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    let e = ctl
        .delete_snapshot(csi::DeleteSnapshotRequest {
            snapshot_id: snap.clone(),
            ..Default::default()
        })
        .await
        .expect_err("a loop device is bound to the snapshot's file");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(snap_file.exists());
    drop(detach_snap);
    // Any file of the state directory, a copy still being made (`.partial`) included.
    let partial = agent.state_dir.join("volumes/lv-making.img.partial");
    sh(&format!("truncate -s {SIZE} {}", partial.display()));
    let dev = super::losetup("", partial.display());
    let _detach_partial = super::owners::DetachOnDrop(dev.clone());
    let h = Vol {
        id: format!("local-ebs://{}", dev.trim_start_matches('/')),
        device: dev,
    };
    let e = agent
        .node()
        .await
        .node_stage_volume(stage_req(&h, &agent.work.join("h/staging"), rwx_mount()))
        .await
        .expect_err("a file of the agent's");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    // A `mount -o loop` of a volume's file: the kernel's autoclear device, mounted.
    let file = agent.state_dir.join(format!("volumes/{id}.img"));
    sh(&format!("mkfs.ext4 -q -F {}", file.display()));
    let mnt = scratch.join("loop-mount");
    std::fs::create_dir_all(&mnt).expect("mount point");
    sh(&format!(
        "mount -o loop {} {}",
        file.display(),
        mnt.display()
    ));
    let e = ctl
        .delete_volume(csi::DeleteVolumeRequest {
            volume_id: id.clone(),
            ..Default::default()
        })
        .await
        .expect_err("the file is mounted through a loop device");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(file.exists());
    let _ = nix::mount::umount2(&mnt, nix::mount::MntFlags::empty());
}
