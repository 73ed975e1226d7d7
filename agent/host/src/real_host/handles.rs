//! The host crate's handles as the core's node pipeline names them: an `Anchored` entry is its
//! `Entry`, an `EntryFd` its `OpenEntry`, a `HeldDevice` its `DeviceHandle`. Each carries its own
//! calls (mount, bind, unmount, the mount table's answer): the pipeline acts through the handle
//! the host crate made, so nothing is ever handed back and taken apart.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use ebs_node_core::DevNum;
use ebs_node_core::node::host::{Ancestry, DeviceHandle, Entry, OpenEntry, PathRefusal};
use ebs_node_core::request::FsType;
use ebs_node_core::seam::{EntryStat, FsUsage, MountFacts, Removed, TrimError, Unmounted};
use nix::errno::Errno;

use crate::anchor::{Anchored, EntryFd};
use crate::device::HeldDevice;

impl Entry for Anchored {
    fn path(&self) -> &Path {
        Anchored::path(self)
    }
    fn stat(&self) -> io::Result<Option<EntryStat>> {
        Anchored::stat(self)
    }
    fn mkdir(&self) -> io::Result<()> {
        Anchored::mkdir(self)
    }
    fn create_file(&self) -> io::Result<()> {
        Anchored::create_file(self)
    }
    fn open_entry(&self) -> io::Result<Box<dyn OpenEntry>> {
        Ok(Box::new(Anchored::open_entry(self)?))
    }
    fn open_dir(&self) -> io::Result<Box<dyn OpenEntry>> {
        Ok(Box::new(Anchored::open_dir(self)?))
    }
    fn remove(&self) -> io::Result<Removed> {
        Anchored::remove(self)
    }
    fn mounted_at(&self) -> io::Result<Option<MountFacts>> {
        crate::mount::at_path::mounted_at(self)
    }
    fn has_submounts(&self) -> io::Result<bool> {
        crate::mount::copies::has_submounts(self)
    }
    fn copies_elsewhere(&self) -> io::Result<Vec<PathBuf>> {
        crate::mount::copies::corresponding_at(self)
    }
    fn bind_here(&self, source: &Path, readonly: bool, vfs_bits: u64) -> io::Result<()> {
        crate::mount::ops::bind(source, self, readonly, vfs_bits)
    }
    fn unmount(&self) -> io::Result<Unmounted> {
        crate::mount::ops::unmount(self)
    }
    fn ancestry(&self) -> io::Result<Ancestry> {
        Anchored::ancestry(self)
    }
}

impl OpenEntry for EntryFd {
    fn proc_path(&self) -> PathBuf {
        EntryFd::proc_path(self)
    }
    fn path_for_tools(&self) -> PathBuf {
        EntryFd::path_for_tools(self)
    }
    fn mount_facts(&self, path: &Path) -> io::Result<Option<MountFacts>> {
        crate::mount::at_path::mount_of(self, path)
    }
    fn mount_device(
        &self,
        device: &Path,
        fs: FsType,
        vfs_bits: u64,
        data: &[String],
        readonly: bool,
    ) -> io::Result<()> {
        crate::mount::ops::mount_device(device, self, fs.name(), vfs_bits, data, readonly)
    }
    fn fs_usage(&self) -> io::Result<FsUsage> {
        crate::fs_usage::usage_of(self)
    }
    fn sync_fs(&self) -> io::Result<()> {
        crate::fs_usage::sync(self)
    }
    fn trim_free_space(&self) -> Result<u64, TrimError> {
        crate::trim::trim_free_space(self).map_err(|e| match e {
            Errno::EOPNOTSUPP => TrimError::Unsupported,
            Errno::ENOTTY => TrimError::NotImplemented,
            Errno::EROFS => TrimError::ReadOnly,
            e => TrimError::Io(e.into()),
        })
    }
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

/// Why the anchoring walk refused a path: a symlink on the way (ELOOP; EXDEV: it leads outside
/// the prefix), a component that is not a directory (ENOTDIR), or anything else that keeps it
/// from being examined.
pub fn path_refusal(e: io::Error) -> PathRefusal {
    match e.raw_os_error() {
        Some(libc::ELOOP) | Some(libc::EXDEV) => PathRefusal::Symlink,
        Some(libc::ENOTDIR) => PathRefusal::NotDirectory,
        _ => PathRefusal::Unexaminable(e),
    }
}
