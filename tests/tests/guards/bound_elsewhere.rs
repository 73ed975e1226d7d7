//! Issue 49 (a ninth fresh review's F1 and F2): a device number is never freed while a bind of
//! its node lives on in another mount namespace. A bind does not open the device, so a detach
//! frees the number at once; the next loop device the controller makes takes it, and the old
//! bind then reads and writes the new volume's bytes. Unpublish keeps a read-only publication's
//! device, and the controller's detach keeps a volume's, until the host shows no bind of it.

use std::path::{Path, PathBuf};

use ebs_tests::csi_req::*;
use ebs_tests::elsewhere::{BoundElsewhere, EVERY_WAY, How};
use ebs_tests::*;

use csi::volume_capability::access_mode::Mode;
use tonic::Code;

use super::ro_block::{Overlays, loops_over, staged_block, target};

/// A block volume staged and published at its target, read-only with `readonly`.
async fn published(agent: &Agent, name: &str, readonly: bool) -> (Vol, PathBuf, PathBuf) {
    let (vol, staging) = staged_block(agent, name, Mode::SingleNodeWriter).await;
    let t = target(agent, name);
    agent
        .node()
        .await
        .node_publish_volume(publish_req(
            &vol,
            &staging,
            &t,
            block_cap(Mode::SingleNodeWriter),
            readonly,
        ))
        .await
        .expect("publish");
    (vol, staging, t)
}

async fn detach(agent: &Agent, id: &str) -> Result<(), tonic::Status> {
    let node_id = node_id(agent).await;
    agent
        .controller()
        .await
        .controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest {
            volume_id: id.into(),
            node_id,
            ..Default::default()
        })
        .await
        .map(drop)
}

#[tokio::test]
async fn a_read_only_device_bound_in_another_namespace_is_kept_until_the_bind_goes() {
    // Makes a mount namespace, which copies every test's mounts: alone (see main.rs).
    let _ns = crate::NAMESPACE_COPY.write().await;
    if !require_root("a_read_only_device_bound_in_another_namespace_is_kept_until_the_bind_goes") {
        return;
    }
    for how in EVERY_WAY {
        read_only_kept(how).await;
    }
}

async fn read_only_kept(how: How) {
    let scratch = Scratch::new(&format!("g-roelse-{how:?}"));
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let (vol, staging, t) = published(&agent, "e", true).await;
    let _overlays = Overlays(vol.device.clone());
    let mut node = agent.node().await;
    // A container's bind of the published device, at a path of its own.
    let theirs = BoundElsewhere::by(how, &scratch.path, &t, &scratch.join("ctr-xvda"));
    let e = node
        .node_unpublish_volume(unpublish_req(&vol, &t))
        .await
        .expect_err(&format!(
            "{how:?}: unpublish freed the read-only device another namespace still binds"
        ));
    assert_eq!(e.code(), Code::FailedPrecondition, "{how:?}: {e:?}");
    assert_eq!(
        loops_over(&vol.device).len(),
        1,
        "{how:?}: the device was detached"
    );
    if let How::Process = how {
        assert_eq!(
            super::ro_block::head(&theirs.path()),
            vec![super::ro_block::PATTERN; 4096],
            "the other namespace's bind reads otherwise"
        );
    }
    // The volume stays attached meanwhile: its record says it is published (an unstage may
    // take the staging bind away; the kept device lies over the volume's all the same).
    let _ = node.node_unstage_volume(unstage_req(&vol, &staging)).await;
    assert!(
        detach(&agent, &vol.id).await.is_err(),
        "{how:?}: detached under it"
    );
    assert_eq!(
        loops_over(&vol.device).len(),
        1,
        "{how:?}: the device was detached"
    );
    // The bind goes; the orchestrator's retry takes everything down.
    theirs.end();
    node.node_unpublish_volume(unpublish_req(&vol, &t))
        .await
        .expect("unpublish once nothing binds the device");
    assert!(
        loops_over(&vol.device).is_empty(),
        "{how:?}: the device was left"
    );
    node.node_unstage_volume(unstage_req(&vol, &staging))
        .await
        .expect("unstage");
    detach(&agent, &vol.id).await.expect("detach");
}

/// The workload's copy of the bind at the target path itself goes when unpublish removes the
/// target (the kernel drops other namespaces' mounts on an unlinked file): nothing is kept.
#[tokio::test]
async fn a_copy_at_the_target_itself_goes_with_the_target() {
    let _ns = crate::NAMESPACE_COPY.write().await;
    if !require_root("a_copy_at_the_target_itself_goes_with_the_target") {
        return;
    }
    let scratch = Scratch::new("g-rocopy");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let (vol, _staging, t) = published(&agent, "c", true).await;
    let _overlays = Overlays(vol.device.clone());
    let mut node = agent.node().await;
    // A namespace made now holds a copy of the publication at the target path.
    let keep = BoundElsewhere::new(&scratch.path, Path::new("/dev/null"), &scratch.join("n"));
    node.node_unpublish_volume(unpublish_req(&vol, &t))
        .await
        .expect("unpublish: the copy at the target went with the target");
    assert!(loops_over(&vol.device).is_empty(), "the device was left");
    drop(keep);
}

/// A read-write raw block publication's device, bound in another namespace after the node let
/// it go: the loop controller's detach would free its number under that bind.
#[tokio::test]
async fn the_controller_never_detaches_a_device_another_namespace_binds() {
    let _ns = crate::NAMESPACE_COPY.write().await;
    if !require_root("the_controller_never_detaches_a_device_another_namespace_binds") {
        return;
    }
    for how in EVERY_WAY {
        controller_refuses(how).await;
    }
}

async fn controller_refuses(how: How) {
    let scratch = Scratch::new(&format!("g-ctlelse-{how:?}"));
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let (vol, staging, t) = published(&agent, "w", false).await;
    let mut node = agent.node().await;
    let theirs = BoundElsewhere::by(how, &scratch.path, &t, &scratch.join("ctr-xvda"));
    node.node_unpublish_volume(unpublish_req(&vol, &t))
        .await
        .expect("unpublish");
    node.node_unstage_volume(unstage_req(&vol, &staging))
        .await
        .expect("unstage");
    let e = detach(&agent, &vol.id).await.expect_err(&format!(
        "{how:?}: the controller detached a device another namespace binds"
    ));
    assert_eq!(e.code(), Code::FailedPrecondition, "{how:?}: {e:?}");
    assert!(
        !super::backing_file(&vol.device).is_empty(),
        "{how:?}: {} was detached",
        vol.device
    );
    theirs.end();
    detach(&agent, &vol.id)
        .await
        .expect("detach once nothing binds it");
}

/// A raw block publication's device detached outside the agent (an operator's `losetup -d`; on
/// EBS a forced detach and a new attachment): another volume's device given the number is refused by
/// the node while the first one's recorded bind still binds that number (a ninth fresh review's
/// F4), and the first one's unpublish takes its own bind down.
#[tokio::test]
async fn a_number_another_volumes_recorded_bind_holds_is_never_staged() {
    // Alone: no other test of the binary attaches a loop device meanwhile (see below).
    let _ns = crate::NAMESPACE_COPY.write().await;
    if !require_root("a_number_another_volumes_recorded_bind_holds_is_never_staged") {
        return;
    }
    let scratch = Scratch::new("g-reused");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let (x, _staging, t) = published(&agent, "x", false).await;
    let mut node = agent.node().await;
    // The outside detach. The controller never gives the number again while x's bind holds it
    // (`no_new_loop_device_takes_a_number_a_bind_still_holds`), so an operator lays y's file
    // on it by hand (on EBS: a forced detach, then another volume's attachment on the number).
    detach_loop(Path::new(&x.device));
    let y_id = create_volume(&agent, "y", 16 * super::MIB, &[]).await;
    let y_file = agent.state_dir.join(format!("volumes/{y_id}.img"));
    sh(&format!("losetup {} {}", x.device, y_file.display()));
    let _y_detach = DetachAtEnd(x.device.clone());
    let y = Vol {
        id: y_id,
        device: x.device.clone(),
    };
    let mounts = mounts_below(&agent.work);
    let e = node
        .node_stage_volume(stage_req(
            &y,
            &agent.work.join("staging/y"),
            mount_cap("ext4", Mode::SingleNodeWriter),
        ))
        .await
        .expect_err("y staged on a number x's recorded bind still binds");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert_eq!(mounts, mounts_below(&agent.work), "the host changed");
    // x's unpublish takes its own bind down: the device it binds is no volume's of x, but the
    // bind is x's publication.
    node.node_unpublish_volume(unpublish_req(&x, &t))
        .await
        .expect("x's unpublish");
    assert!(!super::is_mounted(&t), "x's bind was left");
}

/// Detaches a loop device at the end of a test, whatever happened.
struct DetachAtEnd(String);

impl Drop for DetachAtEnd {
    fn drop(&mut self) {
        detach_loop(Path::new(&self.0));
    }
}

/// A read-only device a refused unpublish kept, whose record a rebuilt state then lost, is not
/// kept forever: once nothing binds it, the controller's detach of the volume takes it away (an
/// eleventh fresh review's F3: it refused until the agent restarted).
#[tokio::test]
async fn a_kept_read_only_device_the_records_lost_goes_with_the_detach() {
    let _ns = crate::NAMESPACE_COPY.write().await;
    if !require_root("a_kept_read_only_device_the_records_lost_goes_with_the_detach") {
        return;
    }
    let scratch = Scratch::new("g-rolost");
    let mut agent = Agent::start(&scratch, AgentOpts::default()).await;
    let (vol, staging, t) = published(&agent, "l", true).await;
    let _overlays = Overlays(vol.device.clone());
    let mut node = agent.node().await;
    let theirs = BoundElsewhere::new(&scratch.path, &t, &scratch.join("ctr-xvda"));
    node.node_unpublish_volume(unpublish_req(&vol, &t))
        .await
        .expect_err("kept while bound");
    node.node_unstage_volume(unstage_req(&vol, &staging))
        .await
        .expect("unstage");
    drop(node);
    agent.kill();
    agent.recover("--from-mounts");
    agent.spawn().await;
    theirs.end();
    let mut node = agent.node().await;
    node.node_unpublish_volume(unpublish_req(&vol, &t))
        .await
        .expect("the retried unpublish");
    detach(&agent, &vol.id)
        .await
        .expect("the detach once nothing binds the kept device");
    assert!(
        loops_over(&vol.device).is_empty(),
        "the kept device was left"
    );
}

/// A workload may detach its own loop device (LOOP_CLR_FD needs no privilege, a read-only open
/// of its node will do); its bind then holds a number no device has. The agent's next loop
/// device, the controller's or a read-only publication's, never takes that number (a twelfth
/// fresh review's F1, high: the next volume's bytes were read and written through the bind).
#[tokio::test]
async fn no_new_loop_device_takes_a_number_a_bind_still_holds() {
    // Alone: no other test of the binary attaches a loop device meanwhile (see below).
    let _ns = crate::NAMESPACE_COPY.write().await;
    if !require_root("no_new_loop_device_takes_a_number_a_bind_still_holds") {
        return;
    }
    for readonly in [false, true] {
        let scratch = Scratch::new(&format!("g-clrfd-{readonly}"));
        let agent = Agent::start(&scratch, AgentOpts::default()).await;
        let (x, _staging, t) = published(&agent, "x", readonly).await;
        let _overlays = Overlays(x.device.clone());
        let bound = std::fs::metadata(&t).expect("the target");
        use std::os::unix::fs::MetadataExt;
        let freed = format!("/dev/loop{}", nix::sys::stat::minor(bound.rdev()));
        // The workload detaches the device its publication binds.
        sh(&format!(
            "python3 -c \"import os,fcntl; fd=os.open('{}',os.O_RDONLY); fcntl.ioctl(fd,0x4C01); os.close(fd)\"",
            t.display()
        ));
        assert!(
            super::backing_file(&freed).is_empty(),
            "{freed} is still bound"
        );
        // The kernel gives the lowest free number: volumes made until one lies past the freed
        // number, none may be given it.
        let index = |d: &str| {
            d.trim_start_matches("/dev/loop")
                .parse::<u32>()
                .unwrap_or(0)
        };
        let mut made = Vec::new();
        loop {
            let v = create_attached(&agent, &format!("y{}", made.len()), 16 * super::MIB).await;
            made.push(DetachAtEnd(v.device.clone()));
            assert_ne!(
                v.device, freed,
                "readonly {readonly}: a new volume took the number x's bind holds"
            );
            if index(&v.device) > index(&freed) || made.len() > 32 {
                break;
            }
        }
    }
}
