//! statmount(2) (Linux 6.8+): the facts of one mount, by its id, without reading the whole
//! mount table. The kernel prints /proc/self/mountinfo for every mount of the namespace (thousands
//! on a dense node); this asks about exactly one.
//!
//! FFI: libc has no wrapper yet, so the syscall and `struct statmount` (include/uapi/linux/mount.h)
//! are mirrored here; this module holds the only `unsafe` of the mount queries.

use ebs_node_core::DevNum;
use std::io;
use std::path::PathBuf;

use crate::sandbox::{self, Newer};

pub(super) const SYS_STATMOUNT: libc::c_long = 457;

pub(super) const STATMOUNT_SB_BASIC: u64 = 0x1;
pub(super) const STATMOUNT_MNT_BASIC: u64 = 0x2;
pub(super) const STATMOUNT_MNT_ROOT: u64 = 0x8;
const STATMOUNT_MNT_POINT: u64 = 0x10;
pub(super) const STATMOUNT_FS_TYPE: u64 = 0x20;
/// The superblock's options (Linux 6.11+): where ext4 reports `emergency_ro`.
const STATMOUNT_MNT_OPTS: u64 = 0x80;

const MOUNT_ATTR_RDONLY: u64 = 0x1;
const MOUNT_ATTR_NOSUID: u64 = 0x2;
const MOUNT_ATTR_NODEV: u64 = 0x4;
const MOUNT_ATTR_NOEXEC: u64 = 0x8;
const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;
const SB_RDONLY: u32 = 0x1;

/// `struct mnt_id_req`, version 0 (24 bytes).
#[repr(C)]
struct MntIdReq {
    size: u32,
    spare: u32,
    mnt_id: u64,
    param: u64,
}

/// The request's size, as the kernel reads it (24 bytes: MNT_ID_REQ_SIZE_VER0).
#[allow(clippy::cast_possible_truncation)]
const REQ_SIZE: u32 = std::mem::size_of::<MntIdReq>() as u32;

/// The fixed head of `struct statmount` (512 bytes, padded by the kernel's spare words); the
/// strings follow it, addressed by offsets into the area after the head.
pub(super) const HEAD: usize = 512;
pub(super) const OFF_SIZE: usize = 0;
const OFF_MNT_OPTS: usize = 4;
pub(super) const OFF_MASK: usize = 8;
pub(super) const OFF_DEV_MAJOR: usize = 16;
pub(super) const OFF_DEV_MINOR: usize = 20;
const OFF_SB_FLAGS: usize = 32;
pub(super) const OFF_FS_TYPE: usize = 36;
const OFF_MNT_ID_OLD: usize = 56;
const OFF_MNT_ATTR: usize = 64;
pub(super) const OFF_MNT_ROOT: usize = 104;
const OFF_MNT_POINT: usize = 108;

/// What statmount tells of one mount.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Statmount {
    pub dev: DevNum,
    pub fs_type: String,
    /// The path inside the filesystem that is mounted ("/" unless a bind of a subdirectory).
    pub root: PathBuf,
    pub mount_point: PathBuf,
    /// The mount is read-only (MOUNT_ATTR_RDONLY).
    pub read_only: bool,
    /// Its nosuid, nodev and noexec, as mount(2)'s bits.
    pub vfs_bits: u64,
    /// Its files' owners shown through an id mapping.
    pub idmapped: bool,
    /// The mount's old (reusable) id, as /proc/self/mountinfo names it.
    pub old_id: u64,
    /// The whole filesystem is read-only (after errors, every mount of it is).
    pub super_read_only: bool,
    /// The superblock's options, where the kernel gives them (6.11+).
    pub options: Option<String>,
}

/// `Ok(None)` when statmount is not available here (an old kernel's ENOSYS, or a seccomp filter's
/// deny: see `sandbox`) or the kernel does not know the id's kind (EINVAL: an id that is not a
/// unique mount id, before 6.8). Its other errors (ENOENT: the mount is gone) are answers.
pub fn statmount(mnt_id: u64) -> io::Result<Option<Statmount>> {
    if !sandbox::usable(Newer::Statmount) {
        return Ok(None);
    }
    let mut buf = vec![0u8; 4096];
    loop {
        let req = MntIdReq {
            size: REQ_SIZE,
            spare: 0,
            mnt_id,
            param: STATMOUNT_SB_BASIC
                | STATMOUNT_MNT_BASIC
                | STATMOUNT_MNT_ROOT
                | STATMOUNT_MNT_POINT
                | STATMOUNT_FS_TYPE
                | STATMOUNT_MNT_OPTS,
        };
        // SAFETY: `req` is a valid mnt_id_req v0 whose `size` says so; `buf` is writable for
        // `buf.len()` bytes, which is the size passed, and outlives the call. The kernel writes at
        // most that many bytes (EOVERFLOW if the answer does not fit).
        let rc = unsafe {
            libc::syscall(
                SYS_STATMOUNT,
                &req as *const MntIdReq,
                buf.as_mut_ptr(),
                buf.len(),
                0u32,
            )
        };
        if rc == 0 {
            return Ok(Some(parse(&buf)?));
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EOVERFLOW) if buf.len() < 1 << 20 => buf.resize(buf.len() * 4, 0),
            Some(libc::EINVAL) => return Ok(None),
            e if sandbox::unavailable(Newer::Statmount, e) => return Ok(None),
            _ => return Err(err),
        }
    }
}

pub(super) fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_ne_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

pub(super) fn u64_at(b: &[u8], off: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[off..off + 8]);
    u64::from_ne_bytes(x)
}

/// Parses the kernel's answer, checking every offset against the size it reported.
pub fn parse(buf: &[u8]) -> io::Result<Statmount> {
    let bad = |why: &str| io::Error::new(io::ErrorKind::InvalidData, format!("statmount: {why}"));
    if buf.len() < HEAD {
        return Err(bad("short answer"));
    }
    let size = (u32_at(buf, OFF_SIZE) as usize).min(buf.len());
    if size < HEAD {
        return Err(bad("short answer"));
    }
    let mask = u64_at(buf, OFF_MASK);
    let wanted = STATMOUNT_SB_BASIC
        | STATMOUNT_MNT_BASIC
        | STATMOUNT_MNT_ROOT
        | STATMOUNT_MNT_POINT
        | STATMOUNT_FS_TYPE;
    if mask & wanted != wanted {
        return Err(bad("the kernel left out facts that were asked for"));
    }
    let strings = &buf[HEAD..size];
    let string = |off: usize| -> io::Result<&[u8]> {
        let start = u32_at(buf, off) as usize;
        let tail = strings
            .get(start..)
            .ok_or_else(|| bad("string offset out of range"))?;
        let end = tail
            .iter()
            .position(|&c| c == 0)
            .ok_or_else(|| bad("unterminated string"))?;
        Ok(&tail[..end])
    };
    use std::os::unix::ffi::OsStrExt;
    let path = |b: &[u8]| PathBuf::from(std::ffi::OsStr::from_bytes(b));
    let options = if mask & STATMOUNT_MNT_OPTS != 0 {
        Some(String::from_utf8_lossy(string(OFF_MNT_OPTS)?).into_owned())
    } else {
        None
    };
    Ok(Statmount {
        options,
        dev: DevNum::new(u32_at(buf, OFF_DEV_MAJOR), u32_at(buf, OFF_DEV_MINOR)),
        fs_type: String::from_utf8_lossy(string(OFF_FS_TYPE)?).into_owned(),
        root: path(string(OFF_MNT_ROOT)?),
        mount_point: path(string(OFF_MNT_POINT)?),
        read_only: u64_at(buf, OFF_MNT_ATTR) & MOUNT_ATTR_RDONLY != 0,
        vfs_bits: vfs_bits(u64_at(buf, OFF_MNT_ATTR)),
        idmapped: u64_at(buf, OFF_MNT_ATTR) & MOUNT_ATTR_IDMAP != 0,
        old_id: u64::from(u32_at(buf, OFF_MNT_ID_OLD)),
        super_read_only: u32_at(buf, OFF_SB_FLAGS) & SB_RDONLY != 0,
    })
}

/// The MOUNT_ATTR_* bits of `attr` that stand for nosuid, nodev and noexec, as MS_* bits.
fn vfs_bits(attr: u64) -> u64 {
    use ebs_node_core::request::ms;
    [
        (MOUNT_ATTR_NOSUID, ms::NOSUID),
        (MOUNT_ATTR_NODEV, ms::NODEV),
        (MOUNT_ATTR_NOEXEC, ms::NOEXEC),
    ]
    .iter()
    .filter(|(a, _)| attr & a != 0)
    .fold(0, |bits, (_, m)| bits | m)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(strings: &[&str]) -> Vec<u8> {
        let mut b = vec![0u8; HEAD];
        let mut offs = Vec::new();
        let mut area = Vec::new();
        for s in strings {
            offs.push(u32::try_from(area.len()).unwrap());
            area.extend_from_slice(s.as_bytes());
            area.push(0);
        }
        b.extend_from_slice(&area);
        let size = u32::try_from(b.len()).unwrap();
        b[0..4].copy_from_slice(&size.to_ne_bytes());
        b[8..16].copy_from_slice(&0x3fu64.to_ne_bytes());
        b[16..20].copy_from_slice(&7u32.to_ne_bytes());
        b[20..24].copy_from_slice(&3u32.to_ne_bytes());
        b[64..72].copy_from_slice(&1u64.to_ne_bytes());
        b[36..40].copy_from_slice(&offs[0].to_ne_bytes());
        b[104..108].copy_from_slice(&offs[1].to_ne_bytes());
        b[108..112].copy_from_slice(&offs[2].to_ne_bytes());
        b
    }

    #[test]
    fn parses_a_well_formed_answer() {
        let m = parse(&answer(&["ext4", "/", "/var/lib/x"])).unwrap();
        assert_eq!(m.dev, DevNum::new(7, 3));
        assert_eq!(m.fs_type, "ext4");
        assert_eq!(m.root, PathBuf::from("/"));
        assert_eq!(m.mount_point, PathBuf::from("/var/lib/x"));
        assert!(m.read_only && !m.super_read_only);
    }

    #[test]
    fn refuses_offsets_out_of_range_and_short_answers() {
        let mut b = answer(&["ext4", "/", "/x"]);
        b[104..108].copy_from_slice(&9999u32.to_ne_bytes());
        assert!(parse(&b).is_err());
        assert!(parse(&b[..100]).is_err());
        let mut b = answer(&["ext4", "/", "/x"]);
        let n = b.len();
        b[n - 1] = b'x';
        assert!(parse(&b).is_err(), "unterminated last string");
    }

    #[test]
    fn the_root_mount_answers_on_this_kernel() {
        let Ok(st) = rustix::fs::statx(
            rustix::fs::CWD,
            "/proc/self",
            rustix::fs::AtFlags::empty(),
            rustix::fs::StatxFlags::from_bits_retain(crate::anchor::STATX_MNT_ID_UNIQUE),
        ) else {
            return;
        };
        let unique = rustix::fs::StatxFlags::from_bits_retain(st.stx_mask).contains(
            rustix::fs::StatxFlags::from_bits_retain(crate::anchor::STATX_MNT_ID_UNIQUE),
        );
        if !unique {
            return; // before 6.8: nothing to ask
        }
        let m = statmount(st.stx_mnt_id)
            .unwrap()
            .expect("statmount on 6.8+");
        assert!(
            !m.fs_type.is_empty() && m.mount_point.is_absolute(),
            "{m:?}"
        );
    }
}
