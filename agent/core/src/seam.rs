//! What the host answers the node pipeline, as plain data: what sits at an entry, what is mounted
//! there, how an unmount, a removal or a check ended, and why a tool failed. The host crate makes
//! these values (and re-exports them where they were born); the pipeline and its recording double
//! read them without linking the host.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::DevNum;
use crate::request::FsType;

/// The kind of an entry, from its mode bits (what `stat` calls the file type).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileKind {
    RegularFile,
    Directory,
    Symlink,
    Fifo,
    Socket,
    CharacterDevice,
    BlockDevice,
    Unknown,
}

impl FileKind {
    /// From `st_mode` (the file type bits; the permission bits are ignored).
    pub fn from_mode(mode: u32) -> FileKind {
        match mode & 0o170_000 {
            0o100_000 => FileKind::RegularFile,
            0o040_000 => FileKind::Directory,
            0o120_000 => FileKind::Symlink,
            0o010_000 => FileKind::Fifo,
            0o140_000 => FileKind::Socket,
            0o020_000 => FileKind::CharacterDevice,
            0o060_000 => FileKind::BlockDevice,
            _ => FileKind::Unknown,
        }
    }
}

/// What sits at an entry, without following a final symlink (mounts are crossed, as the kernel
/// does for a mount point).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryStat {
    pub kind: FileKind,
    /// st_dev: the filesystem the entry is on (for a mount point: the mounted one).
    pub dev: DevNum,
    /// st_rdev: the device a device node stands for.
    pub rdev: DevNum,
    pub ino: u64,
    /// st_size: a regular file's length.
    pub size: u64,
    /// Whether the entry is the root of a mount; `None` when the kernel cannot say (before 5.8).
    pub mount_root: Option<bool>,
    /// The mount's id (the unique one where the kernel gives it), when `mount_root` is known.
    pub mnt_id: Option<u64>,
    pub mnt_id_unique: bool,
}

/// How removing an entry ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Removed {
    Removed,
    Absent,
    /// Not empty, or not a directory or file: not ours to delete.
    Kept,
}

/// The mount whose root an entry is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountFacts {
    /// The mounted filesystem's device (for a bind of a device node: the device filesystem's).
    pub dev: DevNum,
    pub fs_type: String,
    /// The path inside the filesystem that is mounted: "/" unless a bind of a subdirectory.
    pub root: PathBuf,
    pub read_only: bool,
    /// Which of nosuid, nodev and noexec the mount carries, as mount(2)'s bits (`request::ms`).
    pub vfs_bits: u64,
    /// The mount shows its files' owners through an id mapping (MOUNT_ATTR_IDMAP): the agent
    /// never makes one.
    pub idmapped: bool,
    /// The filesystem itself is read-only (remounted so, or after errors), for every mount of it.
    pub super_read_only: bool,
    /// The entry as the mount shows it: for a block publication a device node, whose `rdev` is
    /// the block device bound there.
    pub node: EntryStat,
}

impl MountFacts {
    pub fn describe(&self) -> String {
        let root = if self.root == Path::new("/") {
            String::new()
        } else {
            format!(" (a bind of {})", self.root.display())
        };
        format!("a {} mount of device {}{root}", self.fs_type, self.dev)
    }
}

/// The file behind a device, and where in it the device starts (the loop offset): the blank
/// proof reads every allocated byte of it instead of a sample.
#[derive(Debug)]
pub struct BackingFile {
    pub file: std::fs::File,
    pub offset: u64,
}

/// How an unmount ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Unmounted {
    Done,
    /// Nothing was mounted there (or the path is gone): success for an idempotent call.
    NotMounted,
    /// A dead mount (ENOTCONN/ESTALE/EIO) that could only be detached lazily.
    Detached,
}

/// How a filesystem check ended, when the filesystem can be mounted.
#[derive(Debug, PartialEq, Eq)]
pub enum FsckOutcome {
    Clean,
    /// e2fsck repaired something (exit 1 or 2): mountable, worth a log line.
    Repaired(i32),
    /// xfs has no offline check worth running here: its log is replayed at mount.
    NotNeeded,
}

/// Why an external tool did not run to an exit code.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error("{program}: command not found")]
    NotFound { program: String },
    #[error("{program}: failed to run: {source}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{program}: timed out after {after:?} and was killed")]
    Timeout { program: String, after: Duration },
    #[error("{program}: killed by signal {signal}")]
    Killed { program: String, signal: i32 },
}

/// The programs a filesystem needs that this host lacks, and the package that brings them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("missing {} (install {package})", tools.join(", "))]
pub struct MissingTools {
    pub tools: Vec<&'static str>,
    pub package: &'static str,
}

/// What went wrong with a filesystem tool, in the host's words; the daemon chooses the code.
#[derive(Debug, thiserror::Error)]
pub enum FsToolError {
    #[error("filesystem {fs} is not available on this host: {why}")]
    Unavailable { fs: FsType, why: String },
    #[error(
        "filesystem check of {device} failed (e2fsck exit {code}): {summary}; the volume was not \
         mounted, repair it by hand"
    )]
    FsckFailed {
        device: PathBuf,
        code: i32,
        summary: String,
    },
    #[error("{tool} on {device} failed (exit {code}): {stderr}")]
    ToolFailed {
        tool: String,
        device: PathBuf,
        code: i32,
        stderr: String,
    },
    /// The device is too small or too large for the filesystem and its options.
    #[error("cannot format {device}: {why}")]
    DoesNotFit { device: PathBuf, why: String },
    #[error("sizing {device}: {source}")]
    Sizing {
        device: PathBuf,
        source: std::io::Error,
    },
    #[error("non-UTF-8 path {0:?}")]
    NonUtf8Path(PathBuf),
    #[error(transparent)]
    Command(#[from] CommandError),
}

#[cfg(test)]
mod tests {
    use super::FileKind;

    #[test]
    fn a_mode_names_its_kind_whatever_its_permissions() {
        assert_eq!(FileKind::from_mode(0o040_755), FileKind::Directory);
        assert_eq!(FileKind::from_mode(0o060_660), FileKind::BlockDevice);
        assert_eq!(FileKind::from_mode(0o100_000), FileKind::RegularFile);
        assert_eq!(FileKind::from_mode(0o120_777), FileKind::Symlink);
        assert_eq!(FileKind::from_mode(0o020_600), FileKind::CharacterDevice);
        assert_eq!(FileKind::from_mode(0), FileKind::Unknown);
    }
}

/// A mounted filesystem's usage, as statvfs reports it (products saturate: a filesystem, a FUSE
/// one say, may report any numbers).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FsUsage {
    pub total_bytes: u64,
    /// Free to an unprivileged writer (f_bavail).
    pub available_bytes: u64,
    /// In use: total less every free block (f_bfree, the reserved ones too).
    pub used_bytes: u64,
    pub total_inodes: u64,
    pub available_inodes: u64,
    pub used_inodes: u64,
}

/// Why a filesystem's free space was not discarded (FITRIM).
#[derive(Debug, thiserror::Error)]
pub enum TrimError {
    #[error("the filesystem or its device does not support discard")]
    Unsupported,
    #[error("the filesystem does not implement FITRIM")]
    NotImplemented,
    #[error("the filesystem is read-only")]
    ReadOnly,
    #[error("FITRIM failed: {0}")]
    Io(#[source] std::io::Error),
}

/// A device's health read: its first 4 KiB, read past the page cache, bounded in time (an
/// impaired volume can leave a read hanging in the kernel for minutes).
#[derive(Debug)]
pub enum ReadOutcome {
    Ok,
    /// The device answered with an I/O error: it, or the storage behind it, is failing.
    IoError(std::io::Error),
    Failed(std::io::Error),
    /// A read of the device started this long ago has not returned.
    Hanging(Duration),
}
