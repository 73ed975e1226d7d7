//! The same bytes under other numbers: a device is taken only while no other device showing its
//! bytes (`HostOps::views_of`: a loop device over the same file, one laid over it, the device it
//! is laid over) is used, and the idle ones are claimed exclusively until the call ends, so
//! nothing mounts them meanwhile (a twenty-fourth and a twenty-fifth fresh review's F1 to F4: a
//! handle, a filesystem stage and a raw block stage or publish each took a device whose bytes
//! another loop device had mounted read-write, or bound raw, elsewhere). The volume's own
//! read-only devices (its read-only raw block publications', by their tags) are its own use.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::DevNum;
use crate::error::{Error, Result};

use super::NodeCtx;
use super::host::{HeldViews, View};

/// Refuses when another view of `devnum` is in use by anything but `volume`'s read-only devices;
/// holds the others until the answer drops.
pub fn refuse_used_and_hold(
    ctx: &NodeCtx,
    volume: &str,
    devnum: DevNum,
    device: &Path,
) -> Result<HeldViews> {
    let idle = idle_views(ctx, volume, devnum, device, &[])?;
    if idle.is_empty() {
        return Ok(HeldViews::default());
    }
    ctx.host.hold_views(devnum, &idle).map_err(|e| {
        refusal(
            volume,
            device,
            DevNum::new(0, 0),
            format!("it could not be held while the call runs ({e})"),
        )
    })
}

/// The same question again once the device is in use (right after the stage's mount): a view
/// attached since the first scan, and used before this call's mount, is caught here (a
/// twenty-seventh fresh review's F5). The views this call holds are its own.
pub fn recheck(
    ctx: &NodeCtx,
    volume: &str,
    devnum: DevNum,
    device: &Path,
    held: &HeldViews,
) -> Result<()> {
    idle_views(ctx, volume, devnum, device, &held.devnums).map(drop)
}

/// The views of `devnum` that nothing uses, or the refusal naming the one in use. A view is the
/// volume's own only when it is one of its read-only devices: its tag, read-only, and laid over
/// this very device (the name alone can be given to any loop device: a twenty-seventh fresh
/// review's F4).
fn idle_views(
    ctx: &NodeCtx,
    volume: &str,
    devnum: DevNum,
    device: &Path,
    held: &[DevNum],
) -> Result<Vec<View>> {
    let views = ctx.host.views_of(devnum).map_err(|e| {
        refusal(
            volume,
            device,
            DevNum::new(0, 0),
            format!("what else shows its bytes cannot be told ({e})"),
        )
    })?;
    if views.is_empty() {
        return Ok(Vec::new());
    }
    let tags = own_read_only_tags(ctx, volume)?;
    // In use, it is the volume's own use only while its publication binds it (a sixty-seventh
    // fresh review's F1: a read-only publication whose bind was gone, its record kept by a
    // refused unpublish, exempted its device mounted by an operator, and a writable one was
    // handed out beside that mount).
    let own = |v: &View| {
        let target = tags.get(&v.name);
        target.is_some()
            && v.read_only
            && v.lies_over == Some(devnum)
            && (v.in_use.is_none() || target.is_some_and(|t| binds(ctx, t, v.devnum)))
    };
    let mut idle = Vec::new();
    for view in views
        .into_iter()
        .filter(|v| !own(v) && !held.contains(&v.devnum))
    {
        // A view another agent made shows that agent's bytes, whatever name the device itself
        // reaches them by (a twenty-eighth fresh review's F2: a bind mount of another agent's
        // volume file gave it a path outside that agent's state directory and no second link).
        if ctx.agent_tag.made_by_another(&view.name) {
            return Err(Error::AnotherAgentsDevice {
                device: device.to_path_buf(),
                volume: volume.to_string(),
                level: std::path::PathBuf::from(format!("/dev/block/{}", view.devnum)),
                evidence: format!(
                    "a device showing the same bytes carries another agent's name {:?}",
                    view.name
                ),
            });
        }
        match view.in_use {
            Some(what) => return Err(refusal(volume, device, view.devnum, what)),
            None => idle.push(view),
        }
    }
    Ok(idle)
}

fn refusal(volume: &str, device: &Path, view: DevNum, what: String) -> Error {
    Error::BytesInUseElsewhere {
        volume: volume.to_string(),
        device: device.to_path_buf(),
        view,
        what,
    }
}

/// The tags of `volume`'s read-only devices, by its read-only raw block publications, each with
/// its publication's target.
fn own_read_only_tags(ctx: &NodeCtx, volume: &str) -> Result<HashMap<String, PathBuf>> {
    let mut tags = HashMap::new();
    for p in ctx.ledger.publications(volume)? {
        if p.block && p.readonly {
            tags.insert(
                ctx.agent_tag.tag(volume, &p.target_path),
                p.target_path.clone(),
            );
            let legacy = ctx.agent_tag.legacy_tag(volume, &p.target_path);
            tags.insert(legacy, p.target_path);
        }
    }
    Ok(tags)
}

/// Whether the mount at `target` is a bind of the device `view`.
fn binds(ctx: &NodeCtx, target: &Path, view: DevNum) -> bool {
    let Ok(Some(entry)) = super::path_handles::lookup_recorded(ctx, target) else {
        return false;
    };
    entry
        .mounted_at()
        .ok()
        .flatten()
        .is_some_and(|m| m.node.kind == crate::seam::FileKind::BlockDevice && m.node.rdev == view)
}
