//! Which volumes a scrape reads, and which disks carry them.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io;
use std::path::{Component, Path, PathBuf};

use ebs_node_core::records::{DeviceIdentity, Progress};
use ebs_store::Store;

use ebs_node_backends::ebs::discovery::read_attr;
use ebs_node_host::nvme::ebs_page;

/// A volume to read: its id and the NVMe serial its device carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wanted {
    pub volume_id: String,
    pub serial: String,
}

/// The volumes whose pages a scrape reads: staged (completely) or published, with an NVMe
/// identity, under the mount-point prefix when one is set.
pub fn wanted_volumes(
    store: &Store,
    prefix: Option<&Path>,
) -> Result<Vec<Wanted>, ebs_store::StoreError> {
    // volume id -> (serial, if known and NVMe; paths it is mounted at)
    let mut seen: BTreeMap<String, (Option<Option<String>>, Vec<PathBuf>)> = BTreeMap::new();
    for s in store.all_staged()? {
        if s.progress != Progress::Complete {
            continue;
        }
        let serial = match s.identity {
            DeviceIdentity::NvmeSerial { serial } => Some(serial),
            // Xen disks and loop files have no NVMe page.
            DeviceIdentity::Unverified | DeviceIdentity::LoopFile { .. } => None,
        };
        let entry = seen.entry(s.volume_id).or_default();
        entry.0 = Some(serial);
        entry.1.push(s.staging_path);
    }
    for p in store.all_publications()? {
        seen.entry(p.volume_id).or_default().1.push(p.target_path);
    }
    let prefix = prefix.map(lexically_clean);
    Ok(seen
        .into_iter()
        .filter(|(_, (_, paths))| match &prefix {
            None => true,
            Some(pre) => paths.iter().any(|p| p.starts_with(pre) && p != pre),
        })
        .filter_map(|(volume_id, (serial, _))| {
            let serial = match serial {
                Some(s) => s?,
                None => serial_of(&volume_id)?,
            };
            Some(Wanted { volume_id, serial })
        })
        .collect())
}

/// EBS's NVMe serial for a volume id: the id without its dash (`vol-0abc` -> `vol0abc`).
pub fn serial_of(volume_id: &str) -> Option<String> {
    let hex = volume_id.strip_prefix("vol-")?;
    (!hex.is_empty() && hex.bytes().all(|b| b.is_ascii_hexdigit())).then(|| format!("vol{hex}"))
}

/// `.` and `..` resolved without touching the filesystem, as upstream cleans its prefix.
fn lexically_clean(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// An NVMe disk as a scrape needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NvmeDisk {
    pub name: String,
    pub model: Option<String>,
}

/// The visible NVMe disks carrying one of `serials`, by serial. Lighter than the backend's scan
/// (which also resolves every disk's sysfs path and device numbers) because every scrape runs
/// it: one attribute read per NVMe disk, one more for each disk that is wanted. When several
/// disks carry a serial, namespace 1 is the volume's, as the backend decides.
pub fn disks_by_serial(
    sys_root: &Path,
    serials: &HashSet<&str>,
) -> io::Result<HashMap<String, Vec<NvmeDisk>>> {
    let block = sys_root.join("block");
    let mut out: HashMap<String, Vec<NvmeDisk>> = HashMap::new();
    for entry in std::fs::read_dir(&block)? {
        let entry = entry?;
        let Some(name) = entry.file_name().to_str().map(str::to_string) else {
            continue;
        };
        if !name.starts_with("nvme") || is_path_node(&name) {
            continue;
        }
        let dir = block.join(&name);
        let Some(serial) = read_attr(&dir.join("device/serial")) else {
            continue;
        };
        if !serials.contains(serial.as_str()) {
            continue;
        }
        let model = read_attr(&dir.join("device/model"));
        out.entry(serial)
            .or_default()
            .push(NvmeDisk { name, model });
    }
    for disks in out.values_mut() {
        if disks.len() > 1 {
            disks.retain(|d| {
                read_attr(&block.join(&d.name).join("nsid")).and_then(|n| n.parse().ok())
                    == Some(ebs_page::NSID)
            });
        }
        disks.sort_by(|a, b| a.name.cmp(&b.name));
    }
    Ok(out)
}

/// Native NVMe multipath's hidden per-path nodes, `nvme<subsys>c<ctrl>n<ns>`: their namespace
/// is read through the visible head `nvme<subsys>n<ns>`.
fn is_path_node(name: &str) -> bool {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let Some(rest) = name.strip_prefix("nvme") else {
        return false;
    };
    rest.split_once('c').is_some_and(|(a, b)| {
        digits(a)
            && b.split_once('n')
                .is_some_and(|(c, n)| digits(c) && digits(n))
    })
}
