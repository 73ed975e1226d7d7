//! Staging and target paths as handles, not strings. A path the CO hands over is resolved once,
//! below an open directory of its allowed prefix, with no symlink followed anywhere on the way;
//! every later step (stat, mkdir, mount, unmount, remove) acts through the directory fd it holds,
//! so nothing can be swapped between the check and the use.
//!
//! Resolution uses openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS) (Linux
//! 5.6+). On older kernels (ENOSYS), or where a seccomp filter denies openat2 (systemd's
//! `RestrictSUIDSGID=`: see `host::sandbox`), it walks one component at a time with
//! openat(O_NOFOLLOW | O_DIRECTORY): slower, equally race-free, since each step starts from the
//! fd of the directory checked just before. Any error other than "does not exist" refuses the
//! path: below a dead NFS or FUSE mount an lstat fails with EIO or ENOTCONN, and a path that
//! cannot be examined cannot be proven safe.

use ebs_node_core::DevNum;
use ebs_node_core::node::host::{Ancestry, Place};
use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use rustix::fs::{
    AtFlags, Mode, OFlags, ResolveFlags, Statx, StatxFlags, mkdirat, openat, openat2, statx,
    unlinkat,
};

use super::sandbox::{self, Newer};

/// Directories the agent creates: owner only, like kubelet's.
const DIR_MODE: u32 = 0o750;

/// STATX_MNT_ID_UNIQUE (Linux 6.8): the 64-bit mount id statmount(2) takes.
pub const STATX_MNT_ID_UNIQUE: u32 = 0x4000;

/// One entry (the last component of a path) in a directory held open.
#[derive(Debug)]
pub struct Anchored {
    dir: OwnedFd,
    name: OsString,
    path: PathBuf,
    /// What the prefix it was resolved below is: where `ancestry` stops.
    prefix: Place,
}

use ebs_node_core::seam::{EntryStat, FileKind, Removed};

fn beneath() -> ResolveFlags {
    ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS
}

fn dir_flags() -> OFlags {
    OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

/// Opens `prefix` (which the operator chose and may be a symlink) as the root of a resolution.
fn open_prefix(prefix: &Path, create: bool) -> io::Result<OwnedFd> {
    let open = || {
        openat(
            rustix::fs::CWD,
            prefix,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
    };
    match open() {
        Err(e) if create && e == rustix::io::Errno::NOENT => {
            std::fs::create_dir_all(prefix)?;
            Ok(open()?)
        }
        other => Ok(other?),
    }
}

/// The components of `path` below `prefix`; `None` when it is not strictly below.
fn below<'a>(prefix: &Path, path: &'a Path) -> Option<Vec<&'a OsStr>> {
    let rest = path.strip_prefix(prefix).ok()?;
    let parts: Vec<&OsStr> = rest
        .components()
        .map(|c| match c {
            Component::Normal(p) => Some(p),
            _ => None,
        })
        .collect::<Option<_>>()?;
    (!parts.is_empty()).then_some(parts)
}

/// Opens the directory `parts` names below `root`, one component at a time, creating missing
/// ones when asked. `Ok(None)`: a component does not exist and `create` is off.
fn walk(root: OwnedFd, parts: &[&OsStr], create: bool) -> io::Result<Option<OwnedFd>> {
    if parts.is_empty() {
        return Ok(Some(root));
    }
    if sandbox::usable(Newer::Openat2) {
        let joined: PathBuf = parts.iter().collect();
        match openat2(&root, &joined, dir_flags(), Mode::empty(), beneath()) {
            Ok(fd) => return Ok(Some(fd)),
            Err(e) if e == rustix::io::Errno::NOENT && create => {}
            Err(e) if e == rustix::io::Errno::NOENT => return Ok(None),
            // Not available here (a filter's ENOSYS or EPERM): the walk below, as on old
            // kernels. The resolution's own refusals (ELOOP, EXDEV, EAGAIN, ...) stay refusals.
            Err(e) if sandbox::unavailable(Newer::Openat2, Some(e.raw_os_error())) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let mut dir = root;
    for part in parts {
        let next = match openat(&dir, *part, dir_flags(), Mode::empty()) {
            Err(e) if e == rustix::io::Errno::NOENT && create => {
                match mkdirat(&dir, *part, Mode::from_raw_mode(DIR_MODE)) {
                    Ok(()) => {}
                    Err(e) if e == rustix::io::Errno::EXIST => {}
                    Err(e) => return Err(e.into()),
                }
                openat(&dir, *part, dir_flags(), Mode::empty())?
            }
            Err(e) if e == rustix::io::Errno::NOENT => return Ok(None),
            other => other?,
        };
        dir = next;
    }
    Ok(Some(dir))
}

impl Anchored {
    /// Resolves the directory that holds `path` (strictly below `prefix`), creating missing
    /// directories on the way: for stage and publish, which create their paths.
    pub fn prepare(prefix: &Path, path: &Path) -> io::Result<Anchored> {
        Self::resolve(prefix, path, true)?.ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
    }

    /// Resolves without creating anything: `None` when a directory above the entry is missing
    /// (then nothing can be mounted at it either).
    pub fn lookup(prefix: &Path, path: &Path) -> io::Result<Option<Anchored>> {
        Self::resolve(prefix, path, false)
    }

    fn resolve(prefix: &Path, path: &Path, create: bool) -> io::Result<Option<Anchored>> {
        let parts = below(prefix, path).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is not below {}", path.display(), prefix.display()),
            )
        })?;
        let (name, parents) = parts
            .split_last()
            .expect("below() returns at least one part");
        let root = match open_prefix(prefix, create) {
            // No prefix yet (v0.1's staging directory before its first stage): nothing is
            // below it either.
            Err(e) if !create && e.kind() == io::ErrorKind::NotFound => return Ok(None),
            other => other?,
        };
        let prefix = place(&root)?;
        Ok(walk(root, parents, create)?.map(|dir| Anchored {
            dir,
            name: name.to_os_string(),
            path: path.to_path_buf(),
            prefix,
        }))
    }

    /// The places the entry lies in: the held directory and each one above it up to the prefix,
    /// reached through `..` from the held fd, so what is checked is where the entry really is,
    /// whatever names lead there (a bind alias, a rename since the walk). A directory moved out
    /// from below the prefix since is refused (EXDEV, as openat2 answers a path leading out).
    pub fn ancestry(&self) -> io::Result<Ancestry> {
        let mut dirs = Vec::new();
        let mut cur = openat(&self.dir, ".", dir_flags(), Mode::empty())?;
        let mut here = place(&cur)?;
        // A path has at most PATH_MAX / 2 components.
        for _ in 0..2048 {
            if here == self.prefix {
                return Ok(Ancestry {
                    prefix: self.prefix,
                    dirs,
                });
            }
            dirs.push(here);
            let parent = openat(&cur, "..", dir_flags(), Mode::empty())?;
            let up = place(&parent)?;
            if up == here {
                break;
            }
            (cur, here) = (parent, up);
        }
        Err(io::Error::new(
            io::ErrorKind::CrossesDevices,
            format!(
                "{} no longer lies below its allowed prefix",
                self.path.display()
            ),
        ))
    }

    /// A path the agent itself chose below a directory it owns (v0.1's internal staging).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What is at the entry now; `None` when nothing is.
    pub fn stat(&self) -> io::Result<Option<EntryStat>> {
        match statx(
            &self.dir,
            &self.name,
            AtFlags::SYMLINK_NOFOLLOW | AtFlags::NO_AUTOMOUNT,
            stat_mask(),
        ) {
            Ok(st) => Ok(Some(entry_stat(&st))),
            Err(e) if e == rustix::io::Errno::NOENT => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Creates the entry as a directory (an existing directory is fine).
    pub fn mkdir(&self) -> io::Result<()> {
        match mkdirat(&self.dir, &self.name, Mode::from_raw_mode(DIR_MODE)) {
            Ok(()) => Ok(()),
            Err(e) if e == rustix::io::Errno::EXIST => match self.stat()? {
                Some(st) if st.kind == FileKind::Directory => Ok(()),
                _ => Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!("{} exists and is not a directory", self.path.display()),
                )),
            },
            Err(e) => Err(e.into()),
        }
    }

    /// Creates the entry as an empty regular file that must not exist yet (O_CREAT | O_EXCL).
    pub fn create_file(&self) -> io::Result<()> {
        let flags =
            OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::WRONLY | OFlags::CLOEXEC;
        openat(&self.dir, &self.name, flags, Mode::from_raw_mode(0o640)).map(drop)?;
        Ok(())
    }

    /// An fd of the entry itself (never a symlink), for mount(2) to use as its target or source
    /// through /proc/self/fd: the mount lands exactly on what was checked.
    pub fn open_entry(&self) -> io::Result<EntryFd> {
        let fd = openat(
            &self.dir,
            &self.name,
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let st = rustix::fs::fstat(&fd)?;
        let kind = FileKind::from_mode(st.st_mode);
        if kind != FileKind::Directory
            && kind != FileKind::RegularFile
            && kind != FileKind::BlockDevice
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} is a {kind:?}, neither a directory nor a file",
                    self.path.display()
                ),
            ));
        }
        Ok(EntryFd(fd))
    }

    /// The entry opened for reading as a directory (FITRIM and syncfs need a real fd), never
    /// through a symlink.
    pub fn open_dir(&self) -> io::Result<EntryFd> {
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        Ok(EntryFd(openat(
            &self.dir,
            &self.name,
            flags,
            Mode::empty(),
        )?))
    }

    /// The entry's path through its held directory, for umount2(UMOUNT_NOFOLLOW): the directory
    /// cannot be swapped, and a final symlink is not followed.
    pub fn unmount_path(&self) -> PathBuf {
        let mut p = PathBuf::from(format!("/proc/self/fd/{}", self.dir.as_raw_fd()));
        p.push(&self.name);
        p
    }

    /// Removes the entry if it is a directory (empty) or an empty regular file.
    pub fn remove(&self) -> io::Result<Removed> {
        let Some(st) = self.stat()? else {
            return Ok(Removed::Absent);
        };
        let result = match st.kind {
            FileKind::Directory => unlinkat(&self.dir, &self.name, AtFlags::REMOVEDIR),
            FileKind::RegularFile if self.file_len()? == 0 => {
                unlinkat(&self.dir, &self.name, AtFlags::empty())
            }
            _ => return Ok(Removed::Kept),
        };
        match result {
            Ok(()) => Ok(Removed::Removed),
            Err(e) if e == rustix::io::Errno::NOTEMPTY || e == rustix::io::Errno::BUSY => {
                Ok(Removed::Kept)
            }
            Err(e) if e == rustix::io::Errno::NOENT => Ok(Removed::Absent),
            Err(e) => Err(e.into()),
        }
    }

    fn file_len(&self) -> io::Result<u64> {
        let st = statx(
            &self.dir,
            &self.name,
            AtFlags::SYMLINK_NOFOLLOW,
            StatxFlags::SIZE,
        )?;
        Ok(st.stx_size)
    }
}

/// An O_PATH fd of one entry; `proc_path` names exactly it.
#[derive(Debug)]
pub struct EntryFd(OwnedFd);

impl EntryFd {
    pub fn proc_path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.0.as_raw_fd()))
    }

    /// The same entry through this process's pid, for a tool the agent runs (xfs_growfs takes
    /// a mount point): the child reaches exactly the checked mount, not whatever the original
    /// path names by the time it looks.
    pub fn path_for_tools(&self) -> PathBuf {
        PathBuf::from(format!(
            "/proc/{}/fd/{}",
            std::process::id(),
            self.0.as_raw_fd()
        ))
    }

    pub fn stat(&self) -> io::Result<EntryStat> {
        let st = statx(
            &self.0,
            "",
            AtFlags::EMPTY_PATH | AtFlags::SYMLINK_NOFOLLOW,
            stat_mask(),
        )?;
        Ok(entry_stat(&st))
    }
}

impl AsFd for EntryFd {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.0.as_fd()
    }
}

/// What the directory held by `fd` is (device and inode).
fn place(fd: &OwnedFd) -> io::Result<Place> {
    let st = statx(fd, "", AtFlags::EMPTY_PATH, StatxFlags::INO)?;
    Ok(Place {
        dev: DevNum::new(st.stx_dev_major, st.stx_dev_minor),
        ino: st.stx_ino,
    })
}

/// What the directory at `path` is, symlinks followed (the operator's own directories).
pub fn place_of(path: &Path) -> io::Result<Place> {
    let fd = openat(
        rustix::fs::CWD,
        path,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    place(&fd)
}

/// The unique mount id (6.8+) only where statmount can use it; otherwise the old id, which the
/// mount table's lines carry (the path of 5.8 to 6.7 kernels).
fn stat_mask() -> StatxFlags {
    let id = if sandbox::usable(Newer::Statmount) {
        StatxFlags::from_bits_retain(STATX_MNT_ID_UNIQUE)
    } else {
        StatxFlags::MNT_ID
    };
    StatxFlags::TYPE | StatxFlags::INO | StatxFlags::SIZE | id
}

pub fn entry_stat(st: &Statx) -> EntryStat {
    use rustix::fs::StatxAttributes;
    let knows_root = st.stx_attributes_mask.contains(StatxAttributes::MOUNT_ROOT);
    let mask = StatxFlags::from_bits_retain(st.stx_mask);
    let unique = mask.contains(StatxFlags::from_bits_retain(STATX_MNT_ID_UNIQUE));
    let has_id = unique || mask.contains(StatxFlags::MNT_ID);
    EntryStat {
        kind: FileKind::from_mode(u32::from(st.stx_mode)),
        dev: DevNum::new(st.stx_dev_major, st.stx_dev_minor),
        rdev: DevNum::new(st.stx_rdev_major, st.stx_rdev_minor),
        ino: st.stx_ino,
        size: st.stx_size,
        mount_root: knows_root.then(|| st.stx_attributes.contains(StatxAttributes::MOUNT_ROOT)),
        mnt_id: has_id.then_some(st.stx_mnt_id),
        mnt_id_unique: unique,
    }
}

#[cfg(test)]
mod tests;
