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

/// Stages the handle `h` as a filesystem and as a raw block device, each at a staging path of
/// its own: both are refused FAILED_PRECONDITION, and nothing is mounted.
pub(super) async fn both_stages_refused(agent: &Agent, h: &Vol, why: &str) {
    for (cap, what) in [(rwx_mount(), "mount"), (rwx_block(), "block")] {
        let staging = agent.work.join(format!("h-{what}/staging"));
        let e = agent
            .node()
            .await
            .node_stage_volume(stage_req(h, &staging, cap))
            .await
            .expect_err(&format!("{what}: {why}"));
        assert_eq!(e.code(), Code::FailedPrecondition, "{what}: {e:?}");
        assert!(!super::is_mounted(&staging), "{what}: staged anyway");
    }
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
    both_stages_refused(
        &agent,
        &h,
        "a handle took a loop device whose sibling is mounted read-write",
    )
    .await;
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
            // The views' refusal; for a node of the device bound, the raw-use one.
            assert!(
                e.message().contains("in use through") || e.message().contains("raw use"),
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

/// A partition table in the volume file's boot block whose first partition is the whole file:
/// a second loop device over the file, scanned for partitions, shows the volume's ext4 again as
/// its partition, and a loop device laid over that partition, mounted, or the partition's node
/// bound, uses the volume's bytes (a twenty-sixth fresh review's F1: the views stopped at whole
/// devices, and the same ext4 was mounted twice read-write).
#[tokio::test]
async fn a_partition_of_another_view_in_use_refuses_the_volume() {
    let _shared = crate::NAMESPACE_COPY.read().await;
    if !require_root("a_partition_of_another_view_in_use_refuses_the_volume") {
        return;
    }
    let scratch = Scratch::new("views-partitions");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    for (n, bound) in [false, true].into_iter().enumerate() {
        let x = create_attached(&agent, &format!("p{n}"), SIZE).await;
        let file = agent.state_dir.join(format!("volumes/{}.img", x.id));
        sh(&format!("mkfs.ext4 -q {}", file.display()));
        // One primary partition, type 0x83, from sector 0 over the whole file, in the boot
        // block ext4 leaves alone.
        let sectors = u32::try_from(SIZE / 512).expect("sectors");
        let mut table = vec![0u8, 0, 0, 0, 0x83, 0, 0, 0];
        table.extend_from_slice(&0u32.to_le_bytes());
        table.extend_from_slice(&sectors.to_le_bytes());
        table.resize(64, 0);
        table.extend_from_slice(&[0x55, 0xaa]);
        {
            use std::io::{Seek, SeekFrom, Write};
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .open(&file)
                .expect("volume file");
            f.seek(SeekFrom::Start(446)).expect("seek");
            f.write_all(&table).expect("partition table");
        }
        let scanned = DetachOnDrop(super::losetup("-P", file.display()));
        let part = format!("{}p1", scanned.0);
        let _ = std::process::Command::new("partx")
            .args(["-a", &scanned.0])
            .status();
        for _ in 0..200 {
            if std::path::Path::new(&part).exists() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(std::path::Path::new(&part).exists(), "no {part}");
        let at = scratch.join(&format!("part-use-{n}"));
        let (over, used) = if bound {
            std::fs::write(&at, "").expect("bind target");
            sh(&format!("mount --bind {part} {}", at.display()));
            (None, Unmount(at))
        } else {
            let over = DetachOnDrop(super::losetup("", &part));
            std::fs::create_dir_all(&at).expect("mount point");
            sh(&format!("mount {} {}", over.0, at.display()));
            (Some(over), Unmount(at))
        };
        let cap = if bound {
            block_cap(Mode::SingleNodeWriter)
        } else {
            mount_cap("ext4", Mode::SingleNodeWriter)
        };
        let staging = agent.work.join(format!("p{n}/staging"));
        let e = agent
            .node()
            .await
            .node_stage_volume(stage_req(&x, &staging, cap))
            .await
            .expect_err("staged while a partition of another view of its bytes is in use");
        assert_eq!(e.code(), Code::FailedPrecondition, "bound={bound}: {e:?}");
        assert!(
            e.message().contains("in use through"),
            "bound={bound}: {e:?}"
        );
        assert!(!super::is_mounted(&staging), "bound={bound}: staged anyway");
        drop(used);
        if let Some(over) = over {
            let name = over.0.clone();
            drop(over);
            wait_unbound(&name);
        }
        let name = scanned.0.clone();
        drop(scanned);
        wait_unbound(&name);
    }
}

/// A loop device over the volume's file seen through overlayfs reports the overlay's device
/// number, so no inode matches it: it cannot be told apart from the volume's file, and mounted
/// elsewhere it refuses the stage (a twenty-seventh fresh review's F1: the same ext4 mounted
/// twice read-write, its bitmaps then wrong).
#[tokio::test]
async fn a_loop_device_over_the_volumes_file_through_an_overlay_refuses_the_stage() {
    // Alone: a mounted loop device over an overlay's file may show any file's bytes, so every
    // other test's stage of a loop device would be refused while it is mounted.
    let _alone = crate::NAMESPACE_COPY.write().await;
    if !require_root("a_loop_device_over_the_volumes_file_through_an_overlay_refuses_the_stage") {
        return;
    }
    let scratch = Scratch::new("views-overlay");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let x = create_attached(&agent, "o", SIZE).await;
    let file = agent.state_dir.join(format!("volumes/{}.img", x.id));
    sh(&format!("mkfs.ext4 -q {}", file.display()));
    let overlay = super::stacked::OverlayView::new(&scratch, &agent.state_dir.join("volumes"));
    let seen = overlay.merged.join(format!("{}.img", x.id));
    let view = DetachOnDrop(super::losetup("", seen.display()));
    let at = scratch.join("through-overlay");
    std::fs::create_dir_all(&at).expect("mount point");
    sh(&format!("mount {} {}", view.0, at.display()));
    let used = Unmount(at);
    let staging = agent.work.join("o/staging");
    let e = agent
        .node()
        .await
        .node_stage_volume(stage_req(
            &x,
            &staging,
            mount_cap("ext4", Mode::SingleNodeWriter),
        ))
        .await
        .expect_err("staged while a loop device through an overlay shows its file mounted");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("in use through"), "{e:?}");
    assert!(!super::is_mounted(&staging), "staged anyway");
    drop(used);
    let name = view.0.clone();
    drop(view);
    wait_unbound(&name);
    drop(overlay);
}

/// An operator's loop device over a detached volume's file, mounted read-write: the controller
/// does not adopt it as the volume's attachment, and no raw block stage or publish hands it out
/// (a thirtieth fresh review's F1: ControllerPublish adopted it, and the workload's first write
/// wiped the mounted filesystem's superblock).
#[tokio::test]
async fn an_operators_mounted_device_over_the_file_is_neither_adopted_nor_handed_out_raw() {
    let _shared = crate::NAMESPACE_COPY.read().await;
    if !require_root(
        "an_operators_mounted_device_over_the_file_is_neither_adopted_nor_handed_out_raw",
    ) {
        return;
    }
    let scratch = Scratch::new("adopt-mounted");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let id = create_volume(&agent, "m", SIZE, &[]).await;
    let file = agent.state_dir.join(format!("volumes/{id}.img"));
    sh(&format!("mkfs.ext4 -q {}", file.display()));
    let operators = DetachOnDrop(super::losetup("", file.display()));
    let at = scratch.join("operators");
    std::fs::create_dir_all(&at).expect("mount point");
    sh(&format!("mount {} {}", operators.0, at.display()));
    let mounted = Unmount(at);
    let e = agent
        .controller()
        .await
        .controller_publish_volume(csi::ControllerPublishVolumeRequest {
            volume_id: id.clone(),
            node_id: node_id(&agent).await,
            volume_capability: Some(block_cap(Mode::SingleNodeWriter)),
            ..Default::default()
        })
        .await
        .expect_err("the controller adopted a device mounted elsewhere");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    // Named directly, as a CO that kept an old devicePath would.
    let v = Vol {
        id: id.clone(),
        device: operators.0.clone(),
    };
    let staging = agent.work.join("m/staging");
    let e = agent
        .node()
        .await
        .node_stage_volume(stage_req(&v, &staging, block_cap(Mode::SingleNodeWriter)))
        .await
        .expect_err("a device mounted elsewhere was staged raw");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    drop(mounted);
    let name = operators.0.clone();
    drop(operators);
    wait_unbound(&name);
}
