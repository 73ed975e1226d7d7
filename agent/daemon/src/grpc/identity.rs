//! The Identity service: the same plugin capabilities in every mode, and a Probe answered from
//! cached state in microseconds.

use std::sync::Arc;

use csi::identity_server::Identity;
use csi::plugin_capability::{self, service, volume_expansion};
use ebs_proto::csi::v1 as csi;
use tonic::{Request, Response, Status};

use crate::health::Health;

pub struct IdentityService {
    pub driver_name: String,
    pub manifest: std::collections::HashMap<String, String>,
    pub health: Arc<Health>,
}

pub fn plugin_capabilities() -> Vec<csi::PluginCapability> {
    let service = |t: service::Type| csi::PluginCapability {
        r#type: Some(plugin_capability::Type::Service(
            plugin_capability::Service { r#type: t as i32 },
        )),
    };
    vec![
        service(service::Type::ControllerService),
        service(service::Type::VolumeAccessibilityConstraints),
        csi::PluginCapability {
            r#type: Some(plugin_capability::Type::VolumeExpansion(
                plugin_capability::VolumeExpansion {
                    r#type: volume_expansion::Type::Online as i32,
                },
            )),
        },
    ]
}

#[tonic::async_trait]
impl Identity for IdentityService {
    async fn get_plugin_info(
        &self,
        _req: Request<csi::GetPluginInfoRequest>,
    ) -> Result<Response<csi::GetPluginInfoResponse>, Status> {
        Ok(Response::new(csi::GetPluginInfoResponse {
            name: self.driver_name.clone(),
            vendor_version: env!("CARGO_PKG_VERSION").to_string(),
            manifest: self.manifest.clone(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _req: Request<csi::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<csi::GetPluginCapabilitiesResponse>, Status> {
        Ok(Response::new(csi::GetPluginCapabilitiesResponse {
            capabilities: plugin_capabilities(),
        }))
    }

    async fn probe(
        &self,
        _req: Request<csi::ProbeRequest>,
    ) -> Result<Response<csi::ProbeResponse>, Status> {
        match self.health.check() {
            Ok(ready) => Ok(Response::new(csi::ProbeResponse { ready: Some(ready) })),
            Err(problem) => Err(Status::failed_precondition(problem)),
        }
    }
}
