//! The size a loop volume grows to on ControllerExpandVolume.

use std::os::unix::fs::MetadataExt;

use ebs_node_core::error::{CapacityError, Error, Result};
use ebs_node_core::records::Durability;
use ebs_node_host::loopdev;

const MIB: u64 = 1 << 20;
/// Loop devices size in 512-byte sectors; a file of another length would lose its tail.
const SECTOR: u64 = 512;

/// The new size for a volume of `current` bytes, or the current size when it already satisfies
/// the range (a retried expansion is a no-op). Volumes never shrink: a range the current size
/// exceeds is OUT_OF_RANGE, as is one that no sector-aligned size fits. 0 means "not set".
pub fn expansion_size(required: u64, limit: u64, current: u64) -> Result<u64> {
    if limit != 0 && required > limit {
        return Err(CapacityError::RequiredOverLimit { required, limit }.into());
    }
    if required <= current {
        if limit != 0 && current > limit {
            return Err(CapacityError::WouldShrink { current, limit }.into());
        }
        return Ok(current);
    }
    // A file's length is a signed 64-bit number (a twentieth fresh review's F5: INTERNAL), and
    // rounding up must not wrap.
    if required > (i64::MAX.cast_unsigned() / MIB) * MIB {
        return Err(CapacityError::BeyondFileSize { required }.into());
    }
    // Whole MiB, like CreateVolume, unless the limit forbids it; then whole sectors.
    let mib = required.div_ceil(MIB) * MIB;
    let size = if limit == 0 || mib <= limit {
        mib
    } else {
        required.div_ceil(SECTOR) * SECTOR
    };
    if limit != 0 && size > limit {
        return Err(CapacityError::NoAlignedSize {
            required,
            limit,
            sector: SECTOR,
        }
        .into());
    }
    Ok(size)
}

impl super::LoopController {
    /// Grows a volume file; returns the new size. Shrinking is never done.
    pub fn expand(&self, id: &str, required: u64, limit: u64) -> Result<u64> {
        let _guard = self.lock();
        let mut volume = self
            .store
            .loop_volume(id)?
            .ok_or_else(|| Error::VolumeNotFound(id.into()))?;
        self.refuse_if_making(id)?;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&volume.file)
            .map_err(|e| Error::io(format!("opening {}", volume.file.display()), e))?;
        // The file's own length, not only the record's: an expansion killed between growing the
        // file and its record left the file longer, and a smaller retry read as growth shrank it
        // under a mounted filesystem (a twenty-first fresh review's F1). Never shrunk.
        let real = f
            .metadata()
            .map_err(|e| Error::io(format!("sizing {}", volume.file.display()), e))?
            .len();
        let current = volume.capacity_bytes.max(real);
        let wanted = super::resize::expansion_size(required, limit, current)?;
        if wanted > real {
            f.set_len(wanted).map_err(|e| {
                let op = format!("growing {} to {wanted} bytes", volume.file.display());
                match e.raw_os_error() {
                    // Beyond the largest file the volume directory's filesystem holds (a
                    // twenty-sixth fresh review's low: it was INTERNAL, CreateVolume's
                    // OUT_OF_RANGE).
                    Some(libc::EFBIG) | Some(libc::EINVAL) => {
                        ebs_node_core::error::CapacityError::FileTooLarge { op, source: e }.into()
                    }
                    Some(libc::ENOSPC) | Some(libc::EDQUOT) => {
                        ebs_node_core::error::ControllerError::NoSpace { op, source: e }.into()
                    }
                    _ => Error::io(op, e),
                }
            })?;
        }
        if wanted != volume.capacity_bytes {
            volume.capacity_bytes = wanted;
            self.store
                .write(Durability::Immediate, |w| w.put_loop_volume(&volume))?;
        }
        // An attached EBS volume shows its new size to the instance by itself; the loop device
        // does so once told. Best effort: NodeExpandVolume refreshes again before growing.
        if let Some(att) = &volume.attachment
            && let Ok(meta) = std::fs::metadata(&volume.file)
            && loopdev::backing_inode(&att.device).ok().flatten() == Some((meta.dev(), meta.ino()))
            && let Err(e) = loopdev::set_capacity(&att.device)
        {
            tracing::warn!(volume = id, device = %att.device.display(), error = %e,
                "could not refresh the attached device's size");
        }
        Ok(volume.capacity_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn out_of_range(r: Result<u64>) -> bool {
        matches!(r, Err(Error::Capacity(_)))
    }

    #[test]
    fn grows_to_whole_mib_within_the_limit() {
        assert_eq!(expansion_size(3 * MIB + 1, 0, MIB).unwrap(), 4 * MIB);
        assert_eq!(expansion_size(3 * MIB + 1, 4 * MIB, MIB).unwrap(), 4 * MIB);
        assert_eq!(
            expansion_size(3 * MIB + 1, 3 * MIB + 512, MIB).unwrap(),
            3 * MIB + 512
        );
        assert!(out_of_range(expansion_size(
            3 * MIB + 1,
            3 * MIB + 100,
            MIB
        )));
    }

    #[test]
    fn retries_and_shrinks() {
        assert_eq!(expansion_size(2 * MIB, 0, 4 * MIB).unwrap(), 4 * MIB);
        assert_eq!(expansion_size(0, 8 * MIB, 4 * MIB).unwrap(), 4 * MIB);
        assert!(out_of_range(expansion_size(MIB, 2 * MIB, 4 * MIB)));
        assert!(out_of_range(expansion_size(5 * MIB, 4 * MIB, MIB)));
        assert!(out_of_range(expansion_size(
            i64::MAX.cast_unsigned(),
            0,
            MIB
        )));
        assert!(out_of_range(expansion_size(u64::MAX - 1, 0, MIB)));
    }
}
