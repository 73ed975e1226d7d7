//! Node-local volumes (`local-ebs://dev/<name>`, upstream aws-ebs-csi-driver v1.53+) on real
//! loop devices the test attaches itself, as an operator pre-attaches a disk: the lifecycle
//! through CSI v1, v0.3 and v0.1 with the data checked, MULTI_NODE_MULTI_WRITER in mount mode
//! for handles only, the publish context's `volumeID`, and bad handles refused with the spec's
//! code and the host unchanged.

#![allow(deprecated)]

mod btrfs;
mod controller;
mod ebs;
mod ebs_partitions;
mod elsewhere;
mod flushed_views;
mod hopping;
mod lifecycle;
mod moving;
mod own_copies;
mod owners;
mod pins;
mod raw_use;
mod rebuild;
mod refusals;
mod replaced;
mod retries;
mod siblings;
mod stacked;
mod two_agents;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use ebs_tests::*;

/// A new mount namespace copies every mount there is. The one `refusals` makes (to keep a device
/// mounted "elsewhere") lazily unmounts its copies of the other tests' mounts first, but until it
/// has, a parallel test's device is still claimed there, and that test's unstage is rightly
/// refused ("still mounted elsewhere": seen in about one CI run in ten). So the other tests of
/// this binary hold this shared while they run, and making the namespace takes it alone.
pub static NAMESPACE_COPY: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// A loop device over a file of `size` bytes below the scratch directory (detached by its
/// Drop), as a disk pre-attached to the node.
pub struct Disk {
    pub dev: PathBuf,
}

impl Disk {
    /// A stage of this disk's handle as raw block at `h/staging` below the agent's work dir.
    pub async fn stage_handle(&self, agent: &Agent) -> Result<(), tonic::Status> {
        agent
            .node()
            .await
            .node_stage_volume(csi_req::stage_req(
                &self.vol(),
                &agent.work.join("h/staging"),
                owners::rwx_block(),
            ))
            .await
            .map(|_| ())
    }

    /// The unstage of `stage_handle`'s stage.
    pub async fn unstage_handle(&self, agent: &Agent) -> Result<(), tonic::Status> {
        agent
            .node()
            .await
            .node_unstage_volume(csi_req::unstage_req(
                &self.vol(),
                &agent.work.join("h/staging"),
            ))
            .await
            .map(|_| ())
    }

    pub fn new(scratch: &Scratch, name: &str, size: u64) -> Disk {
        let img = scratch.join(&format!("{name}.img"));
        sh(&format!("truncate -s {size} {}", img.display()));
        let out = sh(&format!("losetup --find --show {}", img.display()));
        Disk {
            dev: PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()),
        }
    }

    /// `local-ebs://dev/loopN`: the device path without its leading slash.
    pub fn handle(&self) -> String {
        format!(
            "local-ebs://{}",
            self.dev.display().to_string().trim_start_matches('/')
        )
    }

    /// The volume as the request builders take it: the handle as its id, the device as its
    /// devicePath.
    pub fn vol(&self) -> csi_req::Vol {
        csi_req::Vol {
            id: self.handle(),
            device: self.dev.display().to_string(),
        }
    }

    /// What upstream's controller publishes for a node-local volume: the device path.
    pub fn publish_context(&self) -> HashMap<String, String> {
        HashMap::from([("devicePath".to_string(), self.dev.display().to_string())])
    }
}

impl Drop for Disk {
    fn drop(&mut self) {
        detach_loop(&self.dev);
    }
}

/// A loop device a test (as an operator would) lays over `backing` with `losetup` and these
/// options (`-o 1048576`, or none): its path.
pub fn losetup(options: &str, backing: impl std::fmt::Display) -> String {
    let out = sh(&format!("losetup {options} -f --show {backing}"));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// How long one of two racing calls waits in a round: 0 for the one that goes first (the
/// stage in even rounds), `round × 3` ms for the other: both orders, and the moments between.
pub fn stagger(round: u64, stage: bool) -> std::time::Duration {
    std::time::Duration::from_millis(if round.is_multiple_of(2) == stage {
        0
    } else {
        round * 3
    })
}

/// A link in /dev to a test's device (another name for it, as udev's links are), removed on drop.
pub struct DevLink {
    pub path: PathBuf,
}

impl DevLink {
    pub fn new(to: &Path) -> DevLink {
        let path = PathBuf::from(format!("/dev/ebs-it-alias-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        std::os::unix::fs::symlink(to, &path).expect("link in /dev");
        DevLink { path }
    }

    pub fn handle(&self) -> String {
        format!(
            "local-ebs://{}",
            self.path.display().to_string().trim_start_matches('/')
        )
    }
}

impl Drop for DevLink {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

pub fn is_mounted(path: &Path) -> bool {
    path.parent()
        .is_some_and(|p| mounts_below(p).iter().any(|m| m == path))
}

/// The SHA-256 of `text` in hex: how kubelet names a CSI volume's staging directory.
pub fn sha256_hex(text: &str) -> String {
    let out = sh(&format!("printf %s '{text}' | sha256sum"));
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string()
}
