//! The format decision: the never-format rule applied to what the probe found, and mkfs itself
//! with its UUID chosen and journaled before it runs.

use std::path::Path;
use std::time::Instant;

use ebs_store::{Durability, FormatRecord, FormatState, Phase, now_unix_ms};

mod evidence;
#[cfg(test)]
mod tests;

pub use evidence::{DeviceEvidence, HeldEvidence};

use super::NodeCtx;
use super::journal::{Journal, detail};
use super::path_string;
use super::volume_device::VolumeDevice;
use crate::error::{Error, Result};
use ebs_node_core::request::{FormatOptions, FsType};
use ebs_node_core::steps::Step;
use ebs_node_host::attachment;
use ebs_node_host::blkid::{self, ProbeOutcome, Signature};
use ebs_node_host::fstools::filesystem_bytes_of;

/// What the probe allows us to do with the device.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    Format { uuid: String },
    Check(Existing),
}

/// A filesystem of the requested type that the probe found on the device.
#[derive(Debug, PartialEq, Eq)]
pub struct Existing {
    pub uuid: String,
    /// Made elsewhere: recorded as ours before it is used.
    pub adopt: bool,
    /// Its size, if the probe read it.
    pub fs_bytes: Option<u64>,
}

/// Whether a signature is the requested filesystem itself.
fn is_requested(sig: &Signature, fs: FsType) -> bool {
    !sig.is_partition_table && sig.type_name == fs.name()
}

/// What the probe found, and the size the requested filesystem believes it has when that is
/// what the device carries.
pub struct Probed {
    pub outcome: ProbeOutcome,
    pub fs_bytes: Option<u64>,
}

/// Probes the device and reads the filesystem's size in the same visit. The device is held open
/// across both, so the superblock is still in the device's page cache (the kernel drops it at the
/// last close) and the size costs no second read through the device.
pub fn probe_with_size(device: &Path, fs: FsType) -> Result<Probed> {
    let held = std::fs::File::open(device)
        .map_err(|e| Error::io(format!("opening {}", device.display()), e))?;
    let outcome = blkid::probe(device)
        .map_err(|e| Error::Internal(format!("probing {}: {e}", device.display())))?;
    let fs_bytes = match &outcome {
        ProbeOutcome::Found(sig) if is_requested(sig, fs) => {
            // Best effort: without it the grow check reads the superblock itself.
            filesystem_bytes_of(fs, &held).ok()
        }
        _ => None,
    };
    Ok(Probed { outcome, fs_bytes })
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
///
/// A format intent proves that our mkfs wrote its UUID only while nobody else can have written
/// the device since the intent: on the same attachment (`licenses_redo`), and never after the
/// volume was handed out as a raw block device (block stage and publish forget the intent,
/// `forget_intent`). Otherwise a filesystem carrying that UUID is used as found, never redone.
///
/// Everything it reads of the device comes through `dev` (the seam its table tests use).
pub fn decide(
    dev: &impl DeviceEvidence,
    vol: &str,
    fs: FsType,
    format: Option<&FormatRecord>,
    probed: Probed,
    readonly: bool,
) -> Result<Decision> {
    let Probed { outcome, fs_bytes } = probed;
    let wrong = |reason: String| Error::WrongDevice {
        volume: vol.to_string(),
        device: dev.path().to_path_buf(),
        reason,
    };
    // An intent that proves nothing counts as no record: a filesystem is used as found (and
    // recorded), never redone; a device that is not provably blank is refused.
    // A stale intent still names the UUID its mkfs chose: a device proven blank is formatted
    // with it (a UUID is no licence, and the journal keeps one name for the volume's filesystem
    // across a power cut that lost mkfs's writes).
    let stale_uuid = format
        .filter(|f| f.state == FormatState::Intent)
        .map(|f| f.uuid.clone());
    let format = format.filter(|f| f.state == FormatState::Done || licenses_redo(f, dev));
    match outcome {
        ProbeOutcome::Ambivalent => Err(Error::NotBlank {
            device: dev.path().to_path_buf(),
            found: "several conflicting signatures (ambivalent probe)".into(),
        }),
        ProbeOutcome::Found(sig) if is_requested(&sig, fs) => {
            let found = sig.uuid.clone().unwrap_or_default();
            let existing = |adopt| {
                // Not redone (no intent licenses it): an xfs whose mkfs never finished is
                // nothing to mount, and is left for the operator.
                let unfinished = dev
                    .xfs_mkfs_unfinished()
                    .map_err(|e| Error::io(format!("reading {}", dev.path().display()), e))?;
                if unfinished {
                    return Err(Error::NotBlank {
                        device: dev.path().to_path_buf(),
                        found: format!(
                            "an xfs (UUID {found}) whose mkfs never finished, and no format \
                             intent of this attachment vouches that it was ours; if it is not \
                             wanted, wipe the whole device and stage again"
                        ),
                    });
                }
                Ok(Decision::Check(Existing {
                    uuid: found.clone(),
                    adopt,
                    fs_bytes,
                }))
            };
            match format {
                Some(f) if f.uuid != found => Err(wrong(format!(
                    "it carries {fs} UUID {found}, but the volume was formatted with UUID {}",
                    f.uuid
                ))),
                // Our mkfs was interrupted (or finished just before its record), on this very
                // attachment, and the device was never handed out since: redo it.
                Some(f) if f.state == FormatState::Intent && !readonly => Ok(Decision::Format {
                    uuid: f.uuid.clone(),
                }),
                Some(_) => existing(false),
                None => existing(true),
            }
        }
        ProbeOutcome::Found(sig) => Err(Error::NotBlank {
            device: dev.path().to_path_buf(),
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
            // Never format unless provably blank, an earlier attempt of ours included: a failed
            // or interrupted mkfs licenses a redo only while the whole device is still proven
            // blank, or its superblock carries exactly the UUID that attempt chose.
            intent => blank_or_ours(dev, vol, intent, stale_uuid),
        },
    }
}

fn blank_or_ours(
    dev: &impl DeviceEvidence,
    vol: &str,
    intent: Option<&FormatRecord>,
    stale_uuid: Option<String>,
) -> Result<Decision> {
    let path = dev.path();
    let read_err = |e| Error::io(format!("reading {}", path.display()), e);
    let size = dev
        .size()
        .map_err(|e| Error::io(format!("sizing {}", path.display()), e))?;
    if size == 0 {
        return Err(Error::Precondition(format!(
            "{} has a size of 0 bytes (a detached loop device?)",
            path.display()
        )));
    }
    let proof = dev.prove_blank(size)?;
    let Some(found) = proof.found else {
        let uuid = match (intent, stale_uuid) {
            (Some(f), _) => f.uuid.clone(),
            (None, Some(stale)) => stale,
            (None, None) => dev.fresh_uuid()?,
        };
        return Ok(Decision::Format { uuid });
    };
    let covered = proof.coverage;
    let Some(f) = intent else {
        return Err(Error::NotBlank {
            device: path.to_path_buf(),
            found: format!("{}, found by {covered}", found.what),
        });
    };
    // Only our own mkfs wrote the superblock with the UUID it chose: the device was proven blank
    // before that mkfs ran, and it was neither mounted, handed out raw nor detached since.
    if dev.carries_uuid(&f.uuid).map_err(read_err)? {
        return Ok(Decision::Format {
            uuid: f.uuid.clone(),
        });
    }
    Err(Error::NotBlank {
        device: path.to_path_buf(),
        found: format!(
            "{}; an earlier mkfs of volume {vol} (UUID {}) failed or was interrupted, and what \
             is on the device now cannot be told from data someone wrote since. If that data is \
             not wanted, wipe the whole device (blkdiscard, or write zeroes over it) and stage \
             again",
            found.what, f.uuid
        ),
    })
}

/// Whether a format record is an intent that still proves its mkfs was the last to write the
/// device: journaled on this attachment of it (a detach and re-attach, a reboot or another
/// device at the path gives another), so nobody can have used the device elsewhere since.
fn licenses_redo(f: &FormatRecord, dev: &impl DeviceEvidence) -> bool {
    f.state == FormatState::Intent && f.attachment.is_some() && f.attachment == dev.attachment()
}

/// Drops a format intent in the commit that hands the volume out as a raw block device (block
/// stage and block publish): from then on anything may be written to it, a filesystem with the
/// intent's UUID included, so the intent may license nothing any more.
pub fn forget_intent(
    ctx: &NodeCtx,
    vol: &str,
    w: &mut ebs_store::Writer,
) -> std::result::Result<(), ebs_store::StoreError> {
    match ctx.store.format(vol)? {
        Some(f) if f.state == FormatState::Intent => w.delete_format(vol),
        _ => Ok(()),
    }
}

pub fn format_record(
    vol: &str,
    fs: FsType,
    uuid: &str,
    dev: &VolumeDevice,
    state: FormatState,
) -> FormatRecord {
    FormatRecord {
        volume_id: vol.to_string(),
        fs_type: fs.name().to_string(),
        uuid: uuid.to_string(),
        identity: dev.identity.clone(),
        state,
        at_unix_ms: now_unix_ms(),
        attachment: attachment::of(dev.devnum()),
    }
}

/// mkfs with the UUID chosen and journaled first; a failure is journaled durably too, so the
/// record of the attempt never reads as an interruption.
pub fn format_device(
    ctx: &NodeCtx,
    journal: &Journal<'_>,
    fs: FsType,
    device: &mut VolumeDevice,
    uuid: &str,
    options: &FormatOptions,
) -> Result<()> {
    let vol = journal.volume().to_string();
    let facts = detail([
        ("device", path_string(device.path())),
        ("fs_type", fs.name().to_string()),
        ("uuid", uuid.to_string()),
        ("options", options.mkfs_args(fs).join(" ")),
    ]);
    ctx.fstools.check_size(fs, device.path(), options)?;
    let intent = format_record(&vol, fs, uuid, device, FormatState::Intent);
    journal.record(
        Step::Format,
        Phase::Intent,
        facts.clone(),
        Durability::Immediate,
        |w| w.put_format(&intent),
    )?;
    let started = Instant::now();
    // mkfs claims the device exclusively itself.
    device.held.release_exclusive();
    let made = device
        .reverify(ctx)
        .and_then(|()| Ok(ctx.fstools.mkfs(fs, device.path(), uuid, options)?));
    if let Err(e) = made {
        let mut failed = facts;
        failed.insert("error".into(), e.to_string());
        if let Err(j) = journal.record(
            Step::Format,
            Phase::Failed,
            failed,
            Durability::Immediate,
            |_| Ok(()),
        ) {
            tracing::warn!(volume = %vol, error = %j, "the failed mkfs could not be journaled");
        }
        return Err(e);
    }
    tracing::info!(volume = %vol, device = %device.path().display(), %fs, uuid,
        ms = started.elapsed().as_millis() as u64, "formatted");
    let done = format_record(&vol, fs, uuid, device, FormatState::Done);
    journal.record(
        Step::Format,
        Phase::Done,
        facts,
        Durability::Immediate,
        |w| w.put_format(&done),
    )
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
