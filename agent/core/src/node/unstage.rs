//! NodeUnstageVolume: refuse while the volume is still published, take the volume's own mount
//! away from the staging path (and nothing else), forget the staging. The staging directory
//! itself belongs to the CO; the format fact stays.

use crate::records::{AccessRecord, Durability, FormatState, Phase};

use super::claims::Use;
use super::journal::{Journal, detail};
use super::ownership::{Expected, holder};
use super::unpublish::take_down;
use super::{NodeCtx, path_handles, path_string};
use crate::error::{Error, Result};
use crate::request::{RequestPath, VolumeId};
use crate::steps::{Op, Step};

pub struct UnstageCommand {
    pub volume: VolumeId,
    pub staging: RequestPath,
}

pub fn unstage(ctx: &NodeCtx, cmd: &UnstageCommand) -> Result<()> {
    let vol = &cmd.volume;
    let staging_path = cmd.staging.as_path();
    let _turn = ctx
        .claims
        .take(vol.as_str(), staging_path, Use::Staging, false)?;
    let staged = ctx.ledger.staged(vol.as_str())?;
    // A raw block staging rebuilt from the mount table (`recover --from-mounts`) knows no staging
    // path (nothing is mounted there): any unstage of the volume is its unstage, but at a path
    // the records give another volume.
    let recorded = staged.as_ref().is_some_and(|s| {
        s.staging_path == staging_path
            || (s.staging_path.as_os_str().is_empty()
                && matches!(s.access, AccessRecord::Block)
                && ctx
                    .claims
                    .another_volumes(vol.as_str(), staging_path)
                    .is_none())
    });
    let expected = Expected::of(ctx, vol.as_str(), staged.as_ref());

    // Each recorded publication, asked of the host: a workload still using the volume keeps it.
    let mut published = Vec::new();
    for p in ctx.ledger.publications(vol.as_str())? {
        if let Some(entry) = path_handles::lookup_recorded(ctx, &p.target_path)?
            && holder(ctx, &*entry, &expected)?.is_volume()
        {
            published.push(p.target_path.display().to_string());
        }
    }
    if !published.is_empty() {
        return Err(Error::StillPublished {
            volume: vol.to_string(),
            targets: published.join(", "),
        });
    }

    // Only at the recorded path itself is a bind of the recorded numbers the volume's own: a
    // raw block staging mounts nothing at its staging path, and a rebuilt one knows no path.
    let at_recorded_path = staged
        .as_ref()
        .is_some_and(|s| s.staging_path == staging_path);
    let journal = Journal::new(ctx, vol, Op::Unstage);
    let facts = detail([("staging", path_string(staging_path))]);
    let mut device = expected.recorded_devnum();
    if let Some(entry) = path_handles::lookup(ctx, &cmd.staging)? {
        if let super::ownership::Holder::Volume(m) = holder(ctx, &*entry, &expected)? {
            device = Some(m.dev);
        }
        take_down(
            ctx,
            &journal,
            &*entry,
            &expected,
            at_recorded_path,
            "staging mount",
        )?;
    }
    let is_fs = staged
        .as_ref()
        .is_none_or(|s| matches!(s.access, AccessRecord::Mount { .. }));
    // A publication the agent has no record of (records lost, or a bind made behind its back)
    // still holds the filesystem: the kernel still claims the device. The staging mount is gone
    // by now, which no workload notices; the record stays until the filesystem is free, so the
    // CO does not detach a volume in use.
    // Only at the volume's own staging path, or with no record to say where that is: at another
    // path nothing of the volume was taken away, and it stays staged where it is.
    let here = recorded || staged.is_none();
    if is_fs
        && here
        && let Some(dev) = device
        && expected.is_device(ctx, dev)
        && ctx.host.still_claimed(dev, expected.held(dev))
    {
        return Err(Error::FilesystemInUse {
            volume: vol.to_string(),
        });
    }
    if !recorded {
        // The CO is done with the volume here: a format intent of a stage that never finished
        // licenses nothing any more, and the device is free for another id (`device_claim`).
        if staged.is_none() && ctx.ledger.publications(vol.as_str())?.is_empty() {
            void_intent(ctx, vol)?;
        }
        // With no record in view the OK must still outlive a crash: a record a failed stage
        // dropped lazily came back at the restart, its unstage already answered (the long
        // simulation's seed 10116203). One durable commit carries every lazy write before it.
        if staged.is_none() && ctx.ledger.knows_volume(vol.as_str())? {
            ctx.ledger.sync()?;
        }
        return Ok(());
    }
    // Durable before the answer: a release the CO was told of must survive a crash. Lazy, a
    // raw block staging (nothing on the host shows it) or a stage whose completion was still
    // lazy came back at the restart, held the device from every other door and kept the loop
    // controller's detach refused for good (a twenty-fourth fresh review's F2; the simulation
    // finds it once it checks that releases stay released).
    // A node-local handle names a place, not a volume: once it is unstaged its format record
    // goes too, so a disk replaced under the same name is judged afresh (blank: formatted; a
    // filesystem: used), not refused forever as "formatted, now wiped".
    // Durable, not `Boot`, even for a filesystem staging, whose mount a reboot takes: a power
    // cut after the OK brought the record back as the last durable commit had it, a stage in
    // progress (its completion is lazy), which start-up keeps for a retry the CO never makes
    // (the long simulation's seeds 30066061 and 30072108, once this was `Boot`).
    let durability = Durability::Immediate;
    journal.record(Step::Unstaged, Phase::Done, facts, durability, |w| {
        w.delete_staged(vol.as_str())?;
        if vol.is_local() && ctx.ledger.format(vol.as_str())?.is_some() {
            w.delete_format(vol.as_str())?;
        }
        Ok(())
    })?;
    ctx.claims.forget(vol.as_str(), staging_path);
    Ok(())
}

/// Drops the volume's format intent, if it has one (a lazy write: lost in a crash, the intent
/// stays and so does the volume's hold on its device, which only refuses more).
fn void_intent(ctx: &NodeCtx, vol: &VolumeId) -> Result<()> {
    if ctx
        .ledger
        .format(vol.as_str())?
        .is_some_and(|f| f.state == FormatState::Intent || vol.is_local())
    {
        ctx.ledger.write(
            Durability::Lazy,
            Box::new(|w| w.delete_format(vol.as_str())),
        )?;
    }
    Ok(())
}
