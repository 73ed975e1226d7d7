//! NodeGetVolumeStats and the volume condition over the double: usage at the staging path and at
//! a publication, each way the volume can go wrong named in the condition, and the paths a
//! volume is not at refused. Stats change nothing on the host. Root tests: `expand_stats`.

use super::*;
use crate::error::Error;
use crate::node::stats::{StatsCommand, Usage, VolumeStats, volume_stats};

fn stats(h: &Harness, volume: &str, path: RequestPath) -> Result<VolumeStats> {
    volume_stats(
        &h.ctx,
        &StatsCommand {
            volume: VolumeId::parse(volume).expect("id"),
            volume_path: path,
            staging: None,
        },
    )
}

fn device(h: &Harness, volume: &str) -> crate::DevNum {
    h.host
        .devnum(&h.dir.join("dev").join(format!("dev-{volume}")))
}

#[test]
fn a_healthy_volume_reports_its_usage_at_staging_and_at_a_publication() {
    let h = Harness::new();
    h.staged(VOL);
    h.published(VOL, "pod");
    let d = device(&h, VOL);
    h.host.state().health.used.insert(d, GIB / 4);
    for path in [h.staging(VOL), h.target("pod")] {
        let s = stats(&h, VOL, path).expect("stats");
        assert!(!s.condition.abnormal, "{:?}", s.condition);
        let Some(Usage::Filesystem { bytes, .. }) = s.usage else {
            panic!("{:?}", s.usage)
        };
        assert_eq!(
            (bytes.total, bytes.used, bytes.available),
            (GIB, GIB / 4, GIB * 3 / 4)
        );
    }
    let h = Harness::new();
    h.staged_block(VOL, AccessMode::SingleNodeWriter);
    let s = stats(&h, VOL, h.staging(VOL)).expect("block stats");
    assert_eq!(s.usage, Some(Usage::Block { total_bytes: GIB }));
    assert_eq!(h.host.calls(), Vec::<String>::new());
}

#[test]
fn each_problem_is_named_in_the_condition_and_nothing_is_measured_wrongly() {
    type Break = fn(&Harness);
    let cases: [(&str, Break, &str, bool); 6] = [
        (
            "unmounted",
            |h| drop(h.host.state().mounts.remove(h.staging(VOL).as_path())),
            "no longer mounted at its staging path",
            false,
        ),
        (
            "covered",
            |h| {
                let foreign =
                    crate::double::host::mount_facts(crate::DevNum::new(8, 42), "ext4", false);
                let at = h.staging(VOL).as_path().to_path_buf();
                h.host.state().mounts.entry(at).or_default().push(foreign);
            },
            "something was mounted over it",
            false,
        ),
        (
            "detached",
            |h| {
                let d = device(h, VOL);
                h.host.state().device_bytes.insert(d, 0);
            },
            "has disappeared",
            true,
        ),
        (
            "failing",
            |h| {
                let d = device(h, VOL);
                h.host.state().health.reads.insert(d, "EIO");
            },
            "I/O error",
            true,
        ),
        (
            "hanging",
            |h| {
                let d = device(h, VOL);
                h.host.state().health.reads.insert(d, "hang");
            },
            "the device is hanging",
            true,
        ),
        (
            "remounted read-only after errors",
            |h| {
                let at = h.staging(VOL).as_path().to_path_buf();
                let mut s = h.host.state();
                let top = s
                    .mounts
                    .get_mut(&at)
                    .and_then(|m| m.last_mut())
                    .expect("mount");
                top.super_read_only = true;
            },
            "the kernel remounted it after errors",
            true,
        ),
    ];
    for (what, break_it, says, measured) in cases {
        let h = Harness::new();
        h.staged(VOL);
        break_it(&h);
        let s = stats(&h, VOL, h.staging(VOL)).expect(what);
        assert!(s.condition.abnormal, "{what}: {:?}", s.condition);
        assert!(
            s.condition.message.contains(says),
            "{what}: {}",
            s.condition.message
        );
        // Usage is measured where the volume's own filesystem is mounted, and only there.
        assert_eq!(s.usage.is_some(), measured, "{what}");
        assert_eq!(h.host.calls(), Vec::<String>::new(), "{what}");
    }
}

#[test]
fn paths_the_volume_is_not_at_are_not_found() {
    let h = Harness::new();
    h.staged(VOL);
    h.staged("vol-b");
    h.published("vol-b", "pod-b");
    let e = stats(&h, VOL, h.target("pod-b")).expect_err("vol-b's publication");
    assert!(matches!(e, Error::PathNotFound { .. }), "{e:?}");
    let e = stats(&h, "vol-x", h.staging(VOL)).expect_err("never staged");
    assert!(matches!(e, Error::PathNotFound { .. }), "{e:?}");
    let mut cmd = StatsCommand {
        volume: VolumeId::parse(VOL).expect("id"),
        volume_path: h.staging(VOL),
        staging: Some(h.staging("vol-b")),
    };
    let e = volume_stats(&h.ctx, &cmd).expect_err("another staging path");
    assert!(matches!(e, Error::PathNotFound { .. }), "{e:?}");
    cmd.staging = None;
    volume_stats(&h.ctx, &cmd).expect("its own");
}

#[test]
fn a_stage_not_finished_reports_abnormal_without_usage() {
    let h = Harness::new();
    h.staged(VOL);
    use crate::ledger::Ledger;
    let mut staged = h.ledger.staged(VOL).expect("read").expect("record");
    staged.progress = crate::records::Progress::InProgress;
    let write: crate::ledger::Changes = Box::new(|w| w.put_staged(&staged));
    h.ledger
        .write(crate::records::Durability::Immediate, write)
        .expect("write");
    let s = stats(&h, VOL, h.staging(VOL)).expect("stats");
    assert!(s.condition.abnormal && s.usage.is_none(), "{s:?}");
    assert!(
        s.condition.message.contains("has not completed"),
        "{}",
        s.condition.message
    );
}

#[test]
fn a_block_publication_is_measured_by_its_device() {
    let h = Harness::new();
    h.staged_block(VOL, AccessMode::SingleNodeWriter);
    h.publish(&h.publish_cmd(VOL, "pod", block(AccessMode::SingleNodeWriter)))
        .expect("publish");
    let s = stats(&h, VOL, h.target("pod")).expect("stats");
    assert!(!s.condition.abnormal, "{:?}", s.condition);
    assert_eq!(s.usage, Some(Usage::Block { total_bytes: GIB }));
}

#[test]
fn a_block_publication_bound_over_is_abnormal() {
    let h = Harness::new();
    h.staged_block(VOL, AccessMode::SingleNodeWriter);
    h.publish(&h.publish_cmd(VOL, "pod", block(AccessMode::SingleNodeWriter)))
        .expect("publish");
    // Another device's node bound over the target behind the agent's back.
    let mut other = crate::double::host::mount_facts(crate::DevNum::new(0, 5), "devtmpfs", false);
    other.node.kind = crate::seam::FileKind::BlockDevice;
    other.node.rdev = crate::DevNum::new(259, 77);
    let at = h.target("pod").as_path().to_path_buf();
    h.host.state().mounts.entry(at).or_default().push(other);
    let s = stats(&h, VOL, h.target("pod")).expect("stats");
    assert!(s.condition.abnormal, "{:?}", s.condition);
    assert!(
        s.condition.message.contains("behind the agent's back"),
        "{}",
        s.condition.message
    );
}

#[test]
fn a_publication_unmounted_behind_the_agents_back_is_named_and_not_measured() {
    let h = Harness::new();
    h.staged(VOL);
    h.published(VOL, "pod");
    h.host.state().mounts.remove(h.target("pod").as_path());
    let s = stats(&h, VOL, h.target("pod")).expect("stats");
    assert!(s.condition.abnormal && s.usage.is_none(), "{s:?}");
    assert!(
        s.condition.message.contains("restart it"),
        "{}",
        s.condition.message
    );
    // The staging path still measures the volume.
    let s = stats(&h, VOL, h.staging(VOL)).expect("stats at staging");
    assert!(!s.condition.abnormal && s.usage.is_some(), "{s:?}");
}

#[test]
fn a_device_that_is_no_longer_the_volume_is_named_in_the_condition() {
    let h = Harness::new();
    h.staged(VOL);
    let d = device(&h, VOL);
    h.backend
        .moved
        .lock()
        .expect("moved")
        .insert(d, "vol-other".into());
    let s = stats(&h, VOL, h.staging(VOL)).expect("stats");
    assert!(s.condition.abnormal, "{:?}", s.condition);
    assert!(
        s.condition.message.contains("no longer carries volume"),
        "{}",
        s.condition.message
    );
}

#[test]
fn a_block_volumes_device_gone_is_abnormal_and_unmeasured() {
    let h = Harness::new();
    h.staged_block(VOL, AccessMode::SingleNodeWriter);
    let d = device(&h, VOL);
    h.host.state().device_bytes.insert(d, 0);
    let s = stats(&h, VOL, h.staging(VOL)).expect("stats");
    assert!(s.condition.abnormal && s.usage.is_none(), "{s:?}");
    assert!(
        s.condition.message.contains("has disappeared"),
        "{}",
        s.condition.message
    );
}

#[test]
fn the_staging_path_named_with_its_own_staging_is_measured() {
    let h = Harness::new();
    h.staged(VOL);
    let s = volume_stats(
        &h.ctx,
        &StatsCommand {
            volume: VolumeId::parse(VOL).expect("id"),
            volume_path: h.staging(VOL),
            staging: Some(h.staging(VOL)),
        },
    )
    .expect("stats");
    assert!(!s.condition.abnormal && s.usage.is_some(), "{s:?}");
}

#[test]
fn stats_change_nothing_on_the_host_or_in_the_journal() {
    let h = Harness::new();
    h.staged(VOL);
    h.published(VOL, "pod");
    let lines = h.journal(VOL).len();
    for path in [h.staging(VOL), h.target("pod")] {
        stats(&h, VOL, path).expect("stats");
    }
    h.assert_nothing_done(VOL, lines);
}

/// kubelet asks a block volume's stats at its own bind of the publication, which no record
/// names: a bind of the volume's device there is the volume's.
#[test]
fn a_block_volume_is_measured_at_a_bind_of_its_device_no_record_names() {
    let h = Harness::new();
    h.staged_block(VOL, AccessMode::SingleNodeWriter);
    h.publish(&h.publish_cmd(VOL, "pod", block(AccessMode::SingleNodeWriter)))
        .expect("publish");
    let kubelets = h.target("kubelet-bind").as_path().to_path_buf();
    std::fs::create_dir_all(kubelets.parent().expect("parent")).expect("dir");
    std::fs::write(&kubelets, b"").expect("file");
    let top = h.host.state().mounts[h.target("pod").as_path()].clone();
    h.host.state().mounts.insert(kubelets, top);
    let s = stats(&h, VOL, h.target("kubelet-bind")).expect("stats at kubelet's bind");
    assert_eq!(s.usage, Some(Usage::Block { total_bytes: GIB }));
    // Another device's bind there is not the volume.
    let mut other = crate::double::host::mount_facts(crate::DevNum::new(0, 5), "devtmpfs", false);
    other.node.kind = crate::seam::FileKind::BlockDevice;
    other.node.rdev = crate::DevNum::new(259, 99);
    let at = h.target("kubelet-bind").as_path().to_path_buf();
    h.host.state().mounts.insert(at, vec![other]);
    let e = stats(&h, VOL, h.target("kubelet-bind")).expect_err("another device");
    assert!(matches!(e, Error::PathNotFound { .. }), "{e:?}");
}
