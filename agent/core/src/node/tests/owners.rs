//! One device, one owner (`device_claim`): a door naming a device another id holds refuses and
//! touches nothing; the claim rides with the first intent; a format intent holds the device for
//! its volume alone (the property test over random calls is `owners_random`).

use super::*;
use crate::double::devices::serial;
use crate::error::Error;
use crate::ledger::Ledger;
use crate::records::{ClaimDoor, DeviceClaim, claim_key};
use crate::request::AccessMode;

fn node_key(of: &str) -> String {
    claim_key(ClaimDoor::Node, &serial(of), None).expect("key")
}

fn claimed(e: &Error) -> bool {
    matches!(e, Error::DeviceClaimed { .. })
}

#[test]
fn a_stage_claims_its_device_in_the_commit_of_its_first_intent() {
    let h = Harness::new();
    h.staged(VOL);
    let claims = h.ledger.claims();
    assert_eq!(
        claims.get(&node_key(VOL)).map(|c| c.volume_id.as_str()),
        Some(VOL)
    );
    // The stage's first durable intent was the format intent: the claim was in it (the double
    // records, with each call, the last line committed before it and whether it was durable).
    let h = Harness::new();
    h.attach(VOL);
    h.host.fail("mkfs", "scripted");
    h.stage(&h.stage_cmd(VOL, mount(AccessMode::SingleNodeWriter)))
        .expect_err("mkfs fails");
    assert!(h.ledger.claims().contains_key(&node_key(VOL)));
}

#[test]
fn a_handle_naming_a_staged_volumes_device_is_refused_and_nothing_is_done() {
    for access in [
        mount(AccessMode::SingleNodeWriter),
        block(AccessMode::SingleNodeWriter),
    ] {
        let h = Harness::new();
        h.attach(VOL);
        h.stage(&h.stage_cmd(VOL, access.clone())).expect("stage");
        h.host.state().calls.clear();
        let before = h.journal(VOL).len();
        for capability in [
            mount(AccessMode::MultiNodeMultiWriter),
            block(AccessMode::MultiNodeMultiWriter),
        ] {
            let e = stage_at(&h, &handle(VOL), "h", capability).expect_err("refused");
            assert!(claimed(&e), "{e}");
        }
        h.assert_nothing_done(VOL, before);
        assert!(
            h.journal(&handle(VOL)).is_empty() || h.ledger.staged(&handle(VOL)).unwrap().is_none()
        );
    }
}

#[test]
fn a_volume_naming_a_handles_device_is_refused() {
    let h = Harness::new();
    h.attach("vol-y");
    stage_at(
        &h,
        &handle("vol-y"),
        "h",
        mount(AccessMode::MultiNodeMultiWriter),
    )
    .expect("the handle stages first");
    h.host.state().calls.clear();
    let e = h
        .stage(&h.stage_cmd("vol-y", mount(AccessMode::SingleNodeWriter)))
        .expect_err("refused");
    assert!(claimed(&e), "{e}");
    assert_eq!(h.host.calls(), Vec::<String>::new());
}

#[test]
fn a_format_intent_holds_the_device_until_its_volume_lets_go() {
    let h = Harness::new();
    h.attach(VOL);
    h.host.fail("mkfs", "scripted");
    h.stage(&h.stage_cmd(VOL, mount(AccessMode::SingleNodeWriter)))
        .expect_err("mkfs fails");
    h.host.state().fail.clear();
    h.host.state().calls.clear();
    // The intent's volume alone may redo its mkfs: a handle writing raw would make the redo
    // format over its data.
    let e = stage_at(
        &h,
        &handle(VOL),
        "h",
        block(AccessMode::MultiNodeMultiWriter),
    )
    .expect_err("refused while the intent stands");
    assert!(claimed(&e), "{e}");
    assert_eq!(h.host.calls(), Vec::<String>::new());
    // NodeUnstageVolume of the volume lets go: the intent is void and the device free.
    h.unstage(VOL).expect("unstage");
    assert!(h.ledger.format(VOL).unwrap().is_none());
    stage_at(
        &h,
        &handle(VOL),
        "h",
        block(AccessMode::MultiNodeMultiWriter),
    )
    .expect("free now");
}

#[test]
fn the_loop_controllers_claim_refuses_a_handle_unless_it_acts_for_the_volume() {
    let h = Harness::new();
    h.attach("vol-l");
    let key = claim_key(ClaimDoor::Controller, &serial("vol-l"), None).expect("key");
    let claim = DeviceClaim {
        volume_id: "vol-l".into(),
        door: ClaimDoor::Controller,
        identity: serial("vol-l"),
        at_unix_ms: 0,
        acts_for: None,
    };
    h.ledger
        .write(
            crate::records::Durability::Immediate,
            Box::new(|w| w.put_claim(&key, &claim)),
        )
        .expect("attach");
    let e = stage_at(
        &h,
        &handle("vol-l"),
        "h",
        block(AccessMode::MultiNodeMultiWriter),
    )
    .expect_err("attached for another volume");
    assert!(claimed(&e), "{e}");
    let mut cmd = h.stage_cmd(VOL, block(AccessMode::MultiNodeMultiWriter));
    cmd.volume = VolumeId::parse(&handle("vol-l")).expect("id");
    cmd.staging = h.path("staging_target_path", "staging/h");
    cmd.publish_context
        .insert("volumeID".into(), "vol-l".into());
    h.stage(&cmd)
        .expect("a handle acting for the attached volume");
    // The volume itself: the node's claim is the handle's now.
    let e = h
        .stage(&h.stage_cmd("vol-l", block(AccessMode::SingleNodeWriter)))
        .expect_err("the handle holds it");
    assert!(claimed(&e), "{e}");
}

#[test]
fn a_mount_of_a_device_another_id_holds_is_never_this_ids() {
    // Records from before claims existed: vol-b's staging names vol-a's device.
    let h = Harness::new();
    h.staged(VOL);
    h.published(VOL, "p");
    let mut forged = h.ledger.staged(VOL).unwrap().expect("staged");
    forged.volume_id = "vol-b".into();
    forged.staging_path = h.staging("vol-b").as_path().to_path_buf();
    h.ledger
        .write(
            crate::records::Durability::Immediate,
            Box::new(|w| w.put_staged(&forged)),
        )
        .expect("forge");
    let _ = h.unpublish("vol-b", "p");
    let _ = h.unstage("vol-b");
    assert!(
        !h.host.calls().iter().any(|c| c.starts_with("unmount")),
        "{:?}",
        h.host.calls()
    );
}

/// A node-local handle names a place: once unstaged, its format record goes with it, so a disk
/// replaced under the same name is judged afresh instead of refused as "formatted, now wiped".
#[test]
fn a_handles_format_record_goes_with_its_unstage() {
    let h = Harness::new();
    h.attach("vol-g");
    let id = handle("vol-g");
    stage_at(&h, &id, "h", mount(AccessMode::MultiNodeMultiWriter)).expect("stage");
    assert!(h.ledger.format(&id).unwrap().is_some());
    let mut cmd = h.stage_cmd(VOL, mount(AccessMode::MultiNodeMultiWriter));
    cmd.volume = VolumeId::parse(&id).expect("id");
    crate::node::unstage(
        &h.ctx,
        &UnstageCommand {
            volume: cmd.volume.clone(),
            staging: h.path("staging_target_path", "staging/h"),
        },
    )
    .expect("unstage");
    assert!(h.ledger.format(&id).unwrap().is_none());
    // A volume's format record stays (never formatted again).
    h.staged(VOL);
    h.unstage(VOL).expect("unstage");
    assert!(h.ledger.format(VOL).unwrap().is_some());
}

/// `recover --from-mounts` rebuilds a raw block staging without its path (nothing is mounted
/// there): the volume's NodeUnstageVolume, whatever path it names, ends it.
#[test]
fn a_rebuilt_block_staging_without_a_path_is_ended_by_unstage() {
    let h = Harness::new();
    h.staged_block(VOL, AccessMode::SingleNodeWriter);
    let mut rebuilt = h.ledger.staged(VOL).unwrap().expect("staged");
    rebuilt.staging_path = std::path::PathBuf::new();
    h.ledger
        .write(
            crate::records::Durability::Immediate,
            Box::new(|w| w.put_staged(&rebuilt)),
        )
        .expect("rebuild");
    h.unstage(VOL).expect("unstage");
    assert!(h.ledger.staged(VOL).unwrap().is_none());
}

#[test]
fn a_claim_goes_with_the_unstage_and_another_id_may_take_the_device_then() {
    let h = Harness::new();
    h.staged(VOL);
    h.unstage(VOL).expect("unstage");
    stage_at(
        &h,
        &handle(VOL),
        "h",
        block(AccessMode::MultiNodeMultiWriter),
    )
    .expect("free after the unstage");
    assert_eq!(
        h.ledger
            .claims()
            .get(&node_key(VOL))
            .map(|c| c.volume_id.clone()),
        Some(handle(VOL))
    );
}

#[test]
fn a_handle_acting_for_the_volume_is_still_refused_while_the_volume_is_staged() {
    let h = Harness::new();
    h.staged(VOL);
    let mut cmd = h.stage_cmd(VOL, block(AccessMode::MultiNodeMultiWriter));
    cmd.volume = VolumeId::parse(&handle(VOL)).expect("id");
    cmd.staging = h.path("staging_target_path", "staging/h");
    cmd.publish_context.insert("volumeID".into(), VOL.into());
    let e = h
        .stage(&cmd)
        .expect_err("the volume holds its device through the node");
    assert!(claimed(&e), "{e}");
}

#[test]
fn a_published_volume_keeps_its_claim_until_its_last_record_goes() {
    let h = Harness::new();
    h.staged(VOL);
    h.published(VOL, "pod");
    let e = stage_at(
        &h,
        &handle(VOL),
        "h",
        block(AccessMode::MultiNodeMultiWriter),
    )
    .expect_err("published");
    assert!(claimed(&e), "{e}");
    h.unpublish(VOL, "pod").expect("unpublish");
    h.unstage(VOL).expect("unstage");
    stage_at(
        &h,
        &handle(VOL),
        "h",
        block(AccessMode::MultiNodeMultiWriter),
    )
    .expect("free once nothing of the volume is left");
}

#[test]
fn a_refusal_of_the_second_id_leaves_the_first_ids_records_whole() {
    let h = Harness::new();
    h.staged(VOL);
    h.published(VOL, "pod");
    let staged = h.ledger.staged(VOL).expect("read");
    let lines = h.journal(VOL).len();
    stage_at(
        &h,
        &handle(VOL),
        "h",
        mount(AccessMode::MultiNodeMultiWriter),
    )
    .expect_err("refused");
    assert_eq!(h.ledger.staged(VOL).expect("read"), staged);
    assert_eq!(h.journal_from(VOL, lines), Vec::<String>::new());
    assert_eq!(h.host.mounts_at(h.target("pod").as_path()), 1);
}
