//! `ebs-node-agent client bench`: create N volumes through CSI, run the node cycle (stage,
//! publish, stats, unpublish, unstage) at concurrency C with every RPC timed, do the same host
//! work directly (the floor) on the same devices, probe the agent meanwhile, read its memory, and
//! optionally time a restart with many journaled volumes. Every figure is quoted against the
//! floor of the same run, so the ratios mean the same on any machine.

mod cpu;
mod cycle;
mod floor;
pub mod grpc_floor;
mod host_mounts;
mod interrupt;
mod probe;
mod report;
mod restart;
mod round;
mod rss;
mod stats;
mod workdir;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Args;

use self::cycle::{BenchVolume, Csi};
use self::interrupt::{INTERRUPTED, Interrupts, interrupted, until};
use self::report::{MemoryReport, Report};
use super::{ClientArgs, parse_size};
use ebs_node_core::config::parse_duration;
use ebs_node_core::request::FsType;

#[derive(Args, Debug, Clone)]
// A later flag wins, so that wrapper scripts can pass defaults and callers override them.
#[command(args_override_self = true)]
pub struct BenchArgs {
    /// How many volumes to create and cycle.
    #[arg(long, default_value_t = 16)]
    pub volumes: usize,
    /// How many volumes are in their cycle at once.
    #[arg(long, default_value_t = 4)]
    pub concurrency: usize,
    /// The agent's pid, to read its idle and peak memory from /proc.
    #[arg(long)]
    pub pid: Option<u32>,
    /// Size of each volume.
    #[arg(long, default_value = "1GiB", value_parser = parse_size)]
    pub size: u64,
    /// Filesystem of the bench's volumes (ext4, xfs).
    #[arg(long, default_value = "ext4")]
    pub fs_type: String,
    /// Where staging and target paths are made: must lie below one of the agent's allowed path
    /// prefixes and outside its state directory (checked with the agent before anything is
    /// created). The default lies below the quick start's prefix, /mnt/ebs-node-agent.
    #[arg(long, default_value = "/mnt/ebs-node-agent/bench")]
    pub work_dir: PathBuf,
    /// The node id for ControllerPublishVolume (default: what NodeGetInfo answers).
    #[arg(long)]
    pub node_id: Option<String>,
    /// Skip the floor (it needs root and the devices on this host).
    #[arg(long)]
    pub no_floor: bool,
    /// Also run the gRPC floor in each round: the floor's host work behind a bare tonic CSI
    /// server of its own, called like the agent. What the agent spends beyond it is its own
    /// logic; what it spends beyond the bare floor is the protocol's.
    #[arg(long)]
    pub grpc_floor: bool,
    /// Give both floors the host checks one owner per device needs (issue 49), as the agent's
    /// filesystem stage makes them, before its mount and after: what uses the device raw in
    /// every mount namespace, and every other device showing its bytes. Against floors that
    /// make them, the agent's figures are its own logic alone.
    #[arg(long)]
    pub floor_checks: bool,
    /// Run the measured cycle and the floor this many times, alternating, and pool the samples:
    /// a neighbour's load then weighs on both sides alike.
    #[arg(long, default_value_t = 1)]
    pub rounds: usize,
    /// How often the background Probe is called during the cycle.
    #[arg(long, default_value = "10ms", value_parser = parse_duration)]
    pub probe_interval: Duration,
    /// Also time restart-to-ready of a fresh agent (this binary, or --agent-bin) holding
    /// --restart-volumes staged and published volumes.
    #[arg(long)]
    pub restart_check: bool,
    /// How many volumes the restarted agent holds (--restart-check).
    #[arg(long, default_value_t = 128)]
    pub restart_volumes: usize,
    /// How many kill -9 / restart rounds; the median is reported.
    #[arg(long, default_value_t = 3)]
    pub restart_rounds: usize,
    /// The agent binary for --restart-check (default: this executable).
    #[arg(long)]
    pub agent_bin: Option<PathBuf>,
    /// Add this many tmpfs mounts to the host before the run (removed after it): a dense node,
    /// whose pods' secret and token mounts make the mount table thousands of lines long.
    #[arg(long, default_value_t = 0)]
    pub host_mounts: usize,
}

/// Runs the bench and prints its report; returns the exit code (1 when any call failed).
pub async fn main(b: &BenchArgs, args: &ClientArgs) -> i32 {
    let report = run(b, args, interrupted()).await;
    match report {
        Ok(report) => {
            if args.json {
                println!("{}", report.to_json());
            } else {
                print!("{}", report.to_table());
            }
            i32::from(!report.clean())
        }
        Err(e) => {
            eprintln!("error: bench: {e}");
            1
        }
    }
}

/// The volumes the run has touched, kept outside the measured future so that clean-up finds them
/// after an error or Ctrl-C.
type Registry = Arc<Mutex<Vec<BenchVolume>>>;

async fn run(b: &BenchArgs, args: &ClientArgs, interrupts: Interrupts) -> Result<Report, String> {
    if b.volumes == 0 || b.concurrency == 0 {
        return Err("--volumes and --concurrency must be at least 1".into());
    }
    let fs = FsType::parse(&b.fs_type).map_err(|e| e.to_string())?;
    let channel = super::connect::channel(&args.endpoint)
        .await
        .map_err(|e| e.to_string())?;
    let agent_paths = workdir::ask(channel.clone()).await?;
    // Before anything is created: a work dir the agent would refuse fails here, not at the
    // first NodeStage after every volume was created and attached.
    workdir::check(&b.work_dir, agent_paths.as_ref())?;
    let _host_mounts = match b.host_mounts {
        0 => None,
        n => Some(host_mounts::HostMounts::add(&b.work_dir, n)?),
    };
    let csi = Csi::new(channel, args.timeout);
    let node_id = match &b.node_id {
        Some(n) => n.clone(),
        None => {
            csi.node
                .clone()
                .node_get_info(ebs_proto::csi::v1::NodeGetInfoRequest {})
                .await
                .map_err(|s| format!("NodeGetInfo: {}", s.message()))?
                .into_inner()
                .node_id
        }
    };
    let with_stats = cycle::offers_stats(&csi)
        .await
        .map_err(|s| format!("NodeGetCapabilities: {}", s.message()))?;

    let run_dir = b.work_dir.join(format!("run-{}", std::process::id()));
    let registry: Registry = Arc::new(Mutex::new(
        (0..b.volumes)
            .map(|i| BenchVolume {
                name: format!("bench-{}-{i}", std::process::id()),
                staging: run_dir.join(format!("{i}/stage")),
                target: run_dir.join(format!("{i}/target")),
                ..Default::default()
            })
            .collect(),
    ));
    let mut report = Report::new(b, with_stats);
    report.endpoint = args.endpoint.clone();
    report.memory = b.pid.and_then(rss::read).map(|m| MemoryReport {
        idle_kib: m.rss_kib,
        idle_anon_kib: m.anon_kib,
        ..Default::default()
    });

    let grpc = grpc_floor::Rounds::default();
    let grpc_busy = grpc.busy();
    let outcome = tokio::select! {
        r = measure(b, &csi, fs, &node_id, &registry, &mut report, grpc) => r,
        _ = until(interrupts.second.clone()) => Err(INTERRUPTED.to_string()),
    };
    let volumes = registry.lock().map(|v| v.clone()).unwrap_or_default();
    if grpc_busy.load(std::sync::atomic::Ordering::SeqCst) {
        // Interrupted in the gRPC floor's cycle: its server is gone (dropped with `measure`),
        // its mounts at the volumes' paths are not the agent's to undo.
        grpc_floor::undo(&volumes);
    }
    report.cleanup_problems = cycle::cleanup(&csi, &volumes, &node_id, b.concurrency).await;
    remove_if_unmounted(&run_dir, &mut report.cleanup_problems);
    outcome?;
    // A Ctrl-C in the last phase ended it early without an error: its figures are partial.
    if interrupt::stopping() {
        return Err(INTERRUPTED.into());
    }

    if b.restart_check {
        let bin = match &b.agent_bin {
            Some(p) => p.clone(),
            None => std::env::current_exe().map_err(|e| format!("own executable: {e}"))?,
        };
        let dir = b.work_dir.join(format!("restart-{}", std::process::id()));
        let plan = restart::Plan {
            bin,
            dir,
            volumes: b.restart_volumes,
            rounds: b.restart_rounds.max(1),
            concurrency: b.concurrency,
            fs_type: b.fs_type.clone(),
            timeout: args.timeout,
        };
        // Its scratch agent and volumes are undone when the future is dropped (restart::Scratch).
        report.restart = Some(tokio::select! {
            r = restart::run(&plan) => r?,
            _ = until(interrupts.first) => return Err(INTERRUPTED.to_string()),
        });
    }
    Ok(report)
}

/// Set-up, warm-up, the measured cycle and the floor. Records progress in `registry`.
async fn measure(
    b: &BenchArgs,
    csi: &Csi,
    fs: FsType,
    node_id: &str,
    registry: &Registry,
    report: &mut Report,
    mut grpc: grpc_floor::Rounds,
) -> Result<(), String> {
    let fs_name = fs.name();
    // Create and attach: not measured.
    let errors = {
        let (csi, reg, node_id) = (csi.clone(), Arc::clone(registry), node_id.to_string());
        let size = b.size;
        cycle::par(b.volumes, b.concurrency, move |i| {
            let (csi, reg, node_id) = (csi.clone(), Arc::clone(&reg), node_id.clone());
            async move {
                let mut v = reg
                    .lock()
                    .map(|r| r[i].clone())
                    .map_err(|e| e.to_string())?;
                std::fs::create_dir_all(&v.staging).map_err(|e| format!("mkdir: {e}"))?;
                cycle::create(&csi, &mut v, size, fs_name)
                    .await
                    .map_err(|s| format!("CreateVolume: {}", s.message()))?;
                // Marked before the call: a call cut short may still have attached it.
                v.publish_context = Some(Default::default());
                set(&reg, i, &v);
                cycle::controller_publish(&csi, &mut v, &node_id, fs_name)
                    .await
                    .map_err(|s| format!("ControllerPublishVolume: {}", s.message()))?;
                set(&reg, i, &v);
                Ok::<_, String>(())
            }
        })
        .await
    };
    for e in errors {
        e.unwrap_or_else(|| Err(INTERRUPTED.into()))?;
    }

    // Warm-up: the first stage formats; the measured cycle stages already-formatted volumes.
    let snapshot = || registry.lock().map(|v| v.clone()).unwrap_or_default();
    let warm = {
        let (csi, vols) = (csi.clone(), Arc::new(snapshot()));
        cycle::par(b.volumes, b.concurrency, move |i| {
            let (csi, vols) = (csi.clone(), Arc::clone(&vols));
            async move {
                let v = &vols[i];
                let t = std::time::Instant::now();
                cycle::stage(&csi, v, fs_name)
                    .await
                    .map_err(|s| format!("warm-up NodeStageVolume: {}", s.message()))?;
                let took = t.elapsed();
                let device = floor::device_mounted_at(&v.staging);
                cycle::unstage(&csi, v)
                    .await
                    .map_err(|s| format!("warm-up NodeUnstageVolume: {}", s.message()))?;
                Ok::<_, String>((took, device))
            }
        })
        .await
    };
    for (i, w) in warm.into_iter().enumerate() {
        let (took, device) = w.unwrap_or_else(|| Err(INTERRUPTED.into()))?;
        report.warmup.ok(took);
        if let Ok(mut reg) = registry.lock() {
            reg[i].device = device;
        }
    }
    let volumes = snapshot();

    // The measured cycle (Probe and memory sampled alongside), then the floor on the same
    // devices, still attached; alternating for each round.
    let sampler = b.pid.map(rss::Sampler::start);
    let plan = round::Plan {
        volumes: &volumes,
        fs_type: fs_name,
        concurrency: b.concurrency,
        with_stats: report.with_stats,
        probe_interval: b.probe_interval,
        timeout: csi.timeout,
        floor_checks: b.floor_checks,
    };
    for round in 0..b.rounds.max(1) {
        if interrupt::stopping() {
            return Err(INTERRUPTED.into());
        }
        let m = round::measure(csi, &report.endpoint, b.pid, &plan).await?;
        report.probe.merge(m.probe);
        report.agent.merge(m.cycle);
        report.cpu.cycles += volumes.len();
        cpu::add(&mut report.cpu.agent, m.server);
        cpu::add(&mut report.cpu.client, m.client);
        // The two floors take turns at going first, so that neither always inherits the other's
        // write-back. The gRPC floor needs what the floor needs (root, the devices).
        let grpc_first = round % 2 == 1;
        for grpc_now in [grpc_first, !grpc_first] {
            if interrupt::stopping() {
                return Err(INTERRUPTED.into());
            }
            if !grpc_now {
                let floor_cpu = cpu::read_self();
                if let Some(f) = floor_run(b, fs, &volumes, &mut report.notes).await {
                    report.floor.get_or_insert_with(Default::default).merge(f);
                    cpu::add_spent(&mut report.cpu.floor, floor_cpu, cpu::read_self());
                }
            } else if b.grpc_floor && report.floor.is_some() {
                let (total, notes) = (&mut report.grpc_floor, &mut report.notes);
                grpc.run(&plan, &b.work_dir, total, notes).await?;
            }
        }
    }
    drop(grpc);
    if b.grpc_floor && report.floor.is_none() {
        report
            .notes
            .push("gRPC floor skipped: it runs only where the floor does".into());
    }
    report.notes.dedup();
    if let (Some(s), Some(mem)) = (sampler, report.memory.as_mut()) {
        (mem.peak_kib, mem.peak_anon_kib) = s.finish();
        if let Some(m) = b.pid.and_then(rss::read) {
            mem.hwm_kib = m.hwm_kib;
            mem.after_kib = m.rss_kib;
            mem.after_anon_kib = m.anon_kib;
        }
    }
    Ok(())
}

async fn floor_run(
    b: &BenchArgs,
    fs: FsType,
    volumes: &[BenchVolume],
    notes: &mut Vec<String>,
) -> Option<floor::FloorResult> {
    if b.no_floor {
        notes.push("floor skipped (--no-floor)".into());
        return None;
    }
    if !nix::unistd::geteuid().is_root() {
        notes.push("floor skipped: it mounts, so it needs root".into());
        return None;
    }
    let Some(devices) = volumes
        .iter()
        .map(|v| {
            v.device.clone().map(|device| floor::FloorVolume {
                device,
                staging: v.staging.with_file_name("floor-stage"),
                target: v.staging.with_file_name("floor-target"),
            })
        })
        .collect::<Option<Vec<_>>>()
    else {
        notes.push(
            "floor skipped: a staged volume's device was not visible in this mount namespace"
                .into(),
        );
        return None;
    };
    for d in &devices {
        if let Err(e) = std::fs::create_dir_all(&d.staging) {
            notes.push(format!("floor skipped: mkdir {}: {e}", d.staging.display()));
            return None;
        }
    }
    let concurrency = b.concurrency;
    let checks = b.floor_checks;
    tokio::task::spawn_blocking(move || floor::run(&devices, concurrency, fs, checks))
        .await
        .ok()
}

fn set(reg: &Registry, i: usize, v: &BenchVolume) {
    if let Ok(mut r) = reg.lock() {
        r[i] = v.clone();
    }
}

/// Removes the run's directories, unless something is still mounted below them: removing files
/// through a live mount would delete the volume's contents.
fn remove_if_unmounted(dir: &Path, problems: &mut Vec<String>) {
    let mounted = ebs_node_host::mount::table::MountTable::read()
        .map(|t| t.entries().iter().any(|m| m.mount_point.starts_with(dir)))
        .unwrap_or(true);
    if mounted {
        problems.push(format!(
            "{} still has mounts below it; left in place",
            dir.display()
        ));
    } else if let Err(e) = std::fs::remove_dir_all(dir)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        problems.push(format!("removing {}: {e}", dir.display()));
    }
}
