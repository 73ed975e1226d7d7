//! Prometheus metrics. Observations always go to a process-wide registry (a few mutex-guarded
//! maps: cheap next to any RPC); `--metrics-address` decides whether anyone can scrape them.
//! Gauges that describe state (volumes staged, published, operations in flight) are computed at
//! scrape time from their sources, so they can never drift from the truth.

mod admission;
pub mod ebs;
mod families;
mod http;
mod text;

use std::sync::Arc;
use std::time::Duration;

use ebs_node_core::records::Durability;
use ebs_store::Store;
use tonic::Code;

use crate::health::Health;
use ebs_node_core::node::VolumeLocks;
use families::{COMMITS, RPCS, STEPS};

pub use http::{bind, spawn};

/// One finished RPC; `code` is `None` for success.
pub fn observe_rpc(rpc: &'static str, code: Option<Code>, ms: f64) {
    RPCS.with_label_values(&[rpc, code_label(code)])
        .observe(ms / 1000.0);
}

/// One journaled step, from its intent to its done (or failed) record.
pub fn observe_step(op: &str, step: &str, ok: bool, elapsed: Duration) {
    let result = if ok { "ok" } else { "failed" };
    STEPS
        .with_label_values(&[op, step, result])
        .observe(elapsed.as_secs_f64());
}

pub fn observe_journal_commit(durability: Durability, elapsed: Duration) {
    let label = match durability {
        Durability::Immediate => "immediate",
        Durability::Boot => "boot",
        Durability::Lazy => "lazy",
    };
    COMMITS
        .with_label_values(&[label])
        .observe(elapsed.as_secs_f64());
}

/// gRPC's own spelling of status codes, as grpc-go's interceptors label them.
fn code_label(code: Option<Code>) -> &'static str {
    match code.unwrap_or(Code::Ok) {
        Code::Ok => "OK",
        Code::Cancelled => "Canceled",
        Code::Unknown => "Unknown",
        Code::InvalidArgument => "InvalidArgument",
        Code::DeadlineExceeded => "DeadlineExceeded",
        Code::NotFound => "NotFound",
        Code::AlreadyExists => "AlreadyExists",
        Code::PermissionDenied => "PermissionDenied",
        Code::ResourceExhausted => "ResourceExhausted",
        Code::FailedPrecondition => "FailedPrecondition",
        Code::Aborted => "Aborted",
        Code::OutOfRange => "OutOfRange",
        Code::Unimplemented => "Unimplemented",
        Code::Internal => "Internal",
        Code::Unavailable => "Unavailable",
        Code::DataLoss => "DataLoss",
        Code::Unauthenticated => "Unauthenticated",
    }
}

/// Where the scrape-time gauges come from.
pub struct Sources {
    pub store: Arc<Store>,
    pub locks: VolumeLocks,
    pub health: Arc<Health>,
    pub attention: Arc<crate::node::attention::Attention>,
    /// EBS volumes' NVMe statistics, read at scrape time (the ebs backend); `None`: not exported.
    pub ebs_stats: Option<ebs::EbsStatsSource>,
}

/// The state gauges, read at scrape time (blocking: store reads).
pub struct Gauges {
    pub in_flight: usize,
    pub staged: Option<usize>,
    pub published: Option<usize>,
    pub ready: bool,
    pub needing_attention: usize,
    pub ebs: Option<ebs::EbsScrape>,
}

impl Sources {
    pub fn gauges(&self) -> Gauges {
        Gauges {
            in_flight: self.locks.in_flight(),
            staged: self.store.all_staged().ok().map(|v| v.len()),
            published: self.store.all_publications().ok().map(|v| v.len()),
            ready: self.health.is_ready(),
            needing_attention: self.attention.count(),
            ebs: self.ebs_stats.as_ref().map(|e| e.scrape(&self.store)),
        }
    }
}

/// The whole exposition, text format 0.0.4: the agent's own families (`families`), then the EBS
/// statistics (`ebs::render`, upstream's formatting).
pub fn render(g: &Gauges) -> String {
    let reads = ebs_node_host::mount::at_path::mount_table_reads();
    let mut gauges = vec![
        (
            "ebs_agent_ready",
            "1 once start-up recovery is done and Probe answers ready.",
            if g.ready { 1.0 } else { 0.0 },
        ),
        (
            "ebs_agent_operations_in_flight",
            "Volume operations running now (each holds its volume's guard).",
            g.in_flight as f64,
        ),
        (
            "ebs_agent_volumes_needing_attention",
            "Volumes whose records could not be checked against the host; their calls are \
             refused until a re-check succeeds (see ebs-node-agent status).",
            g.needing_attention as f64,
        ),
    ];
    // A state file that cannot be read leaves the gauge out rather than reporting a false zero.
    if let Some(n) = g.staged {
        gauges.push((
            "ebs_agent_volumes_staged",
            "Volumes staged on this node.",
            n as f64,
        ));
    }
    if let Some(n) = g.published {
        gauges.push((
            "ebs_agent_volumes_published",
            "Publications (target paths) on this node.",
            n as f64,
        ));
    }
    let families = families::gather(&gauges, reads, env!("CARGO_PKG_VERSION"));
    let mut out = String::new();
    // The encoder stops at a family it refuses (no series, no name; `families` leaves none
    // out that way): what it wrote stays, and the rest is said in the log, not lost silently.
    if let Err(e) = prometheus::TextEncoder::new().encode_utf8(&families, &mut out) {
        tracing::warn!(error = %e, "the metrics exposition stopped short");
    }
    if let Some(e) = &g.ebs {
        ebs::render::render(&mut out, e);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// grpc-go's names (`codes.Canceled.String()`), not tonic's Debug spelling.
    #[test]
    fn codes_are_spelled_as_grpc_go_spells_them() {
        assert_eq!(code_label(Some(Code::Cancelled)), "Canceled");
        assert_eq!(code_label(None), "OK");
        assert_eq!(code_label(Some(Code::DeadlineExceeded)), "DeadlineExceeded");
    }

    #[test]
    fn exposition_has_every_family() {
        observe_rpc("NodeStageVolume", None, 12.0);
        observe_rpc("NodeStageVolume", Some(Code::InvalidArgument), 0.2);
        observe_step("stage", "mount", true, Duration::from_millis(3));
        observe_journal_commit(Durability::Immediate, Duration::from_micros(800));
        let text = render(&Gauges {
            in_flight: 2,
            staged: Some(1),
            published: None,
            ready: true,
            needing_attention: 1,
            ebs: None,
        });
        assert!(
            text.contains("ebs_agent_rpc_requests_total{code=\"OK\",rpc=\"NodeStageVolume\"} ")
        );
        assert!(text.contains("code=\"InvalidArgument\""));
        assert!(text.contains(
            "ebs_agent_step_duration_seconds_count{op=\"stage\",result=\"ok\",step=\"mount\"} "
        ));
        assert!(text.contains(
            "ebs_agent_journal_commit_seconds_bucket{durability=\"immediate\",le=\"0.001\"} "
        ));
        assert!(text.contains("ebs_agent_operations_in_flight 2\n"));
        assert!(text.contains("ebs_agent_volumes_needing_attention 1\n"));
        assert!(text.contains("\nebs_agent_mount_table_reads_total "));
        assert!(text.contains("ebs_agent_volumes_staged 1\n"));
        assert!(!text.contains("ebs_agent_volumes_published"));
    }
}
