//! The dm-log-writes log, read back: the entries the kernel target logged, and the logged device
//! rebuilt as of any entry (what the device held had the power gone right after it).
//!
//! The format (Linux `Documentation/admin-guide/device-mapper/log-writes.rst`, the target in
//! `drivers/md/dm-log-writes.c`): byte 0 holds the super (magic, version, entry count, sector
//! size, little-endian); from one sector on, each entry takes one sector (sector, sector count,
//! flags, data length, then a mark's name) followed by its data, `nr_sectors` sectors, except for
//! discards, which carry none. There are no checksums: the entry count, the magic, the version,
//! known flags and every entry's data lying inside the log are what can be checked.
//!
//! The target logs a write once a flush covers it (a FUA write as soon as it completes), so the
//! log is the order in which data became durable: replaying entries `0..=n` gives the device as
//! a power cut right after entry `n` would leave it, if `n` is a FLUSH or FUA entry. xfstests'
//! `replay-log` is the reference tool; like its `--discard-zeroes-data` mode, a discard reads
//! back as zeros here.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

pub const FLUSH: u64 = 1 << 0;
pub const FUA: u64 = 1 << 1;
pub const DISCARD: u64 = 1 << 2;
pub const MARK: u64 = 1 << 3;
/// REQ_META writes (kernels since 4.19); a hint only, replayed like any write.
pub const METADATA: u64 = 1 << 4;
const KNOWN_FLAGS: u64 = FLUSH | FUA | DISCARD | MARK | METADATA;

pub const MAGIC: u64 = 0x006a_7366_7773_6872;
pub const VERSION: u64 = 1;
/// The on-disk entry header: sector, nr_sectors, flags, data_len.
const ENTRY_HEADER: usize = 32;

/// One logged request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Where it went on the logged device, in the log's sectors.
    pub sector: u64,
    pub nr_sectors: u64,
    pub flags: u64,
    /// A mark's name (`dmsetup message <dev> 0 mark <name>`).
    pub mark: Option<String>,
    /// Where its data starts in the log, in bytes.
    pub data_at: u64,
}

impl Entry {
    pub fn is_flush(&self) -> bool {
        self.flags & FLUSH != 0
    }
    pub fn is_fua(&self) -> bool {
        self.flags & FUA != 0
    }
    pub fn is_discard(&self) -> bool {
        self.flags & DISCARD != 0
    }
    /// A point where everything logged so far is durable: a power cut right after it loses
    /// nothing that came before.
    pub fn is_durability_point(&self) -> bool {
        self.is_flush() || self.is_fua()
    }
    /// Whether it changes the device (a write with data, or a discard).
    pub fn changes_device(&self) -> bool {
        self.mark.is_none() && self.nr_sectors > 0
    }
}

/// A parsed log; its data stays in the file and is read during a replay.
pub struct Log {
    file: File,
    pub sector_size: u64,
    pub entries: Vec<Entry>,
}

fn bad(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

fn le64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

impl Log {
    pub fn open(path: &Path) -> io::Result<Log> {
        let file = File::open(path)?;
        let len = file.metadata()?.len();
        let mut sup = [0u8; 28];
        file.read_exact_at(&mut sup, 0)?;
        let magic = le64(&sup, 0);
        if magic != MAGIC {
            return Err(bad(format!("not a dm-log-writes log: magic {magic:#x}")));
        }
        let version = le64(&sup, 8);
        if version != VERSION {
            return Err(bad(format!(
                "log version {version}, this reader knows {VERSION}"
            )));
        }
        let count = le64(&sup, 16);
        let sector_size = u64::from(u32::from_le_bytes([sup[24], sup[25], sup[26], sup[27]]));
        if !sector_size.is_power_of_two() || !(512..=65536).contains(&sector_size) {
            return Err(bad(format!("sector size {sector_size}")));
        }
        let mut entries = Vec::new();
        let mut at = sector_size;
        let mut header = vec![0u8; sector_size as usize];
        for index in 0..count {
            if at + sector_size > len {
                return Err(bad(format!(
                    "entry {index} of {count} lies past the end of the log ({len} bytes)"
                )));
            }
            file.read_exact_at(&mut header, at)?;
            let (sector, nr_sectors, flags) =
                (le64(&header, 0), le64(&header, 8), le64(&header, 16));
            let data_len = le64(&header, 24);
            if flags & !KNOWN_FLAGS != 0 {
                return Err(bad(format!("entry {index}: unknown flags {flags:#x}")));
            }
            let mark = if flags & MARK != 0 {
                let end = ENTRY_HEADER as u64 + data_len;
                if end > sector_size {
                    return Err(bad(format!("entry {index}: a mark of {data_len} bytes")));
                }
                let raw = &header[ENTRY_HEADER..end as usize];
                Some(String::from_utf8_lossy(raw).into_owned())
            } else {
                None
            };
            let data_at = at + sector_size;
            let carried = if flags & DISCARD != 0 || mark.is_some() {
                0
            } else {
                nr_sectors
            };
            at = data_at + carried * sector_size;
            if at > len {
                return Err(bad(format!(
                    "entry {index}: its {carried} sectors of data run past the end of the log"
                )));
            }
            entries.push(Entry {
                sector,
                nr_sectors,
                flags,
                mark,
                data_at,
            });
        }
        Ok(Log {
            file,
            sector_size,
            entries,
        })
    }

    /// The index of the mark with this name.
    pub fn mark(&self, name: &str) -> Option<usize> {
        self.entries
            .iter()
            .position(|e| e.mark.as_deref() == Some(name))
    }

    /// Every mark, in log order.
    pub fn marks(&self) -> Vec<(usize, String)> {
        self.entries
            .iter()
            .enumerate()
            .filter_map(|(i, e)| e.mark.clone().map(|m| (i, m)))
            .collect()
    }

    /// Rebuilds the logged device as of entry `upto` (inclusive) on `target`, which must read
    /// as zeros (a new sparse file). Zeros are punched, not written, so the image stays sparse.
    pub fn replay(&self, upto: usize, target: &File) -> io::Result<ReplayStats> {
        let mut stats = ReplayStats::default();
        let mut buf = Vec::new();
        for e in self.entries.iter().take(upto + 1) {
            if !e.changes_device() {
                continue;
            }
            let offset = e.sector * self.sector_size;
            let len = e.nr_sectors * self.sector_size;
            if e.is_discard() {
                punch(target, offset, len)?;
                stats.discards += 1;
                continue;
            }
            buf.resize(len as usize, 0);
            self.file.read_exact_at(&mut buf, e.data_at)?;
            // Entries are at most one bio (a few MiB); zero runs are punched per 64 KiB chunk.
            for (i, chunk) in buf.chunks(64 << 10).enumerate() {
                let at = offset + (i as u64) * (64 << 10);
                if chunk.iter().all(|b| *b == 0) {
                    punch(target, at, chunk.len() as u64)?;
                } else {
                    target.write_all_at(chunk, at)?;
                }
            }
            stats.writes += 1;
            stats.bytes += len;
        }
        Ok(stats)
    }
}

/// What a replay applied.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ReplayStats {
    pub writes: usize,
    pub discards: usize,
    pub bytes: u64,
}

fn punch(f: &File, offset: u64, len: u64) -> io::Result<()> {
    use nix::fcntl::{FallocateFlags, fallocate};
    let flags = FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE;
    fallocate(f, flags, offset as i64, len as i64).map_err(io::Error::from)
}

#[cfg(test)]
mod tests;
