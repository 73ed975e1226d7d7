//! Paths as the double hands them out: plain paths in the test's temporary directory, acted on
//! through std. The anchoring walk that makes a real entry safe (no symlink followed, nothing
//! swapped between check and use) is the host crate's, proven by its own tests. Its answers are
//! kept: a symlink or a non-directory on the way is refused, a missing directory above the entry
//! is `None` (or made, for `prepare`), and the entry itself may be anything, a symlink included
//! (held, never followed), so the pipeline's own refusals are exercised as on the host.

use std::any::Any;
use std::fs::{self, File};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::DevNum;
use crate::node::host::{Entry, OpenEntry, PathRefusal};
use crate::seam::{EntryStat, FileKind, Removed};

#[derive(Debug)]
pub struct DoubleEntry {
    path: PathBuf,
    /// Why making it a directory or a file fails, when scripted.
    make_fails: Option<String>,
}

/// The entry at `path` below `prefix`: refused when a directory on the way (below the prefix) is
/// a symlink or not a directory; `None` when one is missing (unless `make`: then made).
pub fn resolve(
    prefix: &Path,
    path: &Path,
    make: bool,
    make_fails: Option<String>,
) -> Result<Option<DoubleEntry>, PathRefusal> {
    let Ok(below) = path.strip_prefix(prefix) else {
        return Err(PathRefusal::Symlink);
    };
    let mut at = prefix.to_path_buf();
    let parts: Vec<_> = below.components().collect();
    for (i, part) in parts.iter().enumerate() {
        at.push(part);
        let last = i + 1 == parts.len();
        match fs::symlink_metadata(&at) {
            Ok(_) if last => {}
            Ok(m) if m.file_type().is_symlink() => return Err(PathRefusal::Symlink),
            Ok(m) if !last && !m.is_dir() => return Err(PathRefusal::NotDirectory),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound && last => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound && make => {
                fs::create_dir(&at).map_err(PathRefusal::Unexaminable)?;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(PathRefusal::Unexaminable(e)),
        }
    }
    Ok(Some(DoubleEntry {
        path: path.to_path_buf(),
        make_fails,
    }))
}

impl Entry for DoubleEntry {
    fn path(&self) -> &Path {
        &self.path
    }
    fn stat(&self) -> io::Result<Option<EntryStat>> {
        match fs::symlink_metadata(&self.path) {
            Ok(m) => Ok(Some(EntryStat {
                kind: FileKind::from_mode(m.mode()),
                dev: DevNum::new(0, 1),
                rdev: DevNum::new(0, 0),
                ino: m.ino(),
                mount_root: None,
                mnt_id: None,
                mnt_id_unique: false,
            })),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }
    fn mkdir(&self) -> io::Result<()> {
        if let Some(why) = &self.make_fails {
            return Err(io::Error::other(why.clone()));
        }
        match fs::create_dir(&self.path) {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && self.path.is_dir() => Ok(()),
            other => other,
        }
    }
    fn create_file(&self) -> io::Result<()> {
        if let Some(why) = &self.make_fails {
            return Err(io::Error::other(why.clone()));
        }
        File::options()
            .write(true)
            .create_new(true)
            .open(&self.path)
            .map(drop)
    }
    fn open_entry(&self) -> io::Result<Box<dyn OpenEntry>> {
        Ok(Box::new(DoubleOpen {
            file: File::open(&self.path)?,
        }))
    }
    fn remove(&self) -> io::Result<Removed> {
        let Some(st) = self.stat()? else {
            return Ok(Removed::Absent);
        };
        let result = match st.kind {
            FileKind::Directory => fs::remove_dir(&self.path),
            FileKind::RegularFile if fs::symlink_metadata(&self.path)?.len() == 0 => {
                fs::remove_file(&self.path)
            }
            _ => return Ok(Removed::Kept),
        };
        match result {
            Ok(()) => Ok(Removed::Removed),
            Err(e) if e.kind() == io::ErrorKind::DirectoryNotEmpty => Ok(Removed::Kept),
            Err(e) => Err(e),
        }
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// An opened entry: a real descriptor, so its /proc path leads back to the path (the double's
/// bind reads it, as the kernel would follow it).
#[derive(Debug)]
pub struct DoubleOpen {
    file: File,
}

impl OpenEntry for DoubleOpen {
    fn proc_path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.file.as_raw_fd()))
    }
    fn path_for_tools(&self) -> PathBuf {
        PathBuf::from(format!(
            "/proc/{}/fd/{}",
            std::process::id(),
            self.file.as_raw_fd()
        ))
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}
