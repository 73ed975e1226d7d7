//! The real host's disks through libudev's enumerator. Enumeration and sysfs attributes work
//! without a running udevd (only the udev database, ID_SERIAL and friends, needs it), so this
//! reads exactly what `SysfsDisks` reads; libudev cannot be pointed at another root than `/sys`.

use std::io;
use std::path::{Path, PathBuf};

use super::discovery::{BlockDevices, Disk, is_hidden_path};
use ebs_node_core::ec2::ebs::clean;

pub struct UdevDisks {
    sys_root: PathBuf,
    dev_root: PathBuf,
}

impl UdevDisks {
    pub fn new(dev_root: impl Into<PathBuf>) -> Self {
        UdevDisks {
            sys_root: PathBuf::from("/sys"),
            dev_root: dev_root.into(),
        }
    }
}

impl BlockDevices for UdevDisks {
    fn disks(&self) -> io::Result<Vec<Disk>> {
        let mut enumerator = udev::Enumerator::new()?;
        enumerator.match_subsystem("block")?;
        let mut out = Vec::new();
        for dev in enumerator.scan_devices()? {
            if dev.devtype().and_then(|t| t.to_str()) != Some("disk") {
                continue;
            }
            let Some(name) = dev.sysname().to_str().map(str::to_string) else {
                continue;
            };
            let sys_path = dev.syspath().to_path_buf();
            if is_hidden_path(&name, &sys_path) {
                continue;
            }
            let attr = |a: &str| {
                dev.attribute_value(a)
                    .and_then(|v| clean(&v.to_string_lossy()))
            };
            out.push(Disk {
                dev: dev.devnum().map(ebs_node_host::device::devnum_of),
                serial: attr("device/serial"),
                model: attr("device/model"),
                nsid: attr("nsid").and_then(|n| n.parse().ok()),
                name,
                sys_path,
            });
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

#[cfg(test)]
mod tests {
    use super::super::discovery::SysfsDisks;
    use super::*;

    /// On the real host both scanners must see the same disks with the same attributes.
    #[test]
    fn udev_and_sysfs_scanners_agree_on_this_host() {
        let via_udev = UdevDisks::new("/dev").disks().expect("udev enumeration");
        let via_sysfs = SysfsDisks::new("/sys", "/dev").disks().expect("sysfs scan");
        assert_eq!(via_udev, via_sysfs);
    }
}
