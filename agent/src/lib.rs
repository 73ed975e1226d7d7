//! ebs-node-agent: a crash-safe CSI node plugin for AWS EBS, any block device, or loop files.
//! The daemon and its tools; every `unsafe` line lives in the host crate (ebs-node-host).

#![forbid(unsafe_code)]

pub mod authority_fix;
pub mod backend;
pub mod cli;

pub mod connections;
pub mod doctor;
pub mod ebs_stats;
pub mod endpoint;
pub mod error;
pub mod fd_budget;
#[doc(hidden)]
pub mod fuzzing;
pub mod grpc;
pub mod health;

pub mod inventory;
pub mod kube_duties;
pub mod logging;
pub mod metrics;
pub mod node;
pub mod nodeinfo;
pub mod notify;
pub mod print_config;
pub mod recover;

pub mod server;
pub mod settings;
pub mod status;
pub mod test_hooks;
pub mod upstream;
pub mod upstream_cli;
