//! Our `aws_ebs_csi_*` families against the upstream node's, written down from
//! kubernetes-sigs/aws-ebs-csi-driver `pkg/metrics/nvme.go` (NewNVMECollector and Collect):
//! every name, its type, the label names of its samples (`le` aside), and the bucket bounds of
//! the collector's duration histogram. Dashboards and alerts key on exactly these.

use std::collections::{BTreeMap, BTreeSet};

use super::*;
use crate::metrics::ebs::render::go_float;

const PER_VOLUME: &[&str] = &["instance_id", "volume_id"];
const COLLECTOR: &[&str] = &["instance_id"];

const UPSTREAM: &[(&str, &str, &[&str])] = &[
    ("aws_ebs_csi_read_ops_total", "counter", PER_VOLUME),
    ("aws_ebs_csi_write_ops_total", "counter", PER_VOLUME),
    ("aws_ebs_csi_read_bytes_total", "counter", PER_VOLUME),
    ("aws_ebs_csi_write_bytes_total", "counter", PER_VOLUME),
    ("aws_ebs_csi_read_seconds_total", "counter", PER_VOLUME),
    ("aws_ebs_csi_write_seconds_total", "counter", PER_VOLUME),
    (
        "aws_ebs_csi_exceeded_iops_seconds_total",
        "counter",
        PER_VOLUME,
    ),
    (
        "aws_ebs_csi_exceeded_tp_seconds_total",
        "counter",
        PER_VOLUME,
    ),
    (
        "aws_ebs_csi_ec2_exceeded_iops_seconds_total",
        "counter",
        PER_VOLUME,
    ),
    (
        "aws_ebs_csi_ec2_exceeded_tp_seconds_total",
        "counter",
        PER_VOLUME,
    ),
    ("aws_ebs_csi_volume_queue_length", "gauge", PER_VOLUME),
    (
        "aws_ebs_csi_read_io_latency_seconds",
        "histogram",
        PER_VOLUME,
    ),
    (
        "aws_ebs_csi_write_io_latency_seconds",
        "histogram",
        PER_VOLUME,
    ),
    (
        "aws_ebs_csi_nvme_collector_scrapes_total",
        "counter",
        COLLECTOR,
    ),
    (
        "aws_ebs_csi_nvme_collector_errors_total",
        "counter",
        COLLECTOR,
    ),
    (
        "aws_ebs_csi_nvme_collector_duration_seconds",
        "histogram",
        COLLECTOR,
    ),
];

const UPSTREAM_DURATION_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// `name{a="x",b="y"} value` -> (name, [(label, value)]).
fn sample(line: &str) -> (String, Vec<(String, String)>) {
    let (head, _value) = line.rsplit_once(' ').unwrap();
    let Some((name, labels)) = head.split_once('{') else {
        return (head.to_string(), vec![]);
    };
    let labels = labels.strip_suffix('}').unwrap();
    let pairs = labels
        .split("\",")
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once("=\"").unwrap();
            (k.to_string(), v.trim_end_matches('"').to_string())
        })
        .collect();
    (name.to_string(), pairs)
}

struct Family {
    kind: String,
    label_sets: BTreeSet<Vec<String>>,
    suffixes: BTreeSet<String>,
    le: Vec<String>,
}

fn families(text: &str) -> BTreeMap<String, Family> {
    let mut out: BTreeMap<String, Family> = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            let f = Family {
                kind: kind.into(),
                label_sets: BTreeSet::new(),
                suffixes: BTreeSet::new(),
                le: vec![],
            };
            assert!(
                out.insert(name.into(), f).is_none(),
                "{name} declared twice"
            );
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let (name, labels) = sample(line);
        let (family, suffix) = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| {
                let base = name.strip_suffix(s)?;
                (out.get(base)?.kind == "histogram").then(|| (base.to_string(), s.to_string()))
            })
            .unwrap_or((name.clone(), String::new()));
        let f = out
            .get_mut(&family)
            .unwrap_or_else(|| panic!("{name}: sample before its TYPE"));
        let mut names: Vec<String> = labels
            .iter()
            .map(|(k, _)| k.clone())
            .filter(|k| k != "le")
            .collect();
        names.sort();
        if let Some((_, le)) = labels.iter().find(|(k, _)| k == "le") {
            assert_eq!(suffix, "_bucket", "{line}");
            f.le.push(le.clone());
        }
        f.label_sets.insert(names);
        f.suffixes.insert(suffix);
    }
    out
}

#[test]
fn names_types_and_labels_match_upstream() {
    let mut env = Env::new("upstream", |_| {});
    env.staged("vol-0a", Some(EBS_MODEL));
    env.staged("vol-0b", Some(EBS_MODEL));
    let (_, text) = env.scrape();
    let ours = families(&text);
    let ours_aws: BTreeMap<&str, &Family> = ours
        .iter()
        .filter(|(n, _)| n.starts_with("aws_ebs_csi_"))
        .map(|(n, f)| (n.as_str(), f))
        .collect();
    let names: BTreeSet<&str> = ours_aws.keys().copied().collect();
    let upstream: BTreeSet<&str> = UPSTREAM.iter().map(|(n, _, _)| *n).collect();
    assert_eq!(names, upstream, "family names differ from upstream's");
    for (name, kind, labels) in UPSTREAM {
        let f = ours_aws[name];
        assert_eq!(f.kind, *kind, "{name}");
        let want: BTreeSet<Vec<String>> = [labels.iter().map(|l| l.to_string()).collect()].into();
        assert_eq!(f.label_sets, want, "{name}: label names");
        if *kind == "histogram" {
            let parts: BTreeSet<String> = ["_bucket", "_sum", "_count"].map(String::from).into();
            assert_eq!(f.suffixes, parts, "{name}");
            assert_eq!(f.le.last().map(String::as_str), Some("+Inf"), "{name}");
        }
    }
    let mut buckets: Vec<String> = UPSTREAM_DURATION_BUCKETS
        .iter()
        .map(|b| go_float(*b))
        .collect();
    buckets.push("+Inf".into());
    assert_eq!(
        ours_aws["aws_ebs_csi_nvme_collector_duration_seconds"].le,
        buckets
    );
}

#[test]
fn without_volumes_only_the_collector_families_appear() {
    // Upstream describes the per-volume families but writes no sample of them then.
    let env = Env::new("upstream-empty", |_| {});
    let (_, text) = env.scrape();
    let names: BTreeSet<String> = families(&text)
        .into_keys()
        .filter(|n| n.starts_with("aws_ebs_csi_"))
        .collect();
    let want: BTreeSet<String> = UPSTREAM
        .iter()
        .filter(|(_, _, labels)| *labels == COLLECTOR)
        .map(|(n, _, _)| n.to_string())
        .collect();
    assert_eq!(names, want);
}
