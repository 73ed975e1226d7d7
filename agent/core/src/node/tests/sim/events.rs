//! What happens around the calls: the loop controller's attach and detach, workloads writing
//! to what they were given, crashes and power cuts, and the orchestrator's retries after them.

use std::sync::Arc;

use super::{Sim, dir_of};
use crate::DevNum;
use crate::double::devices::serial;
use crate::ledger::Ledger;
use crate::records::{ClaimDoor, DeviceClaim, Durability, claim_key};

impl Sim {
    /// The loop controller's attach or detach of a volume: its claim comes and goes with the
    /// attachment; a detach is refused while the node holds the device (the daemon's `in_use`).
    pub(super) fn controller(&mut self, attach: bool, id: &str) {
        let key = claim_key(ClaimDoor::Controller, &serial(id), None).expect("key");
        let claim = DeviceClaim {
            volume_id: id.to_string(),
            door: ClaimDoor::Controller,
            identity: serial(id),
            at_unix_ms: 0,
            acts_for: None,
        };
        let held = crate::node::device_claim::node_owner(&*self.h.ledger, &serial(id), None)
            .unwrap_or_else(|e| self.fail(format!("reading a claim: {e}")));
        let may = crate::node::device_claim::controller_may_take(&*self.h.ledger, id, &serial(id))
            .and_then(|()| self.bytes_held_by_another(id).map_or(Ok(()), Err));
        let ledger = &self.h.ledger;
        let _ = if attach && may.is_ok() {
            ledger.write(
                Durability::Immediate,
                Box::new(|w| w.put_claim(&key, &claim)),
            )
        } else if held.is_none() {
            ledger.write(Durability::Immediate, Box::new(|w| w.delete_claim(&key)))
        } else {
            Ok(())
        };
    }

    /// Another id staged on a device that shows `id`'s bytes under another identity (the
    /// operator's loop device over vol-c's disk). The real loop controller sees such a holder by
    /// identity (a loop device laid over its volume's file has the file's backing inode); the
    /// simulated stack has none, so the model asks the bytes.
    fn bytes_held_by_another(&self, id: &str) -> Option<String> {
        let (devnum, others) = {
            let s = self.h.host.state();
            let devnum = s.devices.get(&self.h.backend.device_of(id)).copied()?;
            let bottom = s.bottom(devnum);
            // The device itself is the identity's case (`controller_may_take`).
            let others: Vec<(DevNum, bool)> = (s.devices.values().copied())
                .filter(|d| *d != devnum && s.bottom(*d) == bottom)
                .map(|d| (d, s.unverified.contains(&d)))
                .collect();
            (devnum, others)
        };
        let staged = self.h.ledger.all_staged().into_iter().find_map(|st| {
            let d = DevNum::from(st.devnum?);
            (st.volume_id != id && others.iter().any(|(o, _)| *o == d)).then_some(st.volume_id)
        });
        // ... or holds them through the node without a staged record (an interrupted stage's
        // format intent): its claim, keyed as a node door keys it.
        staged.or_else(|| {
            others.iter().find_map(|(d, unverified)| {
                let identity = if *unverified {
                    crate::records::DeviceIdentity::Unverified
                } else {
                    crate::node::backend::Backend::identify(&*self.h.backend, *d).ok()?
                };
                let key = crate::node::device_claim::node_key(&self.h.ctx, &identity, *d)?;
                let claim = crate::node::device_claim::live_claim(&*self.h.ledger, &key).ok()??;
                (claim.volume_id != id && *d != devnum).then_some(claim.volume_id)
            })
        })
    }

    /// A workload writes to what it was given: a raw block publication's bytes, or a file in a
    /// mounted one (the device then holds data, whoever's claim is on it).
    pub(super) fn write(&mut self, id: &str, over_start: bool) {
        let Some(((_, target), _)) = self
            .belief
            .published
            .iter()
            .find(|((v, _), ro)| v == id && !**ro)
            .map(|(k, v)| (k.clone(), *v))
        else {
            return;
        };
        let path = self
            .h
            .target(&format!("{}-{target}", dir_of(id)))
            .as_path()
            .to_path_buf();
        let mut s = self.h.host.state();
        let Some(top) = s.mounts.get(&path).and_then(|m| m.last()).cloned() else {
            return;
        };
        // After a reset the agent is not held to what it no longer knows: the belief may name a
        // publication it never made again, and a later read-only publish of the same target
        // (cut by a crash, its bind there) is what the target shows (the long run's seed 14213
        // with this model's first reset). Only one it records as read-write must be writable.
        let recorded_rw = || {
            matches!(
                crate::ledger::Ledger::publication(&*self.h.ledger, id, &path),
                Ok(Some(p)) if !p.readonly
            )
        };
        if top.read_only && self.reset_seen && !recorded_rw() {
            return;
        }
        if top.read_only {
            drop(s);
            self.fail(format!(
                "{id}'s read-write publication at {} is read-only",
                path.display()
            ));
        }
        let dev = if top.node.kind == crate::seam::FileKind::BlockDevice {
            top.node.rdev
        } else {
            top.dev
        };
        // The bytes are every device's that shows them (a loop device laid over another).
        let devices = s.same_bytes(dev);
        if top.node.kind == crate::seam::FileKind::BlockDevice {
            for &d in &devices {
                s.not_blank.insert(d);
                // Over the start half the time: the primary superblock goes, a probe finds
                // nothing (the backup superblocks, with mkfs's UUID, stay).
                if over_start {
                    s.probes.insert(d, crate::probe::ProbeOutcome::Blank);
                }
            }
        }
        drop(s);
        for d in devices {
            self.written.entry(d).or_insert_with(|| id.to_string());
        }
    }

    /// The agent dies: what is in memory is gone, and the writes the boot log does not hold
    /// with it; the host stays.
    pub(super) fn crash(&mut self) {
        self.h.ledger.crash();
        self.h.restart(Arc::clone(&self.parker) as _);
        self.start_up();
    }

    /// The power goes: mounts, read-only devices and claims on devices go too; a new boot.
    pub(super) fn power_cut(&mut self) {
        {
            let mut s = self.h.host.state();
            s.mounts.clear();
            s.dev_allowed.clear();
            s.claimed.clear();
            s.read_only.clear();
            s.boot += 1;
        }
        self.h.ledger.power_cut();
        self.crash();
    }

    /// `recover --reset`: the records are gone, the host is not. Start-up must take nothing
    /// away that the host shows in use (a live read-only block publication's device: issue 49's
    /// third medium); what the agent no longer knows is not promised back, so from here on the
    /// orchestrator's retries are made but not held to their answers.
    pub(super) fn reset(&mut self) {
        self.h.ledger.reset();
        self.reset_seen = true;
        self.crash();
    }

    /// After a crash or a power cut: the orchestrator's retries of what it believes converge.
    pub(super) fn converge(&mut self) {
        if self.reset_seen {
            let belief = self.belief.clone();
            for (id, block_access) in &belief.staged {
                let _ = self.call("stage", id, "", *block_access);
            }
            for ((id, target), ro) in &belief.published {
                let _ = self.call("publish", id, target, *ro);
            }
            return;
        }
        let belief = self.belief.clone();
        for (id, block_access) in &belief.staged {
            if let Err(e) = self.call("stage", id, "", *block_access) {
                self.fail(format!("the retried stage of {id} failed: {e}"));
            }
        }
        for ((id, target), ro) in &belief.published {
            if let Err(e) = self.call("publish", id, target, *ro) {
                self.fail(format!(
                    "the retried publish of {id} at {target} failed: {e}"
                ));
            }
        }
        for id in belief.staged.keys() {
            if !matches!(self.h.ledger.staged(id), Ok(Some(_))) {
                self.fail(format!("{id} is believed staged but has no record"));
            }
        }
        // What was released with an OK answer stays released (else the device stays held from
        // every other door, and the loop controller refuses the detach, for good).
        for (id, target) in &belief.released {
            let back = if target.is_empty() {
                matches!(self.h.ledger.staged(id), Ok(Some(_)))
            } else {
                let path = self.h.target(&format!("{}-{target}", dir_of(id)));
                matches!(self.h.ledger.publication(id, path.as_path()), Ok(Some(_)))
            };
            if back {
                let what = if target.is_empty() {
                    "unstage"
                } else {
                    "unpublish"
                };
                self.fail(format!(
                    "the acknowledged {what} of {id} {target} came back after a restart"
                ));
            }
        }
    }
}
