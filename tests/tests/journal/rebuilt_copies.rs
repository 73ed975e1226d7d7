//! `recover --from-mounts` under a shared directory with a peer (kubelet's directory on a
//! systemd host, bound elsewhere): the kernel shows the staging and every publication again at
//! the peer, and those copies are none of the volume's mounts (a seventy-third fresh review's
//! F1: each was rebuilt as a publication of a single-writer volume, its repeat publish and its
//! unstage were refused for good, and an unpublish of a copy inside the prefix took the staging
//! mount down).

use ebs_tests::csi_req::*;
use ebs_tests::*;

use csi::volume_capability::access_mode::Mode;

#[tokio::test]
async fn copies_a_shared_directory_shows_are_never_rebuilt_as_publications() {
    if !require_root("copies_a_shared_directory_shows_are_never_rebuilt_as_publications") {
        return;
    }
    let scratch = Scratch::new("rebuilt-copies");
    let mut agent = Agent::start(&scratch, AgentOpts::default()).await;
    let kl = agent.work.join("kl");
    let peer = agent.work.join("peer");
    let outside = scratch.join("outside");
    // A peer inside the prefix and one outside it, a peer made of a subdirectory, and a slave of
    // a slave (a seventy-fourth fresh review's F2: the last two were still rebuilt).
    let (sub_peer, s1, s2) = (
        agent.work.join("subpeer"),
        agent.work.join("s1"),
        agent.work.join("s2"),
    );
    sh(&format!(
        "mkdir -p {k}/sub {p} {o} {x} {s1} {s2} && mount --bind {k} {k} && \
         mount --make-private {k} && mount --make-shared {k} && mount --bind {k} {p} && \
         mount --bind {k} {o} && mount --bind {k}/sub {x} && mount --bind {k} {s1} && \
         mount --make-slave {s1} && mount --make-shared {s1} && mount --bind {s1} {s2} && \
         mount --make-slave {s2}",
        k = kl.display(),
        p = peer.display(),
        o = outside.display(),
        x = sub_peer.display(),
        s1 = s1.display(),
        s2 = s2.display()
    ));
    let v = create_attached(&agent, "copies", 64 << 20).await;
    let staging = kl.join("sub/plugins/kubernetes.io/csi/ebs.csi.aws.com/abc/globalmount");
    let target = kl.join("sub/pods/p1/volumes/kubernetes.io~csi/pv/mount");
    let cap = || mount_cap("ext4", Mode::SingleNodeWriter);
    let mut node = agent.node().await;
    node.node_stage_volume(stage_req(&v, &staging, cap()))
        .await
        .expect("stage");
    node.node_publish_volume(publish_req(&v, &staging, &target, cap(), true))
        .await
        .expect("publish");
    agent.kill();
    let said = agent.recover("--from-mounts");
    assert_eq!(said.matches("published at").count(), 1, "{said}");
    assert!(
        said.contains(&format!("published at {}", target.display())),
        "{said}"
    );
    agent.spawn().await;
    let mut node = agent.node().await;
    node.node_publish_volume(publish_req(&v, &staging, &target, cap(), true))
        .await
        .unwrap_or_else(|e| panic!("the repeat: {e:?}\n{said}"));
    unpublish_and_unstage(&agent, &v, &staging, &target).await;
    assert!(
        mounts_below(&peer).iter().all(|m| m == &peer),
        "copies left at the peer: {:?}",
        mounts_below(&peer)
    );
}

/// kubelet's directory bound on itself below a shared mount (systemd makes `/` shared): each
/// mount made inside it is copied below the shared mount at the same path, hidden under the
/// self-bind, and listed at the same path string (a seventy-fifth fresh review's F1: rebuilt as
/// publications, every kubelet call but the unpublish was refused for good, and the unpublish of
/// the staging path took the real staging down).
#[tokio::test]
async fn hidden_copies_below_a_self_bound_kubelet_directory_are_never_rebuilt() {
    if !require_root("hidden_copies_below_a_self_bound_kubelet_directory_are_never_rebuilt") {
        return;
    }
    let scratch = Scratch::new("rebuilt-hidden");
    let mut agent = Agent::start(&scratch, AgentOpts::default()).await;
    let root = agent.work.join("r");
    let kubelet = root.join("kubelet");
    sh(&format!(
        "mkdir -p {k} && mount --bind {r} {r} && mount --make-private {r} && \
         mount --make-shared {r} && mount --bind {k} {k}",
        r = root.display(),
        k = kubelet.display()
    ));
    let v = create_attached(&agent, "hidden", 64 << 20).await;
    let staging = kubelet.join("plugins/kubernetes.io/csi/ebs.csi.aws.com/abc/globalmount");
    let target = kubelet.join("pods/uid1/volumes/kubernetes.io~csi/pvc-1/mount");
    let cap = || mount_cap("ext4", Mode::SingleNodeWriter);
    let mut node = agent.node().await;
    node.node_stage_volume(stage_req(&v, &staging, cap()))
        .await
        .expect("stage");
    node.node_publish_volume(publish_req(&v, &staging, &target, cap(), false))
        .await
        .expect("publish");
    agent.kill();
    let said = agent.recover("--from-mounts");
    assert_eq!(said.matches("published at").count(), 1, "{said}");
    agent.spawn().await;
    let mut node = agent.node().await;
    node.node_stage_volume(stage_req(&v, &staging, cap()))
        .await
        .unwrap_or_else(|e| panic!("the repeat stage: {e:?}\n{said}"));
    node.node_publish_volume(publish_req(&v, &staging, &target, cap(), false))
        .await
        .unwrap_or_else(|e| panic!("the repeat publish: {e:?}\n{said}"));
    unpublish_and_unstage(&agent, &v, &staging, &target).await;
}
