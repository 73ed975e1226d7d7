use super::extents::prove_extents;
use super::windows::layout;
use super::*;
use crate::loopdev::test_support::{Loop, TempFile, root_or_skip};
use ebs_node_core::blank::{SPREAD_WINDOW, SPREAD_WINDOWS};
use ebs_node_core::seam::BackingFile;
use std::io::Write;
use std::process::Command;

const WINDOW: u64 = 4096;

fn poke(file: &TempFile, off: u64, bytes: &[u8]) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(&file.0)
        .unwrap()
        .write_all_at(bytes, off)
        .unwrap();
}

fn open(file: &TempFile) -> File {
    File::open(&file.0).unwrap()
}

/// The window proof of a file (read buffered where O_DIRECT is refused).
fn windows_hit(file: &TempFile, size: u64) -> Option<u64> {
    prove_windows(&open(file), size)
        .unwrap()
        .found
        .map(|f| f.offset)
}

/// The extent proof of a file as its own backing file.
fn extents_hit(file: &TempFile, size: u64, budget: u64) -> Option<NonBlank> {
    let backing = BackingFile {
        file: open(file),
        offset: 0,
    };
    prove_extents(&open(file), &backing, size, budget)
        .unwrap()
        .found
}

#[test]
fn a_superblock_carrying_the_uuid_is_recognised() {
    let uuid = "01234567-89ab-cdef-0123-456789abcdef";
    let bytes: Vec<u8> = (0..16u8)
        .map(|i| [0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef][i as usize % 8])
        .collect();
    let ext = TempFile::sparse("uuid-ext", MIB);
    assert!(!carries_uuid(&open(&ext), uuid).unwrap());
    poke(&ext, 1024 + 0x38, &[0x53, 0xef]);
    poke(&ext, 1024 + 0x68, &bytes);
    assert!(carries_uuid(&open(&ext), uuid).unwrap());
    assert!(!carries_uuid(&open(&ext), "ffffffff-89ab-cdef-0123-456789abcdef").unwrap());
    let xfs = TempFile::sparse("uuid-xfs", MIB);
    poke(&xfs, 0, b"XFSB");
    poke(&xfs, 32, &bytes);
    assert!(carries_uuid(&open(&xfs), uuid).unwrap());
    assert!(!carries_uuid(&open(&xfs), "not-a-uuid").unwrap());
    // Mounted since: not mkfs's own work, whatever the UUID.
    poke(&ext, 1024 + 0x34, &[1, 0]);
    assert!(
        !carries_uuid(&open(&ext), uuid).unwrap(),
        "an ext mount count"
    );
    poke(&ext, 1024 + 0x34, &[0, 0]);
    poke(&ext, 1024 + 0x2c, &[0x10, 0x20, 0x30, 0x40]);
    assert!(
        !carries_uuid(&open(&ext), uuid).unwrap(),
        "an ext mount time"
    );
    poke(&xfs, 240, &[0, 0, 0, 1, 0, 0, 0, 2]);
    assert!(!carries_uuid(&open(&xfs), uuid).unwrap(), "an xfs LSN");
}

#[test]
fn sparse_file_is_blank_to_both_proofs() {
    let t = TempFile::sparse("sparse", 256 * MIB);
    assert_eq!(windows_hit(&t, 256 * MIB), None);
    assert_eq!(extents_hit(&t, 256 * MIB, EXTENT_READ_BUDGET), None);
}

#[test]
fn windows_find_data_in_each_fixed_region() {
    let size = 512 * MIB;
    for off in [
        0,
        4095,
        MIB - 1,
        size - MIB,
        size - 1,
        8193 * 1024 + 100,
        16384 * 2048,
        32768 * 4096 + 4095,
        3 * 32768 * 4096 + 10,
        size / 2,
    ] {
        let t = TempFile::sparse(&format!("at{off}"), size);
        poke(&t, off, &[0x53]);
        assert_eq!(windows_hit(&t, size), Some(off), "offset {off}");
    }
}

#[test]
fn windows_see_a_run_one_spacing_long_anywhere() {
    let size = 600 * MIB;
    let spacing = size / SPREAD_WINDOWS + SPREAD_WINDOW;
    for start in [MIB + 1, 300 * MIB, 331 * MIB + 4096, size - MIB - spacing] {
        let t = TempFile::sparse(&format!("run{start}"), size);
        poke(&t, start, &vec![0xaa; usize::try_from(spacing).unwrap()]);
        let hit = windows_hit(&t, size).expect("seen");
        assert!((start..start + spacing).contains(&hit), "{start}: {hit}");
    }
}

#[test]
fn windows_are_sorted_disjoint_aligned_and_bounded() {
    for size in [
        0,
        1,
        3000,
        4096,
        MIB,
        MIB + 1,
        2 * MIB,
        3 * MIB / 2,
        9 * MIB,
        33 * MIB,
        128 * MIB + 2048,
        600 * MIB,
        10 << 30,
        1 << 40,
        16 << 40,
    ] {
        let r = layout(size);
        let total: u64 = r.iter().map(|(_, l)| l).sum();
        // Ends, spread windows, and fewer than 64 known offsets of two aligned blocks each.
        let bound = 2 * MIB + (SPREAD_WINDOWS - 1) * (SPREAD_WINDOW + 4096) + 64 * 2 * WINDOW;
        assert!(total <= bound.min(size), "size {size}: {total}");
        for w in r.windows(2) {
            assert!(w[0].0 + w[0].1 <= w[1].0, "size {size}: {r:?}");
        }
        assert!(r.iter().all(|&(s, l)| l > 0 && l <= MIB && s + l <= size));
        assert!(
            r.iter()
                .all(|&(s, l)| s % 4096 == 0 && (l % 4096 == 0 || s + l == size))
        );
    }
    assert_eq!(layout(2 * MIB), vec![(0, MIB), (MIB, MIB)]);
}

#[test]
fn extents_find_any_written_byte_and_accept_zeroed_extents() {
    let size = 600 * MIB;
    let t = TempFile::sparse("extents", size);
    // Allocated but zero: written zeroes and a fallocated range.
    poke(&t, 100 * MIB, &vec![0; 4 * MIB_LEN]);
    let f = std::fs::OpenOptions::new().write(true).open(&t.0).unwrap();
    nix::fcntl::fallocate(
        &f,
        nix::fcntl::FallocateFlags::FALLOC_FL_KEEP_SIZE,
        200 << 20,
        1 << 20,
    )
    .unwrap();
    assert_eq!(extents_hit(&t, size, EXTENT_READ_BUDGET), None);
    // One byte anywhere, also between every window.
    let off = 331 * MIB + 4096 + 17;
    poke(&t, off, b"x");
    let hit = extents_hit(&t, size, EXTENT_READ_BUDGET).unwrap();
    assert_eq!(hit.offset, off, "{hit:?}");
    assert_eq!(
        windows_hit(&t, size),
        None,
        "the sample misses it: why loop is exact"
    );
}

#[test]
fn extents_beyond_the_budget_are_not_proven_blank() {
    let t = TempFile::sparse("budget", 64 * MIB);
    poke(&t, 8 * MIB, &vec![0; 3 * MIB_LEN]);
    assert_eq!(extents_hit(&t, 64 * MIB, 4 * MIB), None);
    poke(&t, 20 * MIB, &vec![0; 2 * MIB_LEN]);
    let over = extents_hit(&t, 64 * MIB, 4 * MIB).expect("over budget");
    assert_eq!(over.offset, 21 * MIB, "{over:?}");
    assert!(over.what.contains("4 MiB"), "{}", over.what);
}

#[test]
fn extents_count_from_the_loop_offset_and_stop_at_the_device_end() {
    let t = TempFile::sparse("offset", 16 * MIB);
    poke(&t, MIB - 1, b"before the device");
    poke(&t, 9 * MIB, b"after it");
    let backing = BackingFile {
        file: open(&t),
        offset: MIB + 4096,
    };
    let dev = open(&t);
    let proof = prove_extents(&dev, &backing, 8 * MIB - 4096, EXTENT_READ_BUDGET).unwrap();
    assert_eq!(proof.found, None, "{proof:?}");
    poke(&t, 5 * MIB, b"inside");
    let proof = prove_extents(&dev, &backing, 8 * MIB - 4096, EXTENT_READ_BUDGET).unwrap();
    assert_eq!(proof.found.unwrap().offset, 4 * MIB - 4096);
}

/// The block-device proof on a real block device (a loop device read as a plain disk, through
/// O_DIRECT): 4 MiB in the middle, and filesystems whose first MiB was wiped.
#[test]
fn windows_on_a_block_device_see_data_and_wiped_filesystems() {
    if !root_or_skip("windows_on_a_block_device_see_data_and_wiped_filesystems") {
        return;
    }
    let size = 600 * MIB;
    let t = TempFile::sparse("blockdev", size);
    let dev = Loop::attach(&t.0);
    let held = || File::open(&dev.0).unwrap();
    assert_eq!(prove_windows(&held(), size).unwrap().found, None);
    let wipe_head = || {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(&dev.0)
            .unwrap();
        f.write_all(&vec![0u8; MIB_LEN]).unwrap();
        f.sync_all().unwrap();
    };
    // Written through the device and not yet synced: O_DIRECT still sees it.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&dev.0)
        .unwrap();
    f.write_all_at(&vec![0x5a; 4 * MIB_LEN], 300 * MIB).unwrap();
    // The loop proof flushes the device first: the unsynced write reaches the file it reads.
    let backing = BackingFile {
        file: open(&t),
        offset: 0,
    };
    let hit = prove_backing(&held(), &backing, size)
        .unwrap()
        .found
        .unwrap();
    assert_eq!(hit.offset, 300 * MIB, "{hit:?}");
    let hit = prove_windows(&held(), size).unwrap().found.unwrap();
    assert!((300 * MIB..304 * MIB).contains(&hit.offset), "{hit:?}");
    for mkfs in [["mkfs.ext4", "-qF"], ["mkfs.xfs", "-qf"]] {
        let made = Command::new(mkfs[0]).args([mkfs[1]]).arg(&dev.0).status();
        if !matches!(made, Ok(s) if s.success()) {
            eprintln!("{}: not run", mkfs[0]);
            continue;
        }
        wipe_head();
        let proof = prove_windows(&held(), size).unwrap();
        let hit = proof
            .found
            .unwrap_or_else(|| panic!("{}: nothing seen", mkfs[0]));
        assert!(hit.offset >= MIB, "{}: {hit:?}", mkfs[0]);
        assert!(matches!(proof.coverage, Coverage::Windows { .. }));
    }
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
        let t = TempFile::sparse(&format!("ext4-{block}"), size);
        let ok = Command::new("mkfs.ext4")
            .args(["-q", "-F", "-E", "nodiscard", "-b", &block.to_string()])
            .arg(&t.0)
            .status();
        if !matches!(ok, Ok(s) if s.success()) {
            let test = "corrupted_ext4_is_found_via_backup_superblock";
            assert_ne!(
                std::env::var("CI").as_deref(),
                Ok("true"),
                "{test}: no mkfs.ext4"
            );
            crate::loopdev::test_support::skip(test, "no mkfs.ext4");
            return;
        }
        poke(&t, 0, &vec![0u8; MIB_LEN]);
        let hit = extents_hit(&t, size, EXTENT_READ_BUDGET).expect("extents see it");
        assert!(hit.offset >= MIB, "{hit:?}");
        let hit = windows_hit(&t, size).unwrap();
        assert!(
            (MIB..backup + WINDOW).contains(&hit),
            "block size {block}: {hit}"
        );
    }
}

#[test]
fn an_xfs_whose_mkfs_never_finished_is_told_apart() {
    let path = std::env::temp_dir().join(format!("xfs-inprogress-{}", std::process::id()));
    let mut sb = vec![0u8; 4096];
    sb[0..4].copy_from_slice(b"XFSB");
    std::fs::write(&path, &sb).unwrap();
    let f = File::open(&path).unwrap();
    assert!(!super::xfs_mkfs_unfinished(&f).unwrap());
    sb[126] = 1;
    std::fs::write(&path, &sb).unwrap();
    let f = File::open(&path).unwrap();
    assert!(super::xfs_mkfs_unfinished(&f).unwrap());
    let _ = std::fs::remove_file(&path);
}

/// The proof past mkfs's first writes: a superblock alone there leaves the rest blank to it, and
/// anything past them is found, by both proofs.
#[test]
fn the_proof_past_a_head_sees_only_what_lies_past_it() {
    let size = 64 * MIB;
    let t = TempFile::sparse("past-head", size);
    poke(&t, 1024 + 0x38, &[0x53, 0xef]);
    let dev = open(&t);
    let backing = BackingFile {
        file: open(&t),
        offset: 0,
    };
    assert!(
        prove_backing_past(&dev, &backing, 0, size)
            .unwrap()
            .found
            .is_some()
    );
    assert_eq!(
        prove_backing_past(&dev, &backing, 4096, size)
            .unwrap()
            .found,
        None
    );
    assert_eq!(prove_windows_past(&dev, 4096, size).unwrap().found, None);
    poke(&t, 8 * MIB, b"data");
    let dev = open(&t);
    let hit = prove_backing_past(&dev, &backing, 4096, size)
        .unwrap()
        .found
        .unwrap();
    assert_eq!(hit.offset, 8 * MIB);
    let hit = prove_windows_past(&dev, 4096, size).unwrap().found.unwrap();
    assert_eq!(hit.offset, 8 * MIB);
}
