//! Attached EBS disks that are provably CSI volumes although the journal does not know them:
//! volumes the upstream node plugin staged or published before it was swapped for this agent.
//! The scheduler already counts them against the node's allocatable, so reserving a slot for
//! each as well would count them twice (the upstream driver's open issue 2796 does exactly that).
//!
//! The proof is kubelet's own layout, read from the mount table:
//! - a filesystem volume: the disk (or one of its partitions) is mounted at kubelet's staging path
//!   for this driver, `…/plugins/kubernetes.io/csi/<driver>/<sha256>/globalmount` (kubelet 1.24
//!   and later); or at the older `…/plugins/kubernetes.io/csi/pv/<pv>/globalmount`, whose
//!   `vol_data.json` beside it names the driver;
//! - a block volume: the disk's device node is bind-mounted at kubelet's block paths,
//!   `…/plugins/kubernetes.io/csi/volumeDevices/publish/<pv>/<pod>` (or `…/staging/<pv>`), where
//!   the mount's root is `/<disk name>` in devtmpfs, and `…/volumeDevices/<pv>/data/vol_data.json`
//!   names the driver (the path itself names none).
//!
//! Anything else (the root volume, a disk mounted elsewhere, a disk nobody mounted) still counts
//! as not CSI: a slot wrongly reserved costs one volume, a slot wrongly freed fails an attach.

use ebs_node_core::DevNum;
use std::collections::HashSet;
use std::ffi::OsStr;
use std::path::{Component, Path};

use ebs_node_host::mount::table::{MountEntry, MountTable};

/// An attached EBS disk: its serial (as sysfs gives it), kernel name, and the device numbers of
/// the disk and of its partitions (sysfs lists both).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disk {
    pub serial: String,
    pub name: String,
    pub devs: Vec<DevNum>,
}

/// The serials (as given) of `disks` that kubelet's paths for `driver` show to be CSI volumes.
pub fn csi_owned<'a>(
    disks: impl IntoIterator<Item = &'a Disk>,
    table: &MountTable,
    driver: &str,
) -> HashSet<String> {
    let proofs: Vec<&MountEntry> = table
        .entries()
        .iter()
        .filter(|m| {
            is_staging_path(&m.mount_point, driver) || is_block_path(&m.mount_point, driver)
        })
        .collect();
    disks
        .into_iter()
        .filter(|d| proofs.iter().any(|m| mounts_disk(m, d, driver)))
        .map(|d| d.serial.clone())
        .collect()
}

fn mounts_disk(m: &MountEntry, disk: &Disk, driver: &str) -> bool {
    if is_block_path(&m.mount_point, driver) {
        // A bind of the device node: devtmpfs's numbers, the node's name as the root.
        return m.root == Path::new("/").join(&disk.name);
    }
    if !is_staging_path(&m.mount_point, driver) {
        return false;
    }
    // The disk itself or one of its partitions, by the numbers the mount table gives.
    disk.devs.contains(&DevNum::new(m.major, m.minor))
}

fn names(path: &Path) -> Vec<&OsStr> {
    path.components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n),
            _ => None,
        })
        .collect()
}

/// `…/plugins/kubernetes.io/csi/<driver>/<hash>/globalmount`, or the pre-1.24
/// `…/plugins/kubernetes.io/csi/pv/<pv>/globalmount` whose vol_data.json names `driver`.
fn is_staging_path(path: &Path, driver: &str) -> bool {
    let n = names(path);
    let Some(at) = csi_dir(&n) else { return false };
    let rest = &n[at..];
    if rest.len() != 3 || rest[2] != "globalmount" {
        return false;
    }
    if rest[0] == driver {
        return true;
    }
    rest[0] == "pv" && vol_data_beside(path, driver)
}

/// `…/plugins/kubernetes.io/csi/volumeDevices/publish/<pv>/<pod>` or `…/staging/<pv>`, whose
/// `…/volumeDevices/<pv>/data/vol_data.json` names `driver`: kubelet's block paths for it.
fn is_block_path(path: &Path, driver: &str) -> bool {
    let n = names(path);
    let Some(at) = csi_dir(&n) else { return false };
    let rest = &n[at..];
    let pv = match rest {
        [dev, kind, pv, _pod] if *dev == "volumeDevices" && *kind == "publish" => pv,
        [dev, kind, pv] if *dev == "volumeDevices" && *kind == "staging" => pv,
        _ => return false,
    };
    // `…/volumeDevices` itself: the path up to and including that component.
    let depth = n.len() - rest.len() + 1;
    let mut dir = if path.is_absolute() {
        std::path::PathBuf::from("/")
    } else {
        std::path::PathBuf::new()
    };
    dir.extend(&n[..depth]);
    vol_data_names(&dir.join(pv).join("data"), driver)
}

/// The index just past `plugins/kubernetes.io/csi` in `n`.
fn csi_dir(n: &[&OsStr]) -> Option<usize> {
    n.windows(3)
        .position(|w| {
            w == [
                OsStr::new("plugins"),
                "kubernetes.io".as_ref(),
                "csi".as_ref(),
            ]
        })
        .map(|i| i + 3)
}

/// kubelet writes `{"driverName":"…",…}` beside the old-layout globalmount. Read at most a few KiB:
/// the file is kubelet's, small, and read only while the limit is recomputed.
fn vol_data_beside(globalmount: &Path, driver: &str) -> bool {
    globalmount
        .parent()
        .is_some_and(|dir| vol_data_names(dir, driver))
}

/// Whether `dir/vol_data.json` names `driver`.
fn vol_data_names(dir: &Path, driver: &str) -> bool {
    use std::io::Read;
    let mut text = String::new();
    let read = std::fs::File::open(dir.join("vol_data.json"))
        .and_then(|f| f.take(16 * 1024).read_to_string(&mut text));
    if read.is_err() {
        return false;
    }
    serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .and_then(|v| {
            v.get("driverName")
                .and_then(|d| d.as_str())
                .map(|d| d == driver)
        })
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DRIVER: &str = "ebs.csi.aws.com";

    fn disk(serial: &str, name: &str, dev: (u32, u32)) -> Disk {
        Disk {
            serial: serial.into(),
            name: name.into(),
            devs: vec![dev.into()],
        }
    }

    fn table(lines: &[&str]) -> MountTable {
        MountTable::parse(&lines.join("\n")).expect("mountinfo")
    }

    #[test]
    fn kubelets_staging_and_block_paths_prove_a_disk_is_csi() {
        let k = "/var/lib/kubelet/plugins/kubernetes.io/csi";
        let t = table(&[
            "20 1 259:0 / / rw - ext4 /dev/nvme0n1p1 rw",
            &format!("30 20 259:3 / {k}/{DRIVER}/abc/globalmount rw - ext4 /dev/nvme1n1 rw"),
            "31 20 259:4 / /var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/pv/mount rw - xfs /dev/nvme2n1 rw",
            &format!("32 20 0:5 /nvme3n1 {k}/volumeDevices/publish/pv-b/pod rw - devtmpfs udev rw"),
            &format!(
                "33 20 259:6 / {k}/other.csi.example.com/abc/globalmount rw - ext4 /dev/nvme4n1 rw"
            ),
            &format!("34 20 259:8 / {k}/{DRIVER}/def/globalmount rw - ext4 /dev/nvme5n1p1 rw"),
        ]);
        let disks = [
            disk("vol0root", "nvme0n1", (259, 1)),
            disk("vol0staged", "nvme1n1", (259, 3)),
            // Mounted in a pod directory only: not kubelet's staging path, so not proven.
            disk("vol0podonly", "nvme2n1", (259, 4)),
            // A block bind, but no vol_data.json names the driver: proves nothing.
            disk("vol0block", "nvme3n1", (259, 5)),
            disk("vol0otherdriver", "nvme4n1", (259, 6)),
            Disk {
                devs: vec![DevNum::new(259, 7), DevNum::new(259, 8)],
                ..disk("vol0partition", "nvme5n1", (259, 7))
            },
            disk("vol0unmounted", "nvme6n1", (259, 9)),
        ];
        let owned = csi_owned(&disks, &t, DRIVER);
        let mut owned: Vec<_> = owned.into_iter().collect();
        owned.sort();
        assert_eq!(owned, ["vol0partition", "vol0staged"]);
    }

    #[test]
    fn the_old_layout_counts_only_with_this_drivers_vol_data() {
        let root = std::env::temp_dir().join(format!("csi-owned-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let k = root.join("plugins/kubernetes.io/csi/pv");
        for (pv, driver) in [("pv-ours", DRIVER), ("pv-theirs", "other.example.com")] {
            std::fs::create_dir_all(k.join(pv).join("globalmount")).expect("dir");
            std::fs::write(
                k.join(pv).join("vol_data.json"),
                format!(r#"{{"driverName":"{driver}","volumeHandle":"vol-1"}}"#),
            )
            .expect("vol_data");
        }
        let line = |id: u32, minor: u32, pv: &str| {
            format!(
                "{id} 1 259:{minor} / {} rw - ext4 /dev/x rw",
                k.join(pv).join("globalmount").display()
            )
        };
        let t = table(&[&line(40, 1, "pv-ours"), &line(41, 2, "pv-theirs")]);
        let disks = [
            disk("vol0a", "nvme1n1", (259, 1)),
            disk("vol0b", "nvme2n1", (259, 2)),
        ];
        let owned = csi_owned(&disks, &t, DRIVER);
        assert_eq!(owned, HashSet::from(["vol0a".to_string()]));
        let _ = std::fs::remove_dir_all(&root);
    }

    /// kubelet's block paths name no driver: `volumeDevices/<pv>/data/vol_data.json` does.
    #[test]
    fn block_binds_count_only_with_this_drivers_vol_data() {
        let root = std::env::temp_dir().join(format!("csi-owned-block-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let k = root.join("plugins/kubernetes.io/csi/volumeDevices");
        for (pv, driver) in [("pv-ours", DRIVER), ("pv-theirs", "other.example.com")] {
            std::fs::create_dir_all(k.join(pv).join("data")).expect("dir");
            std::fs::write(
                k.join(pv).join("data/vol_data.json"),
                format!(r#"{{"driverName":"{driver}","volumeHandle":"vol-1"}}"#),
            )
            .expect("vol_data");
        }
        let line = |id: u32, name: &str, at: &str| {
            format!(
                "{id} 1 0:5 /{name} {} rw - devtmpfs udev rw",
                k.join(at).display()
            )
        };
        let t = table(&[
            &line(40, "nvme1n1", "publish/pv-ours/pod-1"),
            &line(41, "nvme2n1", "publish/pv-theirs/pod-1"),
            &line(42, "nvme3n1", "staging/pv-ours"),
            // Not one of kubelet's block paths, although below volumeDevices.
            &line(43, "nvme4n1", "pv-ours/dev/pod-1"),
        ]);
        let disks = [
            disk("vol0a", "nvme1n1", (259, 1)),
            disk("vol0b", "nvme2n1", (259, 2)),
            disk("vol0c", "nvme3n1", (259, 3)),
            disk("vol0d", "nvme4n1", (259, 4)),
        ];
        let owned = csi_owned(&disks, &t, DRIVER);
        assert_eq!(
            owned,
            HashSet::from(["vol0a".to_string(), "vol0c".to_string()])
        );
        let _ = std::fs::remove_dir_all(&root);
    }
}
