//! A device replaced under a volume's records (detached outside the agent, its numbers given to
//! another device): a forty-eighth fresh review's F1 and F2. Nothing of the device that took
//! the numbers is the volume's, at any door.

use super::*;
use crate::error::Error;
use crate::ledger::Ledger;
use crate::records::Durability;

fn device_of(h: &Harness, volume: &str) -> crate::DevNum {
    h.host
        .devnum(&h.dir.join("dev").join(format!("dev-{volume}")))
}

/// F1: `recover --from-mounts` rebuilt X's raw block staging without its path; X's device went
/// and Y's took its numbers. X's unstage at Y's publication target (any path is X's staging
/// path, to a rebuilt record) found there a bind of X's recorded numbers, and took it down as
/// X's own replaced bind: Y's pod lost its device.
#[test]
fn a_rebuilt_staging_never_takes_another_volumes_bind_down() {
    let h = Harness::new();
    h.staged_block("vol-y", AccessMode::SingleNodeWriter);
    h.publish(&h.publish_cmd("vol-y", "y", block(AccessMode::SingleNodeWriter)))
        .expect("y's publish");
    let mut x = h.ledger.staged("vol-y").unwrap().expect("staged");
    x.volume_id = VOL.into();
    x.staging_path = std::path::PathBuf::new();
    x.device = h.dir.join("dev").join(format!("dev-{VOL}"));
    x.identity = crate::double::devices::serial(VOL);
    assert_eq!(
        x.devnum.map(crate::DevNum::from),
        Some(device_of(&h, "vol-y"))
    );
    h.ledger
        .write(Durability::Immediate, Box::new(|w| w.put_staged(&x)))
        .expect("x rebuilt");
    h.host.state().calls.clear();
    crate::node::unstage(
        &h.ctx,
        &UnstageCommand {
            volume: VolumeId::parse(VOL).expect("id"),
            staging: h.path("staging_target_path", "pods/y/mount"),
        },
    )
    .expect("nothing of x there: OK, and nothing done");
    assert_eq!(
        h.host.calls(),
        Vec::<String>::new(),
        "y's bind was taken down"
    );
    assert!(h.ledger.staged(VOL).unwrap().is_some(), "x is still staged");
}

/// F2: a device with no identity to prove, staged raw and published once; detached and another
/// attached at its numbers (a new attachment); its next publish handed the new device out.
#[test]
fn a_device_without_identity_replaced_since_its_stage_is_never_published() {
    let h = Harness::new();
    h.attach(VOL);
    let devnum = device_of(&h, VOL);
    h.host.state().unverified.insert(devnum);
    h.stage(&h.stage_cmd(VOL, block(AccessMode::SingleNodeWriter)))
        .expect("stage");
    h.publish(&h.publish_cmd(VOL, "a", block(AccessMode::SingleNodeWriter)))
        .expect("first publish");
    h.unpublish(VOL, "a").expect("unpublish");
    // Another attachment at the same numbers (the double's attachments are per boot).
    h.host.state().boot += 1;
    h.host.state().calls.clear();
    let e = h
        .publish(&h.publish_cmd(VOL, "b", block(AccessMode::SingleNodeWriter)))
        .expect_err("another device at the staged numbers");
    assert!(matches!(e, Error::NoLongerTheDevice { .. }), "{e}");
    assert_eq!(h.host.calls(), Vec::<String>::new());
}
