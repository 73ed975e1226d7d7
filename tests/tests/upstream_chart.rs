//! The agent started exactly as the upstream aws-ebs-csi-driver chart (2.64) starts its node
//! container: the argument list `_node.tpl` renders for the given values, `$(CSI_ENDPOINT)`
//! expanded as kubelet expands it, and the chart's environment. Only the socket path (a scratch
//! one, in the chart's one-slash form) and the test rig's own settings (state dir, the IMDS
//! emulator, a sysfs fixture; all through environment variables) differ from a real node.
//! Each time the agent serves and NodeGetInfo answers.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ebs_node_core::ec2::ebs::EBS_MODEL;
use ebs_node_fixture::flat as fixture;
use ebs_tests::imds::{Imds, Instance};
use ebs_tests::*;

const KUBELET: &str = "/var/lib/kubelet";

/// The chart values that change the node container's arguments.
#[derive(Default, Clone)]
struct Values {
    enable_metrics: bool,
    /// Changes the pod's mounts and the CSIDriver (seLinuxMount), not the arguments.
    selinux: bool,
    legacy_xfs: bool,
    volume_attach_limit: Option<i64>,
    reserved_volume_attachments: Option<i64>,
    metadata_sources: Option<&'static str>,
    logging_format: Option<&'static str>,
    log_level: Option<u8>,
    otel_tracing: bool,
    additional_args: Vec<&'static str>,
}

/// `args:` of the `ebs-plugin` container, in the template's order.
fn chart_args(v: &Values, endpoint: &str) -> Vec<String> {
    let mut a = vec!["node".to_string(), format!("--endpoint={endpoint}")];
    if let Some(n) = v.reserved_volume_attachments {
        a.push(format!("--reserved-volume-attachments={n}"));
    }
    if v.enable_metrics {
        a.push("--http-endpoint=0.0.0.0:3302".into());
    }
    a.push(format!(
        "--csi-mount-point-prefix={KUBELET}/plugins/kubernetes.io/csi/ebs.csi.aws.com/"
    ));
    if let Some(n) = v.volume_attach_limit {
        a.push(format!("--volume-attach-limit={n}"));
    }
    if let Some(s) = v.metadata_sources {
        a.push(format!("--metadata-sources={s}"));
    }
    if v.legacy_xfs {
        a.push("--legacy-xfs=true".into());
    }
    a.push(format!(
        "--logging-format={}",
        v.logging_format.unwrap_or("text")
    ));
    a.push(format!("--v={}", v.log_level.unwrap_or(2)));
    if v.otel_tracing {
        a.push("--enable-otel-tracing=true".into());
    }
    a.extend(v.additional_args.iter().map(|s| s.to_string()));
    a
}

/// The agent process, killed on drop.
struct Node {
    child: Child,
    socket: PathBuf,
    log: PathBuf,
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Node {
    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// NodeGetInfo, once the identity lookup has found the emulator.
    async fn node_info(&mut self) -> csi::NodeGetInfoResponse {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.try_wait().ok().flatten() {
                panic!("agent exited ({status}); log:\n{}", self.log_text());
            }
            if let Ok(ch) = channel(&self.socket).await {
                let r = csi::node_client::NodeClient::new(ch)
                    .node_get_info(csi::NodeGetInfoRequest {})
                    .await;
                if let Ok(r) = r {
                    return r.into_inner();
                }
            }
            assert!(
                Instant::now() < deadline,
                "NodeGetInfo never answered; log:\n{}",
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Starts the agent with the chart's arguments for `values` on a host with its root volume and
/// one interface, the IMDS emulator being the instance.
fn start(scratch: &Scratch, imds: &Imds, values: &Values) -> Node {
    let sysfs = scratch.join("sys");
    fixture::nvme_disk(&sysfs, "nvme0n1", EBS_MODEL, "vol0123456789abcdef0");
    fixture::nic(&sysfs, "ena", "0000:00:05.0");
    let socket = scratch.join("csi/csi.sock");
    let endpoint = format!("unix:{}", socket.display());
    let log = scratch.join("agent.log");
    let out = std::fs::File::create(&log).expect("log");
    let child = Command::new(agent_bin())
        .args(chart_args(values, &endpoint))
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        // The chart's environment.
        .env("CSI_ENDPOINT", &endpoint)
        .env("CSI_NODE_NAME", "ip-10-0-0-1.eu-central-1.compute.internal")
        // The test rig's.
        .env("EBS_AGENT_STATE_DIR", scratch.join("state"))
        .env("EBS_AGENT_IMDS_ENDPOINT", imds.endpoint())
        .env("EBS_AGENT_SYSFS_ROOT", &sysfs)
        .stdin(Stdio::null())
        .stdout(out.try_clone().expect("log"))
        .stderr(out)
        .spawn()
        .expect("spawn agent");
    Node { child, socket, log }
}

async fn emulator() -> Imds {
    Imds::start(Instance {
        instance_type: "m7i.large".into(),
        ..Instance::default()
    })
    .await
}

/// `--http-endpoint=0.0.0.0:3302` is fixed in the chart: test runs that use it take turns,
/// holding an abstract unix socket name shared by every checkout on this machine (the kernel
/// frees it when the holder exits, and it leaves no file behind).
fn port_3302() -> std::os::unix::net::UnixListener {
    use std::os::linux::net::SocketAddrExt;
    let name = std::os::unix::net::SocketAddr::from_abstract_name(b"ebs-tests-port-3302")
        .expect("an abstract socket name");
    let start = std::time::Instant::now();
    loop {
        match std::os::unix::net::UnixListener::bind_addr(&name) {
            Ok(held) => return held,
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                assert!(
                    start.elapsed() < Duration::from_secs(600),
                    "port 3302 stayed taken by another test run"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("taking turns for port 3302: {e}"),
        }
    }
}

fn http_get(addr: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect(addr).expect("connect to the metrics address");
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        c,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    let _ = c.read_to_string(&mut out);
    out
}

fn warnings(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| l.contains("is accepted and ignored"))
        .collect()
}

async fn serves(name: &str, values: Values) -> (csi::NodeGetInfoResponse, String) {
    let scratch = Scratch::new(name);
    let imds = emulator().await;
    let mut node = start(&scratch, &imds, &values);
    let info = node.node_info().await;
    assert_eq!(info.node_id, "i-0feedfacecafe0001");
    let topo = info.accessible_topology.clone().expect("topology").segments;
    assert_eq!(topo["topology.ebs.csi.aws.com/zone"], "eu-central-1b");
    assert_eq!(topo["topology.kubernetes.io/zone"], "eu-central-1b");
    assert_eq!(topo["kubernetes.io/os"], "linux");
    assert!(
        node.socket.exists(),
        "the socket is where CSI_ENDPOINT says"
    );
    (info, node.log_text())
}

#[tokio::test]
async fn chart_defaults() {
    if !require_root("chart_defaults") {
        return;
    }
    let (info, log) = serves("chart-defaults", Values::default()).await;
    // m7i.large: dedicated 32 - the root volume, as upstream reports it.
    assert_eq!(info.max_volumes_per_node, 31);
    assert!(warnings(&log).is_empty(), "{log}");
    // --logging-format=text: plain lines, not JSON.
    assert!(log.lines().any(|l| l.contains("serving")), "{log}");
    assert!(!log.trim_start().starts_with('{'), "{log}");
}

#[tokio::test]
async fn chart_enable_metrics() {
    if !require_root("chart_enable_metrics") {
        return;
    }
    let _turn = port_3302();
    let scratch = Scratch::new("chart-metrics");
    let imds = emulator().await;
    let values = Values {
        enable_metrics: true,
        ..Default::default()
    };
    let mut node = start(&scratch, &imds, &values);
    node.node_info().await;
    // --http-endpoint is the metrics address: /metrics answers on port 3302.
    let answer = http_get("127.0.0.1:3302", "/metrics");
    assert!(
        answer.starts_with("HTTP/1.1 200"),
        "{answer}\n{}",
        node.log_text()
    );
    assert!(warnings(&node.log_text()).is_empty());
}

#[tokio::test]
async fn chart_selinux() {
    if !require_root("chart_selinux") {
        return;
    }
    let values = Values {
        selinux: true,
        ..Default::default()
    };
    assert!(values.selinux);
    assert_eq!(
        chart_args(&values, "e"),
        chart_args(&Values::default(), "e"),
        "node.selinux changes mounts, not arguments"
    );
    let (info, _) = serves("chart-selinux", values).await;
    assert_eq!(info.max_volumes_per_node, 31);
}

#[tokio::test]
async fn chart_legacy_xfs() {
    if !require_root("chart_legacy_xfs") {
        return;
    }
    let (info, log) = serves(
        "chart-legacy-xfs",
        Values {
            legacy_xfs: true,
            ..Default::default()
        },
    )
    .await;
    assert_eq!(info.max_volumes_per_node, 31);
    assert!(warnings(&log).is_empty(), "{log}");
}

#[tokio::test]
async fn chart_volume_attach_limit() {
    if !require_root("chart_volume_attach_limit") {
        return;
    }
    let (info, _) = serves(
        "chart-attach-limit",
        Values {
            volume_attach_limit: Some(25),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(info.max_volumes_per_node, 25);
    // -1 is upstream's "unset".
    let (info, _) = serves(
        "chart-attach-limit-unset",
        Values {
            volume_attach_limit: Some(-1),
            reserved_volume_attachments: Some(-1),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(info.max_volumes_per_node, 31);
}

#[tokio::test]
async fn chart_all_four_values_together() {
    if !require_root("chart_all_four_values_together") {
        return;
    }
    let _turn = port_3302();
    let (info, log) = serves(
        "chart-all-four",
        Values {
            enable_metrics: true,
            selinux: true,
            legacy_xfs: true,
            volume_attach_limit: Some(20),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(info.max_volumes_per_node, 20);
    assert!(warnings(&log).is_empty(), "{log}");
}

/// Every other value the template renders, and the flags users add through
/// node.additionalArgs: still serving, one warning line for each flag that changes nothing.
#[tokio::test]
async fn chart_every_optional_value() {
    if !require_root("chart_every_optional_value") {
        return;
    }
    let _turn = port_3302();
    let (info, log) = serves(
        "chart-everything",
        Values {
            enable_metrics: true,
            reserved_volume_attachments: Some(2),
            metadata_sources: Some("imds,kubernetes"),
            legacy_xfs: true,
            logging_format: Some("json"),
            log_level: Some(7),
            otel_tracing: true,
            additional_args: vec![
                "--kubeconfig=/etc/kubernetes/kubeconfig",
                "--metrics-cert-file=/certs/tls.crt",
                "--metrics-key-file=/certs/tls.key",
            ],
            ..Default::default()
        },
    )
    .await;
    // The reserved count replaces the automatic one, as upstream's: 32 - 2.
    assert_eq!(info.max_volumes_per_node, 30);
    let w = warnings(&log);
    for flag in [
        "--metadata-sources",
        "--enable-otel-tracing",
        "--kubeconfig",
        "--metrics-cert-file",
        "--metrics-key-file",
    ] {
        let n = w.iter().filter(|l| l.contains(flag)).count();
        assert_eq!(n, 1, "{flag}: {n} warnings in\n{log}");
    }
    assert_eq!(w.len(), 5, "{w:#?}");
    // --logging-format=json: JSON lines.
    assert!(w.iter().all(|l| l.trim_start().starts_with('{')), "{w:#?}");
}

#[test]
fn a_typo_still_exits_2_and_upstream_flags_never_do() {
    let run = |args: &[&str]| {
        Command::new(agent_bin())
            .args(args)
            .arg("--print-config")
            .env_clear()
            .output()
            .expect("agent")
    };
    let mut every: Vec<String> = chart_args(
        &Values {
            enable_metrics: true,
            legacy_xfs: true,
            volume_attach_limit: Some(-1),
            reserved_volume_attachments: Some(-1),
            metadata_sources: Some("imds"),
            otel_tracing: true,
            ..Default::default()
        },
        "unix:/csi/csi.sock",
    );
    every.extend(
        [
            "--kubeconfig=/k",
            "--metrics-cert-file=/c",
            "--metrics-key-file=/k",
            "--logtostderr",
            "-v",
            "3",
        ]
        .map(String::from),
    );
    let words: Vec<&str> = every.iter().map(String::as_str).collect();
    let out = run(&words);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cfg: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(cfg["mode"], "node");
    assert_eq!(cfg["socket_path"], "/csi/csi.sock");
    assert_eq!(cfg["metrics_address"], "0.0.0.0:3302");
    assert_eq!(cfg["legacy_xfs"], true);
    assert_eq!(
        cfg["csi_mount_point_prefix"],
        "/var/lib/kubelet/plugins/kubernetes.io/csi/ebs.csi.aws.com/"
    );
    for (typo, word) in [
        (
            vec!["node", "--endpointt=unix:/csi/csi.sock"],
            "--endpointt",
        ),
        (vec!["node", "--v=2", "--legacy-xf"], "--legacy-xf"),
        (vec!["node", "--volume-attach-limit=-2"], "-2"),
        (vec!["nodes", "--v=2"], "nodes"),
    ] {
        let out = run(&typo);
        assert_eq!(out.status.code(), Some(2), "{typo:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(word), "{typo:?}: {err}");
    }
    // Our own command line is unchanged.
    let ours = run(&[
        "serve",
        "--mode",
        "node",
        "--endpoint",
        "unix:///run/x/csi.sock",
    ]);
    assert!(ours.status.success());
}
