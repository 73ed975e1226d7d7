//! The same bytes under another number (`node::views`): a loop device laid over the volume's
//! device, or over the same file, mounted or bound elsewhere, refuses every door that would take
//! or hand out the device, and nothing is done to the host; the volume's own read-only devices
//! are its own. Root tests: `node_local::siblings`.

use super::*;
use crate::error::Error;
use crate::ledger::Ledger;
use crate::node::host::Under;

/// A device laid over `volume`'s, mounted (as a filesystem, or its node bound) somewhere else.
fn used_view(h: &Harness, volume: &str, bound: bool) -> crate::DevNum {
    let view = h.host.add_device("dev-view", GIB);
    let view = h.host.devnum(&view);
    let under = h
        .host
        .devnum(&h.dir.join("dev").join(format!("dev-{volume}")));
    let mut s = h.host.state();
    s.lies_on.insert(view, vec![Under::Device(under)]);
    let mut facts = crate::double::host::mount_facts(view, "ext4", false);
    if bound {
        facts = crate::double::host::mount_facts(crate::DevNum::new(0, 5), "devtmpfs", false);
        facts.node.kind = crate::seam::FileKind::BlockDevice;
        facts.node.rdev = view;
    }
    s.mounts.insert(h.dir.join("elsewhere"), vec![facts]);
    view
}

/// The views' refusal; or, for a view bound raw or laid over the device, the raw-use one a
/// first take asks before the views (`HostOps::raw_use`).
fn in_use_elsewhere(e: &Error) -> bool {
    matches!(
        e,
        Error::BytesInUseElsewhere { .. } | Error::DeviceStillBound { .. }
    )
}

#[test]
fn a_stage_is_refused_while_another_view_of_the_bytes_is_used() {
    for (bound, capability) in [
        (false, mount(AccessMode::SingleNodeWriter)),
        (true, mount(AccessMode::SingleNodeWriter)),
        (false, block(AccessMode::SingleNodeWriter)),
        (true, block(AccessMode::SingleNodeWriter)),
    ] {
        let h = Harness::new();
        h.attach(VOL);
        used_view(&h, VOL, bound);
        let e = h
            .stage(&h.stage_cmd(VOL, capability))
            .expect_err("staged while its bytes are used elsewhere");
        assert!(in_use_elsewhere(&e), "{e}");
        assert_eq!(h.host.calls(), Vec::<String>::new());
        assert!(h.ledger.staged(VOL).expect("read").is_none());
    }
}

#[test]
fn a_raw_block_publish_is_refused_once_another_view_is_used() {
    let h = Harness::new();
    h.staged_block(VOL, AccessMode::SingleNodeWriter);
    used_view(&h, VOL, false);
    let cmd = h.publish_cmd(VOL, "pod", block(AccessMode::SingleNodeWriter));
    let e = h
        .publish(&cmd)
        .expect_err("published raw under a mounted view");
    assert!(in_use_elsewhere(&e), "{e}");
    assert_eq!(h.host.calls(), Vec::<String>::new());
}

#[test]
fn the_volumes_own_read_only_device_is_no_other_use() {
    let h = Harness::new();
    h.staged_block(VOL, AccessMode::MultiNodeReaderOnly);
    let mut ro = h.publish_cmd(VOL, "pod-ro", block(AccessMode::MultiNodeReaderOnly));
    ro.readonly = true;
    h.publish(&ro).expect("read-only publish");
    // Its read-only device is bound at pod-ro; a second publication is the volume's own use.
    let mut again = h.publish_cmd(VOL, "pod-2", block(AccessMode::MultiNodeReaderOnly));
    again.readonly = true;
    h.publish(&again).expect("a second read-only publication");
}

#[test]
fn a_device_named_like_the_volumes_read_only_device_is_not_its_own() {
    let h = Harness::new();
    h.staged_block(VOL, AccessMode::MultiNodeReaderOnly);
    let mut ro = h.publish_cmd(VOL, "pod-ro", block(AccessMode::MultiNodeReaderOnly));
    ro.readonly = true;
    h.publish(&ro).expect("read-only publish");
    // A writable device over the same bytes, given the read-only device's name, bound elsewhere.
    let view = used_view(&h, VOL, true);
    let tag = h.ctx.agent_tag.tag(VOL, h.target("pod-ro").as_path());
    h.host.state().ro_tags.insert(view, tag);
    let e = h
        .publish(&h.publish_cmd(VOL, "pod-rw", block(AccessMode::MultiNodeReaderOnly)))
        .expect_err("a name made a foreign writable device the volume's own");
    assert!(in_use_elsewhere(&e), "{e}");
}

/// The device itself bound raw elsewhere (an operator's bind of its node, or a raw block
/// publication a `recover --reset` forgot): the kernel's exclusive claim shows nothing, and a
/// first stage of any volume, filesystem or raw, is refused with nothing done.
#[test]
fn a_first_stage_refuses_a_device_bound_raw_elsewhere() {
    for capability in [
        mount(AccessMode::SingleNodeWriter),
        block(AccessMode::SingleNodeWriter),
    ] {
        let h = Harness::new();
        h.attach(VOL);
        h.bind_node_elsewhere(VOL);
        let e = h
            .stage(&h.stage_cmd(VOL, capability))
            .expect_err("staged a device bound raw elsewhere");
        assert!(matches!(e, Error::DeviceStillBound { .. }), "{e}");
        assert_eq!(h.host.calls(), Vec::<String>::new());
        assert!(h.ledger.staged(VOL).expect("read").is_none());
    }
}

/// A filesystem staging has no binds of its own: its re-stage, with the record there and its
/// mount gone, fsck'd and mounted a device bound elsewhere (a thirty-second fresh review's F1).
#[test]
fn a_filesystem_re_stage_refuses_a_device_bound_raw_elsewhere() {
    let h = Harness::new();
    h.attach(VOL);
    let cmd = h.stage_cmd(VOL, mount(AccessMode::SingleNodeWriter));
    h.stage(&cmd).expect("the first stage");
    h.host.state().mounts.clear();
    h.bind_node_elsewhere(VOL);
    h.host.state().calls.clear();
    let e = h.stage(&cmd).expect_err("re-staged under a raw bind");
    assert!(matches!(e, Error::DeviceStillBound { .. }), "{e}");
    assert_eq!(h.host.calls(), Vec::<String>::new());
}

/// A bind of the device's node made while the stage runs (during mkfs, after its first checks):
/// the stage's own mount comes down again and the stage is refused (the thirty-second review's
/// F2).
#[test]
fn a_bind_made_during_the_stage_takes_its_mount_down() {
    let h = Harness::new();
    h.attach(VOL);
    let elsewhere = h.dir.join("elsewhere");
    h.host
        .fail("bind_during_mkfs", &elsewhere.display().to_string());
    let cmd = h.stage_cmd(VOL, mount(AccessMode::SingleNodeWriter));
    let e = h
        .stage(&cmd)
        .expect_err("staged with a bind made during mkfs");
    assert!(matches!(e, Error::DeviceStillBound { .. }), "{e}");
    let mounts: Vec<_> = (h.host.state().mounts.iter())
        .filter(|(_, stack)| !stack.is_empty())
        .map(|(at, _)| at.clone())
        .collect();
    assert_eq!(mounts, vec![elsewhere], "the stage's mount stayed");
}
