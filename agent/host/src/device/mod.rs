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
//! runs, because mkfs and e2fsck take their own exclusive claim; dropping it waits until no child
//! forked meanwhile by another thread still holds a copy (`Claim`).

use ebs_node_core::DevNum;
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{LazyLock, Mutex};

#[allow(unsafe_code)] // FFI / ioctl / syscall wrapper
mod size;
pub use size::{size, size_of};

#[derive(Debug)]
pub struct HeldDevice {
    path: PathBuf,
    pin: File,
    exclusive: Option<Claim>,
    devnum: DevNum,
}

/// An exclusive claim on a block device. A tool that another thread spawns gets a copy of every
/// descriptor, this one too, until it closes them (close_range before its caller is let go, or
/// at exec on a kernel without it); closing ours while such a copy lives leaves the
/// device claimed, and the mkfs or mount(2) that follows fails with EBUSY ("apparently in use by
/// the system", seen with 16 stages at once). So dropping a claim waits for the spawns in flight,
/// and `HeldDevice::release_exclusive` waits until the device is free again.
#[derive(Debug)]
struct Claim(Option<File>);

impl Drop for Claim {
    fn drop(&mut self) {
        if let Some(file) = self.0.take() {
            drop(file);
            crate::command::without_spawns(|| ());
        }
    }
}

/// Tries an exclusive claim through `fd_path` and drops it at once, with no spawn in flight (so
/// the try leaves no copy behind). Whether the device was free; errors other than EBUSY count as
/// free (the tool that follows reports them).
fn free_now(fd_path: &Path) -> bool {
    crate::command::without_spawns(|| {
        match OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_EXCL)
            .open(fd_path)
        {
            Ok(_) => true,
            Err(e) => e.raw_os_error() != Some(libc::EBUSY),
        }
    })
}

// major() and minor() mask their answers to 32 bits (glibc's gnu_dev_major/minor).
#[allow(clippy::cast_possible_truncation)]
pub fn devnum_of(rdev: u64) -> DevNum {
    DevNum::new(
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
            self.exclusive = Some(Claim(Some(
                OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_EXCL)
                    .open(self.proc_path())?,
            )));
        }
        Ok(())
    }

    fn from_pin(path: &Path, pin: File, exclusive: Option<Claim>) -> io::Result<Self> {
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

    /// Drops the exclusive claim (before a tool that claims the device itself), and waits until
    /// no copy of it is left in a child being spawned (the child closes its copies before its
    /// spawn returns; without close_range they go during exec, a moment after); 20 ms at most,
    /// then the tool reports the device busy.
    pub fn release_exclusive(&mut self) {
        if self.exclusive.take().is_none() {
            return;
        }
        let fd_path = self.proc_path();
        crate::command::past_spawns(|| free_now(&fd_path), |free| !free);
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn devnum(&self) -> DevNum {
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
                "{} is now device {}, not the verified {}",
                self.path.display(),
                now,
                self.devnum
            )));
        }
        Ok(())
    }
}

/// The numbers of a block device node (following links, as a CO's devicePath may be one).
pub fn block_devnum(path: &Path) -> io::Result<DevNum> {
    let meta = std::fs::metadata(path)?;
    if !meta.file_type().is_block_device() {
        return Err(not_block(path));
    }
    Ok(devnum_of(meta.rdev()))
}

/// The device node for a device number, opened and checked to carry those numbers. Its name is
/// the kernel's (sysfs uevent's DEVNAME), remembered from one call to the next: the numbers of
/// what was opened decide, so a name gone stale costs one more sysfs read, never a wrong device.
pub fn open_devnum(devnum: DevNum) -> io::Result<File> {
    if let Some(name) = known_names().get(&devnum).cloned()
        && let Ok(file) = open_named(&name, devnum)
    {
        return Ok(file);
    }
    let uevent = std::fs::read_to_string(format!("/sys/dev/block/{}/uevent", devnum))?;
    let name = uevent
        .lines()
        .find_map(|l| l.strip_prefix("DEVNAME="))
        .ok_or_else(|| io::Error::other("no DEVNAME in uevent"))?;
    if name.split('/').any(|part| part.is_empty() || part == "..") {
        return Err(io::Error::other(format!("odd device name {name:?}")));
    }
    let file = open_named(name, devnum)?;
    let mut names = known_names();
    if names.len() >= MAX_KNOWN_NAMES {
        names.clear();
    }
    names.insert(devnum, name.to_string());
    Ok(file)
}

/// More block devices than any host has; a bound all the same.
const MAX_KNOWN_NAMES: usize = 4096;

fn known_names() -> std::sync::MutexGuard<'static, HashMap<DevNum, String>> {
    static NAMES: LazyLock<Mutex<HashMap<DevNum, String>>> = LazyLock::new(Default::default);
    NAMES
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn open_named(name: &str, devnum: DevNum) -> io::Result<File> {
    let file = File::open(Path::new("/dev").join(name))?;
    let meta = file.metadata()?;
    // A character device can carry the same numbers (7:1 is also /dev/vcs1).
    if !meta.file_type().is_block_device() || devnum_of(meta.rdev()) != devnum {
        return Err(io::Error::other(format!(
            "/dev/{name} does not carry device {}",
            devnum
        )));
    }
    Ok(file)
}

/// Whether something still claims the device exclusively: a mounted filesystem (in any mount
/// namespace), a device mapper, a running mkfs. A device that is gone claims nothing.
pub fn still_claimed(devnum: DevNum) -> bool {
    let Ok(file) = open_devnum(devnum) else {
        return false;
    };
    held_still_claimed(&file)
}

/// The same question about a device the caller holds open (not exclusively).
pub fn held_still_claimed(device: &File) -> bool {
    !free_now(Path::new(&format!("/proc/self/fd/{}", device.as_raw_fd())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loopdev::test_support::{Loop, TempDir, TempFile};

    #[test]
    fn regular_files_are_not_held() {
        let dir = TempDir::new("held-file");
        let f = dir.0.join("f");
        std::fs::write(&f, b"x").unwrap();
        assert!(HeldDevice::open(&f).is_err());
    }

    /// A remembered name that no longer carries the numbers (a character device with the same
    /// numbers, or a device renamed) is never what is opened: sysfs is asked again.
    #[test]
    fn a_stale_device_name_is_never_what_is_opened() {
        if !crate::loopdev::test_support::root_or_skip(
            "a_stale_device_name_is_never_what_is_opened",
        ) {
            return;
        }
        use nix::sys::stat::{Mode, SFlag, makedev, mknod};
        struct Node(PathBuf);
        impl Drop for Node {
            fn drop(&mut self) {
                let _ = std::fs::remove_file(&self.0);
            }
        }
        let file = TempFile::sparse("devnum-name", 1 << 20);
        let lo = Loop::attach(&file.0);
        let devnum = block_devnum(&lo.0).unwrap();
        // A character device with the loop device's numbers, as /dev/vcs1 is for loop1.
        let chr = format!("ebs-test-chr-{}", std::process::id());
        let node = Node(Path::new("/dev").join(&chr));
        let numbers = makedev(devnum.major.into(), devnum.minor.into());
        mknod(&node.0, SFlag::S_IFCHR, Mode::S_IRUSR, numbers).unwrap();
        known_names().insert(devnum, chr.clone());
        let opened = open_devnum(devnum).unwrap();
        let meta = opened.metadata().unwrap();
        assert!(meta.file_type().is_block_device(), "opened /dev/{chr}");
        assert_eq!(devnum_of(meta.rdev()), devnum);
        let name = lo.0.file_name().unwrap().to_str().unwrap();
        assert_eq!(known_names().get(&devnum).map(String::as_str), Some(name));
    }

    #[test]
    fn an_exclusive_claim_excludes_a_second_one_until_released() {
        if !crate::loopdev::test_support::root_or_skip(
            "an_exclusive_claim_excludes_a_second_one_until_released",
        ) {
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

    /// mount(2) (or mkfs) right after the probe's claim is released must find the device free,
    /// also while other threads spawn tools: their children hold copies of every descriptor from
    /// fork until exec. Without the wait, 16 stages at once failed with "apparently in use".
    #[test]
    fn a_released_claim_is_gone_while_other_threads_spawn_tools() {
        use rustix::io::Errno;
        use rustix::mount::{MountFlags, UnmountFlags, mount, unmount};
        if !crate::loopdev::test_support::root_or_skip(
            "a_released_claim_is_gone_while_other_threads_spawn_tools",
        ) {
            return;
        }
        let file = TempFile::sparse("held-spawn", 8 << 20);
        let lo = Loop::attach(&file.0);
        let mkfs = crate::command::run(
            "mkfs.ext4",
            &["-q", &lo.0.to_string_lossy()],
            std::time::Duration::from_secs(30),
        )
        .expect("mkfs.ext4 runs");
        assert_eq!(mkfs.code, 0, "{}", mkfs.stderr);
        let dir = TempDir::new("held-spawn-mnt");
        struct Unmount<'a>(&'a Path);
        impl Drop for Unmount<'_> {
            fn drop(&mut self) {
                let _ = unmount(self.0, UnmountFlags::DETACH);
            }
        }
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let spawners: Vec<_> = (0..2)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let _ = crate::command::run(
                            "true",
                            &[] as &[&str],
                            std::time::Duration::from_secs(5),
                        );
                    }
                })
            })
            .collect();
        let mut busy = 0;
        for _ in 0..200 {
            let mut held = HeldDevice::open(&lo.0).unwrap();
            held.claim_exclusive().unwrap();
            // The probe and the blank check, while other threads fork.
            std::thread::sleep(std::time::Duration::from_millis(1));
            held.release_exclusive();
            // What a stage does next: mount(2), which claims the device in the kernel.
            match mount(
                lo.0.as_path(),
                dir.0.as_path(),
                "ext4",
                MountFlags::RDONLY,
                None,
            ) {
                Ok(()) => drop(Unmount(&dir.0)),
                Err(Errno::BUSY) => busy += 1,
                Err(e) => panic!("mount: {e}"),
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for s in spawners {
            s.join().unwrap();
        }
        assert_eq!(busy, 0, "mount found the device busy {busy} times of 200");
    }
}
