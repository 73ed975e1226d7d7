//! The size of a block device, any kind (loop, NVMe, Xen): BLKGETSIZE64 on an open fd.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;

// BLKGETSIZE64 = _IOR(0x12, 114, size_t); the kernel always writes a u64.
nix::ioctl_read_bad!(
    blkgetsize64,
    nix::request_code_read!(0x12, 114, std::mem::size_of::<libc::size_t>()),
    u64
);

/// Size in bytes of a block device (regular files are accepted too, which
/// keeps callers and tests simple).
pub fn size(device: &Path) -> io::Result<u64> {
    let file = File::open(device)?;
    let kind = file.metadata()?.file_type();
    if !kind.is_file() && !kind.is_block_device() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not a block device", device.display()),
        ));
    }
    size_of(&file)
}

/// As [`size`], of a device already open (the held one).
pub fn size_of(file: &File) -> io::Result<u64> {
    let meta = file.metadata()?;
    if meta.file_type().is_file() {
        return Ok(meta.len());
    }
    if !meta.file_type().is_block_device() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a block device",
        ));
    }
    let mut size: u64 = 0;
    // SAFETY: file is an open block device; &mut size is a valid u64 the
    // kernel writes exactly 8 bytes into.
    unsafe { blkgetsize64(file.as_raw_fd(), &mut size) }.map_err(io::Error::from)?;
    Ok(size)
}
