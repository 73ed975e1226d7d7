//! A device used only raw (its node bound onto a file: an operator's bind, another driver's
//! block volume, or a raw block publication a `recover --reset` forgot) shows no claim to the
//! kernel's exclusive open, so a filesystem stage took it: mkfs or a mount over bytes a workload
//! writes. The raw-use check lived in the node-local backend, so only handles asked it; the
//! core asks it now on every first take of a device (`HostOps::raw_use`), whatever the door
//! (the simulation's long run, seeds 9036274 and 9044383: after a reset, vol-b's own stage took
//! the device a handle had published raw).

use csi::volume_capability::access_mode::Mode;
use ebs_tests::csi_req::*;
use ebs_tests::*;
use tonic::Code;

use super::owners::SIZE;

#[tokio::test]
async fn a_volume_whose_device_is_bound_raw_elsewhere_is_not_staged() {
    let _shared = crate::NAMESPACE_COPY.read().await;
    if !require_root("a_volume_whose_device_is_bound_raw_elsewhere_is_not_staged") {
        return;
    }
    let scratch = Scratch::new("node-local-raw-bound");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let v = create_attached(&agent, "v", SIZE).await;
    let bound = scratch.join("operators-bind");
    std::fs::write(&bound, b"").expect("bind target");
    sh(&format!("mount --bind {} {}", v.device, bound.display()));
    let unbind = Unmount(bound.clone());
    let device = std::path::Path::new(&v.device);
    let staging = agent.work.join("v/staging");
    let mut node = agent.node().await;
    for capability in [
        mount_cap("ext4", Mode::SingleNodeWriter),
        block_cap(Mode::SingleNodeWriter),
    ] {
        let before = checksum(device);
        let e = node
            .node_stage_volume(stage_req(&v, &staging, capability))
            .await
            .expect_err("a device bound raw elsewhere was staged");
        assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
        assert!(e.message().contains("raw use"), "{e:?}");
        assert_eq!(before, checksum(device), "the device's bytes changed");
        assert!(
            mounts_below(&agent.work).is_empty(),
            "something was mounted"
        );
    }
    drop(unbind);
    node.node_stage_volume(stage_req(
        &v,
        &staging,
        mount_cap("ext4", Mode::SingleNodeWriter),
    ))
    .await
    .expect("the stage once nothing binds the device");
    node.node_unstage_volume(unstage_req(&v, &staging))
        .await
        .expect("unstage");
}

/// A filesystem staging has no binds of its own: with its record there and its mount gone (an
/// operator's umount), a re-stage fsck'd and mounted a device whose node was bound elsewhere (a
/// thirty-second fresh review's F1).
#[tokio::test]
async fn a_re_stage_whose_mount_went_refuses_a_device_bound_raw_elsewhere() {
    let _shared = crate::NAMESPACE_COPY.read().await;
    if !require_root("a_re_stage_whose_mount_went_refuses_a_device_bound_raw_elsewhere") {
        return;
    }
    let scratch = Scratch::new("node-local-raw-restage");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let v = create_attached(&agent, "v", SIZE).await;
    let staging = agent.work.join("v/staging");
    let cap = || mount_cap("ext4", Mode::SingleNodeWriter);
    let mut node = agent.node().await;
    node.node_stage_volume(stage_req(&v, &staging, cap()))
        .await
        .expect("the first stage");
    sh(&format!("umount {}", staging.display()));
    let bound = scratch.join("operators-bind");
    std::fs::write(&bound, b"").expect("bind target");
    sh(&format!("mount --bind {} {}", v.device, bound.display()));
    let unbind = Unmount(bound.clone());
    let e = node
        .node_stage_volume(stage_req(&v, &staging, cap()))
        .await
        .expect_err("re-staged a device bound raw elsewhere");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(!super::is_mounted(&staging), "the staging is mounted again");
    drop(unbind);
    node.node_stage_volume(stage_req(&v, &staging, cap()))
        .await
        .expect("the re-stage once nothing binds the device");
    node.node_unstage_volume(unstage_req(&v, &staging))
        .await
        .expect("unstage");
}
