//! NodeStageVolume as the spec's lifecycle reads: resolve the device, verify its identity, probe
//! it, format it (only when provably blank) or check it, mount it, grow it. Each step is journaled;
//! a retry after a crash re-derives every decision from the journal's facts and the host.

use std::collections::HashMap;
use std::path::Path;
use std::time::Instant;

use ebs_store::{
    AccessRecord, Durability, FormatRecord, FormatState, Phase, Progress, StagedVolume, now_unix_ms,
};

use super::journal::{Journal, detail};
use super::{NodeCtx, ensure_dir, mounted_at, path_string};
use crate::backend::{ResolvedDevice, block_dev_numbers};
use crate::error::{Error, Result};
use crate::host::blkid::{self, ProbeOutcome, Signature};
use crate::host::{blank, loopdev, mounter};
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

/// What the probe allows us to do with the device.
enum Decision {
    Format { uuid: String },
    Check { uuid: String, adopt: bool },
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

    if !already {
        let outcome = journal.step(
            "probe",
            detail([("device", path_string(&device.path))]),
            Durability::Lazy,
            || probe(&device.path),
        )?;
        match decide(vol, fs, &device, format.as_ref(), outcome, readonly)? {
            Decision::Format { uuid } => format_device(ctx, &journal, cmd, fs, &device, &uuid)?,
            Decision::Check { uuid, adopt } => {
                if adopt {
                    let fact = format_record(vol, fs, &uuid, &device, FormatState::Done);
                    ctx.store
                        .write(Durability::Immediate, |w| w.put_format(&fact))?;
                }
                if !readonly {
                    let outcome = journal.step(
                        "check",
                        detail([("device", path_string(&device.path)), ("uuid", uuid)]),
                        Durability::Lazy,
                        || ctx.fstools.check(fs, &device.path),
                    )?;
                    if let crate::host::fstools::FsckOutcome::Repaired(code) = outcome {
                        tracing::warn!(volume = vol, code, "e2fsck repaired the filesystem");
                    }
                }
            }
        }
        let mut data = flags.data().to_vec();
        if fs == FsType::Xfs {
            // A volume and its snapshot clone share a UUID; xfs refuses the second without this.
            data.push("nouuid".into());
        }
        let facts = detail([
            ("device", path_string(&device.path)),
            ("staging", path_string(staging)),
            ("options", data.join(",")),
            ("readonly", readonly.to_string()),
        ]);
        journal.record(
            "mount",
            Phase::Intent,
            facts.clone(),
            Durability::Immediate,
            |w| w.put_staged(&record),
        )?;
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
                    "mounting {} on {}",
                    device.path.display(),
                    staging.display()
                ),
                e,
            )
        })?;
        journal.record("mount", Phase::Done, facts, Durability::Lazy, |_| Ok(()))?;
    }

    if !readonly {
        grow_if_needed(ctx, &journal, fs, &device.path, staging)?;
    }
    record.progress = Progress::Complete;
    record.at_unix_ms = now_unix_ms();
    journal.record(
        "staged",
        Phase::Done,
        detail([("staging", path_string(staging))]),
        Durability::Immediate,
        |w| w.put_staged(&record),
    )
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

fn probe(device: &Path) -> Result<ProbeOutcome> {
    blkid::probe(device).map_err(|e| Error::Internal(format!("probing {}: {e}", device.display())))
}

fn describe(sig: &Signature) -> String {
    let what = if sig.is_partition_table {
        "partition table"
    } else {
        match sig.usage.as_deref() {
            Some("filesystem") => "filesystem",
            Some("raid") => "RAID or LVM member",
            Some("crypto") => "encryption header",
            _ => "signature",
        }
    };
    match &sig.uuid {
        Some(u) => format!("{what} {} (UUID {u})", sig.type_name),
        None => format!("{what} {}", sig.type_name),
    }
}

/// The never-format rule: format only a provably blank device, or one whose interrupted mkfs was
/// ours; use an existing filesystem only if it is the requested one and, once we formatted the
/// volume, only if it carries our UUID.
fn decide(
    vol: &str,
    fs: FsType,
    device: &ResolvedDevice,
    format: Option<&FormatRecord>,
    outcome: ProbeOutcome,
    readonly: bool,
) -> Result<Decision> {
    let wrong = |reason: String| Error::WrongDevice {
        volume: vol.to_string(),
        device: device.path.clone(),
        reason,
    };
    match outcome {
        ProbeOutcome::Ambivalent => Err(Error::NotBlank {
            device: device.path.clone(),
            found: "several conflicting signatures (ambivalent probe)".into(),
        }),
        ProbeOutcome::Found(sig) if !sig.is_partition_table && sig.type_name == fs.name() => {
            let found = sig.uuid.clone().unwrap_or_default();
            match format {
                Some(f) if f.uuid != found => Err(wrong(format!(
                    "it carries {fs} UUID {found}, but the volume was formatted with UUID {}",
                    f.uuid
                ))),
                // Our mkfs was interrupted (or finished just before its record): redo it; the
                // volume was never mounted, so nothing of the user's can be on it.
                Some(f) if f.state == FormatState::Intent && !readonly => Ok(Decision::Format {
                    uuid: f.uuid.clone(),
                }),
                Some(_) => Ok(Decision::Check {
                    uuid: found,
                    adopt: false,
                }),
                None => Ok(Decision::Check {
                    uuid: found,
                    adopt: true,
                }),
            }
        }
        ProbeOutcome::Found(sig) => Err(Error::NotBlank {
            device: device.path.clone(),
            found: format!("it carries a {}, not the requested {fs}", describe(&sig)),
        }),
        ProbeOutcome::Blank => match format {
            Some(f) if f.state == FormatState::Done => Err(wrong(format!(
                "the volume was formatted with {} UUID {}, but the device now carries no \
                 filesystem (wrong device, or the device was wiped)",
                f.fs_type, f.uuid
            ))),
            _ if readonly => Err(Error::Precondition(format!(
                "volume {vol} has no filesystem and the capability is read-only: nothing to mount"
            ))),
            Some(f) => Ok(Decision::Format {
                uuid: f.uuid.clone(),
            }),
            None => {
                let size = loopdev::device_size(&device.path)
                    .map_err(|e| Error::io(format!("sizing {}", device.path.display()), e))?;
                if size == 0 {
                    return Err(Error::Precondition(format!(
                        "{} has a size of 0 bytes (a detached loop device?)",
                        device.path.display()
                    )));
                }
                match blank::first_nonzero_region(&device.path, size)
                    .map_err(|e| Error::io(format!("reading {}", device.path.display()), e))?
                {
                    Some(offset) => Err(Error::NotBlank {
                        device: device.path.clone(),
                        found: format!("unrecognised data at byte {offset}"),
                    }),
                    None => Ok(Decision::Format {
                        uuid: random_uuid()?,
                    }),
                }
            }
        },
    }
}

fn format_record(
    vol: &str,
    fs: FsType,
    uuid: &str,
    dev: &ResolvedDevice,
    state: FormatState,
) -> FormatRecord {
    FormatRecord {
        volume_id: vol.to_string(),
        fs_type: fs.name().to_string(),
        uuid: uuid.to_string(),
        identity: dev.identity.clone(),
        state,
        at_unix_ms: now_unix_ms(),
    }
}

fn format_device(
    ctx: &NodeCtx,
    journal: &Journal<'_>,
    cmd: &StageCommand,
    fs: FsType,
    device: &ResolvedDevice,
    uuid: &str,
) -> Result<()> {
    let vol = cmd.volume.as_str();
    let facts = detail([
        ("device", path_string(&device.path)),
        ("fs_type", fs.name().to_string()),
        ("uuid", uuid.to_string()),
        ("options", cmd.format.mkfs_args(fs).join(" ")),
    ]);
    let intent = format_record(vol, fs, uuid, device, FormatState::Intent);
    journal.record(
        "format",
        Phase::Intent,
        facts.clone(),
        Durability::Immediate,
        |w| w.put_format(&intent),
    )?;
    let started = Instant::now();
    if let Err(e) = ctx.fstools.mkfs(fs, &device.path, uuid, &cmd.format) {
        let mut failed = facts;
        failed.insert("error".into(), e.to_string());
        let _ = journal.record(
            "format",
            Phase::Failed,
            failed,
            Durability::Lazy,
            |_| Ok(()),
        );
        return Err(e);
    }
    tracing::info!(volume = vol, device = %device.path.display(), %fs, uuid,
        ms = started.elapsed().as_millis() as u64, "formatted");
    let done = format_record(vol, fs, uuid, device, FormatState::Done);
    journal.record("format", Phase::Done, facts, Durability::Immediate, |w| {
        w.put_format(&done)
    })
}

/// Grows the filesystem when the device is larger (a snapshot restored into a bigger volume, or
/// an expansion that happened while the volume was not staged).
pub fn grow_if_needed(
    ctx: &NodeCtx,
    journal: &Journal<'_>,
    fs: FsType,
    device: &Path,
    mount_point: &Path,
) -> Result<bool> {
    let dev_bytes = loopdev::device_size(device)
        .map_err(|e| Error::io(format!("sizing {}", device.display()), e))?;
    let fs_bytes = crate::host::fs_size::mounted_bytes(fs, device, mount_point)
        .map_err(|e| Error::io(format!("sizing the filesystem on {}", device.display()), e))?;
    if dev_bytes <= fs_bytes + (1 << 20) {
        return Ok(false);
    }
    journal.step(
        "grow",
        detail([
            ("device", path_string(device)),
            ("from_bytes", fs_bytes.to_string()),
            ("to_bytes", dev_bytes.to_string()),
        ]),
        Durability::Lazy,
        || ctx.fstools.grow(fs, device, mount_point),
    )?;
    Ok(true)
}

/// A random (version 4) UUID for mkfs, chosen before mkfs runs so that the journal knows it.
pub fn random_uuid() -> Result<String> {
    let mut b = [0u8; 16];
    let f =
        std::fs::File::open("/dev/urandom").map_err(|e| Error::io("opening /dev/urandom", e))?;
    std::io::Read::read_exact(&mut &f, &mut b).map_err(|e| Error::io("reading /dev/urandom", e))?;
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: Vec<String> = b.iter().map(|x| format!("{x:02x}")).collect();
    Ok(format!(
        "{}-{}-{}-{}-{}",
        h[0..4].concat(),
        h[4..6].concat(),
        h[6..8].concat(),
        h[8..10].concat(),
        h[10..16].concat()
    ))
}
