//! Which existing records a stage or a publish must honour. A record counts only when the host
//! shows what it records: a stage that failed or was interrupted before its mount never holds a
//! corrected retry to its arguments.

use crate::records::{AccessRecord, FormatRecord, Progress, StagedVolume};

use super::NodeCtx;
use super::backend::ResolvedDevice;
use super::identity::same_identity;
use super::ownership::{Expected, holder};
use super::path_handles;
use crate::error::{Error, Result};
use crate::request::{AccessType, Capability, RequestPath, VolumeId};

/// A volume is staged at one path with one capability; anything else is ALREADY_EXISTS. A
/// stage that failed or was interrupted before its mount never holds a corrected retry to its
/// arguments: only a record whose staging mount the host shows counts.
pub fn check_compatible(
    ctx: &NodeCtx,
    volume: &VolumeId,
    staging: &RequestPath,
    capability: &Capability,
) -> Result<()> {
    let Some(existing) = ctx.ledger.staged(volume.as_str())? else {
        return Ok(());
    };
    if existing.progress == Progress::InProgress && !staged_mount_present(ctx, &existing)? {
        return Ok(());
    }
    // Access mode 0: a record rebuilt by `recover --from-mounts`, which cannot know what the CO
    // asked for; the CO's request is taken as the truth.
    let recovered = existing.access_mode == 0;
    if existing.staging_path != staging.as_path() && !existing.staging_path.as_os_str().is_empty() {
        return Err(Error::AlreadyStagedAt {
            volume: volume.to_string(),
            at: existing.staging_path.clone(),
        });
    }
    let compatible = if recovered {
        same_kind(&existing.access, &access_record(capability))
    } else {
        existing.access == access_record(capability)
            && existing.access_mode == capability.mode.csi_number()
    };
    if !compatible {
        return Err(Error::StagedWithOtherCapability {
            volume: volume.to_string(),
            at: existing.staging_path.clone(),
        });
    }
    Ok(())
}

/// Whether the host shows a staged record's filesystem at its staging path.
pub fn staged_mount_present(ctx: &NodeCtx, staged: &StagedVolume) -> Result<bool> {
    if matches!(staged.access, AccessRecord::Block) {
        return Ok(true);
    }
    let Some(entry) = path_handles::lookup_recorded(ctx, &staged.staging_path)? else {
        return Ok(false);
    };
    let expected = Expected::of(ctx, &staged.volume_id, Some(staged));
    Ok(holder(ctx, &*entry, &expected)?.is_volume())
}

/// Block with block, or the same filesystem type (mount flags aside).
pub fn same_kind(a: &AccessRecord, b: &AccessRecord) -> bool {
    match (a, b) {
        (AccessRecord::Block, AccessRecord::Block) => true,
        (AccessRecord::Mount { fs_type: a, .. }, AccessRecord::Mount { fs_type: b, .. }) => a == b,
        _ => false,
    }
}

pub fn access_record(cap: &Capability) -> AccessRecord {
    match &cap.access {
        AccessType::Block => AccessRecord::Block,
        AccessType::Mount { fs, flags } => AccessRecord::Mount {
            fs_type: fs.name().to_string(),
            mount_flags: flags.raw().to_vec(),
        },
    }
}

pub fn verify_identity(
    volume: &VolumeId,
    device: &ResolvedDevice,
    format: Option<&FormatRecord>,
) -> Result<()> {
    match format {
        Some(f) if !same_identity(&f.identity, &device.identity) => Err(Error::WrongDevice {
            volume: volume.to_string(),
            device: device.path.clone(),
            reason: format!(
                "the volume was formatted on a device identified as {:?}, but this device is {:?} \
                 (wrong device, or the device changed under us)",
                f.identity, device.identity
            ),
        }),
        _ => Ok(()),
    }
}
