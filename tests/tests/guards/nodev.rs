//! A device node on a volume's own filesystem opens nothing: every filesystem staging is mounted
//! `nodev`, whatever the mount options say (`dev` included), and its publications keep it (a
//! fifty-fourth fresh review's F2: a node carried on volume B's filesystem, which any user can
//! put in an image with debugfs, read volume A's bytes as `nobody` through B's publication).
//! A staging the agent did not mount (root's own mount of the volume at its staging path, the
//! upstream plugin's, found by a stage or by start-up recovery of a stage cut before its mount)
//! is taken only as the stage would have mounted it, `dev` aside (a sixty-third fresh review's
//! F1, a seventieth's F1); its publications are `nodev` whatever it has.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use ebs_tests::csi_req::*;
use ebs_tests::*;

use csi::volume_capability::access_mode::Mode;
use nix::sys::stat::{Mode as Perm, SFlag, mknod};

use super::MIB;
use super::ro_peer::mount_options;

#[tokio::test]
async fn a_device_node_on_a_volume_opens_nothing() {
    let _ns = crate::NAMESPACE_COPY.read().await;
    if !require_root("a_device_node_on_a_volume_opens_nothing") {
        return;
    }
    let scratch = Scratch::new("g-nodev");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    // A's device is what the node on B names; A needs no staging for its bytes to be read.
    let a = create_attached(&agent, "nodev-a", 64 * MIB).await;
    let b = create_attached(&agent, "nodev-b", 64 * MIB).await;
    let mut node = agent.node().await;
    for (case, flags) in [("plain", &[][..]), ("dev", &["dev"][..])] {
        let staging = agent.work.join(format!("staging/{case}"));
        let cap = || mount_cap_flags("ext4", Mode::SingleNodeWriter, flags);
        node.node_stage_volume(stage_req(&b, &staging, cap()))
            .await
            .unwrap_or_else(|e| panic!("{case}: stage: {e:?}\n{}", agent.log_text()));
        carry_node(&staging, &a);
        let carried = staging.join("node");
        let target = agent.work.join(format!("pods/{case}/mount"));
        for readonly in [false, true] {
            node.node_publish_volume(publish_req(&b, &staging, &target, cap(), readonly))
                .await
                .unwrap_or_else(|e| panic!("{case}: publish: {e:?}\n{}", agent.log_text()));
            for place in [&staging, &target] {
                opens_nothing(case, place);
            }
            node.node_unpublish_volume(unpublish_req(&b, &target))
                .await
                .expect("unpublish");
        }
        std::fs::remove_file(&carried).expect("removing the node");
        node.node_unstage_volume(unstage_req(&b, &staging))
            .await
            .expect("unstage");
    }
}

/// Root mounts volume B at its staging path by hand (`dev`, as the upstream plugin this agent
/// replaces mounts its stagings; or read-write for a reader), with no record of it, or while the
/// agent is down after a stage of it was cut at its mount's intent. A `dev` staging is taken as
/// it is (only root reaches a staging path), and its publication is `nodev`: the node carried on
/// B opens nothing there (a sixty-third fresh review's F1: it read volume A's bytes as `nobody`).
/// A read-write filesystem is refused for a reader's stage and left as it is (its F3; a
/// seventieth's F1: made read-only after the fact, the filesystem below stayed read-write). With
/// the new mount API, and without it (a filter denies it, as a kernel before 5.12 lacks it).
#[tokio::test]
async fn a_staging_mounted_by_hand_is_taken_only_as_the_stage_would_mount_it() {
    let _ns = crate::NAMESPACE_COPY.read().await;
    if !require_root("a_staging_mounted_by_hand_is_taken_only_as_the_stage_would_mount_it") {
        return;
    }
    use ebs_tests::seccomp::{EPERM, MOUNT_SETATTR, MOVE_MOUNT, OPEN_TREE, filtered};
    found_by_hand("g-nodev-hand", Vec::new()).await;
    let denied = filtered(&[
        (OPEN_TREE, EPERM),
        (MOVE_MOUNT, EPERM),
        (MOUNT_SETATTR, EPERM),
    ]);
    found_by_hand("g-nodev-hand-old", denied).await;
}

async fn found_by_hand(name: &str, wrapper: Vec<std::ffi::OsString>) {
    use ebs_tests::crash_points::{self as cp, Op as J, Step as S};
    let scratch = Scratch::new(name);
    let mut agent = Agent::unstarted(&scratch, AgentOpts::default());
    agent.wrapper = wrapper;
    agent.spawn().await;
    let a = create_attached(&agent, "hand-a", 64 * MIB).await;
    let b = create_attached(&agent, "hand-b", 64 * MIB).await;
    // B formatted by the agent, and unstaged.
    let first = agent.work.join("staging/first");
    let mut node = agent.node().await;
    let writer = || mount_cap_flags("ext4", Mode::SingleNodeWriter, &[]);
    node.node_stage_volume(stage_req(&b, &first, writer()))
        .await
        .expect("the first stage");
    node.node_unstage_volume(unstage_req(&b, &first))
        .await
        .expect("the first unstage");
    for (case, mode, by_hand, refused, cut) in [
        ("writer", Mode::SingleNodeWriter, "dev,rw", None, false),
        (
            "reader",
            Mode::SingleNodeReaderOnly,
            "nodev,rw",
            Some("read-only"),
            false,
        ),
        ("cut", Mode::SingleNodeWriter, "dev,rw", None, true),
    ] {
        let staging = agent.work.join(format!("staging/{case}"));
        let cap = || mount_cap_flags("ext4", mode, &[]);
        if cut {
            let point = cp::intent(J::Stage, S::Mount);
            let mut opts = AgentOpts::default();
            opts.args.extend(["--crash-after".to_string(), point]);
            agent.restart(Some(opts)).await;
            let mut node = agent.node().await;
            assert!(
                node.node_stage_volume(stage_req(&b, &staging, cap()))
                    .await
                    .is_err()
            );
            agent
                .wait_exit(std::time::Duration::from_secs(20))
                .await
                .expect("crashed");
        }
        std::fs::create_dir_all(&staging).expect("the staging directory");
        sh(&format!(
            "mount -o {by_hand} {} {}",
            b.device,
            staging.display()
        ));
        carry_node(&staging, &a);
        let before = mount_options(&staging);
        if cut {
            agent.restart(Some(AgentOpts::default())).await;
            let log = agent.log_text();
            assert!(log.contains("record completed"), "{case}: {log}");
        }
        let mut node = agent.node().await;
        let target = agent.work.join(format!("pods/{case}/mount"));
        let readonly = mode == Mode::SingleNodeReaderOnly;
        let staged = node.node_stage_volume(stage_req(&b, &staging, cap())).await;
        assert_eq!(
            mount_options(&staging),
            before,
            "{case}: the mount was changed"
        );
        if let Some(differs) = refused {
            let e = staged.expect_err("a read-write filesystem taken for a reader");
            assert_eq!(e.code(), tonic::Code::AlreadyExists, "{case}: {e:?}");
            assert!(e.message().contains(differs), "{case}: {e:?}");
            node.node_publish_volume(publish_req(&b, &staging, &target, cap(), readonly))
                .await
                .expect_err("published from a mount made by hand");
            sh(&format!("umount {}", staging.display()));
            node.node_stage_volume(stage_req(&b, &staging, cap()))
                .await
                .unwrap_or_else(|e| panic!("{case}: stage: {e:?}\n{}", agent.log_text()));
        } else {
            staged.unwrap_or_else(|e| panic!("{case}: stage: {e:?}\n{}", agent.log_text()));
        }
        node.node_publish_volume(publish_req(&b, &staging, &target, cap(), readonly))
            .await
            .unwrap_or_else(|e| panic!("{case}: publish: {e:?}\n{}", agent.log_text()));
        opens_nothing(case, &target);
        let opts = mount_options(&target).unwrap_or_default();
        assert_eq!(opts.iter().any(|o| o == "ro"), readonly, "{case}: {opts:?}");
        node.node_unpublish_volume(unpublish_req(&b, &target))
            .await
            .expect("unpublish");
        node.node_unstage_volume(unstage_req(&b, &staging))
            .await
            .expect("unstage");
        assert_eq!(mount_options(&staging), None, "{case}: the staging stayed");
    }
}

/// The mount at `place` is `nodev`, and the node on it is refused EACCES even to root.
pub(super) fn opens_nothing(case: &str, place: &Path) {
    let opts = mount_options(place).unwrap_or_default();
    assert!(
        opts.iter().any(|o| o == "nodev"),
        "{case}: {} is not nodev: {opts:?}",
        place.display()
    );
    match std::fs::File::open(place.join("node")) {
        Err(e) if e.raw_os_error() == Some(libc::EACCES) => {}
        other => panic!("{case}: the node at {} opened: {other:?}", place.display()),
    }
}

/// A block node naming `other`'s device, put on the filesystem mounted at `place` (root may,
/// where the mount is its own and `dev`).
pub(super) fn carry_node(place: &Path, other: &Vol) {
    let dev = std::fs::metadata(&other.device)
        .expect("the other device")
        .rdev();
    let node = place.join("node");
    let _ = std::fs::remove_file(&node);
    mknod(&node, SFlag::S_IFBLK, Perm::from_bits_truncate(0o666), dev).expect("a block node");
}
