//! Start-up recovery: before Probe reports ready, reconcile the journal's records with the mount
//! table. Records of mounts that a reboot (or an operator) removed are dropped, so the next call
//! redoes the work; half-done steps are left for the retry, which resumes from the host's state.
//! One log line per volume says what was found and done.

use std::path::Path;

use ebs_store::{AccessRecord, Durability, FormatState, Progress, Store};

use crate::backend::{Backend, block_dev_numbers};
use crate::error::Result;
use crate::host::mountinfo::MountTable;
use crate::node::mount_table;
use crate::node::publish::is_ours;

#[derive(Debug, Default)]
pub struct RecoveryReport {
    pub volumes: usize,
    pub dropped_stagings: usize,
    pub dropped_publications: usize,
}

fn staged_mount_present(table: &MountTable, device: &Path, staging: &Path) -> bool {
    let Ok((major, minor)) = block_dev_numbers(device) else {
        return false;
    };
    table
        .at(staging)
        .is_some_and(|m| m.major == major && m.minor == minor)
}

pub fn recover(store: &Store, backend: &dyn Backend) -> Result<RecoveryReport> {
    let table = mount_table()?;
    let mut report = RecoveryReport::default();
    for staged in store.all_staged()? {
        report.volumes += 1;
        let vol = staged.volume_id.as_str();
        let present = match staged.access {
            AccessRecord::Mount { .. } => {
                staged_mount_present(&table, &staged.device, &staged.staging_path)
            }
            AccessRecord::Block => backend.still_is(&staged.device, &staged.identity).is_ok(),
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
                // The mount step was done (its intent is durable, the mount is ours): the stage
                // completed, or its retry will only find the mount and carry on.
                let mut done = staged.clone();
                done.progress = Progress::Complete;
                store.write(Durability::Immediate, |w| w.put_staged(&done))?;
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
        let present = table.at(target).is_some_and(|m| {
            store
                .staged(vol)
                .ok()
                .flatten()
                .is_some_and(|s| is_ours(&s, m, target))
        });
        if present {
            tracing::info!(volume = vol, target = %target.display(), "recovery: published as recorded");
            continue;
        }
        tracing::warn!(volume = vol, target = %target.display(),
            "recovery: the publication's mount is gone; record dropped");
        store.write(Durability::Immediate, |w| w.delete_publication(vol, target))?;
        report.dropped_publications += 1;
    }
    for id in store.known_volume_ids()? {
        if let Some(f) = store.format(&id)?
            && f.state == FormatState::Intent
        {
            tracing::warn!(volume = %id, uuid = %f.uuid,
                "recovery: mkfs was interrupted; the next stage formats again only if the device shows nothing or our own filesystem");
        }
    }
    Ok(report)
}
