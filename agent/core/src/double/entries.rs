//! Paths as the double hands them out: plain paths in the test's temporary directory, acted on
//! through std. The anchoring walk that makes a real entry safe (no symlink followed, nothing
//! swapped between check and use) is the host crate's, proven by its own tests. Its answers are
//! kept: a symlink or a non-directory on the way is refused, a missing directory above the entry
//! is `None` (or made, for `prepare`), and the entry itself may be anything, a symlink included
//! (held, never followed), so the pipeline's own refusals are exercised as on the host.

use std::fs::{self, File};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use std::sync::Arc;

use super::host::DoubleHost;
use crate::DevNum;
use crate::node::host::{Ancestry, Entry, OpenEntry, PathRefusal};
use crate::request::FsType;
use crate::seam::{EntryStat, FileKind, FsUsage, MountFacts, Removed, TrimError, Unmounted};

pub struct DoubleEntry {
    path: PathBuf,
    /// Why making it a directory or a file fails, when scripted.
    make_fails: Option<String>,
    /// The double that made it, whose mount table it is mounted on through.
    host: Arc<DoubleHost>,
}

impl std::fmt::Debug for DoubleEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DoubleEntry({})", self.path.display())
    }
}

/// The entry at `path` below `prefix`: refused when a directory on the way (below the prefix) is
/// a symlink or not a directory; `None` when one is missing (unless `make`: then made).
pub fn resolve(
    prefix: &Path,
    path: &Path,
    make: bool,
    make_fails: Option<String>,
    host: Arc<DoubleHost>,
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
        host,
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
                size: m.len(),
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
            path: self.path.clone(),
            host: Arc::clone(&self.host),
        }))
    }
    fn open_dir(&self) -> io::Result<Box<dyn OpenEntry>> {
        if !self.path.is_dir() {
            return Err(io::Error::from(io::ErrorKind::NotADirectory));
        }
        self.open_entry()
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
    fn mounted_at(&self) -> io::Result<Option<MountFacts>> {
        self.host.mounted_at(&self.path)
    }
    fn has_submounts(&self) -> io::Result<bool> {
        Ok(self.host.has_submounts(&self.path))
    }
    fn copies_elsewhere(&self) -> io::Result<Vec<PathBuf>> {
        Ok(self.host.copies_of(&self.path))
    }
    fn bind_here(&self, source: &Path, readonly: bool, vfs_bits: u64) -> io::Result<()> {
        self.host.bind(source, &self.path, readonly, vfs_bits)
    }
    fn unmount(&self) -> io::Result<Unmounted> {
        self.host.unmount(&self.path)
    }
    fn ancestry(&self) -> io::Result<Ancestry> {
        self.host.ancestry(&self.path)
    }
}

/// An opened entry: a real descriptor, so its /proc path leads back to the path (the double's
/// bind reads it, as the kernel would follow it).
pub struct DoubleOpen {
    file: File,
    path: PathBuf,
    host: Arc<DoubleHost>,
}

impl std::fmt::Debug for DoubleOpen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DoubleOpen({})", self.path.display())
    }
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
    fn mount_facts(&self, path: &Path) -> io::Result<Option<MountFacts>> {
        Ok(self.host.top(path))
    }
    fn mount_device(
        &self,
        device: &Path,
        fs: FsType,
        vfs_bits: u64,
        data: &[String],
        readonly: bool,
    ) -> io::Result<()> {
        self.host
            .mount_device(device, &self.path, fs, data, readonly, vfs_bits)
    }
    fn fs_usage(&self) -> io::Result<FsUsage> {
        self.host.usage_at(&self.path)
    }
    fn sync_fs(&self) -> io::Result<()> {
        self.host.sync_at(&self.path)
    }
    fn trim_free_space(&self) -> Result<u64, TrimError> {
        self.host.trim_at(&self.path)
    }
}
