//! NodeStageVolume as the spec's lifecycle reads: resolve the device, verify its identity, probe
//! it, format it (only when provably blank) or check it, mount it, grow it. Each step is journaled;
//! a retry after a crash re-derives every decision from the journal's facts and the host.

use std::collections::HashMap;
use std::time::Instant;

use crate::records::{DeviceIdentity, Durability, Phase, Progress, StagedVolume, now_unix_ms};

use super::claims::Use;
use super::compat::{access_record, check_compatible, verify_identity};
use super::device_claim::acts_for;
use super::format::forget_intent;
use super::grow::grow_if_needed;
use super::journal::{Journal, detail};
use super::mount_steps::MountSteps;
use super::ownership::{Expected, Holder, holder, holder_of};
use super::volume_device::{VolumeDevice, put_claim};
use super::{NodeCtx, path_handles, path_string};
use crate::error::{Error, Result};
use crate::request::{AccessType, Capability, FormatOptions, RequestPath, VolumeId};
use crate::seam::FsToolError;
use crate::steps::{Op, Step};

pub struct StageCommand {
    pub volume: VolumeId,
    pub staging: RequestPath,
    pub capability: Capability,
    pub publish_context: HashMap<String, String>,
    pub volume_context: HashMap<String, String>,
    pub format: FormatOptions,
    pub deadline: Instant,
}

pub fn stage(ctx: &NodeCtx, cmd: &StageCommand) -> Result<()> {
    let vol = &cmd.volume;
    let journal = Journal::new(ctx, vol, Op::Stage);
    check_compatible(ctx, &cmd.volume, &cmd.staging, &cmd.capability)?;
    if let Some(fs) = cmd.capability.fs() {
        ctx.host.fs_supported(fs).map_err(|missing| {
            Error::FsTool(FsToolError::Unavailable {
                fs,
                why: missing.to_string(),
            })
        })?;
    }
    let staging_path = cmd.staging.as_path();
    let _turn = ctx
        .claims
        .take(vol.as_str(), staging_path, Use::Staging, true)?;
    // A node-local handle acting for a volume holds that volume's guard too: the loop
    // controller's detach and delete of it (which take it) wait until the claim is written.
    let _acting = match acts_for(vol, &cmd.publish_context) {
        Some(real) if real != vol.as_str() => Some(
            ctx.locks
                .try_lock(real)
                .ok_or_else(|| Error::Busy(real.to_string()))?,
        ),
        _ => None,
    };

    let resolved = journal.step(
        Step::ResolveDevice,
        detail([("staging", path_string(staging_path))]),
        Durability::Lazy,
        || {
            ctx.backend.resolve_at(
                &cmd.volume,
                &cmd.publish_context,
                &cmd.volume_context,
                staging_path,
                cmd.deadline,
            )
        },
    )?;
    let format = ctx.ledger.format(vol.as_str())?;
    let mut device = journal.step(
        Step::VerifyIdentity,
        detail([("device", path_string(&resolved.path))]),
        Durability::Lazy,
        || {
            verify_identity(&cmd.volume, &resolved, format.as_ref())?;
            let mut device = VolumeDevice::hold(ctx, vol, &resolved)?;
            device.take_for_node(ctx, vol, acts_for(vol, &cmd.publish_context))?;
            Ok(device)
        },
    )?;
    // Written with the first intent below, so the device is this volume's before anything is
    // done to it.
    let claim = device.pending_claim();

    let readonly = cmd.capability.mode.is_read_only();
    let mut record = StagedVolume {
        volume_id: vol.to_string(),
        staging_path: staging_path.to_path_buf(),
        device: resolved.path.clone(),
        devnum: Some(device.devnum().into()),
        identity: resolved.identity.clone(),
        access: access_record(&cmd.capability),
        access_mode: cmd.capability.mode.csi_number(),
        readonly,
        progress: Progress::InProgress,
        at_unix_ms: now_unix_ms(),
        attachment: (resolved.identity == DeviceIdentity::Unverified)
            .then(|| ctx.host.attachment(device.devnum()))
            .flatten(),
    };
    let AccessType::Mount { fs, flags } = &cmd.capability.access else {
        // Block access: the device is verified and recorded; nothing is mounted. It is handed
        // out raw from here on, so a format intent stops licensing anything in the same commit.
        // A first stage hands out only a device nothing else uses: a filesystem mounted from it
        // elsewhere would be written under (a thirtieth fresh review's F1: the controller had
        // adopted an operator's mounted device, and only the filesystem stage's exclusive claim
        // refused it).
        if ctx.ledger.staged(vol.as_str())?.is_none() {
            device.refuse_if_used_raw(ctx)?;
        }
        record.progress = Progress::Complete;
        journal.record(
            Step::Staged,
            Phase::Done,
            detail([("device", path_string(&resolved.path))]),
            Durability::Immediate,
            |w| {
                forget_intent(ctx, vol, w)?;
                put_claim(w, &claim)?;
                w.put_staged(&record)
            },
        )?;
        ctx.claims.record(vol.as_str(), staging_path, Use::Staging);
        return Ok(());
    };
    let fs = *fs;
    // `ro` among the mount flags makes the staging mount read-only, and the record says so, so
    // that every publication of it is read-only too.
    let readonly = readonly || flags.wants_read_only();
    record.readonly = readonly;
    let staging = path_handles::prepare(ctx, &cmd.staging)?;
    staging.mkdir().map_err(|source| Error::StagingNotCreated {
        path: staging_path.to_path_buf(),
        source,
    })?;
    let expected = Expected::resolved(vol, device.identity.clone(), device.devnum());
    let already = match holder(ctx, &*staging, &expected)? {
        Holder::Volume(_) => true,
        Holder::Foreign(what) => {
            return Err(Error::ForeignMount {
                path: staging_path.to_path_buf(),
                what,
                volume: vol.to_string(),
            });
        }
        Holder::Nothing => false,
    };

    // Whether this stage already knows the filesystem fills the device: mkfs made it so, or the
    // offline check before the mount compared the two.
    let mut size_settled = false;
    if already {
        // Found mounted with no complete record of this stage (the records lost, or a crash
        // cut the stage after its mount): the mount may be anyone's, made while the agent was
        // down. A repeat of a complete stage touches nothing.
        let completed = (ctx.ledger.staged(vol.as_str())?)
            .is_some_and(|s| s.progress == Progress::Complete && s.staging_path == staging_path);
        if !completed {
            let made = super::adopted::AsMade {
                readonly,
                vfs_bits: flags.vfs_bits(),
                staging: true,
            };
            super::adopted::adopt(ctx, &*staging, &expected, vol.as_str(), made)?;
        }
    } else {
        let steps = MountSteps {
            ctx,
            journal: &journal,
            cmd,
            fs,
            flags,
            readonly,
            format: format.as_ref(),
            claim: &claim,
        };
        size_settled = steps.run(&mut device, &*staging, &mut record)?;
    }

    if !readonly && !size_settled {
        // As NodeExpandVolume: the grow acts on the staging mount's root held open and proven
        // the volume's, never on whatever the staging path names by the time a tool looks.
        let root = staging
            .open_entry()
            .map_err(|e| Error::io(format!("opening {}", staging_path.display()), e))?;
        if !matches!(
            holder_of(ctx, &*root, &*staging, &expected)?,
            Holder::Volume(_)
        ) {
            return Err(Error::StagingChanged {
                path: staging_path.to_path_buf(),
                volume: vol.to_string(),
            });
        }
        device.reverify(ctx)?;
        grow_if_needed(ctx, &journal, fs, device.path(), &*root)?;
    }
    record.progress = Progress::Complete;
    record.at_unix_ms = now_unix_ms();
    // Lazy: the durable mount intent already holds this record (in progress), and both recovery
    // and the next call complete an in-progress record whose staging mount is the volume's, so a
    // lost completion costs nothing; it saves one fsync per stage.
    journal.record(
        Step::Staged,
        Phase::Done,
        detail([("staging", path_string(staging_path))]),
        Durability::Lazy,
        |w| {
            // Found mounted already (records lost): the claim, if it was not held, comes here.
            if already {
                put_claim(w, &claim)?;
            }
            w.put_staged(&record)
        },
    )?;
    ctx.claims.record(vol.as_str(), staging_path, Use::Staging);
    Ok(())
}
