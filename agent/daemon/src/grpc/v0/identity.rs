//! v0.3 Identity: the v1 answers, with the capabilities v0 can name.

use std::sync::Arc;

use ebs_proto::csi::v0;
use ebs_proto::csi::v1::{self, identity_server::Identity as V1Identity};
use tonic::{Request, Response, Status};
use v0::identity_server::Identity;

use crate::grpc::identity::IdentityService;

pub struct V0Identity {
    pub v1: Arc<IdentityService>,
}

/// v1 service capabilities that exist in v0.3 (same numbers: CONTROLLER_SERVICE and
/// ACCESSIBILITY_CONSTRAINTS); volume expansion has no v0 name and is left out.
pub fn plugin_capabilities(caps: &[v1::PluginCapability]) -> Vec<v0::PluginCapability> {
    use v1::plugin_capability::Type;
    caps.iter()
        .filter_map(|c| match &c.r#type {
            Some(Type::Service(s)) if (1..=2).contains(&s.r#type) => Some(v0::PluginCapability {
                r#type: Some(v0::plugin_capability::Type::Service(
                    v0::plugin_capability::Service { r#type: s.r#type },
                )),
            }),
            _ => None,
        })
        .collect()
}

#[tonic::async_trait]
impl Identity for V0Identity {
    async fn get_plugin_info(
        &self,
        req: Request<v0::GetPluginInfoRequest>,
    ) -> Result<Response<v0::GetPluginInfoResponse>, Status> {
        let r = self
            .v1
            .get_plugin_info(req.map(|_| v1::GetPluginInfoRequest {}))
            .await?
            .into_inner();
        Ok(Response::new(v0::GetPluginInfoResponse {
            name: r.name,
            vendor_version: r.vendor_version,
            manifest: r.manifest,
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        req: Request<v0::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<v0::GetPluginCapabilitiesResponse>, Status> {
        let r = self
            .v1
            .get_plugin_capabilities(req.map(|_| v1::GetPluginCapabilitiesRequest {}))
            .await?
            .into_inner();
        Ok(Response::new(v0::GetPluginCapabilitiesResponse {
            capabilities: plugin_capabilities(&r.capabilities),
        }))
    }

    async fn probe(
        &self,
        req: Request<v0::ProbeRequest>,
    ) -> Result<Response<v0::ProbeResponse>, Status> {
        let r = self
            .v1
            .probe(req.map(|_| v1::ProbeRequest {}))
            .await?
            .into_inner();
        Ok(Response::new(v0::ProbeResponse { ready: r.ready }))
    }
}
