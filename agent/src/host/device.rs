//! A block device held open from the moment it is verified until the operation ends.
//!
//! While an fd is open the kernel cannot hand the device's number to another disk: a detached
//! loop device is only marked autoclear until its last close, and a removed NVMe namespace keeps
//! its minor until its last user goes. So "the device at major:minor" keeps meaning the one whose
//! identity was checked, and a tool or mount(2) that opens it by path afterwards reaches the same
//! device as long as the path still carries those numbers (`still_at_path`, checked right before
//! each use).
//!
//! For the probe and the blank check it is also held exclusively (O_EXCL): a concurrent mkfs, or a
//! mount of the device elsewhere, then fails instead of racing. The claim is dropped before a tool
//! runs, because mkfs and e2fsck take their own exclusive claim.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

#[derive(Debug)]
pub struct HeldDevice {
    path: PathBuf,
    pin: File,
    exclusive: Option<File>,
    devnum: (u32, u32),
}

pub fn devnum_of(rdev: u64) -> (u32, u32) {
    (
        nix::sys::stat::major(rdev) as u32,
        nix::sys::stat::minor(rdev) as u32,
    )
}

fn not_block(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{} is not a block device", path.display()),
    )
}

impl HeldDevice {
    /// Holds `path` open (not exclusively).
    pub fn open(path: &Path) -> io::Result<Self> {
        let pin = OpenOptions::new().read(true).open(path)?;
        Self::from_pin(path, pin, None)
    }

    /// Claims the held device exclusively, through the held fd (so the claim is on this very
    /// device). EBUSY: it is mounted, or another process (a mkfs, a device mapper) claims it.
    pub fn claim_exclusive(&mut self) -> io::Result<()> {
        if self.exclusive.is_none() {
            self.exclusive = Some(
                OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_EXCL)
                    .open(self.proc_path())?,
            );
        }
        Ok(())
    }

    fn from_pin(path: &Path, pin: File, exclusive: Option<File>) -> io::Result<Self> {
        let meta = pin.metadata()?;
        if !meta.file_type().is_block_device() {
            return Err(not_block(path));
        }
        Ok(HeldDevice {
            path: path.to_path_buf(),
            pin,
            exclusive,
            devnum: devnum_of(meta.rdev()),
        })
    }

    /// Drops the exclusive claim (before a tool that claims the device itself).
    pub fn release_exclusive(&mut self) {
        self.exclusive = None;
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn devnum(&self) -> (u32, u32) {
        self.devnum
    }

    pub fn file(&self) -> &File {
        &self.pin
    }

    /// The held device itself through /proc: a bind mount of it reaches this device node.
    pub fn proc_path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.pin.as_raw_fd()))
    }

    /// The path still names the held device: checked right before anything opens it by path
    /// (mkfs, e2fsck, resize2fs, mount(2)).
    pub fn still_at_path(&self) -> io::Result<()> {
        let meta = std::fs::metadata(&self.path)?;
        if !meta.file_type().is_block_device() {
            return Err(not_block(&self.path));
        }
        let now = devnum_of(meta.rdev());
        if now != self.devnum {
            return Err(io::Error::other(format!(
                "{} is now device {}:{}, not the verified {}:{}",
                self.path.display(),
                now.0,
                now.1,
                self.devnum.0,
                self.devnum.1
            )));
        }
        Ok(())
    }
}

/// The numbers of a block device node (following links, as a CO's devicePath may be one).
pub fn block_devnum(path: &Path) -> io::Result<(u32, u32)> {
    let meta = std::fs::metadata(path)?;
    if !meta.file_type().is_block_device() {
        return Err(not_block(path));
    }
    Ok(devnum_of(meta.rdev()))
}

/// The device node for a device number (the kernel's name for it, under /dev), opened and
/// checked to carry those numbers.
pub fn open_devnum(devnum: (u32, u32)) -> io::Result<File> {
    let uevent =
        std::fs::read_to_string(format!("/sys/dev/block/{}:{}/uevent", devnum.0, devnum.1))?;
    let name = uevent
        .lines()
        .find_map(|l| l.strip_prefix("DEVNAME="))
        .ok_or_else(|| io::Error::other("no DEVNAME in uevent"))?;
    if name.split('/').any(|part| part.is_empty() || part == "..") {
        return Err(io::Error::other(format!("odd device name {name:?}")));
    }
    let file = File::open(Path::new("/dev").join(name))?;
    if devnum_of(file.metadata()?.rdev()) != devnum {
        return Err(io::Error::other(format!(
            "/dev/{name} does not carry device {}:{}",
            devnum.0, devnum.1
        )));
    }
    Ok(file)
}

/// Whether something still claims the device exclusively: a mounted filesystem (in any mount
/// namespace), a device mapper, a running mkfs. A device that is gone claims nothing.
pub fn still_claimed(devnum: (u32, u32)) -> bool {
    let Ok(file) = open_devnum(devnum) else {
        return false;
    };
    let claim = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_EXCL)
        .open(format!("/proc/self/fd/{}", file.as_raw_fd()));
    matches!(claim, Err(e) if e.raw_os_error() == Some(libc::EBUSY))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::loopdev::test_support::{Loop, TempDir, TempFile};

    #[test]
    fn regular_files_are_not_held() {
        let dir = TempDir::new("held-file");
        let f = dir.0.join("f");
        std::fs::write(&f, b"x").unwrap();
        assert!(HeldDevice::open(&f).is_err());
    }

    #[test]
    fn an_exclusive_claim_excludes_a_second_one_until_released() {
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        let file = TempFile::sparse("held-excl", 1 << 20);
        let lo = Loop::attach(&file.0);
        let mut held = HeldDevice::open(&lo.0).unwrap();
        held.claim_exclusive().unwrap();
        assert!(held.still_at_path().is_ok());
        let mut other = HeldDevice::open(&lo.0).unwrap();
        assert_eq!(
            other.claim_exclusive().unwrap_err().raw_os_error(),
            Some(libc::EBUSY)
        );
        held.release_exclusive();
        assert!(other.claim_exclusive().is_ok());
        assert_eq!(held.devnum(), block_devnum(&lo.0).unwrap());
    }
}
