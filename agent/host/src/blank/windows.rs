//! The blank proof of a block device with no backing file (EBS, any disk): a bounded sample whose
//! coverage is stated. It reads the first and last MiB (every partition table, LVM, LUKS, md,
//! swap and filesystem signature starts there), the known superblock offsets (ext's backup
//! superblocks, xfs's allocation-group headers of its default geometry) and `SPREAD_WINDOWS`
//! windows of `SPREAD_WINDOW` (the core's `blank`) bytes spread evenly over the device: about 18 MiB whatever the
//! device's size. Any data run at least one spacing long (device size / 256, plus 64 KiB) is
//! always seen; a shorter one only if it touches a window.
//!
//! Reads go around the page cache (O_DIRECT, through the held device): what the device holds
//! now, not what an earlier read of it left in memory (another host of a multi-attach volume
//! may have written since).

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use super::{Coverage, MIB, MIB_LEN, Proof, data_at, first_nonzero};
use crate::direct_read::{AlignedBuf, open_direct, read_exact_direct};
use ebs_node_core::blank::{SPREAD_WINDOW, SPREAD_WINDOWS};

/// A superblock-sized window at a known offset.
const SB_WINDOW: u64 = 4096;
const ALIGN: u64 = 4096;

/// Byte offsets of the block group 1 backup superblock for ext2/3/4 with
/// 1 KiB, 2 KiB and 4 KiB blocks (default blocks-per-group = 8 * block size).
const EXT_BACKUP_SUPERBLOCKS: [u64; 3] = [8193 * 1024, 16384 * 2048, 32768 * 4096];
/// A block group with 4 KiB blocks (mkfs's default): 32768 blocks.
const EXT_GROUP_4K: u64 = 32768 * 4096;

/// Reads every window of [`layout`] and reports the first non-zero byte.
pub fn prove_windows(device: &File, size: u64) -> io::Result<Proof> {
    prove_windows_past(device, 0, size)
}

/// The same proof of the windows' bytes from device offset `from` on.
pub fn prove_windows_past(device: &File, from: u64, size: u64) -> io::Result<Proof> {
    let layout: Vec<(u64, u64)> = layout(size)
        .into_iter()
        .filter(|(start, len)| start + len > from)
        .map(|(start, len)| {
            let skip = from.saturating_sub(start);
            (start + skip, len - skip)
        })
        .collect();
    let read = layout.iter().map(|(_, len)| len).sum();
    let coverage = Coverage::Windows {
        windows: layout.len(),
        read,
    };
    // The held device reopened for O_DIRECT; a file that refuses it (tmpfs, in tests) is read
    // through the held fd, whose page cache is coherent with every write made through it.
    let proc = PathBuf::from(format!("/proc/self/fd/{}", device.as_raw_fd()));
    let mut direct = open_direct(&proc).ok();
    let mut buf = AlignedBuf::new(MIB_LEN)?;
    for (start, len) in layout {
        // Every window is at most a MiB long (`layout`).
        let len_in_buf = usize::try_from(len).map_err(io::Error::other)?;
        let chunk = &mut buf.as_mut_slice()[..len_in_buf];
        let aligned = start % ALIGN == 0 && len % ALIGN == 0;
        match direct.as_ref().filter(|_| aligned) {
            Some(d) => match read_exact_direct(d, chunk, start) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    direct = None;
                    device.read_exact_at(chunk, start)?;
                }
                Err(e) => return Err(e),
            },
            None => device.read_exact_at(chunk, start)?,
        }
        if let Some(pos) = first_nonzero(chunk) {
            return Ok(Proof {
                found: Some(data_at(start + pos as u64)),
                coverage,
            });
        }
    }
    Ok(Proof {
        found: None,
        coverage,
    })
}

/// Sorted, non-overlapping (start, len) windows to read, each at most 1 MiB, aligned to 4 KiB
/// except where the device ends.
pub fn layout(size: u64) -> Vec<(u64, u64)> {
    let mut wanted = vec![(0, MIB), (size.saturating_sub(MIB), MIB)];
    for off in EXT_BACKUP_SUPERBLOCKS {
        wanted.push((off, SB_WINDOW));
    }
    // ext's sparse_super backups (groups 3^k, 5^k, 7^k) with 4 KiB blocks.
    for base in [3u64, 5, 7] {
        let mut group = base;
        while group.saturating_mul(EXT_GROUP_4K) < size {
            wanted.push((group * EXT_GROUP_4K, SB_WINDOW));
            group = group.saturating_mul(base);
        }
    }
    // xfs's secondary superblocks with its default 4 allocation groups of 4 KiB blocks.
    let ag = (size / 4096).div_ceil(4) * 4096;
    for k in 1..4 {
        wanted.push((k * ag, SB_WINDOW));
    }
    for i in 1..SPREAD_WINDOWS {
        // i < SPREAD_WINDOWS: the quotient is below size, so it fits.
        let at = u128::from(size) * u128::from(i) / u128::from(SPREAD_WINDOWS);
        let at = u64::try_from(at).unwrap_or(size);
        wanted.push((at, SPREAD_WINDOW));
    }
    merged(wanted, size)
}

/// Aligns (start, len) windows out to 4 KiB, clips them to the device, merges overlaps (no byte
/// is read twice, and hits come out in ascending order) and splits spans over 1 MiB.
fn merged(wanted: Vec<(u64, u64)>, size: u64) -> Vec<(u64, u64)> {
    let mut spans: Vec<(u64, u64)> = wanted
        .into_iter()
        .map(|(start, len)| {
            let end = start
                .saturating_add(len)
                .div_ceil(ALIGN)
                .saturating_mul(ALIGN);
            (start - start % ALIGN, end.min(size))
        })
        .filter(|(start, end)| start < end)
        .collect();
    spans.sort_unstable();
    let mut joined: Vec<(u64, u64)> = Vec::with_capacity(spans.len());
    for (start, end) in spans {
        match joined.last_mut() {
            Some(last) if start <= last.1 => last.1 = last.1.max(end),
            _ => joined.push((start, end)),
        }
    }
    let mut out = Vec::new();
    for (mut start, end) in joined {
        while start < end {
            let len = (end - start).min(MIB);
            out.push((start, len));
            start += len;
        }
    }
    out
}
