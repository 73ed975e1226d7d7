//! The loop backend's later scenarios: a node reboot, expansion (online xfs, offline ext4) and
//! fsGroup. Each makes its own claim and leaves nothing behind for the next.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ebs_tests::k8s::{Cluster, now, wait_until};

use super::Ctx;
use super::scenarios::{
    agent_calls, agent_container, agent_failures, loops_of_the_agent, pod_yaml, staged_access_mode,
    start_pod, wait_all_released,
};

const MIB: u64 = 1 << 20;

fn claim(name: &str, class: &str, size: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: {name}}}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: {class}
  resources: {{requests: {{storage: {size}}}}}
"#
    )
}

/// A pod with `claim` at /data; `security` is the pod's securityContext (flow YAML) or "".
fn pod_on(name: &str, claim: &str, security: &str) -> String {
    pod_yaml(name, claim, "exec sleep 3600", security)
}

fn exec(c: &Cluster, pod: &str, script: &str) -> Result<String, String> {
    c.kubectl(&["exec", pod, "--", "sh", "-c", script])
}

/// The publish mount of `claim`'s volume in `pod`, as the host sees it: (target, fstype, device).
fn publish_of(c: &Cluster, pod: &str, claim: &str) -> Result<(PathBuf, String, String), String> {
    let uid = c.kubectl(&["get", "pod", pod, "-o", "jsonpath={.metadata.uid}"])?;
    let pv = c.kubectl(&["get", "pvc", claim, "-o", "jsonpath={.spec.volumeName}"])?;
    let target = c
        .dir
        .join("kubelet/pods")
        .join(uid.trim())
        .join("volumes/kubernetes.io~csi")
        .join(pv.trim())
        .join("mount");
    let mounts = c.volume_mounts();
    let found: Vec<_> = mounts.iter().filter(|(t, _, _)| *t == target).collect();
    match found[..] {
        [one] => Ok(one.clone()),
        _ => Err(format!(
            "expected one mount at {}, found {mounts:#?}",
            target.display()
        )),
    }
}

/// The filesystem's UUID on `device`, read from the host.
fn fs_uuid(device: &str) -> Result<String, String> {
    let out = std::process::Command::new("timeout")
        .args(["10", "blkid", "-p", "-o", "value", "-s", "UUID", device])
        .output()
        .map_err(|e| format!("blkid: {e}"))?;
    let uuid = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if uuid.is_empty() {
        return Err(format!("blkid found no filesystem UUID on {device}"));
    }
    Ok(uuid)
}

/// The size of the filesystem at /data, as the pod sees it (statfs: blocks × block size).
fn fs_bytes(c: &Cluster, pod: &str) -> Result<u64, String> {
    let out = exec(c, pod, "stat -f -c '%b %S' /data")?;
    let mut f = out.split_whitespace().map(|x| x.parse::<u64>());
    match (f.next(), f.next()) {
        (Some(Ok(blocks)), Some(Ok(size))) => Ok(blocks * size),
        _ => Err(format!("stat -f /data printed {out:?}")),
    }
}

fn delete(c: &Cluster, what: &[&str]) -> Result<(), String> {
    let mut args = vec!["delete"];
    args.extend_from_slice(what);
    args.extend(["--wait=true", "--timeout=90s"]);
    c.kubectl(&args).map(|_| ())
}

fn container_id(c: &Cluster, pod: &str) -> Result<String, String> {
    c.kubectl(&[
        "get",
        "pod",
        pod,
        "-o",
        "jsonpath={.status.containerStatuses[0].containerID}",
    ])
}

/// A ReadWriteOncePod claim reaches the agent as SINGLE_NODE_SINGLE_WRITER (kubelet sends the
/// new modes because the agent advertises SINGLE_NODE_MULTI_WRITER), and stages and publishes.
pub fn read_write_once_pod(ctx: &mut Ctx) -> Result<(), String> {
    let c = &ctx.cluster;
    let yaml = format!(
        "{}---\n{}",
        claim("rwop", "ebs-loop", "16Mi").replace("[ReadWriteOnce]", "[ReadWriteOncePod]"),
        pod_on("rwop", "rwop", "")
    );
    start_pod(c, &yaml, "rwop")?;
    let pv = c.kubectl(&["get", "pvc", "rwop", "-o", "jsonpath={.spec.volumeName}"])?;
    let handle = c.kubectl(&[
        "get",
        "pv",
        pv.trim(),
        "-o",
        "jsonpath={.spec.csi.volumeHandle}",
    ])?;
    let mode = staged_access_mode(c, handle.trim())?;
    if mode != "SINGLE_NODE_SINGLE_WRITER" {
        return Err(format!(
            "a ReadWriteOncePod claim was staged with access mode {mode}, expected \
             SINGLE_NODE_SINGLE_WRITER"
        ));
    }
    exec(c, "rwop", "echo one-pod > /data/w && sync")?;
    delete(c, &["pod", "rwop"])?;
    wait_all_released(c)?;
    delete(c, &["pvc", "rwop"])
}

/// Everything dies at once and what a reboot loses goes (tests/k8s/cluster.sh reboot: mounts
/// under kubelet's directory, loop devices, containerd's run-time state); then containerd and
/// kubelet start again. The pod comes back with its data, on the filesystem it had: the UUID
/// mkfs gave it is unchanged, so NodeStageVolume re-attached the volume and did not format it.
pub fn node_reboot(ctx: &mut Ctx) -> Result<(), String> {
    let c = &ctx.cluster;
    let yaml = format!(
        "{}---\n{}",
        claim("rb", "ebs-loop", "64Mi"),
        pod_on("rb", "rb", "")
    );
    start_pod(c, &yaml, "rb")?;
    exec(c, "rb", "echo before-reboot > /data/r && sync")?;
    let (_, fstype, device) = publish_of(c, "rb", "rb")?;
    let uuid = fs_uuid(&device)?;
    let old_container = container_id(c, "rb")?;
    c.script("cluster.sh", Some("reboot"), &[], Duration::from_secs(120))?;
    let rebooted = Instant::now();
    // The reboot took what it should: no volume mount and no loop device of the agent left.
    let mounts = c.volume_mounts();
    let loops = loops_of_the_agent(c);
    if !mounts.is_empty() || !loops.is_empty() {
        return Err(format!(
            "after the reboot, still mounted {mounts:?}, loop devices {loops:?}"
        ));
    }
    wait_until(
        Duration::from_secs(180),
        "the pod to run again in a new container",
        || {
            let id = container_id(c, "rb")?;
            let ready = c.kubectl(&[
                "get",
                "pod",
                "rb",
                "-o",
                "jsonpath={.status.containerStatuses[0].ready}",
            ])?;
            Ok(!id.is_empty() && id != old_container && ready == "true")
        },
    )?;
    ctx.figures.push(format!(
        "node reboot (kubelet and containerd started again) to the pod Ready on its volume: {:.1} s",
        rebooted.elapsed().as_secs_f64()
    ));
    let got = exec(c, "rb", "cat /data/r")?;
    if got.trim() != "before-reboot" {
        return Err(format!("after the reboot the pod read {got:?}"));
    }
    let (_, fstype_after, device_after) = publish_of(c, "rb", "rb")?;
    let uuid_after = fs_uuid(&device_after)?;
    if uuid_after != uuid || fstype_after != fstype {
        return Err(format!(
            "the volume was reformatted over the reboot: {fstype} {uuid} on {device} before, \
             {fstype_after} {uuid_after} on {device_after} after"
        ));
    }
    delete(c, &["pod", "rb"])?;
    wait_all_released(c)?;
    delete(c, &["pvc", "rb"])
}

/// Waits until the filesystem at /data in `pod` is at least `bytes`; the last size seen.
fn wait_fs_at_least(c: &Cluster, pod: &str, bytes: u64) -> Result<u64, String> {
    let mut last = 0;
    wait_until(Duration::from_secs(120), "the filesystem to grow", || {
        last = fs_bytes(c, pod)?;
        Ok(last >= bytes)
    })
    .map_err(|e| format!("{e} (the filesystem has {last} bytes, expected {bytes})"))?;
    Ok(last)
}

/// The filesystem grew through the agent: NodeExpandVolume answered ok since `since`.
fn grown_by_the_agent(c: &Cluster, since: f64) -> Result<(), String> {
    let calls = agent_calls(c, since)?;
    let failed = agent_failures(c, since)?;
    if calls.iter().any(|(rpc, _)| rpc == "NodeExpandVolume")
        && !failed.iter().any(|f| f.contains("NodeExpandVolume"))
    {
        return Ok(());
    }
    Err(format!(
        "no NodeExpandVolume answered ok since the resize: calls {calls:?}, failures {failed:?}"
    ))
}

fn resize(c: &Cluster, claim: &str, size: &str) -> Result<(), String> {
    let patch = format!(r#"{{"spec":{{"resources":{{"requests":{{"storage":"{size}"}}}}}}}}"#);
    c.kubectl(&["patch", "pvc", claim, "--type=merge", "-p", &patch])
        .map(|_| ())
}

fn wait_claim_capacity(c: &Cluster, claim: &str, size: &str) -> Result<(), String> {
    wait_until(Duration::from_secs(120), "the claim's new capacity", || {
        Ok(c.kubectl(&[
            "get",
            "pvc",
            claim,
            "-o",
            "jsonpath={.status.capacity.storage}",
        ])? == size)
    })
}

/// An xfs volume grows while the pod uses it: external-resizer's ControllerExpandVolume, then
/// kubelet's NodeExpandVolume on the published volume (xfs_growfs on the mounted filesystem).
pub fn expand_online_xfs(ctx: &mut Ctx) -> Result<(), String> {
    let c = &ctx.cluster;
    // mkfs.xfs refuses filesystems under 300 MiB.
    let yaml = format!(
        "{}---\n{}",
        claim("gx", "ebs-loop-xfs", "320Mi"),
        pod_on("gx", "gx", "")
    );
    start_pod(c, &yaml, "gx")?;
    let (_, fstype, _) = publish_of(c, "gx", "gx")?;
    if fstype != "xfs" {
        return Err(format!("the xfs claim is mounted as {fstype}"));
    }
    exec(c, "gx", "echo grown > /data/g && sync")?;
    let before = fs_bytes(c, "gx")?;
    let t = Instant::now();
    let since = now();
    resize(c, "gx", "640Mi")?;
    let after = wait_fs_at_least(c, "gx", before + 300 * MIB)?;
    wait_claim_capacity(c, "gx", "640Mi")?;
    grown_by_the_agent(c, since)?;
    ctx.figures.push(format!(
        "online xfs growth 320 -> 640 MiB, PVC patched to the pod seeing it: {:.1} s ({} -> {} MiB)",
        t.elapsed().as_secs_f64(),
        before / MIB,
        after / MIB
    ));
    let got = exec(c, "gx", "cat /data/g")?;
    if got.trim() != "grown" {
        return Err(format!("after growing, the pod read {got:?}"));
    }
    delete(c, &["pod", "gx"])?;
    wait_all_released(c)?;
    delete(c, &["pvc", "gx"])
}

/// An ext4 volume grows while no pod uses it: ControllerExpandVolume now, the filesystem when
/// the next pod stages it (kubelet's NodeExpandVolume after NodeStageVolume).
pub fn expand_offline_ext4(ctx: &mut Ctx) -> Result<(), String> {
    let c = &ctx.cluster;
    let yaml = format!(
        "{}---\n{}",
        claim("ge", "ebs-loop", "64Mi"),
        pod_on("ge1", "ge", "")
    );
    start_pod(c, &yaml, "ge1")?;
    exec(c, "ge1", "echo offline > /data/o && sync")?;
    let before = fs_bytes(c, "ge1")?;
    delete(c, &["pod", "ge1"])?;
    wait_all_released(c)?;
    resize(c, "ge", "128Mi")?;
    wait_until(Duration::from_secs(120), "the volume to grow", || {
        let pv = c.kubectl(&["get", "pvc", "ge", "-o", "jsonpath={.spec.volumeName}"])?;
        Ok(c.kubectl(&[
            "get",
            "pv",
            pv.trim(),
            "-o",
            "jsonpath={.spec.capacity.storage}",
        ])? == "128Mi")
    })?;
    let t = Instant::now();
    let since = now();
    start_pod(c, &pod_on("ge2", "ge", ""), "ge2")?;
    let after = wait_fs_at_least(c, "ge2", before + 56 * MIB)?;
    wait_claim_capacity(c, "ge", "128Mi")?;
    grown_by_the_agent(c, since)?;
    ctx.figures.push(format!(
        "offline ext4 growth 64 -> 128 MiB: the next pod Ready on the grown filesystem in {:.1} s ({} -> {} MiB)",
        t.elapsed().as_secs_f64(),
        before / MIB,
        after / MIB
    ));
    let got = exec(c, "ge2", "cat /data/o")?;
    if got.trim() != "offline" {
        return Err(format!("after growing, the pod read {got:?}"));
    }
    delete(c, &["pod", "ge2"])?;
    wait_all_released(c)?;
    delete(c, &["pvc", "ge"])
}

const FS_GROUP: u32 = 4321;

/// kubelet applies the pod's fsGroup itself (the CSIDriver's fsGroupPolicy File; the agent
/// does not offer VOLUME_MOUNT_GROUP): the volume's root is group FS_GROUP with the setgid bit,
/// so a file the pod (uid 1000, not root) creates is FS_GROUP's too.
pub fn fs_group(ctx: &mut Ctx) -> Result<(), String> {
    let c = &ctx.cluster;
    let policy = c.kubectl(&[
        "get",
        "csidriver",
        super::scenarios::DRIVER,
        "-o",
        "jsonpath={.spec.fsGroupPolicy}",
    ])?;
    if policy != "File" {
        return Err(format!(
            "the CSIDriver's fsGroupPolicy is {policy:?}, shipped File"
        ));
    }
    let security = format!("{{fsGroup: {FS_GROUP}, runAsUser: 1000, runAsGroup: 1000}}");
    let yaml = format!(
        "{}---\n{}",
        claim("fg", "ebs-loop", "32Mi"),
        pod_on("fg", "fg", &security)
    );
    start_pod(c, &yaml, "fg")?;
    let root = exec(c, "fg", "stat -c '%g %A' /data")?;
    let mut f = root.split_whitespace();
    let (gid, mode) = (f.next().unwrap_or(""), f.next().unwrap_or(""));
    // drwxrwsr-x: group-writable, setgid.
    if gid != FS_GROUP.to_string() || mode.get(5..7) != Some("ws") {
        return Err(format!(
            "the volume's root is {root:?} in the pod, expected group {FS_GROUP} with g+ws"
        ));
    }
    let file = exec(
        c,
        "fg",
        "echo x > /data/by-pod && stat -c '%u %g' /data/by-pod",
    )?;
    if file.trim() != format!("1000 {FS_GROUP}") {
        return Err(format!(
            "a file the pod made is owned {file:?}, expected 1000 {FS_GROUP}"
        ));
    }
    let (publish, _, _) = publish_of(c, "fg", "fg")?;
    let host = std::os::unix::fs::MetadataExt::gid(
        &std::fs::metadata(&publish).map_err(|e| format!("{}: {e}", publish.display()))?,
    );
    if host != FS_GROUP {
        return Err(format!("the host sees the volume's root as group {host}"));
    }
    delete(c, &["pod", "fg"])?;
    wait_all_released(c)?;
    delete(c, &["pvc", "fg"])
}

/// The agent container's memory as kubelet counts it (working set: usage minus inactive file
/// pages) and its RSS, from its cgroup v1 memory controller, after every loop scenario ran.
pub fn agent_memory(ctx: &mut Ctx) -> Result<(), String> {
    let c = &ctx.cluster;
    let agent = agent_container(c, "ebs-node-agent")?;
    let id = agent["containerID"]
        .as_str()
        .unwrap_or_default()
        .trim_start_matches("containerd://")
        .to_string();
    if id.is_empty() {
        return Err("no agent container".into());
    }
    let mut stack = vec![PathBuf::from("/sys/fs/cgroup/memory/kubepods")];
    let mut found = None;
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                if e.file_name().to_string_lossy() == id {
                    found = Some(e.path());
                }
                stack.push(e.path());
            }
        }
    }
    // A figure, not a check: on a cgroup v2 host (no v1 memory controller) it is not measured.
    if !Path::new("/sys/fs/cgroup/memory/kubepods").is_dir() {
        ctx.figures
            .push("agent container memory: not measured (no cgroup v1 memory controller)".into());
        return Ok(());
    }
    let dir = found.ok_or_else(|| format!("no memory cgroup for container {id}"))?;
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap_or_default();
    let usage: u64 = read("memory.usage_in_bytes").trim().parse().unwrap_or(0);
    let stat = read("memory.stat");
    let field = |name: &str| {
        stat.lines()
            .find_map(|l| {
                l.strip_prefix(name)?
                    .strip_prefix(' ')?
                    .trim()
                    .parse::<u64>()
                    .ok()
            })
            .unwrap_or(0)
    };
    let working = usage.saturating_sub(field("total_inactive_file"));
    ctx.figures.push(format!(
        "agent container memory after the loop scenarios: working set {:.1} MiB, RSS {:.1} MiB",
        working as f64 / MIB as f64,
        field("total_rss") as f64 / MIB as f64
    ));
    Ok(())
}
