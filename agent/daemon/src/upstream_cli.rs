//! The upstream aws-ebs-csi-driver's node command line, accepted as its Helm chart renders it, so
//! swapping only the image of the chart's `ebs-plugin` container is enough:
//!
//! ```text
//! ebs-node-agent node --endpoint=unix:/csi/csi.sock --csi-mount-point-prefix=… --logging-format=text --v=2
//! ```
//!
//! The first word `node`, `controller` or `all` is the mode (`serve --mode …`). Flags with an
//! equivalent here map to it (see `cli::ServeArgs`); the rest are accepted and each is named in
//! one warning line at start that says why it changes nothing. A flag neither driver knows still
//! stops the agent with exit code 2. The table of every flag is in
//! docs/migration-from-aws-ebs-csi-driver.md.

use std::net::SocketAddr;

use crate::cli::ServeArgs;

/// Upstream flags that have no effect here. Hidden from `--help`: they exist so that the
/// upstream command line starts the agent.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct IgnoredFlags {
    #[arg(long, hide = true)]
    pub metrics_cert_file: Option<String>,
    #[arg(long, hide = true)]
    pub metrics_key_file: Option<String>,
    #[arg(long, hide = true)]
    pub metadata_sources: Option<String>,
    #[arg(long, hide = true)]
    pub kubeconfig: Option<String>,
    #[arg(long, hide = true, action = clap::ArgAction::Set, num_args = 0..=1,
          require_equals = true, default_missing_value = "true",
          value_parser = clap::builder::BoolishValueParser::new())]
    pub enable_otel_tracing: Option<bool>,
    /// Older charts rendered it; logs go to stderr anyway.
    #[arg(long, hide = true, action = clap::ArgAction::Set, num_args = 0..=1,
          require_equals = true, default_missing_value = "true",
          value_parser = clap::builder::BoolishValueParser::new())]
    pub logtostderr: Option<bool>,
}

/// One upstream flag given and ignored, with the reason (logged once at start).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ignored {
    pub flag: &'static str,
    pub why: &'static str,
}

pub fn ignored(args: &ServeArgs) -> Vec<Ignored> {
    let f = &args.upstream_flags;
    let mut out = Vec::new();
    let mut add = |given: bool, flag, why| {
        if given {
            out.push(Ignored { flag, why });
        }
    };
    let plain_http = "the metrics endpoint is plain HTTP: keep it on a private address or put a \
                      TLS proxy in front";
    add(
        f.metrics_cert_file.is_some(),
        "--metrics-cert-file",
        plain_http,
    );
    add(
        f.metrics_key_file.is_some(),
        "--metrics-key-file",
        plain_http,
    );
    add(
        f.metadata_sources.is_some(),
        "--metadata-sources",
        "the identity comes from flags, DMI and instance metadata, never from the Kubernetes \
         API; without instance metadata give the zone with EBS_AGENT_ZONE (downward API)",
    );
    add(
        f.kubeconfig.is_some(),
        "--kubeconfig",
        "the Kubernetes duties (startup taint, pre-stop) use the pod's service account",
    );
    add(
        f.enable_otel_tracing == Some(true),
        "--enable-otel-tracing",
        "no OpenTelemetry export: use the logs and the metrics endpoint",
    );
    add(
        f.logtostderr.is_some(),
        "--logtostderr",
        "logs always go to stderr",
    );
    add(
        args.volume_attach_limit >= 0 && args.reserved_volume_attachments >= 0,
        "--reserved-volume-attachments",
        "not used when --volume-attach-limit is set (upstream refuses the pair)",
    );
    out
}

/// One warning line per ignored flag.
pub fn warn_ignored(args: &ServeArgs) {
    for i in ignored(args) {
        tracing::warn!(
            flag = i.flag,
            "{} is accepted and ignored: {}",
            i.flag,
            i.why
        );
    }
}

/// Environment variables the upstream chart sets, applied where a flag left a setting open:
/// AWS_REGION gives the region, AWS_EC2_METADATA_DISABLED=true turns instance metadata off,
/// DISABLE_TAINT_WATCHER turns startup-taint removal off. CSI_NODE_NAME names the Node for the
/// Kubernetes duties only: the node id is the instance id, found as upstream finds it.
/// Identity settings that are blank count as unset: the downward API gives an empty value for a
/// label the pod lacks (`EBS_AGENT_ZONE` from `topology.kubernetes.io/zone`).
pub fn apply_env(args: &mut ServeArgs, env: impl Fn(&str) -> Option<String>) {
    for field in [
        &mut args.zone,
        &mut args.region,
        &mut args.node_id,
        &mut args.instance_type,
    ] {
        if field.as_deref().is_some_and(|v| v.trim().is_empty()) {
            *field = None;
        }
    }
    let set = |name: &str| {
        env(name)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    };
    if args.region.is_none() {
        args.region = set("AWS_REGION");
    }
    if set("AWS_EC2_METADATA_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
        args.imds_disabled = true;
    }
    // Upstream's switch: any value turns its taint watcher off.
    if set("DISABLE_TAINT_WATCHER").is_some() {
        args.startup_taint_removal_disabled = true;
    }
}

/// klog's `-v` level as a tracing filter: up to 3 is info (the chart's default is 2), 4 and 5
/// are the agent's debug lines (where upstream logs each call), 6 and above its trace lines.
/// Libraries (gRPC, HTTP/2) stay at info: their debug output is not what `-v` asks for. The
/// agent's lines come from its crates: the daemon, the core (the node pipeline), the host layer
/// and the store.
pub fn log_level(verbosity: Option<u8>) -> &'static str {
    match verbosity {
        None | Some(0..=3) => "info",
        Some(4..=5) => {
            "info,ebs_node_agent=debug,ebs_node_core=debug,ebs_node_host=debug,ebs_store=debug"
        }
        Some(_) => {
            "info,ebs_node_agent=trace,ebs_node_core=trace,ebs_node_host=trace,ebs_store=trace"
        }
    }
}

/// `--volume-attach-limit` and `--reserved-volume-attachments`: -1 is unset, as upstream.
pub fn parse_count_or_unset(raw: &str) -> Result<i64, String> {
    match raw.trim().parse::<i64>() {
        Ok(n) if n == -1 || (0..=i64::from(u32::MAX)).contains(&n) => Ok(n),
        _ => Err(format!("{raw:?}: give a number >= 0, or -1 for unset")),
    }
}

/// A listen address: `host:port` with an IP host, or Go's `:port` for every address.
pub fn parse_listen_addr(raw: &str) -> Result<SocketAddr, String> {
    let full = match raw.strip_prefix(':') {
        Some(port) => format!("0.0.0.0:{port}"),
        None => raw.to_string(),
    };
    full.parse()
        .map_err(|_| format!("{raw:?}: give ip:port (e.g. 127.0.0.1:9809) or :port"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_addresses() {
        assert_eq!(parse_count_or_unset("-1"), Ok(-1));
        assert_eq!(parse_count_or_unset("0"), Ok(0));
        assert_eq!(parse_count_or_unset("25"), Ok(25));
        for bad in ["-2", "x", "", "1.5", "99999999999"] {
            assert!(parse_count_or_unset(bad).is_err(), "{bad}");
        }
        assert_eq!(
            parse_listen_addr(":3302").unwrap(),
            "0.0.0.0:3302".parse().unwrap()
        );
        assert!(parse_listen_addr("0.0.0.0:3302").is_ok());
        assert!(parse_listen_addr("[::1]:3302").is_ok());
        assert!(parse_listen_addr("metrics:3302").is_err());
    }

    #[test]
    fn levels() {
        assert_eq!(log_level(None), "info");
        assert_eq!(log_level(Some(2)), "info");
        for krate in [
            "ebs_node_agent",
            "ebs_node_core",
            "ebs_node_host",
            "ebs_store",
        ] {
            assert!(
                log_level(Some(4)).contains(&format!("{krate}=debug")),
                "{krate}"
            );
            assert!(
                log_level(Some(7)).contains(&format!("{krate}=trace")),
                "{krate}"
            );
        }
    }
}
