//! The host crate's handles as the core's node pipeline names them: an `Anchored` entry is its
//! `Entry`, an `EntryFd` its `OpenEntry`, a `HeldDevice` its `DeviceHandle`. The daemon's
//! `RealHost` hands these out, and takes them back through `as_any`.

use std::any::Any;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use ebs_node_core::DevNum;
use ebs_node_core::node::host::{DeviceHandle, Entry, OpenEntry, PathRefusal};
use ebs_node_core::seam::{EntryStat, Removed};

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
    fn remove(&self) -> io::Result<Removed> {
        Anchored::remove(self)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl OpenEntry for EntryFd {
    fn proc_path(&self) -> PathBuf {
        EntryFd::proc_path(self)
    }
    fn path_for_tools(&self) -> PathBuf {
        EntryFd::path_for_tools(self)
    }
    fn as_any(&self) -> &dyn Any {
        self
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

/// The `Anchored` behind a core `Entry`; the pipeline only ever hands back what the host made.
pub fn anchored(entry: &dyn Entry) -> io::Result<&Anchored> {
    entry
        .as_any()
        .downcast_ref::<Anchored>()
        .ok_or_else(|| io::Error::other("an entry the host crate did not make"))
}

/// The `EntryFd` behind a core `OpenEntry`.
pub fn entry_fd(fd: &dyn OpenEntry) -> io::Result<&EntryFd> {
    fd.as_any()
        .downcast_ref::<EntryFd>()
        .ok_or_else(|| io::Error::other("an open entry the host crate did not make"))
}
