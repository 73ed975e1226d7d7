//! NodeExpandVolume over the double: what it refuses (and that a refusal changes nothing), what
//! it grows, and what it answers. Root tests: `expand_stats`.

use super::*;
use crate::error::{CapacityError, Error};
use crate::node::expand::{ExpandCommand, expand};

fn cmd(h: &Harness, volume: &str, path: RequestPath, required: u64) -> ExpandCommand {
    ExpandCommand {
        volume: VolumeId::parse(volume).expect("id"),
        volume_path: path,
        staging: Some(h.staging(volume)),
        required_bytes: required,
        limit_bytes: 0,
        capability: None,
    }
}

/// The volume's device grows to `bytes` (ControllerExpandVolume ran).
fn grow_device(h: &Harness, volume: &str, bytes: u64) {
    let d = h
        .host
        .devnum(&h.dir.join("dev").join(format!("dev-{volume}")));
    h.host.state().device_bytes.insert(d, bytes);
}

#[test]
fn a_mounted_volume_grows_online_and_the_answer_is_the_device_size() {
    let h = Harness::new();
    h.staged(VOL);
    grow_device(&h, VOL, 2 * GIB);
    let bytes = expand(&h.ctx, &cmd(&h, VOL, h.staging(VOL), 2 * GIB)).expect("expand");
    assert_eq!(bytes, 2 * GIB);
    assert_eq!(h.host.calls(), strings(&["grow ext4 dev-vol-a mounted"]));
    let lines = h.journal(VOL);
    assert!(
        lines.ends_with(&strings(&["expand/expanded:done"])),
        "{lines:?}"
    );
    // Grown already: a retry answers the same and runs no tool.
    h.host.state().calls.clear();
    assert_eq!(
        expand(&h.ctx, &cmd(&h, VOL, h.staging(VOL), 0)).expect("again"),
        2 * GIB
    );
    assert_eq!(h.host.calls(), Vec::<String>::new());
}

#[test]
fn a_block_volume_answers_its_device_size_and_grows_nothing() {
    let h = Harness::new();
    h.staged_block(VOL, AccessMode::SingleNodeWriter);
    grow_device(&h, VOL, 3 * GIB);
    let bytes = expand(&h.ctx, &cmd(&h, VOL, h.staging(VOL), 0)).expect("expand");
    assert_eq!(bytes, 3 * GIB);
    assert_eq!(h.host.calls(), Vec::<String>::new());
}

#[test]
fn refusals_change_nothing() {
    let h = Harness::new();
    h.staged(VOL);
    h.staged("vol-b");
    h.published("vol-b", "pod-b");
    let lines = h.journal(VOL).len();
    type Case = (
        &'static str,
        Box<dyn Fn(&Harness) -> ExpandCommand>,
        fn(&Error) -> bool,
    );
    let cases: Vec<Case> = vec![
        (
            "required above limit",
            Box::new(|h| {
                let mut c = cmd(h, VOL, h.staging(VOL), 2 * GIB);
                c.limit_bytes = GIB;
                c
            }),
            |e| matches!(e, Error::Capacity(CapacityError::RequiredOverLimit { .. })),
        ),
        (
            "the device has not grown yet",
            Box::new(|h| cmd(h, VOL, h.staging(VOL), 2 * GIB)),
            |e| {
                matches!(e, Error::Capacity(CapacityError::DeviceNotGrown { .. }))
                    && e.to_string().contains("fewer than the required")
            },
        ),
        (
            "the device is above the limit",
            Box::new(|h| {
                let mut c = cmd(h, VOL, h.staging(VOL), 0);
                c.limit_bytes = GIB / 2;
                c
            }),
            |e| {
                matches!(e, Error::Capacity(CapacityError::DeviceOverLimit { .. }))
                    && e.to_string().contains("more than limit_bytes")
            },
        ),
        (
            "a volume never staged",
            Box::new(|h| cmd(h, "vol-x", h.staging(VOL), 0)),
            |e| matches!(e, Error::PathNotFound { .. }),
        ),
        (
            "another volume's publication",
            Box::new(|h| cmd(h, VOL, h.target("pod-b"), 0)),
            |e| matches!(e, Error::PathNotFound { .. }),
        ),
        (
            "another staging path",
            Box::new(|h| {
                let mut c = cmd(h, VOL, h.staging(VOL), 0);
                c.staging = Some(h.staging("vol-b"));
                c
            }),
            |e| matches!(e, Error::PathNotFound { .. }),
        ),
        (
            "a block capability for a mounted volume",
            Box::new(|h| {
                let mut c = cmd(h, VOL, h.staging(VOL), 0);
                c.capability = Some(block(AccessMode::SingleNodeWriter));
                c
            }),
            |e| matches!(e, Error::Invalid(_)),
        ),
    ];
    for (what, make, expected) in cases {
        let before = h.journal(VOL).len().max(lines);
        let e = expand(&h.ctx, &make(&h)).expect_err(what);
        assert!(expected(&e), "{what}: {e:?}");
        assert_eq!(h.host.calls(), Vec::<String>::new(), "{what}");
        // Asking the kernel for the device's size is all a size refusal did.
        let refresh = strings(&["expand/refresh_size:intent", "expand/refresh_size:done"]);
        let added = h.journal_from(VOL, before);
        assert!(added.is_empty() || added == refresh, "{what}: {added:?}");
    }
}

#[test]
fn a_staging_mount_gone_or_foreign_is_refused_before_any_tool() {
    let h = Harness::new();
    h.staged(VOL);
    grow_device(&h, VOL, 2 * GIB);
    let staging = h.staging(VOL).as_path().to_path_buf();
    h.host.state().mounts.remove(&staging);
    let e = expand(&h.ctx, &cmd(&h, VOL, h.staging(VOL), 0)).expect_err("not mounted");
    assert!(matches!(e, Error::StagingNotMounted { .. }), "{e:?}");
    let foreign = crate::double::host::mount_facts(crate::DevNum::new(8, 42), "ext4", false);
    h.host.state().mounts.insert(staging, vec![foreign]);
    let e = expand(&h.ctx, &cmd(&h, VOL, h.staging(VOL), 0)).expect_err("foreign");
    assert!(matches!(e, Error::StagingNotMounted { .. }), "{e:?}");
    assert!(
        !h.host.calls().iter().any(|c| c.starts_with("grow")),
        "{:?}",
        h.host.calls()
    );
}

#[test]
fn a_failed_grow_without_cap_sys_resource_names_the_capability() {
    let h = Harness::new();
    h.staged(VOL);
    grow_device(&h, VOL, 2 * GIB);
    h.host
        .state()
        .fail
        .insert("grow", "Permission denied".into());
    h.host.state().health.no_resource_cap = true;
    let e = expand(&h.ctx, &cmd(&h, VOL, h.staging(VOL), 0)).expect_err("grow fails");
    assert!(matches!(e, Error::GrowNeedsCapability { .. }), "{e:?}");
    h.host.state().health.no_resource_cap = false;
    let e = expand(&h.ctx, &cmd(&h, VOL, h.staging(VOL), 0)).expect_err("grow fails");
    assert!(matches!(e, Error::FsTool(_)), "{e:?}");
}

#[test]
fn a_read_only_block_publication_follows_the_resize_or_the_answer_says_why_not() {
    let h = Harness::new();
    h.staged_block(VOL, AccessMode::SingleNodeReaderOnly);
    let mut p = h.publish_cmd(VOL, "pod", block(AccessMode::SingleNodeReaderOnly));
    p.readonly = true;
    h.publish(&p).expect("publish read-only");
    grow_device(&h, VOL, 2 * GIB);
    h.host.state().fail.insert("set_capacity", "EBUSY".into());
    let e = expand(&h.ctx, &cmd(&h, VOL, h.staging(VOL), 0)).expect_err("did not follow");
    assert!(
        matches!(&e, Error::ReadOnlyDeviceDidNotFollow { .. })
            && e.to_string().contains("did not follow"),
        "{e:?}"
    );
    h.host.state().fail.remove("set_capacity");
    assert_eq!(
        expand(&h.ctx, &cmd(&h, VOL, h.staging(VOL), 0)).expect("follows"),
        2 * GIB
    );
    let s = h.host.state();
    let (ro, _) = s.read_only[0];
    assert_eq!(
        s.device_bytes[&ro],
        2 * GIB,
        "the workload's device kept the old size"
    );
}

#[test]
fn a_stage_not_finished_is_not_expanded() {
    let h = Harness::new();
    h.staged(VOL);
    let mut s = crate::ledger::Ledger::staged(&*h.ledger, VOL)
        .expect("read")
        .expect("staged");
    s.progress = crate::records::Progress::InProgress;
    let write: crate::ledger::Changes = Box::new(move |w| w.put_staged(&s));
    crate::ledger::Ledger::write(&*h.ledger, crate::records::Durability::Immediate, write)
        .expect("write");
    let e = expand(&h.ctx, &cmd(&h, VOL, h.staging(VOL), 0)).expect_err("unfinished");
    assert!(matches!(e, Error::StagingIncomplete { .. }), "{e:?}");
    assert_eq!(h.host.calls(), Vec::<String>::new());
}

#[test]
fn a_publication_is_a_path_the_volume_may_be_expanded_at_while_it_holds_the_volume() {
    let h = Harness::new();
    h.staged(VOL);
    h.published(VOL, "pod");
    grow_device(&h, VOL, 2 * GIB);
    assert_eq!(
        expand(&h.ctx, &cmd(&h, VOL, h.target("pod"), 0)).expect("at the publication"),
        2 * GIB
    );
    // The publication's mount gone behind the agent's back: not a path of the volume now.
    h.host.state().mounts.remove(h.target("pod").as_path());
    h.host.state().calls.clear();
    let e = expand(&h.ctx, &cmd(&h, VOL, h.target("pod"), 0)).expect_err("gone");
    assert!(matches!(e, Error::PathNotFound { .. }), "{e:?}");
    assert_eq!(h.host.calls(), Vec::<String>::new());
}

#[test]
fn a_volume_staged_read_only_or_remounted_read_only_is_not_grown() {
    let h = Harness::new();
    h.staged(VOL);
    grow_device(&h, VOL, 2 * GIB);
    {
        let mut s = h.host.state();
        let top = s
            .mounts
            .get_mut(h.staging(VOL).as_path())
            .and_then(|m| m.last_mut());
        top.expect("mount").super_read_only = true;
    }
    let e = expand(&h.ctx, &cmd(&h, VOL, h.staging(VOL), 0)).expect_err("read-only");
    assert!(matches!(e, Error::MountedReadOnly { .. }), "{e:?}");
    assert!(!h.host.calls().iter().any(|c| c.starts_with("grow")));
}

#[test]
fn a_device_that_is_no_longer_the_volume_is_refused_before_any_refresh() {
    let h = Harness::new();
    h.staged(VOL);
    // Another disk now answers at the device's name (a detach and a new attach in between).
    let d = h.host.devnum(&h.dir.join("dev").join(format!("dev-{VOL}")));
    h.backend
        .moved
        .lock()
        .expect("moved")
        .insert(d, "vol-other".into());
    let lines = h.journal(VOL).len();
    let e = expand(&h.ctx, &cmd(&h, VOL, h.staging(VOL), 0)).expect_err("not the volume");
    assert!(
        matches!(
            e,
            Error::NotTheVolumeAnyMore { .. } | Error::DeviceClaimed { .. }
        ),
        "{e:?}"
    );
    h.assert_nothing_done(VOL, lines);
}

#[test]
fn a_limit_equal_to_the_device_size_is_met() {
    let h = Harness::new();
    h.staged(VOL);
    grow_device(&h, VOL, 2 * GIB);
    let mut c = cmd(&h, VOL, h.staging(VOL), 2 * GIB);
    c.limit_bytes = 2 * GIB;
    assert_eq!(expand(&h.ctx, &c).expect("exactly the limit"), 2 * GIB);
}

#[test]
fn a_failed_grow_is_journaled_as_failed_and_the_retry_grows() {
    let h = Harness::new();
    h.staged(VOL);
    grow_device(&h, VOL, 2 * GIB);
    h.host
        .state()
        .fail
        .insert("grow", "resize2fs: out of memory".into());
    expand(&h.ctx, &cmd(&h, VOL, h.staging(VOL), 0)).expect_err("grow fails");
    let lines = h.journal(VOL);
    assert!(lines.iter().any(|l| l.ends_with(":failed")), "{lines:?}");
    h.host.state().fail.remove("grow");
    assert_eq!(
        expand(&h.ctx, &cmd(&h, VOL, h.staging(VOL), 0)).expect("retry"),
        2 * GIB
    );
    assert!(
        h.host.calls().iter().any(|c| c.starts_with("grow ext4")),
        "{:?}",
        h.host.calls()
    );
}

#[test]
fn a_block_publication_is_a_path_a_block_volume_is_expanded_at() {
    let h = Harness::new();
    h.staged_block(VOL, AccessMode::SingleNodeWriter);
    h.publish(&h.publish_cmd(VOL, "pod", block(AccessMode::SingleNodeWriter)))
        .expect("publish");
    grow_device(&h, VOL, 4 * GIB);
    let bytes = expand(&h.ctx, &cmd(&h, VOL, h.target("pod"), 0)).expect("at the publication");
    assert_eq!(bytes, 4 * GIB);
}

#[test]
fn a_mount_capability_for_a_block_volume_is_refused() {
    let h = Harness::new();
    h.staged_block(VOL, AccessMode::SingleNodeWriter);
    let mut c = cmd(&h, VOL, h.staging(VOL), 0);
    c.capability = Some(mount(AccessMode::SingleNodeWriter));
    let e = expand(&h.ctx, &c).expect_err("staged for block access");
    assert!(matches!(e, Error::Invalid(_)), "{e:?}");
    assert_eq!(h.host.calls(), Vec::<String>::new());
}
