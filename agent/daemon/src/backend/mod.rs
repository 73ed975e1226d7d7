//! Backends turn a volume id into a block device and prove that the device is the volume.

pub mod ebs;
pub mod local;
pub mod loopback;

pub use ebs_node_core::node::backend::{
    Backend, NotProven, ResolvedDevice, Shown, describe_identity, proves,
};
