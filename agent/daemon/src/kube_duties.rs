//! The node pod's Kubernetes duties (crate `ebs-node-agent-kube`), wired to the command line:
//! startup-taint removal in the background of `serve`, and the `pre-stop` subcommand. Both need
//! the pod's service account; without one they are off and say so in one line.

use std::path::PathBuf;
use std::time::Duration;

use ebs_node_agent_kube::{Client, DEFAULT_SERVICE_ACCOUNT_DIR, InCluster, prestop, taint};

use crate::cli::ServeArgs;
use crate::settings::DEFAULT_DRIVER_NAME;
use ebs_node_core::config::parse_duration;

/// Where the duties find the API server's credentials and this node's name.
#[derive(clap::Args, Debug, Clone)]
pub struct KubeArgs {
    /// Kubernetes: this node's name (the downward API's spec.nodeName, as upstream's chart sets
    /// it); the startup taint and the pre-stop hook act on this Node. Off when unset.
    #[arg(long, env = "CSI_NODE_NAME")]
    pub kube_node_name: Option<String>,
    /// Kubernetes: the pod's service-account directory (token, ca.crt).
    #[arg(long, env = "EBS_AGENT_SERVICE_ACCOUNT_DIR", default_value = DEFAULT_SERVICE_ACCOUNT_DIR)]
    pub service_account_dir: PathBuf,
}

impl KubeArgs {
    fn in_cluster(&self) -> Result<InCluster, String> {
        InCluster::detect(
            |k| std::env::var(k).ok(),
            &self.service_account_dir,
            self.kube_node_name.as_deref(),
        )
    }
}

/// `serve`: starts the startup-taint removal in the background, or logs why not. Returns at once.
pub fn spawn_taint_removal(args: &ServeArgs) {
    if !args.mode.serves_node() {
        return;
    }
    if args.startup_taint_removal_disabled {
        tracing::info!("startup taint removal: off (--startup-taint-removal-disabled)");
        return;
    }
    let cfg = match args.kube.in_cluster() {
        Ok(cfg) => cfg,
        Err(why) => {
            tracing::info!("startup taint removal: off, {why}");
            return;
        }
    };
    let client = match Client::new(&cfg) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "startup taint removal: off, the service account's CA cannot be used");
            return;
        }
    };
    let mut settings = taint::Settings::new(&args.driver_name);
    settings.window = args.startup_taint_window;
    settings.count_expected = reports_attach_limit(args);
    tracing::info!(node = %cfg.node_name, window = ?settings.window,
        waits_for_count = settings.count_expected, "startup taint removal: on");
    tokio::spawn(async move {
        taint::remove_startup_taint(&client, &cfg.node_name, &settings).await;
    });
}

/// NodeGetInfo's max_volumes_per_node is above 0, so kubelet puts an allocatable count in
/// CSINode: always with ebs (computed or --volume-attach-limit), with loop only when
/// --volume-attach-limit is above 0 (server.rs: loop devices are allocated on demand).
fn reports_attach_limit(args: &ServeArgs) -> bool {
    match args.backend {
        crate::settings::BackendKind::Ebs => true,
        crate::settings::BackendKind::Loop => args.volume_attach_limit > 0,
    }
}

#[derive(clap::Args, Debug)]
pub struct PreStopArgs {
    /// The CSI driver name whose VolumeAttachments are waited for.
    #[arg(long, env = "EBS_AGENT_DRIVER_NAME", default_value = DEFAULT_DRIVER_NAME)]
    pub driver_name: String,
    /// The longest wait for volumes to detach. Keep it below the pod's
    /// terminationGracePeriodSeconds minus the agent's --shutdown-grace.
    #[arg(long, env = "EBS_AGENT_PRE_STOP_TIMEOUT", default_value = "40s", value_parser = parse_duration)]
    pub timeout: Duration,
    #[command(flatten)]
    pub kube: KubeArgs,
}

/// `pre-stop`: exit code 0 when done or nothing to do (also outside a pod), 1 when the time ran
/// out or the API server could not be asked (kubelet records a failed hook and stops the pod).
pub async fn pre_stop(args: PreStopArgs) -> i32 {
    let cfg = match args.kube.in_cluster() {
        Ok(cfg) => cfg,
        Err(why) => {
            tracing::info!("pre-stop: nothing to do, {why}");
            return 0;
        }
    };
    let client = match Client::new(&cfg) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "pre-stop: cannot use the service account");
            return 1;
        }
    };
    let settings = prestop::Settings {
        driver: args.driver_name,
        timeout: args.timeout,
    };
    match prestop::pre_stop(&client, &cfg.node_name, &settings).await {
        Ok(prestop::Outcome::NotDraining | prestop::Outcome::Detached { .. }) => 0,
        Ok(prestop::Outcome::TimedOut { .. }) => 1,
        Err(e) => {
            tracing::error!(error = %e, "pre-stop: cannot read the node");
            1
        }
    }
}
