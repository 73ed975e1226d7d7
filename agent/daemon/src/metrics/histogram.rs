//! Labelled histograms with fixed buckets, rendered in the Prometheus text format (0.0.4).
//! A mutex per family is enough: observations are a few per RPC, scrapes a few per minute.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;

/// Bucket upper bounds in seconds for whole operations and host steps (mkfs, fsck, grow).
pub const OPERATION_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];

/// Bucket upper bounds in seconds for state-file commits (an fsync is 0.1–20 ms).
pub const COMMIT_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
];

#[derive(Clone, Debug, Default)]
struct Histogram {
    /// Per-bucket (not cumulative) counts; one more than the bounds for +Inf.
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

/// One metric name: a histogram per distinct label set.
pub struct Family {
    name: &'static str,
    help: &'static str,
    label_names: &'static [&'static str],
    bounds: &'static [f64],
    series: Mutex<BTreeMap<Vec<String>, Histogram>>,
}

impl Family {
    pub const fn new(
        name: &'static str,
        help: &'static str,
        label_names: &'static [&'static str],
        bounds: &'static [f64],
    ) -> Self {
        Family {
            name,
            help,
            label_names,
            bounds,
            series: Mutex::new(BTreeMap::new()),
        }
    }

    pub fn observe(&self, labels: &[&str], seconds: f64) {
        let key: Vec<String> = labels.iter().map(|l| l.to_string()).collect();
        let mut series = self.series.lock().unwrap_or_else(|p| p.into_inner());
        let h = series.entry(key).or_insert_with(|| Histogram {
            counts: vec![0; self.bounds.len() + 1],
            ..Default::default()
        });
        let slot = self
            .bounds
            .iter()
            .position(|b| seconds <= *b)
            .unwrap_or(self.bounds.len());
        h.counts[slot] += 1;
        h.sum += seconds;
        h.count += 1;
    }

    fn snapshot(&self) -> BTreeMap<Vec<String>, Histogram> {
        self.series
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// `<name>_bucket`, `_sum` and `_count` for every label set seen.
    pub fn render_histogram(&self, out: &mut String) {
        header(out, self.name, self.help, "histogram");
        for (values, h) in self.snapshot() {
            let labels = label_pairs(self.label_names, &values);
            let mut cumulative = 0;
            for (i, bound) in self.bounds.iter().enumerate() {
                cumulative += h.counts[i];
                let le = format!("{bound}");
                let _ = writeln!(
                    out,
                    "{}_bucket{{{}}} {cumulative}",
                    self.name,
                    join(&labels, &[("le", &le)])
                );
            }
            let _ = writeln!(
                out,
                "{}_bucket{{{}}} {}",
                self.name,
                join(&labels, &[("le", "+Inf")]),
                h.count
            );
            let _ = writeln!(out, "{}_sum{{{}}} {}", self.name, join(&labels, &[]), h.sum);
            let _ = writeln!(
                out,
                "{}_count{{{}}} {}",
                self.name,
                join(&labels, &[]),
                h.count
            );
        }
    }

    /// The same observations as a counter: how many, per label set.
    pub fn render_count_as_counter(&self, name: &str, help: &str, out: &mut String) {
        header(out, name, help, "counter");
        for (values, h) in self.snapshot() {
            let labels = label_pairs(self.label_names, &values);
            let _ = writeln!(out, "{name}{{{}}} {}", join(&labels, &[]), h.count);
        }
    }
}

pub fn header(out: &mut String, name: &str, help: &str, kind: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

pub fn gauge(out: &mut String, name: &str, help: &str, value: f64) {
    header(out, name, help, "gauge");
    let _ = writeln!(out, "{name} {value}");
}

fn label_pairs(names: &[&str], values: &[String]) -> Vec<(String, String)> {
    names
        .iter()
        .zip(values)
        .map(|(n, v)| (n.to_string(), escape(v)))
        .collect()
}

fn join(labels: &[(String, String)], extra: &[(&str, &str)]) -> String {
    labels
        .iter()
        .map(|(n, v)| format!("{n}=\"{v}\""))
        .chain(extra.iter().map(|(n, v)| format!("{n}=\"{v}\"")))
        .collect::<Vec<_>>()
        .join(",")
}

/// Label values escape backslash, double quote and newline (text format 0.0.4).
pub fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_cumulative_and_labels_escaped() {
        let f = Family::new("t_seconds", "test", &["rpc"], &[0.01, 0.1]);
        f.observe(&["a\"b"], 0.005);
        f.observe(&["a\"b"], 0.05);
        f.observe(&["a\"b"], 5.0);
        let mut out = String::new();
        f.render_histogram(&mut out);
        assert!(out.contains("# TYPE t_seconds histogram"));
        assert!(out.contains("t_seconds_bucket{rpc=\"a\\\"b\",le=\"0.01\"} 1\n"));
        assert!(out.contains("t_seconds_bucket{rpc=\"a\\\"b\",le=\"0.1\"} 2\n"));
        assert!(out.contains("t_seconds_bucket{rpc=\"a\\\"b\",le=\"+Inf\"} 3\n"));
        assert!(out.contains("t_seconds_count{rpc=\"a\\\"b\"} 3\n"));
        assert!(out.contains("t_seconds_sum{rpc=\"a\\\"b\"} 5.055\n"));
        let mut counter = String::new();
        f.render_count_as_counter("t_total", "calls", &mut counter);
        assert!(counter.contains("# TYPE t_total counter\nt_total{rpc=\"a\\\"b\"} 3\n"));
    }
}
