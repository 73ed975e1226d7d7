//! The host as the node pipeline sees it: every question stage, publish, unpublish and unstage
//! ask of the host and every change they make to it, behind one trait. The daemon's `RealHost`
//! calls the host crate; the recording double in this crate's tests answers from a mount table in
//! memory and records each call with the journal line committed before it, so the pipeline's
//! steps, their order and every refusal are unit-tested as any user. The root tests on real
//! devices prove the host itself.
//!
//! Paths and devices still go through held handles: a request path becomes an `Entry` once,
//! resolved below its allowed prefix with no symlink followed (the host crate's `Anchored`), and
//! every later question or change names that entry or an `OpenEntry` of it, never a path to
//! resolve again; a device is held open from the moment it is proven (`DeviceHandle`). A handle
//! carries its own host calls (an entry is mounted on, bound onto, unmounted and placed through
//! itself), so the host is never handed back a handle to take apart: no downcast, and no handle
//! made elsewhere can reach the host crate's calls.

use std::collections::HashSet;
use std::fmt::Debug;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use super::backend::Backend;
use super::volume_device::VolumeDevice;
use crate::DevNum;
use crate::error::Result;
use crate::format::DeviceEvidence;
use crate::format::Probed;
use crate::request::{FormatOptions, FsType};
use crate::seam::{
    EntryStat, FsToolError, FsUsage, FsckOutcome, MountFacts, ReadOutcome, Removed, TrimError,
    Unmounted,
};

/// One entry (the last component of a path) in a directory held open.
pub trait Entry: Debug + Send + Sync {
    /// The path it was resolved from (for messages and the journal).
    fn path(&self) -> &Path;
    /// What sits there now (`None`: nothing).
    fn stat(&self) -> io::Result<Option<EntryStat>>;
    /// Makes it a directory; an existing directory is fine.
    fn mkdir(&self) -> io::Result<()>;
    /// Makes it an empty file; an existing one is `AlreadyExists`.
    fn create_file(&self) -> io::Result<()>;
    /// Opens what is there (crossing a mount on it), without following a final symlink.
    fn open_entry(&self) -> io::Result<Box<dyn OpenEntry>>;
    /// Opens the directory there for reading (crossing a mount on it), without following a
    /// final symlink: what syncfs and FITRIM need (a path-only descriptor does not do).
    fn open_dir(&self) -> io::Result<Box<dyn OpenEntry>>;
    /// Removes an empty directory or an empty file; anything else is kept.
    fn remove(&self) -> io::Result<Removed>;
    /// The mount whose root this entry is, if any.
    fn mounted_at(&self) -> io::Result<Option<MountFacts>>;
    /// Whether anything is mounted below the top-most mount on it (on a directory inside it).
    fn has_submounts(&self) -> io::Result<bool>;
    /// Where the kernel shows the top-most mount on it again through propagation (a shared
    /// parent's peers and slaves), or shows the mount it is such a copy of.
    fn copies_elsewhere(&self) -> io::Result<Vec<PathBuf>>;
    /// A bind of `source` (a /proc/self/fd path of a proven mount root or device) onto it.
    fn bind_here(&self, source: &Path, readonly: bool, vfs_bits: u64) -> io::Result<()>;
    /// Unmounts the top-most mount on it.
    fn unmount(&self) -> io::Result<Unmounted>;
    /// The places it lies in below its prefix, as the kernel reaches them from the held
    /// directory (`..`), not by their names.
    fn ancestry(&self) -> io::Result<Ancestry>;
}

/// An entry held open: what is checked through it is what is used.
pub trait OpenEntry: Debug + Send + Sync {
    /// The entry itself through this process's descriptor table: a bind of it reaches it.
    fn proc_path(&self) -> PathBuf;
    /// The same through this process's pid, for a tool the agent runs.
    fn path_for_tools(&self) -> PathBuf;
    /// The mount whose root the opened entry is, if any (`path` names it in errors).
    fn mount_facts(&self, path: &Path) -> io::Result<Option<MountFacts>>;
    /// mount(2) of `device`'s filesystem onto it.
    fn mount_device(
        &self,
        device: &Path,
        fs: FsType,
        vfs_bits: u64,
        data: &[String],
        readonly: bool,
    ) -> io::Result<()>;
    /// statvfs of the filesystem it is on.
    fn fs_usage(&self) -> io::Result<FsUsage>;
    /// syncfs of the filesystem it is on.
    fn sync_fs(&self) -> io::Result<()>;
    /// FITRIM of the filesystem it is on: the bytes the filesystem says it discarded.
    fn trim_free_space(&self) -> std::result::Result<u64, TrimError>;
}

/// Why a request or recorded path cannot be held.
#[derive(Debug)]
pub enum PathRefusal {
    /// A component is a symbolic link, or leads outside the allowed prefix.
    Symlink,
    /// A component is not a directory.
    NotDirectory,
    /// It cannot be examined (EIO, ENOTCONN below a dead mount, EACCES).
    Unexaminable(io::Error),
}

/// A block device held open (the host crate's `ebs_node_host::device::HeldDevice`): while it is
/// open its numbers cannot pass to another device.
pub trait DeviceHandle: Debug + Send + Sync {
    fn path(&self) -> &Path;
    fn devnum(&self) -> DevNum;
    /// The held descriptor: the device's identity and evidence are read through it.
    fn file(&self) -> &File;
    /// The held device itself through /proc: a bind of it reaches this very device.
    fn proc_path(&self) -> PathBuf;
    /// An exclusive claim through the held fd. EBUSY: mounted, or claimed by another process.
    fn claim_exclusive(&mut self) -> io::Result<()>;
    /// Drops the claim before a tool that claims the device itself.
    fn release_exclusive(&mut self);
    /// The path still names the held device (checked right before a tool opens it by path).
    fn still_at_path(&self) -> io::Result<()>;
}

/// What a device's bytes come from, one level down (`HostOps::lies_on`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Under {
    /// A block device: the one a loop device is laid over, the one whose filesystem holds a
    /// loop device's backing file, or one a mapper is built on (sysfs `slaves`).
    Device(DevNum),
    /// A loop device's backing file on a filesystem that may show another filesystem's files
    /// under names of its own (overlayfs, FUSE, NFS): where its bytes live cannot be told.
    Unknown(String),
}

/// What a loop device shows of the agent that made it (`HostOps::loop_origin`): two agents with
/// state directories of their own cannot read each other's records.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoopOrigin {
    /// Its name (`lo_file_name`): agents name the devices they make with their instance
    /// (`ro_tag`). Anyone who can open the device may change it, so it is not the only sign.
    pub name: String,
    /// The agent state directory its backing file lies in (the file is `volumes/<file>` or
    /// `snapshots/<file>` of a directory holding `state.redb` or `instance-id`), when it does.
    pub state_dir: Option<Place>,
    /// How many names its backing file has (0: not a file, or not countable): a second name
    /// may be another agent's volume file, whose directory the name the kernel shows is not.
    pub file_links: u64,
}

/// Another device that shows some of a device's bytes (`HostOps::views_of`): a loop device over
/// the same file, one laid over the device or over another view, the device a loop device is
/// laid over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct View {
    pub devnum: DevNum,
    /// Its loop name (`lo_file_name`): an agent's read-only devices carry their tag there.
    pub name: String,
    /// A read-only loop device.
    pub read_only: bool,
    /// The block device it is laid over, when it is a loop device laid over one.
    pub lies_over: Option<DevNum>,
    /// What uses it, as the host shows it (mounted or claimed, a device-node bind, a holder).
    pub in_use: Option<String>,
    /// What it shows is told all the way down (no loop device it is, or lies over, is over a file
    /// of a filesystem that may show another's files, or gave no status): a flush of it reaches
    /// no filesystem's server, so a failed one is an error (`HostOps::hold_views`).
    pub told: bool,
}

/// Views claimed exclusively for the length of a call (`HostOps::hold_views`): nothing mounts
/// them meanwhile. Dropped, they are free again.
#[derive(Debug, Default)]
pub struct HeldViews {
    /// Each view's exclusive claim (the real host: the view opened with O_EXCL).
    pub claims: Vec<Box<dyn ViewClaim>>,
    /// The views held: their claim is the call's own, no other use.
    pub devnums: Vec<DevNum>,
}

/// One held view's exclusive claim, given up when dropped.
pub trait ViewClaim: Send + Sync + std::fmt::Debug {}

impl ViewClaim for File {}

/// What start-up did with this agent's read-only devices that no publication record names.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Swept {
    pub detached: usize,
    /// Still used on the host (a reset or rebuilt state file lost their records): kept.
    pub adopted: usize,
}

/// One of this agent's read-only devices, as the host lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadOnlyFound {
    pub device: PathBuf,
    /// Its name (`ro_tag`): the agent instance's and the publication's.
    pub tag: String,
}

/// A read-only device laid over the volume's, held open until the bind is done.
#[derive(Debug)]
pub struct ReadOnlyDevice {
    pub file: File,
    pub path: PathBuf,
}

impl ReadOnlyDevice {
    pub fn proc_path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.file.as_raw_fd()))
    }
}

/// What the lifecycle pipeline needs of the host.
pub trait HostOps: Send + Sync {
    // Paths.
    /// The entry `path` names below `prefix`, with no symlink followed; missing parents are made.
    fn prepare(
        &self,
        prefix: &Path,
        path: &Path,
    ) -> std::result::Result<Box<dyn Entry>, PathRefusal>;
    /// The same without making anything; `None`: a directory above it is missing.
    fn lookup(
        &self,
        prefix: &Path,
        path: &Path,
    ) -> std::result::Result<Option<Box<dyn Entry>>, PathRefusal>;

    // Devices.
    /// Holds a block device open (not exclusively).
    fn open_device(&self, path: &Path) -> io::Result<Box<dyn DeviceHandle>>;
    /// The numbers of the block device at `path` now.
    fn block_devnum(&self, path: &Path) -> io::Result<DevNum>;
    /// Whether anything (a mount in any namespace, a mapper, a tool) still claims the device;
    /// asked through `held` when the call holds it open.
    fn still_claimed(&self, devnum: DevNum, held: Option<&File>) -> bool;
    /// Whether a device with these numbers exists now.
    fn device_exists(&self, devnum: DevNum) -> bool;
    /// Whether the kernel keeps the device read-only (a read-only attachment); one that cannot
    /// be asked counts as read-only.
    fn device_read_only(&self, devnum: DevNum) -> bool;
    /// The disk a partition is of: the device itself when it is a whole disk, or when the host
    /// cannot tell.
    fn whole_disk(&self, devnum: DevNum) -> DevNum;
    /// What the device's bytes come from, one level down (see `Under`); empty for a plain disk.
    fn lies_on(&self, devnum: DevNum) -> io::Result<Vec<Under>>;
    /// A loop device's backing file, as (st_dev, st_ino) (LOOP_GET_STATUS64's pair); `None`: not
    /// a loop device over a file, or not readable.
    fn loop_backing(&self, devnum: DevNum) -> Option<(u64, u64)>;
    /// Who a bound loop device says made it (`LoopOrigin`). `None`: not a bound loop device.
    fn loop_origin(&self, devnum: DevNum) -> io::Result<Option<LoopOrigin>>;
    /// The devices sysfs shows built on the device's bytes: its `holders` (mappers).
    fn built_on(&self, devnum: DevNum) -> io::Result<Vec<DevNum>>;
    /// The other devices that show some of `devnum`'s bytes, and what uses each.
    fn views_of(&self, devnum: DevNum) -> io::Result<Vec<View>>;
    /// Claims `device`'s `views` exclusively until the answer drops (all but the whole disk of
    /// a partition: its claim would keep `device` itself from being claimed); an error when one
    /// is in use.
    fn hold_views(&self, device: DevNum, views: &[View]) -> io::Result<HeldViews>;
    /// The device's size in bytes, by path (right after it was proven).
    fn device_bytes(&self, device: &Path) -> io::Result<u64>;
    /// The attachment a device's numbers stand for now (sysfs `diskseq`), when the kernel says.
    fn attachment(&self, devnum: DevNum) -> Option<String>;
    /// The never-format rule's evidence, read from the held, proven device.
    fn evidence<'a>(
        &'a self,
        backend: &'a dyn Backend,
        device: &'a VolumeDevice,
    ) -> Box<dyn DeviceEvidence + 'a>;

    // Read-only raw block publications (see `ro_tag`).
    fn lay_read_only(
        &self,
        device: &VolumeDevice,
        tag: &str,
        retry: bool,
    ) -> Result<ReadOnlyDevice>;
    fn remove_read_only(&self, tag: &str) -> Result<usize>;
    /// When the device is one of the agents' read-only devices: the device it lies over.
    fn read_only_lies_over(&self, devnum: DevNum) -> Option<DevNum>;
    /// What uses the device raw, as the host shows it (a bind of its node, or of a node of its
    /// disk's family or of another loop device over its file, in any mount namespace; a
    /// holder): the kernel's exclusive claim shows none of these. `Err`
    /// when the host cannot be read.
    fn raw_use(&self, devnum: DevNum, device: &Path) -> io::Result<Option<String>>;
    /// This agent's read-only devices: those whose tag starts with one of `prefixes`.
    fn read_only_devices(&self, prefixes: &[&str]) -> Result<Vec<ReadOnlyFound>>;
    /// For each of `found`, in order: what the host shows uses it (a bind of its node in any
    /// visible mount namespace, a holder, an O_EXCL claim, or that this could not be read),
    /// None when nothing does. One scan of the host for them all.
    fn read_only_uses(&self, found: &[ReadOnlyFound]) -> Vec<Option<String>>;
    /// Detaches one read-only device (the core's sweep decided it may go).
    fn detach_read_only(&self, found: &ReadOnlyFound) -> Result<()>;
    /// Every read-only device named with one of `tags` and laid over `over` is told to take the
    /// new size of what it lies over (LOOP_SET_CAPACITY): each, with the size it then shows.
    fn resize_read_only(
        &self,
        tags: &HashSet<String>,
        over: DevNum,
    ) -> io::Result<Vec<(PathBuf, io::Result<u64>)>>;

    // Health.
    /// Reads the device's first 4 KiB past the page cache, waiting a moment at most; while one
    /// read of a device hangs, no second one starts.
    fn read_first_block(&self, device: &Path) -> ReadOutcome;
    /// Whether this process may grow a mounted ext filesystem (the kernel asks CAP_SYS_RESOURCE,
    /// and resize2fs then says only "Permission denied").
    fn may_grow_mounted_ext(&self) -> bool;

    // Filesystem tools.
    /// Why this host cannot format, check or grow `fs`, if it cannot.
    fn fs_supported(&self, fs: FsType) -> std::result::Result<(), crate::seam::MissingTools>;
    /// Probes the device, and reads the filesystem's size in the same visit when it is `fs`.
    fn probe(&self, device: &Path, fs: FsType) -> Result<Probed>;
    /// Refuses options that cannot make a filesystem on a device this size.
    fn check_size(
        &self,
        fs: FsType,
        device: &Path,
        opts: &FormatOptions,
    ) -> std::result::Result<(), FsToolError>;
    fn mkfs(
        &self,
        fs: FsType,
        device: &Path,
        uuid: &str,
        opts: &FormatOptions,
    ) -> std::result::Result<(), FsToolError>;
    fn fsck(&self, fs: FsType, device: &Path) -> std::result::Result<FsckOutcome, FsToolError>;
    /// The filesystem's size, read from the unmounted device's superblock.
    fn fs_bytes(&self, fs: FsType, device: &Path) -> io::Result<u64>;
    /// The mounted filesystem's size (`mount_point` reaches the proven mount).
    fn mounted_fs_bytes(&self, fs: FsType, device: &Path, mount_point: &Path) -> io::Result<u64>;
    fn grow(
        &self,
        fs: FsType,
        device: &Path,
        mount_point: &Path,
    ) -> std::result::Result<(), FsToolError>;
    fn grow_offline(&self, fs: FsType, device: &Path) -> std::result::Result<(), FsToolError>;

    // Places: what a directory is, whatever it is called.
    /// The place the directory at `path` is (symlinks followed: the operator's own directories).
    fn place_of(&self, path: &Path) -> io::Result<Place>;
}

/// What a directory is: its filesystem's device and its inode. A bind of it, or a second mount of
/// its filesystem, shows the same place under another name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Place {
    pub dev: DevNum,
    pub ino: u64,
}

/// The places an entry lies in: its allowed prefix, and each directory from the one that holds
/// the entry up to the prefix (the prefix not included).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ancestry {
    pub prefix: Place,
    pub dirs: Vec<Place>,
}
