//! A short run of `ebs-node-agent client bench`, so the harness behind the published figures
//! cannot rot: every section of its JSON is present, no call fails, and it cleans up after itself.
//! No timing is asserted here; figures come from real bench runs (docs/performance.md).

use ebs_tests::*;

#[tokio::test]
async fn bench_smoke_run() {
    if !require_root("bench_smoke_run") {
        return;
    }
    let scratch = Scratch::new("bench");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let work_dir = agent.work.join("bench");
    let pid = agent.pid().to_string();
    let (ok, v) = agent.client_json(&[
        "bench",
        "--volumes",
        "3",
        "--concurrency",
        "2",
        "--size",
        "64MiB",
        "--pid",
        &pid,
        "--work-dir",
        work_dir.to_str().unwrap(),
        "--restart-check",
        "--restart-volumes",
        "3",
        "--restart-rounds",
        "1",
        "--grpc-floor",
        "--floor-checks",
    ]);
    assert!(ok, "bench failed: {v:#}\nagent log:\n{}", agent.log_text());
    // Both floors made the host's checks of one owner per device, two a stage.
    assert_eq!(v["config"]["floor_checks"], true);
    assert_eq!(v["floor"]["phases"]["checks"]["count"], 6, "{}", v["floor"]);
    assert_eq!(
        v["floor"]["phases"]["checks"]["errors"], 0,
        "{}",
        v["floor"]
    );

    for rpc in [
        "NodeStageVolume",
        "NodePublishVolume",
        "NodeUnpublishVolume",
        "NodeUnstageVolume",
    ] {
        let r = &v["rpcs"][rpc];
        assert_eq!(r["count"], 3, "{rpc}: {r}");
        assert_eq!(r["errors"], 0, "{rpc}: {r}");
        for key in ["p50_ms", "p95_ms", "p99_ms", "max_ms", "throughput_per_s"] {
            assert!(r[key].is_number(), "{rpc}.{key} missing: {r}");
        }
        assert!(
            v["ratios"][rpc]["p50_ratio"].is_number(),
            "ratio of {rpc}: {v}"
        );
    }
    assert_eq!(v["rpcs"]["Probe"]["errors"], 0);
    assert_eq!(v["errors"], 0);
    assert_eq!(v["floor"]["errors"], 0, "floor: {}", v["floor"]);
    assert!(v["ratios"]["wall"].is_number());
    // The gRPC floor ran the same cycle through its own server, which is gone again.
    let g = &v["grpc_floor"];
    assert_eq!(g["errors"], 0, "gRPC floor: {g}");
    for rpc in ["NodeStageVolume", "NodePublishVolume", "NodeUnstageVolume"] {
        assert_eq!(g["rpcs"][rpc]["count"], 3, "gRPC floor {rpc}: {g}");
    }
    assert!(g["ratios"]["agent_wall"].is_number(), "{g}");
    assert!(g["cpu_per_cycle_ms"]["server"].is_number(), "{g}");
    let servers = processes_naming(&["ebs-bench-grpc-floor", work_dir.to_str().unwrap()]);
    assert!(
        servers.is_empty(),
        "the gRPC floor's server outlived the bench: {servers:?}"
    );
    assert!(v["memory"]["idle_kib"].as_u64().unwrap() > 0);
    assert!(v["memory"]["peak_kib"].as_u64().unwrap() > 0);
    for key in ["agent", "agent_tools", "client", "floor", "floor_tools"] {
        assert!(
            v["cpu_per_cycle_ms"][key].is_number(),
            "cpu_per_cycle_ms.{key}: {}",
            v["cpu_per_cycle_ms"]
        );
    }
    assert_eq!(v["restart"]["volumes"], 3);
    assert!(v["restart"]["median_ms"].as_f64().unwrap() > 0.0);
    assert_eq!(v["restart"]["cleanup_problems"], serde_json::json!([]));
    assert_eq!(v["cleanup_problems"], serde_json::json!([]));
    assert_eq!(v["targets"].as_array().unwrap().len(), 8);

    // Nothing left: no mounts or directories under the work dir, no volumes in the agent.
    assert!(
        mounts_below(&work_dir).is_empty(),
        "mounts left below {}",
        work_dir.display()
    );
    let leftovers: Vec<_> = std::fs::read_dir(&work_dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(leftovers.is_empty(), "left behind: {leftovers:?}");
    let (ok, list) = agent.client_json(&["controller", "list-volumes"]);
    assert!(ok);
    assert_eq!(
        list["entries"],
        serde_json::json!([]),
        "volumes left: {list}"
    );
}

/// Ctrl-C at any moment of a bench: no new call starts, those in flight end, then everything is
/// undone. Interrupted twice here: at the first mount (the warm-up) and once the gRPC floor's
/// server runs (a round's floors); each time nothing may be left.
#[tokio::test]
async fn bench_interrupted_leaves_nothing() {
    if !require_root("bench_interrupted_leaves_nothing") {
        return;
    }
    let scratch = Scratch::new("bench-interrupt");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let work_dir = agent.work.join("bench");
    let dir = work_dir.to_str().unwrap().to_string();
    let server_runs = || !processes_naming(&["ebs-bench-grpc-floor", &dir]).is_empty();
    let first_mount = || !mounts_below(&work_dir).is_empty();
    for (moment, reached) in [
        ("the first mount", &first_mount as &dyn Fn() -> bool),
        ("the gRPC floor", &server_runs),
    ] {
        let child = std::process::Command::new(agent_bin())
            .args(["client", "--endpoint", &agent.endpoint(), "--json", "bench"])
            .args(["--volumes", "8", "--concurrency", "4", "--size", "64MiB"])
            .args(["--rounds", "50", "--grpc-floor", "--work-dir", &dir])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("bench");
        let mut bench = KillOnDrop(Some(child));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while !reached() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        assert!(reached(), "the bench never reached {moment}");
        let child = bench.0.as_mut().unwrap();
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            assert!(
                std::time::Instant::now() < deadline + std::time::Duration::from_secs(120),
                "the bench did not end after an interrupt at {moment}"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        let mut stderr = String::new();
        if let Some(mut e) = child.stderr.take() {
            std::io::Read::read_to_string(&mut e, &mut stderr).unwrap();
        }
        bench.0 = None;
        assert!(!status.success(), "at {moment}: {stderr}");
        assert!(stderr.contains("interrupted"), "at {moment}: {stderr}");
        assert!(
            mounts_below(&work_dir).is_empty(),
            "mounts left after an interrupt at {moment}: {:?}",
            mounts_below(&work_dir)
        );
        assert!(
            !server_runs(),
            "the gRPC floor outlived an interrupt at {moment}"
        );
        let loops = loops_below(&agent.state_dir);
        assert!(loops.is_empty(), "loop devices left at {moment}: {loops:?}");
        let (ok, list) = agent.client_json(&["controller", "list-volumes"]);
        assert!(ok);
        assert_eq!(
            list["entries"],
            serde_json::json!([]),
            "volumes left after an interrupt at {moment}: {list}"
        );
    }
}

/// A bench process killed if the test fails before it ends.
struct KillOnDrop(Option<std::process::Child>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The pids whose command line holds every one of `words`.
fn processes_naming(words: &[&str]) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline);
            words.iter().all(|w| cmdline.contains(w))
        })
        .collect()
}

/// A work dir the agent would refuse (outside its allowed prefixes, or inside its state
/// directory) stops the bench before it creates anything, with the prefixes named.
#[tokio::test]
async fn bench_checks_its_work_dir_before_creating_anything() {
    if !require_root("bench_checks_its_work_dir_before_creating_anything") {
        return;
    }
    let scratch = Scratch::new("bench-workdir");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    for (work_dir, expected) in [
        (
            scratch.join("elsewhere/bench"),
            "outside the agent's allowed path prefixes",
        ),
        (
            agent.state_dir.join("bench"),
            "inside the agent's state directory",
        ),
    ] {
        let out = std::process::Command::new(agent_bin())
            .args(["client", "--endpoint", &agent.endpoint(), "bench"])
            .args([
                "--volumes",
                "2",
                "--size",
                "64MiB",
                "--no-floor",
                "--work-dir",
            ])
            .arg(&work_dir)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "bench must refuse {}",
            work_dir.display()
        );
        assert!(stderr.contains(expected), "{stderr}");
        assert!(
            stderr.contains(&agent.work.display().to_string()),
            "the allowed prefixes are named: {stderr}"
        );
        assert!(
            !work_dir.exists(),
            "nothing created at {}",
            work_dir.display()
        );
    }
    let (ok, list) = agent.client_json(&["controller", "list-volumes"]);
    assert!(ok);
    assert_eq!(
        list["entries"],
        serde_json::json!([]),
        "no volume created: {list}"
    );
}
