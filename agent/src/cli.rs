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
    /// Print an EBS volume's NVMe performance statistics (log page 0xD0), like `nvme amzn stats`.
    EbsStats(crate::ebs_stats::EbsStatsArgs),
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

pub const DEFAULT_ENDPOINT: &str = "unix:///run/ebs-node-agent/csi.sock";
pub const DEFAULT_STATE_DIR: &str = "/var/lib/ebs-node-agent";
pub const DEFAULT_DRIVER_NAME: &str = "ebs.csi.aws.com";

#[derive(clap::Args, Debug, Clone)]
pub struct ServeArgs {
    /// The CSI socket: unix:///path/name.sock.
    #[arg(long, env = "CSI_ENDPOINT", default_value = DEFAULT_ENDPOINT, value_parser = Endpoint::parse_arg)]
    pub endpoint: Endpoint,
    /// A second socket for the CSI-Addons sidecar (identity, online space reclaim); off when unset.
    #[arg(long, env = "CSIADDONS_ENDPOINT", value_parser = Endpoint::parse_arg)]
    pub csi_addons_endpoint: Option<Endpoint>,
    /// Which CSI services this instance serves.
    #[arg(long, env = "EBS_AGENT_MODE", value_enum, default_value = "all")]
    pub mode: Mode,
    /// CSI versions served on the socket, comma-separated: v1, v0 (0.2/0.3), v0.1. Any may be
    /// turned off, v1 included (a node that only Mesos 1.5 talks to); at least one must stay.
    #[arg(
        long,
        env = "EBS_AGENT_CSI_VERSIONS",
        value_enum,
        value_delimiter = ',',
        default_value = "v1,v0,v0.1"
    )]
    pub csi_versions: Vec<CsiVersion>,
    /// How volume ids become block devices.
    #[arg(long, env = "EBS_AGENT_BACKEND", value_enum, default_value = "ebs")]
    pub backend: BackendKind,
    /// The CSI driver name (domain notation, at most 63 characters).
    #[arg(long, env = "EBS_AGENT_DRIVER_NAME", default_value = DEFAULT_DRIVER_NAME, value_parser = parse_driver_name)]
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
    /// Serve Prometheus metrics over HTTP at this address (e.g. 127.0.0.1:9809); off when unset.
    #[arg(long, env = "EBS_AGENT_METRICS_ADDRESS")]
    pub metrics_address: Option<std::net::SocketAddr>,
    /// Print the effective settings as JSON and exit, touching nothing (checks a deployment's flags).
    #[arg(long)]
    pub print_config: bool,
    /// ebs: the availability zone, when DMI and instance metadata cannot tell it.
    #[arg(long, env = "EBS_AGENT_ZONE")]
    pub zone: Option<String>,
    /// ebs: the region (logged; derived from the zone when absent).
    #[arg(long, env = "EBS_AGENT_REGION")]
    pub region: Option<String>,
    /// ebs: the instance type, for the attach limit.
    #[arg(long, env = "EBS_AGENT_INSTANCE_TYPE")]
    pub instance_type: Option<String>,
    /// ebs: instance metadata (IMDSv2), http://host[:port].
    #[arg(long, env = "EBS_AGENT_IMDS_ENDPOINT", default_value = crate::nodeinfo::imds::DEFAULT_ENDPOINT)]
    pub imds_endpoint: String,
    /// ebs: never call instance metadata (identity from flags and DMI only).
    #[arg(long, env = "EBS_AGENT_IMDS_DISABLED")]
    pub imds_disabled: bool,
    /// ebs: how long one instance-metadata request may take.
    #[arg(long, env = "EBS_AGENT_IMDS_TIMEOUT", default_value = "1s", value_parser = parse_duration)]
    pub imds_timeout: Duration,
    /// Where sysfs is mounted (DMI asset tag, NVMe disks, network devices).
    #[arg(long, env = "EBS_AGENT_SYSFS_ROOT", default_value = "/sys")]
    pub sysfs_root: PathBuf,
    /// ebs: max_volumes_per_node, instead of the limit computed from the instance type.
    #[arg(long, env = "EBS_AGENT_VOLUME_ATTACH_LIMIT")]
    pub volume_attach_limit: Option<u32>,
    /// ebs: attachment slots to keep free beyond those the agent counts on the host.
    #[arg(
        long,
        env = "EBS_AGENT_RESERVED_VOLUME_ATTACHMENTS",
        default_value_t = 0
    )]
    pub reserved_volume_attachments: u32,
    /// ebs: the longest pause between identity lookups while the identity is missing.
    #[arg(long, env = "EBS_AGENT_IDENTITY_RETRY_MAX", default_value = "60s", value_parser = parse_duration, hide = true)]
    pub identity_retry_max: Duration,
    #[command(flatten)]
    pub upstream: crate::upstream::UpstreamArgs,
    /// ebs: where device nodes are (a fixture tree in tests).
    #[arg(long, env = "EBS_AGENT_DEV_ROOT", default_value = "/dev")]
    pub dev_root: PathBuf,
    /// ebs: the NVMe controller model that marks an EBS volume (the QEMU lab: "QEMU NVMe Ctrl").
    #[arg(long, env = "EBS_AGENT_EBS_MODEL", default_value = crate::backend::ebs::EBS_MODEL)]
    pub ebs_model: String,
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
