//! Volume capabilities: access type (block or mount with a filesystem) and access mode.

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

    /// CSI's number for the mode (csi.proto's `AccessMode.Mode`): what the wire carries and
    /// what the journal stores. The daemon's tests pin these to the generated enum.
    pub fn csi_number(self) -> i32 {
        match self {
            AccessMode::SingleNodeWriter => csi_mode::SINGLE_NODE_WRITER,
            AccessMode::SingleNodeReaderOnly => csi_mode::SINGLE_NODE_READER_ONLY,
            AccessMode::MultiNodeReaderOnly => csi_mode::MULTI_NODE_READER_ONLY,
            AccessMode::SingleNodeSingleWriter => csi_mode::SINGLE_NODE_SINGLE_WRITER,
            AccessMode::SingleNodeMultiWriter => csi_mode::SINGLE_NODE_MULTI_WRITER,
            AccessMode::MultiNodeMultiWriter => csi_mode::MULTI_NODE_MULTI_WRITER,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Capability {
    pub access: AccessType,
    pub mode: AccessMode,
}

/// CSI's access-mode numbers (csi.proto, `VolumeCapability.AccessMode.Mode`). The core crate
/// does not link the generated code; `grpc::capability`'s tests hold these equal to it.
pub mod csi_mode {
    pub const UNKNOWN: i32 = 0;
    pub const SINGLE_NODE_WRITER: i32 = 1;
    pub const SINGLE_NODE_READER_ONLY: i32 = 2;
    pub const MULTI_NODE_READER_ONLY: i32 = 3;
    pub const MULTI_NODE_SINGLE_WRITER: i32 = 4;
    pub const MULTI_NODE_MULTI_WRITER: i32 = 5;
    pub const SINGLE_NODE_SINGLE_WRITER: i32 = 6;
    pub const SINGLE_NODE_MULTI_WRITER: i32 = 7;

    /// The spec's name for a mode number, for messages.
    pub fn name(mode: i32) -> &'static str {
        match mode {
            UNKNOWN => "UNKNOWN",
            SINGLE_NODE_WRITER => "SINGLE_NODE_WRITER",
            SINGLE_NODE_READER_ONLY => "SINGLE_NODE_READER_ONLY",
            MULTI_NODE_READER_ONLY => "MULTI_NODE_READER_ONLY",
            MULTI_NODE_SINGLE_WRITER => "MULTI_NODE_SINGLE_WRITER",
            MULTI_NODE_MULTI_WRITER => "MULTI_NODE_MULTI_WRITER",
            SINGLE_NODE_SINGLE_WRITER => "SINGLE_NODE_SINGLE_WRITER",
            SINGLE_NODE_MULTI_WRITER => "SINGLE_NODE_MULTI_WRITER",
            _ => "?",
        }
    }
}

/// A volume capability as the wire carries it, before validation: what the gRPC door hands to
/// [`Capability::parse`] (the daemon reads it out of whichever CSI version's message arrived).
#[derive(Clone, Copy, Debug)]
pub struct RawCapability<'a> {
    /// `access_type`: absent, block, or mount with its fs_type and mount_flags.
    pub access: Option<RawAccess<'a>>,
    /// `access_mode.mode`, absent when `access_mode` is.
    pub mode: Option<i32>,
}

#[derive(Clone, Copy, Debug)]
pub enum RawAccess<'a> {
    Block,
    Mount {
        fs_type: &'a str,
        mount_flags: &'a [String],
    },
}

impl Capability {
    /// Validates a capability. `node_local` (a `local-ebs://…` handle, on node calls) allows
    /// MULTI_NODE_MULTI_WRITER in mount mode too, as upstream does: each node mounts its own
    /// disk, nothing is shared across nodes. Otherwise that mode is for raw block only.
    pub fn parse(
        cap: Option<RawCapability<'_>>,
        node_local: bool,
    ) -> Result<Self, ValidationError> {
        let cap = cap.ok_or(ValidationError::Missing("volume_capability"))?;
        let raw_mode = cap
            .mode
            .ok_or(ValidationError::Missing("volume_capability.access_mode"))?;
        let access = match cap.access {
            Some(RawAccess::Block) => AccessType::Block,
            Some(RawAccess::Mount {
                fs_type,
                mount_flags,
            }) => {
                let fs = FsType::parse(fs_type)?;
                AccessType::Mount {
                    fs,
                    flags: MountFlags::parse(fs, mount_flags)?,
                }
            }
            None => return Err(ValidationError::Missing("volume_capability.access_type")),
        };
        let mode = match raw_mode {
            csi_mode::SINGLE_NODE_WRITER => AccessMode::SingleNodeWriter,
            csi_mode::SINGLE_NODE_READER_ONLY => AccessMode::SingleNodeReaderOnly,
            csi_mode::MULTI_NODE_READER_ONLY => AccessMode::MultiNodeReaderOnly,
            csi_mode::SINGLE_NODE_SINGLE_WRITER => AccessMode::SingleNodeSingleWriter,
            csi_mode::SINGLE_NODE_MULTI_WRITER => AccessMode::SingleNodeMultiWriter,
            csi_mode::MULTI_NODE_MULTI_WRITER if node_local || access == AccessType::Block => {
                AccessMode::MultiNodeMultiWriter
            }
            csi_mode::MULTI_NODE_MULTI_WRITER | csi_mode::MULTI_NODE_SINGLE_WRITER => {
                return Err(ValidationError::Unsupported(format!(
                    "access mode {} is not supported for this access type: EBS volumes attach \
                     to several nodes only as raw block devices (MULTI_NODE_MULTI_WRITER), and \
                     node-local handles (local-ebs://…) are MULTI_NODE_MULTI_WRITER in either \
                     mode",
                    csi_mode::name(raw_mode)
                )));
            }
            _ => {
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
}
