//! FIFREEZE and FITHAW: hold a mounted filesystem still while the file under its loop device is
//! copied. Freezing flushes the filesystem's dirty data and journal down through the loop device
//! into the backing file and blocks new writes (they wait, they do not fail) until the thaw, so
//! the copy is a clean, consistent image.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use ebs_node_core::DevNum;

mod sys {
    // FIFREEZE and FITHAW are _IOWR('X', 119/120, int); the kernel ignores the argument.
    nix::ioctl_readwrite!(fifreeze, b'X', 119, libc::c_int);
    nix::ioctl_readwrite!(fithaw, b'X', 120, libc::c_int);
}

/// A frozen filesystem; thawed by `thaw`, or on drop when the copy failed.
pub struct Frozen {
    dir: File,
    path: PathBuf,
    thawed: bool,
}

/// Freezes the filesystem mounted at `mount_point` (any directory of it would do), which must be
/// the filesystem on `device`: the directory opened is asked its device before anything is done,
/// so a mount laid over the path (another volume's, say) is never frozen.
pub fn freeze(mount_point: &Path, device: DevNum) -> io::Result<Frozen> {
    let dir = open_on(mount_point, device)?;
    let mut unused: libc::c_int = 0;
    // SAFETY: `dir` is an open descriptor for the call's duration and `unused` a valid int the
    // kernel may read; FIFREEZE touches no other memory.
    unsafe { sys::fifreeze(dir.as_raw_fd(), &mut unused) }?;
    Ok(Frozen {
        dir,
        path: mount_point.to_path_buf(),
        thawed: false,
    })
}

/// Thaws a filesystem on `device` that a crashed agent may have left frozen; one that is not
/// frozen is fine. The same check as `freeze`: never a filesystem laid over the path.
pub fn thaw_if_frozen(mount_point: &Path, device: DevNum) -> io::Result<bool> {
    let dir = open_on(mount_point, device)?;
    match thaw_fd(&dir) {
        Ok(()) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(false),
        Err(e) => Err(e),
    }
}

/// The directory at `mount_point`, opened, when its filesystem is the one on `device`.
fn open_on(mount_point: &Path, device: DevNum) -> io::Result<File> {
    use std::os::unix::fs::MetadataExt;
    let dir = File::open(mount_point)?;
    let shown = dir.metadata()?.dev();
    let want = libc::makedev(device.major, device.minor);
    if shown != want {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{} is not on {device}: another filesystem is mounted over it",
                mount_point.display()
            ),
        ));
    }
    Ok(dir)
}

fn thaw_fd(dir: &File) -> io::Result<()> {
    let mut unused: libc::c_int = 0;
    // SAFETY: as for FIFREEZE: an open descriptor and a valid int, nothing else is touched.
    unsafe { sys::fithaw(dir.as_raw_fd(), &mut unused) }?;
    Ok(())
}

impl Frozen {
    /// The mount point it was frozen through.
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn thaw(mut self) -> io::Result<()> {
        self.thawed = true;
        thaw_fd(&self.dir)
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        if !self.thawed
            && let Err(e) = thaw_fd(&self.dir)
        {
            tracing::error!(path = %self.path.display(), error = %e,
                "could not thaw a frozen filesystem; writes to it wait until `fsfreeze -u` runs");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The directory is asked its device before any ioctl: a path on another filesystem (one
    /// mounted over the volume's mount point) is neither frozen nor thawed.
    #[test]
    fn a_mount_point_on_another_device_is_never_frozen_or_thawed() {
        let elsewhere = DevNum::new(7, 12345);
        for path in ["/", "/proc", "/dev"] {
            let e = freeze(Path::new(path), elsewhere).err().expect(path);
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{path}: {e}");
            let e = thaw_if_frozen(Path::new(path), elsewhere).expect_err(path);
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{path}: {e}");
        }
    }
}
