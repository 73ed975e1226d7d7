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

mod blank;
mod found;
