//! Every filesystem staging and publication is `nodev`, whatever the mount options say (`dev` is
//! accepted and changes nothing): a block node carried on a volume's own filesystem (any user can
//! put one in an image with debugfs; a container with CAP_MKNOD, in its volume) would otherwise
//! open whatever device it names, another volume's included, with no bind anywhere for the
//! raw-use question to see (a fifty-fourth fresh review's F2). A stage mounts with it, and a
//! publish binds with it whatever the staging has.
//!
//! A mount the agent finds there and adopts, instead of making it (a stage that finds the volume
//! mounted at its staging path, recovery or a publish completing a stage a crash cut after its
//! mount, a publish that finds its bind there), gets the attributes the agent would have made it
//! with, added to its own, before it is recorded as the volume's: root's own mount of a volume at
//! its staging path, without `nodev`, was adopted and its publications carried it on (a
//! sixty-third fresh review's F1), and a read-only stage adopted a read-write mount (its F3).

use std::path::Path;

use crate::error::{Error, Result};
use crate::records::{AccessRecord, Durability, Publication, StagedVolume};
use crate::request::{FsType, MountFlags, VolumeId};
use crate::steps::{Op, Step};

use super::host::{Entry, OpenEntry};
use super::journal::{Journal, detail};
use super::ownership::{Expected, Holder, holder_of};
use super::volume_device::VolumeDevice;
use super::{NodeCtx, path_string};
use crate::DevNum;
use crate::seam::MountFacts;

/// The bits every filesystem mount of a volume carries.
pub const NO_DEVICES: u64 = crate::request::ms::NODEV;

/// Gives the mount at `entry` (proven the volume's through the descriptor that is then used)
/// read-only when `readonly`, `nodev`, and the nosuid and noexec of `vfs_bits`, journaled.
pub fn adopt(
    ctx: &NodeCtx,
    journal: &Journal,
    entry: &dyn Entry,
    expected: &Expected,
    readonly: bool,
    vfs_bits: u64,
) -> Result<()> {
    let path = entry.path();
    let root = entry
        .open_entry()
        .map_err(|e| Error::io(format!("opening {}", path.display()), e))?;
    if !matches!(holder_of(ctx, &*root, entry, expected)?, Holder::Volume(_)) {
        return Err(Error::StagingChanged {
            path: path.to_path_buf(),
            volume: journal.volume().to_string(),
        });
    }
    restrict(journal, &*root, path, readonly, vfs_bits)
}

/// A publication's bind found with no complete record (start-up after a publish cut past its
/// bind intent; `recover --from-mounts`): given what a bind of the publish gets, read-only as
/// recorded; a raw block one, `adopt_block`.
pub fn adopt_publication(
    ctx: &NodeCtx,
    publication: &Publication,
    staged: Option<&StagedVolume>,
    entry: &dyn Entry,
    expected: &Expected,
    bound: &MountFacts,
) -> Result<()> {
    if publication.block {
        let target = &publication.target_path;
        return adopt_block(ctx, staged, target, bound.node.rdev, publication.readonly);
    }
    let volume = VolumeId::parse(&publication.volume_id)?;
    let journal = Journal::new(ctx, &volume, Op::Publish);
    let fs_type = match staged.map(|s| &s.access) {
        Some(AccessRecord::Mount { fs_type, .. }) => fs_type.as_str(),
        _ => "",
    };
    let bits = recorded_bits(&volume, "publication", fs_type, &publication.mount_flags)?;
    adopt(ctx, &journal, entry, expected, publication.readonly, bits)
}

/// A raw block publication's bind found with no complete record. A bind's read-only flag does
/// not reach a device node: a read-only publication binds the agent's read-only device laid over
/// the volume's, so the bind found must be of that, never of the volume's own node; and no other
/// view of the volume's bytes may be in use, as for the agent's own bind (a sixty-fifth fresh
/// review's F1: root's read-only bind of the writable node was recorded as a read-only
/// publication, and a bind was taken while another device showing the bytes was mounted).
pub fn adopt_block(
    ctx: &NodeCtx,
    staged: Option<&StagedVolume>,
    target: &Path,
    bound: DevNum,
    readonly: bool,
) -> Result<()> {
    let overlay = ctx.host.read_only_lies_over(bound).is_some();
    let volume = staged.map(|s| s.volume_id.clone()).unwrap_or_default();
    // A device the kernel keeps read-only is bound only through a read-only device of the
    // publication's own, as the publish binds it (a sixty-ninth fresh review's F1: root's bind
    // of a read-only attachment's shared node, rebuilt by `recover --from-mounts`, was completed
    // as a writable publication).
    if overlay != readonly || (!overlay && ctx.host.device_read_only(bound)) {
        return Err(Error::PublishedWithOtherReadonly {
            volume,
            path: target.to_path_buf(),
            readonly: overlay,
        });
    }
    // With no staging record nothing says which device the bind must be of.
    let Some(staged) = staged else {
        return Err(Error::NotStaged { volume });
    };
    let mut device = VolumeDevice::hold_recorded(ctx, staged)?;
    device.hold_views(ctx)?;
    if !bound_by_its_publications(ctx, staged, target)? {
        device.refuse_if_used_raw(ctx)?;
    }
    Ok(())
}

/// Whether a publication of the volume other than the one at `except` binds its device now: a
/// workload may mount its raw device inside its own namespace, which claims the device, so a
/// further publication of a volume already handed out raw does not ask whether the device is
/// claimed. Records alone exempt nothing: a record kept after a reboot for the file the agent
/// made, an adopted bind, or a cut publish let a fresh publish hand out the writable node of a
/// device root had mounted a filesystem from (a sixty-sixth fresh review's F1 and F2).
pub fn bound_by_its_publications(
    ctx: &NodeCtx,
    staged: &StagedVolume,
    except: &Path,
) -> Result<bool> {
    // Only a bind of the device's own node: a read-only publication's workload holds the
    // agent's read-only device, and can claim nothing of the device itself (a sixty-seventh
    // fresh review's F2: a live read-only publication let a writable one through beside root's
    // read-write ext4 mount of the device).
    let expected = Expected::of(ctx, &staged.volume_id, Some(staged));
    let Some(device) = expected.recorded_devnum() else {
        return Ok(false);
    };
    for p in ctx.ledger.publications(&staged.volume_id)? {
        if p.target_path == except {
            continue;
        }
        if let Some(entry) = super::path_handles::lookup_recorded(ctx, &p.target_path)?
            && let Holder::Volume(bound) = super::ownership::holder(ctx, &*entry, &expected)?
            && bound.node.rdev == device
        {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The per-mount bits a record's mount flags ask for.
pub fn recorded_bits(
    volume: &VolumeId,
    record: &'static str,
    fs_type: &str,
    flags: &[String],
) -> Result<u64> {
    let damaged = |source| Error::DamagedRecord {
        record,
        volume: volume.to_string(),
        source,
    };
    let fs = FsType::parse(fs_type).map_err(damaged)?;
    Ok(MountFlags::parse(fs, flags).map_err(damaged)?.vfs_bits())
}

fn restrict(
    journal: &Journal,
    root: &dyn OpenEntry,
    path: &Path,
    readonly: bool,
    vfs_bits: u64,
) -> Result<()> {
    journal.step(
        Step::Restrict,
        detail([
            ("path", path_string(path)),
            ("readonly", readonly.to_string()),
        ]),
        Durability::Lazy,
        || {
            root.restrict(readonly, vfs_bits | NO_DEVICES)
                .map_err(|e| Error::io(format!("making the mount at {} nodev", path.display()), e))
        },
    )
}
