//! Clients and request builders for the pre-1.0 CSI versions (v0.3 as `csi.v0`, v0.1 as `csi`),
//! so the legacy tests read like the ones for v1.

use std::collections::HashMap;
use std::path::Path;

pub use ebs_proto::csi as v01;
pub use ebs_proto::csi::v0;
use tonic::transport::Channel;

use crate::Agent;

pub const V01: v01::Version = v01::Version {
    major: 0,
    minor: 1,
    patch: 0,
};

pub fn v01_version() -> Option<v01::Version> {
    Some(V01)
}

pub async fn v0_node(agent: &Agent) -> v0::node_client::NodeClient<Channel> {
    v0::node_client::NodeClient::new(agent.channel().await)
}

pub async fn v0_identity(agent: &Agent) -> v0::identity_client::IdentityClient<Channel> {
    v0::identity_client::IdentityClient::new(agent.channel().await)
}

pub async fn v0_controller(agent: &Agent) -> v0::controller_client::ControllerClient<Channel> {
    v0::controller_client::ControllerClient::new(agent.channel().await)
}

pub async fn v01_node(agent: &Agent) -> v01::node_client::NodeClient<Channel> {
    v01::node_client::NodeClient::new(agent.channel().await)
}

pub async fn v01_identity(agent: &Agent) -> v01::identity_client::IdentityClient<Channel> {
    v01::identity_client::IdentityClient::new(agent.channel().await)
}

pub async fn v01_controller(agent: &Agent) -> v01::controller_client::ControllerClient<Channel> {
    v01::controller_client::ControllerClient::new(agent.channel().await)
}

pub fn v0_mount_cap(
    fs: &str,
    mode: v0::volume_capability::access_mode::Mode,
) -> v0::VolumeCapability {
    use v0::volume_capability::{AccessMode, AccessType, MountVolume};
    v0::VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: fs.into(),
            mount_flags: vec![],
        })),
        access_mode: Some(AccessMode { mode: mode as i32 }),
    }
}

pub fn v01_mount_cap(fs: &str) -> v01::VolumeCapability {
    use v01::volume_capability::{AccessMode, AccessType, MountVolume, access_mode::Mode};
    v01::VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: fs.into(),
            mount_flags: vec![],
        })),
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
    }
}

pub fn v0_stage(
    id: &str,
    publish_info: &HashMap<String, String>,
    staging: &Path,
    fs: &str,
) -> v0::NodeStageVolumeRequest {
    v0::NodeStageVolumeRequest {
        volume_id: id.into(),
        publish_info: publish_info.clone(),
        staging_target_path: staging.display().to_string(),
        volume_capability: Some(v0_mount_cap(
            fs,
            v0::volume_capability::access_mode::Mode::SingleNodeWriter,
        )),
        ..Default::default()
    }
}

pub fn v0_publish(
    id: &str,
    publish_info: &HashMap<String, String>,
    staging: &Path,
    target: &Path,
    fs: &str,
) -> v0::NodePublishVolumeRequest {
    v0::NodePublishVolumeRequest {
        volume_id: id.into(),
        publish_info: publish_info.clone(),
        staging_target_path: staging.display().to_string(),
        target_path: target.display().to_string(),
        volume_capability: Some(v0_mount_cap(
            fs,
            v0::volume_capability::access_mode::Mode::SingleNodeWriter,
        )),
        ..Default::default()
    }
}

pub fn v01_publish(
    id: &str,
    publish_info: &HashMap<String, String>,
    target: &Path,
    fs: &str,
) -> v01::NodePublishVolumeRequest {
    v01::NodePublishVolumeRequest {
        version: v01_version(),
        volume_id: id.into(),
        publish_volume_info: publish_info.clone(),
        target_path: target.display().to_string(),
        volume_capability: Some(v01_mount_cap(fs)),
        ..Default::default()
    }
}

pub fn v01_unpublish(id: &str, target: &Path) -> v01::NodeUnpublishVolumeRequest {
    v01::NodeUnpublishVolumeRequest {
        version: v01_version(),
        volume_id: id.into(),
        target_path: target.display().to_string(),
        ..Default::default()
    }
}
