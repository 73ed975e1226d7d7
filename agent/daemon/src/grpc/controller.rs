//! The loop backend's Controller service: translation to and from `LoopController`.

use std::collections::HashMap;
use std::sync::Arc;

use csi::controller_server::Controller;
use csi::controller_service_capability::{self, rpc};
use ebs_node_core::records::LoopVolume;
use ebs_proto::csi::v1 as csi;
use tonic::{Request, Response, Status};

use super::spec_order::required;
use super::{capability, logged};
use crate::error::blocking;
use ebs_node_backends::loopback::{CreateVolume, LoopController, TOPOLOGY_KEY};
use ebs_node_core::error::{Error, Result};
use ebs_node_core::node::{VolumeGuard, VolumeLocks};
use ebs_node_core::request::{Capability, MAX_STRING_BYTES, ValidationError, VolumeId, check_map};

pub struct LoopControllerService {
    pub controller: Arc<LoopController>,
    /// The node's per-volume guards: a snapshot or clone of a volume must not overlap a stage
    /// or unstage of it (its filesystem is frozen for the copy), nor two creations of a name;
    /// a detach or a delete never overlaps a node call on the volume.
    pub locks: VolumeLocks,
}

fn unimplemented<T>(what: &str) -> Result<Response<T>, Status> {
    Err(Status::unimplemented(format!(
        "{what} is not supported by the loop backend"
    )))
}

impl LoopControllerService {
    fn to_volume(&self, v: &LoopVolume) -> csi::Volume {
        csi::Volume {
            capacity_bytes: v.capacity_bytes as i64,
            volume_id: v.id.clone(),
            volume_context: v.parameters.clone().into_iter().collect(),
            content_source: v
                .content_source
                .as_ref()
                .map(super::loop_snapshots::content_source),
            accessible_topology: vec![csi::Topology {
                segments: HashMap::from([(
                    TOPOLOGY_KEY.to_string(),
                    self.controller.node_id().to_string(),
                )]),
            }],
        }
    }

    pub(super) async fn run<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&LoopController) -> Result<T> + Send + 'static,
    {
        let c = Arc::clone(&self.controller);
        blocking(move || f(&c)).await
    }

    /// The guards a call holds while it runs (ABORTED when another call holds one).
    pub(super) fn guard(&self, keys: &[String]) -> Result<Vec<VolumeGuard>> {
        keys.iter()
            .map(|k| {
                self.locks
                    .try_lock(k)
                    .ok_or_else(|| Error::OperationPending { key: k.clone() })
            })
            .collect()
    }
}

/// The guard key of a name being created (volume ids and names cannot clash: ids have no '/').
pub(super) fn name_key(kind: &str, name: &str) -> String {
    format!("{kind}/{name}")
}

fn capabilities(caps: &[csi::VolumeCapability]) -> Result<Vec<Capability>> {
    if caps.is_empty() {
        return Err(ValidationError::Missing("volume_capabilities").into());
    }
    caps.iter()
        .map(|c| capability::parse(Some(c)).map_err(Error::from))
        .collect()
}

#[tonic::async_trait]
impl Controller for LoopControllerService {
    async fn create_volume(
        &self,
        req: Request<csi::CreateVolumeRequest>,
    ) -> Result<Response<csi::CreateVolumeResponse>, Status> {
        let r = req.into_inner();
        let v = logged("CreateVolume", &r.name.clone(), async {
            required(&r)?;
            if r.name.len() > MAX_STRING_BYTES || r.name.chars().any(|c| c.is_control()) {
                return Err(ValidationError::bad(
                    "name",
                    r.name.clone(),
                    "too long or has control characters",
                )
                .into());
            }
            let source = super::loop_snapshots::source(r.volume_content_source.as_ref())?;
            let caps = capabilities(&r.volume_capabilities)?;
            check_map("parameters", &r.parameters)?;
            let (required_bytes, limit_bytes) =
                super::node_stats::capacity_range(r.capacity_range.as_ref())?;
            let mut keys = vec![name_key("volume", &r.name)];
            if let Some(ebs_node_core::records::LoopSource::Volume { id }) = &source {
                keys.push(id.clone());
            }
            let guards = self.guard(&keys)?;
            let create = CreateVolume {
                name: r.name,
                required_bytes,
                limit_bytes,
                parameters: r.parameters,
                source,
                filesystems: caps.iter().filter_map(|c| c.fs()).collect(),
            };
            self.run(move |c| {
                let _guards = guards;
                c.create(create)
            })
            .await
        })
        .await?;
        Ok(Response::new(csi::CreateVolumeResponse {
            volume: Some(self.to_volume(&v)),
        }))
    }

    async fn delete_volume(
        &self,
        req: Request<csi::DeleteVolumeRequest>,
    ) -> Result<Response<csi::DeleteVolumeResponse>, Status> {
        let r = req.into_inner();
        logged("DeleteVolume", &r.volume_id.clone(), async {
            required(&r)?;
            let id = VolumeId::parse(&r.volume_id)?;
            // The node's guard of the volume: never while a node call (or a copy) uses it.
            let guards = self.guard(&[id.to_string()])?;
            self.run(move |c| {
                let _guards = guards;
                c.delete(id.as_str())
            })
            .await
        })
        .await?;
        Ok(Response::new(csi::DeleteVolumeResponse {}))
    }

    async fn controller_publish_volume(
        &self,
        req: Request<csi::ControllerPublishVolumeRequest>,
    ) -> Result<Response<csi::ControllerPublishVolumeResponse>, Status> {
        let r = req.into_inner();
        let device = logged("ControllerPublishVolume", &r.volume_id.clone(), async {
            required(&r)?;
            let id = VolumeId::parse(&r.volume_id)?;
            capability::parse(r.volume_capability.as_ref())?;
            let node = r.node_id;
            let readonly = r.readonly;
            self.run(move |c| c.publish(id.as_str(), &node, readonly))
                .await
        })
        .await?;
        Ok(Response::new(csi::ControllerPublishVolumeResponse {
            publish_context: HashMap::from([(
                "devicePath".to_string(),
                device.display().to_string(),
            )]),
        }))
    }

    async fn controller_unpublish_volume(
        &self,
        req: Request<csi::ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<csi::ControllerUnpublishVolumeResponse>, Status> {
        let r = req.into_inner();
        logged("ControllerUnpublishVolume", &r.volume_id.clone(), async {
            required(&r)?;
            let id = VolumeId::parse(&r.volume_id)?;
            let node = r.node_id;
            // The node's guard of the volume: a detach never runs while a stage (or any node
            // call) is between resolving the device and recording what it did.
            let guards = self.guard(&[id.to_string()])?;
            self.run(move |c| {
                let _guards = guards;
                c.unpublish(id.as_str(), &node)
            })
            .await
        })
        .await?;
        Ok(Response::new(csi::ControllerUnpublishVolumeResponse {}))
    }

    async fn validate_volume_capabilities(
        &self,
        req: Request<csi::ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<csi::ValidateVolumeCapabilitiesResponse>, Status> {
        let r = req.into_inner();
        let resp = logged("ValidateVolumeCapabilities", &r.volume_id.clone(), async {
            required(&r)?;
            let id = VolumeId::parse(&r.volume_id)?;
            self.run(move |c| c.get(id.as_str())).await?;
            Ok(match capabilities(&r.volume_capabilities) {
                Ok(_) => csi::ValidateVolumeCapabilitiesResponse {
                    confirmed: Some(csi::validate_volume_capabilities_response::Confirmed {
                        volume_context: r.volume_context,
                        volume_capabilities: r.volume_capabilities,
                        parameters: r.parameters,
                        mutable_parameters: r.mutable_parameters,
                    }),
                    message: String::new(),
                },
                Err(e) => csi::ValidateVolumeCapabilitiesResponse {
                    confirmed: None,
                    message: e.to_string(),
                },
            })
        })
        .await?;
        Ok(Response::new(resp))
    }

    async fn list_volumes(
        &self,
        req: Request<csi::ListVolumesRequest>,
    ) -> Result<Response<csi::ListVolumesResponse>, Status> {
        let r = req.into_inner();
        let page = logged("ListVolumes", "", async {
            if r.max_entries < 0 {
                return Err(ValidationError::bad(
                    "max_entries",
                    r.max_entries.to_string(),
                    "must not be negative",
                )
                .into());
            }
            let max = r.max_entries as usize;
            let token = r.starting_token;
            self.run(move |c| c.list(max, &token)).await
        })
        .await?;
        let entries = page
            .entries
            .iter()
            .map(|v| csi::list_volumes_response::Entry {
                volume: Some(self.to_volume(v)),
                status: Some(csi::list_volumes_response::VolumeStatus {
                    published_node_ids: v.attachment.iter().map(|a| a.node_id.clone()).collect(),
                    volume_condition: None,
                }),
            })
            .collect();
        Ok(Response::new(csi::ListVolumesResponse {
            entries,
            next_token: page.next_token,
        }))
    }

    async fn get_capacity(
        &self,
        _req: Request<csi::GetCapacityRequest>,
    ) -> Result<Response<csi::GetCapacityResponse>, Status> {
        let free = logged("GetCapacity", "", self.run(|c| c.capacity())).await?;
        Ok(Response::new(csi::GetCapacityResponse {
            available_capacity: free as i64,
            maximum_volume_size: Some(free as i64),
            minimum_volume_size: Some(1 << 20),
        }))
    }

    async fn controller_get_capabilities(
        &self,
        _req: Request<csi::ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<csi::ControllerGetCapabilitiesResponse>, Status> {
        let cap = |t: rpc::Type| csi::ControllerServiceCapability {
            r#type: Some(controller_service_capability::Type::Rpc(
                controller_service_capability::Rpc { r#type: t as i32 },
            )),
        };
        Ok(Response::new(csi::ControllerGetCapabilitiesResponse {
            capabilities: vec![
                cap(rpc::Type::CreateDeleteVolume),
                cap(rpc::Type::PublishUnpublishVolume),
                cap(rpc::Type::ListVolumes),
                cap(rpc::Type::ListVolumesPublishedNodes),
                cap(rpc::Type::GetCapacity),
                cap(rpc::Type::ExpandVolume),
                cap(rpc::Type::SingleNodeMultiWriter),
                cap(rpc::Type::CreateDeleteSnapshot),
                cap(rpc::Type::ListSnapshots),
                cap(rpc::Type::GetSnapshot),
                cap(rpc::Type::CloneVolume),
                cap(rpc::Type::PublishReadonly),
            ],
        }))
    }

    async fn controller_expand_volume(
        &self,
        req: Request<csi::ControllerExpandVolumeRequest>,
    ) -> Result<Response<csi::ControllerExpandVolumeResponse>, Status> {
        let r = req.into_inner();
        let (size, block) = logged("ControllerExpandVolume", &r.volume_id.clone(), async {
            required(&r)?;
            let id = VolumeId::parse(&r.volume_id)?;
            let (required, limit) = super::node_stats::capacity_range(r.capacity_range.as_ref())?;
            if required == 0 && limit == 0 {
                return Err(ValidationError::Missing("capacity_range").into());
            }
            let block = match r.volume_capability.as_ref() {
                Some(c) => capability::parse(Some(c))?.is_block(),
                None => false,
            };
            let size = self
                .run(move |c| c.expand(id.as_str(), required, limit))
                .await?;
            Ok((size, block))
        })
        .await?;
        Ok(Response::new(csi::ControllerExpandVolumeResponse {
            capacity_bytes: size as i64,
            node_expansion_required: !block,
        }))
    }

    async fn create_snapshot(
        &self,
        req: Request<csi::CreateSnapshotRequest>,
    ) -> Result<Response<csi::CreateSnapshotResponse>, Status> {
        let r = req.into_inner();
        let snapshot = logged("CreateSnapshot", &r.source_volume_id.clone(), async {
            required(&r)?;
            self.create_snapshot(r).await
        })
        .await?;
        Ok(Response::new(csi::CreateSnapshotResponse {
            snapshot: Some(snapshot),
        }))
    }

    async fn delete_snapshot(
        &self,
        req: Request<csi::DeleteSnapshotRequest>,
    ) -> Result<Response<csi::DeleteSnapshotResponse>, Status> {
        let r = req.into_inner();
        logged("DeleteSnapshot", &r.snapshot_id.clone(), async {
            required(&r)?;
            self.delete_snapshot(r.snapshot_id).await
        })
        .await?;
        Ok(Response::new(csi::DeleteSnapshotResponse {}))
    }

    async fn list_snapshots(
        &self,
        req: Request<csi::ListSnapshotsRequest>,
    ) -> Result<Response<csi::ListSnapshotsResponse>, Status> {
        let r = req.into_inner();
        let resp = logged("ListSnapshots", "", self.list_snapshots(r)).await?;
        Ok(Response::new(resp))
    }

    async fn get_snapshot(
        &self,
        req: Request<csi::GetSnapshotRequest>,
    ) -> Result<Response<csi::GetSnapshotResponse>, Status> {
        let r = req.into_inner();
        let snapshot = logged("GetSnapshot", &r.snapshot_id.clone(), async {
            required(&r)?;
            self.get_snapshot(r.snapshot_id).await
        })
        .await?;
        Ok(Response::new(csi::GetSnapshotResponse {
            snapshot: Some(snapshot),
        }))
    }

    async fn controller_get_volume(
        &self,
        _r: Request<csi::ControllerGetVolumeRequest>,
    ) -> Result<Response<csi::ControllerGetVolumeResponse>, Status> {
        unimplemented("ControllerGetVolume")
    }

    async fn controller_modify_volume(
        &self,
        _r: Request<csi::ControllerModifyVolumeRequest>,
    ) -> Result<Response<csi::ControllerModifyVolumeResponse>, Status> {
        unimplemented("ControllerModifyVolume")
    }
}
