//! Point-in-time copies of loop volume files (snapshots, restores, clones): a reflink where the
//! filesystem under the state directory shares extents (btrfs, XFS with reflink, bcachefs), so
//! the copy is instant, atomic and costs no space until either side is written; otherwise a
//! sparse copy that reads only the source's data extents (SEEK_DATA/SEEK_HOLE) and moves them
//! with copy_file_range, so holes stay holes.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use rustix::fs::SeekFrom;
use rustix::io::Errno;

/// How a copy was made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyKind {
    /// The extents are shared (FICLONE): atomic with respect to writers of the source.
    Reflink,
    /// The data extents were copied one after another.
    Sparse,
}

impl CopyKind {
    pub fn name(self) -> &'static str {
        match self {
            CopyKind::Reflink => "reflink",
            CopyKind::Sparse => "sparse copy",
        }
    }
}

/// Copies `src` into `dst`, which must not exist yet, and sizes the copy to `len` bytes (at
/// least the source's length: the tail reads as zeros). The copy is on disk when this returns.
pub fn copy_file(src: &Path, dst: &Path, len: u64) -> io::Result<CopyKind> {
    let from = File::open(src)?;
    // Copies are volume images and snapshots: private, whatever the umask (host::private).
    let to = super::private::open_file(dst, OpenOptions::new().write(true).create_new(true))?;
    let kind = match rustix::fs::ioctl_ficlone(&to, &from) {
        Ok(()) => CopyKind::Reflink,
        // Not a reflink filesystem, or the two files on different ones: copy the data.
        Err(Errno::OPNOTSUPP | Errno::XDEV | Errno::INVAL | Errno::NOTTY | Errno::NOSYS) => {
            sparse_copy(&from, &to)?;
            CopyKind::Sparse
        }
        Err(e) => return Err(e.into()),
    };
    if to.metadata()?.len() < len {
        to.set_len(len)?;
    }
    to.sync_all()?;
    Ok(kind)
}

/// Copies the data extents of `from` into `to` at the same offsets; holes are left unwritten.
fn sparse_copy(from: &File, to: &File) -> io::Result<()> {
    let size = from.metadata()?.len();
    to.set_len(size)?;
    let mut pos = 0;
    while pos < size {
        let data = match rustix::fs::seek(from, SeekFrom::Data(pos)) {
            Ok(d) => d,
            // No data past `pos`: the rest is a hole.
            Err(Errno::NXIO) => break,
            Err(e) => return Err(e.into()),
        };
        let hole = rustix::fs::seek(from, SeekFrom::Hole(data))?.min(size);
        copy_range(from, to, data, hole - data)?;
        pos = hole;
    }
    Ok(())
}

fn copy_range(from: &File, to: &File, start: u64, len: u64) -> io::Result<()> {
    let (mut off_in, mut off_out) = (start, start);
    let end = start + len;
    while off_in < end {
        let chunk = (end - off_in).min(1 << 30) as usize;
        match rustix::fs::copy_file_range(from, Some(&mut off_in), to, Some(&mut off_out), chunk) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(_) => {}
            // Old kernels, or filesystems that refuse it: plain reads and writes.
            Err(Errno::XDEV | Errno::NOSYS | Errno::OPNOTSUPP | Errno::INVAL) => {
                return copy_by_reads(from, to, off_in, end);
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

fn copy_by_reads(from: &File, to: &File, mut pos: u64, end: u64) -> io::Result<()> {
    let mut buf = vec![0u8; 1 << 20];
    while pos < end {
        let want = usize::try_from(end - pos).map_or(buf.len(), |left| left.min(buf.len()));
        let n = from.read_at(&mut buf[..want], pos)?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        to.write_all_at(&buf[..n], pos)?;
        pos += n as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use super::*;

    #[test]
    fn copies_data_and_keeps_holes() {
        let dir = std::env::temp_dir().join(format!("file-copy-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let (src, dst) = (dir.join("src"), dir.join("dst"));
        let f = File::create(&src).unwrap();
        f.set_len(64 << 20).unwrap();
        f.write_all_at(b"head", 0).unwrap();
        f.write_all_at(b"middle", 32 << 20).unwrap();
        f.sync_all().unwrap();
        let kind = copy_file(&src, &dst, 80 << 20).unwrap();
        let out = std::fs::read(&dst).unwrap();
        let meta = std::fs::metadata(&dst).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(out.len(), 80 << 20);
        assert_eq!(&out[..4], b"head");
        assert_eq!(&out[32 << 20..(32 << 20) + 6], b"middle");
        assert!(out[(32 << 20) + 6..].iter().all(|b| *b == 0));
        // Sparse either way: a reflink shares two small extents, a sparse copy writes two.
        assert!(
            meta.blocks() * 512 < 8 << 20,
            "{kind:?}: {} blocks",
            meta.blocks()
        );
        assert!(copy_file(&dir.join("missing"), &dir.join("x"), 0).is_err());
    }
}
