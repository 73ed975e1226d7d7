//! Mounts the agent finds where it would have made its own (`node::adopted`): taken as the
//! volume's only when they are what it would have made, refused otherwise, and the host left as
//! it was either way: a change to the one mount found would not reach its copies in other mount
//! namespaces, nor the filesystem below it (a seventieth fresh review's F1).

use super::*;
use crate::error::Error;
use crate::ledger::Ledger;
use crate::node::recover::recover_volume;
use crate::records::{Durability, Progress};

const RWO: AccessMode = AccessMode::SingleNodeWriter;
const ROX: AccessMode = AccessMode::MultiNodeReaderOnly;

fn write(h: &Harness, change: crate::ledger::Changes) {
    h.ledger
        .write(Durability::Immediate, change)
        .expect("write");
}

/// The mount at `path` lets device nodes open: root's, made without `nodev`.
fn without_nodev(h: &Harness, path: RequestPath) {
    h.host
        .state()
        .dev_allowed
        .insert(path.as_path().to_path_buf());
}

/// The top mount at `path` shows its files through an id mapping.
fn idmapped(h: &Harness, path: RequestPath) {
    let mut s = h.host.state();
    let top = s.mounts.get_mut(path.as_path()).and_then(|m| m.last_mut());
    top.expect("a mount").idmapped = true;
}

/// A tmpfs mounted on a directory inside the mount at `path`.
fn mount_below(h: &Harness, path: RequestPath) {
    let tmpfs = crate::double::host::mount_facts(crate::DevNum::new(0, 77), "tmpfs", false);
    let below = path.as_path().join("sub");
    h.host.state().mounts.insert(below, vec![tmpfs]);
}

fn stage_in_progress(h: &Harness) {
    let mut s = h.ledger.staged(VOL).expect("read").expect("staged");
    s.progress = Progress::InProgress;
    write(h, Box::new(move |w| w.put_staged(&s)));
}

fn progress(h: &Harness) -> Option<Progress> {
    h.ledger.staged(VOL).expect("read").map(|s| s.progress)
}

/// VOL staged and published at p1 by the agent, its publication's record complete or not (a
/// publish cut past its bind intent), and the command that publishes it there again.
fn published_at_p1(complete: bool) -> (Harness, PublishCommand) {
    let h = Harness::new();
    h.staged(VOL);
    h.published(VOL, "p1");
    if !complete {
        publication_in_progress(&h, "p1");
    }
    let cmd = h.publish_cmd(VOL, "p1", mount(RWO));
    (h, cmd)
}

fn publication_in_progress(h: &Harness, target: &str) {
    let target = h.target(target).as_path().to_path_buf();
    let mut p = h.ledger.publication(VOL, &target).unwrap().unwrap();
    p.progress = Progress::InProgress;
    write(h, Box::new(move |w| w.put_publication(&p)));
}

/// A stage that finds the volume mounted at its staging path with no record of it (the records
/// lost; root's mount while the agent was down; the upstream plugin's before a swap): taken as
/// it is, `dev` too; one read-write for a reader, idmapped, or with a mount below it, is refused
/// and left as it is.
#[test]
fn a_staging_mount_found_without_its_record_is_taken_only_as_the_stage_makes_it() {
    type Setup = fn(&Harness);
    let cases: [(&str, Setup, AccessMode, Option<&str>); 5] = [
        ("the stage's own mount", |_| {}, RWO, None),
        (
            // The upstream plugin's, root's: only root reaches a staging path, and every
            // publication is bound `nodev` whatever the staging has.
            "root's, without nodev",
            |h| without_nodev(h, h.staging(VOL)),
            RWO,
            None,
        ),
        (
            "an idmapped one",
            |h| idmapped(h, h.staging(VOL)),
            RWO,
            Some("idmapped"),
        ),
        (
            "one with a mount below it",
            |h| mount_below(h, h.staging(VOL)),
            RWO,
            Some("mounts below it"),
        ),
        (
            "a read-write filesystem, for a reader",
            |_| {},
            ROX,
            Some("not read-only, its filesystem not read-only"),
        ),
    ];
    for (what, setup, mode, lacks) in cases {
        let h = Harness::new();
        h.staged(VOL);
        write(&h, Box::new(|w| w.delete_staged(VOL)));
        setup(&h);
        let got = h.stage(&h.stage_cmd(VOL, mount(mode)));
        assert_eq!(
            h.host.calls(),
            Vec::<String>::new(),
            "{what}: the host changed"
        );
        assert_eq!(h.host.mounts_at(h.staging(VOL).as_path()), 1, "{what}");
        match lacks {
            None => {
                got.expect(what);
                assert_eq!(progress(&h), Some(Progress::Complete), "{what}");
            }
            Some(lacks) => {
                let e = got.expect_err(what);
                assert!(
                    matches!(&e, Error::MountedNotAsMade { differs: d, .. } if d == lacks),
                    "{what}: {e}"
                );
                assert_ne!(progress(&h), Some(Progress::Complete), "{what}: recorded");
            }
        }
    }
}

/// A publish finds its bind with no complete record (cut past its intent), or repeats a complete
/// one: OK only while the bind is what the publish binds; root's bind without `nodev` is refused
/// and left, and so is the agent's own once root remounted it with `dev`.
#[test]
fn a_bind_found_at_the_target_answers_ok_only_as_the_publish_binds_it() {
    for complete in [false, true] {
        let (h, cmd) = published_at_p1(complete);
        h.publish(&cmd).expect("the publish's own bind");
        without_nodev(&h, h.target("p1"));
        let e = h.publish(&cmd).expect_err("a bind without nodev taken");
        assert!(matches!(e, Error::MountedNotAsMade { .. }), "{e}");
        assert_eq!(h.host.calls(), Vec::<String>::new());
        assert_eq!(h.host.mounts_at(h.target("p1").as_path()), 1);
    }
}

/// Found with no complete record, a bind with a mount below it is refused (root's `dev` tmpfs
/// there carried another volume's node: a seventy-second fresh review's F2); a complete one is
/// not asked (a workload may mount inside its volume where its propagation lets it). An
/// idmapped one is refused either way, and so is a publish from an idmapped staging (its F3).
#[test]
fn a_found_bind_with_mounts_below_it_or_an_id_mapping_is_never_taken() {
    for complete in [false, true] {
        let (h, cmd) = published_at_p1(complete);
        mount_below(&h, h.target("p1"));
        let got = h.publish(&cmd);
        assert_eq!(got.is_ok(), complete, "complete={complete}: {got:?}");
        idmapped(&h, h.target("p1"));
        let e = h.publish(&cmd).expect_err("an idmapped bind taken");
        assert!(matches!(e, Error::MountedNotAsMade { .. }), "{e}");
        assert_eq!(h.host.calls(), Vec::<String>::new());
    }
    let h = Harness::new();
    h.staged(VOL);
    idmapped(&h, h.staging(VOL));
    let e = h
        .publish(&h.publish_cmd(VOL, "p1", mount(RWO)))
        .expect_err("published from an idmapped staging");
    assert!(matches!(e, Error::MountedNotAsMade { .. }), "{e}");
    assert_eq!(h.host.calls(), Vec::<String>::new());
}

/// Start-up finds a stage or a publication cut before its completion with root's mount there,
/// made without `nodev` while the agent was down: the staging is taken (only root reaches it),
/// the publication left in progress; the host untouched.
#[test]
fn recovery_completes_nothing_that_is_not_as_made() {
    let h = Harness::new();
    h.staged(VOL);
    h.published(VOL, "pod");
    stage_in_progress(&h);
    without_nodev(&h, h.staging(VOL));
    let r = recover_volume(&h.ctx, VOL).expect("recover");
    assert_eq!(r.completed, 1, "{r:?}");
    assert_eq!(progress(&h), Some(Progress::Complete));

    let h = Harness::new();
    h.staged(VOL);
    h.published(VOL, "pod");
    let target = h.target("pod").as_path().to_path_buf();
    publication_in_progress(&h, "pod");
    without_nodev(&h, h.target("pod"));
    let r = recover_volume(&h.ctx, VOL).expect("recover");
    assert_eq!(r.completed, 0, "{r:?}");
    let p = h.ledger.publication(VOL, &target).unwrap().unwrap();
    assert_eq!(p.progress, Progress::InProgress);
    assert_eq!(h.host.calls(), Vec::<String>::new());
}

/// A raw block bind found with no complete record, idmapped: never taken (the agent's own bind
/// of a device node has no id mapping).
#[test]
fn an_idmapped_block_bind_is_never_taken() {
    let h = Harness::new();
    h.staged_block(VOL, AccessMode::SingleNodeMultiWriter);
    let cmd = h.publish_cmd(VOL, "p1", block(AccessMode::SingleNodeMultiWriter));
    h.publish(&cmd).expect("publish");
    publication_in_progress(&h, "p1");
    idmapped(&h, h.target("p1"));
    h.host.state().calls.clear();
    let e = h.publish(&cmd).expect_err("an idmapped block bind taken");
    assert!(
        matches!(&e, Error::MountedNotAsMade { differs, .. } if differs == "idmapped"),
        "{e}"
    );
    assert_eq!(h.host.calls(), Vec::<String>::new());
}

/// A bind found at a target that the kernel shows as the propagated copy of the volume's own
/// staging (a shared directory's peer): never taken for a publication, filesystem or raw block,
/// since its unpublish would propagate back and take the staging down (a seventy-fourth fresh
/// review's F1).
#[test]
fn the_kernels_copy_of_a_recorded_mount_is_never_taken() {
    let (h, cmd) = published_at_p1(false);
    let staging = h.staging(VOL).as_path().to_path_buf();
    let target = h.target("p1").as_path().to_path_buf();
    h.host.state().copies.insert(target, vec![staging]);
    let e = h.publish(&cmd).expect_err("the staging's copy taken");
    assert!(
        matches!(&e, Error::MountedNotAsMade { differs, .. } if differs.contains("copy of")),
        "{e}"
    );
    assert_eq!(h.host.calls(), Vec::<String>::new());

    let h = Harness::new();
    h.staged_block(VOL, AccessMode::SingleNodeMultiWriter);
    let block_cmd = |t| h.publish_cmd(VOL, t, block(AccessMode::SingleNodeMultiWriter));
    h.publish(&block_cmd("p1")).expect("publish p1");
    h.publish(&block_cmd("p2")).expect("publish p2");
    publication_in_progress(&h, "p2");
    let (p1, p2) = (h.target("p1"), h.target("p2"));
    let copies = vec![p1.as_path().to_path_buf()];
    h.host
        .state()
        .copies
        .insert(p2.as_path().to_path_buf(), copies);
    h.host.state().calls.clear();
    let e = h.publish(&block_cmd("p2")).expect_err("p1's copy taken");
    assert!(matches!(e, Error::MountedNotAsMade { .. }), "{e}");
    assert_eq!(h.host.calls(), Vec::<String>::new());
}

/// An unpublish naming the volume's own staging path is refused, and the staging stays (a
/// seventy-sixth fresh review's F1: it was unmounted under a live publication).
#[test]
fn an_unpublish_of_the_volumes_own_staging_path_touches_nothing() {
    let (h, _) = published_at_p1(true);
    let staging = h.staging(VOL);
    let cmd = UnpublishCommand {
        volume: VolumeId::parse(VOL).unwrap(),
        target: staging.clone(),
    };
    let e = crate::node::unpublish::unpublish(&h.ctx, &cmd).expect_err("the staging unpublished");
    assert!(matches!(e, Error::PathOfAnotherVolume { .. }), "{e}");
    assert_eq!(h.host.calls(), Vec::<String>::new());
    assert_eq!(h.host.mounts_at(staging.as_path()), 1);
}
