//! The command line. Every `serve` flag can also come from an environment variable, so the same
//! binary is configured the same way by systemd, a DaemonSet, Nomad or Mesos. The upstream EBS
//! driver's node command line (`node --endpoint=… --v=2`) is accepted too: see `upstream_cli`.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};

use crate::endpoint::Endpoint;
use ebs_node_tools::client::ClientArgs;
// The settings' types live below the command line, so that modules it names (client, upstream)
// can use them without depending on it.
use crate::settings::{
    BackendKind, CsiVersion, DEFAULT_DRIVER_NAME, DEFAULT_STATE_DIR, LogFormat, Mode,
};
use ebs_node_core::config::{DEFAULT_ENDPOINT, parse_duration};

/// The parsed command line (see `Cli::parse_args`).
#[derive(Debug)]
pub struct Cli {
    pub command: Command,
}

#[derive(Parser, Debug)]
#[command(
    name = "ebs-node-agent",
    version,
    about = "A crash-safe CSI node plugin for EBS and block devices"
)]
struct Parsed {
    #[command(subcommand)]
    command: ParsedCommand,
}

/// Ours, plus the upstream driver's first words, which stand for `serve --mode <word>`.
#[derive(Subcommand, Debug)]
enum ParsedCommand {
    #[command(flatten)]
    Ours(Command),
    #[command(hide = true)]
    Node(Box<ServeArgs>),
    #[command(hide = true)]
    Controller(Box<ServeArgs>),
    #[command(hide = true)]
    All(Box<ServeArgs>),
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
    /// Check whether this host can run the agent: one line per check, with the fix.
    Doctor(crate::commands::doctor::DoctorArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell) to stdout.
    Completions {
        /// The shell to write the script for.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff) to stdout, or with --dir write ebs-node-agent.1 and one page
    /// per subcommand (ebs-node-agent-serve.1, ...) into that directory.
    Man {
        /// Write the pages into this directory instead of printing the main page.
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Print an EBS volume's NVMe performance statistics (log page 0xD0), like `nvme amzn stats`.
    EbsStats(crate::commands::ebs_stats::EbsStatsArgs),
    /// Kubernetes preStop hook: on a node being drained, wait until its VolumeAttachments of
    /// this driver are gone (bounded); otherwise return at once. Upstream's `pre-stop-hook` too.
    #[command(alias = "pre-stop-hook")]
    PreStop(crate::kube_duties::PreStopArgs),
}

impl Cli {
    /// The clap definition (completions and man pages are generated from it).
    pub fn command() -> clap::Command {
        <Parsed as clap::CommandFactory>::command()
    }

    /// Parses the command line. The upstream driver's first word (`node`, `controller`, `all`)
    /// becomes `serve` with that mode (the word wins over --mode), and the upstream chart's
    /// environment variables fill in what flags left open. Errors exit with code 2, as clap's do.
    pub fn parse_args() -> Cli {
        Cli::from_parsed(Parsed::parse())
    }

    /// As `parse_args`, from given words (the first is the program name).
    pub fn try_parse_from<I, T>(words: I) -> Result<Cli, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        Parsed::try_parse_from(words).map(Cli::from_parsed)
    }

    fn from_parsed(parsed: Parsed) -> Cli {
        let upstream = |mut args: Box<ServeArgs>, mode| {
            args.mode = mode;
            Command::Serve(args)
        };
        let mut command = match parsed.command {
            ParsedCommand::Ours(c) => c,
            ParsedCommand::Node(a) => upstream(a, Mode::Node),
            ParsedCommand::Controller(a) => upstream(a, Mode::Controller),
            ParsedCommand::All(a) => upstream(a, Mode::All),
        };
        if let Command::Serve(args) = &mut command {
            crate::upstream_cli::apply_env(args, |k| std::env::var(k).ok());
        }
        Cli { command }
    }
}

/// A flag given twice takes its last value, as Go's flag parsing does (the chart's
/// `node.additionalArgs` may repeat one it renders, `--v` say).
#[derive(clap::Args, Debug, Clone)]
#[command(args_override_self = true)]
pub struct ServeArgs {
    /// The CSI socket: unix:///path/name.sock (or unix:/path/name.sock).
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
    #[arg(long = "allowed-path-prefix", env = "EBS_AGENT_ALLOWED_PATH_PREFIXES", value_delimiter = ',', value_parser = ebs_node_core::request::parse_prefix)]
    pub allowed_path_prefixes: Vec<PathBuf>,
    /// Log lines as text, or one JSON object per line.
    #[arg(
        long,
        alias = "logging-format",
        env = "EBS_AGENT_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    pub log_format: LogFormat,
    /// Log verbosity as klog counts it (upstream's `--v`): up to 3 info, 4-5 debug, 6+ trace.
    /// RUST_LOG, when set, wins.
    #[arg(
        short = 'v',
        long = "v",
        env = "EBS_AGENT_LOG_VERBOSITY",
        value_name = "LEVEL"
    )]
    pub verbosity: Option<u8>,
    /// How long in-flight calls may run after SIGTERM before the agent exits anyway.
    #[arg(long, env = "EBS_AGENT_SHUTDOWN_GRACE", default_value = "30s", value_parser = parse_duration)]
    pub shutdown_grace: Duration,
    /// How long a stage waits for the volume's device to appear (never past the call's deadline).
    #[arg(long, env = "EBS_AGENT_DEVICE_WAIT", default_value = "30s", value_parser = parse_duration)]
    pub device_wait: Duration,
    /// Serve Prometheus metrics over HTTP at this address (e.g. 127.0.0.1:9809, or :9809 for
    /// every address); off when unset. Upstream's `--http-endpoint` is the same flag.
    #[arg(long, alias = "http-endpoint", env = "EBS_AGENT_METRICS_ADDRESS",
          value_parser = crate::upstream_cli::parse_listen_addr)]
    pub metrics_address: Option<std::net::SocketAddr>,
    /// Per-volume metrics cover only volumes mounted under this path (upstream's flag of the
    /// same name; the chart gives `<kubelet>/plugins/kubernetes.io/csi/ebs.csi.aws.com/`).
    #[arg(long, env = "EBS_AGENT_CSI_MOUNT_POINT_PREFIX", value_parser = parse_absolute)]
    pub csi_mount_point_prefix: Option<PathBuf>,
    /// Format xfs without bigtime, inobtcount and reflink, for nodes on Linux 5.4 or older
    /// (upstream's flag of the same name). Such volumes keep timestamps only until 2038.
    #[arg(long, env = "EBS_AGENT_LEGACY_XFS", action = clap::ArgAction::Set, num_args = 0..=1,
          require_equals = true, default_missing_value = "true", default_value = "false",
          value_parser = clap::builder::BoolishValueParser::new())]
    pub legacy_xfs: bool,
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
    #[arg(long, env = "EBS_AGENT_IMDS_ENDPOINT", default_value = ebs_node_backends::nodeinfo::imds::DEFAULT_ENDPOINT)]
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
    /// max_volumes_per_node; -1: unset. ebs: instead of the limit computed from the instance
    /// type (same meaning as upstream's flag); loop: the node's attach limit, which
    /// ControllerPublishVolume enforces (none when unset).
    #[arg(long, env = "EBS_AGENT_VOLUME_ATTACH_LIMIT", default_value = "-1",
          allow_negative_numbers = true, value_parser = crate::upstream_cli::parse_count_or_unset)]
    pub volume_attach_limit: i64,
    /// ebs: attachment slots used by other disks than the agent's volumes, replacing the live
    /// count of attached EBS volumes the agent did not stage (root included); -1: that count.
    /// Same meaning as upstream's flag. Not used with --volume-attach-limit.
    #[arg(long, env = "EBS_AGENT_RESERVED_VOLUME_ATTACHMENTS", default_value = "-1",
          allow_negative_numbers = true, value_parser = crate::upstream_cli::parse_count_or_unset)]
    pub reserved_volume_attachments: i64,
    /// ebs: the longest pause between identity lookups while the identity is missing.
    #[arg(long, env = "EBS_AGENT_IDENTITY_RETRY_MAX", default_value = "60s", value_parser = parse_duration, hide = true)]
    pub identity_retry_max: Duration,
    #[command(flatten)]
    pub upstream: crate::upstream::UpstreamArgs,
    #[command(flatten)]
    pub upstream_flags: crate::upstream_cli::IgnoredFlags,
    #[command(flatten)]
    pub kube: crate::kube_duties::KubeArgs,
    /// Kubernetes: leave the startup taint ebs.csi.aws.com/agent-not-ready alone (removed by
    /// default once kubelet registered the driver; upstream's DISABLE_TAINT_WATCHER works too).
    #[arg(long, env = "EBS_AGENT_STARTUP_TAINT_REMOVAL_DISABLED")]
    pub startup_taint_removal_disabled: bool,
    /// Kubernetes: how long after start the startup taint is watched for (upstream: 10 minutes).
    #[arg(long, env = "EBS_AGENT_STARTUP_TAINT_WINDOW", default_value = "10m", value_parser = parse_duration, hide = true)]
    pub startup_taint_window: Duration,
    /// ebs: where device nodes are (a fixture tree in tests).
    #[arg(long, env = "EBS_AGENT_DEV_ROOT", default_value = "/dev")]
    pub dev_root: PathBuf,
    /// ebs: on hosts whose disks carry no serial (Xen), use the CO's devicePath as given, its
    /// identity unverified. Off by default: a disk without a serial is never taken for a volume.
    #[arg(long, env = "EBS_AGENT_ALLOW_UNVERIFIED_DEVICES")]
    pub allow_unverified_devices: bool,
    /// ebs: the NVMe controller model that marks an EBS volume (the QEMU lab: "QEMU NVMe Ctrl").
    #[arg(long, env = "EBS_AGENT_EBS_MODEL", default_value = ebs_node_core::ec2::ebs::EBS_MODEL)]
    pub ebs_model: String,
    /// The background re-check of a volume that needs attention: the first pause (then
    /// doubling, at most ten times this).
    #[arg(long, env = "EBS_AGENT_ATTENTION_RETRY", default_value = "30s", value_parser = parse_duration, hide = true)]
    pub attention_retry: Duration,
    // `--crash-after` and `--bench-lazy-journal` in test and bench builds; nothing in a release.
    #[command(flatten)]
    pub test_hooks: crate::test_hooks::HookArgs,
}

impl ServeArgs {
    /// `--volume-attach-limit` when set (>= 0).
    pub fn attach_limit_override(&self) -> Option<u32> {
        u32::try_from(self.volume_attach_limit).ok()
    }

    /// `--reserved-volume-attachments` when set (>= 0).
    pub fn reserved_override(&self) -> Option<u32> {
        u32::try_from(self.reserved_volume_attachments).ok()
    }

    /// The tracing filter for `--v` (RUST_LOG wins when set).
    pub fn log_level(&self) -> &'static str {
        crate::upstream_cli::log_level(self.verbosity)
    }
}

#[derive(clap::Args, Debug)]
pub struct StatusArgs {
    /// The state directory to read when no agent answers on --endpoint.
    #[arg(long, env = "EBS_AGENT_STATE_DIR", default_value = DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
    /// Ask the running agent on this socket first (redb locks its file while the agent runs).
    #[arg(long, env = "CSI_ENDPOINT", default_value = DEFAULT_ENDPOINT, value_parser = Endpoint::parse_arg)]
    pub endpoint: Endpoint,
    /// Print one JSON object (for scripts) instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args, Debug)]
pub struct RecoverArgs {
    /// The state directory whose state file to rebuild or reset.
    #[arg(long, env = "EBS_AGENT_STATE_DIR", default_value = DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
    /// Rebuild staged volumes and publications from /proc/self/mountinfo.
    #[arg(long, conflicts_with = "reset")]
    pub from_mounts: bool,
    /// Move the state file aside and start with an empty one.
    #[arg(long)]
    pub reset: bool,
    /// The node id the loop controller's attachments are rebuilt under: the agent's own
    /// `--node-id` (the host name by default, as the loop backend's).
    #[arg(long, env = "EBS_AGENT_NODE_ID")]
    pub node_id: Option<String>,
    /// The agent's allowed prefixes: a mount outside them is none of its volumes' (repeatable;
    /// env: comma-separated, as `serve`'s).
    #[arg(long = "allowed-path-prefix", env = "EBS_AGENT_ALLOWED_PATH_PREFIXES", value_delimiter = ',', value_parser = ebs_node_core::request::parse_prefix)]
    pub allowed_path_prefixes: Vec<PathBuf>,
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

fn parse_absolute(raw: &str) -> Result<PathBuf, String> {
    let p = PathBuf::from(raw);
    if p.is_absolute() {
        Ok(p)
    } else {
        Err(format!("{raw:?} must be an absolute path"))
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
}
