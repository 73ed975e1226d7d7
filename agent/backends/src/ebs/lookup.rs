//! One look for a volume's device: the NVMe namespace whose controller has the EBS model and the
//! volume's serial. Links (publish_context `devicePath`, `/dev/disk/by-id/…`) are followed only to
//! catch stale ones: a link to a device with another serial refuses the call.

use std::path::{Path, PathBuf};

use ebs_node_core::records::DeviceIdentity;

use super::discovery::{BlockDevices, Disk, disk_in_use, disk_of, partition_node};
use super::wait::Look;
use ebs_node_core::ec2::ebs;
use ebs_node_core::error::{Error, Result};
use ebs_node_core::node::backend::ResolvedDevice;
use ebs_node_core::request::VolumeId;

/// The NVMe serial EBS gives a volume (`vol-0abc` → `vol0abc`); any other id is one the ebs
/// backend cannot have on this node.
pub fn expected_serial(volume: &VolumeId) -> Result<String> {
    ebs::serial_of(volume).ok_or_else(|| Error::NotAnEbsVolumeId {
        volume: volume.to_string(),
    })
}

/// What a look is after.
pub struct Wanted<'a> {
    pub volume: &'a VolumeId,
    pub serial: &'a str,
    pub model: &'a str,
    pub device_path: Option<&'a Path>,
    pub partition: Option<u32>,
    /// The operator's explicit choice for hosts without serials (`--allow-unverified-devices`).
    pub allow_unverified: bool,
}

/// What a look saw, for the error at the deadline.
#[derive(Debug, Default)]
pub struct Seen {
    pub disks: Vec<String>,
    pub device_path: Option<String>,
    pub partition_missing: Option<String>,
    /// Why a serial-less devicePath was not used.
    pub unverified: Option<String>,
}

/// Whether a by-id link name carries exactly `serial` (never as a substring of a longer one):
/// `nvme-<model>_<serial>`, optionally with `_<nsid>` and `-part<N>`.
pub fn link_names_serial(name: &str, serial: &str) -> bool {
    let name = match name.rsplit_once("-part") {
        Some((head, n)) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => head,
        _ => name,
    };
    name.split('_').any(|token| token == serial)
}

/// Links that claim to be the volume: the given devicePath and by-id names carrying the serial.
fn claiming_links(devices: &dyn BlockDevices, want: &Wanted<'_>) -> Vec<PathBuf> {
    let mut links: Vec<PathBuf> = want
        .device_path
        .map(Path::to_path_buf)
        .into_iter()
        .collect();
    let by_id = devices.dev_root().join("disk/by-id");
    if let Ok(entries) = std::fs::read_dir(&by_id) {
        for e in entries.flatten() {
            if link_names_serial(&e.file_name().to_string_lossy(), want.serial) {
                links.push(e.path());
            }
        }
    }
    links
}

fn stale_link(want: &Wanted<'_>, link: &Path, disk: &Disk, ours: Option<&Disk>) -> Error {
    let there = match ours {
        Some(d) => format!("the volume is {}", d.describe()),
        None => "the volume's own device is not visible".to_string(),
    };
    Error::WrongDevice {
        volume: want.volume.to_string(),
        device: link.to_path_buf(),
        reason: format!(
            "it resolves to {}, whose serial is not {} ({there}); a stale link: check the udev \
             rules that create it, or remove it",
            disk.describe(),
            want.serial
        ),
    }
}

/// Looks once. `Found` is a device whose serial is the volume's (or, on Xen, the given path,
/// unverified); `NotYet` says what was there instead; `Err` refuses outright.
pub fn look(devices: &dyn BlockDevices, want: &Wanted<'_>) -> Result<Look<ResolvedDevice, Seen>> {
    let disks = devices
        .disks()
        .map_err(|e| Error::io(format!("listing {}/block", devices.sys_root().display()), e))?;
    let dev_root = devices.dev_root();
    let mut matches: Vec<&Disk> = disks
        .iter()
        .filter(|d| {
            d.serial.as_deref() == Some(want.serial) && d.model.as_deref() == Some(want.model)
        })
        .collect();
    // A controller has one namespace on EBS; if one shows several, namespace 1 is the volume.
    if matches.len() > 1 {
        let first: Vec<&Disk> = matches
            .iter()
            .copied()
            .filter(|d| d.nsid == Some(1))
            .collect();
        if first.len() != 1 {
            return Err(Error::AmbiguousSerial {
                volume: want.volume.to_string(),
                serial: want.serial.to_string(),
                matches: matches
                    .iter()
                    .map(|d| d.describe())
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
        matches = first;
    }
    let ours = matches.first().copied();

    let mut seen = Seen {
        disks: disks.iter().map(Disk::describe).collect(),
        ..Seen::default()
    };
    let mut given_disk: Option<&Disk> = None;
    for link in claiming_links(devices, want) {
        if std::fs::metadata(&link).is_err() {
            if Some(link.as_path()) == want.device_path {
                seen.device_path = Some(format!("{} does not exist", link.display()));
            }
            continue;
        }
        let disk = disk_of(&disks, dev_root, &link);
        if let Some(d) = disk
            && let Some(serial) = &d.serial
            && serial != want.serial
        {
            return Err(stale_link(want, &link, d, ours));
        }
        if Some(link.as_path()) == want.device_path {
            given_disk = disk;
            seen.device_path = Some(match disk {
                Some(d) => format!("{} is {}", link.display(), d.describe()),
                None => format!("{} exists but is no disk in sysfs", link.display()),
            });
        }
    }

    if let Some(disk) = ours {
        if let (Some(path), Some(g)) = (want.device_path, given_disk)
            && g.name != disk.name
        {
            tracing::warn!(volume = %want.volume, device_path = %path.display(), given = %g.describe(),
                found = %disk.describe(), "devicePath is not the volume's device; using the device with the volume's serial");
        }
        let path = match want.partition {
            None => dev_root.join(&disk.name),
            Some(n) => match partition_node(disk, dev_root, n) {
                Some(p) => p,
                None => {
                    seen.partition_missing =
                        Some(format!("{} has no partition {n}", disk.describe()));
                    return Ok(Look::NotYet(seen));
                }
            },
        };
        return Ok(Look::Found(ResolvedDevice {
            path,
            identity: DeviceIdentity::NvmeSerial {
                serial: want.serial.to_string(),
            },
        }));
    }

    // Xen: no EBS NVMe controller anywhere, and the given path is a disk without a serial. Only
    // the attach order vouches for it, so only by the operator's explicit choice, and never a
    // disk that holds the host's own filesystems.
    let any_ebs = disks.iter().any(|d| d.model.as_deref() == Some(want.model));
    if let (Some(path), Some(g), false) = (want.device_path, given_disk, any_ebs)
        && g.serial.is_none()
    {
        if !want.allow_unverified {
            seen.unverified = Some(format!(
                "{} has no serial to verify; start the agent with --allow-unverified-devices to \
                 use such devices as given (hosts without NVMe serials, e.g. Xen)",
                path.display()
            ));
            return Ok(Look::NotYet(seen));
        }
        if let Some(why) = disk_in_use(g)
            .map_err(|e| Error::io(format!("checking whether {} is in use", g.name), e))?
        {
            return Err(Error::WrongDevice {
                volume: want.volume.to_string(),
                device: path.to_path_buf(),
                reason: format!("{why}: it is not a volume attached for this call"),
            });
        }
        let device = match want.partition {
            None => path.to_path_buf(),
            Some(n) => match partition_node(g, dev_root, n) {
                Some(p) => p,
                None => {
                    seen.partition_missing = Some(format!("{} has no partition {n}", g.describe()));
                    return Ok(Look::NotYet(seen));
                }
            },
        };
        tracing::warn!(volume = %want.volume, device = %device.display(),
            "no NVMe EBS controllers on this node (Xen?): using devicePath as given; the volume's \
             identity could not be verified");
        return Ok(Look::Found(ResolvedDevice {
            path: device,
            identity: DeviceIdentity::Unverified,
        }));
    }
    Ok(Look::NotYet(seen))
}

/// The error at the deadline: the volume, what was seen, and what to check.
pub fn not_found(want: &Wanted<'_>, waited: std::time::Duration, seen: Seen) -> Error {
    let mut seen_text = if seen.disks.is_empty() {
        "no block disks".to_string()
    } else {
        seen.disks.join(", ")
    };
    for more in [
        seen.device_path.map(|d| format!("devicePath: {d}")),
        seen.partition_missing,
        seen.unverified,
    ]
    .into_iter()
    .flatten()
    {
        seen_text.push_str(&format!("; {more}"));
    }
    // NOT_FOUND, as the upstream EBS driver answers: the CSI spec's code for a volume that is
    // not there, which kubelet and operators read as "not attached (yet)".
    Error::DeviceNotAppeared {
        volume: want.volume.to_string(),
        waited,
        model: want.model.to_string(),
        serial: want.serial.to_string(),
        seen: seen_text,
    }
}
