//! The exact blank proof of a device backed by a file (a loop device): every byte of the device
//! that is not a hole in the file is read and must be zero. A sparse volume file that nobody
//! wrote has no extent at all, so the proof costs two lseeks; an extent that is allocated but
//! zero (fallocate, a zeroing) is read and accepted, up to [`EXTENT_READ_BUDGET`] bytes in all,
//! beyond which the device is not proven blank.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

use rustix::fs::SeekFrom;
use rustix::io::Errno;

use super::{Coverage, MIB, MIB_LEN, NonBlank, Proof, data_at, first_nonzero};

/// The most allocated bytes the proof reads before it gives up: a volume file that much of
/// which is allocated is not proven blank (punch its holes: `blkdiscard` the device, or
/// `fallocate --dig-holes` the file).
pub const EXTENT_READ_BUDGET: u64 = 256 * MIB;

use ebs_node_core::seam::BackingFile;

/// Proves the `size` bytes of `device` blank through its backing file.
pub fn prove_backing(device: &File, backing: &BackingFile, size: u64) -> io::Result<Proof> {
    prove_backing_past(device, backing, 0, size)
}

/// The same proof of the bytes from device offset `from` on.
pub fn prove_backing_past(
    device: &File,
    backing: &BackingFile,
    from: u64,
    size: u64,
) -> io::Result<Proof> {
    prove_extents_past(device, backing, from, size, EXTENT_READ_BUDGET)
}

#[cfg(test)]
pub(super) fn prove_extents(
    device: &File,
    backing: &BackingFile,
    size: u64,
    budget: u64,
) -> io::Result<Proof> {
    prove_extents_past(device, backing, 0, size, budget)
}

fn prove_extents_past(
    device: &File,
    backing: &BackingFile,
    from: u64,
    size: u64,
    budget: u64,
) -> io::Result<Proof> {
    // Writes made through the device may still sit in its page cache; fsync hands them to the
    // loop driver, which writes them into the file (where SEEK_DATA sees even delayed ones).
    device.sync_all()?;
    let file = &backing.file;
    let (first, end) = (backing.offset, backing.offset.saturating_add(size));
    let mut read = 0u64;
    let mut buf = vec![0u8; MIB_LEN];
    let mut pos = first.saturating_add(from).min(end);
    while pos < end {
        let data = match rustix::fs::seek(file, SeekFrom::Data(pos)) {
            Ok(d) => d,
            // No data past `pos`: the rest is a hole.
            Err(Errno::NXIO) => break,
            Err(e) => return Err(e.into()),
        };
        if data >= end {
            break;
        }
        let hole = rustix::fs::seek(file, SeekFrom::Hole(data))?.min(end);
        let mut at = data;
        while at < hole {
            let len = (hole - at).min(MIB);
            if read + len > budget {
                return Ok(Proof {
                    found: Some(over_budget(at - first, budget)),
                    coverage: Coverage::Allocated { read },
                });
            }
            let chunk = &mut buf[..len as usize];
            file.read_exact_at(chunk, at)?;
            read += len;
            if let Some(p) = first_nonzero(chunk) {
                return Ok(Proof {
                    found: Some(data_at(at - first + p as u64)),
                    coverage: Coverage::Allocated { read },
                });
            }
            at += len;
        }
        pos = hole;
    }
    Ok(Proof {
        found: None,
        coverage: Coverage::Allocated { read },
    })
}

fn over_budget(offset: u64, budget: u64) -> NonBlank {
    NonBlank {
        offset,
        what: format!(
            "more than {} MiB of the volume file is allocated (zeroes so far; the proof reads at \
             most that much), the rest from byte {offset} on unproven",
            budget / MIB
        ),
    }
}
