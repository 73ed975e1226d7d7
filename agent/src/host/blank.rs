//! "Provably blank" check run before any mkfs.
//!
//! libblkid only recognises intact signatures: an ext4 whose primary
//! superblock was damaged probes as nothing, yet still holds user data and
//! backup superblocks that e2fsck could recover. Formatting such a device
//! would destroy that data, so we additionally require that the regions where
//! metadata lives are all zeroes.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

const MIB: u64 = 1 << 20;
const WINDOW: u64 = 4096;

/// Byte offsets of the block group 1 backup superblock for ext2/3/4 with
/// 1 KiB, 2 KiB and 4 KiB blocks (default blocks-per-group = 8 * block size).
const EXT_BACKUP_SUPERBLOCKS: [u64; 3] = [8193 * 1024, 16384 * 2048, 32768 * 4096];

/// Returns the lowest offset of a non-zero byte within the checked regions
/// (first MiB, last MiB, ext backup superblock windows), or None when every
/// checked byte is zero. `size` is the device size in bytes; regions beyond it
/// are skipped. Reads at most ~2 MiB + 12 KiB.
pub fn first_nonzero_region(device: &Path, size: u64) -> io::Result<Option<u64>> {
    let file = File::open(device)?;
    let mut buf = vec![0u8; MIB as usize];
    for (start, len) in regions(size) {
        let chunk = &mut buf[..len as usize];
        file.read_exact_at(chunk, start)?;
        if let Some(pos) = first_nonzero(chunk) {
            return Ok(Some(start + pos as u64));
        }
    }
    Ok(None)
}

/// Whether the device carries a superblock (even one libblkid rejects: a checksum not yet
/// written by an interrupted mkfs) with exactly this UUID: ext's at byte 1024, xfs's at 0.
pub fn carries_uuid(device: &Path, uuid: &str) -> io::Result<bool> {
    let Some(want) = parse_uuid(uuid) else {
        return Ok(false);
    };
    let file = File::open(device)?;
    let mut sb = [0u8; 1024];
    file.read_exact_at(&mut sb, 1024)?;
    if sb[0x38..0x3a] == [0x53, 0xef] && sb[0x68..0x78] == want {
        return Ok(true);
    }
    let mut xfs = [0u8; 64];
    file.read_exact_at(&mut xfs, 0)?;
    Ok(&xfs[0..4] == b"XFSB" && xfs[32..48] == want)
}

fn parse_uuid(uuid: &str) -> Option<[u8; 16]> {
    let hex: Vec<u8> = uuid.bytes().filter(|&b| b != b'-').collect();
    if hex.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, pair) in hex.chunks(2).enumerate() {
        out[i] = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    Some(out)
}

/// Sorted, non-overlapping (start, len) regions to check, each <= 1 MiB.
fn regions(size: u64) -> Vec<(u64, u64)> {
    // Collected as [start, end) pairs first; converted to lengths at the end.
    let mut wanted = vec![(0, size.min(MIB)), (size.saturating_sub(MIB), size)];
    for off in EXT_BACKUP_SUPERBLOCKS {
        if off < size {
            wanted.push((off, (off + WINDOW).min(size)));
        }
    }
    // Merge overlaps so no byte is read twice and hits come out in ascending
    // offset order.
    wanted.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(wanted.len());
    for (start, end) in wanted {
        if start >= end {
            continue;
        }
        match merged.last_mut() {
            Some(last) if start <= last.1 => last.1 = last.1.max(end),
            _ => merged.push((start, end)),
        }
    }
    // Merging can produce spans over 1 MiB on small devices; split them so the
    // single buffer suffices.
    let mut out = Vec::new();
    for (mut start, end) in merged {
        while start < end {
            let len = (end - start).min(MIB);
            out.push((start, len));
            start += len;
        }
    }
    out
}

fn first_nonzero(buf: &[u8]) -> Option<usize> {
    // OR-folding fixed-size chunks vectorises well; only a hit chunk is
    // scanned bytewise.
    const CHUNK: usize = 512;
    buf.chunks(CHUNK)
        .enumerate()
        .find(|(_, c)| c.iter().fold(0u8, |acc, &b| acc | b) != 0)
        .and_then(|(i, c)| c.iter().position(|&b| b != 0).map(|p| i * CHUNK + p))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::path::PathBuf;
    use std::process::Command;

    struct Tmp(PathBuf);
    impl Tmp {
        fn new(tag: &str, size: u64) -> Tmp {
            let p = std::env::temp_dir().join(format!("blanktest-{tag}-{}", std::process::id()));
            File::create(&p).unwrap().set_len(size).unwrap();
            Tmp(p)
        }
        fn poke(&self, off: u64, bytes: &[u8]) {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(&self.0)
                .unwrap();
            f.write_all_at(bytes, off).unwrap();
        }
    }
    impl Drop for Tmp {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    #[test]
    fn a_superblock_carrying_the_uuid_is_recognised() {
        let uuid = "01234567-89ab-cdef-0123-456789abcdef";
        let bytes: Vec<u8> = (0..16u8)
            .map(|i| [0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef][i as usize % 8])
            .collect();
        let ext = Tmp::new("uuid-ext", MIB);
        assert!(!carries_uuid(&ext.0, uuid).unwrap());
        ext.poke(1024 + 0x38, &[0x53, 0xef]);
        ext.poke(1024 + 0x68, &bytes);
        assert!(carries_uuid(&ext.0, uuid).unwrap());
        assert!(!carries_uuid(&ext.0, "ffffffff-89ab-cdef-0123-456789abcdef").unwrap());
        let xfs = Tmp::new("uuid-xfs", MIB);
        xfs.poke(0, b"XFSB");
        xfs.poke(32, &bytes);
        assert!(carries_uuid(&xfs.0, uuid).unwrap());
        assert!(!carries_uuid(&xfs.0, "not-a-uuid").unwrap());
    }

    #[test]
    fn sparse_file_is_blank() {
        let t = Tmp::new("sparse", 256 * MIB);
        assert_eq!(first_nonzero_region(&t.0, 256 * MIB).unwrap(), None);
    }

    #[test]
    fn finds_data_in_each_region() {
        let size = 256 * MIB;
        for off in [
            0,
            4095,
            MIB - 1,
            size - MIB,
            size - 1,
            8193 * 1024 + 100,
            16384 * 2048,
            32768 * 4096 + 4095,
        ] {
            let t = Tmp::new(&format!("at{off}"), size);
            t.poke(off, &[0x53]);
            assert_eq!(
                first_nonzero_region(&t.0, size).unwrap(),
                Some(off),
                "offset {off}"
            );
        }
    }

    #[test]
    fn ignores_data_outside_checked_regions() {
        let size = 256 * MIB;
        let t = Tmp::new("outside", size);
        t.poke(MIB, b"x");
        t.poke(64 * MIB, b"x");
        t.poke(32768 * 4096 + 4096, b"x");
        assert_eq!(first_nonzero_region(&t.0, size).unwrap(), None);
    }

    #[test]
    fn reports_lowest_offset() {
        let size = 64 * MIB;
        let t = Tmp::new("lowest", size);
        t.poke(size - 10, b"z");
        t.poke(8193 * 1024 + 7, b"y");
        assert_eq!(
            first_nonzero_region(&t.0, size).unwrap(),
            Some(8193 * 1024 + 7)
        );
    }

    #[test]
    fn tiny_and_empty_devices() {
        let t = Tmp::new("tiny", 3000);
        assert_eq!(first_nonzero_region(&t.0, 3000).unwrap(), None);
        t.poke(2999, b"!");
        assert_eq!(first_nonzero_region(&t.0, 3000).unwrap(), Some(2999));
        let e = Tmp::new("empty", 0);
        assert_eq!(first_nonzero_region(&e.0, 0).unwrap(), None);
    }

    #[test]
    fn regions_are_sorted_disjoint_and_bounded() {
        for size in [
            0,
            1,
            4096,
            MIB,
            MIB + 1,
            2 * MIB,
            3 * MIB / 2,
            9 * MIB,
            33 * MIB,
            128 * MIB + 2048,
            10 << 30,
        ] {
            let r = regions(size);
            let total: u64 = r.iter().map(|(_, l)| l).sum();
            assert!(total <= 2 * MIB + 3 * WINDOW, "size {size}");
            for w in r.windows(2) {
                assert!(w[0].0 + w[0].1 <= w[1].0, "size {size}: {r:?}");
            }
            assert!(r.iter().all(|&(s, l)| l > 0 && l <= MIB && s + l <= size));
        }
        assert_eq!(regions(2 * MIB), vec![(0, MIB), (MIB, MIB)]);
    }

    #[test]
    fn size_beyond_device_is_an_error() {
        let t = Tmp::new("short", MIB);
        assert!(first_nonzero_region(&t.0, 4 * MIB).is_err());
    }

    #[test]
    fn corrupted_ext4_is_found_via_backup_superblock() {
        // Wipe the whole first MiB (primary superblock included): libblkid
        // sees nothing, but the block group 1 backup must still be spotted.
        for (block, size, backup) in [
            (1024, 64 * MIB, 8193 * 1024),
            (2048, 128 * MIB, 16384 * 2048),
            (4096, 256 * MIB, 32768 * 4096),
        ] {
            let t = Tmp::new(&format!("ext4-{block}"), size);
            let ok = Command::new("mkfs.ext4")
                .args(["-q", "-F", "-b", &block.to_string()])
                .arg(&t.0)
                .status();
            if !matches!(ok, Ok(s) if s.success()) {
                let test = "corrupted_ext4_is_found_via_backup_superblock";
                assert_ne!(
                    std::env::var("CI").as_deref(),
                    Ok("true"),
                    "{test}: no mkfs.ext4"
                );
                crate::host::loopdev::test_support::skip(test, "no mkfs.ext4");
                return;
            }
            let mut f = std::fs::OpenOptions::new().write(true).open(&t.0).unwrap();
            f.write_all(&vec![0u8; MIB as usize]).unwrap();
            let hit = first_nonzero_region(&t.0, size).unwrap().unwrap();
            assert!(
                (backup..backup + WINDOW).contains(&hit),
                "block size {block}: {hit}"
            );
        }
    }
}
