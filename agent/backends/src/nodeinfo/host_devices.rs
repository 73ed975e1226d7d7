//! What uses attachment slots on this host, counted from sysfs (not from the boot-time
//! metadata, which misses volumes attached since): EBS volumes, NVMe instance-store disks,
//! Xen block devices and network interfaces.

use ebs_node_core::DevNum;
use std::collections::HashSet;
use std::path::Path;

use ebs_node_core::ec2::ebs::{EBS_MODEL, INSTANCE_STORE_MODEL, normalize_serial};

pub use super::csi_owned::Disk;

/// Network drivers of EC2 interfaces: ENA on Nitro, the Intel VF on older enhanced networking.
const NIC_DRIVERS: &[&str] = &["ena", "ixgbevf"];

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct AttachedDisks {
    /// EBS NVMe namespaces, with their serials (`vol0123…`), sorted by serial.
    pub ebs: Vec<Disk>,
    pub instance_store: u32,
    /// Xen front-end disks (`xvd*`): EBS or instance store, both use an attachment.
    pub xen_disks: u32,
}

impl AttachedDisks {
    /// The EBS disks whose serials the state file does not record (`staged_serials`,
    /// normalized): the root volume, other non-CSI disks, and CSI volumes staged before the
    /// agent ran.
    pub fn unknown<'a>(
        &'a self,
        staged_serials: &'a HashSet<String>,
    ) -> impl Iterator<Item = &'a Disk> {
        self.ebs
            .iter()
            .filter(|d| !staged_serials.contains(&normalize_serial(&d.serial)))
    }

    /// Attached EBS volumes (and Xen disks) that are not CSI volumes: neither staged by the
    /// agent (`staged_serials`) nor proven CSI-owned from kubelet's mounts (`csi_owned`, the
    /// serials as sysfs gives them).
    pub fn not_csi(&self, staged_serials: &HashSet<String>, csi_owned: &HashSet<String>) -> u32 {
        let ebs = self
            .unknown(staged_serials)
            .filter(|d| !csi_owned.contains(&d.serial))
            .count();
        u32::try_from(ebs)
            .unwrap_or(u32::MAX)
            .saturating_add(self.xen_disks)
    }
}

/// Scans `<sysfs_root>/block/*/device/model`. Partitions are not listed there; one NVMe
/// namespace per controller is what EC2 attaches.
pub fn attached_disks(sysfs_root: &Path) -> AttachedDisks {
    let mut found = AttachedDisks::default();
    let Ok(entries) = std::fs::read_dir(sysfs_root.join("block")) else {
        return found;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let dev = entry.path().join("device");
        if name.starts_with("xvd") {
            found.xen_disks += 1;
            continue;
        }
        let model = std::fs::read_to_string(dev.join("model")).unwrap_or_default();
        match model.trim() {
            EBS_MODEL => {
                let serial = std::fs::read_to_string(dev.join("serial")).unwrap_or_default();
                found.ebs.push(Disk {
                    serial: serial.trim().to_string(),
                    devs: device_numbers(&entry.path(), &name),
                    name,
                });
            }
            INSTANCE_STORE_MODEL => found.instance_store += 1,
            _ => {}
        }
    }
    found.ebs.sort_by(|a, b| a.serial.cmp(&b.serial));
    found
}

/// The `maj:min` of `<sysfs>/block/<name>` and of its partitions (`<name>/<name>p1/dev`, …).
fn device_numbers(disk_dir: &Path, name: &str) -> Vec<DevNum> {
    let read = |dir: &Path| DevNum::parse(&std::fs::read_to_string(dir.join("dev")).ok()?);
    let mut devs: Vec<DevNum> = read(disk_dir).into_iter().collect();
    if let Ok(entries) = std::fs::read_dir(disk_dir) {
        devs.extend(
            entries
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with(name))
                .filter_map(|e| read(&e.path())),
        );
    }
    devs
}

/// Network interfaces bound to an EC2 network driver, from `<sysfs_root>/bus/pci/drivers/`.
/// The fallback when instance metadata cannot list them. PCI bindings rather than
/// `/sys/class/net`: a containerised agent sees only its own network namespace there, while the
/// PCI devices are the host's.
pub fn network_interfaces(sysfs_root: &Path) -> u32 {
    NIC_DRIVERS
        .iter()
        .map(|driver| {
            std::fs::read_dir(sysfs_root.join("bus/pci/drivers").join(driver))
                .map(|entries| {
                    entries
                        .flatten()
                        .filter(|e| is_pci_address(&e.file_name().to_string_lossy()))
                        .count() as u32
                })
                .unwrap_or(0)
        })
        .sum()
}

/// `0000:00:05.0`
fn is_pci_address(s: &str) -> bool {
    s.len() == 12 && s.as_bytes()[4] == b':' && s.as_bytes()[7] == b':' && s.as_bytes()[10] == b'.'
}

#[cfg(test)]
mod tests {
    use super::*;
    use ebs_node_fixture::flat as fixture;

    #[test]
    fn counts_disks_by_model_and_nics_by_driver() {
        let root = std::env::temp_dir().join(format!("hostdev-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        fixture::nvme_disk(&root, "nvme0n1", EBS_MODEL, "vol0aaaaaaaaaaaaaaaa");
        fixture::nvme_disk(&root, "nvme1n1", EBS_MODEL, "vol0bbbbbbbbbbbbbbbb");
        fixture::nvme_disk(&root, "nvme2n1", INSTANCE_STORE_MODEL, "AWS1234");
        fixture::nvme_disk(&root, "loop0", "", "");
        fixture::nic(&root, "ena", "0000:00:05.0");
        fixture::nic(&root, "ena", "0000:00:06.0");
        std::fs::create_dir_all(root.join("bus/pci/drivers/ena/module")).unwrap();
        let disks = attached_disks(&root);
        assert_eq!(disks.ebs.len(), 2);
        assert_eq!(disks.instance_store, 1);
        let staged = HashSet::from([normalize_serial("vol-0bbbbbbbbbbbbbbbb")]);
        assert_eq!(disks.not_csi(&staged, &HashSet::new()), 1);
        let owned = HashSet::from(["vol0aaaaaaaaaaaaaaaa".to_string()]);
        assert_eq!(disks.not_csi(&staged, &owned), 0);
        assert_eq!(network_interfaces(&root), 2);
        assert_eq!(network_interfaces(&root.join("nowhere")), 0);
        let _ = std::fs::remove_dir_all(&root);
    }
}
