//! A device replaced under records `recover --from-mounts` rebuilt (a forty-eighth fresh
//! review's F1 and F2): detached outside the agent, another disk attached at its numbers. A
//! rebuilt record proves a loop device by numbers and attachment, never by numbers alone, and
//! never takes down what the records give another volume.

use ebs_tests::csi_req::*;
use ebs_tests::*;
use tonic::Code;

use super::owners::{SIZE, handle_of, rwx_block};
use super::rebuild::kubelet_block_layout;

/// `dev` now shows the file `other` (written with `mark`): the disk that was there detached,
/// another attached at its numbers.
fn replace(dev: &std::path::Path, other: &std::path::Path, mark: &str) {
    sh(&format!(
        "truncate -s {SIZE} {o} && printf {mark} | dd of={o} conv=notrunc status=none && \
         losetup -d {d} && losetup {d} {o}",
        o = other.display(),
        d = dev.display()
    ));
}

/// F2: a raw block handle rebuilt (known by numbers then, as a disk with no identity is), its
/// disk detached and another attached at its numbers: the next publish gave the pod the other
/// disk's bytes.
#[tokio::test]
async fn a_rebuilt_handle_never_publishes_a_disk_attached_at_its_numbers_since() {
    // Detaches and attaches a loop device at a number of its choosing: alone.
    let _ns = crate::NAMESPACE_COPY.write().await;
    if !require_root("a_rebuilt_handle_never_publishes_a_disk_attached_at_its_numbers_since") {
        return;
    }
    let scratch = Scratch::new("node-local-replaced");
    let mut agent = Agent::start(&scratch, AgentOpts::default()).await;
    let disk = crate::Disk::new(&scratch, "f", SIZE as u64);
    let h = handle_of(&disk.vol());
    let (staging, target) = kubelet_block_layout(&agent, &h);
    let mut node = agent.node().await;
    node.node_stage_volume(stage_req(&h, &staging, rwx_block()))
        .await
        .expect("stage");
    node.node_publish_volume(publish_req(&h, &staging, &target, rwx_block(), false))
        .await
        .expect("publish");
    drop(node);
    agent.terminate().await;
    agent.recover("--from-mounts");
    agent.spawn().await;
    let mut node = agent.node().await;
    node.node_unpublish_volume(unpublish_req(&h, &target))
        .await
        .expect("unpublish");
    replace(&disk.dev, &scratch.join("g.img"), "G-OTHER-DISK");
    let second = target.with_file_name("pod-2");
    let e = node
        .node_publish_volume(publish_req(&h, &staging, &second, rwx_block(), false))
        .await
        .expect_err("published another disk attached at the handle's numbers");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert_eq!(mounts_below(&agent.work), Vec::<std::path::PathBuf>::new());
    let _ = node.node_unstage_volume(unstage_req(&h, &staging)).await;
}

/// F1: a volume's raw block staging rebuilt (no staging path: any unstage of it is its
/// unstage), its device detached and another disk attached at its numbers, staged and published
/// under a handle: the volume's unstage at the handle's publication took that bind down.
#[tokio::test]
async fn a_rebuilt_staging_never_takes_down_another_ids_bind_of_its_numbers() {
    let _ns = crate::NAMESPACE_COPY.write().await;
    if !require_root("a_rebuilt_staging_never_takes_down_another_ids_bind_of_its_numbers") {
        return;
    }
    let scratch = Scratch::new("node-local-replaced-x");
    let mut agent = Agent::start(&scratch, AgentOpts::default()).await;
    let x = create_attached(&agent, "x", SIZE).await;
    let (x_staging, x_target) = (agent.work.join("x/staging"), agent.work.join("x/pod"));
    let mut node = agent.node().await;
    node.node_stage_volume(stage_req(&x, &x_staging, rwx_block()))
        .await
        .expect("x's stage");
    node.node_publish_volume(publish_req(&x, &x_staging, &x_target, rwx_block(), false))
        .await
        .expect("x's publish");
    drop(node);
    agent.terminate().await;
    agent.recover("--from-mounts");
    agent.spawn().await;
    let mut node = agent.node().await;
    node.node_unpublish_volume(unpublish_req(&x, &x_target))
        .await
        .expect("x's unpublish");
    let dev = std::path::PathBuf::from(&x.device);
    replace(&dev, &scratch.join("y.img"), "Y-DATA");
    let _detach = super::owners::DetachOnDrop(x.device.clone());
    let y = handle_of(&Vol {
        id: String::new(),
        device: x.device.clone(),
    });
    let (y_staging, y_target) = (agent.work.join("y/staging"), agent.work.join("y/pod"));
    let _unbind = Unmount(y_target.clone());
    node.node_stage_volume(stage_req(&y, &y_staging, rwx_block()))
        .await
        .expect("y's stage");
    node.node_publish_volume(publish_req(&y, &y_staging, &y_target, rwx_block(), false))
        .await
        .expect("y's publish");
    let _ = node.node_unstage_volume(unstage_req(&x, &y_target)).await;
    assert_eq!(
        mounts_below(&agent.work),
        vec![y_target.clone()],
        "x's unstage took y's bind down"
    );
    assert!(
        std::fs::read(&y_target).is_ok_and(|b| b.starts_with(b"Y-DATA")),
        "y's pod no longer reads its disk"
    );
    node.node_unpublish_volume(unpublish_req(&y, &y_target))
        .await
        .expect("y's unpublish");
    node.node_unstage_volume(unstage_req(&y, &y_staging))
        .await
        .expect("y's unstage");
}
