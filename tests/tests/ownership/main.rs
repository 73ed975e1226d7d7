//! Issue 24: the agent touches only what is provably the volume's. Each test reproduces one way
//! the promise broke (see the numbered problems) on real loop devices.

mod devices;
mod failures;
mod foreign;
mod intent;

use std::path::{Path, PathBuf};

use ebs_tests::csi_req::*;
use ebs_tests::*;

use csi::volume_capability::access_mode::Mode;

pub const MIB: i64 = 1 << 20;

/// Whether anything is mounted exactly at `path`.
pub fn is_mounted(path: &Path) -> bool {
    mounts_below(path).iter().any(|m| m == path)
}

pub fn fs_cap() -> csi::VolumeCapability {
    mount_cap("ext4", Mode::SingleNodeWriter)
}

/// A 64 MiB ext4 volume, staged and published, with a file written through the target.
pub async fn published(agent: &Agent, name: &str) -> (Vol, PathBuf, PathBuf) {
    let vol = create_attached(agent, name, 64 * MIB).await;
    let staging = agent.work.join(format!("staging/{name}"));
    let target = agent.work.join(format!("pods/{name}/mount"));
    let mut node = agent.node().await;
    node.node_stage_volume(stage_req(&vol, &staging, fs_cap()))
        .await
        .expect("stage");
    node.node_publish_volume(publish_req(&vol, &staging, &target, fs_cap(), false))
        .await
        .expect("publish");
    std::fs::write(target.join("data.txt"), name.as_bytes()).expect("write through target");
    (vol, staging, target)
}
