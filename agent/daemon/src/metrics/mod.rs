//! Prometheus metrics. Observations always go to a process-wide registry (a few mutex-guarded
//! maps: cheap next to any RPC); `--metrics-address` decides whether anyone can scrape them.
//! Gauges that describe state (volumes staged, published, operations in flight) are computed at
//! scrape time from their sources, so they can never drift from the truth.

mod admission;
pub mod ebs;
mod histogram;
mod http;

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use ebs_node_core::records::Durability;
use ebs_store::Store;
use tonic::Code;

use crate::health::Health;
use ebs_node_core::node::VolumeLocks;
use histogram::{COMMIT_BUCKETS, Family, OPERATION_BUCKETS, gauge};

pub use http::{bind, spawn};

static RPCS: Family = Family::new(
    "ebs_agent_rpc_duration_seconds",
    "CSI calls by method and gRPC status code.",
    &["rpc", "code"],
    OPERATION_BUCKETS,
);
static STEPS: Family = Family::new(
    "ebs_agent_step_duration_seconds",
    "Journaled host steps (probe, format, check, mount, grow, bind, unmount) by operation and result.",
    &["op", "step", "result"],
    OPERATION_BUCKETS,
);
static COMMITS: Family = Family::new(
    "ebs_agent_journal_commit_seconds",
    "State-file commits of journal records, by durability (immediate = fsync'd).",
    &["durability"],
    COMMIT_BUCKETS,
);

/// One finished RPC; `code` is `None` for success.
pub fn observe_rpc(rpc: &'static str, code: Option<Code>, ms: f64) {
    RPCS.observe(&[rpc, &code_label(code)], ms / 1000.0);
}

/// One journaled step, from its intent to its done (or failed) record.
pub fn observe_step(op: &str, step: &str, ok: bool, elapsed: Duration) {
    let result = if ok { "ok" } else { "failed" };
    STEPS.observe(&[op, step, result], elapsed.as_secs_f64());
}

pub fn observe_journal_commit(durability: Durability, elapsed: Duration) {
    let label = match durability {
        Durability::Immediate => "immediate",
        Durability::Lazy => "lazy",
    };
    COMMITS.observe(&[label], elapsed.as_secs_f64());
}

/// gRPC's own spelling of status codes, as grpc-go's interceptors label them.
fn code_label(code: Option<Code>) -> String {
    match code {
        None | Some(Code::Ok) => "OK".to_string(),
        Some(c) => format!("{c:?}"),
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

/// The whole exposition, text format 0.0.4.
pub fn render(g: &Gauges) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# HELP ebs_agent_build_info The running agent's version.\n\
         # TYPE ebs_agent_build_info gauge\n\
         ebs_agent_build_info{{version=\"{}\"}} 1",
        env!("CARGO_PKG_VERSION")
    );
    let _ = writeln!(
        out,
        "# HELP ebs_agent_mount_table_reads_total Reads of the whole mount table \
         (/proc/self/mountinfo): start-up recovery and the fallbacks only; node calls ask the \
         kernel about one path.\n\
         # TYPE ebs_agent_mount_table_reads_total counter\n\
         ebs_agent_mount_table_reads_total {}",
        ebs_node_host::mount::at_path::mount_table_reads()
    );
    gauge(
        &mut out,
        "ebs_agent_ready",
        "1 once start-up recovery is done and Probe answers ready.",
        if g.ready { 1.0 } else { 0.0 },
    );
    gauge(
        &mut out,
        "ebs_agent_operations_in_flight",
        "Volume operations running now (each holds its volume's guard).",
        g.in_flight as f64,
    );
    gauge(
        &mut out,
        "ebs_agent_volumes_needing_attention",
        "Volumes whose records could not be checked against the host; their calls are refused \
         until a re-check succeeds (see ebs-node-agent status).",
        g.needing_attention as f64,
    );
    // A state file that cannot be read leaves the gauge out rather than reporting a false zero.
    if let Some(n) = g.staged {
        gauge(
            &mut out,
            "ebs_agent_volumes_staged",
            "Volumes staged on this node.",
            n as f64,
        );
    }
    if let Some(n) = g.published {
        gauge(
            &mut out,
            "ebs_agent_volumes_published",
            "Publications (target paths) on this node.",
            n as f64,
        );
    }
    RPCS.render_count_as_counter(
        "ebs_agent_rpc_requests_total",
        "CSI calls by method and gRPC status code.",
        &mut out,
    );
    RPCS.render_histogram(&mut out);
    STEPS.render_histogram(&mut out);
    COMMITS.render_histogram(&mut out);
    if let Some(e) = &g.ebs {
        ebs::render::render(&mut out, e);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

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
            text.contains("ebs_agent_rpc_requests_total{rpc=\"NodeStageVolume\",code=\"OK\"} ")
        );
        assert!(text.contains("code=\"InvalidArgument\""));
        assert!(text.contains(
            "ebs_agent_step_duration_seconds_count{op=\"stage\",step=\"mount\",result=\"ok\"} "
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
