//! A filesystem stage a crash cut between its mount and its completion. Once mounted, a stage
//! asks again whether anything else uses the device (a view of its bytes used, a bind of its
//! node made while e2fsck ran), and takes its own mount down on a hit. A crash in between leaves
//! only the mount for recovery to find: completing the record then, without asking, let a
//! publish hand out a device bound elsewhere (a fifty-sixth fresh review's F1). So recovery asks
//! the same questions first, and on a hit unstages the mount, through the unstage every door
//! uses; a question it cannot answer leaves the stage in progress, and the next publish (kubelet
//! stages a volume once, and publishes it for every pod) or the stage's retry asks again.

use crate::error::{Error, Result};
use crate::records::{AccessRecord, Durability, Phase, Progress, StagedVolume};
use crate::request::{RequestPath, VolumeId};
use crate::steps::{Op, Step};

use super::journal::{Journal, detail};
use super::ownership::Expected;
use super::unstage::{UnstageCommand, unstage};
use super::volume_device::VolumeDevice;
use super::{NodeCtx, path_handles, path_string};

/// What recovery made of an interrupted stage whose mount is there.
#[derive(Debug)]
pub enum Verdict {
    /// Nothing else uses the device: the stage may be completed.
    Complete,
    /// Something else uses it (`refusal`): the stage was unstaged, or could not be (`unstaged`:
    /// a publication holds it, or the unmount failed) and is left in progress.
    Refused {
        refusal: Error,
        unstaged: Result<()>,
    },
    /// The questions (or the take-down) could not be answered: left in progress.
    Unanswered(Error),
}

/// Asks an interrupted stage's post-mount questions, and unstages it when they refuse.
pub fn judge(ctx: &NodeCtx, staged: &StagedVolume) -> Verdict {
    let refusal = match post_mount_checks(ctx, staged) {
        Ok(()) => return Verdict::Complete,
        Err(e) if refuses(&e) => e,
        Err(e) => return Verdict::Unanswered(e),
    };
    Verdict::Refused {
        refusal,
        unstaged: take_down(ctx, staged),
    }
}

/// The stage's own questions, on the device its record names: held, proven the volume's, its
/// other views checked and held, then raw use of it and of them.
fn post_mount_checks(ctx: &NodeCtx, staged: &StagedVolume) -> Result<()> {
    let mut device = VolumeDevice::hold_recorded(ctx, staged)?;
    device.hold_views(ctx)?;
    device.recheck_views(ctx)
}

/// The answers that say the device is someone else's, as the stage's own refusals do.
fn refuses(e: &Error) -> bool {
    matches!(
        e,
        Error::DeviceStillBound { .. }
            | Error::BytesInUseElsewhere { .. }
            | Error::AnotherAgentsDevice { .. }
            | Error::DeviceClaimed { .. }
    )
}

/// NodeUnstageVolume of the record's own volume and path, as if the CO had asked: it refuses
/// while a publication holds the volume, and takes away the volume's own mount only.
fn take_down(ctx: &NodeCtx, staged: &StagedVolume) -> Result<()> {
    let volume = VolumeId::parse(&staged.volume_id)?;
    let raw = staged.staging_path.to_str().unwrap_or_default();
    let staging = RequestPath::parse("staging_target_path", raw, &ctx.roots)?;
    unstage(ctx, &UnstageCommand { volume, staging })
}

/// A publish's way through an interrupted stage: the questions asked, the record completed
/// (durably: a publication will rest on it), or the refusal (the stage unstaged if it could be)
/// or the reason they could not be answered.
pub fn finish(ctx: &NodeCtx, staged: &StagedVolume) -> Result<StagedVolume> {
    match judge(ctx, staged) {
        Verdict::Complete => complete(ctx, staged),
        Verdict::Refused { refusal, unstaged } => {
            if let Err(e) = unstaged {
                tracing::warn!(volume = %staged.volume_id, error = %e,
                    "an interrupted stage whose device is in use elsewhere could not be unstaged");
            }
            Err(refusal)
        }
        Verdict::Unanswered(e) => Err(e),
    }
}

/// Writes the interrupted stage's record as complete, once its questions found nothing and its
/// mount has the attributes the stage gives one (the mount may be anyone's made since: root's,
/// without `nodev`, while the agent was down).
pub fn complete(ctx: &NodeCtx, staged: &StagedVolume) -> Result<StagedVolume> {
    let volume = VolumeId::parse(&staged.volume_id)?;
    let journal = Journal::new(ctx, &volume, Op::Stage);
    let path = &staged.staging_path;
    // A raw block staging mounts nothing of its own: nothing to adopt.
    if let AccessRecord::Mount {
        fs_type,
        mount_flags,
    } = &staged.access
    {
        let made = super::adopted::AsMade {
            readonly: staged.readonly,
            vfs_bits: super::adopted::recorded_bits(&volume, "staged", fs_type, mount_flags)?,
            staging: true,
        };
        let Some(entry) = path_handles::lookup_recorded(ctx, path)? else {
            return Err(Error::StagingChanged {
                path: path.clone(),
                volume: volume.to_string(),
            });
        };
        let expected = Expected::of(ctx, volume.as_str(), Some(staged));
        super::adopted::adopt(ctx, &*entry, &expected, volume.as_str(), made)?;
    }
    let mut done = staged.clone();
    done.progress = Progress::Complete;
    journal.record(
        Step::Staged,
        Phase::Done,
        detail([("staging", path_string(path))]),
        Durability::Immediate,
        |w| w.put_staged(&done),
    )?;
    Ok(done)
}
