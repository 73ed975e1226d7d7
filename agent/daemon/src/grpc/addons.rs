//! The CSI-Addons endpoint (`--csi-addons-endpoint`): a second unix socket, bound by the same
//! rules as the CSI one, where the CSI-Addons sidecar discovers what the driver offers and asks
//! for online space reclaim. ReclaimSpaceController is not registered: gRPC answers UNIMPLEMENTED,
//! and the capabilities never advertise OFFLINE reclaim.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use ebs_proto::identity::{self as addons_id, capability};
use ebs_proto::reclaimspace as rs;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_stream::StreamExt;
use tonic::{Request, Response, Status};

use super::logged;
use crate::endpoint::Endpoint;
use crate::health::Health;
use crate::node::AgentCtx;
use ebs_node_core::error::Result;
use ebs_node_core::node::reclaim::{ReclaimCommand, ReclaimPath, reclaim};
use ebs_node_core::request::{RequestPath, Roots, Secrets, VolumeId};

pub struct AddonsIdentity {
    pub driver_name: String,
    pub manifest: HashMap<String, String>,
    pub health: Arc<Health>,
    pub serves_node: bool,
    pub serves_controller: bool,
}

impl AddonsIdentity {
    fn capabilities(&self) -> Vec<addons_id::Capability> {
        let service = |t: capability::service::Type| addons_id::Capability {
            r#type: Some(capability::Type::Service(capability::Service {
                r#type: t as i32,
            })),
        };
        let mut caps = Vec::new();
        if self.serves_node {
            caps.push(service(capability::service::Type::NodeService));
            caps.push(addons_id::Capability {
                r#type: Some(capability::Type::ReclaimSpace(capability::ReclaimSpace {
                    r#type: capability::reclaim_space::Type::Online as i32,
                })),
            });
        }
        if self.serves_controller {
            caps.push(service(capability::service::Type::ControllerService));
        }
        caps
    }
}

#[tonic::async_trait]
impl addons_id::identity_server::Identity for AddonsIdentity {
    async fn get_identity(
        &self,
        _req: Request<addons_id::GetIdentityRequest>,
    ) -> Result<Response<addons_id::GetIdentityResponse>, Status> {
        Ok(Response::new(addons_id::GetIdentityResponse {
            name: self.driver_name.clone(),
            vendor_version: env!("CARGO_PKG_VERSION").to_string(),
            manifest: self.manifest.clone(),
        }))
    }

    async fn get_capabilities(
        &self,
        _req: Request<addons_id::GetCapabilitiesRequest>,
    ) -> Result<Response<addons_id::GetCapabilitiesResponse>, Status> {
        Ok(Response::new(addons_id::GetCapabilitiesResponse {
            capabilities: self.capabilities(),
        }))
    }

    async fn probe(
        &self,
        _req: Request<addons_id::ProbeRequest>,
    ) -> Result<Response<addons_id::ProbeResponse>, Status> {
        match self.health.check() {
            Ok(ready) => Ok(Response::new(addons_id::ProbeResponse {
                ready: Some(ready),
            })),
            Err(problem) => Err(Status::failed_precondition(problem)),
        }
    }
}

pub struct ReclaimSpaceNodeService {
    pub ctx: Arc<AgentCtx>,
    pub roots: Arc<Roots>,
}

impl ReclaimSpaceNodeService {
    /// The checks that need no host access; resolving the path runs with the reclaim, off the
    /// executor.
    fn command(&self, r: &rs::NodeReclaimSpaceRequest) -> Result<(VolumeId, GivenPath)> {
        let volume = VolumeId::parse(&r.volume_id)?;
        let path = if !r.staging_target_path.is_empty() {
            GivenPath::Staging(RequestPath::parse(
                "staging_target_path",
                &r.staging_target_path,
                &self.roots,
            )?)
        } else {
            // Missing both: report the field the sidecar is expected to send.
            GivenPath::Published(RequestPath::parse(
                if r.volume_path.is_empty() {
                    "staging_target_path"
                } else {
                    "volume_path"
                },
                &r.volume_path,
                &self.roots,
            )?)
        };
        Ok((volume, path))
    }

    /// The same guard as stage and publish: a reclaim clashes with any other operation on the
    /// volume (ABORTED), and the guard lives in the blocking task until the ioctl returns.
    async fn locked(
        &self,
        volume: VolumeId,
        given: GivenPath,
    ) -> Result<ebs_node_core::node::reclaim::Reclaimed> {
        let id = volume.clone();
        crate::node::run_locked(&self.ctx, id.as_str(), move |ctx| {
            let path = match given {
                GivenPath::Staging(p) => ReclaimPath::Staging(p),
                GivenPath::Published(p) => ReclaimPath::Published(p),
            };
            reclaim(ctx, &ReclaimCommand { volume, path })
        })
        .await
    }
}

enum GivenPath {
    Staging(RequestPath),
    Published(RequestPath),
}

fn consumption(bytes: u64) -> Option<rs::StorageConsumption> {
    Some(rs::StorageConsumption {
        usage_bytes: i64::try_from(bytes).unwrap_or(i64::MAX),
    })
}

#[tonic::async_trait]
impl rs::reclaim_space_node_server::ReclaimSpaceNode for ReclaimSpaceNodeService {
    async fn node_reclaim_space(
        &self,
        req: Request<rs::NodeReclaimSpaceRequest>,
    ) -> Result<Response<rs::NodeReclaimSpaceResponse>, Status> {
        let mut r = req.into_inner();
        let _secrets = Secrets::new(std::mem::take(&mut r.secrets));
        let done = logged("NodeReclaimSpace", &r.volume_id.clone(), async {
            let (volume, given) = self.command(&r)?;
            let done = self.locked(volume, given).await?;
            tracing::info!(volume = %r.volume_id, pre_bytes = done.pre_bytes,
                post_bytes = done.post_bytes, trimmed_bytes = done.trimmed_bytes,
                measure = ?done.measure, "space reclaimed");
            Ok(done)
        })
        .await?;
        Ok(Response::new(rs::NodeReclaimSpaceResponse {
            pre_usage: consumption(done.pre_bytes),
            post_usage: consumption(done.post_bytes),
        }))
    }
}

/// The running CSI-Addons server.
pub struct AddonsServer {
    endpoint: Endpoint,
    stop: oneshot::Sender<()>,
    task: JoinHandle<std::result::Result<(), tonic::transport::Error>>,
}

/// Binds `endpoint` and serves the CSI-Addons services on it. ReclaimSpaceNode only when this
/// instance serves the node side (`node` is Some).
pub fn spawn(
    endpoint: &Endpoint,
    identity: AddonsIdentity,
    node: Option<ReclaimSpaceNodeService>,
    max_connections: usize,
) -> std::result::Result<AddonsServer, String> {
    let listener = endpoint.bind()?;
    let router = crate::connections::server()
        .add_service(addons_id::identity_server::IdentityServer::new(identity))
        .add_optional_service(node.map(rs::reclaim_space_node_server::ReclaimSpaceNodeServer::new));
    let (stop, stopped) = oneshot::channel::<()>();
    // The same :authority fix as the CSI socket: grpcio (C-core >= 1.57) sends the socket path
    // there, and was reset with no status (a sixteenth fresh review's F4).
    let incoming = crate::connections::incoming(listener, max_connections)
        .map(|conn| conn.map(crate::authority_fix::AuthorityFix::new));
    let task = tokio::spawn(router.serve_with_incoming_shutdown(incoming, async {
        let _ = stopped.await;
    }));
    tracing::info!(endpoint = %endpoint, "serving CSI-Addons");
    Ok(AddonsServer {
        endpoint: endpoint.clone(),
        stop,
        task,
    })
}

impl AddonsServer {
    /// Stops accepting, lets in-flight calls finish within `grace`, removes the socket.
    pub async fn shutdown(self, grace: Duration) {
        let _ = self.stop.send(());
        match tokio::time::timeout(grace, self.task).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => tracing::error!(error = %e, "CSI-Addons server error while draining"),
            Ok(Err(e)) => tracing::error!(error = %e, "CSI-Addons server task failed"),
            Err(_) => tracing::warn!(?grace, "CSI-Addons calls still in flight at exit"),
        }
        self.endpoint.remove();
    }
}
