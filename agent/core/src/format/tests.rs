//! `decide`, the never-format rule, over every branch, against a recording double of the
//! device: no root, no device. Each row also says which reads of the device the branch makes,
//! so a branch that must decide on the record alone is seen not to touch the device, and a
//! stale intent is seen never to be asked whether the device carries its UUID.
//! The root tests on real devices (`refusals::never_format_matrix`, `ownership::intent::*`)
//! prove the host's side: the probe, the blank proof and the superblock reads.

use std::cell::RefCell;
use std::io;
use std::path::Path;

use super::{Decision, DeviceEvidence, Existing, FormatError, FormatView, Probed, decide};
use crate::blank::{Coverage, NonBlank, Proof};
use crate::probe::{ProbeOutcome, Signature};
use crate::request::FsType;

const NOW: &str = "boot-1:7";
const BEFORE: &str = "boot-0:3";
const OURS: &str = "11111111-2222-4333-8444-555555555555";
const OTHER: &str = "99999999-8888-4777-8666-555555555555";

/// The device as a table: what each read answers. `calls` records the reads made.
struct Double {
    attachment: Option<&'static str>,
    size: Option<u64>,
    unfinished: bool,
    carries: Option<&'static str>,
    /// Ok(None): proven blank; Ok(Some(what)): something found; Err: no proof possible.
    proof: std::result::Result<Option<&'static str>, &'static str>,
    /// Where the first thing found lies (past mkfs's first writes unless set lower).
    found_at: u64,
    /// What lies past mkfs's first writes (`prove_blank_past`), if anything.
    past_head: Option<&'static str>,
    calls: RefCell<Vec<&'static str>>,
}

impl Default for Double {
    fn default() -> Self {
        Double {
            attachment: Some(NOW),
            size: Some(1 << 30),
            unfinished: false,
            carries: None,
            proof: Ok(None),
            found_at: 4096,
            past_head: None,
            calls: RefCell::new(Vec::new()),
        }
    }
}

impl Double {
    fn read(&self, what: &'static str) {
        self.calls.borrow_mut().push(what);
    }
}

impl DeviceEvidence for Double {
    fn path(&self) -> &Path {
        Path::new("/dev/double")
    }
    fn attachment(&self) -> Option<String> {
        self.read("attachment");
        self.attachment.map(str::to_string)
    }
    fn size(&self) -> io::Result<u64> {
        self.read("size");
        self.size.ok_or_else(|| io::Error::from_raw_os_error(5))
    }
    fn xfs_mkfs_unfinished(&self) -> io::Result<bool> {
        self.read("xfs_mkfs_unfinished");
        Ok(self.unfinished)
    }
    fn carries_uuid(&self, uuid: &str) -> io::Result<bool> {
        self.read("carries_uuid");
        Ok(self.carries == Some(uuid))
    }
    fn prove_blank(&self, _size: u64) -> Result<Proof, FormatError> {
        self.read("prove_blank");
        let coverage = Coverage::Windows {
            windows: 256,
            read: 1 << 24,
        };
        match self.proof {
            Ok(found) => Ok(Proof {
                found: found.map(|what| NonBlank {
                    offset: self.found_at,
                    what: what.into(),
                }),
                coverage,
            }),
            Err(why) => Err(FormatError::Unprovable {
                device: self.path().to_path_buf(),
                why: why.into(),
            }),
        }
    }
    fn prove_blank_past(&self, from: u64, _size: u64) -> Result<Proof, FormatError> {
        self.read("prove_blank_past");
        assert_eq!(from, crate::format::MKFS_HEAD);
        Ok(Proof {
            found: self.past_head.map(|what| NonBlank {
                offset: from,
                what: what.into(),
            }),
            coverage: Coverage::Windows {
                windows: 256,
                read: 1 << 24,
            },
        })
    }
    fn fresh_uuid(&self) -> Result<String, FormatError> {
        self.read("fresh_uuid");
        Ok("fresh".into())
    }
}

fn fs_sig(fs: &str, uuid: &str) -> ProbeOutcome {
    ProbeOutcome::Found(Signature {
        type_name: fs.into(),
        uuid: Some(uuid.into()),
        usage: Some("filesystem".into()),
        label: None,
        is_partition_table: false,
        external_journal: None,
    })
}

fn record(done: bool, uuid: &'static str, attachment: Option<&'static str>) -> FormatView<'static> {
    FormatView {
        fs_type: "ext4",
        uuid,
        done,
        attachment,
    }
}

fn intent(uuid: &'static str, attachment: Option<&'static str>) -> Option<FormatView<'static>> {
    Some(record(false, uuid, attachment))
}

fn done(uuid: &'static str) -> Option<FormatView<'static>> {
    Some(record(true, uuid, None))
}

#[derive(Debug)]
enum Want {
    Format(&'static str),
    Check { uuid: &'static str, adopt: bool },
    NotBlank(&'static str),
    WrongDevice(&'static str),
    NothingToMount,
    EmptyDevice,
    Unprovable,
    Io(&'static str),
}

struct Row {
    name: &'static str,
    probe: ProbeOutcome,
    record: Option<FormatView<'static>>,
    readonly: bool,
    device: Double,
    want: Want,
    /// The reads of the device the branch makes, in order.
    reads: &'static [&'static str],
}

fn row(
    name: &'static str,
    probe: ProbeOutcome,
    record: Option<FormatView<'static>>,
    want: Want,
) -> Row {
    Row {
        name,
        probe,
        record,
        readonly: false,
        device: Double::default(),
        want,
        reads: &[],
    }
}

impl Row {
    fn reads(mut self, reads: &'static [&'static str]) -> Self {
        self.reads = reads;
        self
    }
    fn readonly(mut self) -> Self {
        self.readonly = true;
        self
    }
    fn device(mut self, device: Double) -> Self {
        self.device = device;
        self
    }
}

fn check(row: Row) {
    let probed = Probed {
        outcome: row.probe.clone(),
        fs_bytes: Some(1 << 29),
    };
    let got = decide(
        &row.device,
        "vol",
        FsType::Ext4,
        row.record,
        probed,
        row.readonly,
    );
    let name = row.name;
    let text = |e: &FormatError| e.to_string();
    match (&row.want, &got) {
        (Want::Format(uuid), Ok(Decision::Format { uuid: got })) => assert_eq!(got, uuid, "{name}"),
        (Want::Check { uuid, adopt }, Ok(Decision::Check(found))) => assert_eq!(
            found,
            &Existing {
                uuid: uuid.to_string(),
                adopt: *adopt,
                fs_bytes: Some(1 << 29),
            },
            "{name}"
        ),
        (Want::NotBlank(part), Err(e @ FormatError::NotBlank { .. }))
        | (Want::WrongDevice(part), Err(e @ FormatError::WrongDevice { .. }))
        | (Want::Io(part), Err(e @ FormatError::Io { .. })) => {
            assert!(text(e).contains(part), "{name}: {e} does not say {part:?}")
        }
        (Want::NothingToMount, Err(FormatError::NothingToMount { volume })) => {
            assert_eq!(volume, "vol", "{name}")
        }
        (Want::EmptyDevice, Err(FormatError::EmptyDevice { .. }))
        | (Want::Unprovable, Err(FormatError::Unprovable { .. })) => {}
        (want, got) => panic!("{name}: wanted {want:?}, got {got:?}"),
    }
    assert_eq!(
        *row.device.calls.borrow(),
        row.reads,
        "{name}: the device reads"
    );
}

/// A filesystem of the requested type is on the device.
#[test]
fn a_requested_filesystem_is_used_as_found_or_refused_never_redone_without_licence() {
    let d = || Double::default();
    for r in [
        row(
            "no record: adopted",
            fs_sig("ext4", OTHER),
            None,
            Want::Check {
                uuid: OTHER,
                adopt: true,
            },
        )
        .reads(&["xfs_mkfs_unfinished"]),
        row(
            "done, same UUID: ours",
            fs_sig("ext4", OURS),
            done(OURS),
            Want::Check {
                uuid: OURS,
                adopt: false,
            },
        )
        .reads(&["xfs_mkfs_unfinished"]),
        row(
            "done, another UUID: the wrong device",
            fs_sig("ext4", OTHER),
            done(OURS),
            Want::WrongDevice("formatted with UUID"),
        )
        .reads(&[]),
        row(
            "intent on this attachment, a whole filesystem: mkfs finished, used and recorded",
            fs_sig("ext4", OURS),
            intent(OURS, Some(NOW)),
            Want::Check {
                uuid: OURS,
                adopt: true,
            },
        )
        .reads(&["attachment", "xfs_mkfs_unfinished"]),
        row(
            "intent on this attachment, an xfs whose mkfs never finished: redone with its UUID",
            fs_sig("ext4", OURS),
            intent(OURS, Some(NOW)),
            Want::Format(OURS),
        )
        .device(Double {
            unfinished: true,
            ..d()
        })
        .reads(&[
            "attachment",
            "xfs_mkfs_unfinished",
            "size",
            "prove_blank_past",
        ]),
        row(
            "intent on this attachment, an unfinished xfs with data past its first writes: refused",
            fs_sig("ext4", OURS),
            intent(OURS, Some(NOW)),
            Want::NotBlank("whose mkfs never finished, and written data"),
        )
        .device(Double {
            unfinished: true,
            past_head: Some("written data"),
            ..d()
        })
        .reads(&[
            "attachment",
            "xfs_mkfs_unfinished",
            "size",
            "prove_blank_past",
        ]),
        row(
            "intent on this attachment, read-only: used, not redone",
            fs_sig("ext4", OURS),
            intent(OURS, Some(NOW)),
            Want::Check {
                uuid: OURS,
                adopt: false,
            },
        )
        .readonly()
        .reads(&["attachment", "xfs_mkfs_unfinished"]),
        row(
            "intent on this attachment, another UUID: the wrong device",
            fs_sig("ext4", OTHER),
            intent(OURS, Some(NOW)),
            Want::WrongDevice("formatted with UUID"),
        )
        .reads(&["attachment"]),
        row(
            "intent of an earlier attachment: no licence, adopted as found",
            fs_sig("ext4", OURS),
            intent(OURS, Some(BEFORE)),
            Want::Check {
                uuid: OURS,
                adopt: true,
            },
        )
        .reads(&["attachment", "xfs_mkfs_unfinished"]),
        row(
            "intent without an attachment: no licence",
            fs_sig("ext4", OURS),
            intent(OURS, None),
            Want::Check {
                uuid: OURS,
                adopt: true,
            },
        )
        .reads(&["xfs_mkfs_unfinished"]),
        row(
            "intent, device's attachment unknown: no licence",
            fs_sig("ext4", OURS),
            intent(OURS, Some(NOW)),
            Want::Check {
                uuid: OURS,
                adopt: true,
            },
        )
        .device(Double {
            attachment: None,
            ..d()
        })
        .reads(&["attachment", "xfs_mkfs_unfinished"]),
        row(
            "an unfinished xfs mkfs, no licence: refused",
            fs_sig("ext4", OTHER),
            None,
            Want::NotBlank("whose mkfs never finished"),
        )
        .device(Double {
            unfinished: true,
            ..d()
        })
        .reads(&["xfs_mkfs_unfinished"]),
        row(
            "an unfinished mkfs, done record: refused",
            fs_sig("ext4", OURS),
            done(OURS),
            Want::NotBlank("whose mkfs never finished"),
        )
        .device(Double {
            unfinished: true,
            ..d()
        })
        .reads(&["xfs_mkfs_unfinished"]),
    ] {
        check(r);
    }
}

/// Something other than the requested filesystem is on the device: never formatted over.
#[test]
fn anything_else_found_is_refused_whatever_the_record() {
    let gpt = ProbeOutcome::Found(Signature {
        type_name: "ext4".into(),
        uuid: Some(OURS.into()),
        usage: None,
        label: None,
        is_partition_table: true,
        external_journal: None,
    });
    let luks = ProbeOutcome::Found(Signature {
        type_name: "crypto_LUKS".into(),
        uuid: Some(OTHER.into()),
        usage: Some("crypto".into()),
        label: None,
        is_partition_table: false,
        external_journal: None,
    });
    for r in [
        row(
            "ambivalent probe",
            ProbeOutcome::Ambivalent,
            None,
            Want::NotBlank("ambivalent"),
        ),
        row(
            "ambivalent probe, licensed intent",
            ProbeOutcome::Ambivalent,
            intent(OURS, Some(NOW)),
            Want::NotBlank("ambivalent"),
        )
        .reads(&["attachment"]),
        row(
            "another filesystem",
            fs_sig("xfs", OTHER),
            None,
            Want::NotBlank("not the requested ext4"),
        ),
        row(
            "another filesystem, licensed intent",
            fs_sig("xfs", OURS),
            intent(OURS, Some(NOW)),
            Want::NotBlank("filesystem xfs"),
        )
        .reads(&["attachment"]),
        row(
            "a partition table named like the filesystem",
            gpt,
            None,
            Want::NotBlank("partition table ext4"),
        ),
        row(
            "an encryption header",
            luks,
            done(OURS),
            Want::NotBlank("encryption header crypto_LUKS"),
        ),
    ] {
        check(r);
    }
}

/// libblkid found nothing: formatted only on a blank proof, or over our own interrupted mkfs.
#[test]
fn a_device_blkid_calls_blank_is_formatted_only_when_proven_blank_or_ours() {
    let d = || Double::default();
    let blank = || ProbeOutcome::Blank;
    for r in [
        row(
            "proven blank: formatted with a fresh UUID",
            blank(),
            None,
            Want::Format("fresh"),
        )
        .reads(&["size", "prove_blank", "fresh_uuid"]),
        row(
            "data in the windows: refused",
            blank(),
            None,
            Want::NotBlank("non-zero bytes"),
        )
        .device(Double {
            proof: Ok(Some("non-zero bytes at 4096")),
            ..d()
        })
        .reads(&["size", "prove_blank"]),
        row(
            "no proof possible: refused",
            blank(),
            None,
            Want::Unprovable,
        )
        .device(Double {
            proof: Err("/dev/double cannot be proven blank"),
            ..d()
        })
        .reads(&["size", "prove_blank"]),
        row("size 0: refused", blank(), None, Want::EmptyDevice)
            .device(Double {
                size: Some(0),
                ..d()
            })
            .reads(&["size"]),
        row(
            "size unreadable: an error",
            blank(),
            None,
            Want::Io("sizing /dev/double"),
        )
        .device(Double { size: None, ..d() })
        .reads(&["size"]),
        row(
            "done record, nothing on the device: the wrong device",
            blank(),
            done(OURS),
            Want::WrongDevice("now carries no filesystem"),
        ),
        row(
            "done record, read-only: still the wrong device",
            blank(),
            done(OURS),
            Want::WrongDevice("now carries no filesystem"),
        )
        .readonly(),
        row(
            "read-only, nothing to mount",
            blank(),
            None,
            Want::NothingToMount,
        )
        .readonly(),
        row(
            "read-only, licensed intent: not formatted",
            blank(),
            intent(OURS, Some(NOW)),
            Want::NothingToMount,
        )
        .readonly()
        .reads(&["attachment"]),
        row(
            "licensed intent, proven blank: formatted with its UUID",
            blank(),
            intent(OURS, Some(NOW)),
            Want::Format(OURS),
        )
        .reads(&["attachment", "size", "prove_blank"]),
        row(
            "stale intent, proven blank: formatted with the intent's UUID",
            blank(),
            intent(OURS, Some(BEFORE)),
            Want::Format(OURS),
        )
        .reads(&["attachment", "size", "prove_blank"]),
        row(
            "licensed intent, our superblock alone: mkfs redone",
            blank(),
            intent(OURS, Some(NOW)),
            Want::Format(OURS),
        )
        .device(Double {
            proof: Ok(Some("non-zero bytes")),
            found_at: 1024,
            carries: Some(OURS),
            ..d()
        })
        .reads(&[
            "attachment",
            "size",
            "prove_blank",
            "carries_uuid",
            "size",
            "prove_blank_past",
        ]),
        row(
            "licensed intent, our superblock and data past it: refused",
            blank(),
            intent(OURS, Some(NOW)),
            Want::NotBlank("an earlier mkfs of volume vol"),
        )
        .device(Double {
            proof: Ok(Some("non-zero bytes")),
            found_at: 1024,
            carries: Some(OURS),
            past_head: Some("written data"),
            ..d()
        })
        .reads(&[
            "attachment",
            "size",
            "prove_blank",
            "carries_uuid",
            "size",
            "prove_blank_past",
        ]),
        row(
            "licensed intent, our superblock, data found first past mkfs's first writes: refused",
            blank(),
            intent(OURS, Some(NOW)),
            Want::NotBlank("an earlier mkfs of volume vol"),
        )
        .device(Double {
            proof: Ok(Some("non-zero bytes")),
            carries: Some(OURS),
            ..d()
        })
        .reads(&["attachment", "size", "prove_blank"]),
        row(
            "licensed intent, data that is not ours: refused",
            blank(),
            intent(OURS, Some(NOW)),
            Want::NotBlank("an earlier mkfs of volume vol"),
        )
        .device(Double {
            proof: Ok(Some("non-zero bytes")),
            found_at: 1024,
            carries: Some(OTHER),
            ..d()
        })
        .reads(&["attachment", "size", "prove_blank", "carries_uuid"]),
        // The licence is the attachment, not the UUID: a stale intent never asks.
        row(
            "stale intent, our UUID on the device: refused, never asked",
            blank(),
            intent(OURS, Some(BEFORE)),
            Want::NotBlank("non-zero bytes"),
        )
        .device(Double {
            proof: Ok(Some("non-zero bytes")),
            carries: Some(OURS),
            ..d()
        })
        .reads(&["attachment", "size", "prove_blank"]),
        row(
            "intent without attachment, our UUID on the device: refused",
            blank(),
            intent(OURS, None),
            Want::NotBlank("non-zero bytes"),
        )
        .device(Double {
            proof: Ok(Some("non-zero bytes")),
            carries: Some(OURS),
            ..d()
        })
        .reads(&["size", "prove_blank"]),
    ] {
        check(r);
    }
}

/// An ext4 whose journal lies on another device writes to that device at mount: refused,
/// whatever the record says (a nineteenth fresh review's F2).
#[test]
fn a_filesystem_whose_journal_lies_on_another_device_is_never_mounted() {
    let with_journal = |uuid: &str| match fs_sig("ext4", uuid) {
        ProbeOutcome::Found(mut sig) => {
            sig.external_journal = Some("1b234682-e2af-4a52-82a1-9a44e5c5fece".into());
            ProbeOutcome::Found(sig)
        }
        other => other,
    };
    for r in [
        row(
            "no record",
            with_journal(OTHER),
            None,
            Want::NotBlank("journal lies on another device"),
        ),
        row(
            "ours, done",
            with_journal(OURS),
            done(OURS),
            Want::NotBlank("journal lies on another device"),
        ),
        row(
            "ours, read-only",
            with_journal(OURS),
            done(OURS),
            Want::NotBlank("journal UUID 1b234682"),
        )
        .readonly(),
    ] {
        check(r);
    }
}
