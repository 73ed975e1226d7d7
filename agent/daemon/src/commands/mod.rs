//! The command line's one-shot commands: each runs and exits, never inside the serving daemon.
//! `recover` (an operator's repair of a stopped agent's records; start-up recovery is
//! `node::recovery`), `status` (what an agent has staged and published), `doctor` (what this
//! host can do), `ebs_stats` (an EBS device's NVMe statistics), `print_config`. The CSI client
//! and its bench are a crate of their own (ebs-node-tools).

pub mod doctor;
pub mod ebs_stats;
pub mod print_config;
pub mod recover;
pub mod status;
