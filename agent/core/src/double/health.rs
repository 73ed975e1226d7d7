//! What the double answers for expansion, stats, volume condition and reclaim: a mounted
//! filesystem's usage (its mkfs size; `used` scripted per device), syncfs and FITRIM (recorded
//! calls, their failures scripted by errno name), the health read (scripted per device), and
//! read-only devices following a resize.

use std::collections::{HashMap, HashSet};
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::host::DoubleHost;
use crate::DevNum;
use crate::error::Result;
use crate::node::host::ReadOnlyFound;
use crate::seam::{FsUsage, ReadOutcome, TrimError};

/// What a test scripts of the volumes' health and usage.
#[derive(Default)]
pub struct Health {
    /// Bytes a mounted filesystem uses, per device (0 when not said).
    pub used: HashMap<DevNum, u64>,
    /// How the health read of a device ends, when not `Ok`: "EIO", "hang" or any other text (a
    /// failure of that text).
    pub reads: HashMap<DevNum, &'static str>,
    /// Why FITRIM fails: "EOPNOTSUPP", "ENOTTY", "EROFS" or any other text.
    pub trim: Option<&'static str>,
    /// Bytes FITRIM says it discarded, taken off `used`.
    pub trims: u64,
    /// The process lacks CAP_SYS_RESOURCE.
    pub no_resource_cap: bool,
}

impl DoubleHost {
    /// statvfs of the filesystem mounted at `path` (the top mount there).
    pub(super) fn usage_at(&self, path: &Path) -> io::Result<FsUsage> {
        let top = self.top(path);
        let s = self.state();
        let dev = top
            .map(|m| m.dev)
            .ok_or_else(|| io::Error::other(format!("{} holds no filesystem", path.display())))?;
        let total = s.fs_bytes.get(&dev).copied().unwrap_or(0);
        let used = s.health.used.get(&dev).copied().unwrap_or(0).min(total);
        Ok(FsUsage {
            total_bytes: total,
            available_bytes: total - used,
            used_bytes: used,
            total_inodes: 1000,
            available_inodes: 990,
            used_inodes: 10,
        })
    }

    pub(super) fn sync_at(&self, path: &Path) -> io::Result<()> {
        self.act(format!("syncfs {}", Self::name(path)), "syncfs")
    }

    pub(super) fn trim_at(&self, path: &Path) -> Result<u64, TrimError> {
        self.act(format!("fitrim {}", Self::name(path)), "fitrim")
            .map_err(TrimError::Io)?;
        let dev = self.top(path).map(|m| m.dev);
        let mut s = self.state();
        match s.health.trim {
            Some("EOPNOTSUPP") => return Err(TrimError::Unsupported),
            Some("ENOTTY") => return Err(TrimError::NotImplemented),
            Some("EROFS") => return Err(TrimError::ReadOnly),
            Some(other) => return Err(TrimError::Io(io::Error::other(other))),
            None => {}
        }
        let trimmed = s.health.trims;
        if let Some(used) = dev.and_then(|d| s.health.used.get_mut(&d)) {
            *used = used.saturating_sub(trimmed);
        }
        Ok(trimmed)
    }

    pub(super) fn read_first_block_of(&self, device: &Path) -> ReadOutcome {
        let s = self.state();
        let Some(dev) = s.devices.get(device) else {
            return ReadOutcome::Failed(io::Error::from(io::ErrorKind::NotFound));
        };
        match s.health.reads.get(dev) {
            None => ReadOutcome::Ok,
            Some(&"EIO") => ReadOutcome::IoError(io::Error::other("EIO")),
            Some(&"hang") => ReadOutcome::Hanging(Duration::from_secs(30)),
            Some(other) => ReadOutcome::Failed(io::Error::other(*other)),
        }
    }

    /// Each read-only device with one of `tags` over `over` takes `over`'s size, unless
    /// "set_capacity" is scripted to fail.
    pub(super) fn resize_read_only_over(
        &self,
        tags: &HashSet<String>,
        over: DevNum,
    ) -> io::Result<Vec<(PathBuf, io::Result<u64>)>> {
        let mut s = self.state();
        let size = s.device_bytes.get(&over).copied().unwrap_or(0);
        let ours: Vec<DevNum> = (s.read_only.iter())
            .filter(|(ro, under)| {
                *under == over && s.ro_tags.get(ro).is_some_and(|t| tags.contains(t))
            })
            .map(|(ro, _)| *ro)
            .collect();
        let fails = s.fail.get("set_capacity").cloned();
        let mut out = Vec::new();
        for ro in ours {
            let path = s
                .devices
                .iter()
                .find(|(_, d)| **d == ro)
                .map(|(p, _)| p.clone());
            let path = path.unwrap_or_else(|| PathBuf::from(format!("/dev/block/{ro}")));
            match &fails {
                Some(why) => out.push((path, Err(io::Error::other(why.clone())))),
                None => {
                    s.device_bytes.insert(ro, size);
                    out.push((path, Ok(size)));
                }
            }
        }
        Ok(out)
    }
}

impl DoubleHost {
    /// The read-only devices whose tag starts with one of `prefixes`.
    pub(super) fn read_only_devices_of(&self, prefixes: &[&str]) -> Vec<ReadOnlyFound> {
        let s = self.state();
        (s.read_only.iter())
            .filter_map(|(ro, _)| {
                let tag = s.ro_tags.get(ro)?;
                prefixes
                    .iter()
                    .any(|p| tag.starts_with(p))
                    .then(|| ReadOnlyFound {
                        device: (s.devices.iter()).find(|(_, d)| **d == *ro).map_or_else(
                            || PathBuf::from(format!("/dev/block/{ro}")),
                            |(p, _)| p.clone(),
                        ),
                        tag: tag.clone(),
                    })
            })
            .collect()
    }

    /// A read-only device is used while a mount binds its node or someone claims it.
    pub(super) fn read_only_uses_of(&self, found: &[ReadOnlyFound]) -> Vec<Option<String>> {
        let s = self.state();
        found
            .iter()
            .map(|f| {
                let ro = *s.devices.get(&f.device)?;
                let bound = s.mounts.iter().find_map(|(at, stack)| {
                    stack.iter().any(|m| m.node.rdev == ro).then(|| at.clone())
                });
                bound.map(|at| format!("its node is bound at {}", at.display()))
            })
            .collect()
    }

    pub(super) fn detach_read_only_of(&self, found: &ReadOnlyFound) -> Result<()> {
        let mut s = self.state();
        let Some(ro) = s.devices.get(&found.device).copied() else {
            return Ok(());
        };
        s.read_only.retain(|(d, _)| *d != ro);
        s.calls.push(super::host::Call {
            what: format!("detach read-only {ro}"),
            after: None,
            durable: true,
        });
        Ok(())
    }
}
