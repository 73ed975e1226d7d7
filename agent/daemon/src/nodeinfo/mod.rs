//! The node's identity as the daemon finds it: the readers (flags, DMI, instance metadata, the
//! live attach limit) are the backends crate's `nodeinfo`; here, running them at start and in
//! the background, and what that tells the health probe.

pub mod sources;
