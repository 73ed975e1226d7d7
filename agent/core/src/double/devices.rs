//! The double's devices (plain files with numbers), the never-format rule's evidence from its
//! tables, and a backend that resolves and identifies volumes over them.

use crate::DevNum;
use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::records::DeviceIdentity;

use super::host::DoubleHost;
use crate::error::{Error, Result};
use crate::node::backend::{Backend, NotProven, ResolvedDevice};
use crate::node::host::{DeviceHandle, HostOps};
use crate::node::volume_device::VolumeDevice;

/// EBUSY, as the kernel refuses an exclusive open of a claimed device.
pub(super) const EBUSY: i32 = 16;
use crate::blank::{Coverage, NonBlank, Proof};
use crate::format::{DeviceEvidence, FormatError};
use crate::probe::Signature;
use crate::request::{FsType, VolumeId};

pub fn signature(fs: FsType, uuid: &str) -> Signature {
    Signature {
        type_name: fs.name().to_string(),
        uuid: Some(uuid.to_string()),
        usage: Some("filesystem".into()),
        label: None,
        is_partition_table: false,
        external_journal: None,
    }
}

/// A device of the double: a plain file with numbers.
#[derive(Debug)]
pub(super) struct DoubleDevice {
    pub(super) path: PathBuf,
    pub(super) file: File,
    pub(super) devnum: DevNum,
    pub(super) exclusive: bool,
    /// Something claimed it when it was opened: an exclusive claim fails (EBUSY).
    pub(super) claimed: bool,
}

impl DeviceHandle for DoubleDevice {
    fn path(&self) -> &Path {
        &self.path
    }
    fn devnum(&self) -> DevNum {
        self.devnum
    }
    fn file(&self) -> &File {
        &self.file
    }
    fn proc_path(&self) -> PathBuf {
        use std::os::fd::AsRawFd;
        PathBuf::from(format!("/proc/self/fd/{}", self.file.as_raw_fd()))
    }
    fn claim_exclusive(&mut self) -> io::Result<()> {
        if self.claimed {
            return Err(io::Error::from_raw_os_error(EBUSY));
        }
        self.exclusive = true;
        Ok(())
    }
    fn release_exclusive(&mut self) {
        self.exclusive = false;
    }
    fn still_at_path(&self) -> io::Result<()> {
        Ok(())
    }
}

/// The never-format rule's evidence, from the double's tables.
pub(super) struct DoubleEvidence<'a> {
    pub(super) host: &'a DoubleHost,
    pub(super) device: &'a VolumeDevice,
}

impl DeviceEvidence for DoubleEvidence<'_> {
    fn path(&self) -> &Path {
        self.device.path()
    }
    fn attachment(&self) -> Option<String> {
        self.host.attachment(self.device.devnum())
    }
    fn size(&self) -> io::Result<u64> {
        self.host.device_bytes(self.device.path())
    }
    fn xfs_mkfs_unfinished(&self) -> io::Result<bool> {
        Ok(false)
    }
    fn carries_uuid(&self, uuid: &str) -> io::Result<bool> {
        Ok(self
            .host
            .state()
            .uuids
            .get(&self.device.devnum())
            .is_some_and(|u| u == uuid))
    }
    fn prove_blank(&self, size: u64) -> std::result::Result<Proof, FormatError> {
        self.prove_blank_past(0, size)
    }
    /// What a workload wrote lies in the middle of the device (past any mkfs's first writes).
    fn prove_blank_past(&self, _from: u64, size: u64) -> std::result::Result<Proof, FormatError> {
        let found = self
            .host
            .state()
            .not_blank
            .contains(&self.device.devnum())
            .then(|| NonBlank {
                offset: size / 2,
                what: "data".into(),
            });
        Ok(Proof {
            found,
            coverage: Coverage::Windows {
                windows: 1,
                read: size,
            },
        })
    }
    /// A new one at every call, as the host's random ones are (one for every call made the
    /// simulation's long run find two volumes' mkfs intents naming one UUID: seed 5026660).
    fn fresh_uuid(&self) -> std::result::Result<String, FormatError> {
        static NEXT: std::sync::atomic::AtomicU64 =
            std::sync::atomic::AtomicU64::new(0x5555_5555_5555);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(format!(
            "11111111-2222-4333-8444-{:012x}",
            n & 0xffff_ffff_ffff
        ))
    }
}

/// A backend whose volume `v`'s device is the double's device file `dev-v`, identified by the
/// serial `v`. `moved` makes a volume's device answer as another volume's.
pub struct DoubleBackend {
    pub host: Arc<DoubleHost>,
    pub dir: PathBuf,
    pub moved: Mutex<HashMap<DevNum, String>>,
}

impl DoubleBackend {
    pub fn device_of(&self, volume: &str) -> PathBuf {
        self.dir.join("dev").join(format!("dev-{volume}"))
    }
}

pub fn serial(volume: &str) -> DeviceIdentity {
    DeviceIdentity::NvmeSerial {
        serial: volume.to_string(),
    }
}

impl Backend for DoubleBackend {
    fn resolve(
        &self,
        volume: &VolumeId,
        _publish_context: &HashMap<String, String>,
        _volume_context: &HashMap<String, String>,
        _deadline: std::time::Instant,
    ) -> Result<ResolvedDevice> {
        // A node-local handle names a device of the double's by its file name, and is whatever
        // that device shows (as the daemon's node-local backend).
        let path = match volume.local_device().and_then(Path::file_name) {
            Some(name) => self.dir.join("dev").join(name),
            None => self.device_of(volume.as_str()),
        };
        let Some(devnum) = self.host.state().devices.get(&path).copied() else {
            return Err(Error::DeviceNotAttached {
                backend: "the double's",
                volume: volume.to_string(),
                device: path,
                why: "no such device".into(),
            });
        };
        let unverified = self.host.state().unverified.contains(&devnum);
        let identity = match volume.local_device() {
            _ if unverified => DeviceIdentity::Unverified,
            Some(_) => self
                .identify(devnum)
                .map_err(|e| Error::DeviceNotAttached {
                    backend: "the double's",
                    volume: volume.to_string(),
                    device: path.clone(),
                    why: e.to_string(),
                })?,
            None => serial(volume.as_str()),
        };
        Ok(ResolvedDevice { path, identity })
    }

    fn identify(&self, devnum: DevNum) -> std::result::Result<DeviceIdentity, NotProven> {
        if let Some(other) = self
            .moved
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&devnum)
        {
            return Ok(serial(other));
        }
        let s = self.host.state();
        if s.unverified.contains(&devnum) {
            return Ok(DeviceIdentity::Unverified);
        }
        let (path, _) = s
            .devices
            .iter()
            .find(|(_, d)| **d == devnum)
            .ok_or_else(|| NotProven::Unknown(format!("no device {}", devnum)))?;
        let name = DoubleHost::name(path);
        Ok(serial(name.strip_prefix("dev-").unwrap_or(&name)))
    }

    fn expected_identity(&self, volume: &VolumeId) -> Option<DeviceIdentity> {
        (!volume.is_local()).then(|| serial(volume.as_str()))
    }

    fn refresh_size(&self, _device: &Path) -> Result<()> {
        Ok(())
    }
}

/// A call's hold of other views (`HostOps::hold_views`), given up when the call drops it.
pub struct ViewHold {
    pub host: std::sync::Arc<super::host::DoubleHost>,
    pub devnums: Vec<DevNum>,
}

impl crate::node::host::ViewClaim for ViewHold {}

impl std::fmt::Debug for ViewHold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ViewHold({:?})", self.devnums)
    }
}

impl Drop for ViewHold {
    fn drop(&mut self) {
        let mut s = self.host.state();
        for d in &self.devnums {
            if let Some(n) = s.view_holds.get_mut(d) {
                *n -= 1;
                if *n == 0 {
                    s.view_holds.remove(d);
                }
            }
        }
    }
}
