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
//! The mechanics (laying, finding, detaching) are the host crate's `real_host::read_only`; here,
//! what records decide at start-up: the sweep (following a resize is the core's `expand`).

use std::collections::HashSet;

use super::AgentCtx;
use ebs_node_core::error::Result;
use ebs_node_host::device_binds::{self, Uses};
use ebs_node_host::loopdev::{self, overlay};
use ebs_node_host::real_host::read_only::{loop_error, unused};

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
