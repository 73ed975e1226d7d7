use super::*;

/// A file in a scratch directory of its own, removed with it.
struct Temp {
    path: std::path::PathBuf,
    _dir: crate::Scratch,
}

impl Temp {
    fn new(name: &str) -> Temp {
        let dir = crate::Scratch::new(&format!("logwrites-{name}"));
        Temp {
            path: dir.join("file"),
            _dir: dir,
        }
    }
    fn with(name: &str, bytes: &[u8]) -> Temp {
        let t = Temp::new(name);
        std::fs::write(&t.path, bytes).expect("write log");
        t
    }
}

/// Writes logs in the kernel's format, for the parser's tests.
struct LogBuilder {
    sector_size: u64,
    bytes: Vec<u8>,
    count: u64,
}

impl LogBuilder {
    fn new(sector_size: u64) -> Self {
        LogBuilder {
            sector_size,
            bytes: vec![0; sector_size as usize],
            count: 0,
        }
    }

    fn entry(&mut self, sector: u64, nr_sectors: u64, flags: u64, mark: &[u8], data: &[u8]) {
        let mut header = vec![0u8; self.sector_size as usize];
        header[0..8].copy_from_slice(&sector.to_le_bytes());
        header[8..16].copy_from_slice(&nr_sectors.to_le_bytes());
        header[16..24].copy_from_slice(&flags.to_le_bytes());
        let data_len = if mark.is_empty() {
            data.len()
        } else {
            mark.len()
        } as u64;
        header[24..32].copy_from_slice(&data_len.to_le_bytes());
        header[ENTRY_HEADER..ENTRY_HEADER + mark.len()].copy_from_slice(mark);
        self.bytes.extend_from_slice(&header);
        self.bytes.extend_from_slice(data);
        self.count += 1;
    }

    /// A write of `data` (whole sectors) at `sector`, with extra flags (FUA, FLUSH, METADATA).
    fn write(&mut self, sector: u64, data: &[u8], flags: u64) -> &mut Self {
        assert_eq!(data.len() as u64 % self.sector_size, 0, "whole sectors");
        let n = data.len() as u64 / self.sector_size;
        self.entry(sector, n, flags, b"", data);
        self
    }

    fn flush(&mut self) -> &mut Self {
        self.entry(0, 0, FLUSH, b"", b"");
        self
    }

    fn discard(&mut self, sector: u64, nr_sectors: u64) -> &mut Self {
        self.entry(sector, nr_sectors, DISCARD, b"", b"");
        self
    }

    fn mark(&mut self, name: &str) -> &mut Self {
        self.entry(0, 0, MARK, name.as_bytes(), b"");
        self
    }

    /// The log with its super; `count` overrides the entry count (a log cut short).
    fn finish(&self, count: Option<u64>) -> Vec<u8> {
        let mut out = self.bytes.clone();
        out[0..8].copy_from_slice(&MAGIC.to_le_bytes());
        out[8..16].copy_from_slice(&VERSION.to_le_bytes());
        out[16..24].copy_from_slice(&count.unwrap_or(self.count).to_le_bytes());
        out[24..28].copy_from_slice(&(self.sector_size as u32).to_le_bytes());
        out
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
        .open(&t.path)
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
        let parsed = Log::open(&log.path).expect("parse");
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
    let parsed = Log::open(&log.path).expect("parse");
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
    let parsed = Log::open(&log.path).expect("parse");
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
    let e = Log::open(&t.path).err().expect("bad magic refused");
    assert!(e.to_string().contains("magic"), "{e}");

    let mut wrong_version = good.clone();
    wrong_version[8] = 2;
    let t = Temp::with("version", &wrong_version);
    assert!(Log::open(&t.path).is_err());

    // The super counts more entries than the log holds (a log device that ran out of space,
    // or a super written before its entries).
    let t = Temp::with("short", &sample(512).finish(Some(9)));
    let e = Log::open(&t.path).err().expect("short log refused");
    assert!(e.to_string().contains("past the end"), "{e}");

    // An entry whose data is cut off.
    let t = Temp::with("cut", &good[..good.len() - 100]);
    assert!(Log::open(&t.path).is_err());

    // Unknown flags.
    let mut b = LogBuilder::new(512);
    b.write(0, &sectors(1, 1, 512), 1 << 9);
    let t = Temp::with("flags", &b.finish(None));
    let e = Log::open(&t.path).err().expect("unknown flag refused");
    assert!(e.to_string().contains("unknown flags"), "{e}");

    // Fewer entries than written: the super is the authority, the rest is ignored.
    let t = Temp::with("fewer", &sample(512).finish(Some(3)));
    assert_eq!(Log::open(&t.path).expect("parse").entries.len(), 3);
}
