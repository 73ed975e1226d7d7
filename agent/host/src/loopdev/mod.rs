//! Loop device management through `/dev/loop-control` and the loop ioctls.
//!
//! We talk to the kernel directly instead of shelling out to losetup so that
//! errors are typed and races (two agents grabbing the same free device) are
//! handled deterministically.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;

use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::errno::Errno;

const LO_NAME_SIZE: usize = 64;
const LO_KEY_SIZE: usize = 32;
pub const LOOP_MAJOR: u32 = 7;
const ATTACH_ATTEMPTS: u32 = 8;

/// Mirror of the kernel's `struct loop_info64` (include/uapi/linux/loop.h).
#[repr(C)]
#[derive(Clone, Copy)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; LO_NAME_SIZE],
    lo_crypt_name: [u8; LO_NAME_SIZE],
    lo_encrypt_key: [u8; LO_KEY_SIZE],
    lo_init: [u64; 2],
}

/// Mirror of the kernel's `struct loop_config` (Linux >= 5.8).
#[repr(C)]
#[derive(Clone, Copy)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

// Layout checks: a mismatch would make the kernel read/write out of bounds.
const _: () = assert!(std::mem::size_of::<LoopInfo64>() == 232);
const _: () = assert!(std::mem::size_of::<LoopConfig>() == 304);

impl LoopInfo64 {
    fn zeroed() -> Self {
        // SAFETY: the struct is plain integers and integer arrays, for which
        // the all-zero bit pattern is valid (and what the kernel expects for
        // unused fields).
        unsafe { std::mem::zeroed() }
    }
}

/// Raw ioctl wrappers. The loop ioctls predate direction/size encoding, hence
/// the `_bad` variants with literal request numbers.
mod sys {
    use super::{LoopConfig, LoopInfo64};
    nix::ioctl_write_int_bad!(loop_set_fd, 0x4C00);
    nix::ioctl_none_bad!(loop_clr_fd, 0x4C01);
    nix::ioctl_write_ptr_bad!(loop_set_status64, 0x4C04, LoopInfo64);
    nix::ioctl_read_bad!(loop_get_status64, 0x4C05, LoopInfo64);
    nix::ioctl_none_bad!(loop_set_capacity, 0x4C07);
    nix::ioctl_write_ptr_bad!(loop_configure, 0x4C0A, LoopConfig);
    nix::ioctl_none_bad!(loop_ctl_get_free, 0x4C82);
    nix::ioctl_write_int_bad!(loop_ctl_add, 0x4C80);
}

#[derive(Debug, thiserror::Error)]
pub enum LoopError {
    #[error("cannot open {path:?}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot create device node {path:?}: {source}")]
    Mknod {
        path: PathBuf,
        #[source]
        source: Errno,
    },
    #[error("{op} on {path:?} failed: {source}")]
    Ioctl {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: Errno,
    },
    #[error("no free loop device after {attempts} attempts (raced with other users)")]
    Busy { attempts: u32 },
    #[error(
        "no free loop device whose number no bind holds among the {looked} after the first free \
         one: a bind of a detached loop device's node keeps its number from every new device"
    )]
    AllBound { looked: u32 },
    #[error("cannot read {path:?}: {source}")]
    Sysfs {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path:?} is not a loop device path")]
    NotLoopDevice { path: PathBuf },
}

fn open(path: &Path, write: bool) -> Result<File, LoopError> {
    OpenOptions::new()
        .read(true)
        .write(write)
        .open(path)
        .map_err(|source| LoopError::Open {
            path: path.to_path_buf(),
            source,
        })
}

fn ioctl_err(op: &'static str, path: &Path) -> impl FnOnce(Errno) -> LoopError {
    let path = path.to_path_buf();
    move |source| LoopError::Ioctl { op, path, source }
}

/// "/dev/loop7" -> "loop7" (the sysfs name).
fn loop_name(device: &Path) -> Result<String, LoopError> {
    device
        .file_name()
        .and_then(|n| n.to_str())
        .filter(|n| {
            n.len() > 4 && n.starts_with("loop") && n[4..].bytes().all(|b| b.is_ascii_digit())
        })
        .map(str::to_owned)
        .ok_or_else(|| LoopError::NotLoopDevice {
            path: device.to_path_buf(),
        })
}

/// Containers often ship a static /dev without the node the kernel just
/// allocated; create it so the index from LOOP_CTL_GET_FREE is usable.
fn ensure_node(index: u32) -> Result<PathBuf, LoopError> {
    let path = PathBuf::from(format!("/dev/loop{index}"));
    if path.exists() {
        return Ok(path);
    }
    // With max_part set, minors are not simply the index; sysfs knows.
    let sys_dev = format!("/sys/block/loop{index}/dev");
    let (major, minor) = std::fs::read_to_string(&sys_dev)
        .ok()
        .and_then(|s| {
            let (ma, mi) = s.trim().split_once(':')?;
            Some((ma.parse().ok()?, mi.parse().ok()?))
        })
        .unwrap_or((u64::from(LOOP_MAJOR), u64::from(index)));
    use nix::sys::stat::{Mode, SFlag, makedev, mknod};
    match mknod(
        &path,
        SFlag::S_IFBLK,
        Mode::from_bits_truncate(0o660),
        makedev(major, minor),
    ) {
        Ok(()) | Err(Errno::EEXIST) => Ok(path),
        Err(source) => Err(LoopError::Mknod { path, source }),
    }
}

fn file_name_field(file: &Path) -> [u8; LO_NAME_SIZE] {
    let mut name = [0u8; LO_NAME_SIZE];
    let bytes = file.as_os_str().as_bytes();
    // Keep the last byte as the NUL terminator the kernel expects.
    let n = bytes.len().min(LO_NAME_SIZE - 1);
    name[..n].copy_from_slice(&bytes[..n]);
    name
}

/// Binds `backing` to the loop device open as `dev`. Returns Err(EBUSY) when
/// another process bound it first, so the caller can pick another device.
fn bind(dev: &File, dev_path: &Path, backing: &File, file: &Path) -> Result<(), LoopError> {
    let mut info = LoopInfo64::zeroed();
    info.lo_file_name = file_name_field(file);
    let config = LoopConfig {
        fd: backing.as_raw_fd().cast_unsigned(), // an open fd, so >= 0
        block_size: 0,
        info,
        reserved: [0; 8],
    };
    // SAFETY: dev is an open loop device fd and &config points to a fully
    // initialised repr(C) loop_config that lives across the call.
    match unsafe { sys::loop_configure(dev.as_raw_fd(), &config) } {
        Ok(_) => Ok(()),
        // Pre-5.8 kernels do not know LOOP_CONFIGURE.
        Err(Errno::EINVAL | Errno::ENOTTY) => bind_legacy(dev, dev_path, backing, file),
        Err(e) => Err(ioctl_err("LOOP_CONFIGURE", dev_path)(e)),
    }
}

/// The pre-5.8 two-step binding. Not atomic: a reader may briefly see the
/// device bound without its file name, which is harmless for us.
fn bind_legacy(dev: &File, dev_path: &Path, backing: &File, file: &Path) -> Result<(), LoopError> {
    let mut info = LoopInfo64::zeroed();
    info.lo_file_name = file_name_field(file);
    // SAFETY: both fds are open for the duration of the call; the kernel
    // takes its own reference on the backing file.
    unsafe { sys::loop_set_fd(dev.as_raw_fd(), backing.as_raw_fd()) }
        .map_err(ioctl_err("LOOP_SET_FD", dev_path))?;
    // SAFETY: dev is open; &info points to an initialised loop_info64.
    if let Err(e) = unsafe { sys::loop_set_status64(dev.as_raw_fd(), &info) } {
        // Undo the half-configured binding so the device is not leaked.
        // SAFETY: dev is open; LOOP_CLR_FD takes no argument.
        let _ = unsafe { sys::loop_clr_fd(dev.as_raw_fd()) };
        return Err(ioctl_err("LOOP_SET_STATUS64", dev_path)(e));
    }
    Ok(())
}

/// Attaches `file` to a free loop device and returns its path. The binding
/// persists after this process closes its descriptors (no autoclear).
pub fn attach(file: &Path) -> Result<PathBuf, LoopError> {
    attach_with(file, bind)
}

/// `attach` for a read-only device: the kernel makes a loop device read-only when its backing
/// file is open read-only, so writes (and a writable open) of the device fail.
pub fn attach_read_only(file: &Path) -> Result<PathBuf, LoopError> {
    attach_backing(open(file, false)?, file, bind)
}

/// Numbers a new loop device must not take: a bind of a node of that number lives on somewhere
/// (a workload may detach its own loop device, which needs no privilege), and it would read and
/// write the new device's bytes.
pub type Avoid<'a> = &'a dyn Fn(ebs_node_core::DevNum) -> bool;

/// `attach` (read-only with `read_only`) on a device whose number `avoid` allows, named `name`
/// (its `lo_file_name`, at most 63 bytes; the file's path when `None`).
pub fn attach_avoiding(
    file: &Path,
    name: Option<&str>,
    read_only: bool,
    avoid: Avoid,
) -> Result<PathBuf, LoopError> {
    let name = name.map_or(file, Path::new);
    attach_backing_avoiding(open(file, !read_only)?, name, bind, avoid)
}

type BindFn = fn(&File, &Path, &File, &Path) -> Result<(), LoopError>;

fn attach_with(file: &Path, bind: BindFn) -> Result<PathBuf, LoopError> {
    attach_backing(open(file, true)?, file, bind)
}

fn attach_backing(backing: File, file: &Path, bind: BindFn) -> Result<PathBuf, LoopError> {
    attach_backing_avoiding(backing, file, bind, &|_| false)
}

/// How many indices past the first free one an attach looks at for one no bind holds.
const AVOID_LOOKS: u32 = 64;

fn attach_backing_avoiding(
    backing: File,
    file: &Path,
    bind: BindFn,
    avoid: Avoid,
) -> Result<PathBuf, LoopError> {
    let ctl_path = Path::new("/dev/loop-control");
    let ctl = open(ctl_path, true)?;
    for attempt in 0..ATTACH_ATTEMPTS {
        // SAFETY: ctl is an open /dev/loop-control fd; the ioctl takes no argument.
        let index = unsafe { sys::loop_ctl_get_free(ctl.as_raw_fd()) }
            .map_err(ioctl_err("LOOP_CTL_GET_FREE", ctl_path))?;
        // nix answers a negative return with Err: the index is >= 0.
        let index = index.cast_unsigned();
        let index = if index_devnum(index).is_none_or(avoid) {
            free_index_past(&ctl, ctl_path, index, avoid)?
        } else {
            index
        };
        let dev_path = ensure_node(index)?;
        let dev = open(&dev_path, true)?;
        match bind(&dev, &dev_path, &backing, file) {
            Ok(()) => return Ok(dev_path),
            Err(LoopError::Ioctl {
                source: Errno::EBUSY,
                ..
            }) => std::thread::sleep(Duration::from_millis(5 << attempt.min(5))),
            Err(e) => return Err(e),
        }
    }
    Err(LoopError::Busy {
        attempts: ATTACH_ATTEMPTS,
    })
}

/// The numbers of loop device `index`, from sysfs.
fn index_devnum(index: u32) -> Option<ebs_node_core::DevNum> {
    let text = std::fs::read_to_string(format!("/sys/block/loop{index}/dev")).ok()?;
    let (major, minor) = text.trim().split_once(':')?;
    Some(ebs_node_core::DevNum::new(
        major.parse().ok()?,
        minor.parse().ok()?,
    ))
}

/// The first index past `from` whose device is unbound and whose number `avoid` allows, made
/// with LOOP_CTL_ADD where it does not exist yet.
fn free_index_past(ctl: &File, ctl_path: &Path, from: u32, avoid: Avoid) -> Result<u32, LoopError> {
    for index in from + 1..=from + AVOID_LOOKS {
        // SAFETY: ctl is an open /dev/loop-control fd; the argument is the index to add.
        match unsafe { sys::loop_ctl_add(ctl.as_raw_fd(), index.cast_signed()) } {
            Ok(_) | Err(Errno::EEXIST) => {}
            Err(e) => return Err(ioctl_err("LOOP_CTL_ADD", ctl_path)(e)),
        }
        if index_devnum(index).is_none_or(avoid) {
            continue;
        }
        let dev_path = ensure_node(index)?;
        let dev = open(&dev_path, false)?;
        if overlay::status_of(&dev, &dev_path)?.is_none() {
            return Ok(index);
        }
    }
    Err(LoopError::AllBound {
        looked: AVOID_LOOKS,
    })
}

/// Names the bound loop device `name` (its `lo_file_name`), changing nothing else: what it
/// shows, from where, and its flags are given back as they are. Devices attached before agents
/// named theirs get their name so (`ro_tag::AgentTag::attached_tag`).
pub fn rename(device: &Path, name: &str) -> Result<(), LoopError> {
    let dev = open(device, false)?;
    let Some(mut info) = query::status(&dev).map_err(ioctl_err("LOOP_GET_STATUS64", device))?
    else {
        return Err(ioctl_err("LOOP_GET_STATUS64", device)(Errno::ENXIO));
    };
    info.lo_file_name = file_name_field(Path::new(name));
    // SAFETY: dev is an open loop device fd; &info is the device's own initialised loop_info64
    // (offset, size limit and flags unchanged), which outlives the call.
    unsafe { sys::loop_set_status64(dev.as_raw_fd(), &info) }
        .map_err(ioctl_err("LOOP_SET_STATUS64", device))?;
    Ok(())
}

/// Detaches the loop device. If the device is still open elsewhere (mounted,
/// or merely being probed by udev or another thread) the kernel only marks it
/// autoclear and the detach completes at the last close, so callers must not
/// assume the device is free when this returns.
pub fn detach(device: &Path) -> Result<(), LoopError> {
    // Read-only suffices: we are CAP_SYS_ADMIN, and a read-only loop device
    // would refuse a writable open.
    let dev = open(device, false)?;
    // SAFETY: dev is an open fd; LOOP_CLR_FD takes no argument.
    match unsafe { sys::loop_clr_fd(dev.as_raw_fd()) } {
        Ok(_) | Err(Errno::ENXIO) => Ok(()),
        Err(e) => Err(ioctl_err("LOOP_CLR_FD", device)(e)),
    }
}

/// Makes the loop device pick up a new size of its backing file.
pub fn set_capacity(device: &Path) -> Result<(), LoopError> {
    let dev = open(device, false)?;
    // SAFETY: dev is an open fd; LOOP_SET_CAPACITY takes no argument.
    unsafe { sys::loop_set_capacity(dev.as_raw_fd()) }
        .map_err(ioctl_err("LOOP_SET_CAPACITY", device))?;
    Ok(())
}

mod backing_fs;
mod flush;
pub mod overlay;
pub mod stacking;
pub mod views;
pub use backing_fs::{BackingFs, backing_fs, backing_fs_of_loop, fs_of_path};
mod query;
pub use query::{
    all_over_inode, backing_file, backing_file_by_devnum, backing_inode, backing_inode_of,
    backing_of, every_view_of_inode, find_by_backing_inode, read_only, size_limit_of,
};

/// Helpers shared by the root-only tests of this module and `blkid`.
#[cfg(test)]
pub(crate) mod test_support;

#[cfg(test)]
mod tests;
