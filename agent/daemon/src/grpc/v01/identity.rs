//! v0.1 Identity: version negotiation (0.1.0 only) and the v1 plugin info.

use std::sync::Arc;

use ebs_proto::csi::identity_server::Identity;
use ebs_proto::csi::{self as v01, v1};
use tonic::{Request, Response, Status};
use v1::identity_server::Identity as V1Identity;

use super::{VERSION, check_version};
use crate::grpc::identity::IdentityService;

pub struct V01Identity {
    pub v1: Arc<IdentityService>,
}

#[tonic::async_trait]
impl Identity for V01Identity {
    async fn get_supported_versions(
        &self,
        _req: Request<v01::GetSupportedVersionsRequest>,
    ) -> Result<Response<v01::GetSupportedVersionsResponse>, Status> {
        Ok(Response::new(v01::GetSupportedVersionsResponse {
            supported_versions: vec![VERSION],
        }))
    }

    async fn get_plugin_info(
        &self,
        req: Request<v01::GetPluginInfoRequest>,
    ) -> Result<Response<v01::GetPluginInfoResponse>, Status> {
        check_version(req.get_ref().version.as_ref())?;
        let r = self
            .v1
            .get_plugin_info(req.map(|_| v1::GetPluginInfoRequest {}))
            .await?
            .into_inner();
        Ok(Response::new(v01::GetPluginInfoResponse {
            name: r.name,
            vendor_version: r.vendor_version,
            manifest: r.manifest,
        }))
    }
}
