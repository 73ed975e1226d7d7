//! Volume files in a btrfs subvolume. A subvolume's files carry a device number of their own
//! that the mount table never shows, so the filesystem a loop device's backing file lies on is
//! asked of the file itself (`fstatfs`), not looked up by number: a loop volume there stages, and
//! a node-local handle over a file there is a handle, not "a filesystem this namespace does not
//! show".

use ebs_tests::csi_req::*;
use ebs_tests::*;

use csi::volume_capability::access_mode::Mode;
use tonic::Code;

use super::owners::{DetachOnDrop, SIZE, rwx_mount};

/// A btrfs filesystem on a loop device, mounted below the scratch directory, with a subvolume;
/// unmounted and detached on drop.
struct Btrfs {
    mount: std::path::PathBuf,
    _device: DetachOnDrop,
}

impl Btrfs {
    fn new(scratch: &Scratch) -> Btrfs {
        let img = scratch.join("btrfs.img");
        sh(&format!("truncate -s 512M {}", img.display()));
        let device = DetachOnDrop(super::losetup("", img.display()));
        sh(&format!("mkfs.btrfs -q {}", device.0));
        let mount = scratch.join("b");
        std::fs::create_dir_all(&mount).expect("mount point");
        sh(&format!("mount {} {}", device.0, mount.display()));
        sh(&format!(
            "btrfs -q subvolume create {}",
            mount.join("sv").display()
        ));
        Btrfs {
            mount,
            _device: device,
        }
    }
}

impl Drop for Btrfs {
    /// The volume's own loop device (still attached: the agent keeps attachments over a
    /// restart) holds the filesystem busy here; the scratch directory's clean-up detaches it
    /// and unmounts lazily, so a busy umount is not an error worth printing.
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg(&self.mount)
            .stderr(std::process::Stdio::null())
            .status();
    }
}

#[tokio::test]
async fn volume_files_in_a_btrfs_subvolume_are_told_apart() {
    let _shared = crate::NAMESPACE_COPY.read().await;
    if !require_root("volume_files_in_a_btrfs_subvolume_are_told_apart") {
        return;
    }
    let scratch = Scratch::new("node-local-btrfs");
    let fs = Btrfs::new(&scratch);
    let sv = fs.mount.join("sv");
    {
        let mut agent = Agent::unstarted(&scratch, AgentOpts::default());
        agent.state_dir = sv.join("state");
        agent.spawn().await;
        let v = create_attached(&agent, "v", SIZE).await;
        let staging = agent.work.join("v/staging");
        let mut node = agent.node().await;
        node.node_stage_volume(stage_req(
            &v,
            &staging,
            mount_cap("ext4", Mode::SingleNodeWriter),
        ))
        .await
        .expect("a loop volume in a btrfs subvolume stages");
        // A handle over another file in the subvolume is nobody's volume: it stages.
        sh(&format!("truncate -s 64M {}", sv.join("h.img").display()));
        let laid = DetachOnDrop(super::losetup("", sv.join("h.img").display()));
        let h = Vol {
            id: format!("local-ebs://{}", laid.0.trim_start_matches('/')),
            device: laid.0.clone(),
        };
        let h_staging = agent.work.join("h/staging");
        node.node_stage_volume(stage_req(&h, &h_staging, rwx_mount()))
            .await
            .expect("a handle over a file in a btrfs subvolume");
        // A second loop device over the volume's own file there is still the volume's.
        let file = sv.join(format!("state/volumes/{}.img", v.id));
        let second = DetachOnDrop(super::losetup("", file.display()));
        let s = Vol {
            id: format!("local-ebs://{}", second.0.trim_start_matches('/')),
            device: second.0.clone(),
        };
        let e = node
            .node_stage_volume(stage_req(&s, &agent.work.join("s/staging"), rwx_mount()))
            .await
            .expect_err("a second loop device over the volume's file");
        assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
        node.node_unstage_volume(unstage_req(&h, &h_staging))
            .await
            .expect("unstage the handle");
        node.node_unstage_volume(unstage_req(&v, &staging))
            .await
            .expect("unstage the volume");
        drop(node);
        drop(agent);
        drop((second, laid));
    }
    drop(fs);
}

/// A btrfs made on volume X's raw device by X's workload, a file in it laid on a loop device:
/// X's bytes, though btrfs shows no device number of its own (a seventeenth fresh review's F1:
/// the walk down stopped at btrfs's anonymous number and a handle read X's data).
#[tokio::test]
async fn a_loop_device_over_a_file_in_a_btrfs_on_another_volume_is_refused() {
    let _shared = crate::NAMESPACE_COPY.read().await;
    if !require_root("a_loop_device_over_a_file_in_a_btrfs_on_another_volume_is_refused") {
        return;
    }
    let scratch = Scratch::new("node-local-btrfs-on-x");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let x = create_attached(&agent, "x", 256 << 20).await;
    let staging = agent.work.join("x/staging");
    let mut node = agent.node().await;
    node.node_stage_volume(stage_req(&x, &staging, block_cap(Mode::SingleNodeWriter)))
        .await
        .expect("stage x raw");
    sh(&format!("mkfs.btrfs -q -f {}", x.device));
    let m = scratch.join("m");
    std::fs::create_dir_all(&m).expect("mount point");
    sh(&format!("mount {} {}", x.device, m.display()));
    let mounted = Unmount(m.clone());
    sh(&format!("truncate -s 64M {}", m.join("f.img").display()));
    let laid = DetachOnDrop(super::losetup("", m.join("f.img").display()));
    let h = Vol {
        id: format!("local-ebs://{}", laid.0.trim_start_matches('/')),
        device: laid.0.clone(),
    };
    let e = node
        .node_stage_volume(stage_req(&h, &agent.work.join("h/staging"), rwx_mount()))
        .await
        .expect_err("a handle took a file in a btrfs on x's device");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains(&x.id), "{e:?}");
    let name = laid.0.clone();
    drop(laid);
    wait_unbound(&name);
    drop(mounted);
    node.node_unstage_volume(unstage_req(&x, &staging))
        .await
        .expect("unstage x");
}
