//! The size of a mounted filesystem as the kernel holds it. Reading the superblock from the device
//! is not enough for xfs: it writes its superblock through its own buffers and the log, so after
//! a grow the device (cached or not) still shows the old size for a while. ext keeps its
//! superblock in the device's page cache, so a buffered read of the device is current.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;

use crate::fstools::filesystem_bytes;
use ebs_node_core::request::FsType;

/// Mirror of the kernel's `struct xfs_fsop_geom_v1` (fs/xfs/libxfs/xfs_fs.h).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct XfsGeometryV1 {
    blocksize: u32,
    rtextsize: u32,
    agblocks: u32,
    agcount: u32,
    logblocks: u32,
    sectsize: u32,
    inodesize: u32,
    imaxpct: u32,
    datablocks: u64,
    rtblocks: u64,
    rtextents: u64,
    logstart: u64,
    uuid: [u8; 16],
    sunit: u32,
    swidth: u32,
    version: i32,
    flags: u32,
    logsectsize: u32,
    rtsectsize: u32,
    dirblocksize: u32,
}

// The ioctl number encodes the size: a mismatch would let the kernel write out of bounds.
const _: () = assert!(std::mem::size_of::<XfsGeometryV1>() == 112);

mod sys {
    // XFS_IOC_FSGEOMETRY_V1 = _IOR('X', 100, struct xfs_fsop_geom_v1)
    nix::ioctl_read!(xfs_fsgeometry_v1, b'X', 100, super::XfsGeometryV1);
}

/// Data bytes of the filesystem mounted at `mount_point` on `device`.
pub fn mounted_bytes(fs: FsType, device: &Path, mount_point: &Path) -> io::Result<u64> {
    if fs != FsType::Xfs {
        return filesystem_bytes(fs, device);
    }
    let dir = File::open(mount_point)?;
    let mut geo = XfsGeometryV1::default();
    // SAFETY: dir is an open file of the xfs mount; &mut geo is a valid, writable struct of the
    // size the request number encodes (checked above), alive for the whole call.
    unsafe { sys::xfs_fsgeometry_v1(dir.as_raw_fd(), &mut geo) }.map_err(io::Error::from)?;
    geo.datablocks
        .checked_mul(u64::from(geo.blocksize))
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "xfs geometry overflows"))
}
