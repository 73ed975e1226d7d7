//! The node plugin's core: what a CSI request means once it is checked, and the node pipeline
//! (`node`) that acts on it through its seams (`node::host::HostOps`, `ledger::Ledger`,
//! `node::backend::Backend`), free of the wire and of the host. It links neither tonic nor libc
//! and holds no `unsafe`; the daemon parses requests into these types and wires in the real host,
//! store and backends.

#![forbid(unsafe_code)]
// Sizes, offsets and device numbers are handled here: a cast that could truncate, wrap or drop
// a sign is refused (a try_from, or an allow that says why the value fits).
#![deny(
    clippy::cast_possible_truncation,
    clippy::cast_possible_wrap,
    clippy::cast_sign_loss,
    clippy::cast_lossless
)]

pub mod blank;
pub mod config;
pub mod deadline;
mod devnum;
// The recording double of the host: the core's tests, and with the `double` feature the daemon's
// table tests (a dev-dependency's feature: never in a release build).
#[cfg(any(test, feature = "double"))]
pub mod double;
pub mod ec2;
pub mod error;
pub mod format;
pub mod ledger;
pub mod node;
pub mod probe;
pub mod records;
pub mod request;
pub mod seam;
pub mod steps;

pub use devnum::DevNum;
