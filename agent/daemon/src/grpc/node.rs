//! The Node service: validate, take the volume's guard, run the domain step pipeline off the
//! executor, map the result.

use std::sync::Arc;
use std::time::{Duration, Instant};

use csi::node_server::Node;
use csi::node_service_capability::{self, rpc};
use ebs_proto::csi::v1 as csi;
use tonic::{Request, Response, Status};

use super::spec_order::{self, Rule};
use super::{capability, logged, to_status};
use crate::error::blocking;
use crate::node::{self, AgentCtx};
use ebs_node_backends::nodeinfo::NodeInfoSource;
use ebs_node_core::error::{Error, Result};
use ebs_node_core::node::{
    PublishCommand, StageCommand, UnpublishCommand, UnstageCommand, VolumeGuard, VolumeLocks,
    publish, require_known, stage, unpublish, unstage,
};
use ebs_node_core::request::{
    AccessType, Capability, FormatOptions, RequestPath, Roots, Secrets, ValidationError, VolumeId,
    check_map,
};

pub struct NodeService {
    pub ctx: Arc<AgentCtx>,
    pub roots: Arc<Roots>,
    pub info: Arc<NodeInfoSource>,
    pub device_wait: Duration,
    /// Volume paths with a NodeGetVolumeStats call running (see `stats_slot`).
    pub stats_in_flight: VolumeLocks,
}

impl NodeService {
    /// Runs `f` off the executor under the volume's guard; the command it builds owns the id.
    async fn locked<T, F>(&self, volume: VolumeId, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&AgentCtx, VolumeId) -> Result<T> + Send + 'static,
    {
        let key = volume.as_str().to_string();
        node::run_locked(&self.ctx, &key, move |ctx| f(ctx, volume)).await
    }

    /// The path checks that need no host access; the rest (resolving it through file
    /// descriptors) runs with the host work, off the executor.
    fn path(&self, field: &'static str, raw: &str) -> Result<RequestPath> {
        Ok(RequestPath::parse(field, raw, &self.roots)?)
    }

    fn optional_path(&self, field: &'static str, raw: &str) -> Result<Option<RequestPath>> {
        if raw.is_empty() {
            return Ok(None);
        }
        self.path(field, raw).map(Some)
    }

    /// One stats call per volume path at a time (kubelet asks for each pod's path of a volume,
    /// maybe at once). A path below a dead mount, or a device that stopped answering, keeps its
    /// blocking thread until the kernel lets go, and kubelet asks again every minute: unbounded,
    /// one hung volume would take a thread a minute until the pool ran dry for every volume.
    fn stats_slot(&self, volume: &VolumeId, path: &RequestPath) -> Result<VolumeGuard> {
        let path = path.as_path();
        self.stats_in_flight
            .try_lock(&format!("{volume}\0{}", path.display()))
            .ok_or_else(|| Error::StatsInFlight {
                volume: volume.to_string(),
                path: path.to_path_buf(),
            })
    }

    /// Steps 1 and 2 of `spec_order`: the REQUIRED fields, then the volume lookup (records
    /// only, off the executor). Paths and states come after, in the handlers.
    async fn admit<R: Rule>(&self, r: &R, volume_id: &str) -> Result<VolumeId> {
        spec_order::required(r)?;
        let volume = VolumeId::parse(volume_id)?;
        // A volume that needs attention may have records that do not decode: the check its
        // call runs first (`node::run_locked`) answers for it.
        if let Some(known) = R::LOOKUP
            && !self.ctx.attention.is_marked(volume.as_str())
        {
            let ctx = Arc::clone(&self.ctx);
            let v = volume.clone();
            blocking(move || require_known(&ctx, &v, known)).await?;
        }
        Ok(volume)
    }

    /// A path the volume must already be at (stats, expansion): one that cannot even be
    /// parsed is not one of the volume's, so NOT_FOUND, as for any other place it is not.
    fn volume_place(
        &self,
        volume: &VolumeId,
        field: &'static str,
        raw: &str,
    ) -> Result<Option<RequestPath>> {
        self.optional_path(field, raw)
            .map_err(|_| Error::PathNotFound {
                volume: volume.to_string(),
                path: std::path::PathBuf::from(raw),
            })
    }

    /// The checks of NodePublishVolume that need no host access, before any host work (v0.1's
    /// publish runs them before its internal stage, so a bad request changes nothing).
    pub async fn publish_command(
        &self,
        r: &csi::NodePublishVolumeRequest,
    ) -> Result<(VolumeId, CheckedPublish)> {
        let volume = self.admit(r, &r.volume_id).await?;
        if r.staging_target_path.is_empty() {
            return Err(Error::StagingPathRequired);
        }
        let staging = self.path("staging_target_path", &r.staging_target_path)?;
        let target = self.path("target_path", &r.target_path)?;
        let capability = capability::for_volume(r.volume_capability.as_ref(), &volume)?;
        check_map("publish_context", &r.publish_context)?;
        check_map("volume_context", &r.volume_context)?;
        let checked = CheckedPublish {
            staging,
            target,
            capability,
            readonly: r.readonly,
        };
        Ok((volume, checked))
    }

    fn deadline<T>(&self, req: &Request<T>) -> Instant {
        let wait = match super::grpc_timeout(req) {
            // Leave a little of the caller's budget for the answer to travel back.
            Some(t) => self
                .device_wait
                .min(t.saturating_sub(Duration::from_millis(200))),
            None => self.device_wait,
        };
        Instant::now() + wait
    }
}

/// NodePublishVolume after the checks that need no host access.
pub struct CheckedPublish {
    staging: RequestPath,
    target: RequestPath,
    capability: Capability,
    readonly: bool,
}

impl CheckedPublish {
    pub fn command(self, volume: VolumeId) -> PublishCommand {
        PublishCommand {
            volume,
            staging: self.staging,
            target: self.target,
            capability: self.capability,
            readonly: self.readonly,
        }
    }
}

#[tonic::async_trait]
impl Node for NodeService {
    async fn node_stage_volume(
        &self,
        req: Request<csi::NodeStageVolumeRequest>,
    ) -> Result<Response<csi::NodeStageVolumeResponse>, Status> {
        let deadline = self.deadline(&req);
        let mut r = req.into_inner();
        let _secrets = Secrets::new(std::mem::take(&mut r.secrets));
        logged("NodeStageVolume", &r.volume_id.clone(), async {
            let volume = self.admit(&r, &r.volume_id).await?;
            let staging = self.path("staging_target_path", &r.staging_target_path)?;
            let capability = capability::for_volume(r.volume_capability.as_ref(), &volume)?;
            check_map("publish_context", &r.publish_context)?;
            check_map("volume_context", &r.volume_context)?;
            let format = match &capability.access {
                AccessType::Mount { fs, .. } => FormatOptions::parse(*fs, &r.volume_context)?,
                AccessType::Block => FormatOptions::default(),
            };
            self.locked(volume, move |ctx, volume| {
                let cmd = StageCommand {
                    volume,
                    staging,
                    capability,
                    publish_context: r.publish_context,
                    volume_context: r.volume_context,
                    format,
                    deadline,
                };
                stage(ctx, &cmd)
            })
            .await
        })
        .await?;
        Ok(Response::new(csi::NodeStageVolumeResponse {}))
    }

    async fn node_unstage_volume(
        &self,
        req: Request<csi::NodeUnstageVolumeRequest>,
    ) -> Result<Response<csi::NodeUnstageVolumeResponse>, Status> {
        let r = req.into_inner();
        logged("NodeUnstageVolume", &r.volume_id.clone(), async {
            let volume = self.admit(&r, &r.volume_id).await?;
            let staging = self.path("staging_target_path", &r.staging_target_path)?;
            self.locked(volume, move |ctx, volume| {
                let cmd = UnstageCommand { volume, staging };
                unstage(ctx, &cmd)
            })
            .await
        })
        .await?;
        Ok(Response::new(csi::NodeUnstageVolumeResponse {}))
    }

    async fn node_publish_volume(
        &self,
        req: Request<csi::NodePublishVolumeRequest>,
    ) -> Result<Response<csi::NodePublishVolumeResponse>, Status> {
        let mut r = req.into_inner();
        let _secrets = Secrets::new(std::mem::take(&mut r.secrets));
        logged("NodePublishVolume", &r.volume_id.clone(), async {
            let (volume, checked) = self.publish_command(&r).await?;
            self.locked(volume, move |ctx, volume| {
                publish(ctx, &checked.command(volume))
            })
            .await
        })
        .await?;
        Ok(Response::new(csi::NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        req: Request<csi::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<csi::NodeUnpublishVolumeResponse>, Status> {
        let r = req.into_inner();
        logged("NodeUnpublishVolume", &r.volume_id.clone(), async {
            let volume = self.admit(&r, &r.volume_id).await?;
            let target = self.path("target_path", &r.target_path)?;
            self.locked(volume, move |ctx, volume| {
                let cmd = UnpublishCommand { volume, target };
                unpublish(ctx, &cmd)
            })
            .await
        })
        .await?;
        Ok(Response::new(csi::NodeUnpublishVolumeResponse {}))
    }

    async fn node_get_volume_stats(
        &self,
        req: Request<csi::NodeGetVolumeStatsRequest>,
    ) -> Result<Response<csi::NodeGetVolumeStatsResponse>, Status> {
        let r = req.into_inner();
        let stats = logged("NodeGetVolumeStats", &r.volume_id.clone(), async {
            let volume = self.admit(&r, &r.volume_id).await?;
            let volume_path = self.volume_place(&volume, "volume_path", &r.volume_path)?;
            let volume_path = volume_path.ok_or(ValidationError::Missing("volume_path"))?;
            let staging =
                self.volume_place(&volume, "staging_target_path", &r.staging_target_path)?;
            // No volume guard: stats are read-only (see node::stats).
            self.ctx.ready()?;
            node::refuse_if_marked(&self.ctx, volume.as_str())?;
            let running = self.stats_slot(&volume, &volume_path)?;
            let ctx = Arc::clone(&self.ctx);
            blocking(move || {
                let _running = running;
                let cmd = ebs_node_core::node::stats::StatsCommand {
                    volume,
                    volume_path,
                    staging,
                };
                ebs_node_core::node::stats::volume_stats(&ctx, &cmd)
            })
            .await
        })
        .await?;
        Ok(Response::new(super::node_stats::response(stats)))
    }

    async fn node_expand_volume(
        &self,
        req: Request<csi::NodeExpandVolumeRequest>,
    ) -> Result<Response<csi::NodeExpandVolumeResponse>, Status> {
        let mut r = req.into_inner();
        let _secrets = Secrets::new(std::mem::take(&mut r.secrets));
        let bytes = logged("NodeExpandVolume", &r.volume_id.clone(), async {
            let volume = self.admit(&r, &r.volume_id).await?;
            let volume_path = self.volume_place(&volume, "volume_path", &r.volume_path)?;
            let volume_path = volume_path.ok_or(ValidationError::Missing("volume_path"))?;
            let staging =
                self.volume_place(&volume, "staging_target_path", &r.staging_target_path)?;
            let (required_bytes, limit_bytes) =
                super::node_stats::capacity_range(r.capacity_range.as_ref())?;
            let capability = match r.volume_capability.as_ref() {
                Some(c) => Some(capability::for_volume(Some(c), &volume)?),
                None => None,
            };
            self.locked(volume, move |ctx, volume| {
                let cmd = ebs_node_core::node::expand::ExpandCommand {
                    volume,
                    volume_path,
                    staging,
                    required_bytes,
                    limit_bytes,
                    capability,
                };
                ebs_node_core::node::expand::expand(ctx, &cmd)
            })
            .await
        })
        .await?;
        Ok(Response::new(csi::NodeExpandVolumeResponse {
            capacity_bytes: bytes as i64,
        }))
    }

    async fn node_get_capabilities(
        &self,
        _req: Request<csi::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<csi::NodeGetCapabilitiesResponse>, Status> {
        let cap = |t: rpc::Type| csi::NodeServiceCapability {
            r#type: Some(node_service_capability::Type::Rpc(
                node_service_capability::Rpc { r#type: t as i32 },
            )),
        };
        Ok(Response::new(csi::NodeGetCapabilitiesResponse {
            capabilities: vec![
                cap(rpc::Type::StageUnstageVolume),
                cap(rpc::Type::GetVolumeStats),
                cap(rpc::Type::ExpandVolume),
                cap(rpc::Type::VolumeCondition),
                cap(rpc::Type::SingleNodeMultiWriter),
            ],
        }))
    }

    async fn node_get_info(
        &self,
        _req: Request<csi::NodeGetInfoRequest>,
    ) -> Result<Response<csi::NodeGetInfoResponse>, Status> {
        let info = self.info.get().map_err(|e| to_status(&e))?;
        Ok(Response::new(csi::NodeGetInfoResponse {
            node_id: info.node_id,
            max_volumes_per_node: info.max_volumes,
            accessible_topology: Some(csi::Topology {
                segments: info.topology,
            }),
        }))
    }
}
