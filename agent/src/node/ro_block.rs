//! Read-only raw block publications. The kernel does not apply a mount's read-only flag to
//! device special files: a read-only bind of the volume's device node still opens for writing.
//! So a read-only block publication binds a read-only loop device laid over the volume's device
//! (its backing opened read-only: the kernel makes that disk read-only and refuses writes).
//!
//! Each such device is named with a tag: this agent's (a hash of its state file's path, so that
//! agents sharing a host never take each other's), and the publication's (volume and target).
//! Publish journals its bind intent durably before it lays the device, so after a crash the
//! record names the tag; unpublish detaches the publication's device after the unmount, and
//! start-up recovery detaches every device of this agent that no present publication binds.

use ebs_node_core::DevNum;
use std::collections::HashSet;
use std::fs::File;
use std::path::Path;

use super::AgentCtx;
use crate::error::{Error, Result};
use ebs_node_core::node::host::ReadOnlyDevice;
use ebs_node_core::node::ro_tag;
use ebs_node_core::node::volume_device::VolumeDevice;
use ebs_node_host::loopdev::{self, overlay};

/// Every agent's tags start so; the loop controller refuses to detach a volume under one.
const PREFIX: &str = ebs_node_core::node::ro_tag::TAG_PREFIX;

fn loop_error(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Internal(format!("{what}: {e}"))
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
        if found.tag != tag {
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
    let path = overlay::attach_read_only_over(backing, tag).map_err(|e| {
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
        return Err(Error::Internal(format!(
            "{} changed right after it was laid over {}",
            path.display(),
            device.path().display()
        )));
    }
    Ok(ReadOnlyDevice { file, path })
}

fn still_tagged(file: &File, path: &Path, tag: &str, backing: DevNum) -> Result<bool> {
    let status = overlay::status_of(file, path)
        .map_err(|e| loop_error(&format!("asking {}", path.display()), e))?;
    Ok(status.is_some_and(|s| s.tag == tag && s.backing == backing && s.read_only))
}

/// Detaches the read-only devices of tag `tag` (none is fine). A device a workload still holds
/// open is detached by the kernel at its last close.
pub fn remove(tag: &str) -> Result<usize> {
    let mut n = 0;
    for found in overlay::tagged(tag).map_err(|e| loop_error("listing loop devices", e))? {
        if found.tag == tag {
            loopdev::detach(&found.device).map_err(|e| {
                loop_error(
                    &format!("detaching read-only device {}", found.device.display()),
                    e,
                )
            })?;
            n += 1;
        }
    }
    Ok(n)
}

/// Start-up: detaches this agent's read-only devices whose tag is not in `keep` (a publish that
/// crashed between laying the device and binding it, an unpublish that crashed before the
/// detach). Returns how many it detached.
pub fn sweep(ctx: &AgentCtx, keep: &HashSet<String>) -> Result<usize> {
    let mut n = 0;
    for found in overlay::tagged(&ro_tag::agent_prefix(ctx))
        .map_err(|e| loop_error("listing loop devices", e))?
    {
        if keep.contains(&found.tag) {
            continue;
        }
        match loopdev::detach(&found.device) {
            Ok(()) => {
                tracing::info!(device = %found.device.display(), tag = %found.tag,
                    "recovery: detached a read-only device no publication binds");
                n += 1;
            }
            Err(e) => tracing::warn!(device = %found.device.display(), error = %e,
                "recovery: could not detach a read-only device no publication binds"),
        }
    }
    Ok(n)
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
