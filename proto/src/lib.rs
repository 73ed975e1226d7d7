//! Generated code only: the wire types, servers and clients of the protocols the agent serves.
//!
//! Module paths mirror the proto packages (`csi.v1`, `identity`, `reclaimspace`), because
//! prost refers to types of other packages by relative paths (`super::csi::v1::...`).

#![allow(clippy::all, clippy::pedantic)]

/// CSI, one module per wire version: `csi` itself is v0.1.0 (`package csi`, Mesos 1.5), `v0` is
/// v0.3.0 (`package csi.v0`, also what v0.2 clients speak), `v1` is v1.12.0 (`package csi.v1`).
pub mod csi {
    tonic::include_proto!("csi");

    pub mod v0 {
        tonic::include_proto!("csi.v0");
    }

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
