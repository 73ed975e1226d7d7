//! Raw block publications the agent adopts instead of making: a bind of the volume's device node
//! found at a target with no complete record is the volume's read-only publication only if it
//! binds the agent's read-only device (a bind's read-only flag does not reach a device node),
//! and is taken only while no other view of the volume's bytes is in use; `recover
//! --from-mounts` never rebuilds a volume whose filesystem is mounted as a raw block staging,
//! whichever of its mounts was made first (a sixty-fifth fresh review's F1 and F2).

use ebs_tests::csi_req::*;
use ebs_tests::*;

use csi::volume_capability::access_mode::Mode;
use tonic::Code;

use super::MIB;

fn multi_block() -> csi::VolumeCapability {
    block_cap(Mode::SingleNodeMultiWriter)
}

/// Root's bind of the volume's own device node at a target, `ro` (which the node ignores).
fn bind_node(dev: &str, target: &std::path::Path) {
    std::fs::create_dir_all(target.parent().expect("a parent")).expect("its directory");
    std::fs::write(target, b"").expect("the target file");
    sh(&format!("mount --bind -o ro {dev} {}", target.display()));
}

/// Whether a write through `target` reaches the device.
fn writable(target: &std::path::Path) -> bool {
    std::fs::OpenOptions::new().write(true).open(target).is_ok()
}

/// A read-only raw block publish over root's bind of the writable node is refused, found by the
/// publish or by start-up after a publish cut past its bind intent; a read-write one over such a
/// bind is refused while another loop device over the volume's file is mounted (the review's
/// F1: the first two were recorded read-only over a writable node, the third taken under a
/// mounted ext4).
#[tokio::test]
async fn a_bind_found_at_a_block_target_is_taken_only_as_the_publish_would_bind() {
    let _ns = crate::NAMESPACE_COPY.read().await;
    if !require_root("a_bind_found_at_a_block_target_is_taken_only_as_the_publish_would_bind") {
        return;
    }
    let scratch = Scratch::new("g-adopt-block");
    let mut agent = Agent::start(&scratch, AgentOpts::default()).await;
    let (v, staging) = super::staged(&agent, "blk", 32 * MIB, multi_block()).await;
    let mut node = agent.node().await;
    let publish = |target: &std::path::Path, readonly| {
        publish_req(&v, &staging, target, multi_block(), readonly)
    };

    let found = agent.work.join("pods/found/dev");
    bind_node(&v.device, &found);
    let e = node
        .node_publish_volume(publish(&found, true))
        .await
        .expect_err("a writable node published read-only");
    assert_eq!(e.code(), Code::AlreadyExists, "{e:?}");

    let cut = agent.work.join("pods/cut/dev");
    super::cut_past_bind_intent(&mut agent, publish(&cut, true)).await;
    let _ = std::fs::remove_file(&cut);
    bind_node(&v.device, &cut);
    agent.restart(Some(AgentOpts::default())).await;
    let log = agent.log_text();
    assert!(!log.contains("record completed"), "{log}");
    let mut node = agent.node().await;
    let e = node
        .node_publish_volume(publish(&cut, true))
        .await
        .expect_err("the retry over a writable node");
    assert_eq!(e.code(), Code::AlreadyExists, "{e:?}");
    assert!(writable(&cut), "the test's own bind");

    let file = sh(&format!("losetup -nO BACK-FILE {}", v.device));
    let file = String::from_utf8_lossy(&file.stdout).trim().to_string();
    let sibling = sh(&format!("losetup -f --show {file}"));
    let sibling = String::from_utf8_lossy(&sibling.stdout).trim().to_string();
    let other = agent.work.join("other");
    std::fs::create_dir_all(&other).expect("a mount point");
    sh(&format!(
        "mkfs.ext4 -q {sibling} && mount {sibling} {}",
        other.display()
    ));
    let rw = agent.work.join("pods/rw/dev");
    bind_node(&v.device, &rw);
    let e = node
        .node_publish_volume(publish(&rw, false))
        .await
        .expect_err("taken while another view of the bytes is mounted");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    sh(&format!(
        "umount {} && losetup -d {sibling}",
        other.display()
    ));
    for target in [&found, &cut, &rw] {
        sh(&format!("umount {}", target.display()));
    }
    // The stage's records hold nothing of the refused targets.
    node.node_unstage_volume(unstage_req(&v, &staging))
        .await
        .expect("unstage");
}

/// `recover --from-mounts` over a filesystem volume whose node root bound before mounting it:
/// the volume is rebuilt as a filesystem staging, the bind is none of its publications, and a
/// raw block publish of it is refused (the review's F2: rebuilt as a raw block staging, and the
/// publish handed out the writable node of a mounted ext4).
#[tokio::test]
async fn a_node_bound_before_the_filesystems_mount_is_never_rebuilt_as_raw_block() {
    let _ns = crate::NAMESPACE_COPY.read().await;
    if !require_root("a_node_bound_before_the_filesystems_mount_is_never_rebuilt_as_raw_block") {
        return;
    }
    let scratch = Scratch::new("g-adopt-order");
    let mut agent = Agent::start(&scratch, AgentOpts::default()).await;
    let v = create_attached(&agent, "order", 64 * MIB).await;
    let fs = || mount_cap_flags("ext4", Mode::SingleNodeWriter, &[]);
    let staging = agent.work.join("staging/order");
    let mut node = agent.node().await;
    node.node_stage_volume(stage_req(&v, &staging, fs()))
        .await
        .expect("the first stage formats it");
    node.node_unstage_volume(unstage_req(&v, &staging))
        .await
        .expect("unstage");
    agent.kill();
    let bound = agent.work.join("pods/early/dev");
    bind_node(&v.device, &bound);
    std::fs::create_dir_all(&staging).expect("the staging directory");
    sh(&format!("mount {} {}", v.device, staging.display()));
    let said = agent.recover("--from-mounts");
    assert!(said.contains("none of its publications"), "{said}");
    agent.spawn().await;
    let mut node = agent.node().await;
    let target = agent.work.join("pods/late/dev");
    let e = node
        .node_publish_volume(publish_req(&v, &staging, &target, multi_block(), false))
        .await
        .expect_err("a mounted filesystem's node handed out raw");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    sh(&format!("umount {}", bound.display()));
    node.node_unstage_volume(unstage_req(&v, &staging))
        .await
        .expect("unstage");
}

/// A raw block publish never hands out the writable node of a device root mounted a filesystem
/// from, on records alone: a publication whose bind a reboot took (its record kept for the file
/// the agent made) exempts nothing, nor does a bind found at the target (a sixty-sixth fresh
/// review's F1 and F2: each let a publish through beside root's ext4 mount of the device).
#[tokio::test]
async fn a_mounted_devices_node_is_never_handed_out_raw_on_records_alone() {
    let _ns = crate::NAMESPACE_COPY.read().await;
    if !require_root("a_mounted_devices_node_is_never_handed_out_raw_on_records_alone") {
        return;
    }
    let scratch = Scratch::new("g-adopt-claimed");
    let mut agent = Agent::start(&scratch, AgentOpts::default()).await;
    let (v, staging) = super::staged(&agent, "claimed", 64 * MIB, multi_block()).await;
    let mut node = agent.node().await;
    sh(&format!("mkfs.ext4 -q {}", v.device));
    let publish =
        |target: &std::path::Path| publish_req(&v, &staging, target, multi_block(), false);
    let rebooted = agent.work.join("pods/rebooted/dev");
    node.node_publish_volume(publish(&rebooted))
        .await
        .expect("publish");
    agent.kill();
    sh(&format!("umount {}", rebooted.display()));
    let other = agent.work.join("other");
    std::fs::create_dir_all(&other).expect("a mount point");
    sh(&format!("mount {} {}", v.device, other.display()));
    let mounted = Unmount(other.clone());
    agent.spawn().await;
    let mut node = agent.node().await;
    let fresh = agent.work.join("pods/fresh/dev");
    let e = node
        .node_publish_volume(publish(&fresh))
        .await
        .expect_err("exempt by a record whose bind is gone");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    let found = agent.work.join("pods/found/dev");
    sh(&format!(
        "mkdir -p {0} && touch {1} && mount --bind {2} {1}",
        found.parent().expect("a parent").display(),
        found.display(),
        v.device
    ));
    let e = node
        .node_publish_volume(publish(&found))
        .await
        .expect_err("a bind found beside a mounted filesystem");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    drop(mounted);
    node.node_publish_volume(publish(&found))
        .await
        .expect("the bind adopted, the filesystem gone");
    for target in [&found, &rebooted] {
        node.node_unpublish_volume(unpublish_req(&v, target))
            .await
            .expect("unpublish");
    }
    node.node_unstage_volume(unstage_req(&v, &staging))
        .await
        .expect("unstage");
}
