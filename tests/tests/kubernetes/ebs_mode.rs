//! The ebs backend on the cluster, where there is no EBS: the shipped DaemonSet as it is
//! (packaging/kubernetes: node mode, backend ebs), then the upstream chart's node DaemonSet
//! through packaging/kubernetes/upstream-chart. Instance metadata is an emulator on 127.0.0.1
//! (tests/src/imds.rs) serving a real instance type; the pods use the host's network, as the
//! shipped DaemonSet does. What differs from the shipped files is what this cluster needs and
//! nothing of the agent's behaviour: host paths under the cluster's directory (its kubelet's
//! root directory is there, so the path allow-list and the registrar's socket path follow),
//! free health and metrics ports, the API server's address (127.0.0.1: no service network
//! here), and the instance-metadata endpoint.

use std::io::{Read, Write};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use ebs_tests::imds::{Imds, Instance};
use ebs_tests::k8s::{Cluster, repo_root, wait_until};

use super::Ctx;
use super::scenarios::{AGENT_PODS, DRIVER, agent_pod_name, agent_pods, klog_time, rollout};

const INSTANCE_ID: &str = "i-0c0ffee0k8s00001";
const INSTANCE_TYPE: &str = "m7i.large";
const ZONE: &str = "eu-central-1b";
/// m7i.large: 32 EBS attachments, dedicated (agent/core/data/ec2-ebs-attachment-limits.tsv), minus
/// the reserved root volume (this VM has no EBS disk, so the agent reserves its minimum of 1).
const EBS_ALLOCATABLE: i64 = 31;
const EBS_TOPOLOGY_KEYS: [&str; 3] = [
    "kubernetes.io/os",
    "topology.ebs.csi.aws.com/zone",
    "topology.kubernetes.io/zone",
];

/// The CSINode entry of our driver, if registered.
fn csinode_driver(c: &Cluster) -> Result<Option<serde_json::Value>, String> {
    let v = c.json(&["get", "csinode", "127.0.0.1"])?;
    Ok(v["spec"]["drivers"]
        .as_array()
        .and_then(|d| d.iter().find(|d| d["name"] == DRIVER).cloned()))
}

/// Takes the zone labels a registration put on the node, so that the next registration's
/// labels are its own (kubelet does not remove them when a driver goes).
fn unlabel_node(c: &Cluster) -> Result<(), String> {
    c.kubectl(&[
        "label",
        "node",
        "127.0.0.1",
        "topology.kubernetes.io/zone-",
        "topology.ebs.csi.aws.com/zone-",
    ])
    .map(|_| ())
}

/// Removes a deployment and waits until its pods are gone and kubelet has dropped the driver.
fn remove(c: &Cluster, kustomization: &str, selector: &str) -> Result<(), String> {
    let dir = c.dir.join(kustomization).to_string_lossy().into_owned();
    c.kubectl(&["delete", "-k", &dir, "--wait=true", "--timeout=90s"])?;
    wait_until(Duration::from_secs(90), "the agent's pods to go", || {
        Ok(c.kubectl(&[
            "-n",
            "kube-system",
            "get",
            "pods",
            "-l",
            selector,
            "-o",
            "name",
        ])?
        .trim()
        .is_empty())
    })?;
    wait_until(
        Duration::from_secs(60),
        "kubelet to drop the driver",
        || Ok(csinode_driver(c)?.is_none()),
    )?;
    unlabel_node(c)
}

/// The ebs registration as kubelet records it, once it holds. kubelet may drop a registration it
/// has just made: after the registrar restarts, its reconciler can deregister the plugin of the
/// re-created registration socket 0.2 s after registering it, and register it again on its next
/// pass (seen in a suite run: "Register new plugin" at 06:23:11.737, "DeRegisterPlugin" at
/// 06:23:11.954). The checks must hold within the minute; none of them is weakened.
fn settled_ebs_registration(c: &Cluster) -> Result<(), String> {
    wait_until(
        Duration::from_secs(60),
        "the ebs registration in CSINode and on the node:",
        || check_ebs_registration(c).map(|()| true),
    )
}

/// The ebs registration as kubelet recorded it: node id, topology keys, allocatable count; and
/// the node's topology labels.
fn check_ebs_registration(c: &Cluster) -> Result<(), String> {
    let d = csinode_driver(c)?.ok_or("the driver is not in CSINode")?;
    let mut keys: Vec<&str> = d["topologyKeys"]
        .as_array()
        .map(|k| k.iter().filter_map(|k| k.as_str()).collect())
        .unwrap_or_default();
    keys.sort_unstable();
    if keys != EBS_TOPOLOGY_KEYS {
        return Err(format!(
            "CSINode topology keys {keys:?}, expected {EBS_TOPOLOGY_KEYS:?}"
        ));
    }
    if d["nodeID"] != INSTANCE_ID {
        return Err(format!(
            "CSINode nodeID {}, expected {INSTANCE_ID}",
            d["nodeID"]
        ));
    }
    if d["allocatable"]["count"].as_i64() != Some(EBS_ALLOCATABLE) {
        return Err(format!(
            "CSINode allocatable {}, expected count {EBS_ALLOCATABLE} ({INSTANCE_TYPE})",
            d["allocatable"]
        ));
    }
    let node = c.json(&["get", "node", "127.0.0.1"])?;
    for key in &EBS_TOPOLOGY_KEYS[1..] {
        if node["metadata"]["labels"][key].as_str() != Some(ZONE) {
            return Err(format!(
                "node label {key}={}, expected {ZONE}",
                node["metadata"]["labels"][key]
            ));
        }
    }
    Ok(())
}

/// GET http://127.0.0.1:port/healthz: livenessprobe's answer, which is the agent's Probe.
pub(super) fn healthz(port: u16) -> Result<String, String> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    s.write_all(b"GET /healthz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .map_err(|e| e.to_string())?;
    let mut out = String::new();
    s.read_to_string(&mut out).map_err(|e| e.to_string())?;
    Ok(out)
}

fn health_port(c: &Cluster, kustomization: &str) -> Result<u16, String> {
    let ports = std::fs::read_to_string(c.dir.join(kustomization).join("ports"))
        .map_err(|e| e.to_string())?;
    ports
        .lines()
        .find_map(|l| l.strip_prefix("HEALTH_PORT="))
        .and_then(|p| p.trim().parse().ok())
        .ok_or_else(|| format!("no HEALTH_PORT in {ports:?}"))
}

fn wait_probe_ready(port: u16) -> Result<(), String> {
    wait_until(
        Duration::from_secs(60),
        "Probe ready (livenessprobe's /healthz 200)",
        || {
            Ok(healthz(port)
                .is_ok_and(|r| r.starts_with("HTTP/1.0 200") || r.starts_with("HTTP/1.1 200")))
        },
    )
}

/// Applies the kustomization `dir` and waits for DaemonSet `ds` and the driver in CSINode; the
/// seconds from `kubectl apply` to the registration.
fn apply_until_registered(c: &Cluster, dir: &str, ds: &str) -> Result<f64, String> {
    let applied = Instant::now();
    c.kubectl(&["apply", "-k", dir])?;
    rollout(c, ds)?;
    wait_until(Duration::from_secs(60), "the driver in CSINode", || {
        Ok(csinode_driver(c)?.is_some())
    })?;
    Ok(applied.elapsed().as_secs_f64())
}

/// The shipped packaging/kubernetes (node mode, backend ebs) registers with the zone keys and
/// the instance type's allocatable count, and its Probe is ready.
pub fn shipped_ebs_mode(ctx: &mut Ctx) -> Result<(), String> {
    let imds = ctx.rt.block_on(Imds::start(Instance {
        instance_id: INSTANCE_ID.into(),
        instance_type: INSTANCE_TYPE.into(),
        zone: ZONE.into(),
        region: "eu-central-1".into(),
        ..Instance::default()
    }));
    let endpoint = imds.endpoint();
    ctx.imds = Some(imds);
    let c = &ctx.cluster;
    // The loop deployment goes first: one driver name, one socket. Its volumes are gone already.
    wait_until(Duration::from_secs(60), "the loop volumes to go", || {
        Ok(c.kubectl(&["get", "pv", "-o", "name"])?.trim().is_empty())
    })?;
    remove(c, "deploy", AGENT_PODS)?;
    let shipped = repo_root().join("packaging/kubernetes");
    let shipped = shipped.to_string_lossy().into_owned();
    let env = format!("{{name: EBS_AGENT_IMDS_ENDPOINT, value: \"{endpoint}\"}}");
    c.script_env(
        "overlay.sh",
        &["deploy-ebs", &shipped],
        &[("AGENT_ENV", &env)],
        Duration::from_secs(60),
    )?;
    let dir = c.dir.join("deploy-ebs").to_string_lossy().into_owned();
    let secs = apply_until_registered(c, &dir, "ds/ebs-node-agent")?;
    ctx.figures.push(format!(
        "ebs mode: kubectl apply -k to the driver in CSINode: {secs:.1} s"
    ));
    settled_ebs_registration(c)?;
    wait_probe_ready(health_port(c, "deploy-ebs")?)
}

fn registrar_restarts(c: &Cluster) -> Result<i64, String> {
    let v = agent_pods(c)?;
    Ok(v["items"][0]["status"]["containerStatuses"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["name"] == "node-driver-registrar"))
        .and_then(|s| s["restartCount"].as_i64())
        .unwrap_or(0))
}

/// The exit code of the registrar's last run.
fn registrar_last_exit(c: &Cluster) -> Result<i64, String> {
    let v = agent_pods(c)?;
    v["items"][0]["status"]["containerStatuses"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["name"] == "node-driver-registrar"))
        .and_then(|s| s["lastState"]["terminated"]["exitCode"].as_i64())
        .ok_or_else(|| "the registrar has no last terminated state".to_string())
}

/// The agent starts while instance metadata does not answer: NodeGetInfo fails at
/// registration, kubelet refuses the plugin, the registrar exits and restarts. Once instance
/// metadata answers, the node registers: how long that takes is measured.
pub fn registration_after_identity(ctx: &mut Ctx) -> Result<(), String> {
    let imds = ctx.imds.as_ref().ok_or("no instance-metadata emulator")?;
    let c = &ctx.cluster;
    imds.switches.down.store(true, Ordering::SeqCst);
    let old = agent_pod_name(c)?;
    c.kubectl(&[
        "-n",
        "kube-system",
        "delete",
        "pod",
        old.trim(),
        "--wait=true",
        "--timeout=90s",
    ])?;
    wait_until(
        Duration::from_secs(60),
        "kubelet to drop the driver",
        || Ok(csinode_driver(c)?.is_none()),
    )?;
    unlabel_node(c)?;
    // The registration fails (the registrar restarts) and the driver stays out of CSINode.
    wait_until(
        Duration::from_secs(120),
        "the registrar to exit after a failed registration",
        || Ok(registrar_restarts(c)? >= 1),
    )?;
    if csinode_driver(c)?.is_some() {
        return Err("the driver registered while NodeGetInfo had no identity".into());
    }
    // It exited because the registration failed (not, say, a liveness probe's kill).
    let why = registrar_last_exit(c)?;
    if why != 1 {
        return Err(format!(
            "the registrar's last exit code is {why}, expected 1"
        ));
    }
    // Read until the runtime serves the exited container's log: right after the restart it
    // can answer "unable to retrieve container logs" (seen once in a CI rehearsal).
    let mut previous = String::new();
    let failed = wait_until(
        Duration::from_secs(30),
        "the registrar's previous log",
        || {
            previous = c
                .kubectl(&[
                    "-n",
                    "kube-system",
                    "logs",
                    "-p",
                    "ds/ebs-node-agent",
                    "-c",
                    "node-driver-registrar",
                ])
                .unwrap_or_default();
            Ok(previous.contains("Registration process failed"))
        },
    );
    if failed.is_err() {
        return Err(format!(
            "the registrar's previous run did not fail its registration: {previous}"
        ));
    }
    let restarts = registrar_restarts(c)?;
    let up = Instant::now();
    imds.switches.down.store(false, Ordering::SeqCst);
    wait_until(Duration::from_secs(300), "the driver in CSINode", || {
        Ok(csinode_driver(c)?.is_some())
    })?;
    let registered = up.elapsed().as_secs_f64();
    settled_ebs_registration(c)?;
    // The agent's own "identity found" moment, from its log, against kubelet's registration.
    let log = c.agent_log().unwrap_or_default();
    let resolved = log
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| {
            // agent/daemon/src/nodeinfo/sources.rs: the line once the identity is complete.
            v["message"] == "node identity known" && v["level"] == "INFO"
        })
        .and_then(|v| {
            v["timestamp"]
                .as_str()
                .and_then(ebs_tests::k8s::parse_rfc3339)
        });
    let kubelet = std::fs::read_to_string(c.dir.join("logs/kubelet.log")).unwrap_or_default();
    let last_register = kubelet
        .lines()
        .rfind(|l| l.contains("Register new plugin with name: ebs.csi.aws.com"))
        .and_then(klog_time);
    let detail = match (resolved, last_register) {
        (Some(r), Some(k)) => format!(
            "; the agent's identity found to kubelet's last registration attempt {:.1} s",
            k - r.rem_euclid(86400.0)
        ),
        _ => String::new(),
    };
    ctx.figures.push(format!(
        "NodeGetInfo failing at registration (IMDS down; {restarts} registrar restart(s)): IMDS \
         answering to the driver in CSINode {registered:.1} s{detail}"
    ));
    Ok(())
}

const CHART_SA: &str = "apiVersion: v1
kind: ServiceAccount
metadata: {name: ebs-csi-node-sa, namespace: kube-system}
";

/// The upstream chart's rendered node manifest (tests/fixtures), through the shipped
/// post-renderer (packaging/kubernetes/upstream-chart), registers as the shipped DaemonSet did.
/// The chart's own values give the host network (node.hostNetwork=true, the cluster has no other
/// network); paths move under the cluster's directory as for the shipped DaemonSet.
pub fn upstream_chart(ctx: &mut Ctx) -> Result<(), String> {
    let c = &ctx.cluster;
    let endpoint = ctx
        .imds
        .as_ref()
        .ok_or("no instance-metadata emulator")?
        .endpoint();
    remove(c, "deploy-ebs", AGENT_PODS)?;
    let dir = c.dir.join("chart");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let fixture = repo_root().join("tests/fixtures/aws-ebs-csi-driver-2.64-node.yaml");
    let rendered = std::fs::read(&fixture).map_err(|e| format!("{}: {e}", fixture.display()))?;
    let post = repo_root().join("packaging/kubernetes/upstream-chart/post-render.sh");
    let out = c
        .run_with_input(&post, &rendered, Duration::from_secs(60))
        .map_err(|e| format!("post-render.sh: {e}"))?;
    std::fs::write(dir.join("post-rendered.yaml"), out).map_err(|e| e.to_string())?;
    std::fs::write(dir.join("sa.yaml"), CHART_SA).map_err(|e| e.to_string())?;
    std::fs::copy(
        repo_root().join("tests/fixtures/aws-ebs-csi-driver-2.64-csidriver.yaml"),
        dir.join("csidriver.yaml"),
    )
    .map_err(|e| e.to_string())?;
    let k = c.dir.join("kubelet");
    let k = k.display();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| e.to_string())?
        .port();
    let d = c.dir.display();
    let kustomization = format!(
        r#"apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources: [post-rendered.yaml, sa.yaml, csidriver.yaml]
patches:
  - target: {{kind: DaemonSet, name: ebs-csi-node}}
    patch: |-
      - {{op: replace, path: /spec/template/spec/hostNetwork, value: true}}
      - {{op: test, path: /spec/template/spec/containers/0/name, value: ebs-plugin}}
      - {{op: test, path: /spec/template/spec/containers/0/args/2, value: "--csi-mount-point-prefix=/var/lib/kubelet/plugins/kubernetes.io/csi/ebs.csi.aws.com/"}}
      - {{op: replace, path: /spec/template/spec/containers/0/args/2, value: "--csi-mount-point-prefix={k}/plugins/kubernetes.io/csi/ebs.csi.aws.com/"}}
      - {{op: test, path: /spec/template/spec/containers/0/volumeMounts/2/name, value: kubelet-dir}}
      - {{op: replace, path: /spec/template/spec/containers/0/volumeMounts/2/mountPath, value: "{k}"}}
      - {{op: replace, path: /spec/template/spec/containers/0/ports/0/containerPort, value: {port}}}
      - {{op: test, path: /spec/template/spec/containers/1/env/1/name, value: DRIVER_REG_SOCK_PATH}}
      - {{op: replace, path: /spec/template/spec/containers/1/env/1/value, value: "{k}/plugins/ebs.csi.aws.com/csi.sock"}}
      - {{op: test, path: /spec/template/spec/containers/2/name, value: liveness-probe}}
      - {{op: add, path: /spec/template/spec/containers/2/args/-, value: "--health-port={port}"}}
  - target: {{kind: DaemonSet, name: ebs-csi-node}}
    patch: |-
      apiVersion: apps/v1
      kind: DaemonSet
      metadata: {{name: ebs-csi-node, namespace: kube-system}}
      spec:
        template:
          spec:
            containers:
              - name: ebs-plugin
                env:
                  - {{name: EBS_AGENT_IMDS_ENDPOINT, value: "{endpoint}"}}
                  - {{name: EBS_AGENT_ALLOWED_PATH_PREFIXES, value: "{k}"}}
            volumes:
              - {{name: kubelet-dir, hostPath: {{path: "{k}", type: Directory}}}}
              - {{name: plugin-dir, hostPath: {{path: "{k}/plugins/ebs.csi.aws.com/", type: DirectoryOrCreate}}}}
              - {{name: registration-dir, hostPath: {{path: "{k}/plugins_registry/", type: Directory}}}}
              - {{name: ebs-node-agent-state, hostPath: {{path: "{d}/agent-state-chart", type: DirectoryOrCreate}}}}
              - {{name: udev-dir, hostPath: {{path: "{d}/udev", type: DirectoryOrCreate}}}}
"#
    );
    std::fs::write(dir.join("kustomization.yaml"), kustomization).map_err(|e| e.to_string())?;
    let secs = apply_until_registered(c, &dir.to_string_lossy(), "ds/ebs-csi-node")?;
    ctx.figures.push(format!(
        "upstream chart path: kubectl apply -k to the driver in CSINode: {secs:.1} s"
    ));
    settled_ebs_registration(c)?;
    wait_probe_ready(port)
}
