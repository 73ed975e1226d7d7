//! Read-only raw block publications. The kernel does not apply a mount's read-only flag to
//! device special files: a read-only bind of the volume's device node still opens for writing.
//! So a read-only block publication binds a read-only loop device laid over the volume's device
//! (its backing opened read-only: the kernel makes that disk read-only and refuses writes).
//!
//! Each such device is named with a tag: this agent instance's (`ro_tag`, `instance`: agents
//! sharing a host, even with one state path in two mount namespaces, never take each other's),
//! and the publication's (volume and target). Publish journals its bind intent durably before it
//! lays the device, so after a crash the record names the tag; unpublish detaches the
//! publication's device after the unmount; start-up recovery (the core's `node::read_only`)
//! detaches every device of this agent that no present publication record names and that the
//! host shows nothing uses (`device_binds`). Here: the mechanics, laying, finding and detaching.

use ebs_node_core::DevNum;
use std::fs::File;
use std::path::Path;

use crate::device::block_devnum;
use crate::device_binds::{self, Uses};
use crate::loopdev::{self, overlay};
use ebs_node_core::error::{Error, Result};
use ebs_node_core::node::host::{ReadOnlyDevice, ReadOnlyFound};
use ebs_node_core::node::ro_tag;
use ebs_node_core::node::volume_device::VolumeDevice;

/// Every agent's tags start so; the loop controller refuses to detach a volume under one.
pub const PREFIX: &str = ebs_node_core::node::ro_tag::TAG_PREFIX;

pub fn loop_error(what: &str, e: crate::loopdev::LoopError) -> Error {
    Error::LoopDevice {
        op: what.to_string(),
        source: Box::new(e),
    }
}

/// Lays the read-only device of tag `tag` over the held, proven `device`. With `retry` (the
/// publication's record was there before this call), one an earlier attempt laid over this very
/// device is used again, and one of this tag over anything else is detached first; without it
/// no device of this tag can exist (the record is written before the device is laid, and
/// start-up recovery detaches the devices of records it drops), so no loop device is asked.
pub fn lay(device: &VolumeDevice, tag: &str, retry: bool) -> Result<ReadOnlyDevice> {
    let earlier = if retry {
        overlay::tagged(tag).map_err(|e| loop_error("listing loop devices", e))?
    } else {
        Vec::new()
    };
    for found in earlier {
        if found.tag != tag || !laid_by_an_agent(&found) {
            continue;
        }
        if found.backing == device.devnum() && found.read_only {
            let file = File::open(&found.device)
                .map_err(|e| Error::io(format!("opening {}", found.device.display()), e))?;
            if still_tagged(&file, &found.device, tag, device.devnum())? {
                return Ok(ReadOnlyDevice {
                    file,
                    path: found.device,
                });
            }
        }
        loopdev::detach(&found.device)
            .map_err(|e| loop_error("detaching a stale read-only device", e))?;
    }
    // The held device itself, reopened read-only: the loop device is over exactly the proven
    // device, and read-only because its backing cannot be written.
    let backing = File::open(device.held.proc_path())
        .map_err(|e| Error::io(format!("opening {} read-only", device.path().display()), e))?;
    // Never on a number a bind still holds (`loopdev::Avoid`).
    let uses = Uses::scan(device_binds::WITHIN);
    if let Some(why) = uses.failed() {
        return Err(Error::BindsUnknown {
            op: format!("laying a read-only device over {}", device.path().display()),
            why: why.to_string(),
        });
    }
    let avoid = |d| uses.bound(d).is_some();
    let path = overlay::attach_read_only_over_avoiding(backing, tag, &avoid).map_err(|e| {
        loop_error(
            &format!(
                "laying a read-only loop device over {}",
                device.path().display()
            ),
            e,
        )
    })?;
    let file =
        File::open(&path).map_err(|e| Error::io(format!("opening {}", path.display()), e))?;
    // The device is held from here; it must be the one just laid (not detached and reused).
    if !still_tagged(&file, &path, tag, device.devnum())? {
        return Err(Error::ReadOnlyDeviceChanged {
            device: path,
            over: device.path().to_path_buf(),
        });
    }
    Ok(ReadOnlyDevice { file, path })
}

fn still_tagged(file: &File, path: &Path, tag: &str, backing: DevNum) -> Result<bool> {
    let status = overlay::status_of(file, path)
        .map_err(|e| loop_error(&format!("asking {}", path.display()), e))?;
    Ok(status.is_some_and(|s| s.tag == tag && s.backing == backing && s.read_only))
}

/// Detaches the read-only devices of tag `tag` (none is fine). A device a workload still holds
/// open is detached by the kernel at its last close. A device the same publication got from an
/// agent before instance ids (a legacy tag: the same publication part) is detached too, once the
/// host shows nothing uses it (`device_binds`).
///
/// Never while the host shows a bind of the device (`device_binds`, every mount namespace): a bind
/// does not open the device, so a detach would free its number at once, and the next loop
/// device made (another volume's, by the controller) would take it under that bind. The
/// publication's own bind is gone by then (unmounted, and its copies in other namespaces went
/// with the target file); what is left is a workload's or an operator's, and the orchestrator's
/// retry detaches once it is gone.
pub fn remove(tag: &str) -> Result<usize> {
    let mut n = 0;
    let mut ours = Vec::new();
    let mut legacy = Vec::new();
    let part = ro_tag::publication_part(tag);
    let tagged = overlay::tagged(PREFIX).map_err(|e| loop_error("listing loop devices", e))?;
    for found in tagged.into_iter().filter(laid_by_an_agent) {
        if found.tag == tag {
            ours.push(found);
        } else if part.is_some()
            && ro_tag::publication_part(&found.tag) == part
            && is_legacy(&found.tag)
        {
            legacy.push(found);
        }
    }
    if ours.is_empty() && legacy.is_empty() {
        return Ok(0);
    }
    let uses = Uses::scan(device_binds::WITHIN);
    for found in ours {
        if let Some(what) = unused(&uses, &found) {
            return Err(Error::DeviceStillBound {
                device: found.device,
                at: format!("the read-only device of this publication: {what}"),
            });
        }
        detach(&found.device)?;
        n += 1;
    }
    for found in legacy {
        if unused(&uses, &found).is_none() {
            detach(&found.device)?;
            n += 1;
        }
    }
    Ok(n)
}

/// Whether a loop device named with an agent's tag may be one an agent laid: read-only, over a
/// block device. A name is no proof (anyone who may write to a loop device may rename it: a
/// workload its own writable raw block device, to another publication's tag, and that
/// publication's unpublish then refused while the workload's bind lasted, and detached the
/// workload's volume's device once it went: a seventieth fresh review's F2); but neither the
/// read-only flag nor a writable device's backing can be changed once it is attached.
fn laid_by_an_agent(found: &overlay::Overlay) -> bool {
    found.read_only && found.backing != DevNum::new(0, 0)
}

fn is_legacy(tag: &str) -> bool {
    tag.strip_prefix(PREFIX)
        .and_then(|rest| rest.split_once(':'))
        .is_some_and(|(agent, _)| agent.len() == 8)
}

pub fn detach(device: &Path) -> Result<()> {
    loopdev::detach(device).map_err(|e| {
        loop_error(
            &format!("detaching read-only device {}", device.display()),
            e,
        )
    })
}

/// What the host shows uses `found`; None when nothing (then it may be taken away).
pub fn unused(uses: &Uses, found: &overlay::Overlay) -> Option<String> {
    match block_devnum(&found.device) {
        Ok(devnum) => uses.of(&found.device, devnum),
        Err(e) => Some(format!("its numbers could not be read: {e}")),
    }
}

/// When the device with these numbers is one of the agents' read-only devices: the numbers of
/// the device it lies over.
pub fn lies_over(devnum: DevNum) -> Option<DevNum> {
    overlay::status_by_devnum(devnum)
        .ok()
        .flatten()
        .filter(|s| s.tag.starts_with(PREFIX) && s.read_only)
        .map(|s| s.backing)
}

/// Every read-only device named with one of `tags` and laid over `over` takes the new size of
/// what it lies over (LOOP_SET_CAPACITY): each, with the size it then shows (or why not).
pub fn resize(
    tags: &std::collections::HashSet<String>,
    over: DevNum,
) -> std::io::Result<Vec<(std::path::PathBuf, std::io::Result<u64>)>> {
    let found = overlay::tagged(PREFIX).map_err(std::io::Error::other)?;
    Ok(found
        .into_iter()
        .filter(|f| tags.contains(&f.tag) && f.backing == over)
        .map(|f| {
            let size = loopdev::set_capacity(&f.device)
                .map_err(std::io::Error::other)
                .and_then(|()| crate::device::size(&f.device));
            (f.device, size)
        })
        .collect())
}

/// This agent's read-only devices (tags starting with one of `prefixes`), for the core's
/// start-up sweep (`node::read_only::sweep`, which decides what goes).
pub fn list(prefixes: &[&str]) -> Result<Vec<ReadOnlyFound>> {
    let mut found = Vec::new();
    for prefix in prefixes {
        let tagged = overlay::tagged(prefix).map_err(|e| loop_error("listing loop devices", e))?;
        for o in tagged.into_iter().filter(laid_by_an_agent) {
            found.push(ReadOnlyFound {
                device: o.device,
                tag: o.tag,
            });
        }
    }
    Ok(found)
}

/// What the host shows uses each of `found` (`device_binds`: one scan for them all).
pub fn uses(found: &[ReadOnlyFound]) -> Vec<Option<String>> {
    if found.is_empty() {
        return Vec::new();
    }
    let uses = Uses::scan(device_binds::WITHIN);
    found
        .iter()
        .map(|f| match block_devnum(&f.device) {
            Ok(devnum) => uses.of(&f.device, devnum),
            Err(e) => Some(format!("its numbers could not be read: {e}")),
        })
        .collect()
}
