//! Translation for NodeGetVolumeStats and NodeExpandVolume: domain results to CSI messages.

use csi::volume_usage::Unit;
use ebs_proto::csi::v1 as csi;

use ebs_node_core::error::Result;
use ebs_node_core::node::stats::{Counts, Usage, VolumeStats};
use ebs_node_core::request::ValidationError;

/// (required, limit) with 0 for "not set"; negative sizes are INVALID_ARGUMENT.
pub fn capacity_range(range: Option<&csi::CapacityRange>) -> Result<(u64, u64)> {
    let Some(r) = range else { return Ok((0, 0)) };
    if r.required_bytes < 0 || r.limit_bytes < 0 {
        return Err(ValidationError::bad(
            "capacity_range",
            format!("{}..{}", r.required_bytes, r.limit_bytes),
            "sizes must not be negative",
        )
        .into());
    }
    Ok((r.required_bytes as u64, r.limit_bytes as u64))
}

fn usage(c: Counts, unit: Unit) -> csi::VolumeUsage {
    csi::VolumeUsage {
        available: c.available as i64,
        total: c.total as i64,
        used: c.used as i64,
        unit: unit as i32,
    }
}

pub fn response(stats: VolumeStats) -> csi::NodeGetVolumeStatsResponse {
    let usage = match stats.usage {
        Some(Usage::Filesystem { bytes, inodes }) => {
            vec![usage(bytes, Unit::Bytes), usage(inodes, Unit::Inodes)]
        }
        // The spec: for block volumes, total only.
        Some(Usage::Block { total_bytes }) => vec![csi::VolumeUsage {
            total: total_bytes as i64,
            unit: Unit::Bytes as i32,
            ..Default::default()
        }],
        None => Vec::new(),
    };
    csi::NodeGetVolumeStatsResponse {
        usage,
        volume_condition: Some(csi::VolumeCondition {
            abnormal: stats.condition.abnormal,
            message: stats.condition.message,
        }),
    }
}
