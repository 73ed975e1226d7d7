//! Read-only raw block publications. The kernel does not apply a mount's read-only flag to
//! device special files: a read-only bind of the volume's device node still opens for writing.
//! So a read-only block publication binds a read-only loop device laid over the volume's device
//! (its backing opened read-only: the kernel makes that disk read-only and refuses writes).
//!
//! Each such device is named with a tag: this agent instance's (`ro_tag`, `instance`: agents
//! sharing a host, even with one state path in two mount namespaces, never take each other's),
//! and the publication's (volume and target). Publish journals its bind intent durably before it
//! lays the device, so after a crash the record names the tag; unpublish detaches the
//! publication's device after the unmount; start-up recovery detaches every device of this agent
//! that no present publication record names and that the host shows nothing uses (`device_binds`).

use ebs_node_core::DevNum;
use std::collections::HashSet;
use std::fs::File;
use std::path::Path;

use super::AgentCtx;
use ebs_node_core::error::{Error, Result};
use ebs_node_core::node::host::ReadOnlyDevice;
use ebs_node_core::node::ro_tag;
use ebs_node_core::node::volume_device::VolumeDevice;
use ebs_node_host::device::block_devnum;
use ebs_node_host::device_binds::{self, Uses};
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
    // Never on a number a bind still holds (`loopdev::Avoid`).
    let uses = Uses::scan(device_binds::WITHIN);
    if let Some(why) = uses.failed() {
        return Err(Error::Unavailable(format!(
            "laying a read-only device over {}: no device number can be told free of binds: {why}",
            device.path().display()
        )));
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
    for found in overlay::tagged(PREFIX).map_err(|e| loop_error("listing loop devices", e))? {
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
        detach(&found)?;
        n += 1;
    }
    for found in legacy {
        if unused(&uses, &found).is_none() {
            detach(&found)?;
            n += 1;
        }
    }
    Ok(n)
}

fn is_legacy(tag: &str) -> bool {
    tag.strip_prefix(PREFIX)
        .and_then(|rest| rest.split_once(':'))
        .is_some_and(|(agent, _)| agent.len() == 8)
}

fn detach(found: &overlay::Overlay) -> Result<()> {
    loopdev::detach(&found.device).map_err(|e| {
        loop_error(
            &format!("detaching read-only device {}", found.device.display()),
            e,
        )
    })
}

/// What the host shows uses `found`; None when nothing (then it may be taken away).
fn unused(uses: &Uses, found: &overlay::Overlay) -> Option<String> {
    match block_devnum(&found.device) {
        Ok(devnum) => uses.of(&found.device, devnum),
        Err(e) => Some(format!("its numbers could not be read: {e}")),
    }
}

/// What start-up did with this agent's read-only devices that no publication record names.
#[derive(Debug, Default, Clone, Copy)]
pub struct Swept {
    pub detached: usize,
    /// Still used on the host (a reset or rebuilt state file lost their records): kept.
    pub adopted: usize,
}

/// Start-up: this agent's read-only devices (current and legacy tags) that no publication
/// record names (a publish that crashed between laying the device and binding it, an unpublish
/// that crashed before the detach, or records lost to `recover`) are detached, but only those the
/// host shows nothing uses: records and tags alone never take a device away. Records that do not
/// decode leave the sweep for the next start.
pub fn sweep(ctx: &AgentCtx) -> Result<Swept> {
    let mut keep = HashSet::new();
    for p in ctx.store.all_publications()? {
        if p.block && p.readonly {
            keep.insert(ctx.agent_tag.tag(p.volume_id.as_str(), &p.target_path));
            keep.insert(
                ctx.agent_tag
                    .legacy_tag(p.volume_id.as_str(), &p.target_path),
            );
        }
    }
    let mut strays = Vec::new();
    for prefix in ctx.agent_tag.prefixes() {
        for found in overlay::tagged(prefix).map_err(|e| loop_error("listing loop devices", e))? {
            if !keep.contains(&found.tag) {
                strays.push(found);
            }
        }
    }
    let mut swept = Swept::default();
    if strays.is_empty() {
        return Ok(swept);
    }
    let uses = Uses::scan(device_binds::WITHIN);
    for found in strays {
        if let Some(what) = unused(&uses, &found) {
            tracing::warn!(device = %found.device.display(), tag = %found.tag, used = %what,
                "recovery: a read-only block device no publication record names is still in use; kept (adopted): `recover --from-mounts` rebuilds its record");
            swept.adopted += 1;
            continue;
        }
        match loopdev::detach(&found.device) {
            Ok(()) => {
                tracing::info!(device = %found.device.display(), tag = %found.tag,
                    "recovery: detached a read-only device nothing uses and no publication binds");
                swept.detached += 1;
            }
            Err(e) => tracing::warn!(device = %found.device.display(), error = %e,
                "recovery: could not detach a read-only device no publication binds"),
        }
    }
    Ok(swept)
}

/// Expansion: every read-only device of `volume`'s read-only block publications, laid over
/// `device` (numbers `devnum`), takes the device's new `size` (LOOP_SET_CAPACITY), so the
/// workload sees the grown volume. A device that does not is FAILED_PRECONDITION, naming it.
pub fn follow_resize(ctx: &AgentCtx, volume: &str, devnum: DevNum, size: u64) -> Result<usize> {
    let mut tags = HashSet::new();
    for p in ctx.store.publications(volume)? {
        if p.block && p.readonly {
            tags.insert(ctx.agent_tag.tag(volume, &p.target_path));
            tags.insert(ctx.agent_tag.legacy_tag(volume, &p.target_path));
        }
    }
    if tags.is_empty() {
        return Ok(0);
    }
    let mut n = 0;
    for found in overlay::tagged(PREFIX).map_err(|e| loop_error("listing loop devices", e))? {
        if !tags.contains(&found.tag) || found.backing != devnum {
            continue;
        }
        let refused = |why: String| {
            Error::Precondition(format!(
                "volume {volume} grew to {size} bytes, but its read-only block device {} (a \
                 publication's) did not follow: {why}",
                found.device.display()
            ))
        };
        loopdev::set_capacity(&found.device).map_err(|e| refused(e.to_string()))?;
        let now = ebs_node_host::device::size(&found.device).map_err(|e| refused(e.to_string()))?;
        if now != size {
            return Err(refused(format!("it shows {now} bytes")));
        }
        tracing::info!(volume, device = %found.device.display(), bytes = size,
            "a read-only block device followed the volume's resize");
        n += 1;
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
