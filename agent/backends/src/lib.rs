//! The backends: each turns a volume id into a block device and proves that the device is the
//! volume (the core's `node::backend::Backend`), over the host crate. `loopback`: files below
//! the state directory on loop devices, with its controller; `ebs`: EBS volumes on NVMe (and,
//! with `--allow-unverified-devices`, disks without a serial); `local`: node-local handles
//! (`local-ebs://dev/...`) in front of either.

pub mod ebs;
pub mod kubelet_names;
pub mod local;
pub mod loopback;
pub mod nodeinfo;
