//! Start-up's sweep of read-only raw block devices (see `ro_tag`, and the host crate's
//! `real_host::read_only` for the mechanics). This agent's read-only devices (current and legacy
//! tags) that no publication record names (a publish that crashed between laying the device and
//! binding it, an unpublish that crashed before the detach, or records lost to `recover`) are
//! detached, but only those the host shows nothing uses: records and tags alone never take a
//! device away.

use std::collections::HashSet;

use super::NodeCtx;
use super::host::Swept;
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
    ctx.host.sweep_read_only(&ctx.agent_tag.prefixes(), &keep)
}
