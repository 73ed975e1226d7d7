//! The host itself, as the core's node pipeline asks and changes it (`ebs_node_core::node::host`):
//! the seam's implementation, through the handles this crate makes (an `Anchored` entry, an
//! `EntryFd`, a `HeldDevice`: `handles`), the never-format rule's evidence read from the held
//! device (`evidence`), and the read-only devices a read-only block publication binds
//! (`read_only`).

use ebs_node_core::DevNum;
use std::collections::HashSet;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

pub mod evidence;
pub mod handles;
pub mod read_only;

use crate::anchor::Anchored;
use crate::blkid;
use crate::device::{self, HeldDevice};
use crate::fstools::{FsTools, filesystem_bytes_of};
use ebs_node_core::error::{Error, Result};
use ebs_node_core::format::{DeviceEvidence, Probed, is_requested};
use ebs_node_core::node::backend::Backend;
use ebs_node_core::node::host::{
    DeviceHandle, Entry, HostOps, LoopOrigin, PathRefusal, Place, ReadOnlyDevice, ReadOnlyFound,
    Under,
};
use ebs_node_core::node::path_handles;
use ebs_node_core::node::volume_device::VolumeDevice;
use ebs_node_core::probe::ProbeOutcome;
use ebs_node_core::request::{FormatOptions, FsType, RequestPath};
use ebs_node_core::seam::{FsToolError, FsckOutcome, MissingTools, ReadOutcome};
use evidence::HeldEvidence;
use handles::path_refusal;

/// A request path held as the host crate's `Anchored` itself, for the daemon's own calls that
/// act on it through the host crate (reclaim's trim, expand's grow); `None`: a directory above
/// it is missing.
pub fn anchored_lookup(path: &RequestPath) -> Result<Option<Anchored>> {
    Anchored::lookup(path.prefix(), path.as_path())
        .map_err(|e| path_handles::refused(path.field(), path.as_path(), path_refusal(e)))
}

/// The host itself, through the host crate.
pub struct RealHost {
    pub fstools: FsTools,
}

impl HostOps for RealHost {
    fn prepare(
        &self,
        prefix: &Path,
        path: &Path,
    ) -> std::result::Result<Box<dyn Entry>, PathRefusal> {
        match Anchored::prepare(prefix, path) {
            Ok(entry) => Ok(Box::new(entry)),
            Err(e) => Err(path_refusal(e)),
        }
    }

    fn lookup(
        &self,
        prefix: &Path,
        path: &Path,
    ) -> std::result::Result<Option<Box<dyn Entry>>, PathRefusal> {
        match Anchored::lookup(prefix, path) {
            Ok(entry) => Ok(entry.map(|e| Box::new(e) as Box<dyn Entry>)),
            Err(e) => Err(path_refusal(e)),
        }
    }

    fn open_device(&self, path: &Path) -> io::Result<Box<dyn DeviceHandle>> {
        Ok(Box::new(HeldDevice::open(path)?))
    }

    fn block_devnum(&self, path: &Path) -> io::Result<DevNum> {
        device::block_devnum(path)
    }

    fn still_claimed(&self, devnum: DevNum, held: Option<&File>) -> bool {
        let ask = || held.map_or_else(|| device::still_claimed(devnum), device::held_still_claimed);
        // A private copy this agent's own scan made of a mount namespace holds every mount of
        // it while it lives: a filesystem unmounted meanwhile stays claimed by the agent itself
        // (an unstage was refused "still mounted elsewhere": rehearsal 71). Asked again once no
        // such copy may live.
        ask() && (!crate::device_binds::own_copies_settled(crate::device_binds::WITHIN) || ask())
    }

    fn device_exists(&self, devnum: DevNum) -> bool {
        Path::new(&format!("/sys/dev/block/{}", devnum)).exists()
    }

    fn device_read_only(&self, devnum: DevNum) -> bool {
        std::fs::read_to_string(format!("/sys/dev/block/{devnum}/ro"))
            .map_or(true, |ro| ro.trim() != "0")
    }

    fn lies_on(&self, devnum: DevNum) -> io::Result<Vec<Under>> {
        crate::loopdev::stacking::lies_on(devnum)
    }

    fn loop_backing(&self, devnum: DevNum) -> Option<(u64, u64)> {
        crate::loopdev::stacking::loop_backing(devnum)
    }

    fn loop_origin(&self, devnum: DevNum) -> io::Result<Option<LoopOrigin>> {
        let Some(status) = crate::loopdev::overlay::status_by_devnum(devnum)? else {
            return Ok(None);
        };
        let (state_dir, file_links) = crate::loopdev::stacking::backing_signs(devnum);
        Ok(Some(LoopOrigin {
            name: status.tag,
            state_dir,
            file_links,
        }))
    }

    fn built_on(&self, devnum: DevNum) -> io::Result<Vec<DevNum>> {
        crate::loopdev::stacking::built_on(devnum)
    }

    fn views_of(&self, devnum: DevNum) -> io::Result<Vec<ebs_node_core::node::host::View>> {
        crate::loopdev::views::views_of(devnum)
    }

    fn hold_views(
        &self,
        device: DevNum,
        views: &[ebs_node_core::node::host::View],
    ) -> io::Result<ebs_node_core::node::host::HeldViews> {
        let files = crate::loopdev::views::hold(device, views)?;
        Ok(ebs_node_core::node::host::HeldViews {
            claims: (files.into_iter())
                .map(|f| Box::new(f) as Box<dyn ebs_node_core::node::host::ViewClaim>)
                .collect(),
            devnums: views.iter().map(|v| v.devnum).collect(),
        })
    }

    fn whole_disk(&self, devnum: DevNum) -> DevNum {
        let dir = Path::new("/sys/dev/block").join(devnum.to_string());
        if !dir.join("partition").exists() {
            return devnum;
        }
        // A partition's sysfs directory lies in its disk's.
        std::fs::canonicalize(&dir)
            .ok()
            .and_then(|d| std::fs::read_to_string(d.parent()?.join("dev")).ok())
            .and_then(|t| {
                let (major, minor) = t.trim().split_once(':')?;
                Some(DevNum::new(major.parse().ok()?, minor.parse().ok()?))
            })
            .unwrap_or(devnum)
    }

    fn device_bytes(&self, device: &Path) -> io::Result<u64> {
        device::size(device)
    }

    fn attachment(&self, devnum: DevNum) -> Option<String> {
        crate::attachment::of(devnum)
    }

    fn evidence<'a>(
        &'a self,
        backend: &'a dyn Backend,
        device: &'a VolumeDevice,
    ) -> Box<dyn DeviceEvidence + 'a> {
        Box::new(HeldEvidence { backend, device })
    }

    fn lay_read_only(
        &self,
        device: &VolumeDevice,
        tag: &str,
        retry: bool,
    ) -> Result<ReadOnlyDevice> {
        read_only::lay(device, tag, retry)
    }

    fn remove_read_only(&self, tag: &str) -> Result<usize> {
        read_only::remove(tag)
    }

    fn read_only_lies_over(&self, devnum: DevNum) -> Option<DevNum> {
        read_only::lies_over(devnum)
    }

    fn raw_use(&self, devnum: DevNum, device: &Path) -> io::Result<Option<String>> {
        crate::raw_use::raw_use(device, devnum)
    }

    fn read_only_devices(&self, prefixes: &[&str]) -> Result<Vec<ReadOnlyFound>> {
        read_only::list(prefixes)
    }

    fn read_only_uses(&self, found: &[ReadOnlyFound]) -> Vec<Option<String>> {
        read_only::uses(found)
    }

    fn detach_read_only(&self, found: &ReadOnlyFound) -> Result<()> {
        read_only::detach(&found.device)
    }

    fn resize_read_only(
        &self,
        tags: &HashSet<String>,
        over: DevNum,
    ) -> io::Result<Vec<(PathBuf, io::Result<u64>)>> {
        read_only::resize(tags, over)
    }

    fn read_first_block(&self, device: &Path) -> ReadOutcome {
        crate::read_probe::probe(device, crate::read_probe::READ_WAIT)
    }

    fn may_grow_mounted_ext(&self) -> bool {
        caps::has_cap(
            None,
            caps::CapSet::Effective,
            caps::Capability::CAP_SYS_RESOURCE,
        )
        .unwrap_or(true)
    }

    fn fs_supported(&self, fs: FsType) -> std::result::Result<(), MissingTools> {
        self.fstools.supports(fs)
    }

    fn probe(&self, device: &Path, fs: FsType) -> Result<Probed> {
        probe_with_size(device, fs)
    }

    fn check_size(
        &self,
        fs: FsType,
        device: &Path,
        opts: &FormatOptions,
    ) -> std::result::Result<(), FsToolError> {
        self.fstools.check_size(fs, device, opts)
    }

    fn mkfs(
        &self,
        fs: FsType,
        device: &Path,
        uuid: &str,
        opts: &FormatOptions,
    ) -> std::result::Result<(), FsToolError> {
        self.fstools.mkfs(fs, device, uuid, opts)
    }

    fn fsck(&self, fs: FsType, device: &Path) -> std::result::Result<FsckOutcome, FsToolError> {
        self.fstools.check(fs, device)
    }

    fn fs_bytes(&self, fs: FsType, device: &Path) -> io::Result<u64> {
        crate::fstools::filesystem_bytes(fs, device)
    }

    fn mounted_fs_bytes(&self, fs: FsType, device: &Path, mount_point: &Path) -> io::Result<u64> {
        crate::fs_size::mounted_bytes(fs, device, mount_point)
    }

    fn grow(
        &self,
        fs: FsType,
        device: &Path,
        mount_point: &Path,
    ) -> std::result::Result<(), FsToolError> {
        self.fstools.grow(fs, device, mount_point)
    }

    fn grow_offline(&self, fs: FsType, device: &Path) -> std::result::Result<(), FsToolError> {
        self.fstools.grow_offline(fs, device)
    }

    fn place_of(&self, path: &Path) -> io::Result<Place> {
        crate::anchor::place_of(path)
    }
}

/// Probes the device and reads the filesystem's size in the same visit. The device is held open
/// across both, so the superblock is still in the device's page cache (the kernel drops it at the
/// last close) and the size costs no second read through the device.
pub fn probe_with_size(device: &Path, fs: FsType) -> Result<Probed> {
    let held = std::fs::File::open(device)
        .map_err(|e| Error::io(format!("opening {}", device.display()), e))?;
    let outcome = blkid::probe(device).map_err(|e| Error::Probe {
        device: device.to_path_buf(),
        source: Box::new(e),
    })?;
    let fs_bytes = match &outcome {
        ProbeOutcome::Found(sig) if is_requested(sig, fs) => {
            // Best effort: without it the grow check reads the superblock itself.
            filesystem_bytes_of(fs, &held).ok()
        }
        _ => None,
    };
    Ok(Probed { outcome, fs_bytes })
}
