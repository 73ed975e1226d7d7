//! The never-format rule: what a device may be used for, judged from what the probe found, what
//! the journal's format record says and what the device shows, read through [`DeviceEvidence`]
//! only. Pure: the agent's evidence reads the held device; the tests' double answers from a table,
//! so every branch is proven without root (`tests.rs`), and the root tests on real devices prove
//! the host's side (the probe, the blank proof, the superblock reads).

use std::io;
use std::path::{Path, PathBuf};

use crate::blank::Proof;
use crate::probe::{ProbeOutcome, Signature};
use crate::request::FsType;

#[cfg(test)]
mod tests;

/// What the never-format rule may read of a device, and nothing more.
pub trait DeviceEvidence {
    /// The device's path, for messages.
    fn path(&self) -> &Path;
    /// The attachment the device is on now (`boot:diskseq`): a format intent licenses a redo
    /// only on the attachment it was journaled on.
    fn attachment(&self) -> Option<String>;
    /// The device's size in bytes.
    fn size(&self) -> io::Result<u64>;
    /// Whether an xfs superblock is the one mkfs.xfs writes first and rewrites last.
    fn xfs_mkfs_unfinished(&self) -> io::Result<bool>;
    /// Whether a superblock (even one libblkid rejects) carries exactly this UUID and was never
    /// mounted (mkfs's own work, not a used filesystem's torn or damaged superblock).
    fn carries_uuid(&self, uuid: &str) -> io::Result<bool>;
    /// The blank proof over `size` bytes: every allocated byte of a backing file where there
    /// is one, bounded windows otherwise. [`FormatError::Unprovable`] when it cannot be made.
    fn prove_blank(&self, size: u64) -> Result<Proof, FormatError>;
    /// The same proof of the bytes from device offset `from` on.
    fn prove_blank_past(&self, from: u64, size: u64) -> Result<Proof, FormatError>;
    /// A UUID for a filesystem that no record names yet.
    fn fresh_uuid(&self) -> Result<String, FormatError>;
}

/// The journal's format record, as the rule reads it.
#[derive(Clone, Copy, Debug)]
pub struct FormatView<'a> {
    pub fs_type: &'a str,
    pub uuid: &'a str,
    /// mkfs finished (false: an intent, mkfs about to run or interrupted).
    pub done: bool,
    /// The attachment an intent was journaled on.
    pub attachment: Option<&'a str>,
}

/// Why the rule refuses, or could not judge. Each says what went wrong; the daemon chooses the
/// gRPC code.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error(
        "refusing to format {device}: it is not blank ({found}); the agent formats only devices \
         that carry no signature and no data"
    )]
    NotBlank { device: PathBuf, found: String },
    #[error("{}", wrong_device_text(.volume, .device, .reason))]
    WrongDevice {
        volume: String,
        device: PathBuf,
        reason: String,
    },
    #[error("volume {volume} has no filesystem and the capability is read-only: nothing to mount")]
    NothingToMount { volume: String },
    #[error("{device} has a size of 0 bytes (a detached loop device?)")]
    EmptyDevice { device: PathBuf },
    #[error("{device} cannot be proven blank, so it is not formatted: {why}")]
    Unprovable { device: PathBuf, why: String },
    #[error("{context}: {source}")]
    Io { context: String, source: io::Error },
}

/// The refusal of a device that is not the volume's, in one wording for every layer that
/// refuses one (this rule, and the daemon's identity checks).
pub fn wrong_device_text(volume: &str, device: &Path, reason: &str) -> String {
    format!(
        "refusing to use {} for volume {volume}: {reason}; nothing was formatted or mounted",
        device.display()
    )
}

impl FormatError {
    pub fn io(context: impl Into<String>, source: io::Error) -> Self {
        FormatError::Io {
            context: context.into(),
            source,
        }
    }
}

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
pub fn is_requested(sig: &Signature, fs: FsType) -> bool {
    !sig.is_partition_table && sig.type_name == fs.name()
}

/// What the probe found, and the size the requested filesystem believes it has when that is
/// what the device carries.
pub struct Probed {
    pub outcome: ProbeOutcome,
    pub fs_bytes: Option<u64>,
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
    dev: &(impl DeviceEvidence + ?Sized),
    vol: &str,
    fs: FsType,
    format: Option<FormatView<'_>>,
    probed: Probed,
    readonly: bool,
) -> Result<Decision, FormatError> {
    let Probed { outcome, fs_bytes } = probed;
    let wrong = |reason: String| FormatError::WrongDevice {
        volume: vol.to_string(),
        device: dev.path().to_path_buf(),
        reason,
    };
    // An intent that proves nothing counts as no record: a filesystem is used as found (and
    // recorded), never redone; a device that is not provably blank is refused.
    // A stale intent still names the UUID its mkfs chose: a device proven blank is formatted
    // with it (a UUID is no licence, and the journal keeps one name for the volume's filesystem
    // across a power cut that lost mkfs's writes).
    let stale_uuid = format.filter(|f| !f.done).map(|f| f.uuid.to_string());
    let format = format.filter(|f| f.done || licenses_redo(f, dev));
    match outcome {
        ProbeOutcome::Ambivalent => Err(FormatError::NotBlank {
            device: dev.path().to_path_buf(),
            found: "several conflicting signatures (ambivalent probe)".into(),
        }),
        // A filesystem whose journal lies on another device writes to that device at mount
        // (the kernel opens it exclusively by number): never the volume's alone, so never
        // mounted (a nineteenth fresh review's F2: another volume's raw device became the
        // journal of this one's ext4).
        ProbeOutcome::Found(sig) if is_requested(&sig, fs) && sig.external_journal.is_some() => {
            Err(FormatError::NotBlank {
                device: dev.path().to_path_buf(),
                found: format!(
                    "{}, whose journal lies on another device (journal UUID {}): mounting it \
                     would write to that device; the agent mounts only filesystems wholly on \
                     the volume's own device",
                    describe(&sig),
                    sig.external_journal.as_deref().unwrap_or_default()
                ),
            })
        }
        ProbeOutcome::Found(sig) if is_requested(&sig, fs) => {
            let found = sig.uuid.clone().unwrap_or_default();
            match format {
                Some(f) if f.uuid != found => Err(wrong(format!(
                    "it carries {fs} UUID {found}, but the volume was formatted with UUID {}",
                    f.uuid
                ))),
                // Our mkfs was interrupted (or finished just before its record), on this very
                // attachment, and the device was never handed out since.
                Some(f) if !f.done && !readonly => requested_found(dev, found, Some(f), fs_bytes),
                Some(_) => requested_found(dev, found, None, fs_bytes).map(|d| match d {
                    // A finished record vouches for the filesystem: nothing to adopt.
                    Decision::Check(e) => Decision::Check(Existing { adopt: false, ..e }),
                    other => other,
                }),
                None => requested_found(dev, found, None, fs_bytes),
            }
        }
        ProbeOutcome::Found(sig) => Err(FormatError::NotBlank {
            device: dev.path().to_path_buf(),
            found: format!("it carries a {}, not the requested {fs}", describe(&sig)),
        }),
        ProbeOutcome::Blank => match format {
            Some(f) if f.done => Err(wrong(format!(
                "the volume was formatted with {} UUID {}, but the device now carries no \
                 filesystem (wrong device, or the device was wiped)",
                f.fs_type, f.uuid
            ))),
            _ if readonly => Err(FormatError::NothingToMount {
                volume: vol.to_string(),
            }),
            // Never format unless provably blank, an earlier attempt of ours included: a failed
            // or interrupted mkfs licenses a redo only while the whole device is still proven
            // blank, or its superblock carries exactly the UUID that attempt chose.
            intent => blank_or_ours(dev, vol, intent, stale_uuid),
        },
    }
}

/// A filesystem of the requested type with the record's UUID (or no record) is on the device.
/// Only an xfs whose mkfs never finished (its superblock still says so) is redone, and only under
/// `intent`, the licence of our own interrupted mkfs: a filesystem the probe finds whole is mkfs's
/// finished work (mke2fs writes the primary superblock last), so it is used as found, checked and
/// recorded; a redo threw away whatever a mount of it wrote since (a fifty-ninth fresh review's
/// F2: root mounted it while the agent was down and wrote a file, and the retried stage formatted
/// it again).
fn requested_found(
    dev: &(impl DeviceEvidence + ?Sized),
    found: String,
    intent: Option<FormatView<'_>>,
    fs_bytes: Option<u64>,
) -> Result<Decision, FormatError> {
    let unfinished = dev
        .xfs_mkfs_unfinished()
        .map_err(|e| FormatError::io(format!("reading {}", dev.path().display()), e))?;
    if !unfinished {
        return Ok(Decision::Check(Existing {
            uuid: found,
            adopt: true,
            fs_bytes,
        }));
    }
    let Some(f) = intent else {
        // Nothing to mount, and no intent licenses a redo: left for the operator.
        return Err(FormatError::NotBlank {
            device: dev.path().to_path_buf(),
            found: format!(
                "an xfs (UUID {found}) whose mkfs never finished, and no format intent of this \
                 attachment vouches that it was ours; if it is not wanted, wipe the whole device \
                 and stage again"
            ),
        });
    };
    // Redone only while nothing lies past mkfs's first writes: beyond them its partial metadata
    // cannot be told from data written since (a sixty-second fresh review's F2: raw writes made
    // while the agent was down were formatted over).
    if let Some(more) = past_mkfs_head(dev)? {
        return Err(FormatError::NotBlank {
            device: dev.path().to_path_buf(),
            found: format!(
                "an xfs (UUID {found}) whose mkfs never finished, and {} past its first writes: \
                 mkfs's own metadata cannot be told from data written since. If that data is \
                 not wanted, wipe the whole device and stage again",
                more.what
            ),
        });
    }
    Ok(Decision::Format {
        uuid: f.uuid.to_string(),
    })
}

fn blank_or_ours(
    dev: &(impl DeviceEvidence + ?Sized),
    vol: &str,
    intent: Option<FormatView<'_>>,
    stale_uuid: Option<String>,
) -> Result<Decision, FormatError> {
    let path = dev.path();
    let read_err = |e| FormatError::io(format!("reading {}", path.display()), e);
    let size = dev
        .size()
        .map_err(|e| FormatError::io(format!("sizing {}", path.display()), e))?;
    if size == 0 {
        return Err(FormatError::EmptyDevice {
            device: path.to_path_buf(),
        });
    }
    let proof = dev.prove_blank(size)?;
    let Some(found) = proof.found else {
        let uuid = match (intent, stale_uuid) {
            (Some(f), _) => f.uuid.to_string(),
            (None, Some(stale)) => stale,
            (None, None) => dev.fresh_uuid()?,
        };
        return Ok(Decision::Format { uuid });
    };
    let covered = proof.coverage;
    let Some(f) = intent else {
        return Err(FormatError::NotBlank {
            device: path.to_path_buf(),
            found: format!("{}, found by {covered}", found.what),
        });
    };
    // Only our own mkfs wrote the superblock with the UUID it chose: the device was proven blank
    // before that mkfs ran, and it was neither mounted, handed out raw nor detached since. The
    // licence covers mkfs's first writes and nothing past them.
    if found.offset < MKFS_HEAD
        && dev.carries_uuid(f.uuid).map_err(read_err)?
        && past_mkfs_head(dev)?.is_none()
    {
        return Ok(Decision::Format {
            uuid: f.uuid.to_string(),
        });
    }
    Err(FormatError::NotBlank {
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

/// What an interrupted mkfs writes before anything else: xfs's superblock and its first
/// allocation group's headers (the sectors after it), ext's superblock at 1024. An intent's
/// licence to redo covers these bytes and nothing beyond.
pub const MKFS_HEAD: u64 = 4096;

/// What the device holds past `MKFS_HEAD`, if anything (`None`: proven blank there).
fn past_mkfs_head(
    dev: &(impl DeviceEvidence + ?Sized),
) -> Result<Option<crate::blank::NonBlank>, FormatError> {
    let size = dev
        .size()
        .map_err(|e| FormatError::io(format!("sizing {}", dev.path().display()), e))?;
    Ok(dev.prove_blank_past(MKFS_HEAD, size)?.found)
}

/// Whether a format record is an intent that still proves its mkfs was the last to write the
/// device: journaled on this attachment of it (a detach and re-attach, a reboot or another
/// device at the path gives another), so nobody can have used the device elsewhere since.
fn licenses_redo(f: &FormatView<'_>, dev: &(impl DeviceEvidence + ?Sized)) -> bool {
    !f.done && f.attachment.is_some() && f.attachment == dev.attachment().as_deref()
}
