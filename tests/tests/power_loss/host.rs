//! The host side of a replayed disk: loop devices over its two regions, the state filesystem
//! mounted where the guest had it, and the fixture that gives the volume its NVMe serial. Every
//! piece is a guard that undoes itself, so a failing point leaves nothing behind.

use std::fs::File;
use std::hash::Hasher;
use std::os::unix::fs::FileExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use ebs_node_core::ec2::ebs::EBS_MODEL;
use ebs_node_fixture::Fixture;

/// The volume's id, and the serial its NVMe controller reports.
pub const VOLUME: &str = "vol-0123456789abcdef0";
const SERIAL: &str = "vol0123456789abcdef0";

/// A loop device over a byte range of an image file, detached on drop.
pub struct Loop {
    pub dev: PathBuf,
}

impl Loop {
    pub fn attach(image: &Path, offset: u64, len: u64) -> Result<Loop, String> {
        let out = Command::new("losetup")
            .args(["--find", "--show", "--offset"])
            .arg(offset.to_string())
            .arg("--sizelimit")
            .arg(len.to_string())
            .arg(image)
            .output()
            .map_err(|e| format!("losetup: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "losetup {}: {}",
                image.display(),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let dev = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        Ok(Loop { dev })
    }

    /// (major, minor) of the device.
    pub fn numbers(&self) -> Result<(u32, u32), String> {
        let rdev = std::fs::metadata(&self.dev)
            .map_err(|e| format!("{}: {e}", self.dev.display()))?
            .rdev();
        Ok((
            nix::sys::stat::major(rdev) as u32,
            nix::sys::stat::minor(rdev) as u32,
        ))
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        // Flushes the device's page cache into the image before it goes.
        ebs_tests::detach_loop(&self.dev);
    }
}

/// A mounted filesystem, unmounted on drop (lazily, if something still holds it).
pub struct Mounted {
    pub at: PathBuf,
}

impl Mounted {
    pub fn mount(dev: &Path, at: &Path, fs: &str) -> Result<Mounted, String> {
        std::fs::create_dir_all(at).map_err(|e| format!("mkdir {}: {e}", at.display()))?;
        nix::mount::mount(
            Some(dev),
            at,
            Some(fs),
            nix::mount::MsFlags::empty(),
            None::<&str>,
        )
        .map_err(|e| format!("mount {} ({fs}) on {}: {e}", dev.display(), at.display()))?;
        Ok(Mounted {
            at: at.to_path_buf(),
        })
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if nix::mount::umount(&self.at).is_err() {
            let _ = nix::mount::umount2(&self.at, nix::mount::MntFlags::MNT_DETACH);
        }
    }
}

/// The sysfs + /dev fixture at `<base>/fixture`, the guest's layout, its namespace node a link
/// to `dev` (the replayed volume's loop device).
pub fn fixture(base: &Path, dev: &Loop) -> Result<(), String> {
    let root = base.join("fixture");
    let _ = std::fs::remove_dir_all(&root);
    let err = |e: std::io::Error| format!("fixture {}: {e}", root.display());
    let f = Fixture::at(&root).map_err(err)?;
    let names = f.nvme(1, Some(SERIAL), EBS_MODEL, &[1]).map_err(err)?;
    let (major, minor) = dev.numbers()?;
    f.set_dev(&names[0], major, minor).map_err(err)?;
    f.link(&names[0], &dev.dev).map_err(err)?;
    Ok(())
}

/// A digest of a byte range of an image that does not depend on how zeros are stored (holes,
/// or written zeros): every non-zero 4 KiB block with its offset.
pub fn content_digest(image: &Path, offset: u64, len: u64) -> std::io::Result<u64> {
    let f = File::open(image)?;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut at = offset;
    let end = offset + len;
    while at < end {
        // Skip holes: only data extents are read.
        let data = match nix::unistd::lseek(&f, at as i64, nix::unistd::Whence::SeekData) {
            Ok(d) if (d as u64) < end => d as u64,
            _ => break,
        };
        let hole = nix::unistd::lseek(&f, data as i64, nix::unistd::Whence::SeekHole)
            .map(|h| (h as u64).min(end))
            .unwrap_or(end);
        let mut pos = data - (data - offset) % 4096;
        while pos < hole {
            let n = ((hole - pos) as usize).min(buf.len());
            f.read_exact_at(&mut buf[..n], pos)?;
            for (i, block) in buf[..n].chunks(4096).enumerate() {
                if block.iter().any(|b| *b != 0) {
                    h.write_u64(pos - offset + (i as u64) * 4096);
                    h.write(block);
                }
            }
            pos += n as u64;
        }
        at = hole;
    }
    Ok(h.finish())
}

/// Whether a digest from `content_digest` is of anything but zeros.
pub fn is_data(digest: u64) -> bool {
    digest != content_digest_of_nothing()
}

fn content_digest_of_nothing() -> u64 {
    std::collections::hash_map::DefaultHasher::new().finish()
}

/// The filesystem UUID on a device (blkid, the test's independent view).
pub fn fs_uuid(dev: &Path) -> String {
    ebs_tests::csi_req::fs_uuid(&dev.display().to_string())
}
