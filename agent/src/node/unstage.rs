//! NodeUnstageVolume: refuse while any publication is still mounted, unmount the staging path,
//! forget the staging. The staging directory itself belongs to the CO; the format fact stays.

use ebs_store::{Durability, Phase};

use super::journal::{Journal, detail};
use super::publish::unmount_all;
use super::{NodeCtx, mount_table, path_string};
use crate::backend::block_dev_numbers;
use crate::error::{Error, Result};
use crate::request::{ConfinedPath, VolumeId};

pub struct UnstageCommand {
    pub volume: VolumeId,
    pub staging: ConfinedPath,
}

pub fn unstage(ctx: &NodeCtx, cmd: &UnstageCommand) -> Result<()> {
    let vol = cmd.volume.as_str();
    let staging = cmd.staging.as_path();
    let staged = ctx.store.staged(vol)?;
    let table = mount_table()?;

    let published: Vec<String> = ctx
        .store
        .publications(vol)?
        .into_iter()
        .filter(|p| table.at(&p.target_path).is_some())
        .map(|p| p.target_path.display().to_string())
        .collect();
    if !published.is_empty() {
        return Err(Error::Precondition(format!(
            "volume {vol} is still published at {}; unpublish it first",
            published.join(", ")
        )));
    }
    let at_staging = table.at(staging).cloned();
    if let Some(s) = &staged
        && let Ok((major, minor)) = block_dev_numbers(&s.device)
    {
        // A lost publication record must not let us pull the filesystem from under a workload.
        let elsewhere: Vec<String> = table
            .mounts_of_device(major, minor)
            .filter(|m| m.mount_point != staging)
            .map(|m| m.mount_point.display().to_string())
            .collect();
        if matches!(s.access, ebs_store::AccessRecord::Mount { .. }) && !elsewhere.is_empty() {
            return Err(Error::Precondition(format!(
                "volume {vol} is still mounted at {}; unpublish it first",
                elsewhere.join(", ")
            )));
        }
        if let Some(m) = &at_staging
            && (m.major, m.minor) != (major, minor)
        {
            return Err(Error::Precondition(format!(
                "{} holds a mount of {} that is not volume {vol}; not unmounting it",
                staging.display(),
                m.source
            )));
        }
    }

    let journal = Journal::new(&ctx.store, vol, "unstage", ctx.crash_after());
    let facts = detail([("staging", path_string(staging))]);
    if at_staging.is_some() {
        // Lazy: as for unpublish, the host and not the journal says whether the unmount
        // happened, so the intent's fsync would buy nothing a retry or recovery reads.
        journal.step("unmount", facts.clone(), Durability::Lazy, || {
            unmount_all(staging)
        })?;
    }
    if staged.is_none() && at_staging.is_none() {
        return Ok(());
    }
    // Lazy: if this line is lost, recovery finds the staging mount gone and drops the record.
    journal.record("unstaged", Phase::Done, facts, Durability::Lazy, |w| {
        w.delete_staged(vol)
    })
}
