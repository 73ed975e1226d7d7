//! Mounts: making and removing them, and asking what is mounted where.
//! - `ops`: mount, bind and unmount, each on a held fd (the only module that changes mounts);
//! - `at_path`: what is mounted at one path, asked of the kernel about that path alone;
//! - `table`: the parser of /proc/self/mountinfo, for the few callers that need every mount;
//! - `setattr`, `statmount`: the two syscalls libc does not wrap (FFI);
//! - `foreign`: listmount and statmount of another namespace's mounts, by its id (FFI);
//! - `private_bind`: the read-only bind without the new mount API.

pub mod at_path;
pub mod copies;
#[allow(unsafe_code)] // FFI / ioctl / syscall wrapper
pub mod foreign;
pub mod ops;
pub mod private_bind;
#[allow(unsafe_code)] // FFI / ioctl / syscall wrapper
pub mod setattr;
#[allow(unsafe_code)] // FFI / ioctl / syscall wrapper
pub mod statmount;
pub mod table;
