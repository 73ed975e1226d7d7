//! One device, one owner (`device_claim`): a door naming a device another id holds refuses and
//! touches nothing; the claim rides with the first intent; a format intent holds the device for
//! its volume alone; and a property test over random calls by several ids, node-local handles and
//! the loop controller's claims on shared devices.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::devices::serial;
use super::double::GIB;
use super::*;
use crate::error::Error;
use crate::ledger::Ledger;
use crate::records::{ClaimDoor, DeviceClaim, claim_key};
use crate::request::AccessMode;

/// The node-local handle naming volume `of`'s device in the double.
fn handle(of: &str) -> String {
    format!("local-ebs://dev/dev-{of}")
}

/// A stage of `id` at `staging/<dir>` (a handle's id is no path component).
fn stage_at(h: &Harness, id: &str, dir: &str, capability: Capability) -> Result<()> {
    let mut cmd = h.stage_cmd(VOL, capability);
    cmd.volume = VolumeId::parse(id).expect("id");
    cmd.staging = h.path("staging_target_path", &format!("staging/{dir}"));
    h.stage(&cmd)
}

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

/// A small seeded generator (xorshift64*): the same seed, the same calls.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        let n = u64::try_from(items.len()).unwrap_or(1);
        &items[usize::try_from(self.next() % n).unwrap_or(0)]
    }
}

/// Which id each mount belongs to, by the records that placed it: path -> (id, device).
fn mount_owners(h: &Harness, ids: &[String]) -> HashMap<std::path::PathBuf, String> {
    let mut owners = HashMap::new();
    for id in ids {
        if let Ok(Some(s)) = h.ledger.staged(id) {
            owners.insert(s.staging_path, id.clone());
        }
        for p in h.ledger.publications(id).unwrap_or_default() {
            owners.insert(p.target_path, id.clone());
        }
    }
    owners
}

/// Random calls by three volumes, two node-local handles on their devices and the loop
/// controller's attach and detach, over shared devices: after every call no device has two
/// owners, and no call took away a mount another id's records placed.
#[test]
fn random_calls_never_give_a_device_two_owners_nor_touch_anothers_mounts() {
    let seeds = std::env::var("EBS_OWNER_SEEDS")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(40);
    for seed in 1..=seeds {
        run_owner_seed(seed);
    }
}

fn run_owner_seed(seed: u64) {
    let h = Harness::new();
    let volumes = ["vol-a", "vol-b", "vol-c"];
    for v in volumes {
        h.host.add_device(&format!("dev-{v}"), GIB);
    }
    let ids: Vec<String> = volumes
        .iter()
        .map(|v| v.to_string())
        .chain([handle("vol-a"), handle("vol-b")])
        .collect();
    let dirs: BTreeMap<&str, &str> = [
        ("vol-a", "a"),
        ("vol-b", "b"),
        ("vol-c", "c"),
        (handle("vol-a").leak() as &str, "ha"),
        (handle("vol-b").leak() as &str, "hb"),
    ]
    .into_iter()
    .collect();
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut history = Vec::new();
    for _ in 0..60 {
        let id = rng.pick(&ids).clone();
        let dir = dirs[id.as_str()];
        let mode = if id.starts_with("local-") {
            AccessMode::MultiNodeMultiWriter
        } else {
            AccessMode::SingleNodeWriter
        };
        let target = *rng.pick(&["p1", "p2"]);
        let op = *rng.pick(&[
            "stage",
            "stage-block",
            "publish",
            "unpublish",
            "unstage",
            "attach",
            "detach",
        ]);
        history.push(format!("{op} {id} {target}"));
        let before = mount_owners(&h, &ids);
        let mounts_before: BTreeSet<_> = h.host.state().mounts.keys().cloned().collect();
        let staging = h.path("staging_target_path", &format!("staging/{dir}"));
        let vid = VolumeId::parse(&id).expect("id");
        let _ = match op {
            "stage" | "stage-block" => {
                let capability = if op == "stage" {
                    mount(mode)
                } else {
                    block(mode)
                };
                stage_at(&h, &id, dir, capability)
            }
            "publish" => {
                let block_access = h
                    .ledger
                    .staged(&id)
                    .ok()
                    .flatten()
                    .is_some_and(|s| matches!(s.access, crate::records::AccessRecord::Block));
                let capability = if block_access {
                    block(mode)
                } else {
                    mount(mode)
                };
                let target = h.target(&format!("{dir}-{target}"));
                crate::node::publish(
                    &h.ctx,
                    &PublishCommand {
                        volume: vid.clone(),
                        staging: staging.clone(),
                        target,
                        capability,
                        readonly: false,
                    },
                )
            }
            "unpublish" => crate::node::unpublish(
                &h.ctx,
                &UnpublishCommand {
                    volume: vid.clone(),
                    target: h.target(&format!("{dir}-{target}")),
                },
            ),
            "unstage" => crate::node::unstage(
                &h.ctx,
                &UnstageCommand {
                    volume: vid.clone(),
                    staging: staging.clone(),
                },
            ),
            // The loop controller's attach and detach of a volume (never of a handle): its
            // claim comes and goes with the attachment; a detach is refused while the node holds
            // the device (the daemon's `in_use`).
            "attach" | "detach" if !id.starts_with("local-") => {
                let key = claim_key(ClaimDoor::Controller, &serial(&id), None).expect("key");
                let held = crate::node::device_claim::node_owner(&*h.ledger, &serial(&id), None)
                    .expect("read");
                let claim = DeviceClaim {
                    volume_id: id.clone(),
                    door: ClaimDoor::Controller,
                    identity: serial(&id),
                    at_unix_ms: 0,
                    acts_for: None,
                };
                if op == "attach" {
                    h.ledger
                        .write(
                            crate::records::Durability::Immediate,
                            Box::new(|w| w.put_claim(&key, &claim)),
                        )
                        .expect("attach");
                } else if held.is_none() {
                    h.ledger
                        .write(
                            crate::records::Durability::Immediate,
                            Box::new(|w| w.delete_claim(&key)),
                        )
                        .expect("detach");
                }
                Ok(())
            }
            _ => Ok(()),
        };
        // No device has two owners: the ids whose staging names each device.
        let mut holders: HashMap<String, BTreeSet<String>> = HashMap::new();
        for other in &ids {
            if let Ok(Some(s)) = h.ledger.staged(other) {
                holders
                    .entry(format!("{:?}", s.identity))
                    .or_default()
                    .insert(other.clone());
            }
        }
        for (device, owners) in &holders {
            assert!(
                owners.len() <= 1,
                "seed {seed}: {device} has owners {owners:?} after {history:#?}"
            );
        }
        // No call took away a mount another id's records placed.
        let mounts_after: BTreeSet<_> = h.host.state().mounts.keys().cloned().collect();
        for gone in mounts_before.difference(&mounts_after) {
            if let Some(owner) = before.get(gone) {
                assert_eq!(
                    owner,
                    &id,
                    "seed {seed}: {id} took away {owner}'s mount at {} after {history:#?}",
                    gone.display()
                );
            }
        }
        // A claim's owner is one of the ids, and a live one names the device it holds.
        for other in &ids {
            if let Ok(Some(s)) = h.ledger.staged(other) {
                let owner = crate::node::device_claim::node_owner(&*h.ledger, &s.identity, None)
                    .expect("read");
                assert!(
                    owner.is_none() || owner.as_deref() == Some(other.as_str()),
                    "seed {seed}: {other} is staged on a device {owner:?} holds, after {history:#?}"
                );
            }
        }
    }
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
