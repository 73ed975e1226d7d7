//! The host as the node pipeline sees it: every question stage, publish, unpublish and unstage
//! ask of the host and every change they make to it, behind one trait. `RealHost` calls the host
//! crate; the recording double in `node::pipeline_tests` answers from a mount table in memory and
//! records each call with the journal line committed before it, so the pipeline's steps, their
//! order and every refusal are unit-tested as any user. The root tests on real devices prove the
//! host itself.
//!
//! Paths and devices still go through held handles: the trait takes the anchored entry or the
//! entry fd that was checked, never a path to resolve again, and a device is held open from the
//! moment it is proven (`DeviceHandle`).

use ebs_node_core::DevNum;
use std::fmt::Debug;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use super::format::{HeldEvidence, Probed};
use super::ro_block::{self, ReadOnlyDevice};
use super::volume_device::VolumeDevice;
use crate::backend::Backend;
use crate::error::Result;
use ebs_node_core::format::DeviceEvidence;
use ebs_node_core::request::{FormatOptions, FsType};
use ebs_node_host::anchor::{Anchored, EntryFd};
use ebs_node_host::device::{self, HeldDevice};
use ebs_node_host::fstools::{FsToolError, FsTools, FsckOutcome};
use ebs_node_host::mount::at_path::{self, MountFacts};
use ebs_node_host::mount::ops::{self, Unmounted};

/// A block device held open (see `host::device::HeldDevice`): while it is open its numbers
/// cannot pass to another device.
pub trait DeviceHandle: Debug + Send + Sync {
    fn path(&self) -> &Path;
    fn devnum(&self) -> DevNum;
    /// The held descriptor: the device's identity and evidence are read through it.
    fn file(&self) -> &File;
    /// The held device itself through /proc: a bind of it reaches this very device.
    fn proc_path(&self) -> PathBuf;
    /// An exclusive claim through the held fd. EBUSY: mounted, or claimed by another process.
    fn claim_exclusive(&mut self) -> io::Result<()>;
    /// Drops the claim before a tool that claims the device itself.
    fn release_exclusive(&mut self);
    /// The path still names the held device (checked right before a tool opens it by path).
    fn still_at_path(&self) -> io::Result<()>;
}

impl DeviceHandle for HeldDevice {
    fn path(&self) -> &Path {
        HeldDevice::path(self)
    }
    fn devnum(&self) -> DevNum {
        HeldDevice::devnum(self)
    }
    fn file(&self) -> &File {
        HeldDevice::file(self)
    }
    fn proc_path(&self) -> PathBuf {
        HeldDevice::proc_path(self)
    }
    fn claim_exclusive(&mut self) -> io::Result<()> {
        HeldDevice::claim_exclusive(self)
    }
    fn release_exclusive(&mut self) {
        HeldDevice::release_exclusive(self)
    }
    fn still_at_path(&self) -> io::Result<()> {
        HeldDevice::still_at_path(self)
    }
}

/// What the lifecycle pipeline needs of the host.
pub trait HostOps: Send + Sync {
    // The mount table, asked about one held entry.
    /// The mount whose root `entry` is, if any.
    fn mounted_at(&self, entry: &Anchored) -> io::Result<Option<MountFacts>>;
    /// The same about an opened entry (`path` names it in errors).
    fn mount_of(&self, fd: &EntryFd, path: &Path) -> io::Result<Option<MountFacts>>;

    // Mounts.
    /// mount(2) of `device`'s filesystem onto `target` (the opened entry at `target_path`).
    #[allow(clippy::too_many_arguments)] // mount(2)'s own arguments, each validated
    fn mount_device(
        &self,
        device: &Path,
        target: &EntryFd,
        target_path: &Path,
        fs: FsType,
        vfs_bits: u64,
        data: &[String],
        readonly: bool,
    ) -> io::Result<()>;
    /// A bind of `source` (a /proc/self/fd path of a proven mount root or device) onto `target`.
    fn bind(
        &self,
        source: &Path,
        target: &Anchored,
        readonly: bool,
        vfs_bits: u64,
    ) -> io::Result<()>;
    /// Unmounts the top-most mount at `entry`.
    fn unmount(&self, entry: &Anchored) -> io::Result<Unmounted>;

    // Devices.
    /// Holds a block device open (not exclusively).
    fn open_device(&self, path: &Path) -> io::Result<Box<dyn DeviceHandle>>;
    /// Whether anything (a mount in any namespace, a mapper, a tool) still claims the device;
    /// asked through `held` when the call holds it open.
    fn still_claimed(&self, devnum: DevNum, held: Option<&File>) -> bool;
    /// Whether a device with these numbers exists now.
    fn device_exists(&self, devnum: DevNum) -> bool;
    /// The device's size in bytes, by path (right after it was proven).
    fn device_bytes(&self, device: &Path) -> io::Result<u64>;
    /// The attachment a device's numbers stand for now (sysfs `diskseq`), when the kernel says.
    fn attachment(&self, devnum: DevNum) -> Option<String>;
    /// The never-format rule's evidence, read from the held, proven device.
    fn evidence<'a>(
        &'a self,
        backend: &'a dyn Backend,
        device: &'a VolumeDevice,
    ) -> Box<dyn DeviceEvidence + 'a>;

    // Read-only raw block publications (see `ro_block`).
    fn lay_read_only(
        &self,
        device: &VolumeDevice,
        tag: &str,
        retry: bool,
    ) -> Result<ReadOnlyDevice>;
    fn remove_read_only(&self, tag: &str) -> Result<usize>;
    /// When the device is one of the agents' read-only devices: the device it lies over.
    fn read_only_lies_over(&self, devnum: DevNum) -> Option<DevNum>;

    // Filesystem tools.
    /// Why this host cannot format, check or grow `fs`, if it cannot.
    fn fs_supported(&self, fs: FsType) -> std::result::Result<(), String>;
    /// Probes the device, and reads the filesystem's size in the same visit when it is `fs`.
    fn probe(&self, device: &Path, fs: FsType) -> Result<Probed>;
    /// Refuses options that cannot make a filesystem on a device this size.
    fn check_size(
        &self,
        fs: FsType,
        device: &Path,
        opts: &FormatOptions,
    ) -> std::result::Result<(), FsToolError>;
    fn mkfs(
        &self,
        fs: FsType,
        device: &Path,
        uuid: &str,
        opts: &FormatOptions,
    ) -> std::result::Result<(), FsToolError>;
    fn fsck(&self, fs: FsType, device: &Path) -> std::result::Result<FsckOutcome, FsToolError>;
    /// The filesystem's size, read from the unmounted device's superblock.
    fn fs_bytes(&self, fs: FsType, device: &Path) -> io::Result<u64>;
    /// The mounted filesystem's size (`mount_point` reaches the proven mount).
    fn mounted_fs_bytes(&self, fs: FsType, device: &Path, mount_point: &Path) -> io::Result<u64>;
    fn grow(
        &self,
        fs: FsType,
        device: &Path,
        mount_point: &Path,
    ) -> std::result::Result<(), FsToolError>;
    fn grow_offline(&self, fs: FsType, device: &Path) -> std::result::Result<(), FsToolError>;
}

/// The host itself, through the host crate.
pub struct RealHost {
    pub fstools: FsTools,
}

impl HostOps for RealHost {
    fn mounted_at(&self, entry: &Anchored) -> io::Result<Option<MountFacts>> {
        at_path::mounted_at(entry)
    }

    fn mount_of(&self, fd: &EntryFd, path: &Path) -> io::Result<Option<MountFacts>> {
        at_path::mount_of(fd, path)
    }

    fn mount_device(
        &self,
        device: &Path,
        target: &EntryFd,
        _target_path: &Path,
        fs: FsType,
        vfs_bits: u64,
        data: &[String],
        readonly: bool,
    ) -> io::Result<()> {
        ops::mount_device(device, target, fs.name(), vfs_bits, data, readonly)
    }

    fn bind(
        &self,
        source: &Path,
        target: &Anchored,
        readonly: bool,
        vfs_bits: u64,
    ) -> io::Result<()> {
        ops::bind(source, target, readonly, vfs_bits)
    }

    fn unmount(&self, entry: &Anchored) -> io::Result<Unmounted> {
        ops::unmount(entry)
    }

    fn open_device(&self, path: &Path) -> io::Result<Box<dyn DeviceHandle>> {
        Ok(Box::new(HeldDevice::open(path)?))
    }

    fn still_claimed(&self, devnum: DevNum, held: Option<&File>) -> bool {
        held.map_or_else(|| device::still_claimed(devnum), device::held_still_claimed)
    }

    fn device_exists(&self, devnum: DevNum) -> bool {
        Path::new(&format!("/sys/dev/block/{}", devnum)).exists()
    }

    fn device_bytes(&self, device: &Path) -> io::Result<u64> {
        device::size(device)
    }

    fn attachment(&self, devnum: DevNum) -> Option<String> {
        ebs_node_host::attachment::of(devnum)
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
        ro_block::lay(device, tag, retry)
    }

    fn remove_read_only(&self, tag: &str) -> Result<usize> {
        ro_block::remove(tag)
    }

    fn read_only_lies_over(&self, devnum: DevNum) -> Option<DevNum> {
        ro_block::lies_over(devnum)
    }

    fn fs_supported(&self, fs: FsType) -> std::result::Result<(), String> {
        self.fstools.supports(fs)
    }

    fn probe(&self, device: &Path, fs: FsType) -> Result<Probed> {
        super::format::probe_with_size(device, fs)
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
        ebs_node_host::fstools::filesystem_bytes(fs, device)
    }

    fn mounted_fs_bytes(&self, fs: FsType, device: &Path, mount_point: &Path) -> io::Result<u64> {
        ebs_node_host::fs_size::mounted_bytes(fs, device, mount_point)
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
}
