//! A mount found where the agent would have made its own, in a tree whose mounts propagate to
//! other mount namespaces (kubelet's directory is shared on every systemd host): making that one
//! mount read-only or `nodev` after the fact does not reach its copies, so nothing found is made
//! so and recorded (a seventieth fresh review's F1: root's read-write bind at a read-only
//! publication's target, made while the agent was down after a publish cut past its intent, was
//! completed read-only on the host and stayed writable in a peer; a repeat of a complete publish
//! answered OK over root's remount of it with `dev`).

use ebs_tests::csi_req::*;
use ebs_tests::*;

use csi::volume_capability::access_mode::Mode;

use super::MIB;
use super::ro_peer::{mount_options, shared_pair};

#[tokio::test]
async fn a_bind_found_in_a_shared_tree_is_recorded_only_as_the_publish_binds() {
    let _ns = crate::NAMESPACE_COPY.read().await;
    if !require_root("a_bind_found_in_a_shared_tree_is_recorded_only_as_the_publish_binds") {
        return;
    }
    let scratch = Scratch::new("g-adopt-copies");
    let mut agent = Agent::start(&scratch, AgentOpts::default()).await;
    let shared = agent.work.join("pods");
    let peer = scratch.join("peer");
    shared_pair(&shared, &peer);
    let vol = create_attached(&agent, "copies", 64 * MIB).await;
    let staging = agent.work.join("staging/copies");
    let target = shared.join("ro/mount");
    let seen = peer.join("ro/mount");
    let cap = || mount_cap_flags("ext4", Mode::SingleNodeMultiWriter, &[]);
    let publish = || publish_req(&vol, &staging, &target, cap(), true);
    let mut node = agent.node().await;
    node.node_stage_volume(stage_req(&vol, &staging, cap()))
        .await
        .expect("stage");

    // A read-only publish cut past its bind intent; root's read-write bind there meanwhile.
    super::cut_past_bind_intent(&mut agent, publish()).await;
    std::fs::create_dir_all(&target).expect("the target");
    sh(&format!(
        "mount --bind {} {}",
        staging.display(),
        target.display()
    ));
    let before = [mount_options(&target), mount_options(&seen)];
    agent.restart(Some(AgentOpts::default())).await;
    let mut node = agent.node().await;
    let e = node
        .node_publish_volume(publish())
        .await
        .expect_err("root's read-write bind recorded as a read-only publication");
    assert_eq!(e.code(), tonic::Code::AlreadyExists, "{e:?}");
    assert_eq!(
        [mount_options(&target), mount_options(&seen)],
        before,
        "root's bind or its copy was changed"
    );

    // Root's bind gone, the publish binds its own: read-only in the peer too.
    sh(&format!("umount {}", target.display()));
    node.node_publish_volume(publish())
        .await
        .unwrap_or_else(|e| panic!("the retry: {e:?}\n{}", agent.log_text()));
    let peer_opts = mount_options(&seen).expect("the copy in the peer");
    assert!(peer_opts.iter().any(|o| o == "ro"), "{peer_opts:?}");

    // Root remounts the host's copy `dev`: the repeat no longer answers OK.
    sh(&format!(
        "mount -o remount,bind,ro,dev {}",
        target.display()
    ));
    let e = node
        .node_publish_volume(publish())
        .await
        .expect_err("a repeat answered OK over a bind remounted dev");
    assert_eq!(e.code(), tonic::Code::AlreadyExists, "{e:?}");
    assert!(e.message().contains("nodev"), "{e:?}");
    unpublish_and_unstage(&agent, &vol, &staging, &target).await;
}

/// A publish naming a place where a shared directory's peer shows the kernel's copy of the
/// volume's own staging, or of another of its publications: refused, and the original stays (a
/// seventy-fourth fresh review's F1: the copy was taken for the publication, and its unpublish
/// propagated back and unmounted the staging, or another workload's raw block bind).
#[tokio::test]
async fn the_kernels_copy_of_the_volumes_own_mount_is_never_a_publication() {
    let _ns = crate::NAMESPACE_COPY.read().await;
    if !require_root("the_kernels_copy_of_the_volumes_own_mount_is_never_a_publication") {
        return;
    }
    let scratch = Scratch::new("g-own-copies");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let (u, w) = (agent.work.join("u"), agent.work.join("w"));
    shared_pair(&u, &w);
    let fs = || mount_cap_flags("ext4", Mode::SingleNodeWriter, &[]);
    let raw = || block_cap(Mode::SingleNodeMultiWriter);
    let (k, k_staging) = super::staged(&agent, "own-raw", 64 * MIB, raw()).await;
    // The filesystem volume staged in the shared directory, the raw one published there.
    let h = create_attached(&agent, "own-fs", 64 * MIB).await;
    let staging = u.join("st");
    let mut node = agent.node().await;
    node.node_stage_volume(stage_req(&h, &staging, fs()))
        .await
        .expect("stage in the shared directory");
    let pod = u.join("pod1");
    node.node_publish_volume(publish_req(&k, &k_staging, &pod, raw(), false))
        .await
        .expect("the raw publish");
    for (v, from, copy, cap, original) in [
        (&h, &staging, w.join("st"), fs(), &staging),
        (&k, &k_staging, w.join("pod1"), raw(), &pod),
    ] {
        let e = node
            .node_publish_volume(publish_req(v, from, &copy, cap, false))
            .await
            .expect_err("the kernel's copy taken for a publication");
        assert_eq!(e.code(), tonic::Code::AlreadyExists, "{e:?}");
        assert!(e.message().contains("copy of"), "{e:?}");
        node.node_unpublish_volume(unpublish_req(v, &copy))
            .await
            .expect("the unpublish of a place never published");
        assert!(
            super::is_mounted(original),
            "{} was taken down",
            original.display()
        );
    }
    node.node_unpublish_volume(unpublish_req(&k, &pod))
        .await
        .expect("unpublish");
    for (v, at) in [(&k, &k_staging), (&h, &staging)] {
        node.node_unstage_volume(unstage_req(v, at))
            .await
            .expect("unstage");
    }
}
