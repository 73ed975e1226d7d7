use super::*;

struct Temp(std::path::PathBuf);

impl Temp {
    fn new(name: &str) -> Temp {
        let p = std::env::temp_dir().join(format!(
            "ebs-logwrites-{name}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        Temp(p)
    }
    fn with(name: &str, bytes: &[u8]) -> Temp {
        let t = Temp::new(name);
        std::fs::write(&t.0, bytes).expect("write log");
        t
    }
}

impl Drop for Temp {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn sectors(fill: u8, n: usize, size: usize) -> Vec<u8> {
    vec![fill; n * size]
}

/// A new sparse device image of `len` bytes.
fn device(name: &str, len: u64) -> (Temp, File) {
    let t = Temp::new(name);
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(&t.0)
        .expect("device image");
    f.set_len(len).expect("size");
    (t, f)
}

fn read(f: &File, at: u64, len: usize) -> Vec<u8> {
    let mut b = vec![0u8; len];
    f.read_exact_at(&mut b, at).expect("read image");
    b
}

/// The shapes the kernel writes: plain writes, a FUA write, a pure flush, a discard, marks,
/// a REQ_META write and a flush that carries data.
fn sample(size: u64) -> LogBuilder {
    let s = size as usize;
    let mut b = LogBuilder::new(size);
    b.write(0, &sectors(0xaa, 2, s), 0)
        .mark("after-a")
        .write(4, &sectors(0xbb, 1, s), FUA)
        .write(8, &sectors(0xcc, 3, s), METADATA)
        .flush()
        .discard(0, 1)
        .mark("after-discard")
        .write(9, &sectors(0xdd, 1, s), FLUSH | FUA);
    b
}

#[test]
fn parses_every_entry_kind() {
    for size in [512u64, 4096] {
        let log = Temp::with("kinds", &sample(size).finish(None));
        let parsed = Log::open(&log.0).expect("parse");
        assert_eq!(parsed.sector_size, size);
        let e = &parsed.entries;
        assert_eq!(e.len(), 8);
        assert_eq!((e[0].sector, e[0].nr_sectors, e[0].flags), (0, 2, 0));
        assert_eq!(e[1].mark.as_deref(), Some("after-a"));
        assert!(!e[1].changes_device() && !e[1].is_durability_point());
        assert!(e[2].is_fua() && e[2].is_durability_point() && !e[2].is_flush());
        assert_eq!(e[3].flags, METADATA);
        assert!(e[4].is_flush() && !e[4].changes_device());
        assert!(e[5].is_discard() && e[5].changes_device());
        // A discard carries no data: the next entry's header follows its own at once.
        assert_eq!(e[6].data_at, e[5].data_at + size);
        assert_eq!(parsed.mark("after-discard"), Some(6));
        assert!(e[7].is_flush() && e[7].is_fua() && e[7].nr_sectors == 1);
        assert_eq!(
            parsed.marks(),
            vec![(1, "after-a".into()), (6, "after-discard".into())]
        );
        // Data offsets: header sector, then the data, back to back.
        assert_eq!(e[0].data_at, 2 * size);
        assert_eq!(e[1].data_at, 5 * size);
    }
}

#[test]
fn replays_to_any_entry() {
    let size = 512u64;
    let log = Temp::with("replay", &sample(size).finish(None));
    let parsed = Log::open(&log.0).expect("parse");
    let at = |s: u64| s * size;

    // Up to the FUA write: a and b, nothing of c.
    let (_t, img) = device("upto-fua", at(16));
    let stats = parsed.replay(2, &img).expect("replay");
    assert_eq!((stats.writes, stats.discards), (2, 0));
    assert_eq!(read(&img, 0, 1024), vec![0xaa; 1024]);
    assert_eq!(read(&img, at(4), 512), vec![0xbb; 512]);
    assert_eq!(read(&img, at(8), 1536), vec![0; 1536]);

    // Up to the flush: c too.
    let (_t, img) = device("upto-flush", at(16));
    parsed.replay(4, &img).expect("replay");
    assert_eq!(read(&img, at(8), 1536), vec![0xcc; 1536]);

    // The discard reads back as zeros, its neighbour keeps its data.
    let (_t, img) = device("upto-discard", at(16));
    let stats = parsed.replay(5, &img).expect("replay");
    assert_eq!(stats.discards, 1);
    assert_eq!(read(&img, 0, 512), vec![0; 512]);
    assert_eq!(read(&img, at(1), 512), vec![0xaa; 512]);

    // Everything: the flush that carried data wrote it.
    let (_t, img) = device("all", at(16));
    let stats = parsed.replay(7, &img).expect("replay");
    assert_eq!(stats.bytes, at(7));
    assert_eq!(read(&img, at(9), 512), vec![0xdd; 512]);
}

#[test]
fn zeros_are_punched_and_overwrite_data() {
    let s = 4096usize;
    let mut b = LogBuilder::new(4096);
    b.write(0, &sectors(0x11, 32, s), 0)
        .flush()
        .write(0, &sectors(0, 32, s), FUA);
    let log = Temp::with("zeros", &b.finish(None));
    let parsed = Log::open(&log.0).expect("parse");
    let (_t, img) = device("zeros-image", 64 * 4096);
    parsed.replay(2, &img).expect("replay");
    assert_eq!(read(&img, 0, 32 * s), vec![0; 32 * s]);
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        img.metadata().expect("stat").blocks(),
        0,
        "zeros stay holes"
    );
}

#[test]
fn refuses_what_is_not_a_whole_log() {
    let good = sample(512).finish(None);

    let mut wrong_magic = good.clone();
    wrong_magic[0] ^= 0xff;
    let t = Temp::with("magic", &wrong_magic);
    let e = Log::open(&t.0).err().expect("bad magic refused");
    assert!(e.to_string().contains("magic"), "{e}");

    let mut wrong_version = good.clone();
    wrong_version[8] = 2;
    let t = Temp::with("version", &wrong_version);
    assert!(Log::open(&t.0).is_err());

    // The super counts more entries than the log holds (a log device that ran out of space,
    // or a super written before its entries).
    let t = Temp::with("short", &sample(512).finish(Some(9)));
    let e = Log::open(&t.0).err().expect("short log refused");
    assert!(e.to_string().contains("past the end"), "{e}");

    // An entry whose data is cut off.
    let t = Temp::with("cut", &good[..good.len() - 100]);
    assert!(Log::open(&t.0).is_err());

    // Unknown flags.
    let mut b = LogBuilder::new(512);
    b.write(0, &sectors(1, 1, 512), 1 << 9);
    let t = Temp::with("flags", &b.finish(None));
    let e = Log::open(&t.0).err().expect("unknown flag refused");
    assert!(e.to_string().contains("unknown flags"), "{e}");

    // Fewer entries than written: the super is the authority, the rest is ignored.
    let t = Temp::with("fewer", &sample(512).finish(Some(3)));
    assert_eq!(Log::open(&t.0).expect("parse").entries.len(), 3);
}
