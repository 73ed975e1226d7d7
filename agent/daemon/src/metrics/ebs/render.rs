//! The exposition of the EBS statistics, sample for sample what the upstream node's collector
//! writes: the same family names, types and units (page times are microseconds, exported as
//! seconds), per-volume labels `instance_id` and `volume_id` (the instance id as a constant
//! label, so also on the collector's own families), latency histograms whose buckets are the
//! page's bins (upper bound in seconds, cumulative counts, sum 0: the page has no sum), and
//! numbers formatted as Go's client formats them, so `le` strings match upstream's exactly.

use std::collections::HashMap;
use std::fmt::Write as _;

use super::{DURATION_BUCKETS, EbsScrape};
use crate::metrics::text::{escape, header};
use ebs_node_host::nvme::ebs_page::{EbsStats, Histogram};

const US_PER_SECOND: f64 = 1e6;

type Field = fn(&EbsStats) -> f64;
type HistogramOf = fn(&EbsStats) -> &Histogram;

/// Per-volume counters and the queue-length gauge: (name, type, help, value).
const SERIES: [(&str, &str, &str, Field); 11] = [
    (
        "aws_ebs_csi_read_ops_total",
        "counter",
        "Read operations completed.",
        |s| s.total_read_ops as f64,
    ),
    (
        "aws_ebs_csi_write_ops_total",
        "counter",
        "Write operations completed.",
        |s| s.total_write_ops as f64,
    ),
    (
        "aws_ebs_csi_read_bytes_total",
        "counter",
        "Bytes read.",
        |s| s.total_read_bytes as f64,
    ),
    (
        "aws_ebs_csi_write_bytes_total",
        "counter",
        "Bytes written.",
        |s| s.total_write_bytes as f64,
    ),
    (
        "aws_ebs_csi_read_seconds_total",
        "counter",
        "Time spent by all completed read operations, in seconds.",
        |s| s.total_read_time as f64 / US_PER_SECOND,
    ),
    (
        "aws_ebs_csi_write_seconds_total",
        "counter",
        "Time spent by all completed write operations, in seconds.",
        |s| s.total_write_time as f64 / US_PER_SECOND,
    ),
    (
        "aws_ebs_csi_exceeded_iops_seconds_total",
        "counter",
        "Time, in seconds, during which IOPS demand was above the volume's provisioned IOPS.",
        |s| s.ebs_volume_performance_exceeded_iops as f64 / US_PER_SECOND,
    ),
    (
        "aws_ebs_csi_exceeded_tp_seconds_total",
        "counter",
        "Time, in seconds, during which throughput demand was above the volume's provisioned throughput.",
        |s| s.ebs_volume_performance_exceeded_tp as f64 / US_PER_SECOND,
    ),
    (
        "aws_ebs_csi_ec2_exceeded_iops_seconds_total",
        "counter",
        "Time, in seconds, during which the volume was above the instance's maximum EBS IOPS.",
        |s| s.ec2_instance_ebs_performance_exceeded_iops as f64 / US_PER_SECOND,
    ),
    (
        "aws_ebs_csi_ec2_exceeded_tp_seconds_total",
        "counter",
        "Time, in seconds, during which the volume was above the instance's maximum EBS throughput.",
        |s| s.ec2_instance_ebs_performance_exceeded_tp as f64 / US_PER_SECOND,
    ),
    (
        "aws_ebs_csi_volume_queue_length",
        "gauge",
        "Read and write operations waiting to complete, at the time of the scrape.",
        |s| s.volume_queue_length as f64,
    ),
];

const HISTOGRAMS: [(&str, &str, HistogramOf); 2] = [
    (
        "aws_ebs_csi_read_io_latency_seconds",
        "Read operations by the latency bin they completed in, in seconds.",
        |s| &s.read_io_latency_histogram,
    ),
    (
        "aws_ebs_csi_write_io_latency_seconds",
        "Write operations by the latency bin they completed in, in seconds.",
        |s| &s.write_io_latency_histogram,
    ),
];

pub fn render(out: &mut String, s: &EbsScrape) {
    let instance = format!("instance_id=\"{}\"", escape(&s.instance_id));
    let volume_labels: Vec<String> = s
        .volumes
        .iter()
        .map(|(id, _)| format!("{instance},volume_id=\"{}\"", escape(id)))
        .collect();
    if !s.volumes.is_empty() {
        for (name, kind, help, value) in SERIES {
            header(out, name, help, kind);
            for ((_, stats), labels) in s.volumes.iter().zip(&volume_labels) {
                let _ = writeln!(out, "{name}{{{labels}}} {}", go_float(value(stats)));
            }
        }
        // Volumes share their bins: each bound is formatted once.
        let mut bounds: HashMap<u64, String> = HashMap::new();
        for (name, help, histogram) in HISTOGRAMS {
            header(out, name, help, "histogram");
            for ((_, stats), labels) in s.volumes.iter().zip(&volume_labels) {
                let h = histogram(stats);
                let mut cumulative: u64 = 0;
                for bin in &h.bins {
                    cumulative += u64::from(bin.count);
                    let le = bounds
                        .entry(bin.upper)
                        .or_insert_with(|| go_float(bin.upper as f64 / US_PER_SECOND));
                    let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{le}\"}} {cumulative}");
                }
                let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {cumulative}");
                let _ = writeln!(out, "{name}_sum{{{labels}}} 0");
                let _ = writeln!(out, "{name}_count{{{labels}}} {cumulative}");
            }
        }
    }

    let name = "aws_ebs_csi_nvme_collector_duration_seconds";
    header(
        out,
        name,
        "Time the NVMe statistics collector took per scrape, in seconds.",
        "histogram",
    );
    let mut cumulative = 0;
    for (bound, n) in DURATION_BUCKETS.iter().zip(s.duration.counts) {
        cumulative += n;
        let le = go_float(*bound);
        let _ = writeln!(out, "{name}_bucket{{{instance},le=\"{le}\"}} {cumulative}");
    }
    let count = s.duration.count;
    let _ = writeln!(out, "{name}_bucket{{{instance},le=\"+Inf\"}} {count}");
    let _ = writeln!(out, "{name}_sum{{{instance}}} {}", go_float(s.duration.sum));
    let _ = writeln!(out, "{name}_count{{{instance}}} {count}");
    for (name, help, value) in [
        (
            "aws_ebs_csi_nvme_collector_scrapes_total",
            "Scrapes of the NVMe statistics collector.",
            s.scrapes,
        ),
        (
            "aws_ebs_csi_nvme_collector_errors_total",
            "Volumes (or listings) the NVMe statistics collector failed to read, over all scrapes.",
            s.errors,
        ),
    ] {
        header(out, name, help, "counter");
        let _ = writeln!(out, "{name}{{{instance}}} {value}");
    }
    let name = "ebs_agent_ebs_stats_errors_total";
    header(
        out,
        name,
        "The collector's failures by reason (the agent's own breakdown of aws_ebs_csi_nvme_collector_errors_total).",
        "counter",
    );
    for (reason, n) in &s.errors_by_reason {
        let _ = writeln!(out, "{name}{{reason=\"{}\"}} {n}", reason.as_str());
    }
}

/// A number as Go's `strconv.FormatFloat(v, 'g', -1, 64)` writes it, which is how the Prometheus
/// Go client writes values and `le` bounds: the shortest digits that read back the same, in
/// exponent form (`8e-06`, `1.5e+07`) when the decimal exponent is below -4 or at least 6.
pub fn go_float(v: f64) -> String {
    if v.is_nan() {
        return "NaN".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "+Inf" } else { "-Inf" }.into();
    }
    if v == 0.0 {
        return "0".into();
    }
    let sci = format!("{v:e}");
    let Some((mantissa, exp)) = sci.split_once('e') else {
        return format!("{v}");
    };
    let exp: i32 = exp.parse().unwrap_or(0);
    if (-4..6).contains(&exp) {
        format!("{v}")
    } else {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exp.unsigned_abs())
    }
}
