//! Restarts under a running pod: kubelet (its volume reconstruction) and the agent's own pod.
//! Neither may change a mount.

use std::time::{Duration, Instant};

use ebs_tests::k8s::{now, wait_until};

use super::Ctx;
use super::scenarios::{
    WRITTEN, agent_failures, agent_pod_name, agent_pods, host_mounts, mount_ids, rollout,
    wait_all_released,
};

/// Kubelet killed and started again while a pod runs: it reconstructs the volume from its
/// directories and the agent's answers, and changes nothing: the same mounts (by mount id, so
/// not taken down and made again), no failed call of the agent, the pod still reads its data.
pub fn kubelet_restart(ctx: &mut Ctx) -> Result<(), String> {
    let c = &ctx.cluster;
    let before = host_mounts(c, "reader")?;
    let ids = mount_ids(&[&before.0, &before.1]);
    if ids.iter().any(Option::is_none) {
        return Err(format!("no mount id for {before:?}"));
    }
    let port = c.env_port("KUBELET_HEALTHZ_PORT")?;
    let since = now();
    c.script(
        "cluster.sh",
        Some("restart-kubelet"),
        &[],
        Duration::from_secs(60),
    )?;
    let restarted = Instant::now();
    // The new kubelet answers its own health check, and its volume manager went through its
    // reconstruction and a few syncs.
    wait_until(Duration::from_secs(90), "the new kubelet's health", || {
        Ok(
            super::ebs_mode::healthz(port).is_ok_and(|r| r.contains(" 200 "))
                && std::fs::read_to_string(c.dir.join("logs/kubelet.log"))
                    .unwrap_or_default()
                    .contains("Starting to sync pod status with apiserver"),
        )
    })?;
    c.kubectl(&[
        "wait",
        "--for=condition=Ready",
        "node/127.0.0.1",
        "--timeout=90s",
    ])?;
    std::thread::sleep(Duration::from_secs(15).saturating_sub(restarted.elapsed()));
    c.kubectl(&[
        "wait",
        "--for=condition=Ready",
        "pod/reader",
        "--timeout=60s",
    ])?;
    let after = host_mounts(c, "reader")?;
    let ids_after = mount_ids(&[&after.0, &after.1]);
    if after != before || ids_after != ids {
        return Err(format!(
            "mounts changed over a kubelet restart: {before:?} {ids:?} → {after:?} {ids_after:?}"
        ));
    }
    let failed = agent_failures(c, since)?;
    if !failed.is_empty() {
        return Err(format!(
            "the agent failed calls after kubelet's restart: {failed:?}"
        ));
    }
    let got = c.kubectl(&["exec", "reader", "--", "cat", "/data/hello"])?;
    if got.trim() != WRITTEN {
        return Err(format!("after the kubelet restart the pod read {got:?}"));
    }
    Ok(())
}

pub fn agent_restart(ctx: &mut Ctx) -> Result<(), String> {
    let c = &ctx.cluster;
    let before = host_mounts(c, "reader")?;
    let ids = mount_ids(&[&before.0, &before.1]);
    let old = agent_pod_name(c)?;
    let t = Instant::now();
    c.kubectl(&[
        "-n",
        "kube-system",
        "delete",
        "pod",
        old.trim(),
        "--wait=true",
        "--timeout=90s",
    ])?;
    rollout(c, "ds/ebs-node-agent")?;
    // rollout status may answer before the controller saw the deletion: a successor by name.
    wait_until(Duration::from_secs(120), "a new agent pod Ready", || {
        let v = agent_pods(c)?;
        Ok(v["items"].as_array().is_some_and(|items| {
            items.iter().any(|p| {
                p["metadata"]["name"] != old.trim()
                    && p["status"]["conditions"].as_array().is_some_and(|cs| {
                        cs.iter()
                            .any(|c| c["type"] == "Ready" && c["status"] == "True")
                    })
            })
        }))
    })?;
    ctx.figures.push(format!(
        "agent pod deleted to its successor ready: {:.1} s",
        t.elapsed().as_secs_f64()
    ));
    // The published volume was untouched (the same mounts, by mount id), and the pod still
    // writes through it.
    if host_mounts(c, "reader")? != before || mount_ids(&[&before.0, &before.1]) != ids {
        return Err("mounts changed over an agent restart".into());
    }
    c.kubectl(&[
        "exec",
        "reader",
        "--",
        "sh",
        "-c",
        "echo second > /data/second && sync",
    ])?;
    let got = std::fs::read_to_string(before.0.join("second")).map_err(|e| e.to_string())?;
    if got.trim() != "second" {
        return Err(format!("the host read {got:?} after the agent restart"));
    }
    // The new agent unpublishes, unstages and detaches what the old one set up.
    c.kubectl(&["delete", "pod", "reader", "--wait=true", "--timeout=90s"])?;
    wait_all_released(c)
}
