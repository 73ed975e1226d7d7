//! Request builders, so tests read like the CSI lifecycle.

use std::collections::HashMap;
use std::path::Path;

use crate::{Agent, csi};
use csi::volume_capability::access_mode::Mode;
use csi::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};

pub fn mount_cap(fs: &str, mode: Mode) -> csi::VolumeCapability {
    mount_cap_flags(fs, mode, &[])
}

pub fn mount_cap_flags(fs: &str, mode: Mode, flags: &[&str]) -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: fs.into(),
            mount_flags: flags.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        })),
        access_mode: Some(AccessMode { mode: mode as i32 }),
    }
}

pub fn block_cap(mode: Mode) -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_type: Some(AccessType::Block(BlockVolume {})),
        access_mode: Some(AccessMode { mode: mode as i32 }),
    }
}

/// A loop-backend volume created and attached to this node.
#[derive(Clone, Debug)]
pub struct Vol {
    pub id: String,
    pub device: String,
}

impl Vol {
    pub fn publish_context(&self) -> HashMap<String, String> {
        HashMap::from([("devicePath".to_string(), self.device.clone())])
    }
}

/// A capacity range asking for at least `bytes`, with no upper limit.
pub fn at_least(bytes: i64) -> Option<csi::CapacityRange> {
    Some(csi::CapacityRange {
        required_bytes: bytes,
        limit_bytes: 0,
    })
}

pub async fn create_volume(
    agent: &Agent,
    name: &str,
    bytes: i64,
    params: &[(&str, &str)],
) -> String {
    let r = agent
        .controller()
        .await
        .create_volume(csi::CreateVolumeRequest {
            name: name.into(),
            capacity_range: at_least(bytes),
            volume_capabilities: vec![mount_cap("ext4", Mode::SingleNodeWriter)],
            parameters: params
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        })
        .await
        .expect("create volume")
        .into_inner();
    r.volume.expect("volume").volume_id
}

pub async fn node_id(agent: &Agent) -> String {
    agent
        .node()
        .await
        .node_get_info(csi::NodeGetInfoRequest {})
        .await
        .expect("node info")
        .into_inner()
        .node_id
}

pub async fn attach(agent: &Agent, id: &str) -> Vol {
    let node = node_id(agent).await;
    let r = agent
        .controller()
        .await
        .controller_publish_volume(csi::ControllerPublishVolumeRequest {
            volume_id: id.into(),
            node_id: node,
            volume_capability: Some(mount_cap("ext4", Mode::SingleNodeWriter)),
            ..Default::default()
        })
        .await
        .expect("controller publish")
        .into_inner();
    Vol {
        id: id.into(),
        device: r.publish_context["devicePath"].clone(),
    }
}

pub async fn create_attached(agent: &Agent, name: &str, bytes: i64) -> Vol {
    let id = create_volume(agent, name, bytes, &[]).await;
    attach(agent, &id).await
}

/// NodeUnpublishVolume at `target`, then NodeUnstageVolume at `staging`: a test's tidy end, each
/// expected to succeed.
pub async fn unpublish_and_unstage(agent: &Agent, vol: &Vol, staging: &Path, target: &Path) {
    let mut node = agent.node().await;
    node.node_unpublish_volume(unpublish_req(vol, target))
        .await
        .expect("unpublish");
    node.node_unstage_volume(unstage_req(vol, staging))
        .await
        .expect("unstage");
}

pub fn stage_req(
    vol: &Vol,
    staging: &Path,
    cap: csi::VolumeCapability,
) -> csi::NodeStageVolumeRequest {
    csi::NodeStageVolumeRequest {
        volume_id: vol.id.clone(),
        publish_context: vol.publish_context(),
        staging_target_path: staging.display().to_string(),
        volume_capability: Some(cap),
        ..Default::default()
    }
}

pub fn unstage_req(vol: &Vol, staging: &Path) -> csi::NodeUnstageVolumeRequest {
    csi::NodeUnstageVolumeRequest {
        volume_id: vol.id.clone(),
        staging_target_path: staging.display().to_string(),
    }
}

pub fn publish_req(
    vol: &Vol,
    staging: &Path,
    target: &Path,
    cap: csi::VolumeCapability,
    readonly: bool,
) -> csi::NodePublishVolumeRequest {
    csi::NodePublishVolumeRequest {
        volume_id: vol.id.clone(),
        publish_context: vol.publish_context(),
        staging_target_path: staging.display().to_string(),
        target_path: target.display().to_string(),
        volume_capability: Some(cap),
        readonly,
        ..Default::default()
    }
}

pub fn unpublish_req(vol: &Vol, target: &Path) -> csi::NodeUnpublishVolumeRequest {
    unpublish_by_id(&vol.id, target)
}

/// For a volume id the test never created (refusals, paths that hang).
pub fn unpublish_by_id(volume_id: &str, target: &Path) -> csi::NodeUnpublishVolumeRequest {
    csi::NodeUnpublishVolumeRequest {
        volume_id: volume_id.into(),
        target_path: target.display().to_string(),
    }
}

pub fn stats_req(volume_id: &str, volume_path: &Path) -> csi::NodeGetVolumeStatsRequest {
    csi::NodeGetVolumeStatsRequest {
        volume_id: volume_id.into(),
        volume_path: volume_path.display().to_string(),
        staging_target_path: String::new(),
    }
}

/// The filesystem UUID on a device, read with blkid (the test's independent view).
pub fn fs_uuid(device: &str) -> String {
    let out = std::process::Command::new("blkid")
        .args(["-p", "-o", "value", "-s", "UUID", device])
        .output()
        .expect("blkid");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}
