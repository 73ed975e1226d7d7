//! What the double's host holds: its mounts, devices and what each shows, scripted failures,
//! and the calls recorded.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;

use super::host::{Call, DoubleHost};
use crate::DevNum;
use crate::node::host::{LoopOrigin, Under};
use crate::probe::ProbeOutcome;
use crate::seam::FileKind as FileType;
use crate::seam::MountFacts;

#[derive(Default)]
pub struct State {
    /// The simulation's crash after this many more host changes (mkfs, mount, bind, unmount,
    /// grow), each done on the host and not yet recorded.
    pub crash_after_acts: Option<u32>,
    /// Mounts per path, the top-most last.
    pub mounts: HashMap<PathBuf, Vec<MountFacts>>,
    /// Paths whose top-most mount lets device nodes open (made without `nodev`).
    pub dev_allowed: HashSet<PathBuf>,
    /// The places the kernel shows a path's mount again through propagation (scripted).
    pub copies: HashMap<PathBuf, Vec<PathBuf>>,
    /// Device files and their numbers.
    pub devices: HashMap<PathBuf, DevNum>,
    /// Device sizes (bytes); the filesystem sizes mkfs made.
    pub device_bytes: HashMap<DevNum, u64>,
    pub fs_bytes: HashMap<DevNum, u64>,
    /// What a probe finds on each device.
    pub probes: HashMap<DevNum, ProbeOutcome>,
    /// Devices whose blank proof finds data.
    pub not_blank: HashSet<DevNum>,
    /// Devices something else claims (mounted elsewhere, a mapper).
    pub claimed: HashSet<DevNum>,
    /// Views another call holds claimed exclusively (`hold_views`), how many times.
    pub view_holds: HashMap<DevNum, usize>,
    /// Read-only devices laid over a volume's: (ro, under).
    pub read_only: Vec<(DevNum, DevNum)>,
    /// Each read-only device's tag: a removal takes only its own.
    pub ro_tags: HashMap<DevNum, String>,
    /// The UUID each device's last mkfs wrote: its backup superblocks carry it even after the
    /// primary one is overwritten (what `carries_uuid` finds).
    pub uuids: HashMap<DevNum, String>,
    /// What each device's bytes lie on (a loop device's backing, a mapper's slaves).
    pub lies_on: HashMap<DevNum, Vec<Under>>,
    /// The mappers sysfs shows built on each device.
    pub holders: HashMap<DevNum, Vec<DevNum>>,
    /// The backing file (st_dev, st_ino) of devices that are loop devices over a file.
    pub loop_files: HashMap<DevNum, (u64, u64)>,
    /// What loop devices show of the agent that made them.
    pub loop_origins: HashMap<DevNum, LoopOrigin>,
    /// Devices with no identity (a disk without a serial): proven by their numbers only.
    pub unverified: HashSet<DevNum>,
    /// Call names that fail, with the error's text.
    pub fail: HashMap<&'static str, String>,
    pub calls: Vec<Call>,
    pub(super) next_minor: u32,
    /// Power cuts so far: a reboot ends every attachment (`attachment`).
    pub boot: u32,
    /// Volumes' usage and health (`health`).
    pub health: super::health::Health,
}

impl State {
    /// The device at the bottom of `dev`'s stack (itself when it lies on nothing).
    pub fn bottom(&self, mut dev: DevNum) -> DevNum {
        for _ in 0..8 {
            match self.lies_on.get(&dev).and_then(|l| l.first()) {
                Some(Under::Device(d)) => dev = *d,
                _ => break,
            }
        }
        dev
    }

    /// Every device that shows `dev`'s bytes: those with its bottom (itself included).
    pub fn same_bytes(&self, dev: DevNum) -> Vec<DevNum> {
        let bottom = self.bottom(dev);
        let mut all: Vec<DevNum> = (self.devices.values().copied())
            .filter(|d| self.bottom(*d) == bottom)
            .collect();
        all.push(dev);
        all.sort();
        all.dedup();
        all
    }
}

impl DoubleHost {
    /// What uses `devnum`'s bytes raw: a bind of the node of a device showing them (the real
    /// host's `raw_use`; a device laid over it is a view, `views_of`).
    pub fn raw_use_of(&self, devnum: DevNum) -> Option<String> {
        let s = self.state();
        let family = s.same_bytes(devnum);
        s.mounts.iter().find_map(|(at, stack)| {
            stack
                .iter()
                .any(|m| m.node.kind == FileType::BlockDevice && family.contains(&m.node.rdev))
                .then(|| format!("bound at {}", at.display()))
        })
    }
}
