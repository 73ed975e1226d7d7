//! Volume condition: is what the agent set up still there and still the volume? Every check is
//! cheap (a statx and a statmount per path, one ioctl, one 4 KiB read) and runs no external
//! command and no read of the mount table, because kubelet asks for stats of every volume every
//! minute.

use crate::DevNum;
use std::io;
use std::path::Path;

use crate::records::{AccessRecord, StagedVolume};

use super::NodeCtx;
use super::ownership::{Expected, Holder, holder};
use super::path_handles;
use crate::seam::{MountFacts, ReadOutcome};

/// What NodeGetVolumeStats reports as VolumeCondition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Condition {
    pub abnormal: bool,
    pub message: String,
}

impl Condition {
    fn from_problems(problems: Vec<String>) -> Self {
        if problems.is_empty() {
            return Condition {
                abnormal: false,
                message: "volume is healthy".into(),
            };
        }
        Condition {
            abnormal: true,
            message: problems.join("; "),
        }
    }
}

/// Findings about one volume, seen from `volume_path` (its staging path or a publication).
pub struct Findings {
    pub condition: Condition,
    /// The mount at `volume_path` is the volume's filesystem: statvfs there measures the volume.
    pub fs_mounted: bool,
    /// The device is present and answers: its size is the volume's size.
    pub device_ok: bool,
}

pub fn examine(ctx: &NodeCtx, staged: &StagedVolume, volume_path: &Path) -> Findings {
    let mut problems = Vec::new();
    let device = staged.device.as_path();
    let expected = Expected::of(ctx, &staged.volume_id, Some(staged));
    let device_ok = match ctx.host.block_devnum(device) {
        Ok(devnum) => check_device(ctx, &expected, staged, devnum, &mut problems),
        Err(e) => {
            problems.push(format!(
                "the device {} has disappeared ({e}); the volume was detached or the device \
                 failed: check the attachment, then unstage and stage the volume again",
                device.display()
            ));
            false
        }
    };
    let fs_mounted = match &staged.access {
        AccessRecord::Mount { .. } => {
            check_fs_mounts(ctx, staged, &expected, volume_path, &mut problems)
        }
        AccessRecord::Block => {
            if volume_path != staged.staging_path {
                check_path(ctx, staged, &expected, volume_path, &mut problems);
            }
            false
        }
    };
    Findings {
        condition: Condition::from_problems(problems),
        fs_mounted,
        device_ok,
    }
}

/// Size, identity and a real read. Stops at the first failure: once a device is gone, asking
/// whether it is still the volume only adds noise. The proof is `expected`'s, so the mounts
/// checked next need none of their own.
fn check_device(
    ctx: &NodeCtx,
    expected: &Expected,
    staged: &StagedVolume,
    devnum: DevNum,
    problems: &mut Vec<String>,
) -> bool {
    let device = staged.device.as_path();
    match ctx.host.device_bytes(device) {
        Ok(0) => {
            problems.push(format!(
                "the device {} has disappeared (it reports a size of 0: detached); check the \
                 attachment, then unstage and stage the volume again",
                device.display()
            ));
            return false;
        }
        Ok(_) => {}
        Err(e) => {
            problems.push(format!(
                "the device {} cannot be sized: {e}",
                device.display()
            ));
            return false;
        }
    }
    if let Err(why) = expected.prove(ctx, devnum) {
        problems.push(format!(
            "the device {} no longer carries volume {}: {why}; the data seen at its mounts is \
             not this volume's: unpublish and unstage it, then find out who changed the device",
            device.display(),
            staged.volume_id
        ));
        return false;
    }
    match ctx.host.read_first_block(device) {
        ReadOutcome::Ok => true,
        ReadOutcome::IoError(_) => {
            problems.push(format!(
                "reading the first 4 KiB of {} failed with an I/O error: the device or the \
                 storage behind it is failing; copy the data off and replace the volume",
                device.display()
            ));
            false
        }
        ReadOutcome::Failed(e) => {
            problems.push(format!(
                "reading the first 4 KiB of {} failed: {}",
                device.display(),
                describe(&e)
            ));
            false
        }
        ReadOutcome::Hanging(for_) => {
            problems.push(format!(
                "a 4 KiB read of {} has not returned for {} s: the device is hanging (an \
                 impaired volume?); check the volume's status with the storage provider",
                device.display(),
                for_.as_secs()
            ));
            false
        }
    }
}

fn describe(e: &io::Error) -> String {
    match e.kind() {
        io::ErrorKind::UnexpectedEof => format!("{e} (the device shrank?)"),
        _ => e.to_string(),
    }
}

/// The staging mount carries every publication: check it, and `volume_path` when it is a
/// publication. Returns whether `volume_path` holds the volume's filesystem.
fn check_fs_mounts(
    ctx: &NodeCtx,
    staged: &StagedVolume,
    expected: &Expected,
    volume_path: &Path,
    problems: &mut Vec<String>,
) -> bool {
    let staging = staged.staging_path.as_path();
    let at_staging = check_path(ctx, staged, expected, staging, problems);
    if let Some(m) = &at_staging
        && read_only_after_errors(staged, m)
    {
        problems.push(format!(
            "the filesystem on {} is read-only although it was mounted read-write: the kernel \
             remounted it after errors (see the kernel log); writes fail: unpublish and \
             unstage the volume, repair the filesystem, and stage it again",
            staged.device.display()
        ));
    }
    if volume_path == staging {
        return at_staging.is_some();
    }
    check_path(ctx, staged, expected, volume_path, problems).is_some()
}

/// What holds one of the volume's paths; a problem when it is not the volume.
fn check_path(
    ctx: &NodeCtx,
    staged: &StagedVolume,
    expected: &Expected,
    path: &Path,
    problems: &mut Vec<String>,
) -> Option<MountFacts> {
    let found = path_handles::lookup_recorded(ctx, path).and_then(|entry| match entry {
        Some(entry) => holder(ctx, &*entry, expected),
        None => Ok(Holder::Nothing),
    });
    match found {
        Ok(Holder::Volume(m)) => Some(m),
        Ok(Holder::Nothing) => {
            problems.push(gone_message(staged, path));
            None
        }
        Ok(Holder::Foreign(what)) => {
            problems.push(format!(
                "{} holds {what}, not the volume's device {}; something was mounted over it \
                 behind the agent's back",
                path.display(),
                staged.device.display()
            ));
            None
        }
        Err(e) => {
            problems.push(format!("{} cannot be inspected: {e}", path.display()));
            None
        }
    }
}

fn read_only_after_errors(staged: &StagedVolume, m: &MountFacts) -> bool {
    !staged.readonly && m.super_read_only
}

fn gone_message(staged: &StagedVolume, path: &Path) -> String {
    if path == staged.staging_path {
        format!(
            "the volume is no longer mounted at its staging path {} (unmounted behind the \
             agent's back); new publications will fail: unstage and stage it again",
            path.display()
        )
    } else {
        format!(
            "the volume is no longer mounted at {} (unmounted behind the agent's back); the \
             workload sees an empty directory: restart it so that the volume is published again",
            path.display()
        )
    }
}
