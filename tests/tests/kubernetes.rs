//! Kubernetes for real: a one-node cluster (tests/k8s/cluster.sh: etcd, kube-apiserver,
//! controller-manager, scheduler, containerd, kubelet, all on 127.0.0.1, state in one temp
//! directory) runs the shipped manifests (`kubectl apply -k` of tests/k8s/loop over
//! packaging/kubernetes: the loop backend in mode `all` with the controller sidecars), with the
//! agent's image built from the agent as it ships (tests/k8s/images.sh; `cargo build -p
//! ebs-node-agent` with no features, copied to target/k8s by tests/run.sh; never a test-hooks
//! build, since the image carries the release image's name). Then the shipped ebs-mode
//! DaemonSet against a local instance-metadata emulator, and the upstream chart's node DaemonSet through packaging/kubernetes/upstream-chart. The scenarios
//! share the cluster and run in order, each with its own pass/fail; a failure skips the rest, and
//! the cluster is torn down in any case (Drop). Own harness (harness = false in Cargo.toml).
//!
//! The binaries are `$K8S_TOOLS`, `shared/tools/k8s` beside the checkout or above it, or
//! target/tools/k8s (tests/k8s/fetch-tools.sh). Without them (or root, the host programs, a
//! fresh agent build) every scenario is reported skipped, with the reason, through
//! ebs_tests::skip and a `test result` line; under CI=true each fails instead.

use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use ebs_tests::k8s::{Cluster, find_tools, missing_host_programs, now};

#[path = "kubernetes/ebs_mode.rs"]
mod ebs_mode;
#[path = "kubernetes/lifecycle.rs"]
mod lifecycle;
#[path = "kubernetes/observe.rs"]
mod observe;
#[path = "kubernetes/restarts.rs"]
mod restarts;
#[path = "kubernetes/scenarios.rs"]
mod scenarios;

pub struct Ctx {
    pub cluster: Cluster,
    /// The agent binary (no features, no test hooks) the image is built from.
    pub agent: PathBuf,
    /// Measured figures, printed at the end.
    pub figures: Vec<String>,
    /// The instance-metadata emulator of the ebs-mode scenarios, and the runtime it runs on.
    pub imds: Option<ebs_tests::imds::Imds>,
    pub rt: tokio::runtime::Runtime,
    /// The first pod's volume directory under kubelet's pods/ (vol_data.json and the target),
    /// which must be gone once the pod is.
    pub publish_dir: Option<PathBuf>,
}

type Scenario = fn(&mut Ctx) -> Result<(), String>;

const SCENARIOS: &[(&str, Scenario)] = &[
    ("k8s_cluster_up_and_images", cluster_up),
    ("k8s_registration", scenarios::registration),
    (
        "k8s_pvc_pod_writes_on_a_real_filesystem",
        scenarios::pvc_pod_data,
    ),
    (
        "k8s_pod_deletion_leaves_nothing_mounted",
        scenarios::pod_deletion,
    ),
    ("k8s_second_pod_sees_the_data", scenarios::second_pod),
    (
        "k8s_kubelet_restart_no_duplicate_mounts",
        restarts::kubelet_restart,
    ),
    ("k8s_agent_restart_while_published", restarts::agent_restart),
    ("k8s_read_only_claim", scenarios::read_only),
    (
        "k8s_pvc_deletion_removes_the_volume",
        scenarios::pvc_deletion,
    ),
    ("k8s_block_mode", scenarios::block_mode),
    (
        "k8s_read_write_once_pod_access_mode",
        lifecycle::read_write_once_pod,
    ),
    (
        "k8s_node_reboot_keeps_the_filesystem",
        lifecycle::node_reboot,
    ),
    ("k8s_expansion_online_xfs", lifecycle::expand_online_xfs),
    ("k8s_expansion_offline_ext4", lifecycle::expand_offline_ext4),
    ("k8s_fs_group", lifecycle::fs_group),
    ("k8s_agent_memory", lifecycle::agent_memory),
    (
        "k8s_ebs_mode_shipped_daemonset_registers",
        ebs_mode::shipped_ebs_mode,
    ),
    (
        "k8s_registration_after_node_get_info_failed",
        ebs_mode::registration_after_identity,
    ),
    ("k8s_upstream_chart_registers", ebs_mode::upstream_chart),
];

fn cluster_up(ctx: &mut Ctx) -> Result<(), String> {
    let c = &ctx.cluster;
    let t = Instant::now();
    c.script("cluster.sh", Some("up"), &[], Duration::from_secs(240))?;
    ctx.figures.push(format!(
        "cluster start to a Ready node: {:.1} s",
        t.elapsed().as_secs_f64()
    ));
    let t = Instant::now();
    let agent = ctx.agent.to_string_lossy().into_owned();
    c.script("images.sh", None, &[&agent], Duration::from_secs(900))?;
    ctx.figures.push(format!(
        "images built and loaded: {:.1} s",
        t.elapsed().as_secs_f64()
    ));
    c.script("overlay.sh", None, &[], Duration::from_secs(60))?;
    let deploy = c.dir.join("deploy").to_string_lossy().into_owned();
    let applied = now();
    c.kubectl(&["apply", "-k", &deploy])?;
    std::fs::write(c.dir.join("applied-at"), applied.to_string()).map_err(|e| e.to_string())?;
    Ok(())
}

/// The newest modification time of the files below `dir` (None: nothing there).
fn newest(dir: &Path) -> Option<std::time::SystemTime> {
    let mut best = None;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let Ok(m) = e.metadata() else { continue };
            if m.is_dir() {
                stack.push(e.path());
            } else if let Ok(t) = m.modified() {
                best = best.max(Some(t));
            }
        }
    }
    best
}

/// The agent the image is built from (`$EBS_K8S_AGENT_BIN`, or target/k8s/ebs-node-agent: the
/// no-feature build tests/run.sh copies there), not older than the sources it is built from.
fn image_agent() -> Result<PathBuf, String> {
    let build = "tests/run.sh (or: cargo build --locked -p ebs-node-agent --bin ebs-node-agent \
                 && cp target/debug/ebs-node-agent target/k8s/)";
    let bin = match std::env::var_os("EBS_K8S_AGENT_BIN") {
        Some(p) => PathBuf::from(p),
        None => {
            // target/debug/deps/<this test> → target
            let exe = std::env::current_exe().map_err(|e| e.to_string())?;
            let target = exe.ancestors().nth(3).ok_or("no target directory")?;
            target.join("k8s/ebs-node-agent")
        }
    };
    let built = std::fs::metadata(&bin)
        .and_then(|m| m.modified())
        .map_err(|e| {
            format!(
                "{}: {e}: the agent's image is built from a no-feature build: {build}",
                bin.display()
            )
        })?;
    let repo = ebs_tests::k8s::repo_root();
    let sources = ["agent", "store", "proto", "Cargo.lock", "Cargo.toml"]
        .iter()
        .filter_map(|p| {
            let p = repo.join(p);
            if p.is_dir() {
                newest(&p)
            } else {
                p.metadata().and_then(|m| m.modified()).ok()
            }
        })
        .max();
    if sources.is_some_and(|s| s > built) {
        return Err(format!(
            "{} is older than its sources: {build}",
            bin.display()
        ));
    }
    Ok(bin)
}

/// What the teardown left: a process it started, a mount or loop device under `dir` (or one of
/// the agent's, seen before), or `dir` itself.
fn left_behind(dir: &Path, pids: &[(String, u32)], agent_loops: &[PathBuf]) -> Vec<String> {
    let mut left = Vec::new();
    let d = dir.to_string_lossy();
    for (name, pid) in pids {
        // Still ours: every program cluster.sh starts names its directory in its arguments (a
        // PID reused since runs something else).
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains(d.as_ref()) {
            left.push(format!("process {name} ({pid}) still runs"));
        }
    }
    for (target, _, source) in Cluster::mounts_under(dir) {
        left.push(format!("mount {} ({source})", target.display()));
    }
    for name in ebs_tests::k8s::loops_named_under(dir) {
        left.push(format!("loop device {name} backed under {}", dir.display()));
    }
    let attached = std::process::Command::new("timeout")
        .args(["10", "losetup", "-l", "-n", "-O", "NAME"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    for l in agent_loops {
        if attached.lines().any(|a| Path::new(a.trim()) == l) {
            left.push(format!(
                "the agent's loop device {} is still attached",
                l.display()
            ));
        }
    }
    if dir.exists() {
        left.push(format!("{} still exists", dir.display()));
    }
    left
}

/// libtest's arguments as far as they matter here: `--list`, `--ignored`, and name filters.
struct Args {
    list: bool,
    ignored: bool,
    filters: Vec<String>,
}

fn args() -> Args {
    let mut a = Args {
        list: false,
        ignored: false,
        filters: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--list" => a.list = true,
            "--ignored" => a.ignored = true,
            "--test-threads" | "--skip" | "--color" | "--format" | "--logfile" | "-Z" => {
                it.next();
            }
            s if s.starts_with('-') => {}
            s => a.filters.push(s.to_string()),
        }
    }
    a
}

/// Every test of the tier, in order: the scenarios, then the teardown's check.
fn names() -> impl Iterator<Item = &'static str> {
    SCENARIOS
        .iter()
        .map(|(name, _)| *name)
        .chain(std::iter::once("k8s_teardown_leaves_nothing"))
}

/// The tier cannot run here (`reason`): every selected test is reported as libtest reports one,
/// so the run's summary counts them. Outside CI each is a skip ("ok", and a line through
/// ebs_tests::skip, which tests/run.sh lists with the reason); under CI=true nothing may skip,
/// so each fails with the reason.
fn not_run(args: &Args, reason: &str) -> ExitCode {
    let ci = ebs_tests::is_ci();
    let selected: Vec<&str> = names()
        .filter(|n| args.filters.is_empty() || args.filters.iter().any(|f| n.contains(f.as_str())))
        .collect();
    println!("\nrunning {} tests", selected.len());
    for name in &selected {
        if ci {
            println!("test {name} ... FAILED");
        } else {
            ebs_tests::skip(&format!("kubernetes::{name}"), reason);
            println!("test {name} ... ok");
        }
    }
    let n = selected.len();
    if ci {
        eprintln!("\n---- kubernetes ----\n{reason}; CI=true: refusing to skip");
        println!(
            "\ntest result: FAILED. 0 passed; {n} failed; 0 ignored; 0 measured; 0 filtered out\n"
        );
        ExitCode::FAILURE
    } else {
        println!(
            "\ntest result: ok. {n} passed; 0 failed; 0 ignored; 0 measured; 0 filtered out\n"
        );
        ExitCode::SUCCESS
    }
}

fn main() -> ExitCode {
    let args = args();
    if args.list {
        for name in names() {
            println!("{name}: test");
        }
        return ExitCode::SUCCESS;
    }
    let selected = args.filters.is_empty()
        || args
            .filters
            .iter()
            .any(|f| SCENARIOS.iter().any(|(n, _)| n.contains(f.as_str())));
    if args.ignored || !selected {
        println!("\nrunning 0 tests\n\ntest result: ok. 0 passed; 0 failed\n");
        return ExitCode::SUCCESS;
    }
    if !ebs_tests::is_root() {
        return not_run(&args, "needs root");
    }
    let tools = match find_tools() {
        Ok(t) => t,
        Err(e) => return not_run(&args, &e),
    };
    let missing = missing_host_programs();
    if !missing.is_empty() {
        let e = format!("missing {} (run tests/deps.sh)", missing.join(", "));
        return not_run(&args, &e);
    }
    let agent = match image_agent() {
        Ok(a) => a,
        Err(e) => return not_run(&args, &e),
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => panic!("kubernetes: a tokio runtime for the IMDS emulator: {e}"),
    };
    println!("\nrunning {} tests", SCENARIOS.len() + 1);
    let started = Instant::now();
    let mut ctx = Ctx {
        cluster: Cluster::new(&tools),
        agent,
        figures: Vec::new(),
        imds: None,
        rt,
        publish_dir: None,
    };
    let (mut passed, mut failed, mut skipped) = (0, Vec::new(), 0);
    for (name, run) in SCENARIOS {
        if !failed.is_empty() {
            println!("test {name} ... ignored (an earlier scenario failed)");
            skipped += 1;
            continue;
        }
        let t = Instant::now();
        let result =
            std::panic::catch_unwind(AssertUnwindSafe(|| run(&mut ctx))).unwrap_or_else(|p| {
                Err(p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "panicked".into()))
            });
        match result {
            Ok(()) => {
                println!("test {name} ... ok ({:.1} s)", t.elapsed().as_secs_f64());
                passed += 1;
            }
            Err(e) => {
                println!(
                    "test {name} ... FAILED ({:.1} s)",
                    t.elapsed().as_secs_f64()
                );
                eprintln!("---- {name} ----\n{e}");
                ctx.cluster.diagnostics();
                failed.push(*name);
            }
        }
    }
    let figures = std::mem::take(&mut ctx.figures);
    // Teardown leaves nothing: what cluster.sh started, every mount and loop device under the
    // cluster's directory, the directory itself, and the agent's loop devices.
    let dir = ctx.cluster.dir.clone();
    let pids = ctx.cluster.pids();
    let agent_loops = ebs_tests::k8s::loops_backed_by(&dir);
    drop(ctx);
    let left = left_behind(&dir, &pids, &agent_loops);
    if left.is_empty() {
        println!("test k8s_teardown_leaves_nothing ... ok");
        passed += 1;
    } else {
        println!("test k8s_teardown_leaves_nothing ... FAILED");
        eprintln!("---- k8s_teardown_leaves_nothing ----\n{}", left.join("\n"));
        failed.push("k8s_teardown_leaves_nothing");
    }
    println!("\nfigures:");
    for f in &figures {
        println!("  {f}");
    }
    println!(
        "  the tier's wall time, teardown included: {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let verdict = if failed.is_empty() { "ok" } else { "FAILED" };
    println!(
        "\ntest result: {verdict}. {passed} passed; {} failed; {skipped} ignored\n",
        failed.len()
    );
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
