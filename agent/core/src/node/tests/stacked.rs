//! A device built on another volume's bytes is that volume's (`stacking`): a loop device laid
//! over a volume's device or over a file in its filesystem, a mapper built on it. Every door's
//! first take walks the stack both ways; the root tests are `node_local::stacked`.

use super::*;
use crate::error::Error;
use crate::node::host::Under;
use crate::request::AccessMode;

/// `on`'s device lies on `under`'s.
fn lay(h: &Harness, on: &str, under: Under) {
    let d = h.host.devnum(&h.attach(on));
    h.host.state().lies_on.insert(d, vec![under]);
}

fn device_of(h: &Harness, volume: &str) -> crate::DevNum {
    h.host
        .devnum(&h.dir.join("dev").join(format!("dev-{volume}")))
}

#[test]
fn a_device_laid_over_a_staged_volumes_device_is_that_volumes() {
    let h = Harness::new();
    h.staged("vol-a");
    lay(&h, "vol-b", Under::Device(device_of(&h, "vol-a")));
    let e = h
        .stage(&h.stage_cmd("vol-b", mount(AccessMode::SingleNodeWriter)))
        .expect_err("vol-b is vol-a's bytes");
    assert!(
        matches!(&e, Error::DeviceClaimed { owner, .. } if owner == "vol-a"),
        "{e}"
    );
    assert_eq!(h.host.calls(), Vec::<String>::new());
}

#[test]
fn a_volume_whose_bytes_another_volumes_device_is_built_on_is_refused() {
    let h = Harness::new();
    h.attach("vol-a");
    lay(&h, "vol-b", Under::Device(device_of(&h, "vol-a")));
    // Two disks without identity (EBS with --allow-unverified-devices): known by numbers only.
    let both = [device_of(&h, "vol-a"), device_of(&h, "vol-b")];
    h.host.state().unverified.extend(both);
    h.stage(&h.stage_cmd("vol-b", mount(AccessMode::SingleNodeWriter)))
        .expect("vol-b stages first");
    h.host.state().calls.clear();
    let e = h
        .stage(&h.stage_cmd("vol-a", mount(AccessMode::SingleNodeWriter)))
        .expect_err("vol-b's device is built on vol-a's");
    assert!(
        matches!(&e, Error::DeviceClaimed { owner, .. } if owner == "vol-b"),
        "{e}"
    );
    assert_eq!(h.host.calls(), Vec::<String>::new());
}

#[test]
fn a_stack_that_cannot_be_told_is_refused_and_a_plain_one_is_not() {
    let h = Harness::new();
    lay(
        &h,
        "vol-b",
        Under::Unknown("backing file lies on overlay".into()),
    );
    let e = h
        .stage(&h.stage_cmd("vol-b", mount(AccessMode::SingleNodeWriter)))
        .expect_err("indistinct");
    assert!(matches!(e, Error::IndistinctDevice { .. }), "{e}");
    // A device laid over one no volume records is nobody else's.
    let h = Harness::new();
    h.attach("vol-a");
    lay(&h, "vol-b", Under::Device(device_of(&h, "vol-a")));
    h.stage(&h.stage_cmd("vol-b", mount(AccessMode::SingleNodeWriter)))
        .expect("stage");
}

#[test]
fn a_volume_a_mapper_is_built_on_is_that_mappers_volume() {
    let h = Harness::new();
    h.staged("vol-m");
    h.attach("vol-a");
    let (a, m) = (device_of(&h, "vol-a"), device_of(&h, "vol-m"));
    h.host.state().holders.insert(a, vec![m]);
    let e = h
        .stage(&h.stage_cmd("vol-a", mount(AccessMode::SingleNodeWriter)))
        .expect_err("vol-m is built on vol-a");
    assert!(
        matches!(&e, Error::DeviceClaimed { owner, .. } if owner == "vol-m"),
        "{e}"
    );
}

#[test]
fn identity_less_loop_devices_over_one_file_are_one_device() {
    let h = Harness::new();
    h.attach("vol-a");
    h.attach("vol-b");
    let (a, b) = (device_of(&h, "vol-a"), device_of(&h, "vol-b"));
    {
        let mut s = h.host.state();
        s.unverified.extend([a, b]);
        s.loop_files.insert(a, (64, 7));
        s.loop_files.insert(b, (64, 7));
    }
    h.stage(&h.stage_cmd("vol-a", mount(AccessMode::SingleNodeWriter)))
        .expect("vol-a");
    h.host.state().calls.clear();
    let e = h
        .stage(&h.stage_cmd("vol-b", block(AccessMode::SingleNodeWriter)))
        .expect_err("one file, two loop devices");
    assert!(
        matches!(&e, Error::DeviceClaimed { owner, .. } if owner == "vol-a"),
        "{e}"
    );
    assert_eq!(h.host.calls(), Vec::<String>::new());
}

/// Two agents with state directories of their own (a nineteenth and a twentieth fresh review's
/// F1): a device another agent named as its own, one whose backing file lies in another agent's
/// state directory (whatever its name: anyone who opens a loop device may rename it), or one laid
/// on either, is refused before the host is touched; this agent's own names and an operator's
/// (a file's path) are not.
#[test]
fn a_device_another_agent_made_is_never_taken() {
    use crate::node::host::{LoopOrigin, Place};
    use crate::node::ro_tag::AgentTag;
    let theirs = AgentTag::new(2, std::path::Path::new("/var/lib/other/state.redb"));
    let ours = AgentTag::new(1, std::path::Path::new("/x"));
    let named = |name: String| LoopOrigin {
        name,
        state_dir: None,
        file_links: 1,
    };
    let their_dir = LoopOrigin {
        name: String::new(),
        state_dir: Some(Place {
            dev: crate::DevNum::new(8, 1),
            ino: 4242,
        }),
        file_links: 1,
    };
    for (on_itself, origin) in [
        (true, named(theirs.attached_tag("vol-t"))),
        (false, named(theirs.attached_tag("vol-t"))),
        (
            true,
            named(theirs.tag("vol-t", std::path::Path::new("/pods/p/dev"))),
        ),
        (true, their_dir.clone()),
        (false, their_dir),
    ] {
        let h = Harness::new();
        h.attach("vol-a");
        lay(&h, "vol-b", Under::Device(device_of(&h, "vol-a")));
        let at = device_of(&h, if on_itself { "vol-b" } else { "vol-a" });
        h.host.state().loop_origins.insert(at, origin.clone());
        h.host.state().calls.clear();
        let e = h
            .stage(&h.stage_cmd("vol-b", mount(AccessMode::SingleNodeWriter)))
            .expect_err(&format!("{origin:?}"));
        assert!(matches!(&e, Error::AnotherAgentsDevice { .. }), "{e}");
        assert_eq!(h.host.calls(), Vec::<String>::new());
    }
    for name in [
        ours.attached_tag("vol-b"),
        "/var/lib/x/volumes/b.img".into(),
    ] {
        let h = Harness::new();
        let d = h.host.devnum(&h.attach("vol-b"));
        h.host.state().loop_origins.insert(d, named(name));
        h.stage(&h.stage_cmd("vol-b", mount(AccessMode::SingleNodeWriter)))
            .expect("its own device, or an operator's");
    }
}

#[test]
fn a_stack_deeper_than_the_walk_goes_is_refused() {
    let h = Harness::new();
    let mut under = h.host.devnum(&h.attach("vol-b"));
    for n in 0..9 {
        let d = h.host.devnum(&h.attach(&format!("level-{n}")));
        h.host.state().lies_on.insert(under, vec![Under::Device(d)]);
        under = d;
    }
    let e = h
        .stage(&h.stage_cmd("vol-b", mount(AccessMode::SingleNodeWriter)))
        .expect_err("nine levels");
    assert!(matches!(e, Error::IndistinctDevice { .. }), "{e}");
    assert_eq!(h.host.calls(), Vec::<String>::new());
}

#[test]
fn a_level_that_cannot_be_told_anywhere_down_the_stack_is_refused() {
    let h = Harness::new();
    h.attach("vol-m");
    lay(&h, "vol-b", Under::Device(device_of(&h, "vol-m")));
    let m = device_of(&h, "vol-m");
    h.host
        .state()
        .lies_on
        .insert(m, vec![Under::Unknown("backing file lies on fuse".into())]);
    let e = h
        .stage(&h.stage_cmd("vol-b", mount(AccessMode::SingleNodeWriter)))
        .expect_err("two levels down");
    assert!(matches!(e, Error::IndistinctDevice { .. }), "{e}");
}

#[test]
fn a_device_laid_over_one_the_loop_controller_attached_is_that_volumes() {
    use crate::records::{ClaimDoor, DeviceClaim, DeviceIdentity, claim_key};
    let h = Harness::new();
    h.attach("vol-l");
    lay(&h, "vol-b", Under::Device(device_of(&h, "vol-l")));
    let identity = DeviceIdentity::NvmeSerial {
        serial: "vol-l".into(),
    };
    let key = claim_key(ClaimDoor::Controller, &identity, None).expect("key");
    let claim = DeviceClaim {
        volume_id: "vol-l".into(),
        door: ClaimDoor::Controller,
        identity,
        at_unix_ms: 0,
        acts_for: None,
    };
    let attach: crate::ledger::Changes = Box::new(move |w| w.put_claim(&key, &claim));
    crate::ledger::Ledger::write(&*h.ledger, crate::records::Durability::Immediate, attach)
        .expect("attach");
    let e = h
        .stage(&h.stage_cmd("vol-b", mount(AccessMode::SingleNodeWriter)))
        .expect_err("laid over an attached volume");
    assert!(
        matches!(&e, Error::DeviceClaimed { owner, .. } if owner == "vol-l"),
        "{e}"
    );
    assert_eq!(h.host.calls(), Vec::<String>::new());
}

#[test]
fn a_device_laid_over_a_raw_staged_volumes_device_is_that_volumes() {
    let h = Harness::new();
    h.staged_block("vol-a", AccessMode::SingleNodeWriter);
    lay(&h, "vol-b", Under::Device(device_of(&h, "vol-a")));
    let e = h
        .stage(&h.stage_cmd("vol-b", block(AccessMode::SingleNodeWriter)))
        .expect_err("raw vol-a's bytes");
    assert!(
        matches!(&e, Error::DeviceClaimed { owner, .. } if owner == "vol-a"),
        "{e}"
    );
}

#[test]
fn once_the_volume_under_it_is_unstaged_the_laid_device_may_be_taken() {
    let h = Harness::new();
    h.staged("vol-a");
    lay(&h, "vol-b", Under::Device(device_of(&h, "vol-a")));
    h.unstage("vol-a").expect("unstage vol-a");
    h.stage(&h.stage_cmd("vol-b", mount(AccessMode::SingleNodeWriter)))
        .expect("nobody holds vol-a's bytes now");
}

#[test]
fn the_walk_asks_the_host_no_change() {
    let h = Harness::new();
    h.attach("vol-a");
    lay(&h, "vol-b", Under::Device(device_of(&h, "vol-a")));
    h.host.state().calls.clear();
    h.stage(&h.stage_cmd("vol-b", block(AccessMode::SingleNodeWriter)))
        .expect("stage");
    // A raw block stage changes nothing on the host; the walk added no call either.
    assert_eq!(h.host.calls(), Vec::<String>::new());
}

/// A loop device over a file with a second name (a hard link of another agent's volume file
/// outside its state directory: a twenty-third fresh review's F1) cannot be told, and is refused
/// before the host is touched.
#[test]
fn a_device_over_a_file_with_another_name_is_refused() {
    use crate::node::host::LoopOrigin;
    let h = Harness::new();
    let d = h.host.devnum(&h.attach("vol-b"));
    let origin = LoopOrigin {
        name: "/elsewhere/hl.img".into(),
        state_dir: None,
        file_links: 2,
    };
    h.host.state().loop_origins.insert(d, origin);
    let e = h
        .stage(&h.stage_cmd("vol-b", mount(AccessMode::SingleNodeWriter)))
        .expect_err("two names");
    assert!(matches!(e, Error::IndistinctDevice { .. }), "{e}");
    assert_eq!(h.host.calls(), Vec::<String>::new());
}
