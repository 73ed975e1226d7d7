//! Every filesystem staging and publication is `nodev`, whatever the mount options say (`dev` is
//! accepted and changes nothing): a block node carried on a volume's own filesystem (any user can
//! put one in an image with debugfs; a container with CAP_MKNOD, in its volume) would otherwise
//! open whatever device it names, another volume's included, with no bind anywhere for the
//! raw-use question to see (a fifty-fourth fresh review's F2). A stage mounts with it, and a
//! publish binds with it whatever the staging has.
//!
//! A mount the agent finds there instead of making it (a stage that finds the volume mounted at
//! its staging path, recovery or a publish completing a stage a crash cut after its mount, a
//! publish that finds its bind there, a repeat of a complete publish) is taken as the volume's
//! only when it already is what the agent would have made: `nodev`, the nosuid and noexec asked
//! for, read-only where recorded so (for a reader's stage, the filesystem itself, as its own
//! mount makes it). Nothing is changed to make it so: a change to one mount does not reach its
//! copies in other mount namespaces (a shared or slave mount's, made when it was), nor the
//! filesystem below a read-only mount (a seventieth fresh review's F1: root's bind, adopted and
//! made read-only, stayed writable in a peer namespace; a reader's stage adopted a read-write
//! filesystem). Root's own mount made otherwise is refused, never recorded (a sixty-third fresh
//! review's F1 and F3: adopted without `nodev`; read-write for a reader).

use std::path::Path;

use crate::error::{Error, Result};
use crate::records::{AccessRecord, Progress, Publication, StagedVolume};
use crate::request::{FsType, MountFlags, VolumeId, ms};

use super::NodeCtx;
use super::host::Entry;
use super::ownership::{Expected, Holder, holder};
use super::volume_device::VolumeDevice;
use crate::seam::MountFacts;

/// The bits every filesystem mount of a volume carries.
pub const NO_DEVICES: u64 = ms::NODEV;

/// What the agent's own mount would have been.
#[derive(Clone, Copy, Debug)]
pub struct AsMade {
    pub readonly: bool,
    /// The nosuid and noexec asked for (`nodev` is always wanted).
    pub vfs_bits: u64,
    /// A staging mount: read-only for a reader's stage as a whole filesystem (as the stage's own
    /// read-only mount makes it), and its per-mount nosuid, nodev and noexec not asked. Only root
    /// reaches a staging path, and every publication is bound with them whatever the staging
    /// has; the stagings of the plugin this agent replaces in place (aws-ebs-csi-driver's node
    /// plugin mounts without `nodev`) are taken by its stage after the swap.
    pub staging: bool,
}

impl AsMade {
    /// How `found` differs from it: what it lacks, and what the agent never makes.
    fn differs(&self, found: &MountFacts) -> Vec<&'static str> {
        let wanted = match self.staging {
            true => 0,
            false => (self.vfs_bits | NO_DEVICES) & (ms::NOSUID | ms::NODEV | ms::NOEXEC),
        };
        let mut differs: Vec<&str> = [
            (ms::NOSUID, "not nosuid"),
            (ms::NODEV, "not nodev"),
            (ms::NOEXEC, "not noexec"),
        ]
        .iter()
        .filter(|(bit, _)| wanted & bit != 0 && found.vfs_bits & bit == 0)
        .map(|(_, name)| *name)
        .collect();
        if self.readonly && !found.read_only && !found.super_read_only {
            differs.push("not read-only");
        }
        if self.staging && self.readonly && !found.super_read_only {
            differs.push("its filesystem not read-only");
        }
        // An id mapping shows root's files as a user's, and a user's setuid file as root's
        // (a seventy-second fresh review's F3).
        if found.idmapped {
            differs.push("idmapped");
        }
        differs
    }
}

/// Refuses `found`, the mount at `entry`, unless it is what the agent would have made there. One
/// the agent did not record (`adopting`) must have nothing mounted below it either, as the
/// agent's own has nothing when it is made (a seventy-second fresh review's F2: root's bind with
/// a `dev` tmpfs below it, carrying another volume's node, was adopted; a repeat does not ask,
/// since a workload may mount inside its own volume where its propagation lets it).
pub fn as_made(
    ctx: &NodeCtx,
    volume: &str,
    entry: &dyn Entry,
    found: &MountFacts,
    made: AsMade,
    adopting: bool,
) -> Result<()> {
    let path = entry.path();
    let mut differs: Vec<String> = made.differs(found).into_iter().map(String::from).collect();
    if adopting
        && entry
            .has_submounts()
            .map_err(|e| Error::io(format!("listing the mounts below {}", path.display()), e))?
    {
        differs.push("mounts below it".into());
    }
    if adopting && let Some(of) = copy_of_a_recorded_mount(ctx, volume, entry)? {
        differs.push(format!("the kernel's copy of {}", of.display()));
    }
    if differs.is_empty() {
        return Ok(());
    }
    Err(Error::MountedNotAsMade {
        volume: volume.to_string(),
        path: path.to_path_buf(),
        differs: differs.join(", "),
    })
}

/// The recorded place of the volume (its staging, another publication) whose mount the kernel
/// shows again at `entry` through propagation, or `None`. Such a copy is never the volume's own
/// mount: unmounting it propagates back and takes the original down (a seventy-fourth fresh
/// review's F1: a publish at a shared directory's peer took the staging's copy there for its
/// publication, and its unpublish unmounted the staging).
pub(super) fn copy_of_a_recorded_mount(
    ctx: &NodeCtx,
    volume: &str,
    entry: &dyn Entry,
) -> Result<Option<std::path::PathBuf>> {
    let path = entry.path();
    let copies = entry.copies_elsewhere().map_err(|e| {
        Error::io(
            format!("finding where the mount at {} shows again", path.display()),
            e,
        )
    })?;
    if copies.is_empty() {
        return Ok(None);
    }
    let mut recorded: Vec<std::path::PathBuf> = (ctx.ledger.staged(volume)?)
        .map(|s| s.staging_path)
        .into_iter()
        .collect();
    recorded.extend(
        (ctx.ledger.publications(volume)?)
            .into_iter()
            .map(|p| p.target_path),
    );
    Ok(copies
        .into_iter()
        .find(|c| c != path && recorded.contains(c)))
}

/// The mount at `entry` if it is the volume's and what the agent would have made; refused
/// otherwise.
pub fn adopt(
    ctx: &NodeCtx,
    entry: &dyn Entry,
    expected: &Expected,
    volume: &str,
    made: AsMade,
) -> Result<()> {
    match holder(ctx, entry, expected)? {
        Holder::Volume(found) => as_made(ctx, volume, entry, &found, made, true),
        _ => Err(Error::StagingChanged {
            path: entry.path().to_path_buf(),
            volume: volume.to_string(),
        }),
    }
}

/// A publication's bind found with no complete record (start-up after a publish cut past its
/// bind intent; `recover --from-mounts`): taken only if it is what a bind of the publish is; a
/// raw block one, `adopt_block`.
pub fn adopt_publication(
    ctx: &NodeCtx,
    publication: &Publication,
    staged: Option<&StagedVolume>,
    entry: &dyn Entry,
    bound: &MountFacts,
) -> Result<()> {
    if publication.block {
        return adopt_block(ctx, staged, entry, bound, publication.readonly);
    }
    let volume = VolumeId::parse(&publication.volume_id)?;
    let fs_type = match staged.map(|s| &s.access) {
        Some(AccessRecord::Mount { fs_type, .. }) => fs_type.as_str(),
        _ => "",
    };
    let made = AsMade {
        readonly: publication.readonly,
        vfs_bits: recorded_bits(&volume, "publication", fs_type, &publication.mount_flags)?,
        staging: false,
    };
    as_made(ctx, volume.as_str(), entry, bound, made, true)
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
    entry: &dyn Entry,
    found: &MountFacts,
    readonly: bool,
) -> Result<()> {
    let target = entry.path();
    let bound = found.node.rdev;
    let overlay = ctx.host.read_only_lies_over(bound).is_some();
    let volume = staged.map(|s| s.volume_id.clone()).unwrap_or_default();
    // An id mapping shows the bound node as its users' own (the agent's bind has none); a copy
    // of another publication's bind is that publication's.
    let copy = copy_of_a_recorded_mount(ctx, &volume, entry)?;
    if found.idmapped || copy.is_some() {
        let differs = match copy {
            Some(of) => format!("the kernel's copy of {}", of.display()),
            None => "idmapped".into(),
        };
        return Err(Error::MountedNotAsMade {
            volume,
            path: target.to_path_buf(),
            differs,
        });
    }
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
        // A publication the agent made and completed: one in progress may be a bind it found
        // and has not taken (root's, rebuilt by `recover --from-mounts` or at a cut publish's
        // target), or just refused to take (a seventy-second fresh review's F1: two such binds
        // exempted each other, and a fresh publish handed out the node of a mounted ext4).
        if p.target_path == except || p.progress != Progress::Complete {
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
