//! The format step around the never-format rule (`crate::format::decide`): mkfs itself, with its
//! UUID chosen and journaled before it runs, and the format record's life around it.

use std::time::Instant;

use crate::records::{DeviceClaim, Durability, FormatRecord, FormatState, Phase, now_unix_ms};

use super::NodeCtx;
use super::journal::{Journal, detail};
use super::path_string;
use super::volume_device::{VolumeDevice, put_claim};
use crate::error::Result;
use crate::format::FormatView;
use crate::ledger::{LedgerResult, LedgerWriter};
use crate::request::{FormatOptions, FsType, VolumeId};
use crate::steps::Step;

/// The journal's format record as the never-format rule reads it.
pub fn view(f: &FormatRecord) -> FormatView<'_> {
    FormatView {
        fs_type: &f.fs_type,
        uuid: &f.uuid,
        done: f.state == FormatState::Done,
        attachment: f.attachment.as_deref(),
    }
}

/// Drops a format intent in the commit that hands the volume out as a raw block device (block
/// stage and block publish): from then on anything may be written to it, a filesystem with the
/// intent's UUID included, so the intent may license nothing any more.
pub fn forget_intent(ctx: &NodeCtx, vol: &VolumeId, w: &mut dyn LedgerWriter) -> LedgerResult<()> {
    match ctx.ledger.format(vol.as_str())? {
        Some(f) if f.state == FormatState::Intent => w.delete_format(vol.as_str()),
        _ => Ok(()),
    }
}

pub fn format_record(
    ctx: &NodeCtx,
    vol: &VolumeId,
    fs: FsType,
    uuid: &str,
    dev: &VolumeDevice,
    state: FormatState,
) -> FormatRecord {
    FormatRecord {
        volume_id: vol.to_string(),
        fs_type: fs.name().to_string(),
        uuid: uuid.to_string(),
        identity: dev.identity.clone(),
        state,
        at_unix_ms: now_unix_ms(),
        attachment: ctx.host.attachment(dev.devnum()),
    }
}

/// mkfs with the UUID chosen and journaled first; a failure is journaled durably too, so the
/// record of the attempt never reads as an interruption.
pub fn format_device(
    ctx: &NodeCtx,
    journal: &Journal<'_>,
    fs: FsType,
    device: &mut VolumeDevice,
    uuid: &str,
    options: &FormatOptions,
    claim: &Option<(String, DeviceClaim)>,
) -> Result<()> {
    let vol = journal.volume();
    let facts = detail([
        ("device", path_string(device.path())),
        ("fs_type", fs.name().to_string()),
        ("uuid", uuid.to_string()),
        ("options", options.mkfs_args(fs).join(" ")),
    ]);
    ctx.host.check_size(fs, device.path(), options)?;
    let intent = format_record(ctx, vol, fs, uuid, device, FormatState::Intent);
    journal.record(
        Step::Format,
        Phase::Intent,
        facts.clone(),
        Durability::Immediate,
        |w| {
            // The device becomes the volume's in the intent's own commit: an intent is tied to
            // its claim (`device_claim`).
            put_claim(w, claim)?;
            w.put_format(&intent)
        },
    )?;
    let started = Instant::now();
    // mkfs claims the device exclusively itself.
    device.held.release_exclusive();
    let made = device
        .reverify(ctx)
        .and_then(|()| Ok(ctx.host.mkfs(fs, device.path(), uuid, options)?));
    if let Err(e) = made {
        let mut failed = facts;
        failed.insert("error".into(), e.to_string());
        if let Err(j) = journal.record(
            Step::Format,
            Phase::Failed,
            failed,
            Durability::Immediate,
            |_| Ok(()),
        ) {
            tracing::warn!(volume = %vol, error = %j, "the failed mkfs could not be journaled");
        }
        return Err(e);
    }
    tracing::info!(volume = %vol, device = %device.path().display(), %fs, uuid,
        ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX), "formatted");
    let done = format_record(ctx, vol, fs, uuid, device, FormatState::Done);
    journal.record(
        Step::Format,
        Phase::Done,
        facts,
        Durability::Immediate,
        |w| w.put_format(&done),
    )
}
