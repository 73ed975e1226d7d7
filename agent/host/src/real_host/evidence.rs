//! The never-format rule's evidence (the core's `format::DeviceEvidence`), read from the held
//! device: its fd, the backend's backing file, sysfs.

use std::io;
use std::path::Path;
use std::time::Instant;

use crate::{attachment, blank, device};
use ebs_node_core::blank::Proof;
use ebs_node_core::format::{DeviceEvidence, FormatError};
use ebs_node_core::node::backend::Backend;
use ebs_node_core::node::volume_device::VolumeDevice;

/// The held device, proven to be the volume's, and the backend that knows its backing file.
pub struct HeldEvidence<'a> {
    pub backend: &'a dyn Backend,
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

    fn prove_blank(&self, size: u64) -> Result<Proof, FormatError> {
        self.prove_blank_past(0, size)
    }

    fn prove_blank_past(&self, from: u64, size: u64) -> Result<Proof, FormatError> {
        let path = self.device.path();
        let dev = self.device.held.file();
        let backing = self
            .backend
            .backing_file(dev, self.device.devnum(), &self.device.identity)
            .map_err(|why| FormatError::Unprovable {
                device: path.to_path_buf(),
                why,
            })?;
        let started = Instant::now();
        let proof = match &backing {
            Some(b) => blank::prove_backing_past(dev, b, from, size),
            None => blank::prove_windows_past(dev, from, size),
        }
        .map_err(|e| FormatError::io(format!("proving {} blank", path.display()), e))?;
        tracing::debug!(device = %path.display(), blank = proof.found.is_none(),
            coverage = %proof.coverage, us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX), "blank proof");
        Ok(proof)
    }

    /// A random (version 4) UUID, chosen before mkfs runs so that the journal knows it.
    fn fresh_uuid(&self) -> Result<String, FormatError> {
        Ok(uuid::Uuid::new_v4().hyphenated().to_string())
    }
}
