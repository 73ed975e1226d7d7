//! NodePublishVolume and NodeUnpublishVolume: bind the staged volume into a workload's target
//! path, and take it away again.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use ebs_store::{Durability, Phase, Progress, Publication, StagedVolume, now_unix_ms};

use super::journal::{Journal, detail};
use super::{NodeCtx, ensure_dir, mounted_at, path_string};
use crate::backend::block_dev_numbers;
use crate::error::{Error, Result};
use crate::host::mounter::{self, Unmounted};
use crate::host::mountinfo::MountEntry;
use crate::node::stage::access_record;
use crate::request::{AccessType, Capability, ConfinedPath, VolumeId};

pub struct PublishCommand {
    pub volume: VolumeId,
    pub staging: ConfinedPath,
    pub target: ConfinedPath,
    pub capability: Capability,
    pub readonly: bool,
}

pub struct UnpublishCommand {
    pub volume: VolumeId,
    pub target: ConfinedPath,
}

/// Whether the mount at `target` is this staged volume: a filesystem bind carries the device's
/// numbers; a block bind is a device node whose rdev is the device.
pub fn is_ours(staged: &StagedVolume, entry: &MountEntry, target: &Path) -> bool {
    let Ok((major, minor)) = block_dev_numbers(&staged.device) else {
        return false;
    };
    match staged.access {
        ebs_store::AccessRecord::Block => std::fs::metadata(target).is_ok_and(|m| {
            nix::sys::stat::major(m.rdev()) as u32 == major
                && nix::sys::stat::minor(m.rdev()) as u32 == minor
        }),
        ebs_store::AccessRecord::Mount { .. } => entry.major == major && entry.minor == minor,
    }
}

pub fn publish(ctx: &NodeCtx, cmd: &PublishCommand) -> Result<()> {
    let vol = cmd.volume.as_str();
    let target = cmd.target.as_path();
    let staged = ctx
        .store
        .staged(vol)?
        .filter(|s| s.progress == Progress::Complete)
        .ok_or_else(|| {
            Error::Precondition(format!(
                "volume {vol} is not staged on this node; call NodeStageVolume first"
            ))
        })?;
    if staged.staging_path != cmd.staging.as_path() && !staged.staging_path.as_os_str().is_empty() {
        return Err(Error::Precondition(format!(
            "volume {vol} is staged at {}, not at {}",
            staged.staging_path.display(),
            cmd.staging
        )));
    }
    let wanted = access_record(&cmd.capability);
    let same_kind = match (&staged.access, &wanted) {
        (ebs_store::AccessRecord::Block, ebs_store::AccessRecord::Block) => true,
        (
            ebs_store::AccessRecord::Mount { fs_type: a, .. },
            ebs_store::AccessRecord::Mount { fs_type: b, .. },
        ) => a == b,
        _ => false,
    };
    if !same_kind {
        return Err(Error::Precondition(format!(
            "volume {vol} was staged for another access type than this publish asks for"
        )));
    }
    let block = cmd.capability.is_block();
    let readonly = cmd.readonly || cmd.capability.mode.is_read_only() || staged.readonly;
    let (flags_raw, vfs_bits) = match &cmd.capability.access {
        AccessType::Mount { flags, .. } => (flags.raw().to_vec(), flags.vfs_bits()),
        AccessType::Block => (Vec::new(), 0),
    };
    let mut record = Publication {
        volume_id: vol.to_string(),
        target_path: target.to_path_buf(),
        staging_path: staged.staging_path.clone(),
        block,
        readonly,
        access_mode: cmd.capability.mode.to_proto() as i32,
        mount_flags: flags_raw,
        progress: Progress::InProgress,
        at_unix_ms: now_unix_ms(),
    };
    if let Some(existing) = ctx.store.publication(vol, target)?
        && existing.access_mode != 0
        && (existing.readonly != record.readonly
            || existing.block != record.block
            || existing.mount_flags != record.mount_flags
            || existing.access_mode != record.access_mode)
    {
        return Err(Error::AlreadyExists(format!(
            "volume {vol} is already published at {} with other arguments",
            target.display()
        )));
    }
    if cmd.capability.mode.single_publication() {
        for other in ctx.store.publications(vol)? {
            // statx rules most paths out before the mount table is read.
            if other.target_path != target && mounted_at(&other.target_path)?.is_some() {
                return Err(Error::Precondition(format!(
                    "volume {vol} is already published at {}; its access mode allows one \
                     publication on this node",
                    other.target_path.display()
                )));
            }
        }
    }

    let journal = Journal::new(&ctx.store, vol, "publish", ctx.crash_after());
    match mounted_at(target)? {
        Some(m) if is_ours(&staged, &m, target) => {
            if m.is_read_only() != readonly {
                return Err(Error::AlreadyExists(format!(
                    "volume {vol} is already mounted at {} with readonly={}",
                    target.display(),
                    m.is_read_only()
                )));
            }
        }
        Some(m) => {
            return Err(Error::Precondition(format!(
                "{} already has a mount of {} ({}) that is not volume {vol}; refusing to stack \
                 another mount on it",
                target.display(),
                m.source,
                m.fs_type
            )));
        }
        None => {
            let source = if block {
                create_block_target(target)?;
                staged.device.clone()
            } else {
                ensure_dir(target)?;
                staged.staging_path.clone()
            };
            let facts = detail([
                ("source", path_string(&source)),
                ("target", path_string(target)),
                ("readonly", readonly.to_string()),
            ]);
            journal.record(
                "bind",
                Phase::Intent,
                facts.clone(),
                Durability::Immediate,
                |w| w.put_publication(&record),
            )?;
            mounter::bind(&source, target, readonly, vfs_bits).map_err(|e| {
                Error::io(
                    format!("bind-mounting {} on {}", source.display(), target.display()),
                    e,
                )
            })?;
            journal.note("bind", Phase::Done, facts);
        }
    }
    record.progress = Progress::Complete;
    // Lazy: the bind intent (with the record) is already durable; if this line is lost, recovery
    // finds the bind mount and keeps the publication, which behaves the same.
    journal.record(
        "published",
        Phase::Done,
        detail([("target", path_string(target))]),
        Durability::Lazy,
        |w| w.put_publication(&record),
    )
}

/// A block volume is published as a file that the device node is bind-mounted onto.
fn create_block_target(target: &Path) -> Result<()> {
    match std::fs::symlink_metadata(target) {
        Ok(m) if m.is_file() => Ok(()),
        Ok(_) => Err(Error::Precondition(format!(
            "{} exists and is not a regular file; a block volume is published onto a file",
            target.display()
        ))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(target)
            .map(drop)
            .map_err(|e| Error::io(format!("creating {}", target.display()), e)),
        Err(e) => Err(Error::io(format!("inspecting {}", target.display()), e)),
    }
}

pub fn unpublish(ctx: &NodeCtx, cmd: &UnpublishCommand) -> Result<()> {
    let vol = cmd.volume.as_str();
    let target = cmd.target.as_path();
    let staged = ctx.store.staged(vol)?;
    let journal = Journal::new(&ctx.store, vol, "unpublish", ctx.crash_after());
    let facts = detail([("target", path_string(target))]);
    if let Some(m) = mounted_at(target)? {
        // A device that vanished (force-detached) cannot be compared any more: our own
        // publication record then vouches for the mount, so a pod is never stuck on it.
        let device_gone = staged
            .as_ref()
            .is_some_and(|s| block_dev_numbers(&s.device).is_err());
        let vouched = device_gone && ctx.store.publication(vol, target)?.is_some();
        if let Some(s) = &staged
            && !vouched
            && !is_ours(s, &m, target)
        {
            return Err(Error::Precondition(format!(
                "{} holds a mount of {} that is not volume {vol}; not unmounting it",
                target.display(),
                m.source
            )));
        }
        // Lazy, unlike the intents of publish and stage: nothing resumes from an unmount's
        // intent. After a crash the host says whether the unmount happened (the mount is there
        // or not), and recovery drops a record whose mount is gone; an fsync here would only
        // make the explanation durable, at the cost of one fsync per unpublish.
        journal.step("unmount", facts.clone(), Durability::Lazy, || {
            unmount_all(target)
        })?;
    }
    remove_target(target)?;
    // Lazy: if this line is lost, recovery finds the mount gone and drops the record itself.
    journal.record("unpublished", Phase::Done, facts, Durability::Lazy, |w| {
        w.delete_publication(vol, target)
    })
}

/// Unmounts until nothing is left at `path` (a crashed earlier call may have stacked mounts).
/// umount(2) itself says when nothing is left (EINVAL: not a mount point), which is far cheaper
/// than reading the mount table again with hundreds of volumes mounted.
pub fn unmount_all(path: &Path) -> Result<()> {
    for _ in 0..8 {
        match mounter::unmount(path)
            .map_err(|e| Error::io(format!("unmounting {}", path.display()), e))?
        {
            Unmounted::NotMounted => return Ok(()),
            Unmounted::Detached => {
                tracing::warn!(path = %path.display(), "mount was dead (ENOTCONN/ESTALE); detached lazily");
            }
            Unmounted::Done => {}
        }
    }
    if mounted_at(path)?.is_none() {
        return Ok(());
    }
    Err(Error::Internal(format!(
        "{} is still mounted after repeated unmounts",
        path.display()
    )))
}

/// Removes the directory or file that publish created. A non-empty directory is left alone:
/// it is not ours to delete.
fn remove_target(target: &Path) -> Result<()> {
    let meta = match std::fs::symlink_metadata(target) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::io(format!("inspecting {}", target.display()), e)),
    };
    let result = if meta.is_dir() {
        std::fs::remove_dir(target)
    } else if meta.is_file() && meta.len() == 0 {
        std::fs::remove_file(target)
    } else {
        return Ok(());
    };
    match result {
        Ok(()) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::ENOTEMPTY) => {
            tracing::warn!(target = %target.display(), "target directory is not empty; left in place");
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(format!("removing {}", target.display()), e)),
    }
}
