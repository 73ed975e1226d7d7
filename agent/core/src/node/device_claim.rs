//! One device, one owner: which volume id holds a device, asked by every door that takes one
//! (stage, raw block stage, node-local handles, recovery's adoption, the loop controller's
//! attach) and by every door that would act on another's mount (through `ownership::Expected`).
//!
//! A device is keyed by the identity its backend proves (the loop volume file's inode, the NVMe
//! serial; its numbers only for a device without one), so two names of one device (a udev link,
//! a node-local handle, a second loop device over the same file) are one key. The node's claim
//! is written in the same commit as the first intent of the door that takes the device (the
//! format intent, the mount intent, the raw block staging) and is live while its volume still has
//! a staged record, a publication or a format intent: the volume's own records end it, so
//! unstage writes nothing more, and a claim whose volume has none of them is free to take. The
//! loop controller's claim is written with its attachment and removed with it.
//!
//! A node claim by another id refuses. The controller's claim refuses a node door unless that
//! door is the controller's volume, or a node-local handle whose publish context names it (the
//! backend has proven the device is that volume where it can: upstream's node-local volumes).

use crate::DevNum;
use crate::records::{ClaimDoor, DeviceClaim, DeviceIdentity, FormatState, claim_key, now_unix_ms};

use super::NodeCtx;
use crate::error::{Error, Result};
use crate::ledger::Ledger;
use crate::request::VolumeId;

/// The publish-context key upstream's controller sets to a node-local handle's real volume id.
pub const ACTS_FOR_KEY: &str = "volumeID";

/// The key of the node's claim on a device. A device with an identity is keyed by that (a
/// partition of an NVMe disk carries the disk's serial; a loop volume, its file's inode). One
/// with none is keyed by its whole disk, so a partition and its disk are one key (two volumes
/// never share a disk), and that disk by what its bytes are: a loop device by its backing
/// file, as a loop volume is, so every loop device over one file is one key whichever backend
/// or door names it (a fifteenth fresh review's F2: two identity-less loop devices over one file
/// were two owners); any other disk by its numbers.
pub fn node_key(ctx: &NodeCtx, identity: &DeviceIdentity, devnum: DevNum) -> Option<String> {
    let DeviceIdentity::Unverified = identity else {
        return claim_key(ClaimDoor::Node, identity, Some(devnum));
    };
    let whole = ctx.host.whole_disk(devnum);
    match ctx.host.loop_backing(whole) {
        Some((st_dev, st_ino)) => {
            let file = DeviceIdentity::LoopFile {
                file: std::path::PathBuf::new(),
                st_dev,
                st_ino,
            };
            claim_key(ClaimDoor::Node, &file, None)
        }
        None => claim_key(ClaimDoor::Node, identity, Some(whole)),
    }
}

/// Why a claim by `owner` refuses: words for the error.
pub fn door_words(door: ClaimDoor) -> &'static str {
    match door {
        ClaimDoor::Node => "staged, published or being formatted on this node",
        ClaimDoor::Controller => "attached to this node by the loop controller",
    }
}

/// Whether `volume` still uses a device through the node: a staged record, a publication, or a
/// format intent (an interrupted mkfs that only its own volume may redo).
pub fn holds_through_node(ledger: &dyn Ledger, volume: &str) -> Result<bool> {
    if ledger.staged(volume)?.is_some() || !ledger.publications(volume)?.is_empty() {
        return Ok(true);
    }
    Ok(ledger
        .format(volume)?
        .is_some_and(|f| f.state == FormatState::Intent))
}

/// The live node claim on a device: its owner, unless the owner's own records have ended it.
pub fn node_owner(
    ledger: &dyn Ledger,
    identity: &DeviceIdentity,
    devnum: Option<DevNum>,
) -> Result<Option<String>> {
    Ok(node_claim(ledger, identity, devnum)?.map(|c| c.volume_id))
}

/// The live node claim on a device, whole.
pub fn node_claim(
    ledger: &dyn Ledger,
    identity: &DeviceIdentity,
    devnum: Option<DevNum>,
) -> Result<Option<DeviceClaim>> {
    let Some(key) = claim_key(ClaimDoor::Node, identity, devnum) else {
        return Ok(None);
    };
    live_claim(ledger, &key)
}

/// The live node claim under `key` (`node_key`).
pub fn live_claim(ledger: &dyn Ledger, key: &str) -> Result<Option<DeviceClaim>> {
    match ledger.claim(key)? {
        Some(c) if holds_through_node(ledger, &c.volume_id)? => Ok(Some(c)),
        _ => Ok(None),
    }
}

/// Whether the loop controller may attach `volume`'s device: no id holds it through the node,
/// or the one that does is `volume` or acts for it. `Err` names the holder.
pub fn controller_may_take(
    ledger: &dyn Ledger,
    volume: &str,
    identity: &DeviceIdentity,
) -> std::result::Result<(), String> {
    match node_claim(ledger, identity, None) {
        Ok(Some(c)) if c.volume_id != volume && c.acts_for.as_deref() != Some(volume) => {
            Err(c.volume_id)
        }
        Ok(_) => Ok(()),
        Err(e) => Err(format!("(unreadable: {e})")),
    }
}

/// What a node door must write to take a device for `volume`: `None` when `volume` holds it
/// already. Refuses (`DeviceClaimed`, nothing changed) when another id holds it through the node,
/// or the loop controller attached it for another volume that `volume` does not act for.
pub fn take_for_node(
    ctx: &NodeCtx,
    volume: &VolumeId,
    acts_for: Option<&str>,
    identity: &DeviceIdentity,
    devnum: DevNum,
    device: &std::path::Path,
) -> Result<Option<(String, DeviceClaim)>> {
    let refuse = |owner: String, door: ClaimDoor| Error::DeviceClaimed {
        device: device.to_path_buf(),
        volume: volume.to_string(),
        owner,
        door: door_words(door),
    };
    let Some(key) = node_key(ctx, identity, devnum) else {
        return Ok(None);
    };
    let node = match ctx.ledger.claim(&key)? {
        Some(c) if holds_through_node(&*ctx.ledger, &c.volume_id)? => Some(c),
        _ => None,
    };
    match node {
        // Held already: a controller's claim written since (which its attach refuses) cannot
        // take it away from under the volume's own retries. The bytes under it may have been
        // taken since, though, by a volume whose own take could not see this one (its claim
        // lives on without a staged record: an interrupted stage's format intent, a publication
        // left behind): the stack is walked again (the simulation's seed 20, once it laid a
        // loop device over a volume's disk).
        Some(c) if c.volume_id == volume.as_str() => {
            let others = super::reused_number::others(ctx, volume)?;
            let again = super::stacking::Take::Again;
            super::stacking::refuse_another_volumes_bytes(
                ctx, &others, volume, devnum, device, again,
            )?;
            return Ok(None);
        }
        Some(c) => return Err(refuse(c.volume_id, ClaimDoor::Node)),
        None => {}
    }
    if let Some(ckey) = claim_key(ClaimDoor::Controller, identity, Some(devnum))
        && let Some(c) = ctx.ledger.claim(&ckey)?
        && c.volume_id != volume.as_str()
        && acts_for != Some(c.volume_id.as_str())
    {
        return Err(refuse(c.volume_id, ClaimDoor::Controller));
    }
    let others = super::reused_number::others(ctx, volume)?;
    if let Some((owner, at)) =
        super::reused_number::bound_by_another(ctx, &others, identity, devnum)
    {
        return Err(Error::DeviceClaimed {
            device: device.to_path_buf(),
            volume: volume.to_string(),
            owner: format!("{owner} (its raw bind at {})", at.display()),
            door: "bound by number: the device that volume had was replaced under its bind",
        });
    }
    let first = super::stacking::Take::First;
    super::stacking::refuse_another_volumes_bytes(ctx, &others, volume, devnum, device, first)?;
    Ok(Some((
        key,
        DeviceClaim {
            volume_id: volume.to_string(),
            door: ClaimDoor::Node,
            identity: identity.clone(),
            at_unix_ms: now_unix_ms(),
            acts_for: acts_for.map(str::to_string),
        },
    )))
}

/// The node-local handle's real volume, from its publish context (`None` for any other id).
pub fn acts_for<'a>(
    volume: &VolumeId,
    publish_context: &'a std::collections::HashMap<String, String>,
) -> Option<&'a str> {
    if !volume.is_local() {
        return None;
    }
    publish_context
        .get(ACTS_FOR_KEY)
        .map(String::as_str)
        .filter(|v| !v.is_empty())
}

/// Recovery's adoption: a staged record with no node claim on its device (records written before
/// claims existed, or rebuilt from the mount table) takes it, durably. A device another id holds
/// already is left to that id and said: two records naming one device cannot both be right.
pub fn adopt(ctx: &NodeCtx, staged: &crate::records::StagedVolume) -> Result<()> {
    let key = match staged.devnum {
        Some(d) => node_key(ctx, &staged.identity, DevNum::from(d)),
        None => claim_key(ClaimDoor::Node, &staged.identity, None),
    };
    let Some(key) = key else {
        return Ok(());
    };
    match ctx.ledger.claim(&key)? {
        Some(c) if c.volume_id == staged.volume_id => Ok(()),
        Some(c) if holds_through_node(&*ctx.ledger, &c.volume_id)? => {
            tracing::warn!(volume = %staged.volume_id, owner = %c.volume_id,
                "recovery: the staged device is held by another volume; left to it");
            Ok(())
        }
        _ => {
            let claim = DeviceClaim {
                volume_id: staged.volume_id.clone(),
                door: ClaimDoor::Node,
                identity: staged.identity.clone(),
                at_unix_ms: now_unix_ms(),
                acts_for: None,
            };
            ctx.ledger.write(
                crate::records::Durability::Immediate,
                Box::new(|w| w.put_claim(&key, &claim)),
            )?;
            Ok(())
        }
    }
}
