//! Start-up's sweep of read-only raw block devices (see `ro_tag`, and the host crate's
//! `real_host::read_only` for the mechanics). This agent's read-only devices (current and legacy
//! tags) that no publication record names (a publish that crashed between laying the device and
//! binding it, an unpublish that crashed before the detach, or records lost to `recover`) are
//! detached, but only those the host shows nothing uses: records and tags alone never take a
//! device away (after `recover --reset` or `--from-mounts` no record names a live read-only
//! publication's device; the workload's bind of its node still does). The decision is here, so
//! the simulation's state resets attack it; the host only lists, reports uses and detaches.

use std::collections::HashSet;

use super::NodeCtx;
use super::host::{ReadOnlyFound, Swept};
use crate::error::Result;

/// Detaches this agent's read-only devices no publication record names and nothing uses.
pub fn sweep(ctx: &NodeCtx) -> Result<Swept> {
    let mut keep = HashSet::new();
    for p in ctx.ledger.all_publications()? {
        if p.block && p.readonly {
            let volume = p.volume_id.as_str();
            keep.insert(ctx.agent_tag.tag(volume, &p.target_path));
            keep.insert(ctx.agent_tag.legacy_tag(volume, &p.target_path));
        }
    }
    let strays: Vec<ReadOnlyFound> = (ctx.host.read_only_devices(&ctx.agent_tag.prefixes())?)
        .into_iter()
        .filter(|found| !keep.contains(&found.tag))
        .collect();
    let mut swept = Swept::default();
    if strays.is_empty() {
        return Ok(swept);
    }
    let uses = ctx.host.read_only_uses(&strays);
    for (found, used) in strays.iter().zip(uses) {
        if let Some(what) = used {
            tracing::warn!(device = %found.device.display(), tag = %found.tag, used = %what,
                "recovery: a read-only block device no publication record names is still in use; kept (adopted): `recover --from-mounts` rebuilds its record");
            swept.adopted += 1;
            continue;
        }
        match ctx.host.detach_read_only(found) {
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
