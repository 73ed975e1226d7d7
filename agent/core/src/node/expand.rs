//! NodeExpandVolume: make the kernel see the grown device, then grow the mounted filesystem
//! online. Block volumes need no filesystem work; their answer is the device size.
//!
//! The answer is always the device size: the filesystem spans the whole device once grown, and
//! the CO accounts capacity as volume size. statvfs totals leave out filesystem metadata, so they
//! never equal what the CO asked for and would read as an incomplete expansion.

use std::path::Path;

use std::collections::HashSet;

use crate::DevNum;
use crate::records::{AccessRecord, Durability, Phase, Progress, StagedVolume};

use super::NodeCtx;
use super::grow::grow_if_needed;
use super::host::OpenEntry;
use super::journal::{Journal, detail};
use super::ownership::{Expected, Holder, holder, holder_of};
use super::volume_device::VolumeDevice;
use super::{path_handles, path_string};
use crate::error::{CapacityError, Error, Result};
use crate::request::{Capability, FsType, RequestPath, ValidationError, VolumeId};
use crate::seam::FsToolError;
use crate::steps::{Op, Step};

pub struct ExpandCommand {
    pub volume: VolumeId,
    /// The staging path or one of the volume's publication targets: the CO may send either.
    pub volume_path: RequestPath,
    pub staging: Option<RequestPath>,
    /// 0 = not set.
    pub required_bytes: u64,
    /// 0 = not set.
    pub limit_bytes: u64,
    pub capability: Option<Capability>,
}

pub fn expand(ctx: &NodeCtx, cmd: &ExpandCommand) -> Result<u64> {
    let vol = &cmd.volume;
    let (required, limit) = (cmd.required_bytes, cmd.limit_bytes);
    if limit != 0 && required > limit {
        return Err(CapacityError::RequiredOverLimit { required, limit }.into());
    }
    // A volume that exists but is not staged here is not at the path (see `stats`).
    let staged = ctx
        .ledger
        .staged(vol.as_str())?
        .ok_or_else(|| Error::PathNotFound {
            volume: vol.to_string(),
            path: cmd.volume_path.as_path().to_path_buf(),
        })?;
    if staged.progress != Progress::Complete {
        return Err(Error::StagingIncomplete {
            volume: vol.to_string(),
        });
    }
    check_paths(ctx, cmd, &staged)?;
    check_capability(cmd.capability.as_ref(), &staged)?;

    let held = VolumeDevice::hold_recorded(ctx, &staged).map_err(|e| match e {
        Error::WrongDevice { reason, .. } => Error::NotTheVolumeAnyMore {
            volume: vol.to_string(),
            device: staged.device.clone(),
            reason,
        },
        other => other,
    })?;
    let device = held.path();
    let mounted = check_mounts(ctx, cmd, &staged)?;

    let journal = Journal::new(ctx, vol, Op::Expand);
    held.reverify(ctx)?;
    journal.step(
        Step::RefreshSize,
        detail([("device", path_string(device))]),
        Durability::Lazy,
        || ctx.backend.refresh_size(device),
    )?;
    let size = ctx
        .host
        .device_bytes(device)
        .map_err(|e| Error::io(format!("sizing {}", device.display()), e))?;
    if size < required {
        return Err(CapacityError::DeviceNotGrown {
            volume: vol.to_string(),
            device: device.to_path_buf(),
            size,
            required,
        }
        .into());
    }
    if limit != 0 && size > limit {
        return Err(CapacityError::DeviceOverLimit {
            volume: vol.to_string(),
            device: device.to_path_buf(),
            size,
            limit,
        }
        .into());
    }
    // A read-only block publication binds a loop device laid over the volume's: it keeps the
    // old size until told, and the answer must be what the workload sees.
    held.reverify(ctx)?;
    let followed = follow_resize(ctx, vol.as_str(), held.devnum(), size)?;
    let grown = match mounted {
        Some((fs, root)) => {
            held.reverify(ctx)?;
            grow_if_needed(ctx, &journal, fs, device, &*root)
                .map_err(|e| explain_grow_failure(ctx, fs, e))?
        }
        None => false,
    };
    tracing::info!(volume = %vol, bytes = size, grown, read_only_devices = followed, "expanded");
    journal.note(
        Step::Expanded,
        Phase::Done,
        detail([("bytes", size.to_string()), ("grown", grown.to_string())]),
    );
    Ok(size)
}

/// The kernel grows a mounted ext filesystem only for a caller with CAP_SYS_RESOURCE, and
/// resize2fs then says no more than "Permission denied": name the missing capability.
fn explain_grow_failure(ctx: &NodeCtx, fs: FsType, err: Error) -> Error {
    match err {
        Error::FsTool(FsToolError::ToolFailed { device, stderr, .. })
            if fs.is_ext() && !ctx.host.may_grow_mounted_ext() =>
        {
            Error::GrowNeedsCapability { fs, device, stderr }
        }
        other => other,
    }
}

/// The paths must name this volume: the staging path or a recorded publication. Anything else is
/// NOT_FOUND, as the spec asks.
fn check_paths(ctx: &NodeCtx, cmd: &ExpandCommand, staged: &StagedVolume) -> Result<()> {
    let vol = &cmd.volume;
    let not_found = |path: &Path| Error::PathNotFound {
        volume: vol.to_string(),
        path: path.to_path_buf(),
    };
    if let Some(staging) = &cmd.staging
        && staging.as_path() != staged.staging_path
    {
        return Err(not_found(staging.as_path()));
    }
    let path = cmd.volume_path.as_path();
    if path != staged.staging_path && ctx.ledger.publication(vol.as_str(), path)?.is_none() {
        return Err(not_found(path));
    }
    Ok(())
}

fn check_capability(cap: Option<&Capability>, staged: &StagedVolume) -> Result<()> {
    let Some(cap) = cap else { return Ok(()) };
    let staged_block = matches!(staged.access, AccessRecord::Block);
    if cap.is_block() != staged_block {
        let (asked, has) = if staged_block {
            ("filesystem", "block")
        } else {
            ("block", "filesystem")
        };
        return Err(ValidationError::bad(
            "volume_capability",
            asked,
            format!("volume {} was staged for {has} access", staged.volume_id),
        )
        .into());
    }
    Ok(())
}

/// A filesystem volume must be mounted at its staging path (the grow runs there) and, when the
/// CO named a publication, there too. Returns the filesystem to grow with the staging mount's
/// root held open, None for block access.
fn check_mounts(
    ctx: &NodeCtx,
    cmd: &ExpandCommand,
    staged: &StagedVolume,
) -> Result<Option<(FsType, Box<dyn OpenEntry>)>> {
    let vol = &cmd.volume;
    let path = cmd.volume_path.as_path();
    let is_target = path != staged.staging_path;
    let not_found = || Error::PathNotFound {
        volume: vol.to_string(),
        path: path.to_path_buf(),
    };
    let expected = Expected::of(ctx, vol.as_str(), Some(staged));
    if is_target {
        let published = match path_handles::lookup(ctx, &cmd.volume_path)? {
            Some(entry) => holder(ctx, &*entry, &expected)?.is_volume(),
            None => false,
        };
        if !published {
            return Err(not_found());
        }
    }
    let AccessRecord::Mount { fs_type, .. } = &staged.access else {
        return Ok(None);
    };
    let fs = FsType::parse(fs_type).map_err(|source| Error::DamagedRecord {
        record: "staged",
        volume: vol.to_string(),
        source,
    })?;
    let not_mounted = || Error::StagingNotMounted {
        volume: vol.to_string(),
        at: staged.staging_path.clone(),
    };
    let staging =
        path_handles::lookup_recorded(ctx, &staged.staging_path)?.ok_or_else(not_mounted)?;
    let root = staging
        .open_entry()
        .map_err(|e| Error::io(format!("opening {}", staged.staging_path.display()), e))?;
    let Holder::Volume(m) = holder_of(ctx, &*root, &*staging, &expected)? else {
        return Err(not_mounted());
    };
    if staged.readonly || m.super_read_only {
        return Err(Error::MountedReadOnly {
            volume: vol.to_string(),
            at: staged.staging_path.clone(),
        });
    }
    Ok(Some((fs, root)))
}

/// Every read-only device of `volume`'s read-only block publications, laid over `device`
/// (numbers `devnum`), takes the device's new `size`, so the workload sees the grown volume (a
/// read-only block publication binds a loop device laid over the volume's: it keeps the old
/// size until told). One that does not is FAILED_PRECONDITION, naming it.
fn follow_resize(ctx: &NodeCtx, volume: &str, devnum: DevNum, size: u64) -> Result<usize> {
    let mut tags = HashSet::new();
    for p in ctx.ledger.publications(volume)? {
        if p.block && p.readonly {
            tags.insert(ctx.agent_tag.tag(volume, &p.target_path));
            tags.insert(ctx.agent_tag.legacy_tag(volume, &p.target_path));
        }
    }
    if tags.is_empty() {
        return Ok(0);
    }
    let resized = ctx
        .host
        .resize_read_only(&tags, devnum)
        .map_err(|e| Error::io("listing loop devices".to_string(), e))?;
    for (device, now) in &resized {
        let refused = |why: String| Error::ReadOnlyDeviceDidNotFollow {
            volume: volume.to_string(),
            size,
            device: device.clone(),
            why,
        };
        match now {
            Ok(now) if *now == size => {}
            Ok(now) => return Err(refused(format!("it shows {now} bytes"))),
            Err(e) => return Err(refused(e.to_string())),
        }
        tracing::info!(volume, device = %device.display(), bytes = size,
            "a read-only block device followed the volume's resize");
    }
    Ok(resized.len())
}
