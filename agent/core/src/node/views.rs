//! The same bytes under other numbers: a device is taken only while no other device showing its
//! bytes (`HostOps::views_of`: a loop device over the same file, one laid over it, the device it
//! is laid over) is used, and the idle ones are claimed exclusively until the call ends, so
//! nothing mounts them meanwhile (a twenty-fourth and a twenty-fifth fresh review's F1 to F4: a
//! handle, a filesystem stage and a raw block stage or publish each took a device whose bytes
//! another loop device had mounted read-write, or bound raw, elsewhere). The volume's own
//! read-only devices (its read-only raw block publications', by their tags) are its own use.

use std::collections::HashSet;
use std::path::Path;

use crate::DevNum;
use crate::error::{Error, Result};

use super::NodeCtx;
use super::host::HeldViews;

/// Refuses when another view of `devnum` is in use by anything but `volume`'s read-only devices;
/// holds the others until the answer drops.
pub fn refuse_used_and_hold(
    ctx: &NodeCtx,
    volume: &str,
    devnum: DevNum,
    device: &Path,
) -> Result<HeldViews> {
    let views = ctx.host.views_of(devnum).map_err(|e| {
        Error::io(
            format!("finding the other devices that show {}", device.display()),
            e,
        )
    })?;
    if views.is_empty() {
        return Ok(HeldViews::default());
    }
    let own = own_read_only_tags(ctx, volume)?;
    let mut idle = Vec::new();
    for view in views.into_iter().filter(|v| !own.contains(&v.name)) {
        match view.in_use {
            Some(what) => {
                return Err(Error::BytesInUseElsewhere {
                    volume: volume.to_string(),
                    device: device.to_path_buf(),
                    view: view.devnum,
                    what,
                });
            }
            None => idle.push(view.devnum),
        }
    }
    ctx.host
        .hold_views(devnum, &idle)
        .map_err(|e| Error::BytesInUseElsewhere {
            volume: volume.to_string(),
            device: device.to_path_buf(),
            view: DevNum::new(0, 0),
            what: format!("it could not be held while the call runs ({e})"),
        })
}

/// The tags of `volume`'s read-only devices, by its read-only raw block publications.
fn own_read_only_tags(ctx: &NodeCtx, volume: &str) -> Result<HashSet<String>> {
    let mut tags = HashSet::new();
    for p in ctx.ledger.publications(volume)? {
        if p.block && p.readonly {
            tags.insert(ctx.agent_tag.tag(volume, &p.target_path));
            tags.insert(ctx.agent_tag.legacy_tag(volume, &p.target_path));
        }
    }
    Ok(tags)
}
