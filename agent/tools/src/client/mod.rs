//! `ebs-node-agent client`: a CSI command-line client for operators and tests. Human output by
//! default, `--json` for scripts. Works against any CSI endpoint, not only ours.

pub mod bench;
mod calls;
pub mod connect;

use std::collections::HashMap;
use std::time::Duration;

use clap::{Args, Subcommand, ValueEnum};

use ebs_node_core::config::{DEFAULT_ENDPOINT, parse_duration};

#[derive(Args, Debug)]
pub struct ClientArgs {
    // Global like --json and --timeout: accepted after any subcommand too (tests/tests/help.rs).
    /// The CSI socket to call.
    #[arg(long, env = "CSI_ENDPOINT", default_value = DEFAULT_ENDPOINT, global = true)]
    pub endpoint: String,
    /// Print JSON instead of text.
    #[arg(long, global = true)]
    pub json: bool,
    /// Deadline of each call.
    #[arg(long, default_value = "120s", value_parser = parse_duration, global = true)]
    pub timeout: Duration,
    #[command(subcommand)]
    pub call: Call,
}

#[derive(Subcommand, Debug)]
pub enum Call {
    /// Identity service: the plugin's name, capabilities and readiness.
    #[command(subcommand)]
    Identity(IdentityCall),
    /// Controller service: create, attach, expand, list and delete volumes.
    #[command(subcommand)]
    Controller(ControllerCall),
    /// Node service: stage, publish, expand and inspect volumes on this host.
    #[command(subcommand)]
    Node(NodeCall),
    /// Time the node cycle against the same host work done directly (see docs/performance.md).
    Bench(Box<bench::BenchArgs>),
}

#[derive(Subcommand, Debug)]
pub enum IdentityCall {
    /// GetPluginInfo: the driver's name and version.
    Info,
    /// GetPluginCapabilities: which services and features the plugin offers.
    Capabilities,
    /// Probe: whether the plugin is ready, and what it lacks when not.
    Probe,
}

#[derive(ValueEnum, Clone, Copy, Debug)]
pub enum ModeArg {
    SingleNodeWriter,
    SingleNodeReaderOnly,
    MultiNodeReaderOnly,
    MultiNodeSingleWriter,
    MultiNodeMultiWriter,
    SingleNodeSingleWriter,
    SingleNodeMultiWriter,
}

// How a command names a volume capability. (A plain comment: clap would show a doc comment as
// the "about" line of every subcommand that flattens these arguments.)
#[derive(Args, Debug, Clone)]
pub struct CapArgs {
    /// Raw block access instead of a filesystem.
    #[arg(long)]
    pub block: bool,
    /// Filesystem to format with and mount (ext4, xfs); ignored with --block.
    #[arg(long, default_value = "ext4")]
    pub fs_type: String,
    /// A mount option such as noatime; repeat for more.
    #[arg(long = "mount-flag")]
    pub mount_flags: Vec<String>,
    /// The access mode of the volume capability.
    #[arg(long, value_enum, default_value = "single-node-writer")]
    pub mode: ModeArg,
}

#[derive(Subcommand, Debug)]
pub enum ControllerCall {
    /// CreateVolume: make a volume (idempotent by name).
    CreateVolume {
        /// The volume's name; the same name returns the same volume.
        #[arg(long)]
        name: String,
        /// Size such as 1GiB, 512MiB or a number of bytes.
        #[arg(long, default_value = "1GiB", value_parser = parse_size)]
        size: u64,
        /// A CreateVolume parameter (key=value), e.g. type=gp3; repeat for more.
        #[arg(long = "param", value_parser = parse_kv)]
        params: Vec<(String, String)>,
        #[command(flatten)]
        cap: CapArgs,
    },
    /// DeleteVolume: delete a volume and its data (an unknown id is already deleted).
    DeleteVolume {
        /// The volume id (CreateVolume's volume_id).
        #[arg(long)]
        id: String,
    },
    /// ControllerPublishVolume: attach a volume to a node.
    Publish {
        /// The volume id (CreateVolume's volume_id).
        #[arg(long)]
        id: String,
        /// The node to attach to (NodeGetInfo's node_id).
        #[arg(long)]
        node_id: String,
        /// Attach read-only.
        #[arg(long)]
        readonly: bool,
        #[command(flatten)]
        cap: CapArgs,
    },
    /// ControllerUnpublishVolume: detach a volume from a node.
    Unpublish {
        /// The volume id (CreateVolume's volume_id).
        #[arg(long)]
        id: String,
        /// The node to attach to (NodeGetInfo's node_id).
        #[arg(long)]
        node_id: String,
    },
    /// ControllerExpandVolume: grow a volume's device; `node expand` then grows its filesystem.
    Expand {
        /// The volume id (CreateVolume's volume_id).
        #[arg(long)]
        id: String,
        /// The new size, such as 2GiB or a number of bytes.
        #[arg(long, value_parser = parse_size)]
        size: u64,
    },
    /// ListVolumes: the volumes the plugin has, a page at a time.
    ListVolumes {
        /// At most this many entries (0: as many as the plugin returns).
        #[arg(long, default_value_t = 0)]
        max_entries: i32,
        /// Continue from the next_token of an earlier answer.
        #[arg(long, default_value = "")]
        starting_token: String,
    },
    /// GetCapacity: the space left for new volumes.
    Capacity,
    /// ControllerGetCapabilities: which controller calls the plugin supports.
    Capabilities,
}

#[derive(Subcommand, Debug)]
pub enum NodeCall {
    /// NodeStageVolume: format if provably blank, check, mount at the staging path.
    Stage {
        /// The volume id (CreateVolume's volume_id).
        #[arg(long)]
        id: String,
        /// The staging path: the volume's mount (or device record) on this host.
        #[arg(long)]
        staging_path: String,
        /// publish_context entries (key=value), e.g. devicePath=/dev/loop3.
        #[arg(long = "publish-context", value_parser = parse_kv)]
        publish_context: Vec<(String, String)>,
        /// volume_context entries (key=value), as CreateVolume returned them.
        #[arg(long = "context", value_parser = parse_kv)]
        volume_context: Vec<(String, String)>,
        #[command(flatten)]
        cap: CapArgs,
    },
    /// NodeUnstageVolume: unmount the volume from its staging path (its publications gone first).
    Unstage {
        /// The volume id (CreateVolume's volume_id).
        #[arg(long)]
        id: String,
        /// The staging path: the volume's mount (or device record) on this host.
        #[arg(long)]
        staging_path: String,
    },
    /// NodePublishVolume: bind the staged volume into a target path.
    Publish {
        /// The volume id (CreateVolume's volume_id).
        #[arg(long)]
        id: String,
        /// The staging path: the volume's mount (or device record) on this host.
        #[arg(long)]
        staging_path: String,
        /// The target path: where the workload sees the volume.
        #[arg(long)]
        target_path: String,
        /// Publish read-only.
        #[arg(long)]
        readonly: bool,
        #[command(flatten)]
        cap: CapArgs,
    },
    /// NodeUnpublishVolume: remove the volume from a target path.
    Unpublish {
        /// The volume id (CreateVolume's volume_id).
        #[arg(long)]
        id: String,
        /// The target path: where the workload sees the volume.
        #[arg(long)]
        target_path: String,
    },
    /// NodeGetVolumeStats: usage and volume condition.
    Stats {
        /// The volume id (CreateVolume's volume_id).
        #[arg(long)]
        id: String,
        /// A path where the volume is staged or published.
        #[arg(long)]
        volume_path: String,
    },
    /// NodeExpandVolume: grow the filesystem to the device size.
    Expand {
        /// The volume id (CreateVolume's volume_id).
        #[arg(long)]
        id: String,
        /// A path where the volume is staged or published.
        #[arg(long)]
        volume_path: String,
        /// The new size, such as 2GiB or a number of bytes.
        #[arg(long, value_parser = parse_size)]
        size: u64,
    },
    /// NodeGetInfo: this node's id, attach limit and topology.
    Info,
    /// NodeGetCapabilities: which node calls the plugin supports (stage, stats, expand, ...).
    Capabilities,
}

pub fn parse_kv(raw: &str) -> Result<(String, String), String> {
    raw.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("{raw:?} is not key=value"))
}

/// Sizes such as `1GiB`, `512MiB`, `10G` or plain bytes.
pub fn parse_size(raw: &str) -> Result<u64, String> {
    let raw = raw.trim();
    let split = raw.find(|c: char| !c.is_ascii_digit()).unwrap_or(raw.len());
    let (num, unit) = raw.split_at(split);
    let n: u64 = num.parse().map_err(|_| format!("invalid size {raw:?}"))?;
    let mult: u64 = match unit {
        "" | "B" => 1,
        "KiB" | "K" | "k" => 1 << 10,
        "MiB" | "M" => 1 << 20,
        "GiB" | "G" => 1 << 30,
        "TiB" | "T" => 1 << 40,
        _ => return Err(format!("invalid size unit in {raw:?}")),
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("size {raw:?} is too large"))
}

pub fn to_map(pairs: &[(String, String)]) -> HashMap<String, String> {
    pairs.iter().cloned().collect()
}

/// Runs the client; returns the process exit code.
pub async fn run(args: ClientArgs) -> i32 {
    if let Call::Bench(bench) = &args.call {
        return bench::main(bench, &args).await;
    }
    match calls::run(&args).await {
        Ok(output) => {
            if args.json {
                println!("{output}");
            } else {
                calls::print_human(&output);
            }
            0
        }
        Err(calls::ClientError::Status(st)) => {
            if args.json {
                println!(
                    "{}",
                    serde_json::json!({"error": {"code": format!("{:?}", st.code()), "message": st.message()}})
                );
            } else {
                eprintln!("error: {:?}: {}", st.code(), st.message());
            }
            1
        }
        Err(calls::ClientError::Other(msg)) => {
            eprintln!("error: {msg}");
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("1XB").is_err());
    }
}
