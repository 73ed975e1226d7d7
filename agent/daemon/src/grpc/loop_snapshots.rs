//! The loop backend's snapshot calls and volume sources: translation to and from the
//! controller's snapshot records.

use csi::volume_content_source::{SnapshotSource, Type, VolumeSource};
use ebs_node_core::records::{LoopSnapshot, LoopSource};
use ebs_proto::csi::v1 as csi;

use super::controller::{LoopControllerService, name_key};
use ebs_node_backends::loopback::SnapshotQuery;
use ebs_node_core::error::Result;
use ebs_node_core::request::{MAX_STRING_BYTES, ValidationError, VolumeId};

/// A CreateVolume source as the controller records it. A source without an id, or of a kind
/// this plugin does not know, is INVALID_ARGUMENT, the spec's code for an unsupported source.
pub fn source(s: Option<&csi::VolumeContentSource>) -> Result<Option<LoopSource>> {
    let Some(s) = s else { return Ok(None) };
    let (field, id, make): (_, _, fn(String) -> LoopSource) = match &s.r#type {
        Some(Type::Snapshot(x)) => (
            "volume_content_source.snapshot.snapshot_id",
            &x.snapshot_id,
            |id| LoopSource::Snapshot { id },
        ),
        Some(Type::Volume(x)) => (
            "volume_content_source.volume.volume_id",
            &x.volume_id,
            |id| LoopSource::Volume { id },
        ),
        None => {
            return Err(ValidationError::bad(
                "volume_content_source",
                "",
                "it names neither a snapshot nor a volume",
            )
            .into());
        }
    };
    if id.is_empty() {
        return Err(ValidationError::Missing(field).into());
    }
    Ok(Some(make(id.clone())))
}

pub fn content_source(s: &LoopSource) -> csi::VolumeContentSource {
    let r#type = match s {
        LoopSource::Snapshot { id } => Type::Snapshot(SnapshotSource {
            snapshot_id: id.clone(),
        }),
        LoopSource::Volume { id } => Type::Volume(VolumeSource {
            volume_id: id.clone(),
        }),
    };
    csi::VolumeContentSource {
        r#type: Some(r#type),
    }
}

fn to_snapshot(s: &LoopSnapshot) -> csi::Snapshot {
    let ms = s.created_unix_ms;
    csi::Snapshot {
        size_bytes: s.size_bytes as i64,
        snapshot_id: s.id.clone(),
        source_volume_id: s.source_volume_id.clone(),
        creation_time: Some(prost_types::Timestamp {
            seconds: (ms / 1000) as i64,
            nanos: ((ms % 1000) * 1_000_000) as i32,
        }),
        ready_to_use: s.ready,
        group_snapshot_id: String::new(),
    }
}

impl LoopControllerService {
    pub(super) async fn create_snapshot(
        &self,
        r: csi::CreateSnapshotRequest,
    ) -> Result<csi::Snapshot> {
        if r.name.len() > MAX_STRING_BYTES || r.name.chars().any(|c| c.is_control()) {
            return Err(
                ValidationError::bad("name", r.name, "too long or has control characters").into(),
            );
        }
        let volume = VolumeId::parse(&r.source_volume_id)?;
        if let Some(k) = r.parameters.keys().next() {
            return Err(ValidationError::bad(
                "parameters",
                k.clone(),
                "the loop backend takes no snapshot parameters",
            )
            .into());
        }
        let guards = self.guard(&[volume.to_string(), name_key("snapshot", &r.name)])?;
        let s = self
            .run(move |c| {
                let _guards = guards;
                c.create_snapshot(&r.name, volume.as_str())
            })
            .await?;
        Ok(to_snapshot(&s))
    }

    pub(super) async fn delete_snapshot(&self, id: String) -> Result<()> {
        let lookup = id.clone();
        let name: Option<String> = self
            .run(move |c| Ok(c.get_snapshot(&lookup).ok().map(|s| s.name)))
            .await?;
        // A snapshot still being taken is not pulled from under its copy.
        let guards = match name {
            Some(n) => self.guard(&[name_key("snapshot", &n)])?,
            None => Vec::new(),
        };
        self.run(move |c| {
            let _guards = guards;
            c.delete_snapshot(&id)
        })
        .await
    }

    pub(super) async fn get_snapshot(&self, id: String) -> Result<csi::Snapshot> {
        let s = self.run(move |c| c.get_snapshot(&id)).await?;
        Ok(to_snapshot(&s))
    }

    pub(super) async fn list_snapshots(
        &self,
        r: csi::ListSnapshotsRequest,
    ) -> Result<csi::ListSnapshotsResponse> {
        if r.max_entries < 0 {
            return Err(ValidationError::bad(
                "max_entries",
                r.max_entries.to_string(),
                "must not be negative",
            )
            .into());
        }
        let q = SnapshotQuery {
            snapshot_id: r.snapshot_id,
            source_volume_id: r.source_volume_id,
            max_entries: r.max_entries as usize,
            starting_token: r.starting_token,
        };
        let page = self.run(move |c| c.list_snapshots(&q)).await?;
        Ok(csi::ListSnapshotsResponse {
            entries: page
                .entries
                .iter()
                .map(|s| csi::list_snapshots_response::Entry {
                    snapshot: Some(to_snapshot(s)),
                })
                .collect(),
            next_token: page.next_token,
        })
    }
}
