//! Volume condition: is what the agent set up still there and still the volume? Every check is
//! cheap (mount table, stat, one ioctl, one 4 KiB read) and runs no external command, because
//! kubelet asks for stats of every volume every minute.

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use ebs_store::{AccessRecord, StagedVolume};

use super::read_probe::{self, ReadOutcome};
use crate::backend::{Backend, block_dev_numbers};
use crate::host::loopdev;
use crate::host::mountinfo::{MountEntry, MountTable};

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

pub fn examine(
    backend: &dyn Backend,
    staged: &StagedVolume,
    table: &MountTable,
    volume_path: &Path,
) -> Findings {
    let mut problems = Vec::new();
    let device = staged.device.as_path();
    let numbers = match block_dev_numbers(device) {
        Ok(n) => Some(n),
        Err(e) => {
            problems.push(format!(
                "the device {} has disappeared ({e}); the volume was detached or the device \
                 failed: check the attachment, then unstage and stage the volume again",
                device.display()
            ));
            None
        }
    };
    let device_ok = numbers.is_some() && check_device(backend, staged, &mut problems);
    let fs_mounted = match &staged.access {
        AccessRecord::Mount { .. } => {
            check_fs_mounts(staged, table, volume_path, numbers, &mut problems)
        }
        AccessRecord::Block => {
            check_block_publication(staged, table, volume_path, numbers, &mut problems);
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
/// whether it is still the volume only adds noise.
fn check_device(backend: &dyn Backend, staged: &StagedVolume, problems: &mut Vec<String>) -> bool {
    let device = staged.device.as_path();
    match loopdev::device_size(device) {
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
    if let Err(why) = backend.still_is(device, &staged.identity) {
        problems.push(format!(
            "the device {} no longer carries volume {}: {why}; the data seen at its mounts is \
             not this volume's: unpublish and unstage it, then find out who changed the device",
            device.display(),
            staged.volume_id
        ));
        return false;
    }
    match read_probe::probe(device, read_probe::READ_WAIT) {
        ReadOutcome::Ok => true,
        ReadOutcome::Failed(e) if e.raw_os_error() == Some(libc::EIO) => {
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
    staged: &StagedVolume,
    table: &MountTable,
    volume_path: &Path,
    numbers: Option<(u32, u32)>,
    problems: &mut Vec<String>,
) -> bool {
    let staging = staged.staging_path.as_path();
    let mut paths = vec![staging];
    if volume_path != staging {
        paths.push(volume_path);
    }
    let mut at_volume_path = false;
    for path in paths {
        let Some(entry) = table.at(path) else {
            problems.push(gone_message(staged, path));
            continue;
        };
        if let Some((major, minor)) = numbers
            && (entry.major, entry.minor) != (major, minor)
        {
            problems.push(format!(
                "{} holds {} ({} {}:{}), not the volume's device {}; something was mounted over \
                 it behind the agent's back",
                path.display(),
                entry.source,
                entry.fs_type,
                entry.major,
                entry.minor,
                staged.device.display()
            ));
            continue;
        }
        if path == volume_path {
            at_volume_path = true;
        }
        if path == staging && read_only_after_errors(staged, entry) {
            problems.push(format!(
                "the filesystem on {} is read-only although it was mounted read-write: the kernel \
                 remounted it after errors (see the kernel log); writes fail: unpublish and \
                 unstage the volume, repair the filesystem, and stage it again",
                staged.device.display()
            ));
        }
    }
    at_volume_path
}

/// Older kernels set the superblock read-only ("ro"); ext4 since Linux 6.x keeps it "rw" and
/// adds "emergency_ro" after an error under errors=remount-ro.
fn read_only_after_errors(staged: &StagedVolume, entry: &MountEntry) -> bool {
    let emergency = entry.super_options.split(',').any(|o| o == "emergency_ro");
    !staged.readonly && (entry.super_read_only() || emergency)
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

/// A block publication is the device node bind-mounted onto a file; the staging path of a block
/// volume holds nothing.
fn check_block_publication(
    staged: &StagedVolume,
    table: &MountTable,
    volume_path: &Path,
    numbers: Option<(u32, u32)>,
    problems: &mut Vec<String>,
) {
    if volume_path == staged.staging_path {
        return;
    }
    if table.at(volume_path).is_none() {
        problems.push(gone_message(staged, volume_path));
        return;
    }
    let Some((major, minor)) = numbers else {
        return;
    };
    match std::fs::metadata(volume_path) {
        Ok(m)
            if (
                nix::sys::stat::major(m.rdev()) as u32,
                nix::sys::stat::minor(m.rdev()) as u32,
            ) == (major, minor) => {}
        Ok(_) => problems.push(format!(
            "{} is not the volume's device {} any more",
            volume_path.display(),
            staged.device.display()
        )),
        Err(e) => problems.push(format!(
            "{} cannot be inspected: {e}",
            volume_path.display()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn staged(readonly: bool) -> StagedVolume {
        StagedVolume {
            volume_id: "v".into(),
            staging_path: "/s".into(),
            device: "/dev/loop9".into(),
            identity: ebs_store::DeviceIdentity::Unverified,
            access: AccessRecord::Mount {
                fs_type: "ext4".into(),
                mount_flags: vec![],
            },
            access_mode: 1,
            readonly,
            progress: ebs_store::Progress::Complete,
            at_unix_ms: 0,
        }
    }

    fn entry(super_options: &str) -> MountEntry {
        MountEntry {
            mount_id: 1,
            parent_id: 0,
            major: 7,
            minor: 9,
            root: "/".into(),
            mount_point: "/s".into(),
            mount_options: "rw,relatime".into(),
            fs_type: "ext4".into(),
            source: "/dev/loop9".into(),
            super_options: super_options.into(),
        }
    }

    #[test]
    fn read_only_after_errors_old_and_new_kernels() {
        assert!(!read_only_after_errors(
            &staged(false),
            &entry("rw,errors=remount-ro")
        ));
        assert!(read_only_after_errors(
            &staged(false),
            &entry("ro,errors=remount-ro")
        ));
        assert!(read_only_after_errors(
            &staged(false),
            &entry("rw,errors=remount-ro,emergency_ro")
        ));
        // Staged read-only on purpose: not a condition.
        assert!(!read_only_after_errors(&staged(true), &entry("ro")));
    }
}
