//! v0.3 Controller: the calls of whichever v1 Controller this socket serves (the loop backend's
//! or the upstream shim), under their old field names. Snapshots translate their status
//! (`ready_to_use` ↔ READY/UPLOADING) and creation time (Timestamp ↔ Unix nanoseconds).

use std::sync::Arc;

use ebs_proto::csi::v0;
use ebs_proto::csi::v1::{self, controller_server::Controller as V1Controller};
use tonic::{Request, Response, Status};
use v0::controller_server::Controller;

use super::{recode_all, recode_opt};

pub struct V0Controller {
    pub v1: Arc<dyn V1Controller>,
}

/// v1 controller capabilities that v0.3 can name: CREATE_DELETE_VOLUME through LIST_SNAPSHOTS
/// carry the same numbers (1-6) in both.
pub fn controller_capabilities(
    caps: &[v1::ControllerServiceCapability],
) -> Vec<v0::ControllerServiceCapability> {
    use v1::controller_service_capability::Type;
    caps.iter()
        .filter_map(|c| match &c.r#type {
            Some(Type::Rpc(r)) if (1..=6).contains(&r.r#type) => {
                Some(v0::ControllerServiceCapability {
                    r#type: Some(v0::controller_service_capability::Type::Rpc(
                        v0::controller_service_capability::Rpc { r#type: r.r#type },
                    )),
                })
            }
            _ => None,
        })
        .collect()
}

fn snapshot(s: v1::Snapshot) -> v0::Snapshot {
    use v0::snapshot_status::Type;
    let created_at = s
        .creation_time
        .map(|t| t.seconds.saturating_mul(1_000_000_000) + i64::from(t.nanos))
        .unwrap_or(0);
    v0::Snapshot {
        size_bytes: s.size_bytes,
        id: s.snapshot_id,
        source_volume_id: s.source_volume_id,
        created_at,
        status: Some(v0::SnapshotStatus {
            r#type: if s.ready_to_use {
                Type::Ready
            } else {
                Type::Uploading
            } as i32,
            details: String::new(),
        }),
    }
}

fn volume(v: Option<&v1::Volume>) -> Result<Option<v0::Volume>, Status> {
    recode_opt(v)
}

#[tonic::async_trait]
impl Controller for V0Controller {
    async fn create_volume(
        &self,
        req: Request<v0::CreateVolumeRequest>,
    ) -> Result<Response<v0::CreateVolumeResponse>, Status> {
        let (meta, ext, r) = req.into_parts();
        let v1req = v1::CreateVolumeRequest {
            name: r.name,
            capacity_range: recode_opt(r.capacity_range.as_ref())?,
            volume_capabilities: recode_all(&r.volume_capabilities)?,
            parameters: r.parameters,
            secrets: r.controller_create_secrets,
            volume_content_source: recode_opt(r.volume_content_source.as_ref())?,
            accessibility_requirements: recode_opt(r.accessibility_requirements.as_ref())?,
            mutable_parameters: Default::default(),
        };
        let out = self
            .v1
            .create_volume(Request::from_parts(meta, ext, v1req))
            .await?
            .into_inner();
        Ok(Response::new(v0::CreateVolumeResponse {
            volume: volume(out.volume.as_ref())?,
        }))
    }

    async fn delete_volume(
        &self,
        req: Request<v0::DeleteVolumeRequest>,
    ) -> Result<Response<v0::DeleteVolumeResponse>, Status> {
        self.v1
            .delete_volume(req.map(|r| v1::DeleteVolumeRequest {
                volume_id: r.volume_id,
                secrets: r.controller_delete_secrets,
            }))
            .await?;
        Ok(Response::new(v0::DeleteVolumeResponse {}))
    }

    async fn controller_publish_volume(
        &self,
        req: Request<v0::ControllerPublishVolumeRequest>,
    ) -> Result<Response<v0::ControllerPublishVolumeResponse>, Status> {
        let (meta, ext, r) = req.into_parts();
        let v1req = v1::ControllerPublishVolumeRequest {
            volume_id: r.volume_id,
            node_id: r.node_id,
            volume_capability: recode_opt(r.volume_capability.as_ref())?,
            readonly: r.readonly,
            secrets: r.controller_publish_secrets,
            volume_context: r.volume_attributes,
        };
        let out = self
            .v1
            .controller_publish_volume(Request::from_parts(meta, ext, v1req))
            .await?
            .into_inner();
        Ok(Response::new(v0::ControllerPublishVolumeResponse {
            publish_info: out.publish_context,
        }))
    }

    async fn controller_unpublish_volume(
        &self,
        req: Request<v0::ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<v0::ControllerUnpublishVolumeResponse>, Status> {
        self.v1
            .controller_unpublish_volume(req.map(|r| v1::ControllerUnpublishVolumeRequest {
                volume_id: r.volume_id,
                node_id: r.node_id,
                secrets: r.controller_unpublish_secrets,
            }))
            .await?;
        Ok(Response::new(v0::ControllerUnpublishVolumeResponse {}))
    }

    async fn validate_volume_capabilities(
        &self,
        req: Request<v0::ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<v0::ValidateVolumeCapabilitiesResponse>, Status> {
        let (meta, ext, r) = req.into_parts();
        // accessible_topology has no v1 counterpart here: v1 checks topology at publish time.
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
        Ok(Response::new(v0::ValidateVolumeCapabilitiesResponse {
            supported: out.confirmed.is_some(),
            message: out.message,
        }))
    }

    async fn list_volumes(
        &self,
        req: Request<v0::ListVolumesRequest>,
    ) -> Result<Response<v0::ListVolumesResponse>, Status> {
        let out = self
            .v1
            .list_volumes(req.map(|r| v1::ListVolumesRequest {
                max_entries: r.max_entries,
                starting_token: r.starting_token,
            }))
            .await?
            .into_inner();
        let entries = out
            .entries
            .iter()
            .map(|e| {
                Ok(v0::list_volumes_response::Entry {
                    volume: volume(e.volume.as_ref())?,
                })
            })
            .collect::<Result<_, Status>>()?;
        Ok(Response::new(v0::ListVolumesResponse {
            entries,
            next_token: out.next_token,
        }))
    }

    async fn get_capacity(
        &self,
        req: Request<v0::GetCapacityRequest>,
    ) -> Result<Response<v0::GetCapacityResponse>, Status> {
        let (meta, ext, r) = req.into_parts();
        let v1req = v1::GetCapacityRequest {
            volume_capabilities: recode_all(&r.volume_capabilities)?,
            parameters: r.parameters,
            accessible_topology: recode_opt(r.accessible_topology.as_ref())?,
        };
        let out = self
            .v1
            .get_capacity(Request::from_parts(meta, ext, v1req))
            .await?
            .into_inner();
        Ok(Response::new(v0::GetCapacityResponse {
            available_capacity: out.available_capacity,
        }))
    }

    async fn controller_get_capabilities(
        &self,
        req: Request<v0::ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<v0::ControllerGetCapabilitiesResponse>, Status> {
        let out = self
            .v1
            .controller_get_capabilities(req.map(|_| v1::ControllerGetCapabilitiesRequest {}))
            .await?
            .into_inner();
        Ok(Response::new(v0::ControllerGetCapabilitiesResponse {
            capabilities: controller_capabilities(&out.capabilities),
        }))
    }

    async fn create_snapshot(
        &self,
        req: Request<v0::CreateSnapshotRequest>,
    ) -> Result<Response<v0::CreateSnapshotResponse>, Status> {
        let out = self
            .v1
            .create_snapshot(req.map(|r| v1::CreateSnapshotRequest {
                source_volume_id: r.source_volume_id,
                name: r.name,
                secrets: r.create_snapshot_secrets,
                parameters: r.parameters,
            }))
            .await?
            .into_inner();
        Ok(Response::new(v0::CreateSnapshotResponse {
            snapshot: out.snapshot.map(snapshot),
        }))
    }

    async fn delete_snapshot(
        &self,
        req: Request<v0::DeleteSnapshotRequest>,
    ) -> Result<Response<v0::DeleteSnapshotResponse>, Status> {
        self.v1
            .delete_snapshot(req.map(|r| v1::DeleteSnapshotRequest {
                snapshot_id: r.snapshot_id,
                secrets: r.delete_snapshot_secrets,
            }))
            .await?;
        Ok(Response::new(v0::DeleteSnapshotResponse {}))
    }

    async fn list_snapshots(
        &self,
        req: Request<v0::ListSnapshotsRequest>,
    ) -> Result<Response<v0::ListSnapshotsResponse>, Status> {
        let out = self
            .v1
            .list_snapshots(req.map(|r| v1::ListSnapshotsRequest {
                max_entries: r.max_entries,
                starting_token: r.starting_token,
                source_volume_id: r.source_volume_id,
                snapshot_id: r.snapshot_id,
                secrets: Default::default(),
            }))
            .await?
            .into_inner();
        Ok(Response::new(v0::ListSnapshotsResponse {
            entries: out
                .entries
                .into_iter()
                .map(|e| v0::list_snapshots_response::Entry {
                    snapshot: e.snapshot.map(snapshot),
                })
                .collect(),
            next_token: out.next_token,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_time_and_status() {
        let s = snapshot(v1::Snapshot {
            size_bytes: 5,
            snapshot_id: "snap".into(),
            source_volume_id: "vol".into(),
            creation_time: Some(prost_types::Timestamp {
                seconds: 2,
                nanos: 7,
            }),
            ready_to_use: true,
            group_snapshot_id: String::new(),
        });
        assert_eq!(s.created_at, 2_000_000_007);
        assert_eq!(s.id, "snap");
        assert_eq!(
            s.status.unwrap().r#type,
            v0::snapshot_status::Type::Ready as i32
        );
    }

    #[test]
    fn capabilities_keep_what_v0_names() {
        let cap = |t: i32| v1::ControllerServiceCapability {
            r#type: Some(v1::controller_service_capability::Type::Rpc(
                v1::controller_service_capability::Rpc { r#type: t },
            )),
        };
        let v0caps = controller_capabilities(&[cap(1), cap(3), cap(9), cap(13)]);
        let kinds: Vec<i32> = v0caps
            .iter()
            .map(|c| match c.r#type.as_ref().unwrap() {
                v0::controller_service_capability::Type::Rpc(r) => r.r#type,
            })
            .collect();
        assert_eq!(kinds, [1, 3]);
    }
}
