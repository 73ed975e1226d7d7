//! The settings' vocabulary shared by the command line and the modules it configures: modes,
//! backends, protocol versions, the default locations (duration parsing and the default
//! endpoint are the core's, shared with the client). It depends on nothing in the crate, so
//! `cli`, `upstream` and `status` all sit above it.

use clap::ValueEnum;

// The pure parts (the default endpoint, `parse_duration`) live in the core crate
// (`ebs_node_core::config`), so the client (ebs-node-tools) shares them.

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    All,
    Node,
    Controller,
}

impl Mode {
    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Mode::All => "all",
            Mode::Node => "node",
            Mode::Controller => "controller",
        }
    }
    pub fn serves_node(self) -> bool {
        matches!(self, Mode::All | Mode::Node)
    }
    pub fn serves_controller(self) -> bool {
        matches!(self, Mode::All | Mode::Controller)
    }
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendKind {
    Ebs,
    Loop,
}

impl BackendKind {
    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Ebs => "ebs",
            BackendKind::Loop => "loop",
        }
    }
}

/// A CSI protocol version the socket can serve (each under its own gRPC package).
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum CsiVersion {
    /// CSI 1.x (`csi.v1`): Kubernetes, Nomad, Mesos 1.8+.
    #[value(name = "v1")]
    V1,
    /// CSI 0.2 and 0.3 (`csi.v0`): Mesos 1.6-1.7, Mesos 1.8+ as fallback, older Kubernetes.
    #[value(name = "v0")]
    V0,
    /// CSI 0.1 (`csi`): Mesos 1.5.
    #[value(name = "v0.1")]
    V01,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

pub const DEFAULT_STATE_DIR: &str = "/var/lib/ebs-node-agent";
pub const DEFAULT_DRIVER_NAME: &str = "ebs.csi.aws.com";

/// The state file inside the state directory.
pub const STATE_FILE: &str = "state.redb";
