//! Request paths the host refuses to hold: a directory on the way that is a symlink, or not a
//! directory. Each door of the pipeline turns the refusal into INVALID_ARGUMENT's `BadPath`, and
//! nothing on the host or in the records changes.

use super::*;
use crate::error::Error;
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
    assert_eq!(h.host.calls(), Vec::<String>::new());
    assert_eq!(h.journal_from(VOL, lines), strings(&[]));
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
    assert_eq!(h.host.calls(), Vec::<String>::new());
    assert_eq!(h.journal_from(VOL, lines), strings(&[]));
    assert_eq!(h.ctx.ledger.publications(VOL).expect("read").len(), 1);
}
