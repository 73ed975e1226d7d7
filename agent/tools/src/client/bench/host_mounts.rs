//! `--host-mounts N`: a dense node's mount table for the bench. Every pod brings secret,
//! configmap and projected-token mounts, so a busy Kubernetes node has thousands; N small tmpfs
//! mounts stand in for them. They are removed when the guard drops, also after an error.

use std::path::{Path, PathBuf};

use rustix::mount::{MountFlags, UnmountFlags, mount, unmount};

pub struct HostMounts {
    dir: PathBuf,
    mounted: Vec<PathBuf>,
}

impl HostMounts {
    /// Mounts `count` tmpfs below `parent` (a directory of its own is made there).
    pub fn add(parent: &Path, count: usize) -> Result<HostMounts, String> {
        let dir = parent.join(format!("host-mounts-{}", std::process::id()));
        let mut mounts = HostMounts {
            dir: dir.clone(),
            mounted: Vec::with_capacity(count),
        };
        for i in 0..count {
            let point = dir.join(format!("m{i}"));
            std::fs::create_dir_all(&point)
                .map_err(|e| format!("--host-mounts: creating {}: {e}", point.display()))?;
            mount(
                "bench-host-mount",
                &point,
                "tmpfs",
                MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
                c"size=64k,mode=0700",
            )
            .map_err(|e| format!("--host-mounts: mounting tmpfs {}: {e}", point.display()))?;
            mounts.mounted.push(point);
        }
        Ok(mounts)
    }
}

impl Drop for HostMounts {
    fn drop(&mut self) {
        for point in self.mounted.drain(..).rev() {
            let _ = unmount(&point, UnmountFlags::DETACH);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
