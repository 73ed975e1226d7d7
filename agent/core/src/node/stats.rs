//! NodeGetVolumeStats: usage of a volume at its staging path or a publication, and its condition.
//!
//! Read-only and lock-free on purpose: kubelet asks for every volume's stats every minute, and
//! the per-volume guard would turn those calls into ABORTED errors (and gaps in the metrics)
//! whenever a publish or an expansion of the same volume runs. Nothing here changes the host or
//! the store, so a stats call that overlaps an operation sees a snapshot at worst.

use std::path::Path;

use crate::records::{AccessRecord, Progress, StagedVolume};

use super::NodeCtx;
use super::ownership::{Expected, Holder, holder};
use super::path_handles;
use super::volume_condition::{self, Condition};
use crate::error::{Error, Result};
use crate::request::{RequestPath, VolumeId};
use crate::seam::{FileKind, FsUsage};

pub struct StatsCommand {
    pub volume: VolumeId,
    pub volume_path: RequestPath,
    pub staging: Option<RequestPath>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counts {
    pub total: u64,
    pub available: u64,
    pub used: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Usage {
    Filesystem { bytes: Counts, inodes: Counts },
    Block { total_bytes: u64 },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeStats {
    /// None when the volume cannot be measured (its mount or device is gone): the condition says
    /// why.
    pub usage: Option<Usage>,
    pub condition: Condition,
}

pub fn volume_stats(ctx: &NodeCtx, cmd: &StatsCommand) -> Result<VolumeStats> {
    let vol = &cmd.volume;
    let path = cmd.volume_path.as_path();
    let not_found = |p: &Path| Error::PathNotFound {
        volume: vol.to_string(),
        path: p.to_path_buf(),
    };
    // A volume that exists but is not staged here is not at the path: said so, not "does not
    // exist" (a twenty-second fresh review's F5).
    let staged = ctx
        .ledger
        .staged(vol.as_str())?
        .ok_or_else(|| not_found(path))?;
    if let Some(staging) = &cmd.staging
        && staging.as_path() != staged.staging_path
    {
        return Err(not_found(staging.as_path()));
    }
    let unfinished = if path == staged.staging_path {
        staged.progress != Progress::Complete
    } else {
        match ctx.ledger.publication(vol.as_str(), path)? {
            Some(publication) => publication.progress != Progress::Complete,
            None if holds_the_device(ctx, &staged, &cmd.volume_path)? => false,
            None => return Err(not_found(path)),
        }
    };
    if unfinished {
        return Ok(VolumeStats {
            usage: None,
            condition: Condition {
                abnormal: true,
                message: format!(
                    "setting up volume {vol} at {} has not completed (in progress, or \
                     interrupted by a crash); it completes when the CO retries",
                    path.display()
                ),
            },
        });
    }
    let findings = volume_condition::examine(ctx, &staged, path);
    let usage = match staged.access {
        AccessRecord::Mount { .. } if findings.fs_mounted => Some(filesystem_usage(ctx, path)?),
        AccessRecord::Block if findings.device_ok => Some(block_usage(ctx, &staged)?),
        _ => None,
    };
    Ok(VolumeStats {
        usage,
        condition: findings.condition,
    })
}

/// Whether `path`, which no record names, is a bind of the block volume's device: kubelet asks
/// at its own bind of the publication (`…/volumeDevices/<pv>/dev/<pod uid>`), which it made, not
/// the agent. A place is what it is: a device node bound there whose device is the staged one
/// (or the read-only device laid over it), proven as a publication is. The path is resolved
/// below its allowed prefix with no symlink followed, as every request path.
fn holds_the_device(ctx: &NodeCtx, staged: &StagedVolume, path: &RequestPath) -> Result<bool> {
    if staged.access != AccessRecord::Block || staged.progress != Progress::Complete {
        return Ok(false);
    }
    let Some(entry) = path_handles::lookup(ctx, path)? else {
        return Ok(false);
    };
    let expected = Expected::of(ctx, &staged.volume_id, Some(staged));
    Ok(match holder(ctx, &*entry, &expected)? {
        Holder::Volume(m) => m.node.kind == FileKind::BlockDevice,
        Holder::Nothing | Holder::Foreign(_) => false,
    })
}

/// statvfs through the mount just found to be the volume's (`volume_condition`), reached again
/// below its prefix with no symlink followed: never a path resolved anew.
fn filesystem_usage(ctx: &NodeCtx, path: &Path) -> Result<Usage> {
    let statvfs = |e| Error::io(format!("statvfs on {}", path.display()), e);
    let entry = path_handles::lookup_recorded(ctx, path)?.ok_or_else(|| {
        statvfs(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "the path is gone",
        ))
    })?;
    let u: FsUsage = entry
        .open_entry()
        .and_then(|root| root.fs_usage())
        .map_err(statvfs)?;
    Ok(Usage::Filesystem {
        bytes: Counts {
            total: u.total_bytes,
            available: u.available_bytes,
            used: u.used_bytes,
        },
        inodes: Counts {
            total: u.total_inodes,
            available: u.available_inodes,
            used: u.used_inodes,
        },
    })
}

fn block_usage(ctx: &NodeCtx, staged: &StagedVolume) -> Result<Usage> {
    let total_bytes = ctx
        .host
        .device_bytes(&staged.device)
        .map_err(|e| Error::io(format!("sizing {}", staged.device.display()), e))?;
    Ok(Usage::Block { total_bytes })
}
