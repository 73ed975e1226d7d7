//! CSI v1's `VolumeCapability` read into the core's raw form, which the core validates
//! (`request::Capability::parse`). The v0 doors convert to v1 first, so this is the one place
//! a capability leaves the wire.

use ebs_node_core::request::{Capability, RawAccess, RawCapability, ValidationError, VolumeId};
use ebs_proto::csi::v1 as csi;

fn raw(cap: &csi::VolumeCapability) -> RawCapability<'_> {
    RawCapability {
        access: cap.access_type.as_ref().map(|access| match access {
            csi::volume_capability::AccessType::Block(_) => RawAccess::Block,
            csi::volume_capability::AccessType::Mount(m) => RawAccess::Mount {
                fs_type: &m.fs_type,
                mount_flags: &m.mount_flags,
            },
        }),
        mode: cap.access_mode.as_ref().map(|m| m.mode),
    }
}

/// A controller call's capability.
pub fn parse(cap: Option<&csi::VolumeCapability>) -> Result<Capability, ValidationError> {
    Capability::parse(cap.map(raw), false)
}

/// The capability a node call asks for `volume`: for a node-local handle (`local-ebs://…`)
/// MULTI_NODE_MULTI_WRITER in mount mode too.
pub fn for_volume(
    cap: Option<&csi::VolumeCapability>,
    volume: &VolumeId,
) -> Result<Capability, ValidationError> {
    Capability::parse(cap.map(raw), volume.is_local())
}

#[cfg(test)]
mod tests {
    use csi::volume_capability::access_mode::Mode;
    use ebs_node_core::request::{AccessMode, csi_mode};

    use super::*;

    /// The core names CSI's mode numbers without the generated code; they are the wire's and the
    /// journal's, so they must stay the enum's.
    #[test]
    fn the_cores_mode_numbers_are_the_protos() {
        let pairs = [
            (csi_mode::UNKNOWN, Mode::Unknown),
            (csi_mode::SINGLE_NODE_WRITER, Mode::SingleNodeWriter),
            (
                csi_mode::SINGLE_NODE_READER_ONLY,
                Mode::SingleNodeReaderOnly,
            ),
            (csi_mode::MULTI_NODE_READER_ONLY, Mode::MultiNodeReaderOnly),
            (
                csi_mode::MULTI_NODE_SINGLE_WRITER,
                Mode::MultiNodeSingleWriter,
            ),
            (
                csi_mode::MULTI_NODE_MULTI_WRITER,
                Mode::MultiNodeMultiWriter,
            ),
            (
                csi_mode::SINGLE_NODE_SINGLE_WRITER,
                Mode::SingleNodeSingleWriter,
            ),
            (
                csi_mode::SINGLE_NODE_MULTI_WRITER,
                Mode::SingleNodeMultiWriter,
            ),
        ];
        for (number, mode) in pairs {
            assert_eq!(number, mode as i32, "{mode:?}");
            assert_eq!(csi_mode::name(number), mode.as_str_name());
        }
    }

    #[test]
    fn every_mode_the_core_accepts_round_trips() {
        let block = csi::VolumeCapability {
            access_type: Some(csi::volume_capability::AccessType::Block(
                csi::volume_capability::BlockVolume {},
            )),
            access_mode: None,
        };
        for mode in [
            AccessMode::SingleNodeWriter,
            AccessMode::SingleNodeReaderOnly,
            AccessMode::MultiNodeReaderOnly,
            AccessMode::SingleNodeSingleWriter,
            AccessMode::SingleNodeMultiWriter,
            AccessMode::MultiNodeMultiWriter,
        ] {
            let cap = csi::VolumeCapability {
                access_mode: Some(csi::volume_capability::AccessMode {
                    mode: mode.csi_number(),
                }),
                ..block.clone()
            };
            assert_eq!(parse(Some(&cap)).map(|c| c.mode), Ok(mode));
        }
        assert_eq!(
            parse(Some(&block)),
            Err(ValidationError::Missing("volume_capability.access_mode"))
        );
    }
}
