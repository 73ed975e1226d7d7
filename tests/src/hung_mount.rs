//! A FUSE mount that never answers, standing in for a dead NFS server below kubelet's directory:
//! its daemon (this process) never replies to the kernel's INIT, so every stat or lookup at or
//! below it waits, killable only, until `Drop` closes the device, which aborts the connection and
//! fails the waiting calls with ENOTCONN.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags, mount, umount2};

pub struct HungMount {
    path: PathBuf,
    /// The connection's only file: closing it aborts the connection.
    device: Option<File>,
    mounted: bool,
}

impl HungMount {
    /// Mounts it at `path` (created if missing). Nothing here touches the mount afterwards: even
    /// a stat of `path` would hang.
    pub fn new(path: &Path) -> std::io::Result<HungMount> {
        std::fs::create_dir_all(path)?;
        // std opens with O_CLOEXEC, so no child process keeps the connection alive.
        let device = File::options().read(true).write(true).open("/dev/fuse")?;
        let data = format!(
            "fd={},rootmode=40000,user_id=0,group_id=0",
            device.as_raw_fd()
        );
        mount(
            Some("ebs-it-hung"),
            path,
            Some("fuse"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some(data.as_str()),
        )?;
        Ok(HungMount {
            path: path.to_path_buf(),
            device: Some(device),
            mounted: true,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Aborts the connection: waiting calls fail, and every later lookup below the mount fails
    /// with ENOTCONN (a dead NFS server's ESTALE, a crashed FUSE daemon), while it stays mounted.
    pub fn abort(&mut self) {
        drop(self.device.take());
    }

    /// Aborts the connection (the waiting calls fail) and detaches the mount.
    pub fn release(&mut self) {
        self.abort();
        if std::mem::take(&mut self.mounted) {
            let _ = umount2(&self.path, MntFlags::MNT_DETACH);
        }
    }
}

impl Drop for HungMount {
    fn drop(&mut self) {
        self.release();
    }
}
