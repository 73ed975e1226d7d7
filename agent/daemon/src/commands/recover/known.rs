//! What `recover --from-mounts` knows a mounted device by: the EBS volumes the NVMe disks'
//! serials name, the volume a bind of a device node hands out (through this agent's read-only
//! device or not), and the node-local handle kubelet's layout names for a device that is none
//! of the agent's volumes.

use ebs_node_backends::kubelet_names::handle_at;
use ebs_node_core::DevNum;
use ebs_node_core::node::ro_tag::AgentTag;
use ebs_node_core::records::DeviceIdentity;
use ebs_node_host::loopdev::overlay;
use std::collections::HashMap;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use super::Known;

/// EBS volumes: NVMe namespaces whose controller serial is a volume id.
pub(super) fn nvme_volumes() -> Vec<Known> {
    let mut known = Vec::new();
    let Ok(entries) = std::fs::read_dir("/sys/block") else {
        return known;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("nvme") {
            continue;
        }
        let serial =
            std::fs::read_to_string(entry.path().join("device/serial")).unwrap_or_default();
        let serial = serial.trim();
        if let Some(rest) = serial.strip_prefix("vol") {
            known.push(Known {
                volume_id: format!("vol-{rest}"),
                device: PathBuf::from("/dev").join(&name),
                identity: DeviceIdentity::NvmeSerial {
                    serial: serial.to_string(),
                },
            });
        }
    }
    known
}

/// The volume a block bind at `at` hands out, and whether through one of this agent's
/// read-only devices laid over it (a read-only raw block publication): by the device numbers of
/// the node bound there, not by names.
pub(super) fn block_bound<'k>(
    at: &Path,
    by_numbers: &HashMap<DevNum, &'k Known>,
    agent_tag: &AgentTag,
) -> Option<(&'k Known, bool)> {
    let meta = std::fs::symlink_metadata(at).ok()?;
    if !meta.file_type().is_block_device() {
        return None;
    }
    let devnum = ebs_node_host::device::devnum_of(meta.rdev());
    if let Some(k) = by_numbers.get(&devnum) {
        return Some((k, false));
    }
    let ro = overlay::status_by_devnum(devnum).ok().flatten()?;
    let k = by_numbers.get(&ro.backing)?;
    let laid_here = [
        agent_tag.tag(&k.volume_id, at),
        agent_tag.legacy_tag(&k.volume_id, at),
    ];
    if !ro.read_only || !laid_here.contains(&ro.tag) {
        println!(
            "volume {}: {} binds a read-only device ({}) this agent did not lay there; left alone, \
             no record made",
            k.volume_id,
            at.display(),
            ro.tag
        );
        return None;
    }
    Some((k, true))
}

/// The node-local handle a mount (or a bind of a device node) of a device that is none of the
/// agent's volumes was made through, when kubelet's layout says so (`kubelet_names::handle_at`),
/// with no identity to prove (the record rests on the device's numbers and the attachment they
/// name); remembered per device, so its later mounts follow its first.
pub(super) fn handle_device(
    m: &ebs_node_host::mount::table::MountEntry,
    block_bind: bool,
    agent_tag: &AgentTag,
    handles: &mut HashMap<DevNum, Known>,
) -> Option<(Known, bool)> {
    let (devnum, read_only) = if block_bind {
        let meta = std::fs::symlink_metadata(&m.mount_point).ok()?;
        if !meta.file_type().is_block_device() {
            return None;
        }
        let bound = ebs_node_host::device::devnum_of(meta.rdev());
        // A read-only raw block publication binds this agent's read-only device laid over the
        // handle's: the handle is the device under it, when this agent laid it here for that
        // handle (a thirty-second fresh review's F3: no record was made).
        match overlay::status_by_devnum(bound).ok().flatten() {
            Some(ro)
                if ro.read_only && agent_tag.prefixes().iter().any(|p| ro.tag.starts_with(p)) =>
            {
                (ro.backing, Some(ro.tag))
            }
            _ => (bound, None),
        }
    } else {
        (DevNum::new(m.major, m.minor), None)
    };
    let k = match handles.get(&devnum) {
        Some(k) => k.clone(),
        None => {
            let device = PathBuf::from("/dev").join(ebs_node_host::raw_use::kernel_name(devnum)?);
            let handle = handle_at(&device, &m.mount_point)?;
            // Which backend staged it (and so which identity it recorded) is not known here:
            // the record rests on the device's numbers and attachment, as a serial-less disk's.
            let k = Known {
                volume_id: handle,
                device,
                identity: DeviceIdentity::Unverified,
            };
            handles.insert(devnum, k.clone());
            k
        }
    };
    match read_only {
        Some(tag) => {
            let laid_here = [
                agent_tag.tag(&k.volume_id, &m.mount_point),
                agent_tag.legacy_tag(&k.volume_id, &m.mount_point),
            ];
            laid_here.contains(&tag).then_some((k, true))
        }
        None => Some((k, false)),
    }
}
