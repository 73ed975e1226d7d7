//! CSI v0.3 (`csi.v0`, also what v0.2 clients speak) on the v1 socket. Every call becomes the
//! v1 request, runs through the very v1 service the socket serves (same validation, guards,
//! pipelines, logging and error mapping) and its answer is translated back. Nothing here knows
//! about volumes; the only logic is the renaming of fields.

pub mod controller;
pub mod identity;
pub mod node;

use prost::Message;
use tonic::Status;

/// Re-reads a message as a type with the same wire layout. CSI renamed fields between v0 and v1
/// but kept their numbers and types in the shared sub-messages (`VolumeCapability`, `Topology`,
/// `CapacityRange`, `Volume`): what one version lacks takes its default, what the other does
/// not know is dropped. The unit tests pin each pair this is used for.
pub fn recode<A: Message, B: Message + Default>(a: &A) -> Result<B, Status> {
    B::decode(a.encode_to_vec().as_slice()).map_err(|e| {
        Status::internal(format!(
            "translating to {}: {e}",
            std::any::type_name::<B>()
        ))
    })
}

/// `recode` for optional sub-messages.
pub fn recode_opt<A: Message, B: Message + Default>(a: Option<&A>) -> Result<Option<B>, Status> {
    a.map(recode).transpose()
}

/// `recode` for repeated sub-messages.
pub fn recode_all<A: Message, B: Message + Default>(a: &[A]) -> Result<Vec<B>, Status> {
    a.iter().map(recode).collect()
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use ebs_proto::csi::{v0, v1};

    #[test]
    fn capability_survives_both_ways() {
        let c0 = v0::VolumeCapability {
            access_type: Some(v0::volume_capability::AccessType::Mount(
                v0::volume_capability::MountVolume {
                    fs_type: "xfs".into(),
                    mount_flags: vec!["noatime".into()],
                },
            )),
            access_mode: Some(v0::volume_capability::AccessMode {
                mode: v0::volume_capability::access_mode::Mode::MultiNodeReaderOnly as i32,
            }),
        };
        let c1: v1::VolumeCapability = recode(&c0).unwrap();
        match c1.access_type.as_ref().unwrap() {
            v1::volume_capability::AccessType::Mount(m) => {
                assert_eq!(m.fs_type, "xfs");
                assert_eq!(m.mount_flags, ["noatime"]);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            c1.access_mode.unwrap().mode,
            v1::volume_capability::access_mode::Mode::MultiNodeReaderOnly as i32
        );
        let back: v0::VolumeCapability = recode(&c1).unwrap();
        assert_eq!(back, c0);
        let block0 = v0::VolumeCapability {
            access_type: Some(v0::volume_capability::AccessType::Block(
                v0::volume_capability::BlockVolume {},
            )),
            access_mode: None,
        };
        let block1: v1::VolumeCapability = recode(&block0).unwrap();
        assert!(matches!(
            block1.access_type,
            Some(v1::volume_capability::AccessType::Block(_))
        ));
    }

    #[test]
    fn v01_capability_is_v1_capability() {
        let c: ebs_proto::csi::VolumeCapability = ebs_proto::csi::VolumeCapability {
            access_type: Some(ebs_proto::csi::volume_capability::AccessType::Mount(
                ebs_proto::csi::volume_capability::MountVolume {
                    fs_type: "ext4".into(),
                    mount_flags: vec![],
                },
            )),
            access_mode: Some(ebs_proto::csi::volume_capability::AccessMode { mode: 1 }),
        };
        let c1: v1::VolumeCapability = recode(&c).unwrap();
        assert_eq!(c1.access_mode.unwrap().mode, 1);
        assert!(matches!(
            c1.access_type,
            Some(v1::volume_capability::AccessType::Mount(m)) if m.fs_type == "ext4"
        ));
    }

    #[test]
    fn volume_id_and_context_land_in_id_and_attributes() {
        let v1v = v1::Volume {
            capacity_bytes: 7 << 20,
            volume_id: "vol-1".into(),
            volume_context: HashMap::from([("k".into(), "v".into())]),
            content_source: Some(v1::VolumeContentSource {
                r#type: Some(v1::volume_content_source::Type::Snapshot(
                    v1::volume_content_source::SnapshotSource {
                        snapshot_id: "snap-1".into(),
                    },
                )),
            }),
            accessible_topology: vec![v1::Topology {
                segments: HashMap::from([("zone".into(), "a".into())]),
            }],
        };
        let v0v: v0::Volume = recode(&v1v).unwrap();
        assert_eq!(v0v.capacity_bytes, 7 << 20);
        assert_eq!(v0v.id, "vol-1");
        assert_eq!(v0v.attributes["k"], "v");
        assert_eq!(v0v.accessible_topology[0].segments["zone"], "a");
        match v0v.content_source.unwrap().r#type.unwrap() {
            v0::volume_content_source::Type::Snapshot(s) => assert_eq!(s.id, "snap-1"),
        }
    }

    #[test]
    fn capacity_range_keeps_both_bounds() {
        let r: v1::CapacityRange = recode(&v0::CapacityRange {
            required_bytes: 1,
            limit_bytes: 2,
        })
        .unwrap();
        assert_eq!((r.required_bytes, r.limit_bytes), (1, 2));
    }
}
