//! Reads a block device around the page cache (O_DIRECT): what the device answers now, not what
//! an earlier read left in memory. Health checks need this (a cached block hides a dead device),
//! and so does reading a superblock that a mounted xfs rewrote through its own buffers.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

/// O_DIRECT wants the buffer, offset and length aligned to the logical block size; 4 KiB covers
/// every block size Linux supports.
const ALIGN: usize = 4096;

/// Reads `len` bytes at `offset` with O_DIRECT. `offset` and `len` are rounded out to 4 KiB; the
/// answer is the requested bytes only. A device that ends early gives `UnexpectedEof`.
pub fn read_direct(device: &Path, offset: u64, len: usize) -> io::Result<Vec<u8>> {
    let align = ALIGN as u64; // 4 KiB
    let start = offset - offset % align;
    let skip = usize::try_from(offset - start).map_err(io::Error::other)?; // below 4 KiB
    let span = (skip + len).div_ceil(ALIGN) * ALIGN;
    let file = open_direct(device)?;
    let mut buf = AlignedBuf::new(span)?;
    read_exact_direct(&file, buf.as_mut_slice(), start).map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof => {
            io::Error::new(e.kind(), format!("{} {e}", device.display()))
        }
        _ => e,
    })?;
    Ok(buf.as_mut_slice()[skip..skip + len].to_vec())
}

/// Opens `device` for O_DIRECT reads (a held device is reopened through its /proc/self/fd link).
pub fn open_direct(device: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(device)
}

/// A zeroed buffer whose usable part starts on a 4 KiB boundary, as O_DIRECT wants it: an aligned
/// window inside a plain Vec (safe code, one extra block of memory).
pub struct AlignedBuf {
    backing: Vec<u8>,
    pad: usize,
    len: usize,
}

impl AlignedBuf {
    pub fn new(len: usize) -> io::Result<AlignedBuf> {
        let backing = vec![0u8; len + ALIGN];
        let pad = backing.as_ptr().align_offset(ALIGN);
        if pad > ALIGN {
            return Err(io::Error::other("cannot align a read buffer"));
        }
        Ok(AlignedBuf { backing, pad, len })
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.backing[self.pad..self.pad + self.len]
    }
}

/// Fills `buf` (aligned, a multiple of 4 KiB long) from `offset` (4 KiB aligned) of a file opened
/// with [`open_direct`]. A device that ends early gives `UnexpectedEof`.
pub fn read_exact_direct(file: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("ended after {} bytes", offset + done as u64),
                ));
            }
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loopdev::test_support::{Loop, TempFile, root_or_skip};

    #[test]
    fn reads_what_is_on_the_device() {
        if !root_or_skip("reads_what_is_on_the_device") {
            return;
        }
        let file = TempFile::sparse("direct-read", 1 << 20);
        std::fs::OpenOptions::new()
            .write(true)
            .open(&file.0)
            .unwrap()
            .write_all_at(b"hello", 5000)
            .unwrap();
        let dev = Loop::attach(&file.0);
        assert_eq!(read_direct(&dev.0, 5000, 5).unwrap(), b"hello");
        assert_eq!(read_direct(&dev.0, 0, 4096).unwrap(), vec![0u8; 4096]);
        let past = read_direct(&dev.0, 1 << 20, 512).unwrap_err();
        assert_eq!(past.kind(), io::ErrorKind::UnexpectedEof);
    }
}
