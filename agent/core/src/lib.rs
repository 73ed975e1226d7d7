//! The node plugin's core: what a CSI request means once it is checked, free of the wire and of
//! the host. It links neither tonic nor libc and holds no `unsafe`; the gRPC door (the daemon)
//! parses into these types, and the host crate acts on them.

#![forbid(unsafe_code)]

pub mod blank;
pub mod config;
pub mod format;
pub mod probe;
pub mod request;
pub mod steps;
