//! NVMe admin passthrough (`NVME_IOCTL_ADMIN_CMD`): Get Log Page, for the vendor page in which EBS
//! publishes a volume's performance statistics (`ebs_page`). One ioctl, no exec.
//!
//! The ioctl works on a namespace's block device (`/dev/nvme1n1`, the path the agent already
//! knows) as well as on the controller's character device, and needs CAP_SYS_ADMIN.

pub mod ebs_page;
pub mod page_reads;

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::Duration;

use nix::errno::Errno;

/// NVMe admin opcode of Get Log Page (NVMe base specification, admin command set).
pub const OPCODE_GET_LOG_PAGE: u8 = 0x02;

/// Mirror of the kernel's `struct nvme_passthru_cmd` (include/uapi/linux/nvme_ioctl.h), which
/// `NVME_IOCTL_ADMIN_CMD` takes as `struct nvme_admin_cmd`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NvmeAdminCmd {
    pub opcode: u8,
    pub flags: u8,
    pub rsvd1: u16,
    pub nsid: u32,
    pub cdw2: u32,
    pub cdw3: u32,
    pub metadata: u64,
    pub addr: u64,
    pub metadata_len: u32,
    pub data_len: u32,
    pub cdw10: u32,
    pub cdw11: u32,
    pub cdw12: u32,
    pub cdw13: u32,
    pub cdw14: u32,
    pub cdw15: u32,
    pub timeout_ms: u32,
    pub result: u32,
}

// The kernel copies exactly this many bytes in and out: a mismatch would corrupt the stack.
const _: () = assert!(std::mem::size_of::<NvmeAdminCmd>() == 72);

mod sys {
    // NVME_IOCTL_ADMIN_CMD = _IOWR('N', 0x41, struct nvme_admin_cmd) = 0xC0484E41.
    nix::ioctl_readwrite!(nvme_admin_cmd, b'N', 0x41, super::NvmeAdminCmd);
}

/// Why a log page could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The device node could not be opened.
    #[error("opening {device}: {source}")]
    Open { device: String, source: io::Error },
    /// The kernel refused the passthrough: ENOTTY/EINVAL (not an NVMe device), EPERM/EACCES
    /// (no CAP_SYS_ADMIN), EINTR or ETIMEDOUT (the command timed out), ...
    #[error("NVMe admin ioctl: {0}")]
    Ioctl(Errno),
    /// The controller completed the command with an error status (status code type and code,
    /// with the Do Not Retry bit): e.g. 0x4002, Invalid Field, for a page it does not implement.
    #[error("the controller answered NVMe status {0:#06x}")]
    Status(u32),
    /// Asked for an empty page, or one whose length is not a whole number of dwords.
    #[error("a log page of {0} bytes cannot be asked for (a positive multiple of 4)")]
    Length(usize),
}

/// The Get Log Page command for `buf.len()` bytes of page `lid` of namespace `nsid`, from offset
/// 0, into the memory at `addr`. NUMD, the number of dwords minus one, is split over CDW10 bits
/// 31:16 (lower half) and CDW11 bits 15:0 (upper half).
pub fn log_page_command(
    nsid: u32,
    lid: u8,
    len: usize,
    addr: u64,
    timeout: Duration,
) -> Result<NvmeAdminCmd, ReadError> {
    let data_len = u32::try_from(len).map_err(|_| ReadError::Length(len))?;
    if len == 0 || !len.is_multiple_of(4) {
        return Err(ReadError::Length(len));
    }
    let numd = data_len / 4 - 1;
    Ok(NvmeAdminCmd {
        opcode: OPCODE_GET_LOG_PAGE,
        nsid,
        addr,
        data_len,
        cdw10: u32::from(lid) | ((numd & 0xffff) << 16),
        cdw11: numd >> 16,
        timeout_ms: u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX),
        ..NvmeAdminCmd::default()
    })
}

/// Fills `buf` with log page `lid` of namespace `nsid`. `timeout` bounds the command in the
/// kernel; when it expires the kernel aborts it, which for the admin queue means resetting the
/// controller, so callers give it room and keep their own, shorter deadline (see the metrics).
pub fn get_log_page(
    dev: impl AsFd,
    nsid: u32,
    lid: u8,
    buf: &mut [u8],
    timeout: Duration,
) -> Result<(), ReadError> {
    let addr = buf.as_mut_ptr() as u64;
    let mut cmd = log_page_command(nsid, lid, buf.len(), addr, timeout)?;
    // SAFETY: the descriptor is open for the whole call; `cmd` is a live, initialised repr(C)
    // mirror of struct nvme_passthru_cmd (size checked above) that the kernel reads and writes
    // back; `cmd.addr`/`cmd.data_len` describe `buf`, which is exclusively borrowed, writable
    // for exactly `data_len` bytes and outlives the call. The ioctl is synchronous: the kernel
    // unmaps the buffer before it returns, on success, error status and timeout alike.
    let status = unsafe { sys::nvme_admin_cmd(dev.as_fd().as_raw_fd(), &mut cmd) }
        .map_err(ReadError::Ioctl)?;
    match status {
        0 => Ok(()),
        s => Err(ReadError::Status(s.cast_unsigned())), // NVMe status bits, as the kernel gave them
    }
}

/// Opens `device` read-only (an admin command needs no write access, and a read-only open of a
/// block device disturbs nothing) and reads `len` bytes of page `lid` of namespace `nsid`.
pub fn read_log_page(
    device: &Path,
    nsid: u32,
    lid: u8,
    len: usize,
    timeout: Duration,
) -> Result<Vec<u8>, ReadError> {
    let file = File::options()
        .read(true)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOCTTY)
        .open(device)
        .map_err(|source| ReadError::Open {
            device: device.display().to_string(),
            source,
        })?;
    let mut buf = vec![0u8; len];
    get_log_page(&file, nsid, lid, &mut buf, timeout)?;
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_code_matches_the_kernel() {
        assert_eq!(
            nix::request_code_readwrite!(b'N', 0x41, std::mem::size_of::<NvmeAdminCmd>()) as u64,
            0xC048_4E41
        );
    }

    #[test]
    fn numd_is_the_dword_count_minus_one() {
        let cmd = log_page_command(1, 0xD0, 4096, 0x1000, Duration::from_secs(10)).unwrap();
        assert_eq!(cmd.opcode, 0x02);
        assert_eq!(cmd.nsid, 1);
        assert_eq!(cmd.data_len, 4096);
        // 1024 dwords: NUMD 1023 (zero-based), lower half in CDW10 31:16, log id in 7:0.
        assert_eq!(cmd.cdw10, 0x03FF_00D0);
        assert_eq!(cmd.cdw11, 0);
        assert_eq!(cmd.cdw12, 0, "offset 0");
        assert_eq!(cmd.addr, 0x1000);
        assert_eq!(cmd.timeout_ms, 10_000);
        // Past 256 KiB the upper half of NUMD goes to CDW11.
        let big = log_page_command(1, 0x02, 512 * 1024, 0, Duration::ZERO).unwrap();
        assert_eq!(big.cdw10 >> 16, 0xFFFF);
        assert_eq!(big.cdw11, 1);
        for bad in [0, 6] {
            assert!(matches!(
                log_page_command(1, 0xD0, bad, 0, Duration::ZERO),
                Err(ReadError::Length(_))
            ));
        }
    }

    #[test]
    fn a_device_without_nvme_passthrough_says_so() {
        // /dev/null implements no NVMe ioctl: the kernel answers ENOTTY, nothing is written.
        let null = File::open("/dev/null").unwrap();
        let mut buf = [7u8; 64];
        let err = get_log_page(&null, 1, 0xD0, &mut buf, Duration::from_secs(1)).unwrap_err();
        assert!(matches!(err, ReadError::Ioctl(Errno::ENOTTY)), "{err}");
        assert!(buf.iter().all(|b| *b == 7));
        let missing = read_log_page(
            Path::new("/nonexistent/nvme9n1"),
            1,
            0xD0,
            4096,
            Duration::from_secs(1),
        );
        assert!(matches!(missing, Err(ReadError::Open { .. })));
    }
}
