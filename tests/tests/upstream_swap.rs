//! Switching a node that runs pods from the upstream node plugin to the agent: the volumes the
//! upstream plugin staged and published are mounted at kubelet's paths, and the agent's journal
//! knows nothing of them. kubelet's NodeUnpublishVolume and NodeUnstageVolume must still take
//! them down, and a NodeStageVolume (kubelet repeats it after a plugin restart) must adopt the
//! staged filesystem as it is: never format it, never stack a second mount on it.
//!
//! The upstream plugin's work is done here by hand as it does it: mkfs, a mount at kubelet's
//! staging path for the driver, a bind into the pod's directory.

use std::path::{Path, PathBuf};

use ebs_tests::csi_req::*;
use ebs_tests::*;

use csi::volume_capability::access_mode::Mode;

/// kubelet's paths below `root` (a kubelet root directory), for one volume and one pod.
struct KubeletPaths {
    staging: PathBuf,
    target: PathBuf,
}

impl KubeletPaths {
    fn new(root: &Path, pv: &str, pod: &str) -> KubeletPaths {
        KubeletPaths {
            // kubelet 1.24+: sha256 of the volume handle; any hex name stands for it here.
            staging: root.join(format!(
                "plugins/kubernetes.io/csi/ebs.csi.aws.com/{:064x}/globalmount",
                pv.len()
            )),
            target: root.join(format!("pods/{pod}/volumes/kubernetes.io~csi/{pv}/mount")),
        }
    }
}

/// What the upstream plugin did: format, stage, publish, and the pod wrote its data.
fn upstream_staged(vol: &Vol, p: &KubeletPaths) {
    sh(&format!("mkfs.ext4 -q -F {}", vol.device));
    std::fs::create_dir_all(&p.staging).unwrap();
    std::fs::create_dir_all(&p.target).unwrap();
    sh(&format!(
        "mount -t ext4 {} {}",
        vol.device,
        p.staging.display()
    ));
    sh(&format!(
        "mount --bind {} {}",
        p.staging.display(),
        p.target.display()
    ));
    std::fs::write(
        p.target.join("data.txt"),
        b"written under the upstream plugin",
    )
    .unwrap();
}

fn cap() -> csi::VolumeCapability {
    mount_cap("ext4", Mode::SingleNodeWriter)
}

/// No call but kubelet's teardown: the pod goes, then the volume.
#[tokio::test]
async fn kubelets_teardown_of_an_upstream_staged_volume_works() {
    if !require_root("kubelets_teardown_of_an_upstream_staged_volume_works") {
        return;
    }
    let scratch = Scratch::new("upstream-swap-teardown");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let vol = create_attached(&agent, "swapped", 64 << 20).await;
    let p = KubeletPaths::new(&agent.work.join("kubelet"), "pv-a", "pod-1");
    upstream_staged(&vol, &p);
    let uuid = fs_uuid(&vol.device);

    let mut node = agent.node().await;
    node.node_unpublish_volume(unpublish_req(&vol, &p.target))
        .await
        .expect("unpublish of the upstream plugin's publication");
    assert!(!mounts_below(&agent.work).contains(&p.target));
    node.node_unstage_volume(unstage_req(&vol, &p.staging))
        .await
        .expect("unstage of the upstream plugin's staging mount");
    assert!(mounts_below(&agent.work).is_empty(), "nothing left mounted");

    // The volume is intact: staged again through the agent, same filesystem, same data.
    let staging = agent.work.join("again/staging");
    node.node_stage_volume(stage_req(&vol, &staging, cap()))
        .await
        .expect("stage");
    assert_eq!(fs_uuid(&vol.device), uuid, "never formatted again");
    assert_eq!(
        std::fs::read(staging.join("data.txt")).unwrap(),
        b"written under the upstream plugin"
    );
    node.node_unstage_volume(unstage_req(&vol, &staging))
        .await
        .expect("unstage");
}

/// kubelet stages again after the plugin restarted, a new pod publishes, then everything goes.
#[tokio::test]
async fn an_upstream_staged_volume_is_adopted_by_a_stage() {
    if !require_root("an_upstream_staged_volume_is_adopted_by_a_stage") {
        return;
    }
    let scratch = Scratch::new("upstream-swap-adopt");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let vol = create_attached(&agent, "adopted", 64 << 20).await;
    let root = agent.work.join("kubelet");
    let p = KubeletPaths::new(&root, "pv-b", "pod-1");
    upstream_staged(&vol, &p);
    let uuid = fs_uuid(&vol.device);
    let mounts_before = mounts_below(&root).len();

    let mut node = agent.node().await;
    node.node_stage_volume(stage_req(&vol, &p.staging, cap()))
        .await
        .expect("a stage adopts the upstream plugin's staging mount");
    assert_eq!(
        mounts_below(&root).len(),
        mounts_before,
        "nothing stacked on it"
    );
    assert_eq!(fs_uuid(&vol.device), uuid, "not formatted");
    let second = KubeletPaths::new(&root, "pv-b", "pod-2").target;
    node.node_publish_volume(publish_req(&vol, &p.staging, &second, cap(), false))
        .await
        .expect("a new pod's publish");
    assert_eq!(
        std::fs::read(second.join("data.txt")).unwrap(),
        b"written under the upstream plugin"
    );
    for t in [&p.target, &second] {
        node.node_unpublish_volume(unpublish_req(&vol, t))
            .await
            .expect("unpublish");
    }
    node.node_unstage_volume(unstage_req(&vol, &p.staging))
        .await
        .expect("unstage");
    assert!(mounts_below(&agent.work).is_empty(), "nothing left mounted");
    // No record holds the volume to kubelet's old path: a stage elsewhere is not ALREADY_EXISTS.
    let elsewhere = agent.work.join("elsewhere/staging");
    node.node_stage_volume(stage_req(&vol, &elsewhere, cap()))
        .await
        .expect("stage at another path");
    node.node_unstage_volume(unstage_req(&vol, &elsewhere))
        .await
        .expect("unstage");
}
