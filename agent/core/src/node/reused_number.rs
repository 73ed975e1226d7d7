//! A device number another volume's raw bind still binds. A bind of a device node opens nothing,
//! so when a raw-bound device is detached outside the agent (an operator's `losetup -d`; on EBS a
//! forced detach, then a new attachment), the kernel gives its number to the next device, and
//! every bind of the old node reads and writes the new device. The node then never takes that
//! device for another volume while the first volume's recorded bind (its raw block staging or a
//! block publication) still binds the number, as the host shows it now; the first volume's
//! unpublish and unstage take those binds down (`unpublish::take_down`).

use std::path::PathBuf;

use crate::DevNum;
use crate::records::{AccessRecord, DeviceIdentity};
use crate::seam::FileKind;

use super::{NodeCtx, path_handles};
use crate::error::Result;
use crate::request::VolumeId;

/// The other volume, and the recorded place, whose bind binds `devnum` while the device there
/// is no longer that volume's (its record names another identity). Only a first take asks (a
/// volume holding the device already is not asked again), so a stage pays one read of each
/// recorded volume once.
pub fn bound_by_another(
    ctx: &NodeCtx,
    volume: &VolumeId,
    identity: &DeviceIdentity,
    devnum: DevNum,
) -> Result<Option<(String, PathBuf)>> {
    for id in ctx.ledger.recorded_volume_ids()? {
        if id == volume.as_str() {
            continue;
        }
        // A record that does not decode is its own volume's trouble (marked for attention at
        // start-up), never another volume's stage: it is passed over here.
        let Ok(staged) = ctx.ledger.staged(&id) else {
            continue;
        };
        // The same device is the claims' question; this is about a number reused under a bind.
        let same_number = staged
            .as_ref()
            .is_some_and(|s| s.devnum.map(DevNum::from) == Some(devnum) && s.identity != *identity);
        let mut places = Vec::new();
        if same_number
            && let Some(s) = &staged
            && matches!(s.access, AccessRecord::Block)
            && !s.staging_path.as_os_str().is_empty()
        {
            places.push(s.staging_path.clone());
        }
        // A read-only block publication binds the agent's read-only device, whose number is
        // none of the staged record's: asked whatever the record's number.
        places.extend(
            ctx.ledger
                .publications(&id)
                .unwrap_or_default()
                .into_iter()
                .filter(|p| p.block && (same_number || p.readonly))
                .map(|p| p.target_path),
        );
        for place in places {
            if binds(ctx, &place, devnum) {
                return Ok(Some((id, place)));
            }
        }
    }
    Ok(None)
}

/// Whether the host shows, at `place`, a bind of a node with these numbers. A place that
/// cannot be examined counts as binding them: the take is refused, never guessed.
fn binds(ctx: &NodeCtx, place: &std::path::Path, devnum: DevNum) -> bool {
    let entry = match path_handles::lookup_recorded(ctx, place) {
        Ok(Some(entry)) => entry,
        Ok(None) => return false,
        Err(_) => return true,
    };
    match entry.mounted_at() {
        Ok(Some(f)) => f.node.kind == FileKind::BlockDevice && f.node.rdev == devnum,
        Ok(None) => false,
        Err(_) => true,
    }
}
