//! A read-only raw block publication exempts from the in-use questions only what it binds now:
//! its read-only device while its bind is there, and nothing of the device itself; `recover
//! --from-mounts` keeps a raw block staging writable whatever its publications' binds are (a
//! sixty-seventh fresh review's F1 to F3).

use std::os::unix::fs::MetadataExt;

use ebs_tests::csi_req::*;
use ebs_tests::*;

use csi::volume_capability::access_mode::Mode;
use tonic::Code;

use super::MIB;

fn multi_block() -> csi::VolumeCapability {
    block_cap(Mode::MultiNodeMultiWriter)
}

/// Root's read-write mount of the volume's device beside a live read-only publication, and an
/// operator's mount of that publication's read-only device once its bind is gone (a refused
/// unpublish keeps the record): a writable publish is refused beside either (the review's F2
/// and F1: each was handed out).
#[tokio::test]
async fn a_read_only_publication_exempts_only_what_it_binds_now() {
    let _ns = crate::NAMESPACE_COPY.read().await;
    if !require_root("a_read_only_publication_exempts_only_what_it_binds_now") {
        return;
    }
    let scratch = Scratch::new("g-ro-views");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let (v, staging) = super::staged(&agent, "rov", 64 * MIB, multi_block()).await;
    let mut node = agent.node().await;
    sh(&format!("mkfs.ext4 -q {}", v.device));
    let publish = |target: &std::path::Path, readonly| {
        publish_req(&v, &staging, target, multi_block(), readonly)
    };
    let reader = agent.work.join("pods/reader/dev");
    let writer = agent.work.join("pods/writer/dev");
    node.node_publish_volume(publish(&reader, true))
        .await
        .expect("the read-only publish");
    let inspect = agent.work.join("inspect");
    std::fs::create_dir_all(&inspect).expect("a mount point");

    sh(&format!("mount {} {}", v.device, inspect.display()));
    let mounted = Unmount(inspect.clone());
    let e = node
        .node_publish_volume(publish(&writer, false))
        .await
        .expect_err("a writable node beside root's read-write mount of the device");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    drop(mounted);

    sh(&format!(
        "mount -o ro,noload {} {}",
        reader.display(),
        inspect.display()
    ));
    let mounted = Unmount(inspect.clone());
    let e = node
        .node_unpublish_volume(unpublish_req(&v, &reader))
        .await
        .expect_err("unpublished with its read-only device mounted");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    let e = node
        .node_publish_volume(publish(&writer, false))
        .await
        .expect_err("a writable node beside the mounted read-only device");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    drop(mounted);
    node.node_unpublish_volume(unpublish_req(&v, &reader))
        .await
        .expect("the unpublish, the mount gone");
    node.node_publish_volume(publish(&writer, false))
        .await
        .expect("the writable publish, nothing else using the bytes");
    node.node_unpublish_volume(unpublish_req(&v, &writer))
        .await
        .expect("unpublish");
    node.node_unstage_volume(unstage_req(&v, &staging))
        .await
        .expect("unstage");
}

/// `recover --from-mounts` over a raw block volume whose only publication is read-only: a later
/// writable publish binds the volume's own node, not another read-only device (the review's F3:
/// the staging was rebuilt read-only, and every later publication silently read-only).
#[tokio::test]
async fn a_raw_block_staging_rebuilt_from_a_read_only_bind_stays_writable() {
    let _ns = crate::NAMESPACE_COPY.read().await;
    if !require_root("a_raw_block_staging_rebuilt_from_a_read_only_bind_stays_writable") {
        return;
    }
    let scratch = Scratch::new("g-ro-rebuilt");
    let mut agent = Agent::start(&scratch, AgentOpts::default()).await;
    let (v, staging) = super::staged(&agent, "rorb", 64 * MIB, multi_block()).await;
    let mut node = agent.node().await;
    let reader = agent.work.join("pods/reader/dev");
    node.node_publish_volume(publish_req(&v, &staging, &reader, multi_block(), true))
        .await
        .expect("the read-only publish");
    agent.kill();
    agent.recover("--from-mounts");
    agent.spawn().await;
    let mut node = agent.node().await;
    let writer = agent.work.join("pods/writer/dev");
    node.node_publish_volume(publish_req(&v, &staging, &writer, multi_block(), false))
        .await
        .unwrap_or_else(|e| panic!("the writable publish: {e:?}\n{}", agent.log_text()));
    let device = std::fs::metadata(&v.device).expect("the device").rdev();
    let bound = std::fs::metadata(&writer).expect("the target").rdev();
    assert_eq!(
        bound, device,
        "the writable publication binds another device"
    );
    for target in [&writer, &reader] {
        node.node_unpublish_volume(unpublish_req(&v, target))
            .await
            .expect("unpublish");
    }
    node.node_unstage_volume(unstage_req(&v, &staging))
        .await
        .expect("unstage");
}

/// A raw block volume attached read-only and published without `readonly` (a static PV marked
/// read-only, a pod that is not): the publication binds a read-only device of its own, never the
/// shared attachment's node, whose backing any workload holding it could swap for every other
/// publication (LOOP_CHANGE_FD needs only a read-only open: a sixty-eighth fresh review's F1).
#[tokio::test]
async fn a_read_only_attachment_is_never_bound_raw_to_a_workload() {
    let _ns = crate::NAMESPACE_COPY.read().await;
    if !require_root("a_read_only_attachment_is_never_bound_raw_to_a_workload") {
        return;
    }
    let scratch = Scratch::new("g-ro-attach");
    let mut agent = Agent::start(&scratch, AgentOpts::default()).await;
    let id = create_volume(&agent, "roat", 64 * MIB, &[]).await;
    let node_id = node_id(&agent).await;
    let r = agent
        .controller()
        .await
        .controller_publish_volume(csi::ControllerPublishVolumeRequest {
            volume_id: id.clone(),
            node_id,
            volume_capability: Some(multi_block()),
            readonly: true,
            ..Default::default()
        })
        .await
        .expect("a read-only attach")
        .into_inner();
    let v = Vol {
        id,
        device: r.publish_context["devicePath"].clone(),
    };
    let staging = agent.work.join("staging/roat");
    let mut node = agent.node().await;
    node.node_stage_volume(stage_req(&v, &staging, multi_block()))
        .await
        .expect("stage");
    let target = agent.work.join("pods/writer/dev");
    node.node_publish_volume(publish_req(&v, &staging, &target, multi_block(), false))
        .await
        .expect("publish");
    let device = std::fs::metadata(&v.device).expect("the device").rdev();
    let bound = std::fs::metadata(&target).expect("the target").rdev();
    assert_ne!(
        bound, device,
        "the shared read-only attachment bound into a workload"
    );
    let written = std::fs::OpenOptions::new()
        .write(true)
        .open(&target)
        .and_then(|mut f| std::io::Write::write_all(&mut f, b"written"));
    assert!(
        written.is_err(),
        "the publication of a read-only attachment is writable"
    );
    // Root's bind of the shared node, rebuilt by `recover --from-mounts`: never completed as a
    // publication (a sixty-ninth fresh review's F1: it was, read-write).
    let shared = agent.work.join("pods/shared/dev");
    sh(&format!(
        "mkdir -p {2} && touch {0} && mount --bind {1} {0}",
        shared.display(),
        v.device,
        shared.parent().expect("a parent").display()
    ));
    let bound = Unmount(shared.clone());
    agent.kill();
    agent.recover("--from-mounts");
    agent.spawn().await;
    let log = agent.log_text();
    assert!(log.contains("is not what the publish would bind"), "{log}");
    let mut node = agent.node().await;
    let e = node
        .node_publish_volume(publish_req(&v, &staging, &shared, multi_block(), false))
        .await
        .expect_err("the shared node's bind taken for a publication");
    assert_eq!(e.code(), Code::AlreadyExists, "{e:?}");
    drop(bound);
    for t in [&target, &shared] {
        node.node_unpublish_volume(unpublish_req(&v, t))
            .await
            .expect("unpublish");
    }
    node.node_unstage_volume(unstage_req(&v, &staging))
        .await
        .expect("unstage");
}
