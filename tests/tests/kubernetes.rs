//! Kubernetes for real: a one-node cluster (tests/k8s/cluster.sh: etcd, kube-apiserver,
//! controller-manager, scheduler, containerd, kubelet, all on 127.0.0.1, state in one temp
//! directory) runs the shipped manifests (`kubectl apply -k` of tests/k8s/loop over
//! packaging/kubernetes: the loop backend in mode `all` with the controller sidecars), with the
//! agent's image built from the built binary (tests/k8s/images.sh). The scenarios share the
//! cluster and run in order, each with its own pass/fail; a failure skips the rest, and the
//! cluster is torn down in any case (Drop). Own harness (harness = false in Cargo.toml).
//!
//! The binaries are `$K8S_TOOLS` or `shared/tools/k8s` beside the checkout or above it; outside
//! CI the test skips without them, under CI=true it fails.

use std::panic::AssertUnwindSafe;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use ebs_tests::k8s::{Cluster, find_tools, missing_host_programs, now};

#[path = "kubernetes/scenarios.rs"]
mod scenarios;

pub struct Ctx {
    pub cluster: Cluster,
    /// Measured figures, printed at the end.
    pub figures: Vec<String>,
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
        scenarios::kubelet_restart,
    ),
    (
        "k8s_agent_restart_while_published",
        scenarios::agent_restart,
    ),
    ("k8s_read_only_claim", scenarios::read_only),
    (
        "k8s_pvc_deletion_removes_the_volume",
        scenarios::pvc_deletion,
    ),
    ("k8s_block_mode", scenarios::block_mode),
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
    let agent = ebs_tests::agent_bin();
    let agent = agent.to_string_lossy().into_owned();
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

fn main() -> ExitCode {
    let args = args();
    if args.list {
        for (name, _) in SCENARIOS {
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
    if !ebs_tests::require_root("kubernetes") {
        return ExitCode::SUCCESS;
    }
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    let tools = match find_tools() {
        Ok(t) => t,
        Err(e) if ci => panic!("kubernetes: {e}; CI=true: refusing to skip"),
        Err(e) => {
            eprintln!("skipping kubernetes: {e}");
            return ExitCode::SUCCESS;
        }
    };
    let missing = missing_host_programs();
    if !missing.is_empty() {
        let e = format!("missing {} (run tests/deps.sh)", missing.join(", "));
        if ci {
            panic!("kubernetes: {e}; CI=true: refusing to skip");
        }
        eprintln!("skipping kubernetes: {e}");
        return ExitCode::SUCCESS;
    }
    println!("\nrunning {} tests", SCENARIOS.len());
    let started = Instant::now();
    let mut ctx = Ctx {
        cluster: Cluster::new(&tools),
        figures: Vec::new(),
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
    drop(ctx);
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
