//! Start-up recovery: before Probe reports ready, reconcile the journal's records with the host.
//! Every step whose effect the host shows is completed (a staging mount of the volume → the stage
//! is complete; a bind of it at a target → the publication is complete); records of mounts that a
//! reboot (or an operator) removed are dropped, so the next call redoes the work. Half-done steps
//! with nothing on the host are left for the retry, which resumes from the host's state (and is
//! never held to the failed call's arguments). One log line per volume says what was found.

use ebs_store::{AccessRecord, Durability, FormatState, Progress};

use super::NodeCtx;
use super::compat::staged_mount_present;
use super::ownership::{Expected, Holder, holder};
use super::paths;
use crate::error::Result;

#[derive(Debug, Default)]
pub struct RecoveryReport {
    pub volumes: usize,
    pub dropped_stagings: usize,
    pub dropped_publications: usize,
    pub completed: usize,
    /// Volumes forgotten: only lines of calls that changed nothing named them.
    pub pruned: usize,
}

pub fn recover(ctx: &NodeCtx) -> Result<RecoveryReport> {
    let store = &ctx.store;
    let mut report = RecoveryReport::default();
    for staged in store.all_staged()? {
        report.volumes += 1;
        let vol = staged.volume_id.as_str();
        let present = match staged.access {
            AccessRecord::Mount { .. } => staged_mount_present(ctx, &staged)?,
            AccessRecord::Block => ctx
                .backend
                .still_is(&staged.device, &staged.identity)
                .is_ok(),
        };
        match (staged.progress, present) {
            (Progress::Complete, true) => {
                tracing::info!(volume = vol, staging = %staged.staging_path.display(), "recovery: staged and mounted as recorded");
            }
            (Progress::Complete, false) => {
                tracing::warn!(volume = vol, staging = %staged.staging_path.display(),
                    "recovery: the staging mount is gone (reboot?); record dropped, the next NodeStageVolume remounts");
                store.write(Durability::Immediate, |w| w.delete_staged(vol))?;
                report.dropped_stagings += 1;
            }
            (Progress::InProgress, true) if matches!(staged.access, AccessRecord::Mount { .. }) => {
                let mut done = staged.clone();
                done.progress = Progress::Complete;
                store.write(Durability::Immediate, |w| w.put_staged(&done))?;
                report.completed += 1;
                tracing::info!(volume = vol, staging = %staged.staging_path.display(),
                    "recovery: the stage had mounted the volume; record completed");
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
    for publication in store.all_publications()? {
        let vol = publication.volume_id.as_str();
        let target = publication.target_path.as_path();
        let staged = store.staged(vol)?;
        let expected = Expected::of(ctx, vol, staged.as_ref());
        let found = match paths::lookup_recorded(ctx, target)? {
            Some(entry) => holder(ctx, &entry, &expected)?,
            None => Holder::Nothing,
        };
        match found {
            Holder::Volume(_) if publication.progress == Progress::Complete => {
                tracing::info!(volume = vol, target = %target.display(), "recovery: published as recorded");
            }
            Holder::Volume(_) => {
                // The bind intent was durable and the bind is there: only the completion was lost.
                let mut done = publication.clone();
                done.progress = Progress::Complete;
                store.write(Durability::Immediate, |w| w.put_publication(&done))?;
                report.completed += 1;
                tracing::info!(volume = vol, target = %target.display(),
                    "recovery: the publication's bind is there; record completed");
            }
            Holder::Foreign(what) => {
                tracing::warn!(volume = vol, target = %target.display(), %what,
                    "recovery: the publication's target holds a mount that is not the volume's; record kept, NodeUnpublishVolume will refuse until it is removed");
            }
            Holder::Nothing => {
                tracing::warn!(volume = vol, target = %target.display(),
                    "recovery: the publication's mount is gone; record dropped");
                store.write(Durability::Immediate, |w| w.delete_publication(vol, target))?;
                report.dropped_publications += 1;
            }
        }
    }
    report.pruned = super::journal::prune_never_staged(store)?;
    for id in store.known_volume_ids()? {
        if let Some(f) = store.format(&id)?
            && f.state == FormatState::Intent
        {
            tracing::warn!(volume = %id, uuid = %f.uuid,
                "recovery: an mkfs was interrupted or failed; the next stage formats again only if the device is still blank or carries that UUID");
        }
    }
    ctx.claims.reload(store)?;
    Ok(report)
}
