//! A device built on another volume's bytes is that volume's (issue 49, a fourteenth fresh
//! review's F1 and F2). A loop device laid over a volume's device, or over a file inside the
//! filesystem a volume has mounted, and a mapper built on either, show that volume's bytes under
//! numbers and an identity of their own: no claim keyed by identity or number sees them. So a
//! first take, from every door, walks the device's stack down to what its bytes come from, and
//! refuses when another volume's recorded device is in it, or when a level cannot be told (a
//! backing file on a filesystem that shows other filesystems' files). Upward, a mapper built on
//! the device is its sysfs holder; a loop device laid over it can only be an identity-less
//! volume's (a loop volume is proven over its file, a node-local handle never takes a loop device
//! laid over another, an EBS volume is its NVMe namespace), so the walk down from each such
//! volume's recorded device says whether it reaches this one. A filesystem on the device, with a
//! loop device over a file in it, keeps the device claimed: every door refuses it as in use.
//! The records are read once per first take, with `reused_number`'s check.

use std::collections::{HashMap, HashSet};
use std::io;
use std::path::{Path, PathBuf};

use crate::DevNum;
use crate::error::{Error, Result};
use crate::request::VolumeId;

use super::NodeCtx;
use super::device_claim::{live_claim, node_key};
use super::host::Under;
use super::reused_number::Recorded;
use crate::records::{ClaimDoor, DeviceIdentity, claim_key};

/// Which take of a device the walk is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Take {
    /// The volume takes the device now: anyone's hold on the bytes under it refuses.
    First,
    /// The volume holds the device already (its retry): another volume's records, or another
    /// id's node claim, on the bytes under it refuse; a loop controller's attachment made since
    /// does not lock the volume out of its own retry (the simulation's seed 4: it was refused
    /// after an attach that came after its stage).
    Again,
}

/// How deep a stack is walked: loop over loop over a file is three; more is refused.
const DEPTH: usize = 8;

/// `Err(DeviceClaimed)` when another volume's recorded device lies under `devnum` or is built on
/// it; `Err(IndistinctDevice)` when a level of the stack cannot be told.
pub fn refuse_another_volumes_bytes(
    ctx: &NodeCtx,
    others: &[Recorded],
    volume: &VolumeId,
    devnum: DevNum,
    device: &Path,
    take: Take,
) -> Result<()> {
    let indistinct = |why: String| Error::IndistinctDevice {
        volume: volume.to_string(),
        device: device.to_path_buf(),
        why,
    };
    let unreadable =
        |e: io::Error| indistinct(format!("what its bytes lie on cannot be read: {e}"));
    let claimed = |owner: String, door: &'static str| Error::DeviceClaimed {
        device: device.to_path_buf(),
        volume: volume.to_string(),
        owner,
        door,
    };
    let recorded = recorded_devices(ctx, others);
    // The taker itself is no other owner. The volume a node-local handle acts for is: acting
    // for it lifts only the loop controller's claim on its very device (`device_claim`), never
    // a level built on its bytes (an eighteenth fresh review's F1: on EBS, where `volumeID`
    // cannot be proven, a handle acting for a staged volume took a file inside its filesystem).
    let owner_of = |d| owner_of(ctx, &recorded, d, take).filter(|o| o != volume.as_str());
    // Another agent's device is nobody's here by records, so it is told by what it shows (a
    // nineteenth and a twentieth fresh review's F1): the device itself and every level under it.
    let own_dir = std::cell::OnceCell::new();
    let another_agents = |d: DevNum| {
        let Some(origin) = ctx.host.loop_origin(d).map_err(unreadable)? else {
            return Ok(());
        };
        let theirs = |evidence: String| Error::AnotherAgentsDevice {
            device: device.to_path_buf(),
            volume: volume.to_string(),
            level: PathBuf::from(format!("/dev/block/{d}")),
            evidence,
        };
        if ctx.agent_tag.made_by_another(&origin.name) {
            return Err(theirs(format!("its loop device name {:?}", origin.name)));
        }
        let ours = own_dir.get_or_init(|| own_state_dir(ctx));
        if let Some(dir) = origin.state_dir
            && Some(dir) != *ours
        {
            return Err(theirs(
                "its backing file lies in another agent's state directory".into(),
            ));
        }
        // A file with another name may be another agent's volume under a name outside its
        // state directory (a twenty-third fresh review's F1: a hard link): it cannot be told,
        // unless this agent's backend knows it as one of its own volumes.
        let own_volume = || {
            let identity = ctx.backend.identify(d).ok();
            identity.and_then(|i| ctx.backend.volume_of(&i)).is_some()
        };
        if origin.file_links > 1 && !own_volume() {
            return Err(indistinct(format!(
                "{d}'s backing file has {} names: one may be another agent's volume file",
                origin.file_links
            )));
        }
        Ok(())
    };
    another_agents(devnum)?;
    for level in walk(devnum, |d| ctx.host.lies_on(d)).map_err(unreadable)? {
        match level {
            Under::Unknown(why) => return Err(indistinct(why)),
            Under::Device(d) => {
                another_agents(d)?;
                if let Some(owner) = owner_of(d) {
                    return Err(claimed(owner, "its bytes lie on that volume's device"));
                }
            }
        }
    }
    let built = |owner| claimed(owner, "that volume's device is built on its bytes");
    for d in ctx.host.built_on(devnum).map_err(unreadable)? {
        if let Some(owner) = owner_of(d) {
            return Err(built(owner));
        }
    }
    let identity_less = others.iter().filter_map(|o| {
        let s = o.staged.as_ref()?;
        matches!(s.identity, DeviceIdentity::Unverified).then_some((o, s.devnum?))
    });
    for (other, theirs) in identity_less {
        let theirs = DevNum::from(theirs);
        // Their device, gone or unreadable now, is their own trouble: it reaches nothing.
        let reached = walk(theirs, |d| ctx.host.lies_on(d)).unwrap_or_default();
        if reached.contains(&Under::Device(devnum)) {
            return Err(built(other.id.clone()));
        }
    }
    Ok(())
}

/// This agent's state directory, the one holding its journal.
fn own_state_dir(ctx: &NodeCtx) -> Option<super::host::Place> {
    let dir = ctx.ledger.path().parent()?;
    ctx.host.place_of(dir).ok()
}

/// Every level reached from `start` (not included) by `step`, each device once.
fn walk(start: DevNum, step: impl Fn(DevNum) -> io::Result<Vec<Under>>) -> io::Result<Vec<Under>> {
    let mut seen = HashSet::from([start]);
    let mut frontier = vec![start];
    let mut found = Vec::new();
    for _ in 0..DEPTH {
        let mut next = Vec::new();
        for d in frontier {
            for level in step(d)? {
                match level {
                    Under::Device(n) if !seen.insert(n) => {}
                    Under::Device(n) => {
                        next.push(n);
                        found.push(Under::Device(n));
                    }
                    Under::Unknown(why) => found.push(Under::Unknown(format!("{d}: {why}"))),
                }
            }
        }
        if next.is_empty() {
            return Ok(found);
        }
        frontier = next;
    }
    Err(io::Error::other(format!(
        "its stack is deeper than {DEPTH} levels"
    )))
}

/// The device numbers other volumes' records name (their staged device), each also by its whole
/// disk: the volume that holds it.
fn recorded_devices(ctx: &NodeCtx, others: &[Recorded]) -> HashMap<DevNum, String> {
    let mut owners = HashMap::new();
    for other in others {
        if let Some(d) = other
            .staged
            .as_ref()
            .and_then(|s| s.devnum)
            .map(DevNum::from)
        {
            owners.insert(ctx.host.whole_disk(d), other.id.clone());
            owners.insert(d, other.id.clone());
        }
    }
    owners
}

/// Whose a level of the stack is: a volume whose record names the device; else what the backend
/// says the device is: one of its volumes (loop: a loop device over a volume's file, attached by
/// anyone: a fifteenth fresh review's F1), or a device a live claim holds (the node's, or the
/// loop controller's attachment).
fn owner_of(
    ctx: &NodeCtx,
    recorded: &HashMap<DevNum, String>,
    d: DevNum,
    take: Take,
) -> Option<String> {
    if let Some(o) = recorded
        .get(&d)
        .or_else(|| recorded.get(&ctx.host.whole_disk(d)))
    {
        return Some(o.clone());
    }
    let identity = ctx.backend.identify(d).ok()?;
    if let Some(v) = ctx.backend.volume_of(&identity) {
        return Some(v);
    }
    let node = node_key(ctx, &identity, d).and_then(|k| live_claim(&*ctx.ledger, &k).ok()?);
    if let Some(c) = node {
        return Some(c.volume_id);
    }
    if take == Take::Again {
        return None;
    }
    let controller = claim_key(ClaimDoor::Controller, &identity, Some(d))?;
    ctx.ledger.claim(&controller).ok()?.map(|c| c.volume_id)
}
