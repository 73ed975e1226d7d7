//! NodeReclaimSpace (CSI-Addons) over the double: a staged filesystem is synced and trimmed
//! through its proven mount, with the usage before and after; a path the volume is not at, a
//! block volume and a read-only one are refused with nothing trimmed. Root tests: `reclaim`.

use super::*;
use crate::error::Error;
use crate::node::reclaim::{Measure, ReclaimCommand, ReclaimPath, Reclaimed, reclaim};

fn at(h: &Harness, volume: &str, path: ReclaimPath) -> Result<Reclaimed> {
    reclaim(
        &h.ctx,
        &ReclaimCommand {
            volume: VolumeId::parse(volume).expect("id"),
            path,
        },
    )
}

fn device(h: &Harness, volume: &str) -> crate::DevNum {
    h.host
        .devnum(&h.dir.join("dev").join(format!("dev-{volume}")))
}

#[test]
fn a_staged_filesystem_is_synced_then_trimmed_and_its_usage_reported() {
    let h = Harness::new();
    h.staged(VOL);
    h.published(VOL, "pod");
    let d = device(&h, VOL);
    for (path, name) in [
        (ReclaimPath::Staging(h.staging(VOL)), VOL),
        (ReclaimPath::Published(h.target("pod")), "mount"),
    ] {
        h.host.state().health.used.insert(d, GIB / 2);
        h.host.state().health.trims = GIB / 8;
        let r = at(&h, VOL, path).expect("reclaim");
        assert_eq!(r.measure, Measure::FilesystemUsed);
        assert_eq!(
            (r.pre_bytes, r.post_bytes, r.trimmed_bytes),
            (GIB / 2, GIB * 3 / 8, GIB / 8)
        );
        let calls = strings(&[&format!("syncfs {name}"), &format!("fitrim {name}")]);
        assert_eq!(h.host.calls(), calls);
        h.host.state().calls.clear();
    }
    let lines = h.journal(VOL);
    assert!(
        lines.ends_with(&strings(&["reclaim/reclaimed:done"])),
        "{lines:?}"
    );
}

#[test]
fn refusals_trim_nothing() {
    let h = Harness::new();
    h.staged(VOL);
    h.staged("vol-b");
    h.published("vol-b", "pod-b");
    h.staged_block("vol-c", AccessMode::SingleNodeWriter);
    type Case = (
        &'static str,
        &'static str,
        fn(&Harness) -> ReclaimPath,
        fn(&Error) -> bool,
    );
    let cases: [Case; 5] = [
        (
            "another volume's staging path",
            VOL,
            |h| ReclaimPath::Staging(h.staging("vol-b")),
            |e| matches!(e, Error::PathNotFound { .. }),
        ),
        (
            "another volume's publication",
            VOL,
            |h| ReclaimPath::Published(h.target("pod-b")),
            |e| matches!(e, Error::PathNotFound { .. }),
        ),
        (
            "a volume not staged here",
            "vol-x",
            |h| ReclaimPath::Staging(h.staging(VOL)),
            |e| matches!(e, Error::StagedVolumeNotFound { .. }),
        ),
        (
            "a block volume",
            "vol-c",
            |h| ReclaimPath::Staging(h.staging("vol-c")),
            |e| matches!(e, Error::ReclaimOfBlockVolume { .. }),
        ),
        (
            "a path nothing is mounted on",
            VOL,
            |h| ReclaimPath::Staging(h.staging(VOL)),
            |e| matches!(e, Error::PathNotFound { .. }),
        ),
    ];
    for (what, volume, path, expected) in cases {
        if what.starts_with("a path nothing") {
            h.host.state().mounts.remove(h.staging(VOL).as_path());
        }
        let e = at(&h, volume, path(&h)).expect_err(what);
        assert!(expected(&e), "{what}: {e:?}");
        assert_eq!(h.host.calls(), Vec::<String>::new(), "{what}");
    }
}

/// ext4's FITRIM does not look at the mount's read-only flag (a twentieth fresh review's F2):
/// a trim of a volume staged read-only discarded blocks another node's writer may have since
/// taken. Refused before the filesystem is asked anything.
#[test]
fn a_volume_staged_read_only_is_never_trimmed() {
    let h = Harness::new();
    h.staged(VOL);
    h.unstage(VOL).expect("unstage");
    h.stage(&h.stage_cmd(VOL, mount(AccessMode::SingleNodeReaderOnly)))
        .expect("stage read-only");
    h.host.state().calls.clear();
    let e = at(&h, VOL, ReclaimPath::Staging(h.staging(VOL))).expect_err("read-only");
    assert!(matches!(e, Error::ReadOnlyNoDiscard { .. }), "{e:?}");
    assert_eq!(h.host.calls(), Vec::<String>::new());
    // The same when the kernel remounted a read-write staging read-only after errors.
    let h = Harness::new();
    h.staged(VOL);
    {
        let mut s = h.host.state();
        let top = s
            .mounts
            .get_mut(h.staging(VOL).as_path())
            .and_then(|m| m.last_mut());
        top.expect("mount").super_read_only = true;
    }
    let e = at(&h, VOL, ReclaimPath::Staging(h.staging(VOL))).expect_err("remounted read-only");
    assert!(matches!(e, Error::ReadOnlyNoDiscard { .. }), "{e:?}");
    assert_eq!(h.host.calls(), Vec::<String>::new());
}

#[test]
fn a_filesystem_that_cannot_discard_is_unimplemented_after_the_sync() {
    for (errno, fits) in [
        (
            "EOPNOTSUPP",
            (|e: &Error| matches!(e, Error::DiscardUnsupported { .. })) as fn(&Error) -> bool,
        ),
        ("ENOTTY", |e| matches!(e, Error::TrimUnimplemented { .. })),
        ("EIO", |e| matches!(e, Error::Io { .. })),
    ] {
        let h = Harness::new();
        h.staged(VOL);
        h.host.state().health.trim = Some(errno);
        let e = at(&h, VOL, ReclaimPath::Staging(h.staging(VOL))).expect_err(errno);
        assert!(fits(&e), "{errno}: {e:?}");
        assert_eq!(
            h.host.calls(),
            strings(&["syncfs vol-a", "fitrim vol-a"]),
            "{errno}"
        );
        let lines = h.journal(VOL);
        assert!(
            lines.ends_with(&strings(&["reclaim/trim:intent", "reclaim/trim:failed"])),
            "{lines:?}"
        );
    }
}

#[test]
fn records_rebuilt_without_a_staging_path_still_reclaim_at_the_proven_mount() {
    let h = Harness::new();
    h.staged(VOL);
    let mut s = h.ledger.staged_record(VOL);
    s.staging_path = std::path::PathBuf::new();
    h.ledger.put(s);
    at(&h, VOL, ReclaimPath::Staging(h.staging(VOL))).expect("the mount decides");
    // A path where the volume is not mounted is still not found.
    let e = at(&h, VOL, ReclaimPath::Staging(h.staging("vol-b"))).expect_err("elsewhere");
    assert!(matches!(e, Error::PathNotFound { .. }), "{e:?}");
}

#[test]
fn a_publication_holding_something_else_is_not_the_volumes_path() {
    let h = Harness::new();
    h.staged(VOL);
    h.published(VOL, "pod");
    let foreign = crate::double::host::mount_facts(crate::DevNum::new(8, 42), "ext4", false);
    let at = h.target("pod").as_path().to_path_buf();
    h.host.state().mounts.entry(at).or_default().push(foreign);
    h.host.state().calls.clear();
    let e = at_path(&h, ReclaimPath::Published(h.target("pod")));
    assert!(matches!(e, Err(Error::PathNotFound { .. })), "{e:?}");
    assert_eq!(h.host.calls(), Vec::<String>::new());
}

#[test]
fn a_reclaim_journals_its_sync_and_trim_lazily_then_its_result() {
    let h = Harness::new();
    h.staged(VOL);
    let before = h.journal(VOL).len();
    at_path(&h, ReclaimPath::Staging(h.staging(VOL))).expect("reclaim");
    assert_eq!(
        h.journal_from(VOL, before),
        strings(&[
            "reclaim/sync:intent",
            "reclaim/sync:done",
            "reclaim/trim:intent",
            "reclaim/trim:done",
            "reclaim/reclaimed:done",
        ])
    );
}

fn at_path(h: &Harness, path: ReclaimPath) -> Result<Reclaimed> {
    at(h, VOL, path)
}
