//! NodePublishVolume: bind the staged volume into a workload's target path, from a staging mount
//! (or device) proven to be the volume on the very fd that is bound.

use std::path::PathBuf;

use crate::records::{Durability, Phase, Progress, Publication, StagedVolume, now_unix_ms};

use super::claims::Use;
use super::compat::{access_record, same_kind, staged_mount_present};
use super::host::OpenEntry;
use super::interrupted;
use super::journal::{Journal, detail};
use super::ownership::{Expected, Holder, holder, holder_of};
use super::volume_device::VolumeDevice;
use super::{NodeCtx, path_handles, path_string, ro_tag};
use crate::error::{Error, Result};
use crate::request::{AccessType, Capability, RequestPath, VolumeId};
use crate::steps::{Op, Step};

pub struct PublishCommand {
    pub volume: VolumeId,
    pub staging: RequestPath,
    pub target: RequestPath,
    pub capability: Capability,
    pub readonly: bool,
}

/// What is bound: kept open until the bind is done, so it cannot change after it was proven.
enum Source {
    StagingMount(Box<dyn OpenEntry>),
    Device(Box<VolumeDevice>),
}

impl Source {
    fn proc_path(&self) -> PathBuf {
        match self {
            Source::StagingMount(fd) => fd.proc_path(),
            Source::Device(d) => d.held.proc_path(),
        }
    }
}

pub fn publish(ctx: &NodeCtx, cmd: &PublishCommand) -> Result<()> {
    let vol = &cmd.volume;
    let target_path = cmd.target.as_path();
    // A path that leads through a symlink is a bad request whatever the volume's state. The
    // handle is kept: its parent stays the one checked, and it is not resolved a second time.
    let looked_up = path_handles::lookup(ctx, &cmd.target)?;
    let staged = staged_here(ctx, cmd)?;
    let block = cmd.capability.is_block();
    let (flags_raw, vfs_bits, ro_flag) = match &cmd.capability.access {
        // Bound `nodev` whatever the staging has (`adopted`).
        AccessType::Mount { flags, .. } => (
            flags.raw().to_vec(),
            flags.vfs_bits() | super::adopted::NO_DEVICES,
            flags.wants_read_only(),
        ),
        AccessType::Block => (Vec::new(), 0, false),
    };
    // `ro` among the mount flags is a read-only request like the `readonly` field: the bind
    // drops MS_RDONLY from the flags and applies only this.
    // A raw block volume the kernel keeps read-only (a read-only attachment) is published
    // read-only, through a read-only device of the publication's own: its node bound itself, a
    // workload could swap what every publication of it reads (LOOP_CHANGE_FD needs only a
    // read-only open of a read-only loop device: a sixty-eighth fresh review's F1).
    let block_read_only = block
        && super::ownership::recorded_devnum(ctx, &staged)
            .is_none_or(|d| ctx.host.device_read_only(d));
    let readonly = cmd.readonly
        || ro_flag
        || cmd.capability.mode.is_read_only()
        || staged.readonly
        || block_read_only;
    let mut record = Publication {
        volume_id: vol.to_string(),
        target_path: target_path.to_path_buf(),
        staging_path: staged.staging_path.clone(),
        block,
        readonly,
        access_mode: cmd.capability.mode.csi_number(),
        mount_flags: flags_raw,
        progress: Progress::InProgress,
        at_unix_ms: now_unix_ms(),
    };
    let expected = Expected::of(ctx, vol.as_str(), Some(&staged));
    let prior = ctx.ledger.publication(vol.as_str(), target_path)?;
    let _turn = ctx
        .claims
        .take(vol.as_str(), target_path, Use::Target, true)?;
    let target = match looked_up {
        Some(target) => {
            path_handles::for_a_mount(ctx, &cmd.target, &*target)?;
            target
        }
        None => path_handles::prepare(ctx, &cmd.target)?,
    };
    let published_here = holder(ctx, &*target, &expected)?;
    if let Some(existing) = &prior
        && existing.access_mode != 0
        && published_here.is_volume()
        && (existing.readonly != record.readonly
            || existing.block != record.block
            || existing.mount_flags != record.mount_flags
            || existing.access_mode != record.access_mode)
    {
        return Err(Error::PublishedWithOtherArguments {
            volume: vol.to_string(),
            path: target_path.to_path_buf(),
        });
    }
    if cmd.capability.mode.single_publication() {
        check_single_publication(ctx, &staged, &expected, cmd)?;
    }

    // One journal for the call: the bind's done line rides with the "published" commit.
    let journal = Journal::new(ctx, vol, Op::Publish);
    match published_here {
        Holder::Volume(m) => {
            // A bind's read-only flag does not reach a device node: a raw block publication is
            // read-only by the agent's read-only device it binds.
            let bound_read_only = match block {
                true => ctx.host.read_only_lies_over(m.node.rdev).is_some(),
                false => m.read_only,
            };
            if bound_read_only != readonly {
                return Err(Error::PublishedWithOtherReadonly {
                    volume: vol.to_string(),
                    path: target_path.to_path_buf(),
                    readonly: bound_read_only,
                });
            }
            // Found bound with no complete record of the bind (a publish cut past its intent,
            // `recover --from-mounts`, root's own bind): taken only if it is what a bind of this
            // call is. A repeat of a complete publish touches nothing, and answers OK only while
            // the bind is still what it made (root's remount of it with `dev`: a seventieth
            // fresh review's F1).
            let adopting = prior
                .as_ref()
                .is_none_or(|p| p.progress != Progress::Complete);
            if adopting && block {
                super::adopted::adopt_block(ctx, Some(&staged), &*target, &m, readonly)?;
            } else if !block {
                let made = super::adopted::AsMade {
                    readonly,
                    vfs_bits,
                    staging: false,
                };
                super::adopted::as_made(ctx, vol.as_str(), &*target, &m, made, adopting)?;
            }
        }
        Holder::Foreign(what) => {
            return Err(Error::ForeignMount {
                path: target_path.to_path_buf(),
                what,
                volume: vol.to_string(),
            });
        }
        Holder::Nothing => {
            let source = source(ctx, &staged, &expected, block, target_path)?;
            let facts = detail([
                ("source", path_string(&source_of(&staged, block))),
                ("target", path_string(target_path)),
                ("readonly", readonly.to_string()),
            ]);
            super::publish_target::check_ours_to_use(&*target, block, prior.is_some())?;
            // A bind is kernel state a reboot takes with it: a filesystem publication's intent
            // need only outlive the agent's crash (the store's boot log, no fsync). A raw block
            // one stays durable: it may forget a format intent (a raw block device may get
            // anything written to it: the intent stops licensing a mkfs in the commit before
            // the bind, see `format::forget_intent`), and the bytes outlive any reboot.
            let durability = if block {
                Durability::Immediate
            } else {
                Durability::Boot
            };
            journal.record(Step::Bind, Phase::Intent, facts.clone(), durability, |w| {
                if block {
                    super::format::forget_intent(ctx, vol, w)?;
                }
                w.put_publication(&record)
            })?;
            if let Err(e) = super::publish_target::create(&*target, block, prior.is_some()) {
                // Someone made the path in between: the intent must not vouch for their file.
                journal.record(Step::Bind, Phase::Failed, facts, durability, |w| {
                    w.delete_publication(vol.as_str(), target_path)
                })?;
                return Err(e);
            }
            if let Source::Device(d) = &source {
                d.reverify(ctx)?;
            }
            // A read-only raw block publication binds a read-only device laid over the
            // volume's: the bind's read-only flag does not reach a device node. The bind intent
            // above is durable first, so a crash from here on leaves a tag recovery finds.
            let tag = ro_tag::tag(ctx, vol.as_str(), target_path);
            let ro_device = match &source {
                Source::Device(d) if readonly => Some(journal.step(
                    Step::RoDevice,
                    detail([("device", path_string(d.path())), ("tag", tag.clone())]),
                    Durability::Lazy,
                    || ctx.host.lay_read_only(d, &tag, prior.is_some()),
                )?),
                _ => None,
            };
            let from = match &ro_device {
                Some(ro) => ro.proc_path(),
                None => source.proc_path(),
            };
            if let Err(e) = target.bind_here(&from, readonly, vfs_bits) {
                // The record stays in progress: the retry binds again, and may use the file it
                // made at a block target.
                let mut failed = facts;
                failed.insert("error".into(), e.to_string());
                journal.note(Step::Bind, Phase::Failed, failed);
                if ro_device.is_some()
                    && let Err(undo) = ctx.host.remove_read_only(&tag)
                {
                    tracing::warn!(volume = %vol, error = %undo,
                        "the read-only device of a failed publish stays until the retry or start-up");
                }
                return Err(Error::io(
                    format!("bind-mounting volume {vol} on {}", target_path.display()),
                    e,
                ));
            }
            journal.note(Step::Bind, Phase::Done, facts);
        }
    }
    record.progress = Progress::Complete;
    // Lazy: the bind intent (with the record) is already durable; if this line is lost, recovery
    // finds the bind mount and completes the publication.
    journal.record(
        Step::Published,
        Phase::Done,
        detail([("target", path_string(target_path))]),
        Durability::Lazy,
        |w| w.put_publication(&record),
    )?;
    ctx.claims.record(vol.as_str(), target_path, Use::Target);
    Ok(())
}

/// The path checks of a publish that ask the host, without changing anything: v0.1 runs them
/// before its internal stage, so a target below a symlink leaves no staged volume behind.
pub fn check_publish_paths(ctx: &NodeCtx, cmd: &PublishCommand) -> Result<()> {
    path_handles::lookup(ctx, &cmd.target).map(drop)
}

/// The staged record, checked against the request: staged, at this staging path, for this kind
/// of access. A stage completes only once it has asked, after its mount, what else uses the
/// device; one a crash cut in between (its mount there, its record in progress: recovery could
/// not answer) is asked here first, as recovery asks, and unstaged on a hit (a fifty-sixth fresh
/// review's F1: the mount was handed out).
fn staged_here(ctx: &NodeCtx, cmd: &PublishCommand) -> Result<StagedVolume> {
    let vol = &cmd.volume;
    let not_staged = || Error::NotStaged {
        volume: vol.to_string(),
    };
    let mut staged = ctx.ledger.staged(vol.as_str())?.ok_or_else(not_staged)?;
    if staged.progress != Progress::Complete && !staged_mount_present(ctx, &staged)? {
        return Err(not_staged());
    }
    if staged.staging_path != cmd.staging.as_path() && !staged.staging_path.as_os_str().is_empty() {
        return Err(Error::StagedElsewhere {
            volume: vol.to_string(),
            at: staged.staging_path.clone(),
            asked: cmd.staging.to_string(),
        });
    }
    if !same_kind(&staged.access, &access_record(&cmd.capability)) {
        return Err(Error::StagedForOtherAccess {
            volume: vol.to_string(),
        });
    }
    if staged.progress != Progress::Complete {
        staged = interrupted::finish(ctx, &staged)?;
    }
    Ok(staged)
}

fn check_single_publication(
    ctx: &NodeCtx,
    staged: &StagedVolume,
    expected: &Expected,
    cmd: &PublishCommand,
) -> Result<()> {
    for other in ctx.ledger.publications(&staged.volume_id)? {
        if other.target_path == cmd.target.as_path() {
            continue;
        }
        let Some(entry) = path_handles::lookup_recorded(ctx, &other.target_path)? else {
            continue;
        };
        if holder(ctx, &*entry, expected)?.is_volume() {
            return Err(Error::SinglePublication {
                volume: staged.volume_id.clone(),
                at: other.target_path,
            });
        }
    }
    Ok(())
}

/// The volume as it is bound: the staging mount, proven on the fd that is bound (publishing from
/// an empty staging directory would hand the pod the host's root filesystem), or for block access
/// the device, held and proven (a detach and a new attach reuse device numbers).
fn source(
    ctx: &NodeCtx,
    staged: &StagedVolume,
    expected: &Expected,
    block: bool,
    target: &std::path::Path,
) -> Result<Source> {
    if block {
        let mut device = VolumeDevice::hold_recorded(ctx, staged).map_err(|e| match e {
            Error::WrongDevice { reason, .. } => Error::NoLongerTheDevice {
                volume: staged.volume_id.clone(),
                device: staged.device.clone(),
                reason,
            },
            other => other,
        })?;
        // A workload gets the device raw: no other view of its bytes may be in use, nor the
        // device itself, unless the volume's own publications use it (a workload may mount its
        // raw device inside its own namespace).
        device.hold_views(ctx)?;
        if !super::adopted::bound_by_its_publications(ctx, staged, target)? {
            device.refuse_if_used_raw(ctx)?;
        }
        return Ok(Source::Device(Box::new(device)));
    }
    let staging = path_handles::lookup_recorded(ctx, &staged.staging_path)?;
    let nothing = || Error::StagingEmpty {
        path: staged.staging_path.clone(),
    };
    let staging = staging.ok_or_else(nothing)?;
    let fd = staging
        .open_entry()
        .map_err(|e| Error::io(format!("opening {}", staged.staging_path.display()), e))?;
    match holder_of(ctx, &*fd, &*staging, expected)? {
        // A bind clones the staging's id mapping: one root laid at the staging path is handed
        // out by no publication (a seventy-second fresh review's F3).
        Holder::Volume(m) if m.idmapped => Err(Error::MountedNotAsMade {
            volume: staged.volume_id.clone(),
            path: staged.staging_path.clone(),
            differs: "idmapped".into(),
        }),
        Holder::Volume(_) => Ok(Source::StagingMount(fd)),
        Holder::Nothing => Err(nothing()),
        Holder::Foreign(what) => Err(Error::ForeignStaging {
            path: staged.staging_path.clone(),
            what,
            volume: staged.volume_id.clone(),
        }),
    }
}

fn source_of(staged: &StagedVolume, block: bool) -> PathBuf {
    if block {
        staged.device.clone()
    } else {
        staged.staging_path.clone()
    }
}
