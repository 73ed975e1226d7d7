//! The scan's private copies of a mount namespace (`unveil`: a bind in a namespace the host's
//! user namespace owns, its mount point covered) hold every mount of that namespace while they
//! live, so a filesystem unmounted meanwhile stays claimed, and an unstage that met one was
//! refused "still mounted elsewhere" (a fifty-third fresh review's F5; in CI, rehearsal 71's
//! `confinement::two_volumes_racing_for_one_path_never_stack`). The agent's own copies are no
//! one's use: the unstage asks again once they are gone.

use ebs_tests::csi_req::*;
use ebs_tests::*;

use csi::volume_capability::access_mode::Mode;

use super::Disk;

/// Unmounts a tree of mounts a test made (`umount -R`), on drop.
struct Tree(std::path::PathBuf);

impl Drop for Tree {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-R")
            .arg(&self.0)
            .status();
    }
}

/// Ten binds of a node of a spare disk made with mknod outside /dev (no name tells it) in the
/// host's namespace, each under thirty tmpfs covers: every scan copies the namespace and takes
/// the covers off there to tell them.
fn covered_binds(scratch: &Scratch, device: &std::path::Path) -> Tree {
    let top = scratch.join("covers");
    std::fs::create_dir_all(&top).expect("covers");
    sh(&format!("mount -t tmpfs covers {}", top.display()));
    let tree = Tree(top.clone());
    let node = top.join("made");
    let rdev = std::os::unix::fs::MetadataExt::rdev(&std::fs::metadata(device).expect("spare"));
    let (block, mode) = (
        nix::sys::stat::SFlag::S_IFBLK,
        nix::sys::stat::Mode::S_IRUSR,
    );
    nix::sys::stat::mknod(&node, block, mode, rdev).expect("mknod");
    for i in 0..10 {
        let dir = top.join(format!("c{i}"));
        std::fs::create_dir(&dir).expect("a cover's directory");
        std::fs::write(dir.join("node"), b"").expect("a bind's file");
        let bind = format!("mount --bind {} {}/node", node.display(), dir.display());
        sh(&bind);
        for _ in 0..30 {
            sh(&format!("mount -t tmpfs cover {}", dir.display()));
        }
    }
    tree
}

#[tokio::test]
async fn an_unstage_beside_the_scans_own_namespace_copies_is_never_refused() {
    let _alone = crate::NAMESPACE_COPY.write().await;
    if !require_root("an_unstage_beside_the_scans_own_namespace_copies_is_never_refused") {
        return;
    }
    let scratch = Scratch::new("node-local-own-copies");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let spare = Disk::new(&scratch, "spare", 8 << 20);
    let _covers = covered_binds(&scratch, &spare.dev);
    let cap = || mount_cap("ext4", Mode::SingleNodeWriter);
    let mut volumes = Vec::new();
    for i in 0..12 {
        let vol = create_attached(&agent, &format!("v{i}"), 32 << 20).await;
        volumes.push((vol, agent.work.join(format!("v{i}/staging"))));
    }
    let (first, second) = volumes.split_at(6);
    for round in 0..3 {
        // Half staged; then the other half staged (each scan copies the namespace, the first
        // half's stagings with it) while the first half is unstaged.
        let (down, up) = if round % 2 == 0 {
            (first, second)
        } else {
            (second, first)
        };
        for (vol, staging) in down {
            let mut node = agent.node().await;
            if round == 0 {
                node.node_stage_volume(stage_req(vol, staging, cap()))
                    .await
                    .expect("stage");
            }
        }
        let mut stages = Vec::new();
        for (vol, staging) in up {
            let (mut node, req) = (agent.node().await, stage_req(vol, staging, cap()));
            stages.push(tokio::spawn(
                async move { node.node_stage_volume(req).await },
            ));
        }
        // The unstages spread over the stages' scans, so that some meet a copy.
        let mut unstages = Vec::new();
        for (vol, staging) in down {
            tokio::time::sleep(std::time::Duration::from_millis(150)).await;
            let (mut node, req) = (agent.node().await, unstage_req(vol, staging));
            unstages.push(tokio::spawn(
                async move { node.node_unstage_volume(req).await },
            ));
        }
        let mut unstaged = Vec::new();
        for task in unstages {
            unstaged.push(task.await.expect("the unstage's task").map(drop));
        }
        let mut staged = Vec::new();
        for task in stages {
            staged.push(task.await.expect("the stage's task").map(drop));
        }
        for (r, (vol, _)) in unstaged.into_iter().zip(down) {
            r.unwrap_or_else(|e| panic!("round {round}: the unstage of {}: {e:?}", vol.id));
        }
        for (r, (vol, _)) in staged.into_iter().zip(up) {
            r.unwrap_or_else(|e| panic!("round {round}: the stage of {}: {e:?}", vol.id));
        }
    }
    for (vol, staging) in volumes.iter() {
        let _ = agent
            .node()
            .await
            .node_unstage_volume(unstage_req(vol, staging))
            .await;
    }
}
