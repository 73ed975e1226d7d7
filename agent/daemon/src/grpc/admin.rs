//! The admin service: `ebs-node-agent status` against a running agent, and the settings a client
//! (the bench) checks before it creates anything.

use std::path::PathBuf;
use std::sync::Arc;

use ebs_proto::admin::admin_server::Admin;
use ebs_proto::admin::{ConfigRequest, ConfigResponse, StatusRequest, StatusResponse};
use ebs_store::Store;
use tonic::{Request, Response, Status};

use crate::error::blocking;
use crate::settings::{BackendKind, Mode};
use ebs_node_core::error::Error;

pub struct AdminService {
    pub store: Arc<Store>,
    pub state_dir: PathBuf,
    pub allowed: Vec<PathBuf>,
    pub backend: BackendKind,
    pub mode: Mode,
    /// For the volumes that need attention, which only the running agent knows.
    pub node: Arc<crate::node::AgentCtx>,
}

#[tonic::async_trait]
impl Admin for AdminService {
    async fn status(
        &self,
        _req: Request<StatusRequest>,
    ) -> Result<Response<StatusResponse>, Status> {
        let store = Arc::clone(&self.store);
        let mut value = blocking(move || crate::inventory::snapshot(&store).map_err(Error::from))
            .await
            .map_err(|e| crate::grpc::to_status(&e))?;
        crate::inventory::add_attention(&mut value, self.node.attention.snapshot());
        Ok(Response::new(StatusResponse {
            json: value.to_string(),
        }))
    }

    async fn config(
        &self,
        _req: Request<ConfigRequest>,
    ) -> Result<Response<ConfigResponse>, Status> {
        let path = |p: &PathBuf| p.display().to_string();
        Ok(Response::new(ConfigResponse {
            state_dir: path(&self.state_dir),
            allowed_path_prefixes: self.allowed.iter().map(path).collect(),
            backend: self.backend.name().into(),
            mode: self.mode.name().into(),
            version: env!("CARGO_PKG_VERSION").into(),
        }))
    }
}
