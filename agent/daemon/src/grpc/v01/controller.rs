//! v0.1 Controller: the v1 Controller's calls under v0.1 names and types (unsigned sizes,
//! `VolumeInfo`, `user_credentials`, `publish_volume_info`), plus ControllerProbe.

use std::sync::Arc;

use ebs_proto::csi::controller_server::Controller;
use ebs_proto::csi::{self as v01, v1};
use tonic::{Request, Response, Status};
use v1::controller_server::Controller as V1Controller;

use super::{check_version, probe};
use crate::grpc::identity::IdentityService;
use crate::grpc::invalid;
use crate::grpc::v0::{recode_all, recode_opt};
use ebs_node_core::request::ValidationError;

pub struct V01Controller {
    pub v1: Arc<dyn V1Controller>,
    pub identity: Arc<IdentityService>,
}

fn signed(field: &'static str, bytes: u64) -> Result<i64, Status> {
    i64::try_from(bytes)
        .map_err(|_| ValidationError::bad(field, bytes.to_string(), "too large"))
        .map_err(invalid)
}

fn volume_info(v: Option<v1::Volume>) -> Option<v01::VolumeInfo> {
    v.map(|v| v01::VolumeInfo {
        capacity_bytes: v.capacity_bytes.max(0) as u64,
        id: v.volume_id,
        attributes: v.volume_context,
    })
}

#[tonic::async_trait]
impl Controller for V01Controller {
    async fn create_volume(
        &self,
        req: Request<v01::CreateVolumeRequest>,
    ) -> Result<Response<v01::CreateVolumeResponse>, Status> {
        let (meta, ext, r) = req.into_parts();
        check_version(r.version.as_ref())?;
        let capacity_range = match r.capacity_range {
            Some(c) => Some(v1::CapacityRange {
                required_bytes: signed("capacity_range.required_bytes", c.required_bytes)?,
                limit_bytes: signed("capacity_range.limit_bytes", c.limit_bytes)?,
            }),
            None => None,
        };
        let v1req = v1::CreateVolumeRequest {
            name: r.name,
            capacity_range,
            volume_capabilities: recode_all(&r.volume_capabilities)?,
            parameters: r.parameters,
            secrets: r.user_credentials,
            ..Default::default()
        };
        let out = self
            .v1
            .create_volume(Request::from_parts(meta, ext, v1req))
            .await?
            .into_inner();
        Ok(Response::new(v01::CreateVolumeResponse {
            volume_info: volume_info(out.volume),
        }))
    }

    async fn delete_volume(
        &self,
        req: Request<v01::DeleteVolumeRequest>,
    ) -> Result<Response<v01::DeleteVolumeResponse>, Status> {
        check_version(req.get_ref().version.as_ref())?;
        self.v1
            .delete_volume(req.map(|r| v1::DeleteVolumeRequest {
                volume_id: r.volume_id,
                secrets: r.user_credentials,
            }))
            .await?;
        Ok(Response::new(v01::DeleteVolumeResponse {}))
    }

    async fn controller_publish_volume(
        &self,
        req: Request<v01::ControllerPublishVolumeRequest>,
    ) -> Result<Response<v01::ControllerPublishVolumeResponse>, Status> {
        let (meta, ext, r) = req.into_parts();
        check_version(r.version.as_ref())?;
        let v1req = v1::ControllerPublishVolumeRequest {
            volume_id: r.volume_id,
            node_id: r.node_id,
            volume_capability: recode_opt(r.volume_capability.as_ref())?,
            readonly: r.readonly,
            secrets: r.user_credentials,
            volume_context: r.volume_attributes,
        };
        let out = self
            .v1
            .controller_publish_volume(Request::from_parts(meta, ext, v1req))
            .await?
            .into_inner();
        Ok(Response::new(v01::ControllerPublishVolumeResponse {
            publish_volume_info: out.publish_context,
        }))
    }

    async fn controller_unpublish_volume(
        &self,
        req: Request<v01::ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<v01::ControllerUnpublishVolumeResponse>, Status> {
        check_version(req.get_ref().version.as_ref())?;
        self.v1
            .controller_unpublish_volume(req.map(|r| v1::ControllerUnpublishVolumeRequest {
                volume_id: r.volume_id,
                node_id: r.node_id,
                secrets: r.user_credentials,
            }))
            .await?;
        Ok(Response::new(v01::ControllerUnpublishVolumeResponse {}))
    }

    async fn validate_volume_capabilities(
        &self,
        req: Request<v01::ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<v01::ValidateVolumeCapabilitiesResponse>, Status> {
        let (meta, ext, r) = req.into_parts();
        check_version(r.version.as_ref())?;
        let v1req = v1::ValidateVolumeCapabilitiesRequest {
            volume_id: r.volume_id,
            volume_context: r.volume_attributes,
            volume_capabilities: recode_all(&r.volume_capabilities)?,
            ..Default::default()
        };
        let out = self
            .v1
            .validate_volume_capabilities(Request::from_parts(meta, ext, v1req))
            .await?
            .into_inner();
        Ok(Response::new(v01::ValidateVolumeCapabilitiesResponse {
            supported: out.confirmed.is_some(),
            message: out.message,
        }))
    }

    async fn list_volumes(
        &self,
        req: Request<v01::ListVolumesRequest>,
    ) -> Result<Response<v01::ListVolumesResponse>, Status> {
        check_version(req.get_ref().version.as_ref())?;
        let out = self
            .v1
            .list_volumes(req.map(|r| v1::ListVolumesRequest {
                // Unsigned in v0.1; more than i32::MAX entries is "no limit" in practice.
                max_entries: r.max_entries.min(i32::MAX as u32) as i32,
                starting_token: r.starting_token,
            }))
            .await?
            .into_inner();
        Ok(Response::new(v01::ListVolumesResponse {
            entries: out
                .entries
                .into_iter()
                .map(|e| v01::list_volumes_response::Entry {
                    volume_info: volume_info(e.volume),
                })
                .collect(),
            next_token: out.next_token,
        }))
    }

    async fn get_capacity(
        &self,
        req: Request<v01::GetCapacityRequest>,
    ) -> Result<Response<v01::GetCapacityResponse>, Status> {
        let (meta, ext, r) = req.into_parts();
        check_version(r.version.as_ref())?;
        let v1req = v1::GetCapacityRequest {
            volume_capabilities: recode_all(&r.volume_capabilities)?,
            parameters: r.parameters,
            accessible_topology: None,
        };
        let out = self
            .v1
            .get_capacity(Request::from_parts(meta, ext, v1req))
            .await?
            .into_inner();
        Ok(Response::new(v01::GetCapacityResponse {
            available_capacity: out.available_capacity.max(0) as u64,
        }))
    }

    async fn controller_probe(
        &self,
        req: Request<v01::ControllerProbeRequest>,
    ) -> Result<Response<v01::ControllerProbeResponse>, Status> {
        check_version(req.get_ref().version.as_ref())?;
        probe(&self.identity, req.map(|_| ())).await?;
        Ok(Response::new(v01::ControllerProbeResponse {}))
    }

    async fn controller_get_capabilities(
        &self,
        req: Request<v01::ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<v01::ControllerGetCapabilitiesResponse>, Status> {
        use v1::controller_service_capability::Type;
        check_version(req.get_ref().version.as_ref())?;
        let out = self
            .v1
            .controller_get_capabilities(req.map(|_| v1::ControllerGetCapabilitiesRequest {}))
            .await?
            .into_inner();
        // CREATE_DELETE_VOLUME, PUBLISH_UNPUBLISH_VOLUME, LIST_VOLUMES, GET_CAPACITY: 1-4 in both.
        let capabilities = out
            .capabilities
            .iter()
            .filter_map(|c| match &c.r#type {
                Some(Type::Rpc(r)) if (1..=4).contains(&r.r#type) => {
                    Some(v01::ControllerServiceCapability {
                        r#type: Some(v01::controller_service_capability::Type::Rpc(
                            v01::controller_service_capability::Rpc { r#type: r.r#type },
                        )),
                    })
                }
                _ => None,
            })
            .collect();
        Ok(Response::new(v01::ControllerGetCapabilitiesResponse {
            capabilities,
        }))
    }
}
