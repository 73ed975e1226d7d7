//! Two loop devices over one file show the same bytes: a handle naming one while the other is
//! mounted read-write (by an operator, by another agent's handle) was staged, e2fsck ran on a
//! filesystem mounted elsewhere and the same ext4 was mounted twice read-write, losing the
//! writes of one side (a twenty-fourth fresh review's F1). The same holds for a loop volume the
//! controller attached whose bytes an operator shows again, through a second loop device over its
//! file or one laid over its device, and mounts or binds: every door that takes or hands out the
//! device asks the other views of its bytes (`node::views`, a twenty-fifth review's F1 to F4).

use csi::volume_capability::access_mode::Mode;
use ebs_tests::csi_req::*;
use ebs_tests::*;
use tonic::Code;

use super::owners::{DetachOnDrop, SIZE, rwx_block, rwx_mount};
use ebs_tests::csi_req::{block_cap, mount_cap};

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

/// How an operator shows a loop volume's bytes a second time, and uses them.
#[derive(Clone, Copy, Debug)]
enum Elsewhere {
    /// A second loop device over the volume's file, mounted.
    SiblingMounted,
    /// A loop device laid over the volume's own device, mounted.
    OverMounted,
    /// A second loop device over the file, its node bound onto a file (a raw publication).
    SiblingBound,
}

/// What an operator did, undone on drop (unmount, detach).
struct Used {
    _mount: Option<Unmount>,
    device: Option<DetachOnDrop>,
}

impl Drop for Used {
    fn drop(&mut self) {
        self._mount.take();
        if let Some(d) = self.device.take() {
            let name = d.0.clone();
            drop(d);
            wait_unbound(&name);
        }
    }
}

fn use_elsewhere(scratch: &Scratch, how: Elsewhere, file: &std::path::Path, dev: &str) -> Used {
    let view = DetachOnDrop(match how {
        Elsewhere::OverMounted => super::losetup("", dev),
        _ => super::losetup("", file.display()),
    });
    let at = scratch.join(&format!("operators-{how:?}"));
    let mount = match how {
        Elsewhere::SiblingBound => {
            std::fs::write(&at, "").expect("bind target");
            sh(&format!("mount --bind {} {}", view.0, at.display()));
            Unmount(at)
        }
        _ => {
            std::fs::create_dir_all(&at).expect("mount point");
            sh(&format!("mount {} {}", view.0, at.display()));
            Unmount(at)
        }
    };
    Used {
        _mount: Some(mount),
        device: Some(view),
    }
}

/// A loop volume whose bytes another loop device shows, used elsewhere, is neither staged (as a
/// filesystem or raw) nor published raw (a twenty-fifth fresh review's F1, F2 and F4).
#[tokio::test]
async fn a_loop_volume_whose_bytes_are_used_through_another_device_is_not_handed_out() {
    let _shared = crate::NAMESPACE_COPY.read().await;
    if !require_root("a_loop_volume_whose_bytes_are_used_through_another_device_is_not_handed_out")
    {
        return;
    }
    let scratch = Scratch::new("loop-volume-views");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let fs = mount_cap("ext4", Mode::SingleNodeWriter);
    let raw = block_cap(Mode::SingleNodeWriter);
    for (n, how) in [
        Elsewhere::SiblingMounted,
        Elsewhere::OverMounted,
        Elsewhere::SiblingBound,
    ]
    .into_iter()
    .enumerate()
    {
        let x = create_attached(&agent, &format!("x{n}"), SIZE).await;
        let file = agent.state_dir.join(format!("volumes/{}.img", x.id));
        sh(&format!("mkfs.ext4 -q {}", file.display()));
        let mut node = agent.node().await;
        // Staged raw before anyone else used the bytes: the raw publish after must refuse.
        let raw_staging = agent.work.join(format!("x{n}/raw-staging"));
        let used = {
            let staged = stage_req(&x, &raw_staging, raw.clone());
            node.node_stage_volume(staged).await.expect("raw stage");
            use_elsewhere(&scratch, how, &file, &x.device)
        };
        let target = agent.work.join(format!("x{n}/target"));
        let e = node
            .node_publish_volume(publish_req(&x, &raw_staging, &target, raw.clone(), false))
            .await
            .expect_err("published raw while its bytes are used elsewhere");
        assert_eq!(e.code(), Code::FailedPrecondition, "{how:?}: {e:?}");
        node.node_unstage_volume(unstage_req(&x, &raw_staging))
            .await
            .expect("unstage");
        for (cap, what) in [(fs.clone(), "filesystem"), (raw.clone(), "raw")] {
            let staging = agent.work.join(format!("x{n}/{what}"));
            let e = node
                .node_stage_volume(stage_req(&x, &staging, cap))
                .await
                .expect_err("staged while its bytes are used elsewhere");
            assert_eq!(e.code(), Code::FailedPrecondition, "{how:?} {what}: {e:?}");
            assert!(
                e.message().contains("in use through"),
                "{how:?} {what}: {e:?}"
            );
            assert!(
                !super::is_mounted(&staging),
                "{how:?} {what}: staged anyway"
            );
        }
        drop(used);
    }
}
