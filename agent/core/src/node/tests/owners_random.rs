//! The property test of one device, one owner (issue 49): random calls by three volumes, two
//! node-local handles on their devices and the loop controller's claims, over shared devices.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::rng::Rng;
use super::*;
use crate::double::devices::serial;
use crate::double::host::GIB;
use crate::ledger::Ledger;
use crate::records::{ClaimDoor, DeviceClaim, claim_key};
use crate::request::AccessMode;

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
    let mut rng = Rng::new(seed);
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
