//! Publications the agent finds instead of making them: root's own mounts at a target, made
//! while the agent was down, rebuilt by `recover --from-mounts` or found by start-up after a
//! publish cut past its bind intent, are recorded only if they are what a publish's bind is
//! (`nodev`, read-only as recorded), and refused and left as they are otherwise (a sixty-fourth
//! fresh review's F1 and F2; a seventieth's F1: made so after the fact, one mount's copies in
//! other mount namespaces stayed `dev` and writable); and a mount of a second loop device over
//! the volume's file, found at a target, is never the volume's publication (the sixty-fourth's
//! F3: two filesystems over the same bytes were handed out as the volume).

use ebs_tests::csi_req::*;
use ebs_tests::*;

use csi::volume_capability::access_mode::Mode;

use super::MIB;
use super::nodev::{carry_node, opens_nothing};
use super::ro_peer::mount_options;

fn writer() -> csi::VolumeCapability {
    mount_cap_flags("ext4", Mode::SingleNodeWriter, &[])
}

/// `recover --from-mounts` over root's own staging mount and bind of volume B, both `dev`: the
/// next start completes neither, the publish's retry is refused and both are left as they were;
/// once root unmounts them, the retries make the agent's own, `nodev` (the sixty-fourth review's
/// F1: the bind was rebuilt complete and handed out as it was; `nobody` read another volume
/// through a node on it).
#[tokio::test]
async fn binds_rebuilt_from_roots_own_mounts_are_refused_not_adopted() {
    let _ns = crate::NAMESPACE_COPY.read().await;
    if !require_root("binds_rebuilt_from_roots_own_mounts_are_refused_not_adopted") {
        return;
    }
    let scratch = Scratch::new("g-adopt-rebuilt");
    let mut agent = Agent::start(&scratch, AgentOpts::default()).await;
    let a = create_attached(&agent, "rebuilt-a", 64 * MIB).await;
    let b = create_attached(&agent, "rebuilt-b", 64 * MIB).await;
    let staging = agent.work.join("staging/b");
    let target = agent.work.join("pods/b/mount");
    let mut node = agent.node().await;
    node.node_stage_volume(stage_req(&b, &staging, writer()))
        .await
        .expect("stage");
    node.node_publish_volume(publish_req(&b, &staging, &target, writer(), false))
        .await
        .expect("publish");
    agent.kill();
    sh(&format!(
        "umount {t} && umount {s} && mount -o dev {d} {s} && mount --bind {s} {t}",
        t = target.display(),
        s = staging.display(),
        d = b.device
    ));
    carry_node(&staging, &a);
    let before = [mount_options(&staging), mount_options(&target)];
    agent.recover("--from-mounts");
    agent.spawn().await;
    let mut node = agent.node().await;
    let e = node
        .node_publish_volume(publish_req(&b, &staging, &target, writer(), false))
        .await
        .expect_err("published over root's own mounts");
    assert_eq!(e.code(), tonic::Code::AlreadyExists, "{e:?}");
    assert_eq!(
        [mount_options(&staging), mount_options(&target)],
        before,
        "root's mounts were changed"
    );
    sh(&format!(
        "umount {} && umount {}",
        target.display(),
        staging.display()
    ));
    node.node_stage_volume(stage_req(&b, &staging, writer()))
        .await
        .unwrap_or_else(|e| panic!("the stage's retry: {e:?}\n{}", agent.log_text()));
    node.node_publish_volume(publish_req(&b, &staging, &target, writer(), false))
        .await
        .unwrap_or_else(|e| panic!("the publish's retry: {e:?}\n{}", agent.log_text()));
    for place in [&staging, &target] {
        opens_nothing("rebuilt", place);
    }
    node.node_unpublish_volume(unpublish_req(&b, &target))
        .await
        .expect("unpublish");
    node.node_unstage_volume(unstage_req(&b, &staging))
        .await
        .expect("unstage");
}

/// A publish cut past its bind intent, and root's own mount of the volume at the target while
/// the agent is down (`dev`, read-write): start-up leaves the publication in progress, the
/// retry is refused and the mount left as it is; once root unmounts it, the retry binds the
/// agent's own, `nodev`, read-only for a read-only publish (the sixty-fourth review's F2:
/// completed as it was; the read-only one was recorded read-only over a read-write mount).
#[tokio::test]
async fn a_publication_cut_past_its_intent_is_never_completed_over_roots_mount() {
    let _ns = crate::NAMESPACE_COPY.read().await;
    if !require_root("a_publication_cut_past_its_intent_is_never_completed_over_roots_mount") {
        return;
    }
    let scratch = Scratch::new("g-adopt-cut");
    let mut agent = Agent::start(&scratch, AgentOpts::default()).await;
    let a = create_attached(&agent, "cut-a", 64 * MIB).await;
    let b = create_attached(&agent, "cut-b", 64 * MIB).await;
    let staging = agent.work.join("staging/b");
    let multi = || mount_cap_flags("ext4", Mode::SingleNodeMultiWriter, &[]);
    let mut node = agent.node().await;
    node.node_stage_volume(stage_req(&b, &staging, multi()))
        .await
        .expect("stage");
    for readonly in [false, true] {
        let case = if readonly { "read-only" } else { "read-write" };
        let target = agent.work.join(format!("pods/{case}/mount"));
        let publish = || publish_req(&b, &staging, &target, multi(), readonly);
        super::cut_past_bind_intent(&mut agent, publish()).await;
        std::fs::create_dir_all(&target).expect("the target");
        sh(&format!(
            "mount -o dev,rw {} {}",
            b.device,
            target.display()
        ));
        carry_node(&target, &a);
        let before = mount_options(&target);
        agent.restart(Some(AgentOpts::default())).await;
        let log = agent.log_text();
        assert!(log.contains("left in progress"), "{case}: {log}");
        let mut node = agent.node().await;
        let e = node
            .node_publish_volume(publish())
            .await
            .expect_err("root's mount taken as the publication");
        assert_eq!(e.code(), tonic::Code::AlreadyExists, "{case}: {e:?}");
        assert_eq!(
            mount_options(&target),
            before,
            "{case}: root's mount changed"
        );
        sh(&format!("umount {}", target.display()));
        node.node_publish_volume(publish())
            .await
            .unwrap_or_else(|e| panic!("{case}: the retry: {e:?}\n{}", agent.log_text()));
        opens_nothing(case, &target);
        let opts = mount_options(&target).unwrap_or_default();
        assert_eq!(opts.iter().any(|o| o == "ro"), readonly, "{case}: {opts:?}");
        node.node_unpublish_volume(unpublish_req(&b, &target))
            .await
            .expect("unpublish");
    }
    let mut node = agent.node().await;
    node.node_unstage_volume(unstage_req(&b, &staging))
        .await
        .expect("unstage");
}

/// A second loop device over volume B's file (root's `losetup`), mounted or its node bound at a
/// target, shows B's identity: a publish there is refused, and records nothing (the review's F3:
/// it answered OK, a second ext4 over B's bytes recorded as B's publication; a raw block publish
/// recorded a device the controller never attached).
#[tokio::test]
async fn a_mount_of_another_loop_device_over_the_volumes_file_is_never_its_publication() {
    let _ns = crate::NAMESPACE_COPY.read().await;
    if !require_root(
        "a_mount_of_another_loop_device_over_the_volumes_file_is_never_its_publication",
    ) {
        return;
    }
    let scratch = Scratch::new("g-adopt-sibling");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let mut node = agent.node().await;
    for block in [false, true] {
        let case = if block { "block" } else { "mount" };
        let b = create_attached(&agent, &format!("sib-{case}"), 64 * MIB).await;
        let staging = agent.work.join(format!("staging/{case}"));
        let target = agent.work.join(format!("pods/{case}/mount"));
        let cap = || match block {
            true => block_cap(Mode::SingleNodeMultiWriter),
            false => mount_cap_flags("ext4", Mode::SingleNodeMultiWriter, &[]),
        };
        node.node_stage_volume(stage_req(&b, &staging, cap()))
            .await
            .expect("stage");
        let file = sh(&format!("losetup -nO BACK-FILE {}", b.device));
        let file = String::from_utf8_lossy(&file.stdout).trim().to_string();
        let sibling = sh(&format!("losetup -f --show {file}"));
        let sibling = String::from_utf8_lossy(&sibling.stdout).trim().to_string();
        if block {
            std::fs::create_dir_all(target.parent().expect("a parent")).expect("its directory");
            std::fs::write(&target, b"").expect("the target file");
            sh(&format!("mount --bind {sibling} {}", target.display()));
        } else {
            std::fs::create_dir_all(&target).expect("the target");
            sh(&format!("mount {sibling} {}", target.display()));
        }
        let e = node
            .node_publish_volume(publish_req(&b, &staging, &target, cap(), false))
            .await
            .expect_err("published a mount of another device");
        assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{case}: {e:?}");
        let status = agent.status_json();
        assert!(!status.is_null(), "{case}: no status");
        let status = status.to_string();
        assert!(
            !status.contains(&*target.to_string_lossy()),
            "{case}: {status}"
        );
        sh(&format!(
            "umount {} && losetup -d {sibling}",
            target.display()
        ));
        node.node_unstage_volume(unstage_req(&b, &staging))
            .await
            .expect("unstage");
    }
}
