//! One device, one owner (issue 49's high and medium): a node-local handle naming another
//! volume's device, staged or published raw, or merely attached by the loop controller, is
//! refused with FAILED_PRECONDITION and nothing changes; the handle's id never takes the
//! volume's mounts away; and a volume's interrupted format holds its device against a handle.

use ebs_tests::csi_req::*;
use ebs_tests::*;

use csi::volume_capability::access_mode::Mode;
use tonic::Code;

pub(super) const SIZE: i64 = 64 << 20;

/// The handle naming `vol`'s device, as a node-local volume's id.
pub(super) fn handle_of(vol: &Vol) -> Vol {
    Vol {
        id: format!("local-ebs://{}", vol.device.trim_start_matches('/')),
        device: vol.device.clone(),
    }
}

pub(super) fn rwx_block() -> csi::VolumeCapability {
    block_cap(Mode::MultiNodeMultiWriter)
}

pub(super) fn rwx_mount() -> csi::VolumeCapability {
    mount_cap("ext4", Mode::MultiNodeMultiWriter)
}

/// A new loop volume `name`, attached, staged and published as raw block (read-only if asked)
/// at `<work>/<name>/staging` and `<work>/<name>/pod/dev`.
async fn published_raw(
    agent: &Agent,
    node: &mut csi::node_client::NodeClient<tonic::transport::Channel>,
    name: &str,
    readonly: bool,
) -> (Vol, std::path::PathBuf, std::path::PathBuf) {
    let v = create_attached(agent, name, SIZE).await;
    let staging = agent.work.join(format!("{name}/staging"));
    let target = agent.work.join(format!("{name}/pod/dev"));
    let blk = block_cap(Mode::SingleNodeWriter);
    node.node_stage_volume(stage_req(&v, &staging, blk.clone()))
        .await
        .expect("stage");
    node.node_publish_volume(publish_req(&v, &staging, &target, blk, readonly))
        .await
        .expect("publish");
    (v, staging, target)
}

#[tokio::test]
async fn a_node_local_handle_never_takes_another_volumes_device() {
    let _shared = crate::NAMESPACE_COPY.read().await;
    if !require_root("a_node_local_handle_never_takes_another_volumes_device") {
        return;
    }
    let scratch = Scratch::new("node-local-owner");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let mut node = agent.node().await;

    // X: staged and published as raw block, with the workload's bytes on it.
    let (x, x_staging, x_target) = published_raw(&agent, &mut node, "x", false).await;
    std::fs::write(&x_target, b"x's workload bytes").expect("write through x's device");
    // Y: attached by the loop controller, never staged.
    let y = create_attached(&agent, "y", SIZE).await;

    for vol in [&x, &y] {
        let h = handle_of(vol);
        let before = checksum(std::path::Path::new(&vol.device));
        let mounts = mounts_below(&agent.work);
        for (n, cap) in [rwx_block(), rwx_mount()].into_iter().enumerate() {
            let staging = agent.work.join(format!("h/{n}/staging"));
            let e = node
                .node_stage_volume(stage_req(&h, &staging, cap))
                .await
                .expect_err("a handle on another volume's device");
            assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
            // Its claim, or first the bind of its node that the host shows.
            assert!(
                e.message().contains("held by volume") || e.message().contains("still in raw use"),
                "{e:?}"
            );
        }
        assert_eq!(
            before,
            checksum(std::path::Path::new(&vol.device)),
            "{}'s bytes changed",
            vol.id
        );
        assert_eq!(mounts, mounts_below(&agent.work));
    }

    // The handle's id never makes X's mounts its own.
    let h = handle_of(&x);
    let _ = node
        .node_unpublish_volume(unpublish_req(&h, &x_target))
        .await;
    let _ = node.node_unstage_volume(unstage_req(&h, &x_staging)).await;
    assert!(
        std::fs::read(&x_target).is_ok_and(|b| b.starts_with(b"x's workload bytes")),
        "x's publication was taken away by the handle's id"
    );

    node.node_unpublish_volume(unpublish_req(&x, &x_target))
        .await
        .expect("unpublish x");
    node.node_unstage_volume(unstage_req(&x, &x_staging))
        .await
        .expect("unstage x");
    // Free again once X lets go, as far as the node goes (the controller's attachment of X
    // still holds it for X: a handle acting for X is the way to use it).
    let mut acting = stage_req(&h, &agent.work.join("h/x/staging"), rwx_block());
    acting
        .publish_context
        .insert("volumeID".into(), x.id.clone());
    node.node_stage_volume(acting)
        .await
        .expect("a handle acting for x, once x is unstaged");
    node.node_unstage_volume(unstage_req(&h, &agent.work.join("h/x/staging")))
        .await
        .expect("unstage the handle");
}

/// The agent died with X's format intent committed: the intent still holds the device for X, so
/// a handle that would write raw to it (and have X's retry format over that) is refused, and X's
/// retry formats and stages.
#[tokio::test]
async fn an_interrupted_format_holds_the_device_against_a_handle() {
    let _shared = crate::NAMESPACE_COPY.read().await;
    if !require_root("an_interrupted_format_holds_the_device_against_a_handle") {
        return;
    }
    let scratch = Scratch::new("node-local-intent");
    let mut agent = Agent::start(&scratch, AgentOpts::default()).await;
    let x = create_attached(&agent, "x", SIZE).await;
    let staging = agent.work.join("x/staging");
    let cap = mount_cap("ext4", Mode::SingleNodeWriter);
    // Killed right after the format intent's commit.
    let mut crash = AgentOpts::default();
    crash.args.push("--crash-after".into());
    crash.args.push(crash_points::intent(
        crash_points::Op::Stage,
        crash_points::Step::Format,
    ));
    agent.restart(Some(crash)).await;
    let mut node = agent.node().await;
    let _ = node
        .node_stage_volume(stage_req(&x, &staging, cap.clone()))
        .await;
    drop(node);
    agent.restart(Some(AgentOpts::default())).await;
    let mut node = agent.node().await;
    let h = handle_of(&x);
    let mut acting = stage_req(&h, &agent.work.join("h/staging"), rwx_block());
    acting
        .publish_context
        .insert("volumeID".into(), x.id.clone());
    let e = node
        .node_stage_volume(acting)
        .await
        .expect_err("x's format intent holds the device");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    node.node_stage_volume(stage_req(&x, &staging, cap))
        .await
        .expect("x's retry");
    node.node_unstage_volume(unstage_req(&x, &staging))
        .await
        .expect("unstage x");
}

/// A read-only block publication binds a read-only loop device laid over the volume's: a handle
/// naming that device would hand a second workload the volume's bytes.
#[tokio::test]
async fn a_node_local_handle_never_takes_a_read_only_publications_device() {
    let _shared = crate::NAMESPACE_COPY.read().await;
    if !require_root("a_node_local_handle_never_takes_a_read_only_publications_device") {
        return;
    }
    use std::os::unix::fs::MetadataExt;
    let scratch = Scratch::new("node-local-ro-owner");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let mut node = agent.node().await;
    let (x, staging, target) = published_raw(&agent, &mut node, "x", true).await;
    let rdev = std::fs::metadata(&target).expect("the target").rdev();
    let (major, minor) = (nix::sys::stat::major(rdev), nix::sys::stat::minor(rdev));
    assert_eq!(major, 7, "a read-only loop device is bound");
    let overlay = Vol {
        id: format!("local-ebs://dev/loop{minor}"),
        device: format!("/dev/loop{minor}"),
    };
    let mounts = mounts_below(&agent.work);
    let e = node
        .node_stage_volume(stage_req(
            &overlay,
            &agent.work.join("h/staging"),
            rwx_block(),
        ))
        .await
        .expect_err("the read-only device is x's");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert_eq!(mounts, mounts_below(&agent.work));
    node.node_unpublish_volume(unpublish_req(&x, &target))
        .await
        .expect("unpublish x");
    node.node_unstage_volume(unstage_req(&x, &staging))
        .await
        .expect("unstage x");
}

/// What the records do not know still counts: after `recover --reset` a raw block publication
/// (a bind of the device node) and a read-only one (a loop device laid over the volume's) keep
/// their devices from a handle, and so does a device node bound by anyone else.
#[tokio::test]
async fn a_node_local_handle_never_takes_a_device_in_raw_use_the_records_do_not_know() {
    let _shared = crate::NAMESPACE_COPY.read().await;
    if !require_root("a_node_local_handle_never_takes_a_device_in_raw_use_the_records_do_not_know")
    {
        return;
    }
    let scratch = Scratch::new("node-local-raw-use");
    let mut agent = Agent::start(&scratch, AgentOpts::default()).await;
    let mut node = agent.node().await;
    let mut published = Vec::new();
    for (name, readonly) in [("c", false), ("d", true)] {
        published.push(published_raw(&agent, &mut node, name, readonly).await.0);
    }
    // The read-only publication's device outlives the reset records: detached at the end.
    let _overlays: Vec<OverlaysOver> = published
        .iter()
        .map(|v| OverlaysOver(v.device.clone()))
        .collect();
    drop(node);
    agent.terminate().await;
    agent.recover("--reset");
    agent.spawn().await;
    let mut node = agent.node().await;

    // Anyone's bind of a device node: another driver's block volume.
    let other = crate::Disk::new(&scratch, "other", SIZE as u64);
    let bound = scratch.join("other-bind");
    std::fs::write(&bound, b"").expect("bind target");
    sh(&format!(
        "mount --bind {} {}",
        other.dev.display(),
        bound.display()
    ));
    let mut refused = published.clone();
    refused.push(other.vol());
    for vol in &refused {
        let h = handle_of(vol);
        let before = checksum(std::path::Path::new(&vol.device));
        let mounts = mounts_below(&agent.work);
        let e = node
            .node_stage_volume(stage_req(&h, &agent.work.join("h/staging"), rwx_block()))
            .await
            .expect_err("a device in raw use");
        assert_eq!(e.code(), Code::FailedPrecondition, "{}: {e:?}", vol.id);
        assert_eq!(before, checksum(std::path::Path::new(&vol.device)));
        assert_eq!(mounts, mounts_below(&agent.work));
    }
    let _ = nix::mount::umount2(&bound, nix::mount::MntFlags::MNT_DETACH);

    // A node of a device made outside devtmpfs (mknod, as a container's /dev has), bound.
    let other2 = crate::Disk::new(&scratch, "other2", SIZE as u64);
    use std::os::unix::fs::MetadataExt;
    let rdev = std::fs::metadata(&other2.dev).expect("the disk").rdev();
    let made = scratch.join("made-node");
    let bound2 = scratch.join("made-bind");
    sh(&format!(
        "mknod {} b {} {} && touch {} && mount --bind {} {}",
        made.display(),
        nix::sys::stat::major(rdev),
        nix::sys::stat::minor(rdev),
        bound2.display(),
        made.display(),
        bound2.display()
    ));
    // A loop device an operator laid over a volume's device: a second name of its bytes.
    let laid = super::losetup("", &published[0].device);
    let _laid = OverlaysOver(published[0].device.clone());
    let laid = Vol {
        id: format!("local-ebs://{}", laid.trim_start_matches('/')),
        device: laid,
    };
    // The same laid over a node that is deleted since: the kernel still knows what it lies on.
    let node3 = scratch.join("deleted-node");
    sh(&format!(
        "mknod {} b {} {}",
        node3.display(),
        nix::sys::stat::major(rdev),
        nix::sys::stat::minor(rdev)
    ));
    let laid3 = super::losetup("", node3.display());
    let _laid3 = DetachOnDrop(laid3.clone());
    std::fs::remove_file(&node3).expect("delete the node");
    let laid3 = Vol {
        id: format!("local-ebs://{}", laid3.trim_start_matches('/')),
        device: laid3,
    };
    for h in [handle_of(&other2.vol()), laid, laid3] {
        let e = node
            .node_stage_volume(stage_req(&h, &agent.work.join("h2/staging"), rwx_block()))
            .await
            .expect_err("a second name, or a node made elsewhere");
        assert_eq!(e.code(), Code::FailedPrecondition, "{}: {e:?}", h.id);
    }
    let _ = nix::mount::umount2(&bound2, nix::mount::MntFlags::MNT_DETACH);
}

/// Detaches, on drop, the loop devices laid over a device (a read-only block publication's that
/// no record names any more).
pub(super) struct OverlaysOver(pub(super) String);

impl Drop for OverlaysOver {
    fn drop(&mut self) {
        let Ok(entries) = std::fs::read_dir("/sys/block") else {
            return;
        };
        for e in entries.flatten() {
            let backing = std::fs::read_to_string(e.path().join("loop/backing_file"));
            if backing.is_ok_and(|b| b.trim() == self.0) {
                detach_loop(&std::path::Path::new("/dev").join(e.file_name()));
            }
        }
    }
}

/// A loop device an operator laid over a volume's file at an offset, or cut short, is a view of
/// part of the volume, never the volume, whatever `volumeID` the handle brings.
#[tokio::test]
async fn a_shifted_view_of_a_volume_file_is_never_the_volume() {
    let _shared = crate::NAMESPACE_COPY.read().await;
    if !require_root("a_shifted_view_of_a_volume_file_is_never_the_volume") {
        return;
    }
    let scratch = Scratch::new("node-local-offset");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let v = create_attached(&agent, "v", SIZE).await;
    let name = v.device.trim_start_matches("/dev/");
    let file = std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file"))
        .expect("the volume's file");
    // Shifted (`-o`) or cut short (`--sizelimit`: a fifteenth fresh review's F3).
    for view in ["-o 1048576", "--sizelimit 8388608"] {
        let shifted = super::losetup(view, file.trim());
        let _detach = DetachOnDrop(shifted.clone());
        let h = Vol {
            id: format!("local-ebs://{}", shifted.trim_start_matches('/')),
            device: shifted,
        };
        let before = checksum(std::path::Path::new(&v.device));
        let mut node = agent.node().await;
        let mut stage = stage_req(&h, &agent.work.join("h/staging"), rwx_mount());
        stage
            .publish_context
            .insert("volumeID".into(), v.id.clone());
        let e = node.node_stage_volume(stage).await.expect_err(view);
        assert_eq!(e.code(), Code::FailedPrecondition, "{view}: {e:?}");
        assert_eq!(before, checksum(std::path::Path::new(&v.device)));
    }
}

/// Detaches a loop device the test made, on drop.
pub(super) struct DetachOnDrop(pub(super) String);

impl Drop for DetachOnDrop {
    fn drop(&mut self) {
        detach_loop(std::path::Path::new(&self.0));
    }
}
