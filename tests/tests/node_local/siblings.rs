//! Two loop devices over one file show the same bytes: a handle naming one while the other is
//! mounted read-write (by an operator, by another agent's handle) was staged, e2fsck ran on a
//! filesystem mounted elsewhere and the same ext4 was mounted twice read-write, losing the
//! writes of one side (a twenty-fourth fresh review's F1). The same holds for a loop volume the
//! controller attached, whose file an operator loops and mounts a second time: its stage goes
//! through the core's exclusive claim, which now asks the siblings too.

use csi::volume_capability::access_mode::Mode;
use ebs_tests::csi_req::*;
use ebs_tests::*;
use tonic::Code;

use super::owners::{DetachOnDrop, SIZE, rwx_block, rwx_mount};

/// A file with an ext4 on it, looped twice; the first loop mounted at `mounted`.
fn twice_looped(scratch: &Scratch) -> (DetachOnDrop, DetachOnDrop, Unmount) {
    let img = scratch.join("plain.img");
    sh(&format!("truncate -s {SIZE} {}", img.display()));
    sh(&format!("mkfs.ext4 -q {}", img.display()));
    let first = DetachOnDrop(super::losetup("", img.display()));
    let second = DetachOnDrop(super::losetup("", img.display()));
    let at = scratch.join("operators");
    std::fs::create_dir_all(&at).expect("mount point");
    sh(&format!("mount {} {}", first.0, at.display()));
    (first, second, Unmount(at))
}

#[tokio::test]
async fn a_handle_on_a_loop_device_whose_sibling_is_mounted_is_refused() {
    let _shared = crate::NAMESPACE_COPY.read().await;
    if !require_root("a_handle_on_a_loop_device_whose_sibling_is_mounted_is_refused") {
        return;
    }
    let scratch = Scratch::new("node-local-siblings");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let (first, second, mounted) = twice_looped(&scratch);
    let h = Vol {
        id: format!("local-ebs://{}", second.0.trim_start_matches('/')),
        device: second.0.clone(),
    };
    for (cap, what) in [(rwx_mount(), "mount"), (rwx_block(), "block")] {
        let staging = agent.work.join(format!("h-{what}/staging"));
        let e = agent
            .node()
            .await
            .node_stage_volume(stage_req(&h, &staging, cap))
            .await
            .expect_err("a handle took a loop device whose sibling is mounted read-write");
        assert_eq!(e.code(), Code::FailedPrecondition, "{what}: {e:?}");
        assert!(!super::is_mounted(&staging), "{what}: staged anyway");
    }
    drop(mounted);
    let (a, b) = (first.0.clone(), second.0.clone());
    drop((first, second));
    wait_unbound(&a);
    wait_unbound(&b);
}

#[tokio::test]
async fn a_loop_volume_whose_file_is_looped_and_mounted_elsewhere_is_not_staged() {
    let _shared = crate::NAMESPACE_COPY.read().await;
    if !require_root("a_loop_volume_whose_file_is_looped_and_mounted_elsewhere_is_not_staged") {
        return;
    }
    let scratch = Scratch::new("loop-volume-siblings");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let x = create_attached(&agent, "x", SIZE).await;
    let file = agent.state_dir.join(format!("volumes/{}.img", x.id));
    sh(&format!("mkfs.ext4 -q {}", file.display()));
    let operators = DetachOnDrop(super::losetup("", file.display()));
    let at = scratch.join("operators");
    std::fs::create_dir_all(&at).expect("mount point");
    sh(&format!("mount {} {}", operators.0, at.display()));
    let mounted = Unmount(at);
    let staging = agent.work.join("x/staging");
    let e = agent
        .node()
        .await
        .node_stage_volume(stage_req(
            &x,
            &staging,
            mount_cap("ext4", Mode::SingleNodeWriter),
        ))
        .await
        .expect_err("a volume was staged while its file was mounted through another loop device");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("same file"), "{e:?}");
    assert!(!super::is_mounted(&staging), "staged anyway");
    drop(mounted);
    let name = operators.0.clone();
    drop(operators);
    wait_unbound(&name);
}
