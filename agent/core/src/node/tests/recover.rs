//! Start-up recovery of one volume over the double: for each state a crash or a reboot can
//! leave (a record whose step the host shows done, one whose mount is gone, one half done), what
//! the check keeps, completes or drops, and that it never touches the host. Root tests: the
//! crash matrix and `power_loss`.

use super::*;
use crate::error::Error;
use crate::ledger::{Changes, Ledger};
use crate::node::recover::{VolumeReport, recover_volume};
use crate::records::{Durability, Progress};

fn write(h: &Harness, change: Changes) {
    h.ledger
        .write(Durability::Immediate, change)
        .expect("write");
}

fn stage_in_progress(h: &Harness) {
    let mut s = h.ledger.staged(VOL).expect("read").expect("staged");
    s.progress = Progress::InProgress;
    write(h, Box::new(move |w| w.put_staged(&s)));
}

fn publication_in_progress(h: &Harness) {
    let target = h.target("pod").as_path().to_path_buf();
    let mut p = h
        .ledger
        .publication(VOL, &target)
        .expect("read")
        .expect("published");
    p.progress = Progress::InProgress;
    write(h, Box::new(move |w| w.put_publication(&p)));
}

/// The mount at `path` is gone behind the agent's back (a reboot, an operator).
fn unmount(h: &Harness, path: RequestPath) {
    let mut s = h.host.state();
    for gone in s.mounts.remove(path.as_path()).unwrap_or_default() {
        if !s.mounts.values().flatten().any(|m| m.dev == gone.dev) {
            s.claimed.remove(&gone.dev);
        }
    }
}

fn cover(h: &Harness, path: RequestPath) {
    let foreign = crate::double::host::mount_facts(crate::DevNum::new(8, 42), "ext4", false);
    let at = path.as_path().to_path_buf();
    h.host.state().mounts.insert(at, vec![foreign]);
}

/// What the records say after the check: (staged progress, publication progress).
fn records(h: &Harness) -> (Option<Progress>, Option<Progress>) {
    let target = h.target("pod").as_path().to_path_buf();
    (
        h.ledger.staged(VOL).expect("read").map(|s| s.progress),
        h.ledger
            .publication(VOL, &target)
            .expect("read")
            .map(|p| p.progress),
    )
}

#[test]
fn each_state_a_crash_or_a_reboot_leaves_is_kept_completed_or_dropped() {
    use Progress::{Complete as Done, InProgress as Half};
    type Leave = fn(&Harness);
    let report = |dropped_staging, dropped_publications, completed| VolumeReport {
        dropped_staging,
        dropped_publications,
        completed,
    };
    type Case = (
        &'static str,
        Leave,
        (Option<Progress>, Option<Progress>),
        VolumeReport,
    );
    let cases: Vec<Case> = vec![
        (
            "as recorded",
            |_| {},
            (Some(Done), Some(Done)),
            report(false, 0, 0),
        ),
        (
            "a reboot took every mount",
            |h| {
                unmount(h, h.target("pod"));
                unmount(h, h.staging(VOL));
            },
            (None, None),
            report(true, 1, 0),
        ),
        (
            "the stage mounted, its completion was lost",
            stage_in_progress,
            (Some(Done), Some(Done)),
            report(false, 0, 1),
        ),
        (
            "the stage was cut before its mount",
            |h| {
                stage_in_progress(h);
                unmount(h, h.staging(VOL));
            },
            (Some(Half), Some(Done)),
            report(false, 0, 0),
        ),
        (
            "the bind is there, its completion was lost",
            publication_in_progress,
            (Some(Done), Some(Done)),
            report(false, 0, 1),
        ),
        (
            "the publication's mount is gone",
            |h| unmount(h, h.target("pod")),
            (Some(Done), None),
            report(false, 1, 0),
        ),
        (
            "something else is mounted at the target",
            |h| cover(h, h.target("pod")),
            (Some(Done), Some(Done)),
            report(false, 0, 0),
        ),
    ];
    for (what, leave, after, expected) in cases {
        let h = Harness::new();
        h.staged(VOL);
        h.published(VOL, "pod");
        leave(&h);
        let r = recover_volume(&h.ctx, VOL).expect(what);
        assert_eq!(
            (r.dropped_staging, r.dropped_publications, r.completed),
            (
                expected.dropped_staging,
                expected.dropped_publications,
                expected.completed
            ),
            "{what}"
        );
        assert_eq!(records(&h), after, "{what}");
        assert_eq!(
            h.host.calls(),
            Vec::<String>::new(),
            "{what}: recovery touched the host"
        );
    }
}

#[test]
fn a_block_volume_is_kept_while_its_device_is_the_volume_and_dropped_once_gone() {
    let h = Harness::new();
    h.staged_block(VOL, AccessMode::SingleNodeWriter);
    let r = recover_volume(&h.ctx, VOL).expect("recover");
    assert!(!r.dropped_staging && h.ledger.staged(VOL).expect("read").is_some());
    // The device is gone (detached, or another disk took its name).
    let dev = h.dir.join("dev").join(format!("dev-{VOL}"));
    h.host.state().devices.remove(&dev);
    let r = recover_volume(&h.ctx, VOL).expect("recover");
    assert!(r.dropped_staging, "{r:?}");
    assert_eq!(
        h.ledger.staged(VOL).expect("read").map(|s| s.volume_id),
        None
    );
    assert_eq!(h.host.calls(), Vec::<String>::new());
}

#[test]
fn a_dropped_staging_frees_its_path_for_the_next_stage() {
    let h = Harness::new();
    h.staged(VOL);
    unmount(&h, h.staging(VOL));
    recover_volume(&h.ctx, VOL).expect("recover");
    // The path's claim went with the record: the retried stage mounts again.
    h.stage(&h.stage_cmd(VOL, mount(AccessMode::SingleNodeWriter)))
        .expect("the retried stage");
    let calls = h.host.calls();
    assert!(
        calls.iter().any(|c| c.starts_with("mount ext4 dev-vol-a")),
        "{calls:?}"
    );
}

#[test]
fn a_volume_with_no_records_is_a_no_op() {
    let h = Harness::new();
    let r = recover_volume(&h.ctx, "vol-x").expect("recover");
    assert_eq!(
        (r.dropped_staging, r.dropped_publications, r.completed),
        (false, 0, 0)
    );
    assert_eq!(h.host.calls(), Vec::<String>::new());
}

#[test]
fn a_block_publish_cut_before_its_bind_is_kept_for_the_retry() {
    let h = Harness::new();
    h.staged_block(VOL, AccessMode::SingleNodeWriter);
    h.publish(&h.publish_cmd(VOL, "pod", block(AccessMode::SingleNodeWriter)))
        .expect("publish");
    publication_in_progress(&h);
    unmount(&h, h.target("pod"));
    let r = recover_volume(&h.ctx, VOL).expect("recover");
    assert_eq!(r.dropped_publications, 0, "{r:?}");
    assert_eq!(
        records(&h),
        (Some(Progress::Complete), Some(Progress::InProgress))
    );
    // The retry finishes it.
    h.publish(&h.publish_cmd(VOL, "pod", block(AccessMode::SingleNodeWriter)))
        .expect("the retried publish");
    assert_eq!(records(&h).1, Some(Progress::Complete));
}

#[test]
fn recovery_twice_changes_nothing_the_second_time() {
    let h = Harness::new();
    h.staged(VOL);
    h.published(VOL, "pod");
    publication_in_progress(&h);
    let first = recover_volume(&h.ctx, VOL).expect("recover");
    assert_eq!(first.completed, 1);
    h.host.state().calls.clear();
    let lines = h.journal(VOL).len();
    let again = recover_volume(&h.ctx, VOL).expect("again");
    assert_eq!(
        (again.completed, again.dropped_publications),
        (0, 0),
        "{again:?}"
    );
    assert!(!again.dropped_staging);
    h.assert_nothing_done(VOL, lines);
}

#[test]
fn a_recovered_volume_holds_its_device_against_another_id() {
    let mut h = Harness::new();
    h.staged(VOL);
    // A restart: every claim in memory is gone; recovery takes the volume's device again.
    h.restart(std::sync::Arc::new(crate::node::Unobserved));
    recover_volume(&h.ctx, VOL).expect("recover");
    let e = stage_at(
        &h,
        &handle(VOL),
        "h",
        mount(AccessMode::MultiNodeMultiWriter),
    )
    .expect_err("a handle on the recovered volume's device");
    assert!(
        matches!(
            e,
            crate::error::Error::DeviceClaimed { .. } | crate::error::Error::DeviceInUse { .. }
        ),
        "{e:?}"
    );
}

#[test]
fn a_block_staging_whose_device_is_another_volumes_now_is_dropped() {
    let h = Harness::new();
    h.staged_block(VOL, AccessMode::SingleNodeWriter);
    // The device's name now answers as another volume (a detach and another attach).
    let d = h.host.devnum(&h.dir.join("dev").join(format!("dev-{VOL}")));
    h.backend
        .moved
        .lock()
        .expect("moved")
        .insert(d, "vol-other".into());
    let r = recover_volume(&h.ctx, VOL).expect("recover");
    assert!(r.dropped_staging, "{r:?}");
    assert_eq!(h.host.calls(), Vec::<String>::new());
}

#[test]
fn only_the_volumes_own_records_are_touched() {
    let h = Harness::new();
    h.staged(VOL);
    h.staged("vol-b");
    h.published("vol-b", "pod-b");
    unmount(&h, h.staging(VOL));
    let before = h
        .ledger
        .publication("vol-b", h.target("pod-b").as_path())
        .expect("read");
    recover_volume(&h.ctx, VOL).expect("recover");
    assert!(h.ledger.staged("vol-b").expect("read").is_some());
    let after = h
        .ledger
        .publication("vol-b", h.target("pod-b").as_path())
        .expect("read");
    assert_eq!(before, after);
}

#[test]
fn a_stage_completed_by_recovery_is_a_no_op_to_its_retry() {
    let h = Harness::new();
    h.staged(VOL);
    stage_in_progress(&h);
    recover_volume(&h.ctx, VOL).expect("recover");
    h.host.state().calls.clear();
    h.stage(&h.stage_cmd(VOL, mount(AccessMode::SingleNodeWriter)))
        .expect("the retry");
    assert_eq!(h.host.calls(), Vec::<String>::new());
}

#[test]
fn a_publication_dropped_by_recovery_is_bound_again_by_its_retry() {
    let h = Harness::new();
    h.staged(VOL);
    h.published(VOL, "pod");
    unmount(&h, h.target("pod"));
    recover_volume(&h.ctx, VOL).expect("recover");
    h.published(VOL, "pod");
    assert_eq!(h.host.mounts_at(h.target("pod").as_path()), 1);
}

#[test]
fn a_stage_cut_before_its_mount_with_no_publication_is_dropped_and_frees_its_device() {
    let h = Harness::new();
    h.staged(VOL);
    stage_in_progress(&h);
    unmount(&h, h.staging(VOL));
    let r = recover_volume(&h.ctx, VOL).expect("recover");
    assert!(r.dropped_staging, "{r:?}");
    assert_eq!(records(&h), (None, None));
    assert_eq!(h.host.calls(), Vec::<String>::new());
    // Nothing holds the device now: a handle naming it is taken (the volume let go).
    h.stage(&h.stage_cmd(VOL, mount(AccessMode::SingleNodeWriter)))
        .expect("the retried stage starts afresh");
}

/// A crash between a filesystem stage's mount and its post-mount questions, with the device's
/// node bound elsewhere meanwhile: recovery asks them before it completes the record, and
/// unstages the mount instead (a fifty-sixth fresh review's F1: it completed the record, and a
/// publish handed the device out).
#[test]
fn an_interrupted_stage_whose_device_is_bound_elsewhere_is_unstaged_not_completed() {
    let h = Harness::new();
    h.staged(VOL);
    stage_in_progress(&h);
    h.bind_node_elsewhere(VOL);
    let r = recover_volume(&h.ctx, VOL).expect("recover");
    assert!(r.dropped_staging && r.completed == 0, "{r:?}");
    assert_eq!(records(&h), (None, None));
    assert_eq!(h.host.mounts_at(h.staging(VOL).as_path()), 0);
    assert_eq!(h.host.calls(), vec![format!("unmount {VOL}")]);
    assert!(
        h.journal(VOL)
            .contains(&"unstage/unstaged:done".to_string())
    );
    let publish = h.publish_cmd(VOL, "pod", mount(AccessMode::SingleNodeWriter));
    let e = h.publish(&publish).expect_err("published");
    assert!(matches!(e, Error::NotStaged { .. }), "{e}");
    let stage = h.stage_cmd(VOL, mount(AccessMode::SingleNodeWriter));
    let e = h.stage(&stage).expect_err("staged under the bind");
    assert!(matches!(e, Error::DeviceStillBound { .. }), "{e}");
    assert_eq!(h.host.mounts_at(h.staging(VOL).as_path()), 0);
    // The bind gone, the stage goes through.
    h.host.state().mounts.remove(&h.dir.join("elsewhere"));
    h.stage(&stage).expect("the stage once the bind is gone");
    h.publish(&publish).expect("publish");
}

/// The same, when the mount cannot be taken down: the record stays in progress, a publish asks
/// again and refuses, and the unstage takes it down later.
#[test]
fn an_interrupted_stage_it_cannot_take_down_stays_in_progress_and_unpublishable() {
    let h = Harness::new();
    h.staged(VOL);
    stage_in_progress(&h);
    h.bind_node_elsewhere(VOL);
    h.host.state().fail.insert("unmount", "EBUSY".into());
    let r = recover_volume(&h.ctx, VOL).expect("recover");
    assert!(!r.dropped_staging && r.completed == 0, "{r:?}");
    assert_eq!(records(&h), (Some(Progress::InProgress), None));
    let publish = h.publish_cmd(VOL, "pod", mount(AccessMode::SingleNodeWriter));
    let e = h.publish(&publish).expect_err("published");
    assert!(matches!(e, Error::DeviceStillBound { .. }), "{e}");
    h.host.state().fail.clear();
    h.unstage(VOL).expect("unstage");
    assert_eq!(records(&h), (None, None));
    assert_eq!(h.host.mounts_at(h.staging(VOL).as_path()), 0);
}

/// A stage whose mount a mount laid over its staging path hides, complete or cut after its
/// mount: its device is still mounted, so its record is kept as it was, never dropped as gone with
/// a reboot or as a stage cut before its mount (a sixty-third fresh review's F2 and a
/// sixty-fifth's F3: the unstage then answered OK over the hidden mount). Nothing is touched.
#[test]
fn a_stage_under_a_cover_keeps_its_record() {
    for progress in [Progress::Complete, Progress::InProgress] {
        let h = Harness::new();
        h.staged(VOL);
        if progress == Progress::InProgress {
            stage_in_progress(&h);
        }
        let foreign = crate::double::host::mount_facts(crate::DevNum::new(8, 42), "ext4", false);
        let at = h.staging(VOL).as_path().to_path_buf();
        h.host.state().mounts.entry(at).or_default().push(foreign);
        let r = recover_volume(&h.ctx, VOL).expect("recover");
        assert!(!r.dropped_staging, "{progress:?}");
        let kept = h.ledger.staged(VOL).expect("read").map(|s| s.progress);
        assert_eq!(kept, Some(progress));
        assert_eq!(h.host.calls(), Vec::<String>::new(), "{progress:?}");
    }
}
