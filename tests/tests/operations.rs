//! Running the agent as operators do: systemd's notify protocol, the Prometheus endpoint, the logs
//! (one line per call, JSON on request, never a secret), and the systemd unit's capability set.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ebs_tests::csi_req::*;
use ebs_tests::http::{free_port, http_get, sample};
use ebs_tests::*;

use csi::volume_capability::access_mode::Mode;

/// A staged and published ext4 volume under the agent's work dir (an allowed prefix).
async fn stage_and_publish(agent: &Agent, name: &str) -> (Vol, PathBuf, PathBuf) {
    let vol = create_attached(agent, name, 64 << 20).await;
    let staging = agent.work.join(format!("stage-{name}"));
    let target = agent.work.join(format!("target-{name}"));
    std::fs::create_dir_all(&staging).unwrap();
    let cap = mount_cap("ext4", Mode::SingleNodeWriter);
    agent
        .node()
        .await
        .node_stage_volume(stage_req(&vol, &staging, cap.clone()))
        .await
        .unwrap();
    agent
        .node()
        .await
        .node_publish_volume(publish_req(&vol, &staging, &target, cap, false))
        .await
        .unwrap();
    (vol, staging, target)
}

#[tokio::test]
async fn metrics_after_a_stage_publish_cycle() {
    if !require_root("metrics_after_a_stage_publish_cycle") {
        return;
    }
    let scratch = Scratch::new("metrics");
    let port = free_port();
    let opts = AgentOpts {
        args: vec![
            "--backend".into(),
            "loop".into(),
            "--metrics-address".into(),
            format!("127.0.0.1:{port}"),
        ],
        ..Default::default()
    };
    let agent = Agent::start(&scratch, opts).await;
    let (vol, staging, _target) = stage_and_publish(&agent, "m1").await;
    // One refused call, for the error-code label.
    let bad = agent
        .node()
        .await
        .node_publish_volume(csi::NodePublishVolumeRequest {
            volume_id: vol.id.clone(),
            staging_target_path: staging.display().to_string(),
            ..Default::default()
        })
        .await;
    assert_eq!(bad.unwrap_err().code(), tonic::Code::InvalidArgument);

    let (head, body) = http_get(port, "/metrics");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        head.contains("Content-Type: text/plain; version=0.0.4"),
        "{head}"
    );

    for rpc in [
        "CreateVolume",
        "ControllerPublishVolume",
        "NodeStageVolume",
        "NodePublishVolume",
    ] {
        assert_eq!(
            sample(
                &body,
                &format!("ebs_agent_rpc_requests_total{{rpc=\"{rpc}\",code=\"OK\"}}")
            ),
            1.0
        );
        let h = format!(
            "ebs_agent_rpc_duration_seconds_bucket{{rpc=\"{rpc}\",code=\"OK\",le=\"+Inf\"}}"
        );
        assert_eq!(sample(&body, &h), 1.0);
        let sum = format!("ebs_agent_rpc_duration_seconds_sum{{rpc=\"{rpc}\",code=\"OK\"}}");
        assert!(sample(&body, &sum) > 0.0);
    }
    assert_eq!(
        sample(
            &body,
            "ebs_agent_rpc_requests_total{rpc=\"NodePublishVolume\",code=\"InvalidArgument\"}"
        ),
        1.0
    );
    // Host steps of the stage and the publish, each timed from intent to done.
    for (op, step) in [
        ("stage", "probe"),
        ("stage", "format"),
        ("stage", "mount"),
        ("publish", "bind"),
    ] {
        let count = format!(
            "ebs_agent_step_duration_seconds_count{{op=\"{op}\",step=\"{step}\",result=\"ok\"}}"
        );
        assert_eq!(sample(&body, &count), 1.0, "{op}.{step}");
    }
    // Buckets are cumulative and end at the count.
    let buckets: Vec<f64> = body
        .lines()
        .filter(|l| {
            l.starts_with(
                "ebs_agent_step_duration_seconds_bucket{op=\"stage\",step=\"format\",result=\"ok\"",
            )
        })
        .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
        .collect();
    assert!(
        buckets.len() > 5 && buckets.windows(2).all(|w| w[0] <= w[1]),
        "{buckets:?}"
    );
    assert_eq!(*buckets.last().unwrap(), 1.0);
    assert!(
        sample(
            &body,
            "ebs_agent_journal_commit_seconds_count{durability=\"immediate\"}"
        ) >= 2.0
    );
    assert!(
        sample(
            &body,
            "ebs_agent_journal_commit_seconds_count{durability=\"lazy\"}"
        ) >= 1.0
    );
    assert_eq!(sample(&body, "ebs_agent_volumes_staged"), 1.0);
    assert_eq!(sample(&body, "ebs_agent_volumes_published"), 1.0);
    assert_eq!(sample(&body, "ebs_agent_operations_in_flight"), 0.0);
    assert_eq!(sample(&body, "ebs_agent_ready"), 1.0);
    for family in [
        "ebs_agent_rpc_requests_total counter",
        "ebs_agent_rpc_duration_seconds histogram",
        "ebs_agent_step_duration_seconds histogram",
        "ebs_agent_journal_commit_seconds histogram",
        "ebs_agent_volumes_staged gauge",
    ] {
        assert!(body.contains(&format!("# TYPE {family}\n")), "{family}");
    }

    let (head, _) = http_get(port, "/other");
    assert!(head.starts_with("HTTP/1.1 404"), "{head}");
}

#[tokio::test]
async fn metrics_address_in_use_stops_the_start_without_a_socket() {
    if !require_root("metrics_address_in_use_stops_the_start_without_a_socket") {
        return;
    }
    let scratch = Scratch::new("metrics-busy");
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap().to_string();
    let opts = AgentOpts {
        args: vec![
            "--backend".into(),
            "loop".into(),
            "--metrics-address".into(),
            addr.clone(),
        ],
        wait_ready: false,
        ..Default::default()
    };
    let mut agent = Agent::start(&scratch, opts).await;
    let status = agent
        .wait_exit(Duration::from_secs(20))
        .await
        .expect("agent exits");
    assert!(!status.success());
    assert!(
        agent
            .log_text()
            .contains(&format!("--metrics-address {addr}")),
        "{}",
        agent.log_text()
    );
    assert!(!agent.socket.exists());
}

#[tokio::test]
async fn sd_notify_ready_after_recovery_and_stopping_on_sigterm() {
    if !require_root("sd_notify_ready_after_recovery_and_stopping_on_sigterm") {
        return;
    }
    let scratch = Scratch::new("notify");
    let mut agent = Agent::start(&scratch, AgentOpts::default()).await;
    // Something for start-up recovery to check: a staged, published volume, then a crash.
    stage_and_publish(&agent, "n1").await;
    agent.kill();

    let notify_path = scratch.join("notify.sock");
    let notify = tokio::net::UnixDatagram::bind(&notify_path).unwrap();
    let opts = AgentOpts {
        env: vec![
            ("NOTIFY_SOCKET".into(), notify_path.display().to_string()),
            ("WATCHDOG_USEC".into(), "200000".into()),
        ],
        wait_ready: false,
        ..Default::default()
    };
    agent.restart(Some(opts)).await;
    async fn recv(sock: &tokio::net::UnixDatagram) -> String {
        let mut buf = [0u8; 512];
        let n = tokio::time::timeout(Duration::from_secs(30), sock.recv(&mut buf))
            .await
            .expect("a notify message in time")
            .unwrap();
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }
    let first = recv(&notify).await;
    assert!(first.lines().any(|l| l == "READY=1"), "{first}");
    assert!(
        first.contains(&format!("MAINPID={}", agent.pid())),
        "{first}"
    );
    // READY=1 came after recovery: its log line is written, and Probe already says ready.
    let log = agent.log_text();
    assert!(
        log.contains("start-up recovery done") && log.contains("volumes=1"),
        "{log}"
    );
    let probe = agent
        .identity()
        .await
        .probe(csi::ProbeRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(probe.ready, Some(true));

    // The watchdog is fed (at half of WATCHDOG_USEC), then SIGTERM brings STOPPING=1.
    let watchdog = recv(&notify).await;
    assert_eq!(watchdog, "WATCHDOG=1");
    let pid = nix::unistd::Pid::from_raw(agent.pid() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let msg = recv(&notify).await;
        if msg == "STOPPING=1" {
            break;
        }
        assert_eq!(msg, "WATCHDOG=1", "unexpected notify message");
        assert!(Instant::now() < deadline, "no STOPPING=1");
    }
    let status = agent
        .wait_exit(Duration::from_secs(20))
        .await
        .expect("exits");
    assert!(status.success());
}

const SECRET: &str = "hunter2-SECRET";

#[tokio::test]
async fn secrets_never_reach_the_logs_and_json_logs_have_one_line_per_call() {
    if !require_root("secrets_never_reach_the_logs_and_json_logs_have_one_line_per_call") {
        return;
    }
    let scratch = Scratch::new("secrets");
    let opts = AgentOpts {
        args: vec![
            "--backend".into(),
            "loop".into(),
            "--log-format".into(),
            "json".into(),
        ],
        ..Default::default()
    };
    let agent = Agent::start(&scratch, opts).await;
    let secrets = || {
        [("password".to_string(), SECRET.to_string())]
            .into_iter()
            .collect()
    };
    let created = agent
        .controller()
        .await
        .create_volume(csi::CreateVolumeRequest {
            name: "sec1".into(),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: 64 << 20,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![mount_cap("ext4", Mode::SingleNodeWriter)],
            secrets: secrets(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let vol = attach(&agent, &created.volume.unwrap().volume_id).await;
    let staging = agent.work.join("stage-sec1");
    let target = agent.work.join("target-sec1");
    std::fs::create_dir_all(&staging).unwrap();
    let cap = mount_cap("ext4", Mode::SingleNodeWriter);
    let mut stage = stage_req(&vol, &staging, cap.clone());
    stage.secrets = secrets();
    agent
        .node()
        .await
        .node_stage_volume(stage.clone())
        .await
        .unwrap();
    let mut publish = publish_req(&vol, &staging, &target, cap, false);
    publish.secrets = secrets();
    agent
        .node()
        .await
        .node_publish_volume(publish)
        .await
        .unwrap();
    // A refused call that carried secrets: its error line must not echo them either.
    stage.volume_capability = None;
    assert!(agent.node().await.node_stage_volume(stage).await.is_err());

    let log = agent.log_text();
    assert!(
        !log.contains(SECRET) && !log.contains("hunter2"),
        "secret in the log:\n{log}"
    );

    let mut calls = Vec::new();
    for line in log.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        if v["rpc"].is_string() {
            assert!(v["volume"].is_string(), "{line}");
            assert!(v["ms"].is_number(), "{line}");
            calls.push(format!(
                "{} {}",
                v["rpc"].as_str().unwrap(),
                v["level"].as_str().unwrap_or("")
            ));
        }
    }
    let stages = calls
        .iter()
        .filter(|c| c.starts_with("NodeStageVolume"))
        .count();
    assert_eq!(stages, 2, "one line per call: {calls:?}");
    assert!(
        calls.iter().any(|c| c == "NodeStageVolume WARN"),
        "{calls:?}"
    );
    assert_eq!(
        calls
            .iter()
            .filter(|c| c.starts_with("NodePublishVolume"))
            .count(),
        1
    );
}

/// The capabilities `CapabilityBoundingSet=` in the shipped unit grants, as setpriv names them.
fn unit_capabilities() -> Vec<String> {
    let unit = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../systemd/ebs-node-agent.service"),
    )
    .unwrap();
    let line = unit
        .lines()
        .find_map(|l| l.strip_prefix("CapabilityBoundingSet="))
        .unwrap();
    line.split_whitespace()
        .map(|c| c.trim_start_matches("CAP_").to_lowercase())
        .collect()
}

fn cap_mask(names: &[String]) -> u64 {
    names
        .iter()
        .map(|n| match n.as_str() {
            "dac_read_search" => 1u64 << 2,
            "mknod" => 1 << 27,
            "sys_admin" => 1 << 21,
            "sys_resource" => 1 << 24,
            other => panic!("add {other} to cap_mask"),
        })
        .fold(0, |a, b| a | b)
}

#[tokio::test]
async fn the_units_capability_set_is_enough_for_the_volume_lifecycle() {
    if !require_root("the_units_capability_set_is_enough_for_the_volume_lifecycle") {
        return;
    }
    let mut caps = unit_capabilities();
    // systemd hosts have a devtmpfs /dev, where the kernel creates loop nodes itself; a sandbox
    // with a plain tmpfs /dev needs the loop backend's mknod fallback.
    let devtmpfs = String::from_utf8(
        Command::new("stat")
            .args(["-f", "-c", "%T", "/dev"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap()
    .trim()
        == "devtmpfs";
    if !devtmpfs {
        caps.push("mknod".into());
    }
    let scratch = Scratch::new("unit-caps");
    let mut agent = Agent {
        child: None,
        socket: scratch.join("run/csi.sock"),
        state_dir: scratch.join("state"),
        work: scratch.join("w"),
        log: scratch.join("agent.log"),
        opts: AgentOpts::default(),
    };
    let log = std::fs::File::create(&agent.log).unwrap();
    let bounding = format!(
        "-all,{}",
        caps.iter()
            .map(|c| format!("+{c}"))
            .collect::<Vec<_>>()
            .join(",")
    );
    // As the unit: only these capabilities, no new privileges, UMask=0077.
    let script = "umask 0077; exec \"$@\"";
    let child = Command::new("sh")
        .args([
            "-c",
            script,
            "sh",
            "setpriv",
            "--no-new-privs",
            "--inh-caps=-all",
        ])
        .arg(format!("--bounding-set={bounding}"))
        .arg(agent_bin())
        .args(agent.serve_args())
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    agent.child = Some(child);
    agent.wait_ready().await;

    let cap_field = |pid: &str, field: &str| {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let hex = status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .unwrap()
            .trim()
            .to_string();
        u64::from_str_radix(&hex, 16).unwrap()
    };
    // What the unit grants, within what this sandbox itself may hold.
    let expected = cap_mask(&caps) & cap_field("self", "CapBnd:");
    let held = cap_field(&agent.pid().to_string(), "CapEff:");
    assert_eq!(
        held, expected,
        "the agent holds other capabilities than the unit grants"
    );

    for fs in ["ext4", "xfs"] {
        let vol = create_attached(&agent, &format!("caps-{fs}"), 320 << 20).await;
        let staging = agent.work.join(format!("stage-{fs}"));
        let target = agent.work.join(format!("target-{fs}"));
        std::fs::create_dir_all(&staging).unwrap();
        let cap = mount_cap(fs, Mode::SingleNodeWriter);
        let mut node = agent.node().await;
        node.node_stage_volume(stage_req(&vol, &staging, cap.clone()))
            .await
            .unwrap();
        node.node_publish_volume(publish_req(&vol, &staging, &target, cap, false))
            .await
            .unwrap();
        std::fs::write(target.join("file"), b"data").unwrap();
        node.node_unpublish_volume(unpublish_req(&vol, &target))
            .await
            .unwrap();
        node.node_unstage_volume(unstage_req(&vol, &staging))
            .await
            .unwrap();
    }
    assert!(
        agent.terminate().await.expect("exits").success(),
        "{}",
        agent.log_text()
    );
}

/// Whether this process has `cap` (a bit of CapEff in /proc/self/status).
fn has_effective_cap(bit: u32) -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .unwrap()
        .trim();
    u64::from_str_radix(hex, 16).unwrap() & (1 << bit) != 0
}

/// `doctor` prints one line per check with its fix, names a missing CAP_SYS_RESOURCE (which only
/// online ext4 growth needs) without failing the loop backend, and fails when something the
/// backend needs is missing (here: a state directory that cannot be created).
#[test]
fn doctor_names_what_is_missing_and_fails_only_for_what_is_needed() {
    if !require_root("doctor_names_what_is_missing_and_fails_only_for_what_is_needed") {
        return;
    }
    let scratch = Scratch::new("doctor");
    let doctor = |state_dir: &std::path::Path| {
        let out = Command::new(agent_bin())
            .args(["doctor", "--backend", "loop", "--skip-imds", "--endpoint"])
            .arg(format!("unix://{}", scratch.join("run/csi.sock").display()))
            .arg("--state-dir")
            .arg(state_dir)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (code, text) = doctor(&scratch.join("state"));
    assert_eq!(code, Some(0), "{text}");
    const CAP_SYS_RESOURCE: u32 = 24;
    let resource = line_of(&text, "CAP_SYS_RESOURCE");
    if has_effective_cap(CAP_SYS_RESOURCE) {
        assert!(resource.starts_with("ok "), "{resource}");
    } else {
        assert!(
            resource.starts_with("warning ")
                && resource.contains("missing")
                && resource.contains("Fix:"),
            "{resource}"
        );
    }
    assert!(line_of(&text, "CAP_SYS_ADMIN").starts_with("ok "));
    for name in [
        "ext4", "loop", "openat2", "socket", "state", "udev", "instance",
    ] {
        line_of(&text, name);
    }
    assert!(text.contains("ready for --backend loop"), "{text}");
    assert!(!scratch.join("state").exists(), "doctor creates nothing");

    let (code, text) = doctor(&unwritable_dir(&scratch));
    assert_eq!(code, Some(1), "{text}");
    let state = line_of(&text, "state");
    assert!(
        state.starts_with("MISSING ") && state.contains("not a directory"),
        "{state}"
    );
}

fn line_of(text: &str, name: &str) -> String {
    text.lines()
        .find(|l| l.split_whitespace().nth(1) == Some(name))
        .unwrap_or_else(|| panic!("no {name} line in:\n{text}"))
        .to_string()
}
