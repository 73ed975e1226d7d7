//! Start-up recovery of one volume: its records checked against the host, each step whose
//! effect the host shows completed (a staging mount of the volume → the stage is complete; a
//! bind of it at a target → the publication is complete), records of mounts that a reboot (or
//! an operator) removed dropped, so the next call redoes the work. Half-done steps with nothing
//! on the host are left for the retry, which resumes from the host's state. One log line per
//! finding. The daemon runs it for every recorded volume at start-up, under the volume's guard,
//! and again for a volume that needs attention (`node::recovery`, `node::attention`).

use crate::ledger::{LedgerResult, LedgerWriter};
use crate::records::{AccessRecord, DeviceIdentity, Durability, Progress, StagedVolume};

use super::NodeCtx;
use super::backend::Shown;
use super::compat::staged_mount_present;
use super::interrupted::{self, Verdict};
use super::ownership::{Expected, Holder, holder};
use super::path_handles;
use crate::error::{Error, Result};

/// What the check of one volume did.
#[derive(Debug, Default, Clone, Copy)]
pub struct VolumeReport {
    pub dropped_staging: bool,
    pub dropped_publications: usize,
    pub completed: usize,
}

/// A device with no identity to prove is still the one staged while its recorded path shows
/// its recorded numbers and the attachment it was staged on (a plain restart).
fn same_attachment(ctx: &NodeCtx, staged: &StagedVolume) -> bool {
    ctx.host
        .block_devnum(&staged.device)
        .is_ok_and(|devnum| super::identity::same_attachment(ctx, staged, devnum))
}

/// Whether the stage's own mount may lie where no lookup of its staging path sees it: something
/// else is mounted at the path, or the recorded device is mounted (or claimed) somewhere, as
/// below a mount laid over the path or over a directory above it.
fn stage_may_be_mounted(ctx: &NodeCtx, staged: &StagedVolume) -> Result<bool> {
    let expected = Expected::of(ctx, &staged.volume_id, Some(staged));
    if let Some(entry) = path_handles::lookup_recorded(ctx, &staged.staging_path)?
        && matches!(holder(ctx, &*entry, &expected)?, Holder::Foreign(_))
    {
        return Ok(true);
    }
    Ok(expected
        .recorded_devnum()
        .is_some_and(|d| ctx.host.still_claimed(d, None) && expected.is_device(ctx, d)))
}

/// Checks one volume's records against the host and completes or drops them. Runs under the
/// volume's guard, on a blocking thread (it walks recorded paths).
pub fn recover_volume(ctx: &NodeCtx, vol: &str) -> Result<VolumeReport> {
    let store = &ctx.ledger;
    let mut report = VolumeReport::default();
    // Read only to see that it decodes: a stage needs it, so a broken one keeps the mark.
    store.format(vol)?;
    if let Some(staged) = store.staged(vol)? {
        let present = match staged.access {
            AccessRecord::Mount { .. } => staged_mount_present(ctx, &staged)?,
            AccessRecord::Block if staged.identity == DeviceIdentity::Unverified => {
                same_attachment(ctx, &staged)
            }
            AccessRecord::Block => ctx
                .backend
                .prove(
                    Shown::Path(&staged.device, ctx.host.block_devnum(&staged.device).ok()),
                    &staged.identity,
                )
                .is_ok(),
        };
        let staging = staged.staging_path.as_path();
        match (staged.progress, present) {
            (Progress::Complete, true) => {
                tracing::info!(volume = vol, staging = %staging.display(), "recovery: staged and mounted as recorded");
            }
            // Its own mount may lie below a mount laid over the staging path, or over a
            // directory above it: kept, and the unstage refuses while the device is in use (a
            // sixty-fifth fresh review's F3: the record was dropped, the unstage then answered
            // OK over the live mount).
            (Progress::Complete, false)
                if matches!(staged.access, AccessRecord::Mount { .. })
                    && stage_may_be_mounted(ctx, &staged)? =>
            {
                tracing::warn!(volume = vol, staging = %staging.display(),
                    "recovery: the staging mount is not seen at its path, but the volume's device is mounted or claimed (a mount laid over the path?); record kept, NodeUnstageVolume refuses until the device is free");
            }
            (Progress::Complete, false) => {
                tracing::warn!(volume = vol, staging = %staging.display(),
                    "recovery: the staging mount is gone (reboot?); record dropped, the next NodeStageVolume remounts");
                write(ctx, |w| w.delete_staged(vol))?;
                ctx.claims.forget(vol, staging);
                report.dropped_staging = true;
            }
            // The stage mounted the volume and was cut before its completion, perhaps before
            // its post-mount questions: asked here before the record is completed.
            (Progress::InProgress, true) if matches!(staged.access, AccessRecord::Mount { .. }) => {
                match interrupted::judge(ctx, &staged) {
                    Verdict::Complete => match interrupted::complete(ctx, &staged) {
                        Ok(_) => {
                            report.completed += 1;
                            tracing::info!(volume = vol, staging = %staging.display(),
                                "recovery: the stage had mounted the volume and nothing else uses its device; record completed");
                        }
                        // Root's mount made otherwise while the agent was down: never recorded.
                        Err(e @ Error::MountedNotAsMade { .. }) => {
                            tracing::warn!(volume = vol, staging = %staging.display(), error = %e,
                                "recovery: the volume is mounted at its staging path, but not as the stage mounts it; left in progress, NodeStageVolume refuses until it is unmounted");
                        }
                        Err(e) => return Err(e),
                    },
                    Verdict::Refused {
                        refusal,
                        unstaged: Ok(()),
                    } => {
                        tracing::warn!(volume = vol, staging = %staging.display(), error = %refusal,
                            "recovery: the stage had mounted the volume, but its device is in use elsewhere; unstaged, the next NodeStageVolume asks again");
                        report.dropped_staging = true;
                    }
                    Verdict::Refused {
                        refusal,
                        unstaged: Err(e),
                    } => {
                        tracing::warn!(volume = vol, staging = %staging.display(), error = %refusal, unstage = %e,
                            "recovery: the stage had mounted the volume, but its device is in use elsewhere, and the mount could not be taken down; left in progress (a publish asks again and refuses), NodeUnstageVolume takes it down");
                    }
                    Verdict::Unanswered(e) => {
                        tracing::warn!(volume = vol, staging = %staging.display(), error = %e,
                            "recovery: the stage had mounted the volume, but what else uses its device cannot be told now; left in progress, the next NodePublishVolume or NodeStageVolume asks again");
                    }
                }
            }
            // A stage cut before its mount (or failed at it), with nothing of it on the host and
            // no publication resting on it: nothing for the record to guard. Kept, it held the
            // device from every other door after the CO had moved on (an unstage answered OK
            // while a failed stage's lazy clean-up was still in memory: the simulation's
            // "a failed stage, its unstage, then a crash"). The retry starts afresh; a format
            // intent, a record of its own, still judges the device. Not while its own mount may
            // lie hidden: below a mount laid over the staging path, or over a directory above it
            // (a sixty-third fresh review's F2 and a sixty-fourth's F4: the record was dropped,
            // and the unstage then answered OK over the hidden mount).
            (Progress::InProgress, false)
                if matches!(staged.access, AccessRecord::Mount { .. })
                    && store.publications(vol)?.is_empty()
                    && !stage_may_be_mounted(ctx, &staged)? =>
            {
                tracing::warn!(volume = vol, staging = %staging.display(),
                    "recovery: a stage was cut before its mount; record dropped, the next NodeStageVolume starts afresh");
                write(ctx, |w| w.delete_staged(vol))?;
                ctx.claims.forget(vol, staging);
                report.dropped_staging = true;
            }
            (Progress::InProgress, mounted) => {
                tracing::warn!(
                    volume = vol,
                    mounted,
                    "recovery: a stage was interrupted; the next NodeStageVolume resumes it"
                );
            }
        }
    }
    let staged = store.staged(vol)?;
    if let Some(s) = &staged {
        super::device_claim::adopt(ctx, s)?;
    }
    for publication in store.publications(vol)? {
        let target = publication.target_path.as_path();
        let expected = Expected::of(ctx, vol, staged.as_ref());
        let entry = path_handles::lookup_recorded(ctx, target)?;
        // The file a block publish made at the target: gone, the publication was taken down (an
        // unpublish whose lazy record a crash lost) or never got that far.
        // (A lookup holds the target's directory; the target itself may be absent.) The file a
        // publish makes is empty: one with bytes in it, or anything but a regular file, is not
        // the agent's, and vouching for it kept a released publication alive for good (a
        // twenty-fifth fresh review's F5). A stat that fails counts as there: kept, never
        // dropped on a guess.
        let file_there = entry.as_ref().is_some_and(|e| match e.stat() {
            Ok(Some(st)) => st.kind == crate::seam::FileKind::RegularFile && st.size == 0,
            Ok(None) => false,
            Err(_) => true,
        });
        let found = match &entry {
            Some(entry) => holder(ctx, &**entry, &expected)?,
            None => Holder::Nothing,
        };
        match found {
            Holder::Volume(_) if publication.progress == Progress::Complete => {
                tracing::info!(volume = vol, target = %target.display(), "recovery: published as recorded");
            }
            Holder::Volume(bound) => {
                // The bind intent was durable and the bind is there: only the completion was
                // lost. The bind may be anyone's made while the agent was down (root's mount of
                // the volume at the target, without `nodev`: a sixty-fourth fresh review's F2):
                // completed only if it is what the publish binds.
                let adopted = match &entry {
                    Some(entry) => super::adopted::adopt_publication(
                        ctx,
                        &publication,
                        staged.as_ref(),
                        &**entry,
                        &bound,
                    ),
                    None => Ok(()),
                };
                if let Err(e) = adopted {
                    tracing::warn!(volume = vol, target = %target.display(), error = %e,
                        "recovery: the publication's bind is there but is not what the publish would bind (nodev, read-only, its read-only device); left in progress, the next NodePublishVolume asks again");
                    continue;
                }
                let mut done = publication.clone();
                done.progress = Progress::Complete;
                write(ctx, |w| w.put_publication(&done))?;
                report.completed += 1;
                tracing::info!(volume = vol, target = %target.display(),
                    "recovery: the publication's bind is there; record completed");
            }
            Holder::Foreign(what) => {
                tracing::warn!(volume = vol, target = %target.display(), %what,
                    "recovery: the publication's target holds a mount that is not the volume's; record kept, NodeUnpublishVolume will refuse until it is removed");
            }
            // A block publish interrupted before its bind: the durable intent vouches for the
            // target file the agent made, so the retry may use it (or unpublish remove it);
            // without the record the retry would refuse the file as not the agent's.
            Holder::Nothing
                if publication.block
                    && file_there
                    && publication.progress == Progress::InProgress =>
            {
                tracing::warn!(volume = vol, target = %target.display(),
                    "recovery: a block publish was interrupted before its bind; the next NodePublishVolume resumes it");
            }
            // The bind went (a reboot) but the file the agent made for it stays: dropping the
            // record would leave kubelet's re-publish after the reboot refused for good ("the
            // agent did not create it"; found by the simulation once it ran start-up recovery).
            // Kept as an intent: the retry binds again, or the unpublish removes the file.
            Holder::Nothing if publication.block && file_there => {
                let mut intent = publication.clone();
                intent.progress = Progress::InProgress;
                write(ctx, |w| w.put_publication(&intent))?;
                tracing::warn!(volume = vol, target = %target.display(),
                    "recovery: a block publication's bind is gone (reboot?); the record is kept for the file the agent made, the next NodePublishVolume binds again");
            }
            Holder::Nothing => {
                tracing::warn!(volume = vol, target = %target.display(),
                    "recovery: the publication's mount is gone; record dropped");
                write(ctx, |w| w.delete_publication(vol, target))?;
                ctx.claims.forget(vol, target);
                report.dropped_publications += 1;
            }
        }
    }
    Ok(report)
}

/// One durable write of the ledger.
fn write(
    ctx: &NodeCtx,
    change: impl FnOnce(&mut dyn LedgerWriter) -> LedgerResult<()>,
) -> Result<()> {
    Ok(ctx.ledger.write(Durability::Immediate, Box::new(change))?)
}
