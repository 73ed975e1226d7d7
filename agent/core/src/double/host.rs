//! The recording double of the host (its devices, evidence and backend are in `devices`, what it
//! holds in `state`, the views of a device's bytes in `views`).
//! Devices are plain files given device numbers; the mount table is a stack of mounts per path;
//! every call that changes the host is recorded with the journal line committed last before it
//! (so a test sees what was durable when the host was touched). Failures are scripted by call
//! name.

use crate::DevNum;
use std::collections::HashSet;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::seam::FileKind as FileType;

use super::devices::{DoubleDevice, DoubleEvidence, signature};
use super::entries::resolve;
use super::ledger::MemLedger;
use crate::error::Result;
use crate::format::DeviceEvidence;
use crate::format::Probed;
use crate::node::backend::Backend;
use crate::node::host::{DeviceHandle, HostOps};
use crate::node::host::{Entry, LoopOrigin, PathRefusal, Place, Under};
use crate::node::host::{HeldViews, ReadOnlyDevice, ReadOnlyFound, View};
use crate::node::volume_device::VolumeDevice;
use crate::probe::ProbeOutcome;
use crate::request::{FormatOptions, FsType};
use crate::seam::MountFacts;
use crate::seam::{EntryStat, FsToolError, FsckOutcome, ReadOutcome};

/// The device filesystem's numbers: what a bind of a device node shows as its `dev`.
pub(super) const DEVTMPFS: DevNum = DevNum::new(0, 5);
pub const GIB: u64 = 1 << 30;

pub use super::state::State;

/// One call that changed the host, with the last journal line committed before it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    pub what: String,
    pub after: Option<String>,
    /// The last write before the call was durable (so was every line before it).
    pub durable: bool,
}

pub struct DoubleHost {
    pub(super) ledger: Arc<MemLedger>,
    /// Whose journal the recorded calls are set against.
    pub(super) watched: String,
    pub(super) dir: PathBuf,
    pub(super) state: Mutex<State>,
    /// Itself, for the entries it hands out: they act through it, as a real entry acts on the
    /// host through its own descriptors.
    pub(super) me: std::sync::Weak<DoubleHost>,
}

pub fn mount_facts(dev: DevNum, fs_type: &str, read_only: bool) -> MountFacts {
    MountFacts {
        dev,
        fs_type: fs_type.to_string(),
        root: PathBuf::from("/"),
        read_only,
        vfs_bits: 0,
        idmapped: false,
        super_read_only: false,
        node: EntryStat {
            kind: FileType::Directory,
            dev,
            rdev: DevNum::new(0, 0),
            ino: 2,
            size: 0,
            mount_root: Some(true),
            mnt_id: None,
            mnt_id_unique: false,
        },
    }
}

fn tool_error(e: io::Error) -> FsToolError {
    FsToolError::ToolFailed {
        tool: "double".into(),
        device: PathBuf::from("/dev/double"),
        code: 1,
        stderr: e.to_string(),
    }
}

impl HostOps for DoubleHost {
    fn prepare(
        &self,
        prefix: &Path,
        path: &Path,
    ) -> std::result::Result<Box<dyn Entry>, PathRefusal> {
        self.examinable()?;
        let entry = resolve(prefix, path, true, self.scripted("mkdir"), self.me())?;
        entry
            .map(|e| Box::new(e) as Box<dyn Entry>)
            .ok_or(PathRefusal::NotDirectory)
    }

    fn lookup(
        &self,
        prefix: &Path,
        path: &Path,
    ) -> std::result::Result<Option<Box<dyn Entry>>, PathRefusal> {
        self.examinable()?;
        let entry = resolve(prefix, path, false, self.scripted("mkdir"), self.me())?;
        Ok(entry.map(|e| Box::new(e) as Box<dyn Entry>))
    }

    fn open_device(&self, path: &Path) -> io::Result<Box<dyn DeviceHandle>> {
        let devnum = self
            .state()
            .devices
            .get(path)
            .copied()
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
        Ok(Box::new(DoubleDevice {
            path: path.to_path_buf(),
            file: File::open(path)?,
            devnum,
            exclusive: false,
            claimed: {
                let s = self.state();
                s.claimed.contains(&devnum) || s.view_holds.contains_key(&devnum)
            },
        }))
    }

    fn block_devnum(&self, path: &Path) -> io::Result<DevNum> {
        self.state()
            .devices
            .get(path)
            .copied()
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
    }

    fn still_claimed(&self, devnum: DevNum, _held: Option<&File>) -> bool {
        let s = self.state();
        s.claimed.contains(&devnum) || s.view_holds.contains_key(&devnum)
    }

    fn device_exists(&self, devnum: DevNum) -> bool {
        self.state().devices.values().any(|d| *d == devnum)
    }

    fn device_read_only(&self, devnum: DevNum) -> bool {
        self.state().read_only.iter().any(|(ro, _)| *ro == devnum)
    }

    fn whole_disk(&self, devnum: DevNum) -> DevNum {
        devnum
    }

    fn lies_on(&self, devnum: DevNum) -> io::Result<Vec<Under>> {
        Ok(self
            .state()
            .lies_on
            .get(&devnum)
            .cloned()
            .unwrap_or_default())
    }

    fn loop_backing(&self, devnum: DevNum) -> Option<(u64, u64)> {
        self.state().loop_files.get(&devnum).copied()
    }

    fn loop_origin(&self, devnum: DevNum) -> io::Result<Option<LoopOrigin>> {
        Ok(self.state().loop_origins.get(&devnum).cloned())
    }

    fn built_on(&self, devnum: DevNum) -> io::Result<Vec<DevNum>> {
        Ok(self
            .state()
            .holders
            .get(&devnum)
            .cloned()
            .unwrap_or_default())
    }

    fn views_of(&self, devnum: DevNum) -> io::Result<Vec<View>> {
        self.views_of_bytes(devnum)
    }

    fn hold_views(&self, _device: DevNum, views: &[View]) -> io::Result<HeldViews> {
        let views: Vec<DevNum> = views.iter().map(|v| v.devnum).collect();
        self.hold_views_of(&views)
    }

    fn device_bytes(&self, device: &Path) -> io::Result<u64> {
        let s = self.state();
        Ok(s.device_bytes[&s.devices[device]])
    }

    fn attachment(&self, devnum: DevNum) -> Option<String> {
        Some(format!("boot-{}-seq-{}", self.state().boot, devnum.minor))
    }

    fn evidence<'a>(
        &'a self,
        _backend: &'a dyn Backend,
        device: &'a VolumeDevice,
    ) -> Box<dyn DeviceEvidence + 'a> {
        Box::new(DoubleEvidence { host: self, device })
    }

    fn lay_read_only(
        &self,
        device: &VolumeDevice,
        tag: &str,
        _retry: bool,
    ) -> Result<ReadOnlyDevice> {
        self.lay_read_only_over(device, tag)
    }

    fn remove_read_only(&self, tag: &str) -> Result<usize> {
        self.remove_read_only_tagged(tag)
    }

    fn read_only_lies_over(&self, devnum: DevNum) -> Option<DevNum> {
        let s = self.state();
        s.read_only
            .iter()
            .find(|(ro, _)| *ro == devnum)
            .map(|(_, under)| *under)
    }

    fn resize_read_only(
        &self,
        tags: &HashSet<String>,
        over: DevNum,
    ) -> io::Result<Vec<(PathBuf, io::Result<u64>)>> {
        self.resize_read_only_over(tags, over)
    }

    fn raw_use(&self, devnum: DevNum, _device: &Path) -> io::Result<Option<String>> {
        Ok(self.raw_use_of(devnum))
    }

    fn read_only_devices(&self, prefixes: &[&str]) -> Result<Vec<ReadOnlyFound>> {
        Ok(self.read_only_devices_of(prefixes))
    }

    fn read_only_uses(&self, found: &[ReadOnlyFound]) -> Vec<Option<String>> {
        self.read_only_uses_of(found)
    }

    fn detach_read_only(&self, found: &ReadOnlyFound) -> Result<()> {
        self.detach_read_only_of(found)
    }

    fn read_first_block(&self, device: &Path) -> ReadOutcome {
        self.read_first_block_of(device)
    }

    fn may_grow_mounted_ext(&self) -> bool {
        !self.state().health.no_resource_cap
    }

    fn fs_supported(&self, _fs: FsType) -> std::result::Result<(), crate::seam::MissingTools> {
        match self.state().fail.get("supported") {
            Some(_) => Err(crate::seam::MissingTools {
                tools: vec!["mkfs.ext4"],
                package: "e2fsprogs",
            }),
            None => Ok(()),
        }
    }

    fn probe(&self, device: &Path, _fs: FsType) -> Result<Probed> {
        let s = self.state();
        let devnum = s.devices[device];
        Ok(Probed {
            outcome: s.probes[&devnum].clone(),
            fs_bytes: s.fs_bytes.get(&devnum).copied(),
        })
    }

    fn check_size(
        &self,
        _fs: FsType,
        _device: &Path,
        _opts: &FormatOptions,
    ) -> std::result::Result<(), FsToolError> {
        Ok(())
    }

    fn mkfs(
        &self,
        fs: FsType,
        device: &Path,
        uuid: &str,
        _opts: &FormatOptions,
    ) -> std::result::Result<(), FsToolError> {
        self.act(format!("mkfs {fs} {}", Self::name(device)), "mkfs")
            .map_err(tool_error)?;
        let mut s = self.state();
        let devnum = s.devices[device];
        let bytes = s.device_bytes[&devnum];
        // One set of bytes, whichever device shows them (a loop device laid over another).
        for d in s.same_bytes(devnum) {
            s.fs_bytes.insert(d, bytes);
            s.probes.insert(d, ProbeOutcome::Found(signature(fs, uuid)));
            s.uuids.insert(d, uuid.to_string());
        }
        // Someone binds the device's node while mkfs runs (after the stage's first checks).
        if let Some(at) = s.fail.get("bind_during_mkfs").cloned() {
            let mut bind = mount_facts(DEVTMPFS, "devtmpfs", false);
            bind.node.kind = FileType::BlockDevice;
            bind.node.rdev = devnum;
            s.mounts.insert(PathBuf::from(at), vec![bind]);
        }
        drop(s);
        self.after_act();
        Ok(())
    }

    fn fsck(&self, fs: FsType, device: &Path) -> std::result::Result<FsckOutcome, FsToolError> {
        self.act(format!("fsck {fs} {}", Self::name(device)), "fsck")
            .map_err(tool_error)?;
        Ok(FsckOutcome::Clean)
    }

    fn fs_bytes(&self, _fs: FsType, device: &Path) -> io::Result<u64> {
        let s = self.state();
        Ok(s.fs_bytes[&s.devices[device]])
    }

    fn mounted_fs_bytes(&self, fs: FsType, device: &Path, _mount_point: &Path) -> io::Result<u64> {
        self.fs_bytes(fs, device)
    }

    fn grow(
        &self,
        fs: FsType,
        device: &Path,
        _mount_point: &Path,
    ) -> std::result::Result<(), FsToolError> {
        self.act(format!("grow {fs} {} mounted", Self::name(device)), "grow")
            .map_err(tool_error)?;
        self.grown(device);
        Ok(())
    }

    fn grow_offline(&self, fs: FsType, device: &Path) -> std::result::Result<(), FsToolError> {
        self.act(format!("grow {fs} {} offline", Self::name(device)), "grow")
            .map_err(tool_error)?;
        self.grown(device);
        Ok(())
    }

    fn place_of(&self, path: &Path) -> io::Result<Place> {
        place(path)
    }
}

pub(super) fn place(path: &Path) -> io::Result<Place> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path)?;
    let dev = m.dev();
    Ok(Place {
        dev: DevNum::new(
            u32::try_from(((dev >> 32) & 0xffff_f000) | ((dev >> 8) & 0xfff)).unwrap_or(0),
            u32::try_from(((dev >> 12) & 0xffff_ff00) | (dev & 0xff)).unwrap_or(0),
        ),
        ino: m.ino(),
    })
}

impl DoubleHost {
    fn me(&self) -> Arc<DoubleHost> {
        self.me.upgrade().expect("the double lives in an Arc")
    }
}
