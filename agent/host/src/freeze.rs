//! FIFREEZE and FITHAW: hold a mounted filesystem still while the file under its loop device is
//! copied. Freezing flushes the filesystem's dirty data and journal down through the loop device
//! into the backing file and blocks new writes (they wait, they do not fail) until the thaw, so
//! the copy is a clean, consistent image.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

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

/// Freezes the filesystem mounted at `mount_point` (any directory of it would do).
pub fn freeze(mount_point: &Path) -> io::Result<Frozen> {
    let dir = File::open(mount_point)?;
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

/// Thaws a filesystem that a crashed agent may have left frozen; one that is not frozen is fine.
pub fn thaw_if_frozen(mount_point: &Path) -> io::Result<bool> {
    let dir = File::open(mount_point)?;
    match thaw_fd(&dir) {
        Ok(()) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(false),
        Err(e) => Err(e),
    }
}

fn thaw_fd(dir: &File) -> io::Result<()> {
    let mut unused: libc::c_int = 0;
    // SAFETY: as for FIFREEZE: an open descriptor and a valid int, nothing else is touched.
    unsafe { sys::fithaw(dir.as_raw_fd(), &mut unused) }?;
    Ok(())
}

impl Frozen {
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
