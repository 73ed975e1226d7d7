//! The admin service: `ebs-node-agent status` against a running agent.

use std::sync::Arc;

use ebs_proto::admin::admin_server::Admin;
use ebs_proto::admin::{StatusRequest, StatusResponse};
use ebs_store::Store;
use tonic::{Request, Response, Status};

use crate::error::{Error, blocking};

pub struct AdminService {
    pub store: Arc<Store>,
}

#[tonic::async_trait]
impl Admin for AdminService {
    async fn status(
        &self,
        _req: Request<StatusRequest>,
    ) -> Result<Response<StatusResponse>, Status> {
        let store = Arc::clone(&self.store);
        let value =
            blocking(move || crate::inventory::snapshot(&store).map_err(Error::from)).await?;
        Ok(Response::new(StatusResponse {
            json: value.to_string(),
        }))
    }
}
