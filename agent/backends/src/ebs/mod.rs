//! The EBS backend's node side: a volume is the NVMe namespace whose controller reports the EBS
//! model and the volume id as its serial. Devices are found from the kernel's own view (sysfs),
//! never from links alone, and a link that points at another serial refuses the call.

pub mod discovery;
mod lookup;
mod udev_scan;
pub mod wait;

use ebs_node_core::DevNum;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use ebs_node_core::records::DeviceIdentity;

pub use discovery::{BlockDevices, Disk, SysfsDisks};
pub use udev_scan::UdevDisks;

use ebs_node_core::error::{Error, Result};
use ebs_node_core::node::backend::{Backend, NotProven, ResolvedDevice, Shown};
use ebs_node_core::request::VolumeId;
use lookup::Wanted;

/// Where to look, and for what controller model (the lab's QEMU reports `QEMU NVMe Ctrl`).
#[derive(Clone, Debug)]
pub struct EbsConfig {
    pub sys_root: PathBuf,
    pub dev_root: PathBuf,
    pub model: String,
    /// Hosts whose disks carry no serial (Xen): accept the CO's devicePath unverified.
    pub allow_unverified: bool,
}

pub struct EbsBackend {
    devices: Box<dyn BlockDevices>,
    model: String,
    allow_unverified: bool,
}

impl EbsBackend {
    /// On the real `/sys` disks are enumerated through libudev; any other root (a fixture tree)
    /// is walked with plain file reads, which libudev cannot do.
    pub fn new(config: &EbsConfig) -> Self {
        let devices: Box<dyn BlockDevices> = if config.sys_root == Path::new("/sys") {
            Box::new(UdevDisks::new(&config.dev_root))
        } else {
            Box::new(SysfsDisks::new(&config.sys_root, &config.dev_root))
        };
        if config.allow_unverified {
            tracing::warn!(
                "--allow-unverified-devices: on a host without EBS NVMe controllers a devicePath \
                 without a serial is used as given, its identity unverified"
            );
        }
        let mut backend = Self::with_devices(devices, &config.model);
        backend.allow_unverified = config.allow_unverified;
        backend
    }

    pub fn with_devices(devices: Box<dyn BlockDevices>, model: &str) -> Self {
        EbsBackend {
            devices,
            model: model.to_string(),
            allow_unverified: false,
        }
    }

    /// Whether the disk at `device` (a path) still carries `identity`.
    fn still_is(
        &self,
        device: &Path,
        identity: &DeviceIdentity,
    ) -> std::result::Result<(), NotProven> {
        match identity {
            DeviceIdentity::NvmeSerial { serial } => {
                let disks = self.disks().map_err(NotProven::Unknown)?;
                let disk = discovery::disk_of(&disks, self.devices.dev_root(), device).ok_or_else(
                    || {
                        NotProven::Unknown(format!(
                            "{} is no disk the kernel shows",
                            device.display()
                        ))
                    },
                )?;
                match &disk.serial {
                    Some(s) if s == serial => Ok(()),
                    _ => Err(NotProven::Other(format!(
                        "{} is now {}, not the device with serial {serial}",
                        device.display(),
                        disk.describe()
                    ))),
                }
            }
            // Xen: nothing to compare; the device must at least still be there.
            DeviceIdentity::Unverified => std::fs::metadata(device)
                .map(|_| ())
                .map_err(|e| NotProven::Unknown(format!("{}: {e}", device.display()))),
            other => Err(NotProven::Other(format!(
                "unexpected identity {other:?} for an EBS volume"
            ))),
        }
    }

    fn disks(&self) -> std::result::Result<Vec<Disk>, String> {
        self.devices
            .disks()
            .map_err(|e| format!("listing {}/block: {e}", self.devices.sys_root().display()))
    }
}

impl Backend for EbsBackend {
    fn resolve(
        &self,
        volume: &VolumeId,
        publish_context: &HashMap<String, String>,
        volume_context: &HashMap<String, String>,
        deadline: Instant,
    ) -> Result<ResolvedDevice> {
        let serial = lookup::expected_serial(volume)?;
        let partition = ebs_node_core::ec2::ebs::partition_of(volume_context)?;
        let device_path = publish_context
            .get("devicePath")
            .filter(|p| !p.is_empty())
            .map(PathBuf::from);
        let want = Wanted {
            volume,
            serial: &serial,
            model: &self.model,
            device_path: device_path.as_deref(),
            partition,
            allow_unverified: self.allow_unverified,
        };
        let started = Instant::now();
        let mut stats = wait::WaitStats::default();
        let outcome = wait::until_found(deadline, &mut stats, || {
            lookup::look(self.devices.as_ref(), &want)
        })?;
        match outcome {
            Ok(device) => {
                tracing::info!(volume = %volume, device = %device.path.display(), looks = stats.looks,
                    uevents = stats.uevents, ms = started.elapsed().as_millis() as u64, "device resolved");
                Ok(device)
            }
            Err(seen) => Err(lookup::not_found(&want, started.elapsed(), seen)),
        }
    }

    fn identify(&self, devnum: DevNum) -> std::result::Result<DeviceIdentity, NotProven> {
        let disk = discovery::disk_by_devnum(self.devices.as_ref(), devnum)
            .map_err(|e| NotProven::Unknown(format!("device {}: {e}", devnum)))?;
        match (&disk.model, &disk.serial) {
            (Some(m), Some(serial)) if *m == self.model => Ok(DeviceIdentity::NvmeSerial {
                serial: serial.clone(),
            }),
            (_, None) => Ok(DeviceIdentity::Unverified),
            _ => Err(NotProven::Other(format!(
                "device {} is {}",
                devnum,
                disk.describe()
            ))),
        }
    }

    /// A device shown by its path is found among the disks the kernel shows (a name that now
    /// stands for another disk says so); by its numbers, it is opened before it is asked about,
    /// so the proof is about the device held: while it is open its numbers cannot pass to
    /// another disk. A fixture tree names no device of this host: proven there, never held.
    fn prove(
        &self,
        device: Shown<'_>,
        identity: &DeviceIdentity,
    ) -> std::result::Result<Option<std::fs::File>, NotProven> {
        if let Shown::Path(path, _) = device {
            return self.still_is(path, identity).map(|()| None);
        }
        let devnum = device.devnum()?;
        let real_host = self.devices.sys_root() == Path::new("/sys")
            && self.devices.dev_root() == Path::new("/dev");
        let held = match device {
            Shown::Numbers(_) if real_host => ebs_node_host::device::open_devnum(devnum).ok(),
            _ => None,
        };
        let found = self.identify(devnum)?;
        if !ebs_node_core::node::backend::proves(identity, &found) {
            return Err(NotProven::Other(format!(
                "device {} is {}, not {}",
                devnum,
                ebs_node_core::node::backend::describe_identity(&found),
                ebs_node_core::node::backend::describe_identity(identity)
            )));
        }
        Ok(held)
    }

    fn expected_identity(&self, volume: &VolumeId) -> Option<DeviceIdentity> {
        lookup::expected_serial(volume)
            .ok()
            .map(|serial| DeviceIdentity::NvmeSerial { serial })
    }

    fn refresh_size(&self, device: &Path) -> Result<()> {
        let disks = self.devices.disks().map_err(|e| {
            let sys = self.devices.sys_root().display();
            Error::io(format!("listing {sys}/block"), e)
        })?;
        let disk =
            discovery::disk_of(&disks, self.devices.dev_root(), device).ok_or_else(|| {
                Error::NoSuchDisk {
                    device: device.to_path_buf(),
                }
            })?;
        let controllers = discovery::controllers_of(disk);
        if controllers.is_empty() {
            // Xen block devices pick up a new size by themselves.
            tracing::info!(device = %device.display(), "no NVMe controller to rescan");
            return Ok(());
        }
        for c in controllers {
            let attr = c.join("rescan_controller");
            std::fs::write(&attr, b"1")
                .map_err(|e| Error::io(format!("writing {}", attr.display()), e))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
