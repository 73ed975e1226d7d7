//! The host: every syscall, ioctl and FFI call the agent makes, and the external tools it runs.
//! The only crate of the workspace allowed `unsafe`, one module at a time (below); each block
//! carries its SAFETY invariant. It knows the core's request types and nothing of gRPC.

// Sizes, offsets and device numbers are handled here: a cast that could truncate, wrap or drop
// a sign is refused (a try_from, or an allow that says why the value fits).
#![deny(
    clippy::cast_possible_truncation,
    clippy::cast_possible_wrap,
    clippy::cast_sign_loss,
    clippy::cast_lossless
)]

pub mod anchor;
pub mod attachment;
pub mod blank;
#[allow(unsafe_code)] // FFI / ioctl / syscall wrapper
pub mod blkid;
#[allow(unsafe_code)] // FFI / ioctl / syscall wrapper
pub mod command;
pub mod device;
pub mod device_binds;
pub mod direct_read;
pub mod file_copy;
pub mod flight;
#[allow(unsafe_code)] // FFI / ioctl / syscall wrapper
pub mod freeze;
pub mod fs_limits;
#[allow(unsafe_code)] // FFI / ioctl / syscall wrapper
pub mod fs_size;
pub mod fs_usage;
pub mod fstools;
pub mod instance;
#[allow(unsafe_code)] // FFI / ioctl / syscall wrapper
pub mod loopdev;
#[allow(unsafe_code)] // FFI / ioctl / syscall wrapper
pub mod malloc;
pub mod mkfs_args;
pub mod mount;
#[allow(unsafe_code)] // FFI / ioctl / syscall wrapper
pub mod nsfs;
#[allow(unsafe_code)] // FFI / ioctl / syscall wrapper
pub mod nvme;
pub mod private;
pub mod raw_use;
pub mod read_probe;
pub mod ready;
pub mod real_host;
#[allow(unsafe_code)] // FFI / ioctl / syscall wrapper
pub mod sandbox;
#[allow(unsafe_code)] // FFI / ioctl / syscall wrapper
pub mod trim;

/// The core crate carries mount(2)'s flag bits without libc (`request::ms`); they are the
/// kernel's ABI, held equal to libc's here.
#[cfg(test)]
mod abi {
    use ebs_node_core::request::ms;

    #[test]
    fn the_cores_mount_flags_are_libcs() {
        assert_eq!(ms::RDONLY, libc::MS_RDONLY);
        assert_eq!(ms::NOSUID, libc::MS_NOSUID);
        assert_eq!(ms::NODEV, libc::MS_NODEV);
        assert_eq!(ms::NOEXEC, libc::MS_NOEXEC);
        assert_eq!(ms::SYNCHRONOUS, libc::MS_SYNCHRONOUS);
        assert_eq!(ms::DIRSYNC, libc::MS_DIRSYNC);
        assert_eq!(ms::NOATIME, libc::MS_NOATIME);
        assert_eq!(ms::NODIRATIME, libc::MS_NODIRATIME);
        assert_eq!(ms::RELATIME, libc::MS_RELATIME);
        assert_eq!(ms::STRICTATIME, libc::MS_STRICTATIME);
        assert_eq!(ms::LAZYTIME, libc::MS_LAZYTIME);
    }
}
