//! Volume capabilities: access type (block or mount with a filesystem) and access mode.

use csi::volume_capability::access_mode::Mode;
use ebs_proto::csi::v1 as csi;

use super::{MountFlags, ValidationError};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FsType {
    Ext4,
    Ext3,
    Xfs,
}

impl FsType {
    pub fn parse(raw: &str) -> Result<Self, ValidationError> {
        match raw {
            "" | "ext4" => Ok(FsType::Ext4),
            "ext3" => Ok(FsType::Ext3),
            "xfs" => Ok(FsType::Xfs),
            other => Err(ValidationError::bad(
                "volume_capability.mount.fs_type",
                other,
                "supported filesystems are ext4 (the default), ext3 and xfs",
            )),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            FsType::Ext4 => "ext4",
            FsType::Ext3 => "ext3",
            FsType::Xfs => "xfs",
        }
    }

    pub fn is_ext(self) -> bool {
        matches!(self, FsType::Ext3 | FsType::Ext4)
    }

    pub const ALL: [FsType; 3] = [FsType::Ext4, FsType::Ext3, FsType::Xfs];
}

impl std::fmt::Display for FsType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AccessType {
    Block,
    Mount { fs: FsType, flags: MountFlags },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccessMode {
    SingleNodeWriter,
    SingleNodeReaderOnly,
    MultiNodeReaderOnly,
    SingleNodeSingleWriter,
    SingleNodeMultiWriter,
    /// io2 Multi-Attach: raw block only, the application arbitrates writes. Node-local handles
    /// (`local-ebs://`): also in mount mode, each node's own disk.
    MultiNodeMultiWriter,
}

impl AccessMode {
    pub fn is_read_only(self) -> bool {
        matches!(
            self,
            AccessMode::SingleNodeReaderOnly | AccessMode::MultiNodeReaderOnly
        )
    }

    /// Modes that allow only one publication on this node (CSI: a second target → FAILED_PRECONDITION).
    pub fn single_publication(self) -> bool {
        matches!(
            self,
            AccessMode::SingleNodeWriter | AccessMode::SingleNodeSingleWriter
        )
    }

    pub fn to_proto(self) -> Mode {
        match self {
            AccessMode::SingleNodeWriter => Mode::SingleNodeWriter,
            AccessMode::SingleNodeReaderOnly => Mode::SingleNodeReaderOnly,
            AccessMode::MultiNodeReaderOnly => Mode::MultiNodeReaderOnly,
            AccessMode::SingleNodeSingleWriter => Mode::SingleNodeSingleWriter,
            AccessMode::SingleNodeMultiWriter => Mode::SingleNodeMultiWriter,
            AccessMode::MultiNodeMultiWriter => Mode::MultiNodeMultiWriter,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Capability {
    pub access: AccessType,
    pub mode: AccessMode,
}

impl Capability {
    pub fn from_proto(cap: Option<&csi::VolumeCapability>) -> Result<Self, ValidationError> {
        Self::parse(cap, false)
    }

    /// The capability a node call asks for `volume`: as `from_proto`, and for a node-local
    /// handle (`local-ebs://…`) MULTI_NODE_MULTI_WRITER in mount mode too, as upstream allows
    /// (each node mounts its own disk; nothing is shared across nodes).
    pub fn for_volume(
        cap: Option<&csi::VolumeCapability>,
        volume: &super::VolumeId,
    ) -> Result<Self, ValidationError> {
        Self::parse(cap, volume.is_local())
    }

    fn parse(
        cap: Option<&csi::VolumeCapability>,
        node_local: bool,
    ) -> Result<Self, ValidationError> {
        let cap = cap.ok_or(ValidationError::Missing("volume_capability"))?;
        let raw_mode = cap
            .access_mode
            .as_ref()
            .ok_or(ValidationError::Missing("volume_capability.access_mode"))?
            .mode;
        let access = match &cap.access_type {
            Some(csi::volume_capability::AccessType::Block(_)) => AccessType::Block,
            Some(csi::volume_capability::AccessType::Mount(m)) => {
                let fs = FsType::parse(&m.fs_type)?;
                AccessType::Mount {
                    fs,
                    flags: MountFlags::parse(fs, &m.mount_flags)?,
                }
            }
            None => return Err(ValidationError::Missing("volume_capability.access_type")),
        };
        let mode = match Mode::try_from(raw_mode) {
            Ok(Mode::SingleNodeWriter) => AccessMode::SingleNodeWriter,
            Ok(Mode::SingleNodeReaderOnly) => AccessMode::SingleNodeReaderOnly,
            Ok(Mode::MultiNodeReaderOnly) => AccessMode::MultiNodeReaderOnly,
            Ok(Mode::SingleNodeSingleWriter) => AccessMode::SingleNodeSingleWriter,
            Ok(Mode::SingleNodeMultiWriter) => AccessMode::SingleNodeMultiWriter,
            Ok(Mode::MultiNodeMultiWriter) if node_local || access == AccessType::Block => {
                AccessMode::MultiNodeMultiWriter
            }
            Ok(Mode::MultiNodeMultiWriter) | Ok(Mode::MultiNodeSingleWriter) => {
                return Err(ValidationError::Unsupported(format!(
                    "access mode {} is not supported for this access type: EBS volumes attach \
                     to several nodes only as raw block devices (MULTI_NODE_MULTI_WRITER), and \
                     node-local handles (local-ebs://…) are MULTI_NODE_MULTI_WRITER in either \
                     mode",
                    Mode::try_from(raw_mode).map_or("?", |m| m.as_str_name())
                )));
            }
            Ok(Mode::Unknown) | Err(_) => {
                return Err(ValidationError::bad(
                    "volume_capability.access_mode",
                    raw_mode.to_string(),
                    "unknown access mode",
                ));
            }
        };
        Ok(Capability { access, mode })
    }

    pub fn is_block(&self) -> bool {
        self.access == AccessType::Block
    }

    pub fn fs(&self) -> Option<FsType> {
        match &self.access {
            AccessType::Mount { fs, .. } => Some(*fs),
            AccessType::Block => None,
        }
    }

    pub fn to_proto(&self) -> csi::VolumeCapability {
        let access_type = match &self.access {
            AccessType::Block => {
                csi::volume_capability::AccessType::Block(csi::volume_capability::BlockVolume {})
            }
            AccessType::Mount { fs, flags } => {
                csi::volume_capability::AccessType::Mount(csi::volume_capability::MountVolume {
                    fs_type: fs.name().to_string(),
                    mount_flags: flags.raw().to_vec(),
                    ..Default::default()
                })
            }
        };
        csi::VolumeCapability {
            access_mode: Some(csi::volume_capability::AccessMode {
                mode: self.mode.to_proto() as i32,
            }),
            access_type: Some(access_type),
        }
    }
}
