//! What block disks the kernel shows, read from sysfs attribute files (no udevd, no udev database).
//!
//! Two scanners share one result type: `SysfsDisks` walks `<root>/block` with `std::fs`, so tests
//! can point it at a fixture tree; `UdevDisks` (see `udev_scan.rs`) enumerates through libudev on the
//! real host. libudev hard-codes `/sys`, which is why the fixture path cannot go through it.

use ebs_node_core::DevNum;
use ebs_node_core::ec2::ebs::{clean, is_multipath_path_name};
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// One whole disk as the kernel shows it, with its NVMe controller's identity when it has one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Disk {
    /// Kernel name, e.g. `nvme1n1`; also its node name under the dev root.
    pub name: String,
    /// The disk's canonical sysfs directory.
    pub sys_path: PathBuf,
    /// major:minor from the `dev` attribute.
    pub dev: Option<DevNum>,
    /// The controller's serial (`device/serial`), trimmed; `None` when the disk is not NVMe.
    pub serial: Option<String>,
    /// The controller's model (`device/model`), trimmed.
    pub model: Option<String>,
    /// The NVMe namespace id (`nsid`), when present.
    pub nsid: Option<u32>,
}

impl Disk {
    /// A short description for error messages: `nvme1n1 (Amazon Elastic Block Store, serial vol…)`.
    pub fn describe(&self) -> String {
        match (&self.model, &self.serial) {
            (Some(m), Some(s)) => format!("{} ({m}, serial {s})", self.name),
            (Some(m), None) => format!("{} ({m}, no serial)", self.name),
            (None, Some(s)) => format!("{} (serial {s})", self.name),
            (None, None) => format!("{} (not NVMe)", self.name),
        }
    }
}

/// The host's block disks. Blocking; called from the blocking pool.
pub trait BlockDevices: Send + Sync {
    /// Every whole disk, without the hidden per-path nodes of native NVMe multipath
    /// (`nvme0c0n1`): their namespace is reached through the shared `nvme0n1`.
    fn disks(&self) -> io::Result<Vec<Disk>>;
    /// Where device nodes live (`/dev`, or a fixture directory).
    fn dev_root(&self) -> &Path;
    /// Where sysfs is mounted (`/sys`, or a fixture directory).
    fn sys_root(&self) -> &Path;
}

/// Reads a sysfs attribute, trimmed of the space and NUL padding NVMe identify strings carry.
pub fn read_attr(path: &Path) -> Option<String> {
    let raw = std::fs::read(path).ok()?;
    clean(&String::from_utf8_lossy(&raw))
}

/// Whether a disk is a hidden multipath path node: the `hidden` attribute says so, and older
/// kernels without it still name those nodes `nvme<ctrl>c<ctrl>n<ns>`.
pub fn is_hidden_path(name: &str, sys_path: &Path) -> bool {
    read_attr(&sys_path.join("hidden")).as_deref() == Some("1") || is_multipath_path_name(name)
}

/// Builds a `Disk` from its sysfs directory (any root): the shared reader of both scanners.
pub fn disk_from_sysfs(name: &str, sys_path: &Path) -> Disk {
    let device = sys_path.join("device");
    Disk {
        name: name.to_string(),
        sys_path: sys_path.to_path_buf(),
        dev: read_attr(&sys_path.join("dev")).and_then(|d| DevNum::parse(&d)),
        serial: read_attr(&device.join("serial")),
        model: read_attr(&device.join("model")),
        nsid: read_attr(&sys_path.join("nsid")).and_then(|n| n.parse().ok()),
    }
}

/// Scans `<sys_root>/block` with plain file reads.
pub struct SysfsDisks {
    sys_root: PathBuf,
    dev_root: PathBuf,
}

impl SysfsDisks {
    pub fn new(sys_root: impl Into<PathBuf>, dev_root: impl Into<PathBuf>) -> Self {
        SysfsDisks {
            sys_root: sys_root.into(),
            dev_root: dev_root.into(),
        }
    }
}

impl BlockDevices for SysfsDisks {
    fn disks(&self) -> io::Result<Vec<Disk>> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(self.sys_root.join("block"))? {
            let entry = entry?;
            let Some(name) = entry.file_name().to_str().map(str::to_string) else {
                continue;
            };
            // A disk that vanishes between listing and reading is simply not there.
            let Ok(sys_path) = std::fs::canonicalize(entry.path()) else {
                continue;
            };
            if is_hidden_path(&name, &sys_path) {
                continue;
            }
            out.push(disk_from_sysfs(&name, &sys_path));
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    fn dev_root(&self) -> &Path {
        &self.dev_root
    }

    fn sys_root(&self) -> &Path {
        &self.sys_root
    }
}

/// Which disk a device node (or a link to one) is, partitions included: by its device numbers
/// when it is a block device, else by its file name under the dev root (fixture trees use regular
/// files there).
pub fn disk_of<'a>(disks: &'a [Disk], dev_root: &Path, node: &Path) -> Option<&'a Disk> {
    let meta = std::fs::metadata(node).ok()?;
    if meta.file_type().is_block_device() {
        let numbers = ebs_node_host::device::devnum_of(meta.rdev());
        return disks.iter().find(|d| d.dev == Some(numbers)).or_else(|| {
            disks.iter().find(|d| {
                children(&d.sys_path).any(|p| {
                    read_attr(&p.join("dev")).and_then(|v| DevNum::parse(&v)) == Some(numbers)
                })
            })
        });
    }
    let real = std::fs::canonicalize(node).ok()?;
    let dev_root = std::fs::canonicalize(dev_root).ok()?;
    if real.parent()? != dev_root {
        return None;
    }
    let name = real.file_name()?.to_str()?;
    disks.iter().find(|d| d.name == name).or_else(|| {
        disks
            .iter()
            .find(|d| name.starts_with(&d.name) && d.sys_path.join(name).join("partition").exists())
    })
}

/// The disk a device number belongs to (a partition's number gives its disk). On the real
/// /sys one symlink says it; a fixture tree is scanned.
pub fn disk_by_devnum(devices: &dyn BlockDevices, devnum: DevNum) -> io::Result<Disk> {
    let link = devices.sys_root().join(format!("dev/block/{}", devnum));
    if let Ok(real) = std::fs::canonicalize(&link) {
        let disk_dir = if real.join("partition").exists() {
            real.parent().map(Path::to_path_buf).unwrap_or(real)
        } else {
            real
        };
        let name = disk_dir
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_string();
        return Ok(disk_from_sysfs(&name, &disk_dir));
    }
    let disks = devices.disks()?;
    disks
        .iter()
        .find(|d| d.dev == Some(devnum))
        .or_else(|| {
            disks.iter().find(|d| {
                children(&d.sys_path).any(|p| {
                    read_attr(&p.join("dev")).and_then(|v| DevNum::parse(&v)) == Some(devnum)
                })
            })
        })
        .cloned()
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no disk has this number"))
}

/// The numbers of a disk and of each of its partitions.
pub fn devnums_of_disk(disk: &Disk) -> Vec<DevNum> {
    disk.dev
        .into_iter()
        .chain(children(&disk.sys_path).filter_map(|p| {
            p.join("partition")
                .exists()
                .then(|| read_attr(&p.join("dev")).and_then(|v| DevNum::parse(&v)))
                .flatten()
        }))
        .collect()
}

/// Whether anything holds a disk: one of its partitions (or itself) is mounted, or a device
/// mapper or RAID sits on it.
pub fn disk_in_use(disk: &Disk) -> io::Result<Option<String>> {
    if children(&disk.sys_path.join("holders")).next().is_some() {
        return Ok(Some(format!(
            "{} is held by a device mapper or RAID",
            disk.name
        )));
    }
    for part in children(&disk.sys_path).filter(|p| p.join("partition").exists()) {
        if children(&part.join("holders")).next().is_some() {
            return Ok(Some(format!(
                "a partition of {} is held by a device mapper or RAID",
                disk.name
            )));
        }
    }
    let numbers = devnums_of_disk(disk);
    let table = ebs_node_host::mount::at_path::read_table()?;
    Ok(table
        .entries()
        .iter()
        .find(|m| numbers.contains(&DevNum::new(m.major, m.minor)))
        .map(|m| {
            format!(
                "{} holds the host's mounted filesystem at {}",
                disk.name,
                m.mount_point.display()
            )
        }))
}

fn children(dir: &Path) -> impl Iterator<Item = PathBuf> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
}

/// The node of partition `number` of `disk`, found in the disk's sysfs directory by its
/// `partition` attribute (names differ: `nvme1n1p2`, `xvdf2`).
pub fn partition_node(disk: &Disk, dev_root: &Path, number: u32) -> Option<PathBuf> {
    let entries = std::fs::read_dir(&disk.sys_path).ok()?;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if !name.starts_with(&disk.name) {
            continue;
        }
        let n = read_attr(&entry.path().join("partition")).and_then(|p| p.parse::<u32>().ok());
        if n == Some(number) {
            return Some(dev_root.join(name));
        }
    }
    None
}

/// The NVMe controllers behind a disk, for `rescan_controller`: the disk's `device` is the
/// controller itself, or (native multipath) a subsystem that links its controllers.
pub fn controllers_of(disk: &Disk) -> Vec<PathBuf> {
    let Ok(device) = std::fs::canonicalize(disk.sys_path.join("device")) else {
        return Vec::new();
    };
    if device.join("rescan_controller").exists() {
        return vec![device];
    }
    let mut out: Vec<PathBuf> = std::fs::read_dir(&device)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("rescan_controller").exists())
        .collect();
    out.sort();
    out
}
