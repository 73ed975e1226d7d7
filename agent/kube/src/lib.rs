//! What the upstream EBS node pod does with the Kubernetes API besides CSI, and nothing more:
//!
//! - [`taint`]: remove the startup taint `ebs.csi.aws.com/agent-not-ready` from this node once
//!   kubelet has registered the driver (CSINode shows it with an allocatable count), so that pods
//!   needing a volume are not scheduled before the node can take one;
//! - [`prestop`]: on a node being drained, hold the pod's termination until the node's
//!   VolumeAttachments of this driver are gone, so that kubelet can still unstage them and the
//!   attach/detach controller never waits out its 6-minute force-detach.
//!
//! Both run only in a pod: the service account's token and CA, the API server's address from
//! `KUBERNETES_SERVICE_HOST`/`_PORT`, and the node's name from `CSI_NODE_NAME` ([`InCluster`]).
//! On a bare host or under Nomad nothing of this is present and nothing runs.
//!
//! The client is a small one over hyper and rustls (already in the agent): four requests, a JSON
//! patch and a watch, each bounded in time ([`client`]).

pub mod client;
pub mod config;
pub mod objects;
pub mod prestop;
pub mod taint;

pub use client::{Client, Error};
pub use config::{DEFAULT_SERVICE_ACCOUNT_DIR, InCluster};
pub use objects::{DRAIN_TAINTS, STARTUP_TAINT};
