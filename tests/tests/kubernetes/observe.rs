//! What the Kubernetes scenarios look at besides the API: the agent's log and status, the host's
//! mounts and loop devices, kubelet's log.

use std::path::{Path, PathBuf};
use std::time::Duration;

use ebs_tests::k8s::{Cluster, loops_backed_by, parse_rfc3339, wait_until};

pub(super) fn agent_state(c: &Cluster) -> PathBuf {
    c.dir.join("agent-state")
}

/// The agent's per-call log lines (JSON) logged at or after `since`: (rpc, ms).
pub(super) fn agent_calls(c: &Cluster, since: f64) -> Result<Vec<(String, f64)>, String> {
    let log = c.agent_log()?;
    Ok(log
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| {
            v["timestamp"]
                .as_str()
                .and_then(parse_rfc3339)
                .is_some_and(|t| t >= since)
        })
        .filter_map(|v| Some((v["rpc"].as_str()?.to_string(), v["ms"].as_f64()?)))
        .collect())
}

pub(super) fn loops_of_the_agent(c: &Cluster) -> Vec<PathBuf> {
    loops_backed_by(&agent_state(c))
}

/// The agent's failed calls (its "failed" lines) logged at or after `since`: rpc and error.
pub(super) fn agent_failures(c: &Cluster, since: f64) -> Result<Vec<String>, String> {
    let log = c.agent_log()?;
    Ok(log
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["message"] == "failed")
        .filter(|v| {
            v["timestamp"]
                .as_str()
                .and_then(parse_rfc3339)
                .is_some_and(|t| t >= since)
        })
        .map(|v| format!("{} {}: {}", v["rpc"], v["volume"], v["error"]))
        .collect())
}

/// The mount ids (mountinfo's first field) of the mounts at `paths`, as the host sees them: a
/// mount taken down and made again, even at the same place from the same source, has a new id.
pub(super) fn mount_ids(paths: &[&Path]) -> Vec<Option<u64>> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    paths
        .iter()
        .map(|p| {
            let p = p.to_string_lossy();
            info.lines()
                .filter_map(|l| {
                    let mut f = l.split(' ');
                    let id = f.next()?;
                    (f.nth(3)? == p).then(|| id.parse().ok())?
                })
                .next_back()
        })
        .collect()
}

/// What the running agent reports (`ebs-node-agent status --json` in its container).
pub(super) fn agent_status(c: &Cluster) -> Result<serde_json::Value, String> {
    let out = c.kubectl(&[
        "-n",
        "kube-system",
        "exec",
        "ds/ebs-node-agent",
        "-c",
        "ebs-node-agent",
        "--",
        "ebs-node-agent",
        "status",
        "--json",
    ])?;
    serde_json::from_str(&out).map_err(|e| format!("status --json: {e}: {out}"))
}

/// The access mode the agent staged `pv` with, as kubelet sent it (the CSI enum's name, from
/// `status --json`'s `staged.access_mode`).
pub(super) fn staged_access_mode(c: &Cluster, pv: &str) -> Result<String, String> {
    let status = agent_status(c)?;
    status["volumes"]
        .as_array()
        .and_then(|v| v.iter().find(|v| v["volume_id"] == pv))
        .and_then(|v| v["staged"]["access_mode"].as_str())
        .map(str::to_string)
        .ok_or_else(|| format!("no staged access mode of {pv} in the agent's status: {status}"))
}

/// The label of the agent's pods in the shipped DaemonSet.
pub(super) const AGENT_PODS: &str = "app.kubernetes.io/name=ebs-node-agent";

/// The agent's pods, as `kubectl get -o json` lists them.
pub(super) fn agent_pods(c: &Cluster) -> Result<serde_json::Value, String> {
    c.json(&["-n", "kube-system", "get", "pods", "-l", AGENT_PODS])
}

/// The name of the (one) agent pod.
pub(super) fn agent_pod_name(c: &Cluster) -> Result<String, String> {
    let pods = agent_pods(c)?;
    pods["items"][0]["metadata"]["name"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| format!("no agent pod: {pods}"))
}

/// The status of container `name` in the (one) agent pod.
pub(super) fn agent_container(c: &Cluster, name: &str) -> Result<serde_json::Value, String> {
    agent_pods(c)?["items"][0]["status"]["containerStatuses"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["name"] == name).cloned())
        .ok_or_else(|| format!("no container {name} in the agent pod"))
}

/// Waits for a DaemonSet in kube-system to be rolled out.
pub(super) fn rollout(c: &Cluster, ds: &str) -> Result<(), String> {
    c.kubectl(&[
        "-n",
        "kube-system",
        "rollout",
        "status",
        ds,
        "--timeout=120s",
    ])
    .map(|_| ())
}

/// Waits until no CSI volume is mounted under kubelet's directory, no VolumeAttachment is left
/// and the agent's loop devices are detached.
pub(super) fn wait_all_released(c: &Cluster) -> Result<(), String> {
    wait_until(
        Duration::from_secs(90),
        "the volume to be unmounted",
        || Ok(c.volume_mounts().is_empty()),
    )?;
    wait_until(Duration::from_secs(90), "the attachment to go", || {
        Ok(c.kubectl(&["get", "volumeattachments", "-o", "name"])?
            .trim()
            .is_empty())
    })?;
    wait_until(
        Duration::from_secs(30),
        "the loop device to be detached",
        || Ok(loops_of_the_agent(c).is_empty()),
    )
}

/// `I1125 20:45:37.306209 ...` → seconds into the day.
pub(super) fn klog_time(line: &str) -> Option<f64> {
    let t = line.split_whitespace().nth(1)?;
    let mut p = t.split(':');
    let h: f64 = p.next()?.parse().ok()?;
    let m: f64 = p.next()?.parse().ok()?;
    let s: f64 = p.next()?.parse().ok()?;
    Some(h * 3600.0 + m * 60.0 + s)
}
