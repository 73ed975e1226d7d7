//! Generated code only: the wire types, servers and clients of the protocols the agent serves.
//!
//! Module paths mirror the proto packages (`csi.v1`, `identity`, `reclaimspace`), because
//! prost refers to types of other packages by relative paths (`super::csi::v1::...`).

#![allow(clippy::all, clippy::pedantic)]

/// CSI v1.12.0 (`package csi.v1`).
pub mod csi {
    pub mod v1 {
        tonic::include_proto!("csi.v1");
    }
}

/// CSI-Addons Identity service (`package identity`).
pub mod identity {
    tonic::include_proto!("identity");
}

/// CSI-Addons ReclaimSpace services (`package reclaimspace`).
pub mod reclaimspace {
    tonic::include_proto!("reclaimspace");
}

/// The CSI-Addons protocols, grouped.
pub mod addons {
    pub use super::identity;
    pub use super::reclaimspace;
}

/// The agent's own admin service (status of a running agent).
pub mod admin {
    tonic::include_proto!("ebs_node_agent.admin.v1");
}
