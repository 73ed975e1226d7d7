//! NodeReclaimSpace (CSI-Addons): return a staged filesystem's free blocks to the storage with
//! FITRIM, and report what the volume consumed before and after.
//!
//! "Consumed" is what the storage holds for the volume when the backend can see it (loop: the
//! sparse volume file's allocated bytes, which punch-hole discards really shrink; this is what
//! the CSI-Addons controller shows users as reclaimed space). Otherwise (EBS exposes no
//! allocation to the node) it is the filesystem's used bytes, which a trim does not change: an
//! honest "unchanged" rather than an invented saving.

use std::path::Path;

use crate::records::{AccessRecord, Durability, Phase, Progress, StagedVolume};

use super::host::OpenEntry;
use super::journal::{Journal, detail};
use super::ownership::{Expected, Holder, holder_of};
use super::{NodeCtx, path_handles, path_string};
use crate::error::{Error, Result};
use crate::request::{RequestPath, VolumeId};
use crate::seam::TrimError;
use crate::steps::{Op, Step};

/// Where the caller says the volume is: the CSI-Addons sidecar sends the staging path; a caller
/// that knows only a workload's mount sends that publication's target path.
pub enum ReclaimPath {
    Staging(RequestPath),
    Published(RequestPath),
}

pub struct ReclaimCommand {
    pub volume: VolumeId,
    pub path: ReclaimPath,
}

/// How the usage figures were measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Measure {
    /// Bytes the backing storage allocates for the volume.
    StorageAllocated,
    /// Bytes the filesystem uses (statvfs).
    FilesystemUsed,
}

impl Measure {
    fn as_str(self) -> &'static str {
        match self {
            Measure::StorageAllocated => "storage_allocated",
            Measure::FilesystemUsed => "filesystem_used",
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub struct Reclaimed {
    pub pre_bytes: u64,
    pub post_bytes: u64,
    /// What the filesystem reports as discarded (ext4 skips groups it trimmed before).
    pub trimmed_bytes: u64,
    pub measure: Measure,
}

pub fn reclaim(ctx: &NodeCtx, cmd: &ReclaimCommand) -> Result<Reclaimed> {
    let vol = &cmd.volume;
    let staged = ctx
        .ledger
        .staged(vol.as_str())?
        .filter(|s| s.progress == Progress::Complete)
        .ok_or_else(|| Error::StagedVolumeNotFound {
            volume: vol.to_string(),
        })?;
    let given = known_path(ctx, &staged, &cmd.path)?;
    let path = given.as_path();
    let not_here = || Error::PathNotFound {
        volume: vol.to_string(),
        path: path.to_path_buf(),
    };
    if staged.access == AccessRecord::Block {
        return Err(Error::ReclaimOfBlockVolume {
            volume: vol.to_string(),
        });
    }
    // The descriptor, not the path, is what gets trimmed: it is proven to be the volume's
    // filesystem root (its device asked for its identity right now).
    let entry = path_handles::lookup(ctx, given)?.ok_or_else(not_here)?;
    let dir = entry.open_dir().map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory => not_here(),
        _ => Error::io(format!("opening {}", path.display()), e),
    })?;
    let expected = Expected::of(ctx, vol.as_str(), Some(&staged));
    let Holder::Volume(mount) = holder_of(ctx, &*dir, &*entry, &expected)? else {
        return Err(not_here());
    };
    // ext4's FITRIM does not look at the mount's read-only flag (a twentieth fresh review's F2):
    // a volume staged read-only (another node may write it) or remounted read-only after errors
    // is never trimmed.
    if staged.readonly || mount.read_only || mount.super_read_only {
        return Err(Error::ReadOnlyNoDiscard {
            path: path.to_path_buf(),
        });
    }

    let journal = Journal::new(ctx, vol, Op::Reclaim);
    let facts = detail([
        ("path", path_string(path)),
        ("device", path_string(&staged.device)),
        ("fs", mount.fs_type.clone()),
    ]);
    // A trim changes no data, so nothing needs resuming after a crash: lazy lines suffice.
    // Sync first: ext4 frees a deleted file's blocks only when its journal commits, and the
    // "before" figure should include data still in the page cache.
    journal.step(Step::Sync, facts.clone(), Durability::Lazy, || {
        dir.sync_fs()
            .map_err(|e| Error::io(format!("syncfs {}", path.display()), e))
    })?;
    let (pre_bytes, measure) = match ctx.backend.allocated_bytes(&staged.identity) {
        Some(bytes) => (bytes, Measure::StorageAllocated),
        None => (filesystem_used(&*dir, path)?, Measure::FilesystemUsed),
    };
    let trimmed_bytes = journal.step(Step::Trim, facts.clone(), Durability::Lazy, || {
        dir.trim_free_space()
            .map_err(|e| trim_error(e, path, &mount.fs_type))
    })?;
    let post_bytes = match measure {
        Measure::StorageAllocated => {
            ctx.backend
                .allocated_bytes(&staged.identity)
                .ok_or_else(|| Error::AllocationUnreadable {
                    volume: vol.to_string(),
                })?
        }
        Measure::FilesystemUsed => filesystem_used(&*dir, path)?,
    };
    let mut done = facts;
    done.extend(detail([
        ("pre_bytes", pre_bytes.to_string()),
        ("post_bytes", post_bytes.to_string()),
        ("trimmed_bytes", trimmed_bytes.to_string()),
        ("measure", measure.as_str().to_string()),
    ]));
    journal.note(Step::Reclaimed, Phase::Done, done);
    Ok(Reclaimed {
        pre_bytes,
        post_bytes,
        trimmed_bytes,
        measure,
    })
}

/// The path must be where this node put the volume: its staging path, or one of its
/// publications. Anything else is NOT_FOUND.
fn known_path<'a>(
    ctx: &NodeCtx,
    staged: &StagedVolume,
    given: &'a ReclaimPath,
) -> Result<&'a RequestPath> {
    let vol = &staged.volume_id;
    let (path, known) = match given {
        ReclaimPath::Staging(p) => (
            p,
            // Records rebuilt from the mount table may lack the path; the mount check decides.
            staged.staging_path == p.as_path() || staged.staging_path.as_os_str().is_empty(),
        ),
        ReclaimPath::Published(p) => (
            p,
            ctx.ledger
                .publications(vol)?
                .iter()
                .any(|pb| pb.target_path == p.as_path()),
        ),
    };
    if known {
        Ok(path)
    } else {
        Err(Error::PathNotFound {
            volume: vol.clone(),
            path: path.as_path().to_path_buf(),
        })
    }
}

fn filesystem_used(dir: &dyn OpenEntry, path: &Path) -> Result<u64> {
    let u = dir
        .fs_usage()
        .map_err(|e| Error::io(format!("statvfs {}", path.display()), e))?;
    Ok(u.used_bytes)
}

fn trim_error(e: TrimError, path: &Path, fs_type: &str) -> Error {
    match e {
        TrimError::Unsupported => Error::DiscardUnsupported {
            path: path.to_path_buf(),
        },
        TrimError::NotImplemented => Error::TrimUnimplemented {
            path: path.to_path_buf(),
            fs: fs_type.to_string(),
        },
        TrimError::ReadOnly => Error::ReadOnlyNoDiscard {
            path: path.to_path_buf(),
        },
        TrimError::Io(e) => Error::io(format!("FITRIM on {}", path.display()), e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trim_errors_map_to_clear_domain_errors() {
        let p = Path::new("/x");
        assert!(matches!(
            trim_error(TrimError::Unsupported, p, "ext4"),
            e @ Error::DiscardUnsupported { .. }
                if e.to_string().contains("does not support discard; do not retry")
        ));
        assert!(matches!(
            trim_error(TrimError::NotImplemented, p, "vfat"),
            Error::TrimUnimplemented { .. }
        ));
        assert!(matches!(
            trim_error(TrimError::ReadOnly, p, "ext4"),
            Error::ReadOnlyNoDiscard { .. }
        ));
        assert!(matches!(
            trim_error(TrimError::Io(std::io::Error::other("eio")), p, "ext4"),
            Error::Io { .. }
        ));
    }
}
