//! v0.3 Node: each call is the v1 call under its old field names (publish_info →
//! publish_context, node_*_secrets → secrets, volume_attributes → volume_context).

use std::sync::Arc;

use ebs_proto::csi::v0;
use ebs_proto::csi::v1::{self, node_server::Node as V1Node};
use tonic::{Request, Response, Status};
use v0::node_server::Node;

use super::{recode, recode_opt};
use crate::grpc::node::NodeService;

pub struct V0Node {
    pub v1: Arc<NodeService>,
}

/// v1 node capabilities that exist in v0.3: STAGE_UNSTAGE_VOLUME (1 in both).
pub fn node_capabilities(caps: &[v1::NodeServiceCapability]) -> Vec<v0::NodeServiceCapability> {
    use v1::node_service_capability::Type;
    caps.iter()
        .filter_map(|c| match &c.r#type {
            Some(Type::Rpc(r)) if r.r#type == 1 => Some(v0::NodeServiceCapability {
                r#type: Some(v0::node_service_capability::Type::Rpc(
                    v0::node_service_capability::Rpc { r#type: r.r#type },
                )),
            }),
            _ => None,
        })
        .collect()
}

impl V0Node {
    async fn info(&self, req: Request<()>) -> Result<v1::NodeGetInfoResponse, Status> {
        Ok(self
            .v1
            .node_get_info(req.map(|()| v1::NodeGetInfoRequest {}))
            .await?
            .into_inner())
    }
}

#[tonic::async_trait]
impl Node for V0Node {
    async fn node_stage_volume(
        &self,
        req: Request<v0::NodeStageVolumeRequest>,
    ) -> Result<Response<v0::NodeStageVolumeResponse>, Status> {
        let (meta, ext, r) = req.into_parts();
        let v1req = v1::NodeStageVolumeRequest {
            volume_id: r.volume_id,
            publish_context: r.publish_info,
            staging_target_path: r.staging_target_path,
            volume_capability: recode_opt(r.volume_capability.as_ref())?,
            secrets: r.node_stage_secrets,
            volume_context: r.volume_attributes,
        };
        self.v1
            .node_stage_volume(Request::from_parts(meta, ext, v1req))
            .await?;
        Ok(Response::new(v0::NodeStageVolumeResponse {}))
    }

    async fn node_unstage_volume(
        &self,
        req: Request<v0::NodeUnstageVolumeRequest>,
    ) -> Result<Response<v0::NodeUnstageVolumeResponse>, Status> {
        self.v1
            .node_unstage_volume(req.map(|r| v1::NodeUnstageVolumeRequest {
                volume_id: r.volume_id,
                staging_target_path: r.staging_target_path,
            }))
            .await?;
        Ok(Response::new(v0::NodeUnstageVolumeResponse {}))
    }

    async fn node_publish_volume(
        &self,
        req: Request<v0::NodePublishVolumeRequest>,
    ) -> Result<Response<v0::NodePublishVolumeResponse>, Status> {
        let (meta, ext, r) = req.into_parts();
        let v1req = v1::NodePublishVolumeRequest {
            volume_id: r.volume_id,
            publish_context: r.publish_info,
            staging_target_path: r.staging_target_path,
            target_path: r.target_path,
            volume_capability: recode_opt(r.volume_capability.as_ref())?,
            readonly: r.readonly,
            secrets: r.node_publish_secrets,
            volume_context: r.volume_attributes,
        };
        self.v1
            .node_publish_volume(Request::from_parts(meta, ext, v1req))
            .await?;
        Ok(Response::new(v0::NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        req: Request<v0::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<v0::NodeUnpublishVolumeResponse>, Status> {
        self.v1
            .node_unpublish_volume(req.map(|r| v1::NodeUnpublishVolumeRequest {
                volume_id: r.volume_id,
                target_path: r.target_path,
            }))
            .await?;
        Ok(Response::new(v0::NodeUnpublishVolumeResponse {}))
    }

    async fn node_get_id(
        &self,
        req: Request<v0::NodeGetIdRequest>,
    ) -> Result<Response<v0::NodeGetIdResponse>, Status> {
        let info = self.info(req.map(|_| ())).await?;
        Ok(Response::new(v0::NodeGetIdResponse {
            node_id: info.node_id,
        }))
    }

    async fn node_get_capabilities(
        &self,
        req: Request<v0::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<v0::NodeGetCapabilitiesResponse>, Status> {
        let r = self
            .v1
            .node_get_capabilities(req.map(|_| v1::NodeGetCapabilitiesRequest {}))
            .await?
            .into_inner();
        Ok(Response::new(v0::NodeGetCapabilitiesResponse {
            capabilities: node_capabilities(&r.capabilities),
        }))
    }

    async fn node_get_info(
        &self,
        req: Request<v0::NodeGetInfoRequest>,
    ) -> Result<Response<v0::NodeGetInfoResponse>, Status> {
        let info = self.info(req.map(|_| ())).await?;
        Ok(Response::new(v0::NodeGetInfoResponse {
            node_id: info.node_id,
            max_volumes_per_node: info.max_volumes_per_node,
            accessible_topology: info.accessible_topology.as_ref().map(recode).transpose()?,
        }))
    }
}
