//! NodeUnpublishVolume: take the volume's bind away from a target path, and nothing else. A mount
//! there that the host does not show to be the volume's is left alone, whatever the records say.

use crate::records::{Durability, Phase};

use super::claims::Use;
use super::host::Entry;
use super::journal::{Journal, detail};
use super::ownership::{Expected, Holder, holder};
use super::{NodeCtx, path_handles, path_string, ro_tag};
use crate::error::{Error, Result};
use crate::request::{RequestPath, VolumeId};
use crate::seam::Removed;
use crate::seam::Unmounted;
use crate::steps::{Op, Step};

pub struct UnpublishCommand {
    pub volume: VolumeId,
    pub target: RequestPath,
}

pub fn unpublish(ctx: &NodeCtx, cmd: &UnpublishCommand) -> Result<()> {
    let vol = &cmd.volume;
    let target_path = cmd.target.as_path();
    let _turn = ctx
        .claims
        .take(vol.as_str(), target_path, Use::Target, false)?;
    let record = ctx.ledger.publication(vol.as_str(), target_path)?;
    let recorded = record.is_some();
    // The volume's own staging path is no target: unpublishing it unmounted the staging under
    // its live publications (a seventy-sixth fresh review's F1, low); a publish refuses it too.
    if !recorded
        && let Some(staged) = ctx.ledger.staged(vol.as_str())?
        && staged.staging_path == target_path
    {
        return Err(Error::PathOfAnotherVolume {
            path: target_path.to_path_buf(),
            how: "is",
            usage: "staging path",
            volume: vol.to_string(),
            theirs: staged.staging_path,
        });
    }
    // A read-only raw block publication binds a read-only device of the agent's (see ro_tag).
    let ro_device = record.as_ref().is_some_and(|p| p.block && p.readonly);
    let journal = Journal::new(ctx, vol, Op::Unpublish);
    let facts = detail([("target", path_string(target_path))]);
    let Some(target) = path_handles::lookup(ctx, &cmd.target)? else {
        if ro_device {
            detach_ro_device(ctx, &journal, vol, target_path)?;
        }
        return forget(ctx, &journal, cmd, recorded, facts);
    };
    let staged = ctx.ledger.staged(vol.as_str())?;
    let expected = Expected::of(ctx, vol.as_str(), staged.as_ref());
    // The kernel's copy of another of the volume's mounts (a shared directory's peer shows its
    // staging, or another publication, there): unmounting it propagates back and takes that
    // down (a seventy-fourth fresh review's F1). Never published here, it is left as it is.
    // A recorded publication is the agent's own bind, never taken where it is such a copy (the
    // question reads the whole mount table: not asked on the common path).
    if !recorded
        && matches!(holder(ctx, &*target, &expected)?, Holder::Volume(_))
        && let Some(of) = super::adopted::copy_of_a_recorded_mount(ctx, vol.as_str(), &*target)?
    {
        tracing::info!(volume = %vol, target = %target_path.display(), copy_of = %of.display(),
            "left alone: the mount there is the kernel's copy of another of the volume's mounts");
        return Ok(());
    }
    let unmounted = take_down(ctx, &journal, &*target, &expected, recorded, "publication")?;
    if recorded || unmounted {
        // What publish created; a directory that is not empty is not ours to delete.
        match target
            .remove()
            .map_err(|e| Error::io(format!("removing {}", target_path.display()), e))?
        {
            Removed::Kept => {
                tracing::warn!(target = %target_path.display(), "target is not empty; left in place")
            }
            Removed::Removed | Removed::Absent => {}
        }
    }
    if ro_device {
        // After the unmount and the target's removal, which takes with it the copies of the
        // bind other mount namespaces hold at the target (the host refuses the detach while a
        // bind of the device is left anywhere); a retry, after a crash or a refusal, finds the
        // target gone and detaches above.
        detach_ro_device(ctx, &journal, vol, target_path)?;
    }
    forget(ctx, &journal, cmd, recorded, facts)
}

fn detach_ro_device(
    ctx: &NodeCtx,
    journal: &Journal<'_>,
    vol: &VolumeId,
    target: &std::path::Path,
) -> Result<()> {
    let tag = ro_tag::tag(ctx, vol.as_str(), target);
    journal
        .step(
            Step::DetachRoDevice,
            detail([("tag", tag.clone())]),
            Durability::Lazy,
            || ctx.host.remove_read_only(&tag),
        )
        .map(drop)
}

fn forget(
    ctx: &NodeCtx,
    journal: &Journal<'_>,
    cmd: &UnpublishCommand,
    recorded: bool,
    facts: super::journal::Detail,
) -> Result<()> {
    if !recorded {
        return Ok(());
    }
    // Lazy: if this line is lost, recovery finds the mount gone and drops the record itself.
    journal.record(
        Step::Unpublished,
        Phase::Done,
        facts,
        Durability::Lazy,
        |w| w.delete_publication(cmd.volume.as_str(), cmd.target.as_path()),
    )?;
    ctx.claims.forget(cmd.volume.as_str(), cmd.target.as_path());
    Ok(())
}

/// How many of the volume's mounts stacked at one path (each a crashed earlier call's) one call
/// takes down before it gives up.
const MAX_UNMOUNTS: usize = 8;

/// Unmounts the volume's mounts at `entry` (a crashed earlier call may have stacked two) and
/// stops at anything else. Returns whether it unmounted something. A foreign mount over a path
/// the records give the volume is an error: the volume's own mount may lie beneath it.
pub fn take_down(
    ctx: &NodeCtx,
    journal: &Journal<'_>,
    entry: &dyn Entry,
    expected: &Expected,
    recorded: bool,
    what: &'static str,
) -> Result<bool> {
    let path = entry.path();
    let mut unmounted = false;
    // The host is asked once more after the last unmount: eight stacked mounts, all taken
    // down, are a success.
    for round in 0..=MAX_UNMOUNTS {
        let found = holder(ctx, entry, expected)?;
        let own_bind = recorded
            && matches!(found, Holder::Foreign(_))
            && binds_the_recorded_number(entry, expected)?
            && ctx.claims.another_volumes(&expected.volume, path).is_none();
        match found {
            Holder::Nothing => return Ok(unmounted),
            Holder::Foreign(found) if recorded && !unmounted && !own_bind => {
                return Err(Error::CoveredMount {
                    path: path.to_path_buf(),
                    found,
                    expected: expected.describe(),
                    what,
                });
            }
            Holder::Foreign(found) if !own_bind => {
                tracing::info!(volume = %expected.volume, path = %path.display(), %found,
                    "left alone: the mount there is not the volume's");
                return Ok(unmounted);
            }
            _ if round == MAX_UNMOUNTS => break,
            _ => {
                if own_bind {
                    tracing::warn!(volume = %expected.volume, path = %path.display(),
                        "the device this bind was made of was replaced under it (detached outside the agent, its number given to another device); taking the bind down");
                }
                unmount_once(journal, entry)?;
                unmounted = true;
            }
        }
    }
    Err(Error::StillMounted {
        path: path.to_path_buf(),
    })
}

/// Lazy, unlike the intents of publish and stage: nothing resumes from an unmount's intent.
/// After a crash the host says whether the unmount happened.
fn unmount_once(journal: &Journal<'_>, entry: &dyn Entry) -> Result<()> {
    let path = entry.path();
    let done = journal.step(
        Step::Unmount,
        detail([("path", path_string(path))]),
        Durability::Lazy,
        || {
            entry
                .unmount()
                .map_err(|e| Error::io(format!("unmounting {}", path.display()), e))
        },
    )?;
    match done {
        Unmounted::Detached => tracing::warn!(path = %path.display(),
            "mount was dead (ENOTCONN/ESTALE); detached lazily"),
        Unmounted::Done | Unmounted::NotMounted => {}
    }
    Ok(())
}

/// A bind of a device node with the numbers the volume's record noted, at a path the volume's
/// records place: the volume's own raw bind, whose device was replaced under it (detached
/// outside the agent, the number given to another device). Taking it down takes a view of
/// another device away from the volume's workload and nothing from that device's owner, whose
/// binds are at paths of its own.
fn binds_the_recorded_number(entry: &dyn Entry, expected: &Expected) -> Result<bool> {
    let Some(recorded) = expected.recorded_devnum() else {
        return Ok(false);
    };
    let facts = entry.mounted_at().map_err(|e| Error::MountUnreadable {
        path: entry.path().to_path_buf(),
        source: e,
    })?;
    Ok(facts.is_some_and(|f| {
        f.node.kind == crate::seam::FileKind::BlockDevice && f.node.rdev == recorded
    }))
}
