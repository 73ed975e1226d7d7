//! Growing a filesystem to its device: offline before mount for ext (resize2fs needs no
//! CAP_SYS_RESOURCE on an unmounted filesystem, and nothing uses it yet), online for xfs (it grows
//! only mounted) and for NodeExpandVolume.

use std::path::Path;

use crate::records::Durability;

use super::NodeCtx;
use super::host::OpenEntry;
use super::journal::{Journal, detail};
use super::path_string;
use crate::error::{Error, Result};
use crate::request::FsType;
use crate::steps::Step;

/// Slack below which a device is not "larger": mkfs rounds the filesystem down to whole blocks.
const GROW_SLACK: u64 = 1 << 20;

/// Grows the filesystem when the device is larger (a snapshot restored into a bigger volume, or
/// an expansion that happened while the volume was not staged). The mount is taken as its root
/// held open (`root`), never as a path string: the size is asked of, and xfs_growfs pointed at,
/// exactly the mount the caller proved to be the volume's.
pub fn grow_if_needed(
    ctx: &NodeCtx,
    journal: &Journal<'_>,
    fs: FsType,
    device: &Path,
    root: &dyn OpenEntry,
) -> Result<bool> {
    let mount_point = root.path_for_tools();
    let mount_point = mount_point.as_path();
    let fs_bytes = ctx
        .host
        .mounted_fs_bytes(fs, device, mount_point)
        .map_err(|e| Error::io(format!("sizing the filesystem on {}", device.display()), e))?;
    grow_when_larger(ctx, journal, device, fs_bytes, true, || {
        Ok(ctx.host.grow(fs, device, mount_point)?)
    })
}

/// Grows an unmounted ext filesystem whose device is larger. resize2fs insists on a fresh forced
/// check first, which the step runs. `known_bytes` is the filesystem's size if the probe read it.
pub fn grow_offline_if_needed(
    ctx: &NodeCtx,
    journal: &Journal<'_>,
    fs: FsType,
    device: &Path,
    known_bytes: Option<u64>,
) -> Result<bool> {
    if !fs.is_ext() {
        return Ok(false);
    }
    let fs_bytes = match known_bytes {
        Some(b) => b,
        None => ctx
            .host
            .fs_bytes(fs, device)
            .map_err(|e| Error::io(format!("reading the superblock of {}", device.display()), e))?,
    };
    grow_when_larger(ctx, journal, device, fs_bytes, false, || {
        Ok(ctx.host.grow_offline(fs, device)?)
    })
}

/// Runs `grow` as a journaled step when the device is larger than the filesystem.
fn grow_when_larger(
    ctx: &NodeCtx,
    journal: &Journal<'_>,
    device: &Path,
    fs_bytes: u64,
    mounted: bool,
    grow: impl FnOnce() -> Result<()>,
) -> Result<bool> {
    let dev_bytes = ctx
        .host
        .device_bytes(device)
        .map_err(|e| Error::io(format!("sizing {}", device.display()), e))?;
    if dev_bytes <= fs_bytes + GROW_SLACK {
        return Ok(false);
    }
    journal.step(
        Step::Grow,
        detail([
            ("device", path_string(device)),
            ("from_bytes", fs_bytes.to_string()),
            ("to_bytes", dev_bytes.to_string()),
            ("mounted", mounted.to_string()),
        ]),
        Durability::Lazy,
        grow,
    )?;
    Ok(true)
}
