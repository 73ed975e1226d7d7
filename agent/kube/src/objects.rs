//! The few fields of Node, CSINode and VolumeAttachment the duties read, and the decisions on
//! them, free of I/O (unit-tested here, proven against a real API server in tests/tests).

use serde::Deserialize;
use serde_json::{Value, json};

/// The taint a cluster puts on new nodes so that no pod needing a volume lands before the
/// driver is registered (Karpenter `startupTaints`, EKS node groups); upstream's key.
pub const STARTUP_TAINT: &str = "ebs.csi.aws.com/agent-not-ready";

/// Taints that mean the node is being drained: `kubectl drain` (cordon), the cluster
/// autoscaler, Karpenter v1 and v1beta1. Upstream's list (cmd/hooks/prestop.go, v1.64).
pub const DRAIN_TAINTS: [&str; 4] = [
    "node.kubernetes.io/unschedulable",
    "ToBeDeletedByClusterAutoscaler",
    "karpenter.sh/disrupted",
    "karpenter.sh/disruption",
];

#[derive(Debug, Default, Deserialize)]
pub struct Meta {
    #[serde(default)]
    pub name: String,
    #[serde(default, rename = "resourceVersion")]
    pub resource_version: String,
}

#[derive(Debug, Deserialize)]
pub struct Node {
    #[serde(default)]
    pub metadata: Meta,
    #[serde(default)]
    pub spec: NodeSpec,
}

#[derive(Debug, Default, Deserialize)]
pub struct NodeSpec {
    /// Kept as the server sent them: the patch's `test` must compare equal to exactly this.
    #[serde(default)]
    pub taints: Option<Vec<Value>>,
    #[serde(default)]
    pub unschedulable: Option<bool>,
}

impl Node {
    fn taint_keys(&self) -> impl Iterator<Item = &str> {
        self.spec
            .taints
            .iter()
            .flatten()
            .filter_map(|t| t["key"].as_str())
    }

    pub fn has_startup_taint(&self) -> bool {
        self.taint_keys().any(|k| k == STARTUP_TAINT)
    }

    /// Cordoned (the taint follows `spec.unschedulable` a moment later: either will do) or
    /// carrying an autoscaler's drain taint.
    pub fn is_being_drained(&self) -> bool {
        self.spec.unschedulable == Some(true)
            || self.taint_keys().any(|k| DRAIN_TAINTS.contains(&k))
    }

    /// The JSON patch that removes the startup taint only if the taints are still exactly what
    /// was read: a taint added or removed meanwhile by someone else fails the `test`, and the
    /// caller reads the node again instead of writing over that change. `None`: no such taint.
    pub fn startup_taint_removal(&self) -> Option<Value> {
        let taints = self.spec.taints.as_ref()?;
        let keep: Vec<&Value> = taints
            .iter()
            .filter(|t| t["key"].as_str() != Some(STARTUP_TAINT))
            .collect();
        if keep.len() == taints.len() {
            return None;
        }
        Some(json!([
            {"op": "test", "path": "/spec/taints", "value": taints},
            {"op": "replace", "path": "/spec/taints", "value": keep},
        ]))
    }
}

#[derive(Debug, Deserialize)]
pub struct CsiNode {
    #[serde(default)]
    pub spec: CsiNodeSpec,
}

#[derive(Debug, Default, Deserialize)]
pub struct CsiNodeSpec {
    #[serde(default)]
    pub drivers: Vec<CsiNodeDriver>,
}

#[derive(Debug, Deserialize)]
pub struct CsiNodeDriver {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub allocatable: Option<Allocatable>,
}

#[derive(Debug, Deserialize)]
pub struct Allocatable {
    #[serde(default)]
    pub count: Option<i64>,
}

impl CsiNode {
    /// kubelet registered `driver` (with or without an attach limit).
    pub fn registered(&self, driver: &str) -> bool {
        self.spec.drivers.iter().any(|d| d.name == driver)
    }

    /// kubelet registered `driver` and published its attach limit: the scheduler can count.
    pub fn registered_with_count(&self, driver: &str) -> bool {
        self.spec
            .drivers
            .iter()
            .any(|d| d.name == driver && d.allocatable.as_ref().is_some_and(|a| a.count.is_some()))
    }
}

#[derive(Debug, Deserialize)]
pub struct VolumeAttachmentList {
    #[serde(default)]
    pub metadata: Meta,
    #[serde(default)]
    pub items: Vec<VolumeAttachment>,
}

#[derive(Debug, Deserialize)]
pub struct VolumeAttachment {
    #[serde(default)]
    pub metadata: Meta,
    #[serde(default)]
    pub spec: VolumeAttachmentSpec,
}

#[derive(Debug, Default, Deserialize)]
pub struct VolumeAttachmentSpec {
    #[serde(default)]
    pub attacher: String,
    #[serde(default, rename = "nodeName")]
    pub node_name: String,
}

impl VolumeAttachment {
    pub fn is_of(&self, node: &str, driver: &str) -> bool {
        self.spec.node_name == node && self.spec.attacher == driver
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(taints: Value, unschedulable: bool) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": "n", "resourceVersion": "7"},
            "spec": {"taints": taints, "unschedulable": unschedulable},
        }))
        .unwrap()
    }

    #[test]
    fn the_patch_tests_the_taints_as_read_and_keeps_every_other_one() {
        let other = json!({"key": "dedicated", "value": "db", "effect": "NoSchedule"});
        let ours = json!({"key": STARTUP_TAINT, "effect": "NoExecute", "timeAdded": "2026-01-01T00:00:00Z"});
        let n = node(json!([other, ours]), false);
        assert!(n.has_startup_taint());
        let patch = n.startup_taint_removal().unwrap();
        assert_eq!(patch[0]["op"], "test");
        assert_eq!(patch[0]["value"], json!([other, ours]));
        assert_eq!(patch[1]["op"], "replace");
        assert_eq!(patch[1]["value"], json!([other]));
        assert!(
            node(json!([other]), false)
                .startup_taint_removal()
                .is_none()
        );
        assert!(node(Value::Null, false).startup_taint_removal().is_none());
    }

    #[test]
    fn drain_is_a_cordon_or_one_of_upstreams_taints() {
        assert!(!node(json!([{"key": STARTUP_TAINT}]), false).is_being_drained());
        assert!(node(Value::Null, true).is_being_drained());
        for key in DRAIN_TAINTS {
            assert!(node(json!([{"key": key, "effect": "NoSchedule"}]), false).is_being_drained());
        }
    }

    #[test]
    fn registration_needs_our_driver_with_a_count() {
        let c = |drivers: Value| -> CsiNode {
            serde_json::from_value(json!({"spec": {"drivers": drivers}})).unwrap()
        };
        assert!(!c(json!([])).registered_with_count("ebs.csi.aws.com"));
        assert!(!c(json!([{"name": "ebs.csi.aws.com"}])).registered_with_count("ebs.csi.aws.com"));
        assert!(
            !c(json!([{"name": "other", "allocatable": {"count": 3}}]))
                .registered_with_count("ebs.csi.aws.com")
        );
        assert!(
            c(json!([{"name": "ebs.csi.aws.com", "allocatable": {"count": 25}}]))
                .registered_with_count("ebs.csi.aws.com")
        );
        assert!(c(json!([{"name": "ebs.csi.aws.com"}])).registered("ebs.csi.aws.com"));
        assert!(
            !c(json!([{"name": "other", "allocatable": {"count": 3}}]))
                .registered("ebs.csi.aws.com")
        );
        assert!(!c(json!([])).registered("ebs.csi.aws.com"));
    }
}
