//! ebs-node-agent's tools that talk to an agent from outside: the CSI client (`client`) and its
//! bench. The binary links them for the `client` subcommand (and `status` uses its connection);
//! nothing here runs while it serves. The bench prepares its loop devices and measures the bare
//! host's floor through the host crate, as the agent would.

#![forbid(unsafe_code)]

pub mod client;
