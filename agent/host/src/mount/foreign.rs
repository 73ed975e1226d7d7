//! The mounts of another mount namespace, asked of the kernel by the namespace's id (listmount and
//! statmount with `mnt_ns_id`, Linux 6.11), whatever covers what: a thread inside a namespace
//! sees only what its root, the top of the mounts stacked on the namespace's root, reaches.
//!
//! Only the facts a device's use needs are asked (the superblock's device, the filesystem's type,
//! the mount's parent and old id, and the path inside the filesystem, up to 64 KiB): never the
//! mount point, whose length a user namespace's deep directories make unbounded (an answer past
//! 1 MiB failed every scan: a forty-fifth fresh review's F5).
//!
//! FFI: the syscalls and `struct mnt_id_req` v1 are mirrored here (libc has neither).

use std::io;
use std::path::PathBuf;

use ebs_node_core::DevNum;

use super::statmount::{
    HEAD, OFF_DEV_MAJOR, OFF_DEV_MINOR, OFF_FS_TYPE, OFF_MASK, OFF_MNT_ROOT, OFF_SIZE,
    STATMOUNT_FS_TYPE, STATMOUNT_MNT_BASIC, STATMOUNT_MNT_ROOT, STATMOUNT_SB_BASIC, SYS_STATMOUNT,
    u32_at, u64_at,
};
use crate::sandbox::{self, Newer};

const SYS_LISTMOUNT: libc::c_long = 458;
const OFF_MNT_ID: usize = 40;
const OFF_MNT_PARENT_ID: usize = 48;
const OFF_MNT_ID_OLD: usize = 56;
/// The largest answer taken: a path inside the device filesystem is short.
const MAX_ANSWER: usize = 64 << 10;

/// `struct mnt_id_req`, version 1 (32 bytes): with the namespace to ask about.
#[repr(C)]
struct MntIdReqV1 {
    size: u32,
    spare: u32,
    mnt_id: u64,
    param: u64,
    mnt_ns_id: u64,
}

#[allow(clippy::cast_possible_truncation)]
const REQ_SIZE_V1: u32 = std::mem::size_of::<MntIdReqV1>() as u32;

/// What is asked of one mount.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mount {
    pub id: u64,
    pub parent: u64,
    pub dev: DevNum,
    pub fs_type: String,
    /// The path inside the filesystem (a bind of a device node has the node there); `None`
    /// where it is longer than an answer is taken (then it is no filesystem's "/").
    pub root: Option<PathBuf>,
}

/// The mount `mnt_id` of the namespace `ns_id`; `Ok(None)`: not available here (before 6.11, or a
/// filter). ENOENT: the mount is gone.
pub fn mount_of(mnt_id: u64, ns_id: u64) -> io::Result<Option<Mount>> {
    if !sandbox::usable(Newer::Statmount) {
        return Ok(None);
    }
    let Some(basic) = ask(
        mnt_id,
        ns_id,
        STATMOUNT_SB_BASIC | STATMOUNT_MNT_BASIC | STATMOUNT_FS_TYPE,
    )?
    else {
        return Ok(None);
    };
    let mut m = parse(&basic)?;
    let with_root = match ask(mnt_id, ns_id, STATMOUNT_MNT_ROOT) {
        Ok(Some(with_root)) => with_root,
        Ok(None) => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::EOVERFLOW) => return Ok(Some(m)),
        Err(e) => return Err(e),
    };
    if u64_at(&with_root, OFF_MASK) & STATMOUNT_MNT_ROOT == 0 {
        return Err(bad("the kernel left out the mount's root"));
    }
    use std::os::unix::ffi::OsStringExt;
    let root = string_at(&with_root, OFF_MNT_ROOT)?;
    m.root = Some(PathBuf::from(std::ffi::OsString::from_vec(root)));
    Ok(Some(m))
}

/// The old (32-bit, `/proc/*/mountinfo`'s) id of the mount `mnt_id` of the namespace `ns_id`
/// (0: the caller's); `Ok(None)`: not available here. ENOENT: the mount is gone.
pub fn old_id_of(mnt_id: u64, ns_id: u64) -> io::Result<Option<u32>> {
    if !sandbox::usable(Newer::Statmount) {
        return Ok(None);
    }
    let Some(basic) = ask(mnt_id, ns_id, STATMOUNT_MNT_BASIC)? else {
        return Ok(None);
    };
    if basic.len() < HEAD || u64_at(&basic, OFF_MASK) & STATMOUNT_MNT_BASIC == 0 {
        return Err(bad("the kernel left out the mount's ids"));
    }
    Ok(Some(u32_at(&basic, OFF_MNT_ID_OLD)))
}

/// Every mount of the namespace `ns_id` below the mount `root_id` (its whole tree, in id order),
/// `root_id` not included; `Ok(None)`: not available here.
pub fn ids_below(root_id: u64, ns_id: u64) -> io::Result<Option<Vec<u64>>> {
    if !sandbox::usable(Newer::Listmount) {
        return Ok(None);
    }
    let mut ids = Vec::new();
    let mut page = vec![0u64; 512];
    loop {
        let req = MntIdReqV1 {
            size: REQ_SIZE_V1,
            spare: 0,
            mnt_id: root_id,
            param: ids.last().copied().unwrap_or(0),
            mnt_ns_id: ns_id,
        };
        // SAFETY: `req` is a valid mnt_id_req v1 whose `size` says so; `page` is writable for
        // `page.len()` ids, the count passed, and outlives the call; the kernel writes at most
        // that many.
        let rc = unsafe {
            libc::syscall(
                SYS_LISTMOUNT,
                &req as *const MntIdReqV1,
                page.as_mut_ptr(),
                page.len(),
                0u32,
            )
        };
        let Ok(n) = usize::try_from(rc) else {
            let err = io::Error::last_os_error();
            return match err.raw_os_error() {
                // A kernel before 6.11 takes no namespace id (E2BIG on the longer request).
                Some(libc::EINVAL | libc::E2BIG) => Ok(None),
                e if sandbox::unavailable(Newer::Listmount, e) => Ok(None),
                _ => Err(err),
            };
        };
        let n = n.min(page.len());
        ids.extend_from_slice(&page[..n]);
        if n < page.len() {
            return Ok(Some(ids));
        }
    }
}

/// statmount(2) of `mnt_id` in the namespace `ns_id`, asking `mask`.
fn ask(mnt_id: u64, ns_id: u64, mask: u64) -> io::Result<Option<Vec<u8>>> {
    let mut buf = vec![0u8; 4096];
    loop {
        let req = MntIdReqV1 {
            size: REQ_SIZE_V1,
            spare: 0,
            mnt_id,
            param: mask,
            mnt_ns_id: ns_id,
        };
        // SAFETY: `req` is a valid mnt_id_req v1 whose `size` says so; `buf` is writable for
        // `buf.len()` bytes, the size passed, and outlives the call; the kernel writes at most
        // that many (EOVERFLOW if the answer does not fit).
        let rc = unsafe {
            libc::syscall(
                SYS_STATMOUNT,
                &req as *const MntIdReqV1,
                buf.as_mut_ptr(),
                buf.len(),
                0u32,
            )
        };
        if rc == 0 {
            return Ok(Some(buf));
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EOVERFLOW) if buf.len() < MAX_ANSWER => buf.resize(buf.len() * 4, 0),
            Some(libc::EINVAL | libc::E2BIG) => return Ok(None),
            e if sandbox::unavailable(Newer::Statmount, e) => return Ok(None),
            _ => return Err(err),
        }
    }
}

fn bad(why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("statmount: {why}"))
}

fn parse(buf: &[u8]) -> io::Result<Mount> {
    if buf.len() < HEAD || (u32_at(buf, OFF_SIZE) as usize) < HEAD {
        return Err(bad("short answer"));
    }
    let wanted = STATMOUNT_SB_BASIC | STATMOUNT_MNT_BASIC | STATMOUNT_FS_TYPE;
    if u64_at(buf, OFF_MASK) & wanted != wanted {
        return Err(bad("the kernel left out facts that were asked for"));
    }
    Ok(Mount {
        id: u64_at(buf, OFF_MNT_ID),
        parent: u64_at(buf, OFF_MNT_PARENT_ID),
        dev: DevNum::new(u32_at(buf, OFF_DEV_MAJOR), u32_at(buf, OFF_DEV_MINOR)),
        fs_type: String::from_utf8_lossy(&string_at(buf, OFF_FS_TYPE)?).into_owned(),
        root: None,
    })
}

/// The string whose offset is at `off`, checked against the size the kernel reported.
fn string_at(buf: &[u8], off: usize) -> io::Result<Vec<u8>> {
    let size = (u32_at(buf, OFF_SIZE) as usize).min(buf.len());
    let start = u32_at(buf, off) as usize;
    let tail = buf
        .get(HEAD..size)
        .and_then(|s| s.get(start..))
        .ok_or_else(|| bad("string offset out of range"))?;
    let end = tail
        .iter()
        .position(|&c| c == 0)
        .ok_or_else(|| bad("unterminated string"))?;
    Ok(tail[..end].to_vec())
}
