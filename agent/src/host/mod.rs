pub mod anchor;
pub mod attachment;
pub mod blank;
#[allow(unsafe_code)] // FFI / ioctl / syscall wrapper
pub mod blkid;
#[allow(unsafe_code)] // FFI / ioctl / syscall wrapper
pub mod command;
pub mod device;
pub mod direct_read;
pub mod file_copy;
#[allow(unsafe_code)] // FFI / ioctl / syscall wrapper
pub mod freeze;
pub mod fs_limits;
#[allow(unsafe_code)] // FFI / ioctl / syscall wrapper
pub mod fs_size;
pub mod fstools;
#[allow(unsafe_code)] // FFI / ioctl / syscall wrapper
pub mod loopdev;
#[allow(unsafe_code)] // FFI / ioctl / syscall wrapper
pub mod malloc;
pub mod mkfs_args;
#[allow(unsafe_code)] // FFI / ioctl / syscall wrapper
pub mod mount_api;
pub mod mounter;
pub mod mountinfo;
pub mod mounts;
#[allow(unsafe_code)] // FFI / ioctl / syscall wrapper
pub mod nvme;
pub mod private;
pub mod private_bind;
#[allow(unsafe_code)] // FFI / ioctl / syscall wrapper
pub mod sandbox;
#[allow(unsafe_code)] // FFI / ioctl / syscall wrapper
pub mod statmount;
#[allow(unsafe_code)] // FFI / ioctl / syscall wrapper
pub mod trim;
