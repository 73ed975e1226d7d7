//! v0.1 Node. v0.1 has no NodeStageVolume, so NodePublishVolume runs the v1 stage into a
//! directory the agent owns (`<state-dir>/v01-staging/<volume-id>`) and then the v1 publish
//! (a bind mount from there); NodeUnpublishVolume runs the v1 unpublish and, when that was the
//! volume's last publication and the volume is staged in that directory, the v1 unstage. Both
//! v1 steps are idempotent, so both v0.1 calls are too, including retries after a failure
//! between the two steps.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ebs_proto::csi::node_server::Node;
use ebs_proto::csi::{self as v01, v1};
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status};
use v1::node_server::Node as V1Node;

use super::{check_version, probe};
use crate::error::blocking;
use crate::grpc::identity::IdentityService;
use crate::grpc::invalid;
use crate::grpc::node::NodeService;
use crate::grpc::to_status;
use crate::grpc::v0::recode_opt;
use ebs_node_core::error::Error;
use ebs_node_core::node::{VolumeGuard, VolumeLocks};
use ebs_node_core::request::{ValidationError, VolumeId};

/// Below the state directory: where v0.1 volumes are staged.
pub const STAGING_DIR: &str = ebs_node_backends::kubelet_names::V01_STAGING_DIR;

pub struct V01Node {
    pub v1: Arc<NodeService>,
    pub identity: Arc<IdentityService>,
    /// `<state-dir>/v01-staging`, absolute: the one directory inside the state directory that
    /// is an allowed path prefix (the agent's own staging paths for v0.1).
    pub staging_root: PathBuf,
    /// One v0.1 call per volume at a time, for the whole call: its two v1 steps each take the
    /// volume's guard only for themselves, and a retry between them (or during the first) must
    /// not undo what the first call is doing (remove its staging directory, unstage it).
    pub calls: VolumeLocks,
}

impl V01Node {
    /// The volume's v0.1 turn: ABORTED (CSI's "operation pending") while another v0.1 call on
    /// the volume runs.
    fn turn(&self, raw_id: &str) -> Result<VolumeGuard, Status> {
        let id = VolumeId::parse(raw_id).map_err(invalid)?;
        self.calls
            .try_lock(id.as_str())
            .ok_or_else(|| to_status(&Error::Busy(id.to_string())))
    }

    fn staging_for(&self, raw_id: &str) -> Result<PathBuf, Status> {
        let id = VolumeId::parse(raw_id).map_err(invalid)?;
        // One component whatever the id (a node-local handle's '/' included), never `.`/`..`.
        let name = id.file_name().ok_or_else(|| {
            invalid(ValidationError::bad(
                "volume_id",
                raw_id,
                "it cannot name a staging directory",
            ))
        })?;
        Ok(self.staging_root.join(name))
    }

    /// Whether the volume is staged in our directory with no publication left.
    async fn staged_here_unused(&self, id: &str, staging: &Path) -> Result<bool, Status> {
        let store = Arc::clone(&self.v1.ctx.store);
        let (id, staging) = (id.to_string(), staging.to_path_buf());
        let unused = blocking(move || {
            let ours = store
                .staged(&id)?
                .is_some_and(|s| s.staging_path == staging);
            Ok::<_, Error>(ours && store.publications(&id)?.is_empty())
        })
        .await
        .map_err(|e| to_status(&e))?;
        Ok(unused)
    }
}

impl V01Node {
    /// Unstages the volume when it is staged in our directory and published nowhere, then
    /// removes the directory (ours, unlike a CO's staging path).
    async fn unstage_if_unused(
        &self,
        meta: &MetadataMap,
        id: &str,
        staging: &Path,
    ) -> Result<(), Status> {
        if !self.staged_here_unused(id, staging).await? {
            return Ok(());
        }
        let unstage = v1::NodeUnstageVolumeRequest {
            volume_id: id.to_string(),
            staging_target_path: staging.display().to_string(),
        };
        self.v1.node_unstage_volume(request(meta, unstage)).await?;
        if let Err(e) = std::fs::remove_dir(staging)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(path = %staging.display(), error = %e, "v0.1 staging directory left behind");
        }
        Ok(())
    }
}

fn request<T>(meta: &MetadataMap, message: T) -> Request<T> {
    // The caller's metadata (its grpc-timeout above all) goes along to every v1 step.
    Request::from_parts(meta.clone(), Default::default(), message)
}

#[tonic::async_trait]
impl Node for V01Node {
    async fn node_publish_volume(
        &self,
        req: Request<v01::NodePublishVolumeRequest>,
    ) -> Result<Response<v01::NodePublishVolumeResponse>, Status> {
        let (meta, _, r) = req.into_parts();
        check_version(r.version.as_ref())?;
        let staging = self.staging_for(&r.volume_id)?;
        let _turn = self.turn(&r.volume_id)?;
        let staging_target_path = staging.display().to_string();
        let capability: Option<v1::VolumeCapability> = recode_opt(r.volume_capability.as_ref())?;
        let publish = v1::NodePublishVolumeRequest {
            volume_id: r.volume_id.clone(),
            publish_context: r.publish_volume_info.clone(),
            staging_target_path: staging_target_path.clone(),
            target_path: r.target_path,
            volume_capability: capability.clone(),
            readonly: r.readonly,
            secrets: r.user_credentials.clone(),
            volume_context: r.volume_attributes.clone(),
        };
        // The publish half is checked before the stage half runs: a bad target must not leave
        // a staged volume behind.
        let (volume, checked) = self
            .v1
            .publish_command(&publish)
            .await
            .map_err(|e| to_status(&e))?;
        let cmd = checked.command(volume);
        let ctx = Arc::clone(&self.v1.ctx);
        blocking(move || ebs_node_core::node::check_publish_paths(&ctx, &cmd))
            .await
            .map_err(|e| to_status(&e))?;
        let stage = v1::NodeStageVolumeRequest {
            volume_id: r.volume_id.clone(),
            publish_context: r.publish_volume_info,
            staging_target_path,
            volume_capability: capability,
            secrets: r.user_credentials,
            volume_context: r.volume_attributes,
        };
        // Whether this call makes the staging directory: only then may its failure remove it.
        let existed = std::fs::symlink_metadata(&staging).is_ok();
        if let Err(e) = self.v1.node_stage_volume(request(&meta, stage)).await {
            // An empty directory the failed stage made (never a mount point: EBUSY).
            if !existed {
                std::fs::remove_dir(&staging).ok();
            }
            return Err(e);
        }
        if let Err(e) = self.v1.node_publish_volume(request(&meta, publish)).await {
            // Leave the volume as the caller last saw it: unstaged, unless it is in use.
            self.unstage_if_unused(&meta, &r.volume_id, &staging)
                .await
                .ok();
            return Err(e);
        }
        Ok(Response::new(v01::NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        req: Request<v01::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<v01::NodeUnpublishVolumeResponse>, Status> {
        let (meta, _, r) = req.into_parts();
        check_version(r.version.as_ref())?;
        let _turn = self.turn(&r.volume_id)?;
        let unpublish = v1::NodeUnpublishVolumeRequest {
            volume_id: r.volume_id.clone(),
            target_path: r.target_path,
        };
        self.v1
            .node_unpublish_volume(request(&meta, unpublish))
            .await?;
        let staging = self.staging_for(&r.volume_id)?;
        self.unstage_if_unused(&meta, &r.volume_id, &staging)
            .await?;
        Ok(Response::new(v01::NodeUnpublishVolumeResponse {}))
    }

    async fn get_node_id(
        &self,
        req: Request<v01::GetNodeIdRequest>,
    ) -> Result<Response<v01::GetNodeIdResponse>, Status> {
        check_version(req.get_ref().version.as_ref())?;
        let info = self
            .v1
            .node_get_info(req.map(|_| v1::NodeGetInfoRequest {}))
            .await?
            .into_inner();
        Ok(Response::new(v01::GetNodeIdResponse {
            node_id: info.node_id,
        }))
    }

    async fn node_probe(
        &self,
        req: Request<v01::NodeProbeRequest>,
    ) -> Result<Response<v01::NodeProbeResponse>, Status> {
        check_version(req.get_ref().version.as_ref())?;
        probe(&self.identity, req.map(|_| ())).await?;
        Ok(Response::new(v01::NodeProbeResponse {}))
    }

    async fn node_get_capabilities(
        &self,
        req: Request<v01::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<v01::NodeGetCapabilitiesResponse>, Status> {
        check_version(req.get_ref().version.as_ref())?;
        // v0.1 names no node capability (staging happens inside publish).
        Ok(Response::new(v01::NodeGetCapabilitiesResponse {
            capabilities: Vec::new(),
        }))
    }
}
