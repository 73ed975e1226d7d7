//! NodeUnstageVolume against the double: the steps of an unstage, the refusals while the volume
//! is in use (asked of the host, not the records), and a mount that is not the volume's left.

use super::*;
use crate::error::Error;

fn staged_record(h: &Harness) -> bool {
    h.ctx.ledger.staged(VOL).unwrap().is_some()
}

#[test]
fn an_unstage_unmounts_the_staging_path_then_deletes_the_record() {
    let h = Harness::new();
    h.staged(VOL);
    let before = h.journal(VOL).len();
    h.unstage(VOL).expect("unstage");
    assert_eq!(
        h.host.calls_after(),
        vec![(
            format!("unmount {VOL}"),
            Some("stage/staged:done".to_string())
        )]
    );
    assert_eq!(
        h.journal_from(VOL, before),
        strings(&[
            "unstage/unmount:intent",
            "unstage/unmount:done",
            "unstage/unstaged:done",
        ])
    );
    assert!(!staged_record(&h));
    assert_eq!(h.host.mounts_at(h.staging(VOL).as_path()), 0);
}

#[test]
fn a_volume_still_published_is_refused_and_nothing_is_unmounted() {
    let h = Harness::new();
    h.staged(VOL);
    h.published(VOL, "p1");
    let before = h.journal(VOL).len();
    let e = h.unstage(VOL).expect_err("refused");
    assert!(matches!(e, Error::StillPublished { .. }), "{e:?}");
    assert_eq!(h.host.calls(), strings(&[]));
    assert_eq!(h.journal_from(VOL, before), strings(&[]));
    assert_eq!(h.host.mounts_at(h.staging(VOL).as_path()), 1);
    assert!(staged_record(&h));
}

#[test]
fn a_publication_whose_bind_is_gone_does_not_block_the_unstage() {
    let h = Harness::new();
    h.staged(VOL);
    h.published(VOL, "p1");
    // The workload's bind went (a node reboot, say); only the record is left of it.
    h.host.state().mounts.remove(h.target("p1").as_path());
    h.unstage(VOL).expect("unstage");
    assert_eq!(h.host.calls(), vec![format!("unmount {VOL}")]);
    assert!(!staged_record(&h));
}

#[test]
fn a_foreign_mount_at_the_staging_path_is_refused_and_left() {
    let h = Harness::new();
    h.staged(VOL);
    let staging = h.staging(VOL);
    // It may cover the volume's own staging mount: unmounting either is not safe.
    h.host.foreign_mount(staging.as_path());
    let e = h.unstage(VOL).expect_err("refused");
    assert!(matches!(e, Error::CoveredMount { .. }), "{e:?}");
    assert_eq!(h.host.calls(), strings(&[]));
    assert_eq!(h.host.mounts_at(staging.as_path()), 2);
    assert!(staged_record(&h));
}

#[test]
fn a_device_still_held_by_an_unrecorded_mount_keeps_the_volume_staged() {
    let h = Harness::new();
    h.staged(VOL);
    let staging = h.staging(VOL);
    // A bind of the filesystem the agent has no record of: the kernel still claims the device.
    let elsewhere = h.dir.join("elsewhere");
    let dev = h.host.devnum(&h.backend.device_of(VOL));
    {
        let mut s = h.host.state();
        let facts = s.mounts[staging.as_path()].last().cloned().unwrap();
        s.mounts.insert(elsewhere.clone(), vec![facts]);
    }
    let e = h.unstage(VOL).expect_err("refused");
    assert!(matches!(e, Error::FilesystemInUse { .. }), "{e:?}");
    // The staging mount is gone (no workload notices); the record stays so the CO does not
    // detach a volume in use.
    assert_eq!(h.host.calls(), vec![format!("unmount {VOL}")]);
    assert_eq!(h.host.mounts_at(staging.as_path()), 0);
    assert!(staged_record(&h));

    // Once nothing else holds it, a retry forgets the staging.
    {
        let mut s = h.host.state();
        s.mounts.remove(&elsewhere);
        // Taken away by hand, not by the double's unmount, which would release the claim.
        s.claimed.remove(&dev);
    }
    h.unstage(VOL).expect("retry");
    assert!(!staged_record(&h));
}

#[test]
fn an_unstage_repeated_is_ok_and_calls_nothing() {
    let h = Harness::new();
    h.staged(VOL);
    h.unstage(VOL).expect("unstage");
    h.host.state().calls.clear();
    let before = h.journal(VOL).len();
    h.unstage(VOL).expect("repeat");
    assert_eq!(h.host.calls(), strings(&[]));
    assert_eq!(h.journal_from(VOL, before), strings(&[]));
}

#[test]
fn a_block_staging_is_forgotten_without_any_unmount() {
    let h = Harness::new();
    h.staged_block(VOL, AccessMode::SingleNodeWriter);
    let before = h.journal(VOL).len();
    h.unstage(VOL).expect("unstage");
    assert_eq!(h.host.calls(), strings(&[]));
    assert_eq!(
        h.journal_from(VOL, before),
        strings(&["unstage/unstaged:done"])
    );
    assert!(!staged_record(&h));
}

/// An unstage naming another volume's staging path leaves both volumes as they are and claims
/// no removal (a twelfth fresh review's F3: it answered "its staging mount was removed").
#[test]
fn an_unstage_at_another_volumes_staging_path_changes_nothing_and_says_nothing_was_removed() {
    let h = Harness::new();
    h.staged(VOL);
    h.attach("vol-other");
    stage_at(
        &h,
        "vol-other",
        "other",
        mount(AccessMode::SingleNodeWriter),
    )
    .expect("stage");
    h.host.state().calls.clear();
    crate::node::unstage(
        &h.ctx,
        &UnstageCommand {
            volume: VolumeId::parse(VOL).expect("id"),
            staging: h.path("staging_target_path", "staging/other"),
        },
    )
    .expect("nothing of the volume is at that path");
    assert_eq!(h.host.calls(), strings(&[]));
    assert!(staged_record(&h));
    assert_eq!(h.host.mounts_at(h.staging(VOL).as_path()), 1);
}

#[test]
fn a_failed_unmount_is_returned_and_the_volume_stays_staged() {
    let h = Harness::new();
    h.staged(VOL);
    h.host.state().fail.insert("unmount", "EBUSY".into());
    h.unstage(VOL).expect_err("the unmount fails");
    assert!(staged_record(&h));
    assert_eq!(h.host.mounts_at(h.staging(VOL).as_path()), 1);
    // The retry, once the unmount works, finishes it.
    h.host.state().fail.remove("unmount");
    h.unstage(VOL).expect("the retry");
    assert!(!staged_record(&h));
}

#[test]
fn an_unstage_after_a_crash_between_unmount_and_record_finishes_without_a_second_unmount() {
    let h = Harness::new();
    h.staged(VOL);
    // The crash: the mount went (and with it the device's last claim), the record stayed.
    {
        let mut s = h.host.state();
        for gone in s
            .mounts
            .remove(h.staging(VOL).as_path())
            .unwrap_or_default()
        {
            s.claimed.remove(&gone.dev);
        }
    }
    h.unstage(VOL).expect("the retry");
    assert!(!staged_record(&h));
    assert!(
        !h.host.calls().iter().any(|c| c.starts_with("unmount")),
        "{:?}",
        h.host.calls()
    );
}

#[test]
fn an_unstage_of_a_volume_never_staged_is_ok_and_calls_nothing() {
    let h = Harness::new();
    h.unstage("vol-never").expect("nothing to do");
    assert_eq!(h.host.calls(), Vec::<String>::new());
}

#[test]
fn an_unstage_voids_an_interrupted_format_so_the_device_is_free_again() {
    let h = Harness::new();
    h.attach(VOL);
    h.host.state().fail.insert("mkfs", "killed".into());
    h.stage(&h.stage_cmd(VOL, mount(AccessMode::SingleNodeWriter)))
        .expect_err("mkfs fails");
    h.host.state().fail.remove("mkfs");
    h.unstage(VOL).expect("unstage");
    assert!(
        h.ctx
            .ledger
            .format(VOL)
            .expect("read")
            .is_none_or(|f| f.state != crate::records::FormatState::Intent),
        "the format intent outlived the unstage"
    );
    // Another id may take the device now.
    stage_at(
        &h,
        &handle(VOL),
        "h",
        block(AccessMode::MultiNodeMultiWriter),
    )
    .expect("the device is free");
}
