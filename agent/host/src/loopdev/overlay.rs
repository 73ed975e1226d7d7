//! Read-only loop devices laid over a block device, named with a tag so that their maker can
//! find them again (the tag is the loop device's `lo_file_name`, which LOOP_GET_STATUS64
//! reports back). A mount's read-only flag does not reach device special files; a loop device
//! whose backing is open read-only is a read-only disk, so every write to it fails.

use ebs_node_core::DevNum;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use nix::errno::Errno;

use super::{LoopError, LoopInfo64, attach_backing, bind, ioctl_err, open, sys};

/// Set by the kernel on a loop device whose backing file is not writable.
const LO_FLAGS_READ_ONLY: u32 = 1;

/// What a loop device says of itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Overlay {
    pub device: PathBuf,
    /// Its `lo_file_name`, up to the first NUL.
    pub tag: String,
    /// The device numbers of its backing file when that is a block device (else its st_rdev,
    /// (0, 0) for a regular file).
    pub backing: DevNum,
    pub read_only: bool,
}

/// Lays a loop device over the block device open as `backing` (which must be open read-only:
/// the kernel then makes the loop device read-only), named `tag` (at most 63 bytes). Returns
/// its path. The binding persists after this process closes its descriptors.
pub fn attach_read_only_over(backing: File, tag: &str) -> Result<PathBuf, LoopError> {
    attach_backing(backing, Path::new(tag), bind)
}

/// `attach_read_only_over` on a device whose number `avoid` allows (`super::Avoid`).
pub fn attach_read_only_over_avoiding(
    backing: File,
    tag: &str,
    avoid: super::Avoid,
) -> Result<PathBuf, LoopError> {
    super::attach_backing_avoiding(backing, Path::new(tag), bind, avoid)
}

/// The status of the loop device open as `dev`; None when it is not bound.
pub fn status_of(dev: &File, device: &Path) -> Result<Option<Overlay>, LoopError> {
    let mut info = LoopInfo64::zeroed();
    // SAFETY: dev is an open fd; &mut info is a valid, writable loop_info64 that outlives the
    // call.
    match unsafe { sys::loop_get_status64(dev.as_raw_fd(), &mut info) } {
        Ok(_) => {}
        Err(Errno::ENXIO) => return Ok(None),
        Err(e) => return Err(ioctl_err("LOOP_GET_STATUS64", device)(e)),
    }
    let name = info
        .lo_file_name
        .split(|b| *b == 0)
        .next()
        .unwrap_or_default();
    Ok(Some(Overlay {
        device: device.to_path_buf(),
        tag: String::from_utf8_lossy(name).into_owned(),
        backing: decode_dev(info.lo_rdevice),
        read_only: info.lo_flags & LO_FLAGS_READ_ONLY != 0,
    }))
}

/// The kernel's huge_encode_dev (new_encode_dev) format, as loop_info64 carries device numbers.
// Both halves are masked to 12 and 20 bits.
#[allow(clippy::cast_possible_truncation)]
pub(super) fn decode_dev(v: u64) -> DevNum {
    let major = ((v >> 8) & 0xfff) as u32;
    let minor = ((v & 0xff) | ((v >> 12) & 0xfff00)) as u32;
    DevNum::new(major, minor)
}

/// Every bound loop device whose tag starts with `prefix`.
pub fn tagged(prefix: &str) -> Result<Vec<Overlay>, LoopError> {
    let sys_block = Path::new("/sys/block");
    let entries = std::fs::read_dir(sys_block).map_err(|source| LoopError::Sysfs {
        path: sys_block.to_path_buf(),
        source,
    })?;
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("loop") || !entry.path().join("loop").exists() {
            continue;
        }
        let device = PathBuf::from(format!("/dev/{name}"));
        let dev = match open(&device, false) {
            Ok(dev) => dev,
            // Detached in between, or no node in this /dev: not one of ours to find.
            Err(_) => continue,
        };
        if let Some(status) = status_of(&dev, &device)?
            && status.tag.starts_with(prefix)
        {
            found.push(status);
        }
    }
    found.sort_by(|a, b| a.device.cmp(&b.device));
    Ok(found)
}

/// The status of the loop device with these numbers, if it is one and bound.
pub fn status_by_devnum(devnum: DevNum) -> io::Result<Option<Overlay>> {
    if devnum.major != super::LOOP_MAJOR {
        return Ok(None);
    }
    let dev = crate::device::open_devnum(devnum)?;
    let path = PathBuf::from(format!("/dev/block/{}", devnum));
    status_of(&dev, &path).map_err(|e| io::Error::other(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_numbers_decode_as_the_kernel_encodes_them() {
        // new_encode_dev: (minor & 0xff) | (major << 8) | ((minor & ~0xff) << 12)
        let enc = |ma: u64, mi: u64| (mi & 0xff) | (ma << 8) | ((mi & !0xff) << 12);
        for (ma, mi) in [(7, 0), (7, 255), (7, 256), (259, 3), (8, 1048575)] {
            assert_eq!(
                decode_dev(enc(ma, mi)),
                DevNum::new(u32::try_from(ma).unwrap(), u32::try_from(mi).unwrap())
            );
        }
    }
}
