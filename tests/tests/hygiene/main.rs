//! Issue 31: promises about the agent's own files, its state's size, its logs and stale device
//! paths, each reproduced on real loop devices.

mod bounded_state;
mod log_lines;
mod private_state;
mod stale_device_path;

use std::path::Path;

use ebs_tests::csi_req::*;
use ebs_tests::*;

use csi::volume_capability::access_mode::Mode;

pub const MIB: i64 = 1 << 20;

pub fn fs_cap() -> csi::VolumeCapability {
    mount_cap("ext4", Mode::SingleNodeWriter)
}

/// Stages `vol` at `staging` with its own devicePath, writes `text` into `name` there, and
/// unstages it again: the volume then carries an ext4 filesystem holding that file.
pub async fn write_and_unstage(agent: &Agent, vol: &Vol, staging: &Path, text: &str) {
    let mut node = agent.node().await;
    node.node_stage_volume(stage_req(vol, staging, fs_cap()))
        .await
        .expect("stage");
    std::fs::write(staging.join("whose"), text).expect("write through the staging path");
    node.node_unstage_volume(unstage_req(vol, staging))
        .await
        .expect("unstage");
}

/// The file modes below `dir`, recursively, without following symlinks.
pub fn modes_below(dir: &Path) -> Vec<(std::path::PathBuf, u32)> {
    use std::os::unix::fs::MetadataExt;
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(meta) = std::fs::symlink_metadata(&d) else {
            continue;
        };
        out.push((d.clone(), meta.mode() & 0o7777));
        if meta.is_dir()
            && let Ok(entries) = std::fs::read_dir(&d)
        {
            todo.extend(entries.flatten().map(|e| e.path()));
        }
    }
    out
}
