//! The agent's own metric families, through the prometheus crate: the histograms observed as
//! calls and steps end (the crate's vectors: a hashed lookup under a read lock and atomic adds,
//! where the hand-written families allocated the label set on every observation), the
//! listener's counters, and the state gauges made afresh at each scrape from their sources, so
//! they can never drift from the truth. Rendered in the text format 0.0.4, families in name
//! order, labels in name order (the crate's order; the hand-written exposition kept them in
//! declaration order, which Prometheus does not tell apart).

use std::sync::LazyLock;

use prometheus::core::Collector;
use prometheus::proto::{Counter, Metric, MetricFamily, MetricType};
use prometheus::{Gauge, HistogramOpts, HistogramVec, IntCounter, Opts};

/// Bucket upper bounds in seconds for whole operations and host steps (mkfs, fsck, grow).
const OPERATION_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];

/// Bucket upper bounds in seconds for state-file commits (an fsync is 0.1–20 ms).
const COMMIT_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
];

const RPC_COUNT: (&str, &str) = (
    "ebs_agent_rpc_requests_total",
    "CSI calls by method and gRPC status code.",
);

pub static RPCS: LazyLock<HistogramVec> = LazyLock::new(|| {
    histograms(
        RPCS_NAME,
        "CSI calls by method and gRPC status code.",
        &["rpc", "code"],
        OPERATION_BUCKETS,
    )
});
pub static STEPS: LazyLock<HistogramVec> = LazyLock::new(|| {
    histograms(
        "ebs_agent_step_duration_seconds",
        "Journaled host steps (probe, format, check, mount, grow, bind, unmount) by operation and result.",
        &["op", "step", "result"],
        OPERATION_BUCKETS,
    )
});
pub static COMMITS: LazyLock<HistogramVec> = LazyLock::new(|| {
    histograms(
        "ebs_agent_journal_commit_seconds",
        "State-file commits of journal records, by durability (immediate = fsync'd).",
        &["durability"],
        COMMIT_BUCKETS,
    )
});

pub static REFUSED: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "ebs_agent_metrics_connections_refused_total",
        "Metrics connections closed on accept because the connection cap was reached and every \
         slot was answering.",
    )
});
pub static EVICTED: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "ebs_agent_metrics_connections_evicted_total",
        "Metrics connections closed while still sending their request, to make room for a new \
         one at the connection cap.",
    )
});
pub static TIMED_OUT: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "ebs_agent_metrics_connections_timed_out_total",
        "Metrics connections dropped for sending a request or taking the answer too slowly.",
    )
});

// The names, helps, labels and buckets above are constants that the crate accepts (its own
// checks, run by `the_families_are_valid`): a failure here is a bug in this file.
fn histograms(name: &str, help: &str, labels: &[&str], buckets: &[f64]) -> HistogramVec {
    let opts = HistogramOpts::new(name, help).buckets(buckets.to_vec());
    HistogramVec::new(opts, labels).expect("a valid histogram family")
}

fn counter(name: &str, help: &str) -> IntCounter {
    IntCounter::new(name, help).expect("a valid counter")
}

/// One scrape's families: the observed ones, the calls counted from the RPC histogram (one
/// observation, two families, never apart), `gauges` (name, help, value) and the mount-table
/// reads so far, in name order.
pub fn gather(
    gauges: &[(&str, &str, f64)],
    mount_table_reads: u64,
    build_version: &str,
) -> Vec<MetricFamily> {
    let mut families = Vec::new();
    let collectors: [&dyn Collector; 6] = [
        &*RPCS,
        &*STEPS,
        &*COMMITS,
        &*REFUSED,
        &*EVICTED,
        &*TIMED_OUT,
    ];
    for c in collectors {
        families.extend(c.collect());
    }
    if let Some(rpcs) = families.iter().find(|f| f.name() == RPCS_NAME) {
        families.push(counted(rpcs));
    }
    let info = Opts::new("ebs_agent_build_info", "The running agent's version.")
        .const_label("version", build_version);
    families.extend(gauge(info, 1.0));
    for &(name, help, value) in gauges {
        families.extend(gauge(Opts::new(name, help), value));
    }
    let reads = counter(
        "ebs_agent_mount_table_reads_total",
        "Reads of the whole mount table (/proc/self/mountinfo): start-up recovery and the \
         fallbacks only; node calls ask the kernel about one path.",
    );
    reads.inc_by(mount_table_reads);
    families.extend(reads.collect());
    drop_empty(&mut families);
    for f in &mut families {
        // Series in label order, as a registry's gather would (a vector's map has none).
        f.mut_metric()
            .sort_by(|a, b| label_values(a).cmp(&label_values(b)));
    }
    families.sort_by(|a, b| a.name().cmp(b.name()));
    families
}

/// A family with no series yet (a histogram never observed) is left out: the text encoder
/// refuses one, and would end the exposition there.
fn drop_empty(families: &mut Vec<MetricFamily>) {
    families.retain(|f| !f.get_metric().is_empty());
}

const RPCS_NAME: &str = "ebs_agent_rpc_duration_seconds";

fn gauge(opts: Opts, value: f64) -> Vec<MetricFamily> {
    match Gauge::with_opts(opts) {
        Ok(g) => {
            g.set(value);
            g.collect()
        }
        // A gauge's name and help are constants of `render`'s (`exposition_has_every_family`
        // reads each back): a refusal is a bug, said in the log rather than lost silently.
        Err(e) => {
            tracing::warn!(error = %e, "a gauge was left out of the metrics");
            Vec::new()
        }
    }
}

/// The RPC histogram's counts as a counter family of their own.
fn counted(histogram: &MetricFamily) -> MetricFamily {
    let mut family = MetricFamily::default();
    family.set_name(RPC_COUNT.0.to_string());
    family.set_help(RPC_COUNT.1.to_string());
    family.set_field_type(MetricType::COUNTER);
    for m in histogram.get_metric() {
        let mut counter = Counter::default();
        counter.set_value(m.get_histogram().get_sample_count() as f64);
        let mut metric = Metric::default();
        metric.set_label(m.get_label().to_vec());
        metric.set_counter(counter);
        family.mut_metric().push(metric);
    }
    family
}

fn label_values(m: &Metric) -> Vec<&str> {
    m.get_label().iter().map(|l| l.value()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(families: &[MetricFamily]) -> String {
        let mut out = String::new();
        prometheus::TextEncoder::new()
            .encode_utf8(families, &mut out)
            .expect("encodes");
        out
    }

    /// Every family the agent exports is one the crate accepts: a name it refused would drop
    /// the family from every scrape without a word.
    #[test]
    fn the_families_are_valid() {
        let gauges = [("ebs_agent_ready", "ready", 1.0), ("ebs_agent_x", "x", 2.0)];
        RPCS.with_label_values(&["Probe", "OK"]).observe(0.001);
        STEPS
            .with_label_values(&["stage", "mount", "ok"])
            .observe(0.001);
        COMMITS.with_label_values(&["lazy"]).observe(0.001);
        let names: Vec<String> = gather(&gauges, 3, "0.1.0")
            .iter()
            .map(|f| f.name().to_string())
            .collect();
        for want in [
            "ebs_agent_build_info",
            "ebs_agent_journal_commit_seconds",
            "ebs_agent_metrics_connections_evicted_total",
            "ebs_agent_metrics_connections_refused_total",
            "ebs_agent_metrics_connections_timed_out_total",
            "ebs_agent_mount_table_reads_total",
            "ebs_agent_ready",
            "ebs_agent_rpc_duration_seconds",
            "ebs_agent_rpc_requests_total",
            "ebs_agent_step_duration_seconds",
            "ebs_agent_x",
        ] {
            assert!(names.iter().any(|n| n == want), "{want} missing: {names:?}");
        }
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(names, sorted, "families in name order");
    }

    /// A histogram never observed is left out, not the end of the exposition.
    #[test]
    fn an_empty_family_ends_nothing() {
        let never = histograms("t_never_seconds", "never", &["x"], &[1.0]);
        let mut families = never.collect();
        families.extend(counter("t_after_total", "after").collect());
        drop_empty(&mut families);
        assert!(text(&families).contains("t_after_total 0\n"));
    }

    /// Buckets are cumulative, `le` is spelled as before, label values are escaped, and the
    /// request counter is the histogram's count.
    #[test]
    fn buckets_are_cumulative_and_labels_escaped() {
        let h = histograms("t_seconds", "test", &["rpc"], &[0.01, 0.1]);
        for s in [0.005, 0.05, 5.0] {
            h.with_label_values(&["a\"b"]).observe(s);
        }
        let mut families = h.collect();
        let mut count = counted(&families[0]);
        count.set_name("t_total".into());
        families.push(count);
        let out = text(&families);
        assert!(out.contains("# TYPE t_seconds histogram\n"), "{out}");
        assert!(out.contains("t_seconds_bucket{rpc=\"a\\\"b\",le=\"0.01\"} 1\n"));
        assert!(out.contains("t_seconds_bucket{rpc=\"a\\\"b\",le=\"0.1\"} 2\n"));
        assert!(out.contains("t_seconds_bucket{rpc=\"a\\\"b\",le=\"+Inf\"} 3\n"));
        assert!(out.contains("t_seconds_count{rpc=\"a\\\"b\"} 3\n"));
        assert!(out.contains("t_seconds_sum{rpc=\"a\\\"b\"} 5.055\n"));
        assert!(
            out.contains("# TYPE t_total counter\nt_total{rpc=\"a\\\"b\"} 3\n"),
            "{out}"
        );
    }
}
