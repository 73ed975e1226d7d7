//! What a mount found where the agent would have made its own carries beyond its flags (a
//! seventy-second fresh review's F1 to F3, each root only): binds found at a raw block target
//! exempt nothing from the question whether a filesystem is mounted from the device; a bind with
//! a mount below it, or an idmapped one, is never taken, and no publication is bound from an
//! idmapped staging.

use std::path::Path;

use ebs_tests::csi_req::*;
use ebs_tests::*;

use csi::volume_capability::access_mode::Mode;

use super::{MIB, staged};

fn multi_block() -> csi::VolumeCapability {
    block_cap(Mode::SingleNodeMultiWriter)
}

fn writer() -> csi::VolumeCapability {
    mount_cap_flags("ext4", Mode::SingleNodeWriter, &[])
}

/// A publish cut past its bind intent, root's bind of the device's node at its target while the
/// agent is down, and root's ext4 mounted from the device: start-up leaves the bind untaken, and
/// it exempts no fresh publish from the question (the review's F1: the fresh publish handed out
/// the writable node of the mounted ext4, and zeroes through it wiped the filesystem).
#[tokio::test]
async fn a_bind_found_and_not_taken_exempts_no_publish() {
    let _ns = crate::NAMESPACE_COPY.read().await;
    if !require_root("a_bind_found_and_not_taken_exempts_no_publish") {
        return;
    }
    let scratch = Scratch::new("g-found-exempt");
    let mut agent = Agent::start(&scratch, AgentOpts::default()).await;
    let (b, staging) = staged(&agent, "exempt", 64 * MIB, multi_block()).await;
    let cut = agent.work.join("pods/k1/dev");
    let cut_req = publish_req(&b, &staging, &cut, multi_block(), false);
    super::cut_past_bind_intent(&mut agent, cut_req).await;
    let mnt = scratch.join("mnt");
    std::fs::create_dir_all(&mnt).expect("a mount point");
    sh(&format!(
        "mkdir -p {dir} && touch {cut} && mount --bind {dev} {cut} && mkfs.ext4 -qF {dev} && \
         mount {dev} {mnt}",
        dir = cut.parent().expect("a parent").display(),
        cut = cut.display(),
        dev = b.device,
        mnt = mnt.display()
    ));
    let _mounted = Unmount(mnt.clone());
    let _bound = Unmount(cut.clone());
    agent.restart(Some(AgentOpts::default())).await;
    let fresh = agent.work.join("pods/k2/dev");
    let mut node = agent.node().await;
    let e = node
        .node_publish_volume(publish_req(&b, &staging, &fresh, multi_block(), false))
        .await
        .expect_err("the writable node of a mounted ext4 handed out");
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    let probed = std::process::Command::new("blkid")
        .args(["-p", "-s", "TYPE", "-o", "value", &b.device])
        .output()
        .expect("blkid");
    assert_eq!(
        String::from_utf8_lossy(&probed.stdout).trim(),
        "ext4",
        "the mounted filesystem was touched"
    );
}

/// Root's `nodev` bind of a staging at a target with a `dev` tmpfs mounted below it, carrying a
/// node of another volume's device: the publish refuses to take it (the review's F2: `nobody`
/// read and wrote the other volume through the node).
#[tokio::test]
async fn a_bind_found_with_a_mount_below_it_is_never_taken() {
    let _ns = crate::NAMESPACE_COPY.read().await;
    if !require_root("a_bind_found_with_a_mount_below_it_is_never_taken") {
        return;
    }
    let scratch = Scratch::new("g-found-below");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let (a, staging) = staged(&agent, "below-a", 64 * MIB, writer()).await;
    let target = agent.work.join("pods/f1/mount");
    std::fs::create_dir_all(staging.join("sub")).expect("a directory on the volume");
    sh(&format!(
        "mkdir -p {t} && mount --bind -o nodev {s} {t} && mount -t tmpfs -o dev,size=1m t {t}/sub",
        s = staging.display(),
        t = target.display()
    ));
    let _bound = Unmount(target.clone());
    let _below = Unmount(target.join("sub"));
    let mut node = agent.node().await;
    let e = node
        .node_publish_volume(publish_req(&a, &staging, &target, writer(), false))
        .await
        .expect_err("a bind with a mount below it taken as a publication");
    assert_eq!(e.code(), tonic::Code::AlreadyExists, "{e:?}");
    assert!(e.message().contains("mounts below it"), "{e:?}");
}

/// Root's idmapped bind of a staging at a target, and an idmapped mount laid at the staging path
/// itself: neither is taken, and nothing is published from the second (the review's F3: `nobody`
/// read root's 0600 file and planted a setuid file owned by root on disk).
#[tokio::test]
async fn an_idmapped_mount_is_never_taken_nor_published_from() {
    let _ns = crate::NAMESPACE_COPY.read().await;
    if !require_root("an_idmapped_mount_is_never_taken_nor_published_from") {
        return;
    }
    let scratch = Scratch::new("g-found-idmap");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let (a, staging) = staged(&agent, "idmap-a", 64 * MIB, writer()).await;
    let target = agent.work.join("pods/id1/mount");
    std::fs::create_dir_all(&target).expect("the target");
    idmap_bind(&staging, &target);
    let _bound = Unmount(target.clone());
    let mut node = agent.node().await;
    let e = node
        .node_publish_volume(publish_req(&a, &staging, &target, writer(), false))
        .await
        .expect_err("an idmapped bind taken as a publication");
    assert_eq!(e.code(), tonic::Code::AlreadyExists, "{e:?}");
    assert!(e.message().contains("idmapped"), "{e:?}");

    // The staging itself laid over by an idmapped bind of it.
    idmap_bind(&staging, &staging);
    let _laid = Unmount(staging.clone());
    let other = agent.work.join("pods/id2/mount");
    let e = node
        .node_publish_volume(publish_req(&a, &staging, &other, writer(), false))
        .await
        .expect_err("published from an idmapped staging");
    assert_eq!(e.code(), tonic::Code::AlreadyExists, "{e:?}");
    assert!(
        !mounts_below(&agent.work).contains(&other),
        "a publication was bound"
    );
}

fn idmap_bind(source: &Path, target: &Path) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/idmap_bind.py");
    sh(&format!(
        "/usr/bin/python3 {} {} {}",
        script.display(),
        source.display(),
        target.display()
    ));
}
