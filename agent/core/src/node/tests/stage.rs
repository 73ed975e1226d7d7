//! NodeStageVolume against the double: the steps of a first stage, of a retry, of a stage that
//! finds a filesystem, and every refusal, each leaving the host as it was.

use super::*;
use crate::double::devices::signature;
use crate::double::host::GIB;
use crate::error::Error;
use crate::format::FormatError;
use crate::probe::ProbeOutcome;
use crate::seam::FsToolError;

const RWO: AccessMode = AccessMode::SingleNodeWriter;
const FIRST_STAGE: &[&str] = &[
    "stage/resolve_device:intent",
    "stage/resolve_device:done",
    "stage/verify_identity:intent",
    "stage/verify_identity:done",
    "stage/probe:intent",
    "stage/probe:done",
    "stage/format:intent",
    "stage/format:done",
    "stage/mount:intent",
    "stage/mount:done",
    "stage/recheck:intent",
    "stage/recheck:done",
    "stage/staged:done",
];

/// Puts an ext4 filesystem of `fs_bytes` on the volume's device, made elsewhere.
fn existing_ext4(h: &Harness, fs_bytes: u64) {
    let dev = h.host.devnum(&h.backend.device_of(VOL));
    let mut s = h.host.state();
    s.probes.insert(
        dev,
        ProbeOutcome::Found(signature(
            FsType::Ext4,
            "aaaaaaaa-0000-4000-8000-000000000000",
        )),
    );
    s.fs_bytes.insert(dev, fs_bytes);
}

#[test]
fn a_blank_device_is_formatted_then_mounted_each_after_its_durable_intent() {
    let h = Harness::new();
    h.attach(VOL);
    h.stage(&h.stage_cmd(VOL, mount(RWO))).expect("stage");
    assert_eq!(
        h.host.durable_before(),
        vec![
            (
                "mkfs ext4 dev-vol-a".to_string(),
                Some("stage/format:intent".to_string())
            ),
            (
                "mount ext4 dev-vol-a on vol-a".to_string(),
                Some("stage/mount:intent".to_string())
            ),
        ]
    );
    assert_eq!(h.journal(VOL), strings(FIRST_STAGE));
    let staged = h.ctx.ledger.staged(VOL).unwrap().expect("record");
    assert_eq!(staged.progress, crate::records::Progress::Complete);
    assert_eq!(staged.staging_path, h.staging(VOL).as_path());
    let format = h.ctx.ledger.format(VOL).unwrap().expect("format fact");
    assert_eq!(format.state, crate::records::FormatState::Done);
    assert_eq!(format.attachment.as_deref(), Some("boot-0-seq-1"));
}

#[test]
fn a_repeat_of_a_completed_stage_touches_nothing() {
    let h = Harness::new();
    h.staged(VOL);
    h.stage(&h.stage_cmd(VOL, mount(RWO))).expect("repeat");
    assert_eq!(h.host.calls(), Vec::<String>::new());
    assert_eq!(h.host.mounts_at(h.staging(VOL).as_path()), 1);
}

#[test]
fn a_filesystem_made_elsewhere_is_adopted_checked_and_mounted_never_formatted() {
    let h = Harness::new();
    h.attach(VOL);
    existing_ext4(&h, GIB);
    h.stage(&h.stage_cmd(VOL, mount(RWO))).expect("stage");
    assert_eq!(
        h.host.calls(),
        strings(&["fsck ext4 dev-vol-a", "mount ext4 dev-vol-a on vol-a"])
    );
    let calls = h.host.durable_before();
    assert_eq!(calls[1].1.as_deref(), Some("stage/mount:intent"));
    let format = h.ctx.ledger.format(VOL).unwrap().expect("adopted");
    assert_eq!(format.uuid, "aaaaaaaa-0000-4000-8000-000000000000");
    assert!(h.journal(VOL).contains(&"stage/check:done".to_string()));
}

#[test]
fn a_filesystem_smaller_than_its_device_is_grown_offline_before_the_mount() {
    let h = Harness::new();
    h.attach(VOL);
    existing_ext4(&h, GIB / 2);
    h.stage(&h.stage_cmd(VOL, mount(RWO))).expect("stage");
    assert_eq!(
        h.host.calls(),
        strings(&[
            "fsck ext4 dev-vol-a",
            "grow ext4 dev-vol-a offline",
            "mount ext4 dev-vol-a on vol-a"
        ])
    );
    assert!(h.journal(VOL).contains(&"stage/grow:done".to_string()));
}

#[test]
fn a_read_only_stage_neither_checks_nor_grows_and_mounts_read_only() {
    let h = Harness::new();
    h.attach(VOL);
    existing_ext4(&h, GIB / 2);
    h.stage(&h.stage_cmd(VOL, mount(AccessMode::SingleNodeReaderOnly)))
        .expect("stage");
    assert_eq!(
        h.host.calls(),
        strings(&["mount ext4 dev-vol-a on vol-a ro"])
    );
    assert!(h.ctx.ledger.staged(VOL).unwrap().expect("record").readonly);
}

#[test]
fn a_block_stage_mounts_nothing_and_records_the_device_durably() {
    let h = Harness::new();
    h.attach(VOL);
    h.stage(&h.stage_cmd(VOL, block(RWO))).expect("stage");
    assert_eq!(h.host.calls(), Vec::<String>::new());
    assert_eq!(
        h.journal(VOL),
        strings(&[
            "stage/resolve_device:intent",
            "stage/resolve_device:done",
            "stage/verify_identity:intent",
            "stage/verify_identity:done",
            "stage/staged:done",
        ])
    );
    let staged = h.ctx.ledger.staged(VOL).unwrap().expect("record");
    assert_eq!(staged.access, crate::records::AccessRecord::Block);
    assert_eq!(
        staged.devnum,
        Some(h.host.devnum(&h.backend.device_of(VOL)).into())
    );
}

/// What every refusal leaves: no host call, no staged record.
fn refused_untouched(h: &Harness, e: &Error, what: &str) {
    assert_eq!(h.host.calls(), Vec::<String>::new(), "{what}: {e}");
    assert_eq!(h.host.mounts_at(h.staging(VOL).as_path()), 0, "{what}: {e}");
    assert!(
        h.ctx.ledger.staged(VOL).unwrap().is_none(),
        "{what}: a record stayed: {e}"
    );
}

#[test]
fn a_device_with_data_and_no_record_is_refused_untouched() {
    let h = Harness::new();
    let dev = h.attach(VOL);
    let devnum = h.host.devnum(&dev);
    h.host.state().not_blank.insert(devnum);
    let e = h.stage(&h.stage_cmd(VOL, mount(RWO))).unwrap_err();
    assert!(
        matches!(e, Error::Format(FormatError::NotBlank { .. })),
        "{e:?}"
    );
    refused_untouched(&h, &e, "not blank");
    assert!(h.ctx.ledger.format(VOL).unwrap().is_none());
}

#[test]
fn another_filesystem_on_the_device_is_refused_untouched() {
    let h = Harness::new();
    let dev = h.attach(VOL);
    let devnum = h.host.devnum(&dev);
    h.host.state().probes.insert(
        devnum,
        ProbeOutcome::Found(signature(
            FsType::Xfs,
            "bbbbbbbb-0000-4000-8000-000000000000",
        )),
    );
    let e = h.stage(&h.stage_cmd(VOL, mount(RWO))).unwrap_err();
    assert!(matches!(e, Error::Format(_)), "{e:?}");
    refused_untouched(&h, &e, "xfs found, ext4 asked");
}

/// The refusals that come before any device is held: (what, setup, the error expected).
#[test]
fn refusals_before_the_device_is_touched() {
    type Setup = fn(&Harness) -> StageCommand;
    type Expected = fn(&Error) -> bool;
    let cases: &[(&str, Setup, Expected)] = &[
        (
            "not attached",
            |h| h.stage_cmd(VOL, mount(RWO)),
            |e| matches!(e, Error::DeviceNotAttached { .. }),
        ),
        (
            "tools missing",
            |h| {
                h.attach(VOL);
                h.host.fail("supported", "mkfs.ext4 is not installed");
                h.stage_cmd(VOL, mount(RWO))
            },
            |e| matches!(e, Error::FsTool(FsToolError::Unavailable { .. })),
        ),
        (
            "the device is now another volume's",
            |h| {
                let dev = h.attach(VOL);
                let devnum = h.host.devnum(&dev);
                h.backend
                    .moved
                    .lock()
                    .unwrap()
                    .insert(devnum, "vol-b".into());
                h.stage_cmd(VOL, mount(RWO))
            },
            |e| matches!(e, Error::WrongDevice { .. }),
        ),
        (
            "another volume's call holds the device",
            |h| {
                let dev = h.attach(VOL);
                let devnum = h.host.devnum(&dev);
                std::mem::forget(h.ctx.device_locks.try_lock(&devnum.to_string()));
                h.stage_cmd(VOL, mount(RWO))
            },
            |e| matches!(e, Error::DeviceBusy { .. }),
        ),
        (
            "something else claims the device",
            |h| {
                let dev = h.attach(VOL);
                let devnum = h.host.devnum(&dev);
                h.host.state().claimed.insert(devnum);
                h.stage_cmd(VOL, mount(RWO))
            },
            |e| matches!(e, Error::DeviceInUse { .. }),
        ),
        (
            "a foreign mount at the staging path",
            |h| {
                h.attach(VOL);
                h.host.foreign_mount(h.staging(VOL).as_path());
                h.stage_cmd(VOL, mount(RWO))
            },
            |e| matches!(e, Error::ForeignMount { .. }),
        ),
    ];
    for (what, setup, expected) in cases {
        let h = Harness::new();
        let cmd = setup(&h);
        let before = h.host.mounts_at(h.staging(VOL).as_path());
        let e = h.stage(&cmd).unwrap_err();
        assert!(expected(&e), "{what}: {e:?}");
        assert_eq!(h.host.calls(), Vec::<String>::new(), "{what}: {e}");
        assert_eq!(h.host.mounts_at(h.staging(VOL).as_path()), before, "{what}");
        assert!(h.ctx.ledger.staged(VOL).unwrap().is_none(), "{what}: {e}");
        assert!(h.ctx.ledger.format(VOL).unwrap().is_none(), "{what}: {e}");
    }
}

#[test]
fn a_volume_staged_elsewhere_or_otherwise_is_refused_and_left_staged() {
    let h = Harness::new();
    h.staged(VOL);
    let mut elsewhere = h.stage_cmd(VOL, mount(RWO));
    elsewhere.staging = h.path("staging_target_path", "other/vol-a");
    let e = h.stage(&elsewhere).unwrap_err();
    assert!(matches!(e, Error::AlreadyStagedAt { .. }), "{e:?}");
    let e = h.stage(&h.stage_cmd(VOL, block(RWO))).unwrap_err();
    assert!(
        matches!(e, Error::StagedWithOtherCapability { .. }),
        "{e:?}"
    );
    let e = h
        .stage(&h.stage_cmd(VOL, mount(AccessMode::MultiNodeReaderOnly)))
        .unwrap_err();
    assert!(
        matches!(e, Error::StagedWithOtherCapability { .. }),
        "{e:?}"
    );
    assert_eq!(h.host.calls(), Vec::<String>::new());
    assert_eq!(h.host.mounts_at(h.staging(VOL).as_path()), 1);
}

#[test]
fn a_failed_mount_forgets_the_stage_so_a_corrected_retry_is_not_held_to_it() {
    let h = Harness::new();
    h.attach(VOL);
    h.host.fail("mount", "wrong fs type, bad option");
    let e = h.stage(&h.stage_cmd(VOL, mount(RWO))).unwrap_err();
    assert!(matches!(e, Error::Io { .. }), "{e:?}");
    assert!(h.ctx.ledger.staged(VOL).unwrap().is_none());
    assert!(h.journal(VOL).contains(&"stage/mount:failed".to_string()));
    // Corrected: another staging path; the filesystem made before is used, not made again.
    h.host.state().fail.clear();
    h.host.state().calls.clear();
    let mut other = h.stage_cmd(VOL, mount(RWO));
    other.staging = h.path("staging_target_path", "other/vol-a");
    h.stage(&other).expect("retry");
    assert_eq!(
        h.host.calls(),
        strings(&["fsck ext4 dev-vol-a", "mount ext4 dev-vol-a on vol-a"])
    );
}

#[test]
fn a_failed_mkfs_is_journaled_and_nothing_is_mounted() {
    let h = Harness::new();
    h.attach(VOL);
    h.host.fail("mkfs", "mkfs.ext4 exited 1");
    let e = h.stage(&h.stage_cmd(VOL, mount(RWO))).unwrap_err();
    assert!(matches!(e, Error::FsTool(_)), "{e:?}");
    assert_eq!(h.host.calls(), strings(&["mkfs ext4 dev-vol-a"]));
    assert_eq!(h.host.mounts_at(h.staging(VOL).as_path()), 0);
    let journal = h.journal(VOL);
    assert_eq!(
        journal[journal.len() - 2..].to_vec(),
        strings(&["stage/format:intent", "stage/format:failed"])
    );
}

#[test]
fn a_failed_check_mounts_nothing() {
    let h = Harness::new();
    h.attach(VOL);
    existing_ext4(&h, GIB);
    h.host.fail("fsck", "e2fsck exited 4");
    let e = h.stage(&h.stage_cmd(VOL, mount(RWO))).unwrap_err();
    assert!(matches!(e, Error::FsTool(_)), "{e:?}");
    assert_eq!(h.host.calls(), strings(&["fsck ext4 dev-vol-a"]));
    assert_eq!(h.host.mounts_at(h.staging(VOL).as_path()), 0);
    assert!(h.journal(VOL).contains(&"stage/check:failed".to_string()));
}

#[test]
fn a_staging_mount_that_is_not_the_volumes_once_mounted_is_never_grown() {
    let h = Harness::new();
    h.attach(VOL);
    let dev = h.host.devnum(&h.backend.device_of(VOL));
    {
        let mut s = h.host.state();
        let uuid = "bbbbbbbb-0000-4000-8000-000000000000";
        s.probes
            .insert(dev, ProbeOutcome::Found(signature(FsType::Xfs, uuid)));
        s.fs_bytes.insert(dev, GIB / 2);
    }
    // xfs grows only mounted, through the staging mount's root held open and proven first.
    h.host
        .fail("mount_lands_foreign", "another mount raced in over ours");
    let cmd = h.stage_cmd(VOL, mount_with(FsType::Xfs, &[], RWO));
    let e = h.stage(&cmd).unwrap_err();
    assert!(matches!(e, Error::StagingChanged { .. }), "{e:?}");
    let calls = h.host.calls();
    assert!(!calls.iter().any(|c| c.starts_with("grow")), "{calls:?}");
}

#[test]
fn a_blank_device_asked_as_xfs_is_made_xfs() {
    let h = Harness::new();
    h.attach(VOL);
    h.stage(&h.stage_cmd(VOL, mount_with(FsType::Xfs, &[], RWO)))
        .expect("stage");
    let calls = h.host.calls();
    assert!(
        calls.contains(&"mkfs xfs dev-vol-a".to_string()),
        "{calls:?}"
    );
    assert!(
        calls
            .iter()
            .any(|c| c.starts_with("mount xfs dev-vol-a on vol-a")),
        "{calls:?}"
    );
}

#[test]
fn mount_flags_asked_reach_the_mount() {
    let h = Harness::new();
    h.attach(VOL);
    h.stage(&h.stage_cmd(VOL, mount_with(FsType::Ext4, &["discard"], RWO)))
        .expect("stage");
    let calls = h.host.calls();
    assert!(
        calls
            .iter()
            .any(|c| c.starts_with("mount ext4 dev-vol-a on vol-a") && c.contains("discard")),
        "{calls:?}"
    );
}

#[test]
fn a_second_volume_at_a_staged_volumes_path_is_refused_untouched() {
    let h = Harness::new();
    h.staged(VOL);
    h.attach("vol-b");
    let mut cmd = h.stage_cmd("vol-b", mount(RWO));
    cmd.staging = h.staging(VOL);
    let lines = h.journal("vol-b").len();
    h.stage(&cmd).expect_err("another volume's staging path");
    h.assert_nothing_done("vol-b", lines);
    assert_eq!(h.host.mounts_at(h.staging(VOL).as_path()), 1);
}

#[test]
fn a_stage_whose_device_cannot_be_found_changes_nothing() {
    let h = Harness::new();
    // vol-x was never attached: the backend finds no device.
    let e = h
        .stage(&h.stage_cmd("vol-x", mount(RWO)))
        .expect_err("no device");
    assert!(
        matches!(e, crate::error::Error::DeviceNotAttached { .. }),
        "{e:?}"
    );
    assert_eq!(h.host.calls(), Vec::<String>::new());
    assert!(h.ctx.ledger.staged("vol-x").expect("read").is_none());
}
