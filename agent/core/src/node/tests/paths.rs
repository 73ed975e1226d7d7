//! Request paths the host refuses to hold: a directory on the way that is a symlink, or not a
//! directory. Each door of the pipeline turns the refusal into INVALID_ARGUMENT's `BadPath`, and
//! nothing on the host or in the records changes.

use super::*;
use crate::error::Error;
use crate::node::Use;
use crate::request::ValidationError;

/// Makes `allowed/<dir>` a symlink to a directory outside the allowed prefix.
fn symlinked(h: &Harness, dir: &str) {
    let outside = h.dir.join("outside");
    std::fs::create_dir_all(&outside).expect("outside");
    std::os::unix::fs::symlink(&outside, h.dir.join("allowed").join(dir)).expect("symlink");
}

fn is_bad_path(e: &Error) -> bool {
    matches!(e, Error::Invalid(ValidationError::BadPath { .. }))
}

#[test]
fn a_publish_target_below_a_symlink_is_refused_and_nothing_changes() {
    let h = Harness::new();
    h.staged(VOL);
    symlinked(&h, "pods");
    let lines = h.journal(VOL).len();
    let e = h
        .publish(&h.publish_cmd(VOL, "p1", mount(AccessMode::SingleNodeWriter)))
        .expect_err("refused");
    assert!(is_bad_path(&e), "{e:?}");
    h.assert_nothing_done(VOL, lines);
    assert!(h.ctx.ledger.publications(VOL).expect("read").is_empty());
    assert!(
        !h.dir.join("outside/p1").exists(),
        "made through the symlink"
    );
}

#[test]
fn a_staging_path_below_a_symlink_is_refused_and_nothing_is_mounted() {
    let h = Harness::new();
    h.attach(VOL);
    symlinked(&h, "staging");
    let e = h
        .stage(&h.stage_cmd(VOL, mount(AccessMode::SingleNodeWriter)))
        .expect_err("refused");
    assert!(is_bad_path(&e), "{e:?}");
    assert_eq!(h.host.calls(), Vec::<String>::new());
    assert!(h.ctx.ledger.staged(VOL).expect("read").is_none());
    assert!(
        !h.dir.join("outside").join(VOL).exists(),
        "made through the symlink"
    );
}

#[test]
fn an_unpublish_target_below_a_non_directory_is_refused_and_nothing_changes() {
    let h = Harness::new();
    h.staged(VOL);
    h.published(VOL, "p1");
    // `pods/p2` is a file: `pods/p2/mount` cannot be below it.
    std::fs::write(h.dir.join("allowed/pods/p2"), b"").expect("file");
    let lines = h.journal(VOL).len();
    let e = h.unpublish(VOL, "p2").expect_err("refused");
    assert!(is_bad_path(&e), "{e:?}");
    h.assert_nothing_done(VOL, lines);
    assert_eq!(h.ctx.ledger.publications(VOL).expect("read").len(), 1);
}

#[test]
fn a_path_that_cannot_be_examined_is_refused_by_every_call_and_nothing_changes() {
    let h = Harness::new();
    h.staged(VOL);
    h.published(VOL, "p1");
    h.attach("vol-b");
    h.host.fail("examine", "Input/output error");
    let lines = h.journal(VOL).len();
    let unexaminable = |e: &Error| matches!(e, Error::PathUnexaminable { .. });
    let rwo = mount(AccessMode::SingleNodeWriter);
    let e = h.stage(&h.stage_cmd("vol-b", rwo.clone())).unwrap_err();
    assert!(unexaminable(&e), "stage: {e:?}");
    let e = h.publish(&h.publish_cmd(VOL, "p2", rwo)).unwrap_err();
    assert!(unexaminable(&e), "publish: {e:?}");
    let e = h.unpublish(VOL, "p1").unwrap_err();
    assert!(unexaminable(&e), "unpublish: {e:?}");
    let e = h.unstage(VOL).unwrap_err();
    assert!(unexaminable(&e), "unstage: {e:?}");
    h.assert_nothing_done(VOL, lines);
    assert!(h.ctx.ledger.staged(VOL).expect("read").is_some());
    assert_eq!(h.ctx.ledger.publications(VOL).expect("read").len(), 1);
}

#[test]
fn a_mount_that_cannot_be_read_is_never_acted_on() {
    let h = Harness::new();
    h.staged(VOL);
    h.published(VOL, "p1");
    h.host
        .fail("mounted_at", "Transport endpoint is not connected");
    let lines = h.journal(VOL).len();
    let unreadable = |e: &Error| matches!(e, Error::MountUnreadable { .. });
    let e = h.unpublish(VOL, "p1").unwrap_err();
    assert!(unreadable(&e), "unpublish: {e:?}");
    let e = h.unstage(VOL).unwrap_err();
    assert!(unreadable(&e), "unstage: {e:?}");
    let rwo = mount(AccessMode::SingleNodeWriter);
    let e = h.publish(&h.publish_cmd(VOL, "p2", rwo)).unwrap_err();
    assert!(unreadable(&e), "publish: {e:?}");
    h.assert_nothing_done(VOL, lines);
    assert_eq!(h.host.mounts_at(h.target("p1").as_path()), 1);
}

#[test]
fn a_path_inside_or_above_another_volumes_path_is_refused() {
    let h = Harness::new();
    h.staged(VOL);
    h.attach("vol-b");
    let rwo = mount(AccessMode::SingleNodeWriter);
    for rel in ["staging/vol-a/inner", "staging"] {
        let mut cmd = h.stage_cmd("vol-b", rwo.clone());
        cmd.staging = h.path("staging_target_path", rel);
        let e = h.stage(&cmd).unwrap_err();
        assert!(
            matches!(e, Error::PathOfAnotherVolume { .. }),
            "{rel}: {e:?}"
        );
    }
    // A publication target inside the volume's own staging path is another use of its path.
    let mut cmd = h.publish_cmd(VOL, "p1", rwo);
    cmd.target = h.path("target_path", "staging/vol-a/pod");
    let e = h.publish(&cmd).unwrap_err();
    assert!(matches!(e, Error::PathOfAnotherVolume { .. }), "{e:?}");
    assert_eq!(h.host.calls(), Vec::<String>::new());
    assert!(h.ctx.ledger.staged("vol-b").expect("read").is_none());
    assert!(h.ctx.ledger.publications(VOL).expect("read").is_empty());
}

#[test]
fn a_path_another_call_is_using_is_refused_as_busy() {
    let h = Harness::new();
    h.staged(VOL);
    let target = h.target("p1");
    let _turn = h
        .ctx
        .claims
        .take("vol-other", target.as_path(), Use::Target, false)
        .expect("the other call's turn");
    let lines = h.journal(VOL).len();
    let rwo = mount(AccessMode::SingleNodeWriter);
    let e = h.publish(&h.publish_cmd(VOL, "p1", rwo)).unwrap_err();
    assert!(matches!(e, Error::PathBusy { .. }), "publish: {e:?}");
    let e = h.unpublish(VOL, "p1").unwrap_err();
    assert!(matches!(e, Error::PathBusy { .. }), "unpublish: {e:?}");
    h.assert_nothing_done(VOL, lines);
}

#[test]
fn a_staging_directory_that_cannot_be_made_is_refused_before_the_device_is_touched() {
    let h = Harness::new();
    h.attach(VOL);
    h.host.fail("mkdir", "No space left on device");
    let e = h
        .stage(&h.stage_cmd(VOL, mount(AccessMode::SingleNodeWriter)))
        .unwrap_err();
    assert!(matches!(e, Error::StagingNotCreated { .. }), "{e:?}");
    assert_eq!(h.host.calls(), Vec::<String>::new());
    assert!(h.ctx.ledger.staged(VOL).expect("read").is_none());
    assert!(h.ctx.ledger.format(VOL).expect("read").is_none());
}

#[test]
fn a_target_that_cannot_be_made_is_refused_and_its_intent_withdrawn() {
    let h = Harness::new();
    h.staged(VOL);
    h.host.fail("mkdir", "No space left on device");
    let lines = h.journal(VOL).len();
    let e = h
        .publish(&h.publish_cmd(VOL, "p1", mount(AccessMode::SingleNodeWriter)))
        .unwrap_err();
    assert!(matches!(e, Error::TargetNotCreated { .. }), "{e:?}");
    assert_eq!(h.host.calls(), Vec::<String>::new(), "bound");
    assert_eq!(
        h.journal_from(VOL, lines),
        strings(&["publish/bind:intent", "publish/bind:failed"])
    );
    assert!(h.ctx.ledger.publications(VOL).expect("read").is_empty());
}

#[test]
fn stats_at_a_path_below_a_symlink_is_refused_and_reads_nothing() {
    let h = Harness::new();
    h.staged(VOL);
    h.published(VOL, "p1");
    symlinked(&h, "elsewhere");
    let path = h.path("volume_path", "elsewhere/p1");
    let e = crate::node::stats::volume_stats(
        &h.ctx,
        &crate::node::stats::StatsCommand {
            volume: VolumeId::parse(VOL).expect("id"),
            volume_path: path,
            staging: None,
        },
    )
    .expect_err("not the volume's path");
    assert!(
        matches!(e, Error::PathNotFound { .. }) || is_bad_path(&e),
        "{e:?}"
    );
    assert_eq!(h.host.calls(), Vec::<String>::new());
}

#[test]
fn an_expansion_at_a_path_below_a_symlink_is_refused_and_grows_nothing() {
    let h = Harness::new();
    h.staged(VOL);
    symlinked(&h, "elsewhere");
    let lines = h.journal(VOL).len();
    let e = crate::node::expand::expand(
        &h.ctx,
        &crate::node::expand::ExpandCommand {
            volume: VolumeId::parse(VOL).expect("id"),
            volume_path: h.path("volume_path", "elsewhere/x"),
            staging: None,
            required_bytes: 0,
            limit_bytes: 0,
            capability: None,
        },
    )
    .expect_err("not the volume's path");
    assert!(
        matches!(e, Error::PathNotFound { .. }) || is_bad_path(&e),
        "{e:?}"
    );
    h.assert_nothing_done(VOL, lines);
}

#[test]
fn a_reclaim_below_a_symlink_is_refused_and_trims_nothing() {
    let h = Harness::new();
    h.staged(VOL);
    symlinked(&h, "elsewhere");
    let e = crate::node::reclaim::reclaim(
        &h.ctx,
        &crate::node::reclaim::ReclaimCommand {
            volume: VolumeId::parse(VOL).expect("id"),
            path: crate::node::reclaim::ReclaimPath::Published(
                h.path("volume_path", "elsewhere/x"),
            ),
        },
    )
    .expect_err("not the volume's path");
    assert!(
        matches!(e, Error::PathNotFound { .. }) || is_bad_path(&e),
        "{e:?}"
    );
    assert_eq!(h.host.calls(), Vec::<String>::new());
}

#[test]
fn a_path_component_longer_than_the_filesystem_allows_is_invalid_and_nothing_changes() {
    let h = Harness::new();
    h.attach(VOL);
    let mut cmd = h.stage_cmd(VOL, mount(AccessMode::SingleNodeWriter));
    cmd.staging = h.path(
        "staging_target_path",
        &format!("staging/{}/x", "y".repeat(300)),
    );
    let e = h.stage(&cmd).expect_err("refused");
    assert!(is_bad_path(&e), "{e:?}");
    assert_eq!(h.host.calls(), Vec::<String>::new());
}
