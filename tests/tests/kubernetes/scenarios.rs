//! The scenarios of tests/tests/kubernetes.rs, in the order they run: each leaves the cluster as
//! the next expects it.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ebs_tests::k8s::{Cluster, loops_named_under, now, parse_rfc3339, wait_until};

pub(super) use super::observe::*;

use super::Ctx;

pub(super) const DRIVER: &str = "ebs.csi.aws.com";
const TOPOLOGY_KEY: &str = "loop.ebs-node-agent.io/node";
/// EBS_AGENT_VOLUME_ATTACH_LIMIT in tests/k8s/loop/loop-all.yaml.
const ATTACH_LIMIT: i64 = 8;
pub(super) const WRITTEN: &str = "hello-from-writer";

/// A pod with `claim` at /data running `command`: hostNetwork (nothing but loopback here), the
/// agent's image (it has a shell), no service account token; `security` is the pod's
/// securityContext (flow YAML) or "".
pub(super) fn pod_yaml(name: &str, claim: &str, command: &str, security: &str) -> String {
    let security = if security.is_empty() {
        String::new()
    } else {
        format!("  securityContext: {security}\n")
    };
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: {name}}}
spec:
  hostNetwork: true
  automountServiceAccountToken: false
  enableServiceLinks: false
  terminationGracePeriodSeconds: 1
{security}  containers:
    - name: main
      image: ghcr.io/ebs-node-agent/ebs-node-agent:0.1.0
      command: ["/bin/sh", "-c", {command:?}]
      volumeMounts: [{{name: data, mountPath: /data}}]
  volumes:
    - name: data
      persistentVolumeClaim: {{claimName: {claim}}}
"#
    )
}

/// A pod on the test PVC `data`.
fn pod(name: &str, command: &str) -> String {
    pod_yaml(name, "data", command, "")
}

const PVC: &str = r#"apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: data}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: ebs-loop
  resources: {requests: {storage: 64Mi}}
"#;

/// Creates a pod and waits for it to be Ready; the seconds it took.
pub(super) fn start_pod(c: &Cluster, yaml: &str, name: &str) -> Result<f64, String> {
    let t = Instant::now();
    c.apply(yaml)?;
    c.kubectl(&[
        "wait",
        "--for=condition=Ready",
        &format!("pod/{name}"),
        "--timeout=120s",
    ])?;
    Ok(t.elapsed().as_secs_f64())
}

pub fn registration(ctx: &mut Ctx) -> Result<(), String> {
    let c = &ctx.cluster;
    rollout(c, "ds/ebs-node-agent")?;
    wait_until(Duration::from_secs(60), "the driver in CSINode", || {
        let v = c.json(&["get", "csinode", "127.0.0.1"])?;
        Ok(v["spec"]["drivers"]
            .as_array()
            .is_some_and(|d| d.iter().any(|d| d["name"] == DRIVER)))
    })?;
    let v = c.json(&["get", "csinode", "127.0.0.1"])?;
    let drivers = v["spec"]["drivers"].as_array().cloned().unwrap_or_default();
    let d = drivers
        .iter()
        .find(|d| d["name"] == DRIVER)
        .ok_or("driver gone from CSINode")?;
    let keys: Vec<&str> = d["topologyKeys"]
        .as_array()
        .map(|k| k.iter().filter_map(|k| k.as_str()).collect())
        .unwrap_or_default();
    if keys != [TOPOLOGY_KEY] {
        return Err(format!(
            "CSINode topology keys {keys:?}, expected [{TOPOLOGY_KEY}]"
        ));
    }
    if d["allocatable"]["count"].as_i64() != Some(ATTACH_LIMIT) {
        return Err(format!(
            "CSINode allocatable {}, expected count {ATTACH_LIMIT}",
            d["allocatable"]
        ));
    }
    let node_id = d["nodeID"].as_str().unwrap_or_default().to_string();
    if node_id.is_empty() {
        return Err("CSINode has an empty nodeID".into());
    }
    let node = c.json(&["get", "node", "127.0.0.1"])?;
    if node["metadata"]["labels"][TOPOLOGY_KEY].as_str() != Some(node_id.as_str()) {
        return Err(format!(
            "node label {TOPOLOGY_KEY}={}, expected the node id {node_id}",
            node["metadata"]["labels"][TOPOLOGY_KEY]
        ));
    }
    // Agent start (its "serving" line) to kubelet's "Register new plugin" line.
    let log = c.agent_log()?;
    let serving = log
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["message"] == "serving")
        .and_then(|v| v["timestamp"].as_str().and_then(parse_rfc3339));
    let kubelet = std::fs::read_to_string(c.dir.join("logs/kubelet.log")).unwrap_or_default();
    let registered = kubelet
        .lines()
        .find(|l| l.contains("Register new plugin with name: ebs.csi.aws.com"))
        .and_then(klog_time);
    if let (Some(s), Some(r)) = (serving, registered) {
        // klog prints the time of day only: compare within the day.
        let s = s.rem_euclid(86400.0);
        ctx.figures.push(format!(
            "agent start (log 'serving') to kubelet's plugin registration: {:.2} s",
            r - s
        ));
    }
    if let Some(applied) = std::fs::read_to_string(c.dir.join("applied-at"))
        .ok()
        .and_then(|s| s.trim().parse::<f64>().ok())
        && let Some(s) = serving
    {
        ctx.figures.push(format!(
            "kubectl apply -k to the agent serving (pod start, image local): {:.1} s",
            s - applied
        ));
    }
    Ok(())
}

/// The one publish mount of `pod`'s volume and the one staging mount, as the host sees them.
pub(super) fn host_mounts(c: &Cluster, pod: &str) -> Result<(PathBuf, PathBuf, String), String> {
    let uid = c.kubectl(&["get", "pod", pod, "-o", "jsonpath={.metadata.uid}"])?;
    let pv = c.kubectl(&["get", "pvc", "data", "-o", "jsonpath={.spec.volumeName}"])?;
    let publish = c
        .dir
        .join("kubelet/pods")
        .join(uid.trim())
        .join("volumes/kubernetes.io~csi")
        .join(pv.trim())
        .join("mount");
    let mounts = c.volume_mounts();
    let at = |p: &Path| mounts.iter().filter(|(t, _, _)| t == p).count();
    let staging: Vec<&(PathBuf, String, String)> = mounts
        .iter()
        .filter(|(t, _, _)| t.ends_with("globalmount"))
        .collect();
    if at(&publish) != 1 || staging.len() != 1 {
        return Err(format!(
            "expected one publish mount at {} and one staging mount, found {mounts:#?}",
            publish.display()
        ));
    }
    let (stage, fstype, source) = staging[0].clone();
    if fstype != "ext4" {
        return Err(format!("staging mount is {fstype}, expected ext4"));
    }
    let loops = loops_of_the_agent(c);
    if loops.len() != 1 || loops[0] != Path::new(&source) {
        return Err(format!(
            "staging mount's source {source}, the agent's loop devices {loops:?}"
        ));
    }
    Ok((publish, stage, source))
}

pub fn pvc_pod_data(ctx: &mut Ctx) -> Result<(), String> {
    let c = &ctx.cluster;
    let since = now();
    let yaml = format!(
        "{PVC}---\n{}",
        pod(
            "writer",
            &format!("echo {WRITTEN} > /data/hello && sync && exec sleep 3600")
        )
    );
    let secs = start_pod(c, &yaml, "writer")?;
    let calls = agent_calls(c, since)?;
    let (publish, stage, device) = host_mounts(c, "writer")?;
    // The bytes, from the host, through both of kubelet's paths.
    for p in [&publish, &stage] {
        let got = std::fs::read_to_string(p.join("hello"))
            .map_err(|e| format!("{}: {e}", p.display()))?;
        if got.trim() != WRITTEN {
            return Err(format!("{} holds {got:?}", p.join("hello").display()));
        }
    }
    let through = c.kubectl(&["exec", "writer", "--", "cat", "/data/hello"])?;
    if through.trim() != WRITTEN {
        return Err(format!("kubectl exec read {through:?}"));
    }
    // Kubelet's side of the target path: it made the parent and wrote vol_data.json there (the
    // driver and the handle it will unpublish with); the agent made the target and mounted it.
    let parent = publish.parent().ok_or("the publish path has no parent")?;
    let vol_data = std::fs::read_to_string(parent.join("vol_data.json"))
        .map_err(|e| format!("kubelet's vol_data.json beside the target: {e}"))?;
    let vol_data: serde_json::Value =
        serde_json::from_str(&vol_data).map_err(|e| format!("vol_data.json: {e}"))?;
    let pv = c.kubectl(&["get", "pvc", "data", "-o", "jsonpath={.spec.volumeName}"])?;
    let handle = c.kubectl(&[
        "get",
        "pv",
        pv.trim(),
        "-o",
        "jsonpath={.spec.csi.volumeHandle}",
    ])?;
    if vol_data["driverName"] != DRIVER || vol_data["volumeHandle"] != handle.trim() {
        return Err(format!(
            "vol_data.json {vol_data}, expected driver {DRIVER} and handle {handle}"
        ));
    }
    // ReadWriteOnce reaches the agent as SINGLE_NODE_MULTI_WRITER: the agent advertises
    // SINGLE_NODE_MULTI_WRITER, so kubelet sends the new modes instead of SINGLE_NODE_WRITER.
    let mode = staged_access_mode(c, handle.trim())?;
    if mode != "SINGLE_NODE_MULTI_WRITER" {
        return Err(format!(
            "a ReadWriteOnce claim was staged with access mode {mode}, expected \
             SINGLE_NODE_MULTI_WRITER"
        ));
    }
    ctx.publish_dir = Some(parent.to_path_buf());
    let mut by_rpc: Vec<(String, f64)> = Vec::new();
    for (rpc, ms) in calls
        .iter()
        .filter(|(r, _)| r != "Probe" && !r.ends_with("GetCapabilities"))
    {
        match by_rpc.iter_mut().find(|(r, _)| r == rpc) {
            Some(e) => e.1 += ms,
            None => by_rpc.push((rpc.clone(), *ms)),
        }
    }
    let total: f64 = by_rpc.iter().map(|(_, ms)| ms).sum();
    ctx.figures.push(format!(
        "first pod (provisioning included) creation to Ready: {secs:.1} s, of which the agent's calls {:.0} ms ({})",
        total,
        by_rpc
            .iter()
            .map(|(r, ms)| format!("{r} {ms:.1} ms"))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    ctx.figures.push(format!("volume staged on {device}"));
    Ok(())
}

pub fn pod_deletion(ctx: &mut Ctx) -> Result<(), String> {
    let c = &ctx.cluster;
    let t = Instant::now();
    c.kubectl(&["delete", "pod", "writer", "--wait=true", "--timeout=90s"])?;
    wait_all_released(c)?;
    // The agent removed the target it made, and kubelet its parent with vol_data.json.
    if let Some(parent) = ctx.publish_dir.take()
        && parent.exists()
    {
        return Err(format!(
            "{} is left after the pod's deletion",
            parent.display()
        ));
    }
    ctx.figures.push(format!(
        "pod deletion to unmounted, unstaged and detached: {:.1} s",
        t.elapsed().as_secs_f64()
    ));
    Ok(())
}

pub fn second_pod(ctx: &mut Ctx) -> Result<(), String> {
    let c = &ctx.cluster;
    let since = now();
    let secs = start_pod(c, &pod("reader", "exec sleep 3600"), "reader")?;
    let calls = agent_calls(c, since)?;
    let got = c.kubectl(&["exec", "reader", "--", "cat", "/data/hello"])?;
    if got.trim() != WRITTEN {
        return Err(format!("the second pod read {got:?}"));
    }
    host_mounts(c, "reader")?;
    let total: f64 = calls
        .iter()
        .filter(|(r, _)| r != "Probe" && !r.ends_with("GetCapabilities"))
        .map(|(_, ms)| ms)
        .sum();
    ctx.figures.push(format!(
        "second pod (volume exists) creation to Ready: {secs:.1} s, of which the agent's calls {total:.0} ms"
    ));
    Ok(())
}

pub fn pvc_deletion(ctx: &mut Ctx) -> Result<(), String> {
    let c = &ctx.cluster;
    let pv = c.kubectl(&["get", "pvc", "data", "-o", "jsonpath={.spec.volumeName}"])?;
    c.kubectl(&["delete", "pvc", "data", "--wait=true", "--timeout=60s"])?;
    wait_until(Duration::from_secs(60), "the PV to go", || {
        Ok(c.kubectl(&["get", "pv", "-o", "name"])?.trim().is_empty())
    })?;
    let volumes = agent_state(c).join("volumes");
    let left: Vec<_> = std::fs::read_dir(&volumes)
        .map_err(|e| format!("{}: {e}", volumes.display()))?
        .flatten()
        .map(|e| e.file_name())
        .collect();
    if !left.is_empty() {
        return Err(format!(
            "{} left after deleting {pv}: {left:?}",
            volumes.display()
        ));
    }
    Ok(())
}

pub fn read_only(ctx: &mut Ctx) -> Result<(), String> {
    let c = &ctx.cluster;
    let yaml = pod("ro", "exec sleep 3600").replace(
        "persistentVolumeClaim: {claimName: data}",
        "persistentVolumeClaim: {claimName: data, readOnly: true}",
    );
    start_pod(c, &yaml, "ro")?;
    let got = c.kubectl(&["exec", "ro", "--", "cat", "/data/hello"])?;
    if got.trim() != WRITTEN {
        return Err(format!("the read-only pod read {got:?}"));
    }
    match c.kubectl(&["exec", "ro", "--", "sh", "-c", "echo x > /data/x"]) {
        Ok(_) => return Err("a write to a read-only volume succeeded".into()),
        Err(e) if e.contains("Read-only file system") => {}
        Err(e) => return Err(format!("the write failed otherwise than read-only: {e}")),
    }
    let (publish, _, _) = host_mounts(c, "ro")?;
    let mounts = c.volume_mounts();
    let opts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let line = opts
        .lines()
        .find(|l| l.split(' ').nth(4) == Some(&*publish.to_string_lossy()))
        .ok_or_else(|| format!("{} not in mountinfo ({mounts:?})", publish.display()))?;
    // The host's copy of the publish mount (Bidirectional propagation) is read-only too: the
    // agent makes the bind read-only before attaching it (open_tree + mount_setattr +
    // move_mount), so the copy propagated here carries the flag. A bind + remount leaves it rw.
    if !line
        .split(' ')
        .nth(5)
        .is_some_and(|o| o.split(',').any(|o| o == "ro"))
    {
        return Err(format!(
            "a read-only publish is read-write in the host's mount namespace: {line}"
        ));
    }
    c.kubectl(&["delete", "pod", "ro", "--wait=true", "--timeout=90s"])?;
    wait_all_released(c)
}

const BLOCK_PVC: &str = r#"apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: blk}
spec:
  accessModes: [ReadWriteOnce]
  volumeMode: Block
  storageClassName: ebs-loop
  resources: {requests: {storage: 16Mi}}
---
apiVersion: v1
kind: Pod
metadata: {name: blk}
spec:
  hostNetwork: true
  automountServiceAccountToken: false
  enableServiceLinks: false
  terminationGracePeriodSeconds: 1
  containers:
    - name: main
      image: ghcr.io/ebs-node-agent/ebs-node-agent:0.1.0
      command: ["/bin/sh", "-c", "printf block-data | dd of=/dev/xvdb conv=notrunc,fsync && exec sleep 3600"]
      volumeDevices: [{name: blk, devicePath: /dev/xvdb}]
  volumes:
    - name: blk
      persistentVolumeClaim: {claimName: blk}
"#;

/// A raw block PVC: the pod writes the device, the bytes are in the volume's file; deleting the
/// pod and the claim leaves no mount, no loop device (the agent's or kubelet's pin) and no file.
pub fn block_mode(ctx: &mut Ctx) -> Result<(), String> {
    let c = &ctx.cluster;
    let secs = start_pod(c, BLOCK_PVC, "blk")?;
    let loops = loops_of_the_agent(c);
    if loops.len() != 1 {
        return Err(format!(
            "expected one loop device of the agent, found {loops:?}"
        ));
    }
    let head = |p: &Path| -> Result<Vec<u8>, String> {
        use std::io::Read;
        let mut b = vec![0u8; 10];
        std::fs::File::open(p)
            .and_then(|mut f| f.read_exact(&mut b))
            .map_err(|e| format!("{}: {e}", p.display()))?;
        Ok(b)
    };
    // Kubelet pins a block volume with a loop device of its own over the device node it
    // bind-mounted under its directory (named by that host path).
    let kubelet_dir = c.dir.join("kubelet");
    let pins = loops_named_under(&kubelet_dir);
    if pins.is_empty() {
        return Err("kubelet pinned no loop device over the block volume".into());
    }
    if head(&loops[0])? != b"block-data" {
        return Err(format!(
            "{} does not start with the pod's bytes",
            loops[0].display()
        ));
    }
    c.kubectl(&["delete", "pod", "blk", "--wait=true", "--timeout=90s"])?;
    wait_all_released(c)?;
    let kubelet_pins = loops_named_under(&kubelet_dir);
    if !kubelet_pins.is_empty() {
        return Err(format!("kubelet's loop devices left: {kubelet_pins:?}"));
    }
    let pv = c.kubectl(&["get", "pvc", "blk", "-o", "jsonpath={.spec.volumeName}"])?;
    let file = std::fs::read_dir(agent_state(c).join("volumes"))
        .map_err(|e| e.to_string())?
        .flatten()
        .map(|e| e.path())
        .find(|p| head(p).is_ok_and(|h| h == b"block-data"))
        .ok_or_else(|| format!("no volume file holds the bytes written to {}", pv.trim()))?;
    c.kubectl(&["delete", "pvc", "blk", "--wait=true", "--timeout=60s"])?;
    wait_until(
        Duration::from_secs(60),
        "the block volume's file to go",
        || Ok(!file.exists()),
    )?;
    ctx.figures
        .push(format!("block pod creation to Ready: {secs:.1} s"));
    Ok(())
}
