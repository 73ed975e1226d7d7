//! What the never-format rule may read of a device, and nothing more: the seam between
//! `decide` and the host. The agent's implementation reads the held device (its fd, the
//! backend's backing file, sysfs); the tests' recording double answers from a table and records
//! each read, so the rule is proven without root, and so is which reads each branch makes.

use std::io;
use std::path::Path;
use std::time::Instant;

use super::super::NodeCtx;
use super::super::volume_device::VolumeDevice;
use crate::error::{Error, Result};
use ebs_node_host::{attachment, blank, device};

pub trait DeviceEvidence {
    /// The device's path, for messages.
    fn path(&self) -> &Path;
    /// The attachment the device is on now (`boot:diskseq`): a format intent licenses a redo
    /// only on the attachment it was journaled on.
    fn attachment(&self) -> Option<String>;
    /// The device's size in bytes.
    fn size(&self) -> io::Result<u64>;
    /// Whether an xfs superblock is the one mkfs.xfs writes first and rewrites last.
    fn xfs_mkfs_unfinished(&self) -> io::Result<bool>;
    /// Whether a superblock (even one libblkid rejects) carries exactly this UUID.
    fn carries_uuid(&self, uuid: &str) -> io::Result<bool>;
    /// The blank proof over `size` bytes: every allocated byte of a backing file where there
    /// is one, bounded windows otherwise. An error when the proof cannot be made.
    fn prove_blank(&self, size: u64) -> Result<blank::Proof>;
    /// A UUID for a filesystem that no record names yet.
    fn fresh_uuid(&self) -> Result<String> {
        super::random_uuid()
    }
}

/// The agent's evidence: the held device, proven to be the volume's, and the backend that
/// knows its backing file.
pub struct HeldEvidence<'a> {
    pub ctx: &'a NodeCtx,
    pub device: &'a VolumeDevice,
}

impl DeviceEvidence for HeldEvidence<'_> {
    fn path(&self) -> &Path {
        self.device.path()
    }

    fn attachment(&self) -> Option<String> {
        attachment::of(self.device.devnum())
    }

    fn size(&self) -> io::Result<u64> {
        device::size_of(self.device.held.file())
    }

    fn xfs_mkfs_unfinished(&self) -> io::Result<bool> {
        blank::xfs_mkfs_unfinished(self.device.held.file())
    }

    fn carries_uuid(&self, uuid: &str) -> io::Result<bool> {
        blank::carries_uuid(self.device.held.file(), uuid)
    }

    fn prove_blank(&self, size: u64) -> Result<blank::Proof> {
        let path = self.device.path();
        let dev = self.device.held.file();
        let backing = self
            .ctx
            .backend
            .backing_file(dev, self.device.devnum(), &self.device.identity)
            .map_err(|why| {
                Error::Precondition(format!(
                    "{} cannot be proven blank, so it is not formatted: {why}",
                    path.display()
                ))
            })?;
        let started = Instant::now();
        let proof = match &backing {
            Some(b) => blank::prove_backing(dev, b, size),
            None => blank::prove_windows(dev, size),
        }
        .map_err(|e| Error::io(format!("proving {} blank", path.display()), e))?;
        tracing::debug!(device = %path.display(), blank = proof.found.is_none(),
            coverage = %proof.coverage, us = started.elapsed().as_micros() as u64, "blank proof");
        Ok(proof)
    }
}
