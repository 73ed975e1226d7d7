//! The recording double of the host (its devices, evidence and backend are in `devices`).
//! Devices are plain files given device numbers; the mount table is a stack of mounts per path;
//! every call that changes the host is recorded with the journal line committed last before it
//! (so a test sees what was durable when the host was touched). Failures are scripted by call
//! name.

use crate::DevNum;
use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::seam::FileKind as FileType;

use super::devices::{DoubleDevice, DoubleEvidence, signature};
use super::entries::resolve;
use super::ledger::MemLedger;
use crate::error::{Error, Result};
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

/// One call that changed the host, with the last journal line committed before it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    pub what: String,
    pub after: Option<String>,
    /// The last write before the call was durable (so was every line before it).
    pub durable: bool,
}

#[derive(Default)]
pub struct State {
    /// The simulation's crash after this many more host changes (mkfs, mount, bind, unmount,
    /// grow), each done on the host and not yet recorded.
    pub crash_after_acts: Option<u32>,
    /// Mounts per path, the top-most last.
    pub mounts: HashMap<PathBuf, Vec<MountFacts>>,
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
        let s = self.state();
        let bottom = s.bottom(devnum);
        let mut views: Vec<DevNum> = (s.devices.values().copied())
            .filter(|d| *d != devnum && s.bottom(*d) == bottom)
            .collect();
        views.extend(
            (s.read_only.iter())
                .filter(|(_, under)| s.bottom(*under) == bottom)
                .map(|(ro, _)| *ro),
        );
        views.sort();
        views.dedup();
        Ok(views
            .into_iter()
            .map(|d| {
                let mounted = s.mounts.values().flatten().any(|m| {
                    m.dev == d || (m.node.kind == FileType::BlockDevice && m.node.rdev == d)
                });
                let over = s.read_only.iter().find(|(ro, _)| *ro == d).map(|(_, u)| *u);
                View {
                    devnum: d,
                    name: s.ro_tags.get(&d).cloned().unwrap_or_default(),
                    read_only: over.is_some(),
                    lies_over: over,
                    in_use: (mounted || s.claimed.contains(&d) || s.view_holds.contains_key(&d))
                        .then(|| "mounted or claimed exclusively".to_string()),
                }
            })
            .collect())
    }

    /// Each view claimed as O_EXCL claims it: refused while mounted or claimed, and claimed
    /// (`still_claimed`, in use to `views_of`, a mount of it refused) until the hold drops.
    fn hold_views(&self, _device: DevNum, views: &[DevNum]) -> io::Result<HeldViews> {
        let mut s = self.state();
        if views
            .iter()
            .any(|v| s.claimed.contains(v) || s.view_holds.contains_key(v))
        {
            return Err(io::Error::from_raw_os_error(super::devices::EBUSY));
        }
        for v in views {
            *s.view_holds.entry(*v).or_default() += 1;
        }
        drop(s);
        let host = self.me.upgrade().expect("the double outlives its calls");
        Ok(HeldViews {
            claims: vec![Box::new(super::devices::ViewHold {
                host,
                devnums: views.to_vec(),
            })],
            devnums: views.to_vec(),
        })
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
        self.act(
            format!("lay read-only over {}", Self::name(device.path())),
            "lay",
        )
        .map_err(|e| Error::LoopDevice {
            op: "laying a read-only loop device".into(),
            source: Box::new(e),
        })?;
        let n = self.state().read_only.len();
        let path = self.add_device(&format!("ro-{n}"), 0);
        let ro = self.devnum(&path);
        let mut s = self.state();
        s.read_only.push((ro, device.devnum()));
        s.ro_tags.insert(ro, tag.to_string());
        drop(s);
        let file = File::open(&path).map_err(|e| Error::io("opening", e))?;
        Ok(ReadOnlyDevice { file, path })
    }

    fn remove_read_only(&self, tag: &str) -> Result<usize> {
        self.act("remove read-only".into(), "remove_ro")
            .map_err(|e| Error::LoopDevice {
                op: "removing read-only loop devices".into(),
                source: Box::new(e),
            })?;
        let mut s = self.state();
        let State {
            read_only, ro_tags, ..
        } = &mut *s;
        let before = read_only.len();
        read_only.retain(|(ro, _)| ro_tags.get(ro).is_some_and(|t| t != tag));
        Ok(before - read_only.len())
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
