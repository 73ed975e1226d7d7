//! `serve --print-config`: the settings the agent would run with, after flags, environment and
//! defaults, as one JSON object. Operators check a deployment with it; the packaging tests read it
//! so that the shipped manifests and the agent's own defaults cannot drift apart.

use serde_json::json;

use crate::cli::ServeArgs;

pub fn print(args: &ServeArgs) {
    let lower = |v: &dyn std::fmt::Debug| format!("{v:?}").to_lowercase();
    let value = json!({
        "endpoint": args.endpoint.url(),
        "socket_path": args.endpoint.path(),
        "mode": lower(&args.mode),
        "serves_node": args.mode.serves_node(),
        "serves_controller": args.mode.serves_controller(),
        "backend": lower(&args.backend),
        "driver_name": args.driver_name,
        "state_dir": args.state_dir,
        "state_file": args.state_dir.join(crate::settings::STATE_FILE),
        "node_id": args.node_id,
        "allowed_path_prefixes": crate::server::allowed_prefixes(args),
        "log_format": lower(&args.log_format),
        "shutdown_grace_ms": args.shutdown_grace.as_millis() as u64,
        "device_wait_ms": args.device_wait.as_millis() as u64,
        "csi_versions": crate::grpc::versions::names(&args.csi_versions),
        "metrics_address": args.metrics_address.map(|a| a.to_string()),
        "log_level": args.log_level(),
        "csi_mount_point_prefix": args.csi_mount_point_prefix,
        "legacy_xfs": args.legacy_xfs,
        "volume_attach_limit": args.volume_attach_limit,
        "reserved_volume_attachments": args.reserved_volume_attachments,
        "zone": args.zone,
        "region": args.region,
        "imds_disabled": args.imds_disabled,
        "kube_node_name": args.kube.kube_node_name,
        "service_account_dir": args.kube.service_account_dir,
        "startup_taint_removal": !args.startup_taint_removal_disabled,
        "ignored_upstream_flags": crate::upstream_cli::ignored(args)
            .iter()
            .map(|i| i.flag)
            .collect::<Vec<_>>(),
    });
    println!("{value:#}");
}
