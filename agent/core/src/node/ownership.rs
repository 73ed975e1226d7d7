//! "Is this mount the volume's?" — one question, asked of the host, for unstage, unpublish,
//! publish, stage, recovery, stats and reclaim. Records only say where to look.
//!
//! A mount at a staging or target path is the volume's only if its source is the volume's
//! device, proven by what the device shows now (loop: the backing file's inode; EBS: the NVMe
//! serial), and it is the filesystem's root (a staging mount, or a bind of it); for block access,
//! the device node bound onto a file is the volume's device, or the agent's read-only loop
//! device over it.

use crate::DevNum;
use std::fs::File;
use std::sync::OnceLock;

use crate::records::{DeviceIdentity, StagedVolume};

use super::backend::{Shown, describe_identity};
use super::host::{Entry, OpenEntry};
use super::{NodeCtx, device_claim};
use crate::error::{Error, Result};
use crate::request::VolumeId;
use crate::seam::{FileKind, MountFacts};

/// What a volume's device must show, from the record or, without one, from the backend. One
/// per call: it keeps the device it proved open for the rest of the call.
#[derive(Debug)]
pub struct Expected {
    pub volume: String,
    identity: Option<DeviceIdentity>,
    /// The recorded device's numbers: all an unverified identity can be checked against.
    recorded: Option<DevNum>,
    /// The device proven to be the volume in this call, held open: while it is open its numbers
    /// cannot pass to another device (see the host crate's `ebs_node_host::device`), so the
    /// staging mount, a bind of it and the device itself, asked about in turn, need one proof,
    /// not one each.
    proven: OnceLock<(DevNum, File)>,
}

impl Expected {
    pub fn of(ctx: &NodeCtx, volume: &str, staged: Option<&StagedVolume>) -> Expected {
        let identity = match staged {
            Some(s) => Some(s.identity.clone()),
            None => VolumeId::parse(volume)
                .ok()
                .and_then(|id| ctx.backend.expected_identity(&id)),
        };
        Expected {
            volume: volume.to_string(),
            identity,
            recorded: staged.and_then(|s| recorded_devnum(ctx, s)),
            proven: OnceLock::new(),
        }
    }

    /// For a device just resolved and held.
    pub fn resolved(volume: &VolumeId, identity: DeviceIdentity, devnum: DevNum) -> Expected {
        Expected {
            volume: volume.to_string(),
            identity: Some(identity),
            recorded: Some(devnum),
            proven: OnceLock::new(),
        }
    }

    /// Whether the device with these numbers is the volume's. A device that is gone (detached
    /// under a mount) can no longer be asked; then the record vouches for the numbers it noted,
    /// so a workload's mount of a vanished volume can still be taken down.
    pub fn is_device(&self, ctx: &NodeCtx, devnum: DevNum) -> bool {
        self.prove(ctx, devnum).is_ok()
            || (self.identity.is_some()
                && self.recorded == Some(devnum)
                && !ctx.host.device_exists(devnum))
    }

    /// Whether the device with these numbers, as it is now, is the volume; `Err` says why not.
    pub fn prove(&self, ctx: &NodeCtx, devnum: DevNum) -> std::result::Result<(), String> {
        if self.held(devnum).is_some() {
            return Ok(());
        }
        let opened = self.prove_identity(ctx, devnum)?;
        // A device another id holds is never this volume's, whatever it shows: a node-local
        // handle or a careless CO naming another volume's device must not make that volume's
        // mounts its own (`device_claim`).
        if let Some(identity) = &self.identity {
            let owner = match device_claim::node_key(ctx, identity, devnum) {
                Some(key) => {
                    device_claim::live_claim(&*ctx.ledger, &key).map(|c| c.map(|c| c.volume_id))
                }
                None => Ok(None),
            };
            match owner {
                Ok(Some(owner)) if owner != self.volume => {
                    return Err(format!("device {devnum} is held by volume {owner}"));
                }
                Ok(_) => {}
                Err(e) => return Err(format!("the device's owner cannot be read: {e}")),
            }
        }
        if let Some(file) = opened {
            let _ = self.proven.set((devnum, file));
        }
        Ok(())
    }

    /// The identity half of `prove`, handing back the device if it was opened to ask.
    fn prove_identity(
        &self,
        ctx: &NodeCtx,
        devnum: DevNum,
    ) -> std::result::Result<Option<File>, String> {
        match &self.identity {
            Some(DeviceIdentity::Unverified) if self.recorded == Some(devnum) => Ok(None),
            Some(DeviceIdentity::Unverified) => Err(format!(
                "device {} is not the one recorded for a volume without a verifiable identity",
                devnum
            )),
            Some(identity) => ctx
                .backend
                .prove(Shown::Numbers(devnum), identity)
                .map_err(|e| e.to_string()),
            None => Err(format!(
                "nothing is known of what {}'s device must show",
                self.volume
            )),
        }
    }

    /// The device proven to be the volume in this call, still held, when it has these numbers.
    pub fn held(&self, devnum: DevNum) -> Option<&File> {
        self.proven
            .get()
            .filter(|(held, _)| *held == devnum)
            .map(|(_, file)| file)
    }

    /// The recorded device's numbers.
    pub fn recorded_devnum(&self) -> Option<DevNum> {
        self.recorded
    }

    pub fn describe(&self) -> String {
        match &self.identity {
            Some(i) => format!("volume {} ({})", self.volume, describe_identity(i)),
            None => format!("volume {}", self.volume),
        }
    }
}

/// What holds a staging or target path.
#[derive(Debug)]
pub enum Holder {
    Nothing,
    /// The volume's filesystem root, or its device node for block access.
    Volume(MountFacts),
    /// Something else, described for the logs and errors.
    Foreign(String),
}

impl Holder {
    pub fn is_volume(&self) -> bool {
        matches!(self, Holder::Volume(_))
    }
}

/// What holds `entry`, judged against `expected`.
pub fn holder(ctx: &NodeCtx, entry: &dyn Entry, expected: &Expected) -> Result<Holder> {
    let facts = entry.mounted_at().map_err(|e| examine_error(entry, e))?;
    Ok(judge(ctx, facts, expected))
}

/// The same question about an opened entry: the answer holds for the fd that is then used.
pub fn holder_of(
    ctx: &NodeCtx,
    fd: &dyn OpenEntry,
    entry: &dyn Entry,
    expected: &Expected,
) -> Result<Holder> {
    let facts = fd
        .mount_facts(entry.path())
        .map_err(|e| examine_error(entry, e))?;
    Ok(judge(ctx, facts, expected))
}

fn judge(ctx: &NodeCtx, facts: Option<MountFacts>, expected: &Expected) -> Holder {
    let Some(facts) = facts else {
        return Holder::Nothing;
    };
    // A device other than the one recorded is never the volume's, whatever it shows: a second
    // loop device over the volume's file shows the same identity, and a mount of it found at a
    // target was handed out as the volume's, a second filesystem over the same bytes (a
    // sixty-fourth fresh review's F3).
    let is_volumes =
        |dev: DevNum| expected.recorded.is_none_or(|r| r == dev) && expected.is_device(ctx, dev);
    if facts.node.kind == FileKind::BlockDevice {
        let dev = facts.node.rdev;
        // A read-only block publication binds the agent's read-only device laid over the
        // volume's (see `read_only`).
        let ours = is_volumes(dev) || ctx.host.read_only_lies_over(dev).is_some_and(is_volumes);
        return if ours {
            Holder::Volume(facts)
        } else {
            Holder::Foreign(format!("a bind of block device {}", dev))
        };
    }
    if facts.root != std::path::Path::new("/") || !is_volumes(facts.dev) {
        return Holder::Foreign(facts.describe());
    }
    Holder::Volume(facts)
}

/// The numbers a staged record noted, or (older records) its device's numbers now.
pub fn recorded_devnum(ctx: &NodeCtx, staged: &StagedVolume) -> Option<DevNum> {
    staged
        .devnum
        .map(DevNum::from)
        .or_else(|| ctx.host.block_devnum(&staged.device).ok())
}

fn examine_error(entry: &dyn Entry, source: std::io::Error) -> Error {
    Error::MountUnreadable {
        path: entry.path().to_path_buf(),
        source,
    }
}
