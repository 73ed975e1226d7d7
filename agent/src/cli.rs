//! The command line. Every `serve` flag can also come from an environment variable, so the same
//! binary is configured the same way by systemd, a DaemonSet, Nomad or Mesos.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};

use crate::client::ClientArgs;
use crate::endpoint::Endpoint;

#[derive(Parser, Debug)]
#[command(
    name = "ebs-node-agent",
    version,
    about = "A crash-safe CSI node plugin for EBS and block devices"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Serve CSI on a unix socket.
    Serve(Box<ServeArgs>),
    /// Call a CSI endpoint (ours or any other driver's).
    Client(ClientArgs),
    /// Show the volumes the agent knows, from the running agent or from its state file.
    Status(StatusArgs),
    /// Rebuild or reset a state file that the agent refuses to open.
    Recover(RecoverArgs),
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    All,
    Node,
    Controller,
}

impl Mode {
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

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

pub const DEFAULT_ENDPOINT: &str = "unix:///run/ebs-node-agent/csi.sock";
pub const DEFAULT_STATE_DIR: &str = "/var/lib/ebs-node-agent";

#[derive(clap::Args, Debug, Clone)]
pub struct ServeArgs {
    /// The CSI socket: unix:///path/name.sock.
    #[arg(long, env = "CSI_ENDPOINT", default_value = DEFAULT_ENDPOINT, value_parser = Endpoint::parse_arg)]
    pub endpoint: Endpoint,
    /// Which CSI services this instance serves.
    #[arg(long, env = "EBS_AGENT_MODE", value_enum, default_value = "all")]
    pub mode: Mode,
    /// How volume ids become block devices.
    #[arg(long, env = "EBS_AGENT_BACKEND", value_enum, default_value = "ebs")]
    pub backend: BackendKind,
    /// The CSI driver name (domain notation, at most 63 characters).
    #[arg(long, env = "EBS_AGENT_DRIVER_NAME", default_value = "ebs.csi.aws.com", value_parser = parse_driver_name)]
    pub driver_name: String,
    /// Holds the state file and the loop backend's volume files.
    #[arg(long, env = "EBS_AGENT_STATE_DIR", default_value = DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
    /// The node id reported by NodeGetInfo (ebs: the instance id; loop: the host name).
    #[arg(long, env = "EBS_AGENT_NODE_ID")]
    pub node_id: Option<String>,
    /// Staging and target paths must lie under one of these (repeatable; env: comma-separated).
    #[arg(long = "allowed-path-prefix", env = "EBS_AGENT_ALLOWED_PATH_PREFIXES", value_delimiter = ',', value_parser = crate::request::parse_prefix)]
    pub allowed_path_prefixes: Vec<PathBuf>,
    #[arg(long, env = "EBS_AGENT_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,
    /// How long in-flight calls may run after SIGTERM before the agent exits anyway.
    #[arg(long, env = "EBS_AGENT_SHUTDOWN_GRACE", default_value = "30s", value_parser = parse_duration)]
    pub shutdown_grace: Duration,
    /// How long a stage waits for the volume's device to appear (never past the call's deadline).
    #[arg(long, env = "EBS_AGENT_DEVICE_WAIT", default_value = "30s", value_parser = parse_duration)]
    pub device_wait: Duration,
    /// Test builds only: abort right after a journal record `op.step.phase` is committed.
    #[arg(long, env = "EBS_AGENT_CRASH_AFTER", hide = true)]
    pub crash_after: Option<String>,
    /// Bench only: commit the journal without fsync, to measure the journal's share. Gives up
    /// crash safety; never for production.
    #[arg(long, env = "EBS_AGENT_BENCH_LAZY_JOURNAL", hide = true)]
    pub bench_lazy_journal: bool,
}

#[derive(clap::Args, Debug)]
pub struct StatusArgs {
    #[arg(long, env = "EBS_AGENT_STATE_DIR", default_value = DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
    /// Ask the running agent on this socket first (redb locks its file while the agent runs).
    #[arg(long, env = "CSI_ENDPOINT", default_value = DEFAULT_ENDPOINT, value_parser = Endpoint::parse_arg)]
    pub endpoint: Endpoint,
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args, Debug)]
pub struct RecoverArgs {
    #[arg(long, env = "EBS_AGENT_STATE_DIR", default_value = DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
    /// Rebuild staged volumes and publications from /proc/self/mountinfo.
    #[arg(long, conflicts_with = "reset")]
    pub from_mounts: bool,
    /// Move the state file aside and start with an empty one.
    #[arg(long)]
    pub reset: bool,
}

fn parse_driver_name(raw: &str) -> Result<String, String> {
    let ok_len = !raw.is_empty() && raw.len() <= 63;
    let bytes = raw.as_bytes();
    let ok_ends = ok_len
        && bytes[0].is_ascii_alphanumeric()
        && bytes[bytes.len() - 1].is_ascii_alphanumeric();
    let ok_chars = raw
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
    if ok_len && ok_ends && ok_chars {
        Ok(raw.to_string())
    } else {
        Err(
            "a driver name has at most 63 characters, letters, digits, '-' and '.', and starts \
             and ends with a letter or digit"
                .into(),
        )
    }
}

/// Durations such as `30s`, `500ms`, `2m` or a bare number of seconds.
pub fn parse_duration(raw: &str) -> Result<Duration, String> {
    let raw = raw.trim();
    let (num, unit) = raw
        .find(|c: char| !c.is_ascii_digit())
        .map_or((raw, "s"), |i| raw.split_at(i));
    let n: u64 = num
        .parse()
        .map_err(|_| format!("invalid duration {raw:?}"))?;
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "s" => Ok(Duration::from_secs(n)),
        "m" => Ok(Duration::from_secs(n * 60)),
        _ => Err(format!("invalid duration {raw:?}: use ms, s or m")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_names() {
        assert!(parse_driver_name("ebs.csi.aws.com").is_ok());
        assert!(parse_driver_name("-bad").is_err());
        assert!(parse_driver_name(&"a".repeat(64)).is_err());
        assert!(parse_driver_name("a_b").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("7"), Ok(Duration::from_secs(7)));
        assert!(parse_duration("x").is_err());
    }
}
