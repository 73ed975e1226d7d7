//! NodePublishVolume against the double: the steps of a mount and a block publish (each bind
//! after its durable intent), the idempotent repeat, and every refusal, each leaving the host and
//! the journal as they were.

use super::*;
use crate::error::Error;
use crate::ledger::{LedgerResult, LedgerWriter};
use crate::records::{Durability, Progress};

/// Publishes `cmd`, expects the refusal `is` accepts, and checks that neither the host nor the
/// journal changed: every refusal comes before the bind intent.
fn check_refused(h: &Harness, cmd: &PublishCommand, is: fn(&Error) -> bool) {
    let calls = h.host.calls();
    let lines = h.journal(VOL).len();
    let e = h.publish(cmd).expect_err("the publish is refused");
    assert!(is(&e), "unexpected refusal: {e:?}");
    assert_eq!(h.host.calls(), calls, "{e}: the host was changed");
    assert_eq!(h.journal_from(VOL, lines), strings(&[]), "{e}: journaled");
}

/// `check_refused` with the refusal named by its `Error` pattern.
macro_rules! refused {
    ($h:expr, $cmd:expr, $refusal:pat) => {
        check_refused($h, $cmd, |e| matches!(e, $refusal))
    };
}

/// The publication record of `VOL` at `target`.
fn record(h: &Harness, target: &str) -> Option<crate::records::Publication> {
    let target = h.target(target);
    h.ctx.ledger.publication(VOL, target.as_path()).unwrap()
}

/// A change to a publish request, or to the records and the host before it.
type Change = fn(&mut PublishCommand);
type Setup = fn(&Harness);

fn writer_cmd(h: &Harness, target: &str) -> PublishCommand {
    h.publish_cmd(VOL, target, mount(AccessMode::SingleNodeWriter))
}

/// Changes the records behind the agent's back (a lost line, a rebuilt record).
fn rewrite(h: &Harness, f: impl FnOnce(&mut dyn LedgerWriter) -> LedgerResult<()>) {
    h.ctx
        .ledger
        .write(Durability::Immediate, Box::new(f))
        .unwrap();
}

/// Marks the staged record of `VOL` in progress, as a stage's mount intent leaves it.
fn stage_in_progress(h: &Harness) {
    let mut staged = h.ctx.ledger.staged(VOL).unwrap().expect("staged record");
    staged.progress = Progress::InProgress;
    rewrite(h, |w| w.put_staged(&staged));
}

/// Makes a file (with content) or a directory at `target` behind the agent's back.
fn make_target(h: &Harness, target: &str, dir: bool) -> std::path::PathBuf {
    let path = h.target(target).as_path().to_path_buf();
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    if dir {
        std::fs::create_dir(&path).unwrap();
    } else {
        std::fs::write(&path, b"host data").unwrap();
    }
    path
}

#[test]
fn a_first_mount_publish_binds_the_staging_mount_after_its_durable_intent() {
    let h = Harness::new();
    h.staged(VOL);
    let before = h.journal(VOL).len();
    h.publish(&writer_cmd(&h, "p1")).expect("publish");
    // Bound from the staging mount, once the intent (with the record) was on disk: the last
    // commit before the bind was durable.
    assert_eq!(
        h.host.durable_before(),
        vec![(
            format!("bind {VOL} on mount"),
            Some("publish/bind:intent".to_string())
        )]
    );
    assert_eq!(
        h.journal_from(VOL, before),
        strings(&[
            "publish/bind:intent",
            "publish/bind:done",
            "publish/published:done"
        ])
    );
    let p = record(&h, "p1").expect("publication record");
    assert_eq!(p.progress, Progress::Complete);
    assert_eq!(p.staging_path, h.staging(VOL).as_path());
    assert!(!p.block && !p.readonly);
    assert_eq!(p.access_mode, AccessMode::SingleNodeWriter.csi_number());
    assert_eq!(h.host.mounts_at(h.target("p1").as_path()), 1);
}

#[test]
fn an_idempotent_repeat_makes_no_host_call() {
    let h = Harness::new();
    h.staged(VOL);
    h.published(VOL, "p1");
    let before = h.journal(VOL).len();
    h.publish(&writer_cmd(&h, "p1")).expect("repeat");
    assert_eq!(h.host.calls(), strings(&[]));
    assert_eq!(
        h.journal_from(VOL, before),
        strings(&["publish/published:done"])
    );
    assert_eq!(h.host.mounts_at(h.target("p1").as_path()), 1);
}

/// A stage is complete only once it has asked, after its mount, what else uses the device: one
/// a crash cut in between (recovery could not answer) is asked by the publish first (kubelet
/// stages once and publishes for every pod): published once nothing else uses the device,
/// refused and unstaged while its node is bound elsewhere (a fifty-sixth fresh review's F1).
#[test]
fn an_in_progress_stage_is_published_only_once_its_questions_are_asked() {
    let h = Harness::new();
    h.staged(VOL);
    stage_in_progress(&h);
    h.publish(&writer_cmd(&h, "p1")).expect("publish");
    assert_eq!(h.host.calls(), vec![format!("bind {VOL} on mount")]);
    let staged = h.ctx.ledger.staged(VOL).unwrap().expect("staged");
    assert_eq!(staged.progress, Progress::Complete);

    let h = Harness::new();
    h.staged(VOL);
    stage_in_progress(&h);
    h.bind_node_elsewhere(VOL);
    let e = h
        .publish(&writer_cmd(&h, "p1"))
        .expect_err("published a device bound elsewhere");
    assert!(matches!(e, Error::DeviceStillBound { .. }), "{e}");
    assert_eq!(h.host.calls(), vec![format!("unmount {VOL}")]);
    assert!(h.ctx.ledger.staged(VOL).unwrap().is_none());
    assert!(h.ledger.all_publications().is_empty());
}

#[test]
fn a_block_publish_binds_the_device_onto_a_file_it_creates() {
    let h = Harness::new();
    h.staged_block(VOL, AccessMode::SingleNodeWriter);
    let cmd = h.publish_cmd(VOL, "p1", block(AccessMode::SingleNodeWriter));
    h.publish(&cmd).expect("publish");
    assert_eq!(
        h.host.durable_before(),
        vec![(
            format!("bind dev-{VOL} on mount"),
            Some("publish/bind:intent".to_string())
        )]
    );
    assert!(h.target("p1").as_path().is_file(), "the target is a file");
    assert!(record(&h, "p1").expect("publication record").block);
}

#[test]
fn a_read_only_block_publish_lays_a_read_only_device_then_binds_it() {
    let h = Harness::new();
    h.staged_block(VOL, AccessMode::SingleNodeWriter);
    let before = h.journal(VOL).len();
    let mut cmd = h.publish_cmd(VOL, "p1", block(AccessMode::SingleNodeWriter));
    cmd.readonly = true;
    h.publish(&cmd).expect("publish");
    // The read-only flag of a bind does not reach a device node: the device bound is read-only
    // itself. Both calls come after the durable intent that names the device's tag.
    let intent = Some("publish/bind:intent".to_string());
    assert_eq!(
        h.host.durable_before(),
        vec![
            (format!("lay read-only over dev-{VOL}"), intent.clone()),
            ("bind ro-0 on mount ro".to_string(), intent),
        ]
    );
    assert_eq!(
        h.journal_from(VOL, before),
        strings(&[
            "publish/bind:intent",
            "publish/ro_device:intent",
            "publish/ro_device:done",
            "publish/bind:done",
            "publish/published:done",
        ])
    );
    assert_eq!(h.host.state().read_only.len(), 1);
}

#[test]
fn a_volume_with_no_staged_record_is_refused_as_not_staged() {
    let h = Harness::new();
    h.attach(VOL);
    refused!(&h, &writer_cmd(&h, "p1"), Error::NotStaged { .. });
}

#[test]
fn an_in_progress_stage_without_its_mount_is_refused_as_not_staged() {
    let h = Harness::new();
    h.staged(VOL);
    // A stage that wrote its mount intent and then failed or crashed before the mount.
    stage_in_progress(&h);
    h.host.state().mounts.remove(h.staging(VOL).as_path());
    refused!(&h, &writer_cmd(&h, "p1"), Error::NotStaged { .. });
}

#[test]
fn a_volume_staged_at_another_path_is_refused() {
    let h = Harness::new();
    h.staged(VOL);
    let mut cmd = writer_cmd(&h, "p1");
    cmd.staging = h.staging("elsewhere");
    refused!(&h, &cmd, Error::StagedElsewhere { .. });
}

#[test]
fn a_publish_for_another_access_type_than_the_staging_is_refused() {
    for staged_block in [false, true] {
        let h = Harness::new();
        let asked = if staged_block {
            h.staged_block(VOL, AccessMode::SingleNodeWriter);
            mount(AccessMode::SingleNodeWriter)
        } else {
            h.staged(VOL);
            block(AccessMode::SingleNodeWriter)
        };
        refused!(
            &h,
            &h.publish_cmd(VOL, "p1", asked),
            Error::StagedForOtherAccess { .. }
        );
    }
}

#[test]
fn a_target_published_with_other_arguments_is_refused() {
    let cases: [(&str, Change); 3] = [
        ("mount flags", |c| {
            c.capability = mount_with(FsType::Ext4, &["noatime"], AccessMode::SingleNodeWriter)
        }),
        ("access mode", |c| {
            c.capability = mount(AccessMode::SingleNodeMultiWriter)
        }),
        ("readonly", |c| c.readonly = true),
    ];
    for (what, change) in cases {
        let h = Harness::new();
        h.staged(VOL);
        h.published(VOL, "p1");
        let mut cmd = writer_cmd(&h, "p1");
        change(&mut cmd);
        refused!(&h, &cmd, Error::PublishedWithOtherArguments { .. });
        assert_eq!(h.host.mounts_at(h.target("p1").as_path()), 1, "{what}");
    }
}

#[test]
fn a_bind_of_the_volume_with_the_other_readonly_is_refused_when_no_record_says_more() {
    // A record rebuilt from the mounts (access mode 0) knows nothing of the arguments; without
    // any record only the bind the host shows is left to compare against.
    let cases: [(&str, Setup); 2] = [
        ("recovered record", |h| {
            let mut p = record(h, "p1").expect("publication record");
            p.access_mode = 0;
            rewrite(h, |w| w.put_publication(&p));
        }),
        ("no record", |h| {
            let target = h.target("p1");
            rewrite(h, |w| w.delete_publication(VOL, target.as_path()));
        }),
    ];
    for (what, forget) in cases {
        let h = Harness::new();
        h.staged(VOL);
        h.published(VOL, "p1");
        forget(&h);
        let mut cmd = writer_cmd(&h, "p1");
        cmd.readonly = true;
        refused!(
            &h,
            &cmd,
            Error::PublishedWithOtherReadonly {
                readonly: false,
                ..
            }
        );
        assert_eq!(h.host.mounts_at(h.target("p1").as_path()), 1, "{what}");
    }
}

#[test]
fn a_single_node_writer_already_published_elsewhere_is_refused() {
    let h = Harness::new();
    h.staged(VOL);
    h.published(VOL, "p1");
    refused!(&h, &writer_cmd(&h, "p2"), Error::SinglePublication { .. });
}

#[test]
fn a_single_node_writer_publication_whose_bind_is_gone_does_not_block_another_target() {
    let h = Harness::new();
    h.staged(VOL);
    h.published(VOL, "p1");
    // The host, not the record, says whether the volume is still published there.
    h.host.state().mounts.remove(h.target("p1").as_path());
    h.publish(&writer_cmd(&h, "p2")).expect("publish");
    assert_eq!(h.host.calls(), vec![format!("bind {VOL} on mount")]);
}

#[test]
fn a_foreign_mount_at_the_target_is_refused_and_left() {
    let h = Harness::new();
    h.staged(VOL);
    let target = make_target(&h, "p1", true);
    h.host.foreign_mount(&target);
    refused!(&h, &writer_cmd(&h, "p1"), Error::ForeignMount { .. });
    assert_eq!(h.host.mounts_at(&target), 1);
}

#[test]
fn a_staging_path_whose_mount_is_gone_is_refused_as_empty() {
    let h = Harness::new();
    h.staged(VOL);
    // Binding the bare staging directory would hand the pod the host's filesystem.
    h.host.state().mounts.remove(h.staging(VOL).as_path());
    refused!(&h, &writer_cmd(&h, "p1"), Error::StagingEmpty { .. });
}

#[test]
fn a_foreign_mount_over_the_staging_path_is_refused() {
    let h = Harness::new();
    h.staged(VOL);
    h.host.foreign_mount(h.staging(VOL).as_path());
    refused!(&h, &writer_cmd(&h, "p1"), Error::ForeignStaging { .. });
}

#[test]
fn a_target_the_agent_did_not_make_and_cannot_bind_onto_is_refused() {
    // (block access, a directory at the target, what)
    let cases = [
        (
            true,
            false,
            "a file at a block target the agent did not create",
        ),
        (true, true, "a directory at a block target"),
        (false, false, "a file at a mount target"),
    ];
    for (is_block, dir, what) in cases {
        let h = Harness::new();
        let capability = if is_block {
            h.staged_block(VOL, AccessMode::SingleNodeWriter);
            block(AccessMode::SingleNodeWriter)
        } else {
            h.staged(VOL);
            mount(AccessMode::SingleNodeWriter)
        };
        let target = make_target(&h, "p1", dir);
        refused!(
            &h,
            &h.publish_cmd(VOL, "p1", capability),
            Error::UnusableTarget { .. }
        );
        if !dir {
            // A host file (kubelet's config, say) is neither covered nor truncated.
            assert_eq!(std::fs::read(&target).unwrap(), b"host data", "{what}");
        }
        assert!(record(&h, "p1").is_none(), "{what}: recorded");
    }
}

#[test]
fn a_block_device_that_is_now_another_volume_is_refused() {
    let h = Harness::new();
    h.staged_block(VOL, AccessMode::SingleNodeWriter);
    // A detach and a new attach reused the device's numbers.
    let dev = h.host.devnum(&h.backend.device_of(VOL));
    h.backend.moved.lock().unwrap().insert(dev, "vol-b".into());
    let cmd = h.publish_cmd(VOL, "p1", block(AccessMode::SingleNodeWriter));
    refused!(&h, &cmd, Error::NoLongerTheDevice { .. });
}

#[test]
fn a_failed_bind_is_returned_and_its_intent_keeps_the_record_for_the_retry() {
    let h = Harness::new();
    h.staged(VOL);
    let before = h.journal(VOL).len();
    h.host.fail("bind", "EPERM");
    let e = h.publish(&writer_cmd(&h, "p1")).expect_err("bind fails");
    assert!(matches!(e, Error::Io { .. }), "{e:?}");
    // The failed line explains; the durable intent and the in-progress record are what a retry
    // (and start-up recovery, which asks the host) go by.
    assert_eq!(
        h.journal_from(VOL, before),
        strings(&["publish/bind:intent", "publish/bind:failed"])
    );
    let target = h.target("p1");
    let p = record(&h, "p1").expect("record");
    assert_eq!(p.progress, Progress::InProgress);
    assert_eq!(h.host.mounts_at(target.as_path()), 0);

    h.host.state().fail.clear();
    h.publish(&writer_cmd(&h, "p1")).expect("the retry");
    let p = record(&h, "p1").expect("record");
    assert_eq!(p.progress, Progress::Complete);
    assert_eq!(h.host.mounts_at(target.as_path()), 1);
}

#[test]
fn a_failed_read_only_block_bind_removes_the_read_only_device_it_laid() {
    let h = Harness::new();
    h.staged_block(VOL, AccessMode::SingleNodeWriter);
    h.host.fail("bind", "EPERM");
    let mut cmd = h.publish_cmd(VOL, "p1", block(AccessMode::SingleNodeWriter));
    cmd.readonly = true;
    let e = h.publish(&cmd).expect_err("bind fails");
    assert!(matches!(e, Error::Io { .. }), "{e:?}");
    assert_eq!(
        h.host.calls(),
        strings(&[
            "lay read-only over dev-vol-a",
            "bind ro-0 on mount ro",
            "remove read-only"
        ])
    );
    assert!(h.host.state().read_only.is_empty());
}

#[test]
fn a_read_only_mount_publication_binds_read_only() {
    let h = Harness::new();
    h.staged(VOL);
    let mut cmd = h.publish_cmd(VOL, "pod", mount(AccessMode::SingleNodeWriter));
    cmd.readonly = true;
    h.publish(&cmd).expect("publish read-only");
    let calls = h.host.calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert!(
        calls[0].starts_with("bind ") && calls[0].ends_with(" ro"),
        "{calls:?}"
    );
}
