//! NodeUnpublishVolume against the double: the steps of an unpublish, the idempotent repeat, the
//! volume's stacked binds taken down, and a mount that is not the volume's left alone.

use super::*;
use crate::error::Error;
use std::path::Path;

/// Stacks `n` more copies of the top-most mount at `path`, as crashed earlier calls may leave.
fn stack(h: &Harness, path: &Path, n: usize) {
    let mut s = h.host.state();
    let mounts = s.mounts.get_mut(path).expect("a mount to stack");
    let top = mounts.last().cloned().expect("a mount to stack");
    mounts.extend(std::iter::repeat_n(top, n));
}

fn recorded(h: &Harness, target: &str) -> bool {
    let target = h.target(target);
    h.ctx
        .ledger
        .publication(VOL, target.as_path())
        .unwrap()
        .is_some()
}

#[test]
fn an_unpublish_unmounts_then_deletes_the_record() {
    let h = Harness::new();
    h.staged(VOL);
    h.published(VOL, "p1");
    let before = h.journal(VOL).len();
    h.unpublish(VOL, "p1").expect("unpublish");
    // The unmount's intent is lazy: nothing resumes from it, the host says after a crash.
    assert_eq!(
        h.host.calls_after(),
        vec![(
            "unmount mount".to_string(),
            Some("publish/published:done".to_string())
        )]
    );
    assert_eq!(
        h.journal_from(VOL, before),
        strings(&[
            "unpublish/unmount:intent",
            "unpublish/unmount:done",
            "unpublish/unpublished:done",
        ])
    );
    assert!(!recorded(&h, "p1"));
    let target = h.target("p1");
    assert_eq!(h.host.mounts_at(target.as_path()), 0);
    assert!(
        !target.as_path().exists(),
        "the target publish made is gone"
    );
    // The staging mount is not the unpublish's business.
    assert_eq!(h.host.mounts_at(h.staging(VOL).as_path()), 1);
}

#[test]
fn an_unpublish_with_nothing_recorded_and_nothing_mounted_is_ok_and_calls_nothing() {
    // (published first, so the repeat follows a real unpublish; or never published at all)
    for published_first in [true, false] {
        let h = Harness::new();
        h.staged(VOL);
        if published_first {
            h.published(VOL, "p1");
            h.unpublish(VOL, "p1").expect("first unpublish");
            h.host.state().calls.clear();
        }
        let before = h.journal(VOL).len();
        h.unpublish(VOL, "p1").expect("repeat");
        assert_eq!(h.host.calls(), strings(&[]), "{published_first}");
        assert_eq!(h.journal_from(VOL, before), strings(&[]));
    }
}

#[test]
fn a_foreign_mount_over_a_recorded_target_is_refused_and_left() {
    let h = Harness::new();
    h.staged(VOL);
    h.published(VOL, "p1");
    let target = h.target("p1");
    // The volume's bind may lie beneath it: unmounting either is not safe.
    h.host.foreign_mount(target.as_path());
    let e = h.unpublish(VOL, "p1").expect_err("refused");
    assert!(matches!(e, Error::CoveredMount { .. }), "{e:?}");
    assert_eq!(h.host.calls(), strings(&[]));
    assert_eq!(h.host.mounts_at(target.as_path()), 2);
    assert!(recorded(&h, "p1"));
}

#[test]
fn a_foreign_mount_at_an_unrecorded_target_is_left_alone() {
    let h = Harness::new();
    h.staged(VOL);
    let target = h.target("p1");
    std::fs::create_dir_all(target.as_path()).unwrap();
    h.host.foreign_mount(target.as_path());
    h.unpublish(VOL, "p1")
        .expect("nothing of the volume is there");
    assert_eq!(h.host.calls(), strings(&[]));
    assert_eq!(h.host.mounts_at(target.as_path()), 1);
    assert!(target.as_path().is_dir(), "not the agent's to remove");
}

#[test]
fn stacked_binds_of_the_volume_are_all_unmounted() {
    let h = Harness::new();
    h.staged(VOL);
    h.published(VOL, "p1");
    let target = h.target("p1");
    stack(&h, target.as_path(), 1);
    h.unpublish(VOL, "p1").expect("unpublish");
    assert_eq!(h.host.calls(), strings(&["unmount mount", "unmount mount"]));
    assert_eq!(h.host.mounts_at(target.as_path()), 0);
    assert!(!recorded(&h, "p1"));
}

#[test]
fn more_than_eight_stacked_binds_are_refused_as_still_mounted() {
    let h = Harness::new();
    h.staged(VOL);
    h.published(VOL, "p1");
    let target = h.target("p1");
    stack(&h, target.as_path(), 8);
    let e = h.unpublish(VOL, "p1").expect_err("refused");
    assert!(matches!(e, Error::StillMounted { .. }), "{e:?}");
    assert_eq!(h.host.calls(), vec!["unmount mount".to_string(); 8]);
    assert_eq!(h.host.mounts_at(target.as_path()), 1);
    assert!(recorded(&h, "p1"), "the record stays while a bind does");
}

#[test]
fn exactly_eight_stacked_binds_are_all_unmounted() {
    let h = Harness::new();
    h.staged(VOL);
    h.published(VOL, "p1");
    let target = h.target("p1");
    stack(&h, target.as_path(), 7);
    // The host is asked once more after the eighth unmount: all taken down is a success.
    h.unpublish(VOL, "p1").expect("unpublish");
    assert_eq!(h.host.calls(), vec!["unmount mount".to_string(); 8]);
    assert_eq!(h.host.mounts_at(target.as_path()), 0);
    assert!(!recorded(&h, "p1"));
}

#[test]
fn a_read_only_block_publication_loses_its_read_only_device_after_the_unmount() {
    let h = Harness::new();
    h.staged_block(VOL, AccessMode::SingleNodeWriter);
    let mut cmd = h.publish_cmd(VOL, "p1", block(AccessMode::SingleNodeWriter));
    cmd.readonly = true;
    h.publish(&cmd).expect("publish");
    h.host.state().calls.clear();
    let before = h.journal(VOL).len();
    h.unpublish(VOL, "p1").expect("unpublish");
    assert_eq!(
        h.host.calls(),
        strings(&["unmount mount", "remove read-only"])
    );
    assert_eq!(
        h.journal_from(VOL, before),
        strings(&[
            "unpublish/unmount:intent",
            "unpublish/unmount:done",
            "unpublish/detach_ro_device:intent",
            "unpublish/detach_ro_device:done",
            "unpublish/unpublished:done",
        ])
    );
    assert!(h.host.state().read_only.is_empty());
    assert!(!h.target("p1").as_path().exists(), "the file publish made");
}

#[test]
fn a_failed_unmount_is_returned_and_the_record_stays() {
    let h = Harness::new();
    h.staged(VOL);
    h.published(VOL, "p1");
    let before = h.journal(VOL).len();
    h.host.fail("unmount", "EBUSY");
    let e = h.unpublish(VOL, "p1").expect_err("unmount fails");
    assert!(matches!(e, Error::Io { .. }), "{e:?}");
    assert_eq!(
        h.journal_from(VOL, before),
        strings(&["unpublish/unmount:intent", "unpublish/unmount:failed"])
    );
    assert!(recorded(&h, "p1"));
    assert_eq!(h.host.mounts_at(h.target("p1").as_path()), 1);
}

#[test]
fn an_unpublish_at_another_volumes_target_changes_nothing() {
    let h = Harness::new();
    h.staged(VOL);
    h.staged("vol-b");
    h.published("vol-b", "pod-b");
    let lines = h.journal("vol-b").len();
    // vol-a's id with vol-b's target: never vol-b's mount taken away.
    let _ = h.unpublish(VOL, "pod-b");
    assert_eq!(h.host.mounts_at(h.target("pod-b").as_path()), 1);
    assert_eq!(h.journal_from("vol-b", lines), Vec::<String>::new());
    assert!(
        !h.host.calls().iter().any(|c| c.starts_with("unmount")),
        "{:?}",
        h.host.calls()
    );
}

#[test]
fn a_block_unpublish_unmounts_and_removes_the_file_it_bound_onto() {
    let h = Harness::new();
    h.staged_block(VOL, AccessMode::SingleNodeWriter);
    h.publish(&h.publish_cmd(VOL, "pod", block(AccessMode::SingleNodeWriter)))
        .expect("publish");
    h.host.state().calls.clear();
    h.unpublish(VOL, "pod").expect("unpublish");
    assert_eq!(h.host.calls(), vec!["unmount mount".to_string()]);
    assert!(
        !h.target("pod").as_path().exists(),
        "the target file stayed"
    );
}

#[test]
fn a_read_only_mount_publication_is_unmounted_and_forgotten() {
    let h = Harness::new();
    h.staged(VOL);
    let mut cmd = h.publish_cmd(VOL, "pod", mount(AccessMode::SingleNodeWriter));
    cmd.readonly = true;
    h.publish(&cmd).expect("publish read-only");
    h.host.state().calls.clear();
    h.unpublish(VOL, "pod").expect("unpublish");
    assert_eq!(h.host.calls(), vec!["unmount mount".to_string()]);
    let target = h.target("pod").as_path().to_path_buf();
    assert!(
        h.ctx
            .ledger
            .publication(VOL, &target)
            .expect("read")
            .is_none()
    );
}

#[test]
fn an_unpublish_leaves_the_staging_mount_and_its_record() {
    let h = Harness::new();
    h.staged(VOL);
    h.published(VOL, "pod-1");
    h.unpublish(VOL, "pod-1").expect("unpublish");
    assert_eq!(h.host.mounts_at(h.staging(VOL).as_path()), 1);
    assert!(h.ctx.ledger.staged(VOL).expect("read").is_some());
}
