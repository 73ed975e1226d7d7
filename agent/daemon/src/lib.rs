//! ebs-node-agent: a crash-safe CSI node plugin for AWS EBS, any block device, or loop files.
//! The daemon: the gRPC doors, the node pipeline wired to the host and the backends (crates of
//! their own), and the command line's one-shot commands (`commands`). Every `unsafe` line lives
//! in the host crate (ebs-node-host).

#![forbid(unsafe_code)]

pub mod authority_fix;
pub mod cli;
pub mod commands;
pub mod connections;
pub mod endpoint;
pub mod error;
pub mod fd_budget;
pub mod grpc;
pub mod health;
pub mod inventory;
pub mod kube_duties;
pub mod logging;
pub mod metrics;
pub mod node;
pub mod nodeinfo;
pub mod notify;
pub mod server;
pub mod settings;
pub mod test_hooks;
pub mod upstream;
pub mod upstream_cli;
