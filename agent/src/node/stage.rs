//! NodeStageVolume as the spec's lifecycle reads: resolve the device, verify its identity, probe
//! it, format it (only when provably blank) or check it, mount it, grow it. Each step is journaled;
//! a retry after a crash re-derives every decision from the journal's facts and the host.

use std::collections::HashMap;
use std::path::Path;
use std::time::Instant;

use ebs_store::{
    AccessRecord, Durability, FormatRecord, FormatState, Phase, Progress, StagedVolume, now_unix_ms,
};

use super::format::{Decision, Existing, decide, format_device, format_record, probe_with_size};
use super::grow::{grow_if_needed, grow_offline_if_needed};
use super::journal::{Journal, detail};
use super::{NodeCtx, ensure_dir, mounted_at, path_string};
use crate::backend::{ResolvedDevice, block_dev_numbers};
use crate::error::{Error, Result};
use crate::host::fstools::FsckOutcome;
use crate::host::mounter;
use crate::node::identity::same_identity;
use crate::request::{AccessType, Capability, ConfinedPath, FormatOptions, FsType, VolumeId};

pub struct StageCommand {
    pub volume: VolumeId,
    pub staging: ConfinedPath,
    pub capability: Capability,
    pub publish_context: HashMap<String, String>,
    pub volume_context: HashMap<String, String>,
    pub format: FormatOptions,
    pub deadline: Instant,
}

pub fn stage(ctx: &NodeCtx, cmd: &StageCommand) -> Result<()> {
    let vol = cmd.volume.as_str();
    let journal = Journal::new(&ctx.store, vol, "stage", ctx.crash_after());
    check_compatible(ctx, cmd)?;
    if let Some(fs) = cmd.capability.fs() {
        ctx.fstools
            .supports(fs)
            .map_err(|why| Error::FsUnavailable(fs.name().into(), why))?;
    }
    let staging = cmd.staging.as_path();

    let device = journal.step(
        "resolve_device",
        detail([("staging", path_string(staging))]),
        Durability::Lazy,
        || {
            ctx.backend.resolve(
                &cmd.volume,
                &cmd.publish_context,
                &cmd.volume_context,
                cmd.deadline,
            )
        },
    )?;
    let format = ctx.store.format(vol)?;
    journal.step(
        "verify_identity",
        detail([("device", path_string(&device.path))]),
        Durability::Lazy,
        || verify_identity(&cmd.volume, &device, format.as_ref()),
    )?;

    let readonly = cmd.capability.mode.is_read_only();
    let mut record = StagedVolume {
        volume_id: vol.to_string(),
        staging_path: staging.to_path_buf(),
        device: device.path.clone(),
        identity: device.identity.clone(),
        access: access_record(&cmd.capability),
        access_mode: cmd.capability.mode.to_proto() as i32,
        readonly,
        progress: Progress::InProgress,
        at_unix_ms: now_unix_ms(),
    };
    let AccessType::Mount { fs, flags } = &cmd.capability.access else {
        // Block access: the device is verified and recorded; nothing is mounted.
        record.progress = Progress::Complete;
        return journal.record(
            "staged",
            Phase::Done,
            detail([("device", path_string(&device.path))]),
            Durability::Immediate,
            |w| w.put_staged(&record),
        );
    };
    let fs = *fs;
    let readonly = readonly || flags.wants_read_only();
    ensure_dir(staging)?;

    let (major, minor) = block_dev_numbers(&device.path)
        .map_err(|e| Error::io(format!("inspecting {}", device.path.display()), e))?;
    let already = match mounted_at(staging)? {
        Some(m) if m.major == major && m.minor == minor && m.root == Path::new("/") => true,
        Some(m) => {
            return Err(Error::Precondition(format!(
                "{} already has a mount of {} ({}) that is not volume {vol}; refusing to stack \
                 another mount on it",
                staging.display(),
                m.source,
                m.fs_type
            )));
        }
        None => false,
    };

    // Whether this stage already knows the filesystem fills the device: mkfs made it so, or the
    // offline check before the mount compared the two.
    let mut size_settled = false;
    if !already {
        let probed = journal.step(
            "probe",
            detail([("device", path_string(&device.path))]),
            Durability::Lazy,
            || probe_with_size(&device.path, fs),
        )?;
        // Validated options; for xfs they include `nouuid` (see request::mount_flags).
        let data = flags.data().to_vec();
        let facts = detail([
            ("device", path_string(&device.path)),
            ("staging", path_string(staging)),
            ("options", data.join(",")),
            ("readonly", readonly.to_string()),
        ]);
        let mount_intent = || {
            journal.record(
                "mount",
                Phase::Intent,
                facts.clone(),
                Durability::Immediate,
                |w| w.put_staged(&record),
            )
        };
        match decide(vol, fs, &device, format.as_ref(), probed, readonly)? {
            Decision::Format { uuid } => {
                format_device(ctx, &journal, cmd, fs, &device, &uuid)?;
                mount_intent()?;
                size_settled = true;
            }
            // The intent must be on disk before mount(2), not before the fsck: committing it
            // while e2fsck runs takes its fsync off the stage's critical path.
            Decision::Check(found) => {
                alongside(mount_intent, || {
                    check_existing(ctx, &journal, fs, &device, found, readonly)
                })?;
                // The offline check covers ext; xfs grows only mounted.
                size_settled = fs.is_ext();
            }
        }
        // xfs needs no fsck: its log is replayed by the kernel at mount.
        mounter::mount_device(
            &device.path,
            staging,
            fs.name(),
            flags.vfs_bits(),
            &data,
            readonly,
        )
        .map_err(|e| {
            Error::io(
                format!(
                    "mounting {} on {} with options {}",
                    device.path.display(),
                    staging.display(),
                    data.join(",")
                ),
                e,
            )
        })?;
        journal.note("mount", Phase::Done, facts);
    }

    if !readonly && !size_settled {
        grow_if_needed(ctx, &journal, fs, &device.path, staging)?;
    }
    record.progress = Progress::Complete;
    record.at_unix_ms = now_unix_ms();
    // Lazy: the durable mount intent already holds this record (in progress), and start-up
    // recovery completes an in-progress record whose staging mount is there, so a lost
    // completion costs nothing; it saves one fsync per stage.
    journal.record(
        "staged",
        Phase::Done,
        detail([("staging", path_string(staging))]),
        Durability::Lazy,
        |w| w.put_staged(&record),
    )
}

/// Uses the filesystem already on the device: records it as ours if it was made elsewhere, checks
/// it, and grows it offline when the device grew.
fn check_existing(
    ctx: &NodeCtx,
    journal: &Journal<'_>,
    fs: FsType,
    device: &ResolvedDevice,
    found: Existing,
    readonly: bool,
) -> Result<()> {
    let Existing {
        uuid,
        adopt,
        fs_bytes,
    } = found;
    if adopt {
        let fact = format_record(journal.volume(), fs, &uuid, device, FormatState::Done);
        ctx.store
            .write(Durability::Immediate, |w| w.put_format(&fact))?;
    }
    if readonly {
        return Ok(());
    }
    let outcome = journal.step(
        "check",
        detail([("device", path_string(&device.path)), ("uuid", uuid)]),
        Durability::Lazy,
        || ctx.fstools.check(fs, &device.path),
    )?;
    if let FsckOutcome::Repaired(code) = outcome {
        tracing::warn!(
            volume = journal.volume(),
            code,
            "e2fsck repaired the filesystem"
        );
    }
    grow_offline_if_needed(ctx, journal, fs, &device.path, fs_bytes)?;
    Ok(())
}

/// Runs `side` on a second thread while `main` runs here; both must succeed. If no thread can be
/// started (a thread limit), `side` runs here afterwards.
fn alongside(
    side: impl Fn() -> Result<()> + Sync,
    main: impl FnOnce() -> Result<()>,
) -> Result<()> {
    std::thread::scope(|s| {
        let spawned = std::thread::Builder::new().spawn_scoped(s, &side);
        let main = main();
        let side = match spawned {
            Ok(handle) => handle
                .join()
                .unwrap_or_else(|_| Err(Error::Internal("the journal writer panicked".into()))),
            Err(e) => {
                tracing::debug!(error = %e, "no thread for the journal writer; writing in turn");
                side()
            }
        };
        main.and(side)
    })
}

/// A volume is staged at one path with one capability; anything else is ALREADY_EXISTS.
fn check_compatible(ctx: &NodeCtx, cmd: &StageCommand) -> Result<()> {
    let Some(existing) = ctx.store.staged(cmd.volume.as_str())? else {
        return Ok(());
    };
    // Access mode 0: a record rebuilt by `recover --from-mounts`, which cannot know what the CO
    // asked for; the CO's request is taken as the truth.
    let recovered = existing.access_mode == 0;
    if existing.staging_path != cmd.staging.as_path()
        && !existing.staging_path.as_os_str().is_empty()
    {
        return Err(Error::AlreadyExists(format!(
            "volume {} is already staged at {}",
            cmd.volume,
            existing.staging_path.display()
        )));
    }
    let same_kind = match (&existing.access, &access_record(&cmd.capability)) {
        (AccessRecord::Block, AccessRecord::Block) => true,
        (AccessRecord::Mount { fs_type: a, .. }, AccessRecord::Mount { fs_type: b, .. }) => a == b,
        _ => false,
    };
    let compatible = if recovered {
        same_kind
    } else {
        existing.access == access_record(&cmd.capability)
            && existing.access_mode == cmd.capability.mode.to_proto() as i32
    };
    if !compatible {
        return Err(Error::AlreadyExists(format!(
            "volume {} is already staged at {} with another capability",
            cmd.volume,
            existing.staging_path.display()
        )));
    }
    Ok(())
}

pub fn access_record(cap: &Capability) -> AccessRecord {
    match &cap.access {
        AccessType::Block => AccessRecord::Block,
        AccessType::Mount { fs, flags } => AccessRecord::Mount {
            fs_type: fs.name().to_string(),
            mount_flags: flags.raw().to_vec(),
        },
    }
}

fn verify_identity(
    volume: &VolumeId,
    device: &ResolvedDevice,
    format: Option<&FormatRecord>,
) -> Result<()> {
    match format {
        Some(f) if !same_identity(&f.identity, &device.identity) => Err(Error::WrongDevice {
            volume: volume.to_string(),
            device: device.path.clone(),
            reason: format!(
                "the volume was formatted on a device identified as {:?}, but this device is {:?} \
                 (wrong device, or the device changed under us)",
                f.identity, device.identity
            ),
        }),
        _ => Ok(()),
    }
}
