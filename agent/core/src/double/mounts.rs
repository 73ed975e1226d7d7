//! The double's mount table: mounts and binds pushed onto a stack per path, unmounts popping the
//! top, a path's ancestry, and the simulation's crash in the middle of a step.

use std::collections::HashSet;
use std::io;
use std::path::{Path, PathBuf};

use super::host::{DEVTMPFS, DoubleHost, mount_facts, place};
use crate::DevNum;
use crate::node::host::Ancestry;
use crate::request::FsType;
use crate::seam::{FileKind as FileType, MountFacts, Unmounted};

/// What an entry the double made asks and does through itself (`entries`), by its path.
impl DoubleHost {
    pub(super) fn mounted_at(&self, path: &Path) -> io::Result<Option<MountFacts>> {
        match self.scripted("mounted_at") {
            Some(why) => Err(io::Error::other(why)),
            None => Ok(self.top(path)),
        }
    }

    /// Whether a mount lies at a path strictly below `path`.
    pub(super) fn has_submounts(&self, path: &Path) -> bool {
        let s = self.state();
        s.mounts
            .iter()
            .any(|(at, stack)| !stack.is_empty() && at != path && at.starts_with(path))
    }

    /// The places scripted as the kernel's copies of the mount at `path` (`State::copies`).
    pub(super) fn copies_of(&self, path: &Path) -> Vec<PathBuf> {
        self.state().copies.get(path).cloned().unwrap_or_default()
    }

    pub(super) fn mount_device(
        &self,
        device: &Path,
        target_path: &Path,
        fs: FsType,
        data: &[String],
        readonly: bool,
        vfs_bits: u64,
    ) -> io::Result<()> {
        let what = format!(
            "mount {} {} on {}{}{}",
            fs,
            Self::name(device),
            Self::name(target_path),
            if readonly { " ro" } else { "" },
            if data.is_empty() {
                String::new()
            } else {
                format!(" -o {}", data.join(","))
            }
        );
        let dev = self.state().devices[device];
        if self.state().view_holds.contains_key(&dev) {
            // Another call holds it exclusively: the kernel's mount is refused, EBUSY.
            return Err(io::Error::from_raw_os_error(super::devices::EBUSY));
        }
        self.act(what, "mount")?;
        let mut s = self.state();
        s.claimed.insert(dev);
        let facts = match s.fail.get("mount_lands_foreign") {
            // Something else ends up on top (another mount raced in over ours).
            Some(_) => mount_facts(DevNum::new(8, 99), "ext4", false),
            None => MountFacts {
                vfs_bits: vfs_bits & KEPT,
                // A first mount read-only makes the filesystem itself read-only.
                super_read_only: readonly,
                ..mount_facts(dev, fs.name(), readonly)
            },
        };
        s.mounts
            .entry(target_path.to_path_buf())
            .or_default()
            .push(facts);
        devices_open(&mut s.dev_allowed, target_path, vfs_bits, true);
        drop(s);
        self.after_act();
        Ok(())
    }

    /// A bind keeps its source's `dev` (open_tree's clone) unless it is given `nodev`.
    pub(super) fn bind(
        &self,
        source: &Path,
        target: &Path,
        readonly: bool,
        vfs_bits: u64,
    ) -> io::Result<()> {
        // The source is a /proc/self/fd path: the entry or device file it names.
        let from = std::fs::read_link(source)?;
        let what = format!(
            "bind {} on {}{}",
            Self::name(&from),
            Self::name(target),
            if readonly { " ro" } else { "" }
        );
        self.act(what, "bind")?;
        let mut s = self.state();
        let facts = if let Some(&rdev) = s.devices.get(&from) {
            let mut f = mount_facts(DEVTMPFS, "devtmpfs", readonly);
            f.node.kind = FileType::BlockDevice;
            f.node.rdev = rdev;
            f
        } else if let Some(top) = s.mounts.get(&from).and_then(|m| m.last()) {
            MountFacts {
                read_only: readonly,
                vfs_bits: top.vfs_bits | vfs_bits & KEPT,
                ..top.clone()
            }
        } else {
            let mut f = mount_facts(DevNum::new(8, 1), "ext4", readonly);
            f.root = from.clone();
            f
        };
        s.mounts
            .entry(target.to_path_buf())
            .or_default()
            .push(facts);
        let source_dev = s.dev_allowed.contains(&from);
        devices_open(&mut s.dev_allowed, target, vfs_bits, source_dev);
        drop(s);
        self.after_act();
        Ok(())
    }

    pub(super) fn unmount(&self, path: &Path) -> io::Result<Unmounted> {
        self.act(format!("unmount {}", Self::name(path)), "unmount")?;
        let mut s = self.state();
        let popped = s.mounts.get_mut(path).and_then(Vec::pop);
        s.dev_allowed.remove(path);
        let Some(gone) = popped else {
            return Ok(Unmounted::NotMounted);
        };
        let still = s.mounts.values().flatten().any(|m| m.dev == gone.dev);
        if !still {
            s.claimed.remove(&gone.dev);
        }
        drop(s);
        self.after_act();
        Ok(Unmounted::Done)
    }

    /// Each directory from the entry's up to the harness's prefix, by name (the double's paths
    /// are plain directories that nothing renames).
    pub(super) fn ancestry(&self, path: &Path) -> io::Result<Ancestry> {
        let mut dirs = Vec::new();
        let mut dir = path.parent();
        while let Some(d) = dir {
            let here = place(d)?;
            // The harness's allowed prefix, or its directory (never above it).
            if d.parent().is_none() || d == self.dir.join("allowed") || d == self.dir {
                return Ok(Ancestry { prefix: here, dirs });
            }
            dirs.push(here);
            dir = d.parent();
        }
        Err(io::Error::other("no prefix above the entry"))
    }

    pub(super) fn grown(&self, device: &Path) {
        let mut s = self.state();
        let devnum = s.devices[device];
        let bytes = s.device_bytes[&devnum];
        s.fs_bytes.insert(devnum, bytes);
        drop(s);
        self.after_act();
    }

    /// The simulation's crash in the middle of a step: after the host did what it was asked,
    /// before the agent recorded it (`State::crash_after_acts`).
    pub(super) fn after_act(&self) {
        let mut s = self.state();
        match s.crash_after_acts {
            Some(n) if n <= 1 => {
                s.crash_after_acts = None;
                drop(s);
                std::panic::panic_any(Crash);
            }
            Some(n) => s.crash_after_acts = Some(n - 1),
            None => {}
        }
    }
}

/// The per-mount bits a mount records (nodev is `State::dev_allowed`'s).
const KEPT: u64 = crate::request::ms::NOSUID | crate::request::ms::NOEXEC;

/// Whether the mount just made at `path` lets device nodes open: not with `nodev` in `vfs_bits`,
/// nor where `inherited` says its source did not.
fn devices_open(dev_allowed: &mut HashSet<PathBuf>, path: &Path, vfs_bits: u64, inherited: bool) {
    if inherited && vfs_bits & crate::request::ms::NODEV == 0 {
        dev_allowed.insert(path.to_path_buf());
    } else {
        dev_allowed.remove(path);
    }
}

/// The payload of a simulated crash (the panic the simulation catches).
pub struct Crash;
