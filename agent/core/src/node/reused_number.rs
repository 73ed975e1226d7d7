//! A device number another volume's raw bind still binds. A bind of a device node opens nothing,
//! so when a raw-bound device is detached outside the agent (an operator's `losetup -d`; on EBS a
//! forced detach, then a new attachment), the kernel gives its number to the next device, and
//! every bind of the old node reads and writes the new device. The node then never takes that
//! device for another volume while the first volume's recorded bind (its raw block staging or a
//! block publication) still binds the number, as the host shows it now; the first volume's
//! unpublish and unstage take those binds down (`unpublish::take_down`).

use std::path::PathBuf;

use crate::DevNum;
use crate::records::{AccessRecord, DeviceIdentity, Publication, StagedVolume};
use crate::seam::FileKind;

use super::{NodeCtx, path_handles};
use crate::error::Result;
use crate::request::VolumeId;

/// Other volumes' records, read once per first take: the reused-number check here and the
/// stacking check (`stacking`) both ask them. A record that does not decode is its own volume's
/// trouble (marked for attention at start-up), never another volume's stage: it is passed over.
pub struct Recorded {
    pub id: String,
    pub staged: Option<StagedVolume>,
    pub publications: Vec<Publication>,
}

/// Every volume's records but `volume`'s.
pub fn others(ctx: &NodeCtx, volume: &VolumeId) -> Result<Vec<Recorded>> {
    let mut out = Vec::new();
    for id in ctx.ledger.recorded_volume_ids()? {
        if id == volume.as_str() {
            continue;
        }
        let Ok(staged) = ctx.ledger.staged(&id) else {
            continue;
        };
        let publications = ctx.ledger.publications(&id).unwrap_or_default();
        out.push(Recorded {
            id,
            staged,
            publications,
        });
    }
    Ok(out)
}

/// The other volume, and the recorded place, whose bind binds `devnum` while the device there
/// is no longer that volume's (its record names another identity). Only a first take asks (a
/// volume holding the device already is not asked again), so a stage pays one read of each
/// recorded volume once.
pub fn bound_by_another(
    ctx: &NodeCtx,
    others: &[Recorded],
    identity: &DeviceIdentity,
    devnum: DevNum,
) -> Option<(String, PathBuf)> {
    for other in others {
        let staged = &other.staged;
        // The same device is the claims' question; this is about a number reused under a bind.
        let same_number = staged
            .as_ref()
            .is_some_and(|s| s.devnum.map(DevNum::from) == Some(devnum) && s.identity != *identity);
        let mut places = Vec::new();
        if same_number
            && let Some(s) = staged
            && matches!(s.access, AccessRecord::Block)
            && !s.staging_path.as_os_str().is_empty()
        {
            places.push(s.staging_path.clone());
        }
        // A read-only block publication binds the agent's read-only device, whose number is
        // none of the staged record's: asked whatever the record's number.
        places.extend(
            other
                .publications
                .iter()
                .filter(|p| p.block && (same_number || p.readonly))
                .map(|p| p.target_path.clone()),
        );
        for place in places {
            if binds(ctx, &place, devnum) {
                return Some((other.id.clone(), place));
            }
        }
    }
    None
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
