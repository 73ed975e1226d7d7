//! The restart figure: a fresh agent on a scratch state directory gets N volumes created,
//! attached, staged and published (N journaled volumes, all of which start-up recovery must
//! reconcile with the mount table), is killed with SIGKILL, and is started again; the time from
//! spawn to the first `Probe` that answers ready is what a CO waits after a crash or an upgrade.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ebs_proto::csi::v1 as csi;

use super::cycle::{self, BenchVolume, Csi};
use super::rss;
use super::stats::ms;

pub struct Plan {
    pub bin: PathBuf,
    pub dir: PathBuf,
    pub volumes: usize,
    pub rounds: usize,
    pub concurrency: usize,
    pub fs_type: String,
    pub timeout: Duration,
}

#[derive(Debug, Clone, Default)]
pub struct RestartReport {
    pub volumes: usize,
    pub rounds_ms: Vec<f64>,
    /// VmRSS of the restarted agent once ready, holding every volume.
    pub rss_kib: Option<u64>,
    pub cleanup_problems: Vec<String>,
}

impl RestartReport {
    pub fn median_ms(&self) -> f64 {
        let mut r = self.rounds_ms.clone();
        r.sort_by(f64::total_cmp);
        r.get(r.len() / 2).copied().unwrap_or(0.0)
    }
}

const NODE_ID: &str = "bench-restart";
const VOLUME_BYTES: u64 = 16 << 20;

/// The scratch agent; on drop it is killed and everything below the directory is unmounted,
/// detached and removed, so a failed run leaves the host clean.
struct Scratch {
    dir: PathBuf,
    bin: PathBuf,
    child: Option<Child>,
}

impl Scratch {
    fn socket(&self) -> PathBuf {
        self.dir.join("csi.sock")
    }

    fn spawn(&mut self) -> Result<Instant, String> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("agent.log"))
            .map_err(|e| format!("agent log: {e}"))?;
        let err = log.try_clone().map_err(|e| e.to_string())?;
        let started = Instant::now();
        let child = Command::new(&self.bin)
            .arg("serve")
            .arg("--backend=loop")
            .arg(format!("--endpoint=unix://{}", self.socket().display()))
            .arg(format!("--state-dir={}", self.dir.join("state").display()))
            .arg(format!("--node-id={NODE_ID}"))
            // Mounts go below a directory of their own, never into the state directory.
            .arg(format!(
                "--allowed-path-prefix={}",
                self.dir.join("mounts").display()
            ))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("starting {}: {e}", self.bin.display()))?;
        self.child = Some(child);
        Ok(started)
    }

    fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Polls Probe on fresh connections until it answers ready; returns when it did.
    async fn wait_ready(&mut self, timeout: Duration) -> Result<Instant, String> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(Ok(Some(st))) = self.child.as_mut().map(Child::try_wait) {
                return Err(format!(
                    "the agent exited ({st}); see {}",
                    self.dir.join("agent.log").display()
                ));
            }
            if let Ok(ch) =
                crate::client::connect::channel(&self.socket().display().to_string()).await
            {
                let c = Csi::new(ch, timeout);
                if let Ok(r) = c.identity.clone().probe(csi::ProbeRequest {}).await
                    && r.into_inner().ready != Some(false)
                {
                    return Ok(Instant::now());
                }
            }
            if Instant::now() > deadline {
                return Err("the agent was not ready within 30 s".into());
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    async fn csi(&self, timeout: Duration) -> Result<Csi, String> {
        let ch = crate::client::connect::channel(&self.socket().display().to_string())
            .await
            .map_err(|e| e.to_string())?;
        Ok(Csi::new(ch, timeout))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        self.kill();
        scrub(&self.dir);
    }
}

/// Unmounts, detaches and removes whatever is left below `dir`.
fn scrub(dir: &Path) {
    if let Ok(table) = ebs_node_host::mount::table::MountTable::read() {
        for m in table.entries().iter().rev() {
            if m.mount_point.starts_with(dir) {
                let _ = rustix::mount::unmount(&m.mount_point, rustix::mount::UnmountFlags::DETACH);
            }
        }
    }
    if let Ok(entries) = std::fs::read_dir("/sys/block") {
        for e in entries.flatten() {
            let dev = Path::new("/dev").join(e.file_name());
            if let Ok(Some(file)) = ebs_node_host::loopdev::backing_file(&dev)
                && file.starts_with(dir)
            {
                let _ = ebs_node_host::loopdev::detach(&dev);
            }
        }
    }
    let still_mounted = ebs_node_host::mount::table::MountTable::read()
        .map(|t| t.entries().iter().any(|m| m.mount_point.starts_with(dir)))
        .unwrap_or(true);
    if !still_mounted {
        let _ = std::fs::remove_dir_all(dir);
    }
}

pub async fn run(plan: &Plan) -> Result<RestartReport, String> {
    scrub(&plan.dir);
    std::fs::create_dir_all(&plan.dir).map_err(|e| format!("mkdir {}: {e}", plan.dir.display()))?;
    let mut scratch = Scratch {
        dir: plan.dir.clone(),
        bin: plan.bin.clone(),
        child: None,
    };
    scratch.spawn()?;
    scratch.wait_ready(plan.timeout).await?;
    let c = scratch.csi(plan.timeout).await?;

    let volumes = populate(&c, plan).await?;
    let mut report = RestartReport {
        volumes: volumes.len(),
        ..Default::default()
    };
    for _ in 0..plan.rounds {
        scratch.kill();
        let spawned = scratch.spawn()?;
        let ready = scratch.wait_ready(plan.timeout).await?;
        report.rounds_ms.push(ms(ready - spawned));
    }
    report.rss_kib = scratch.pid().and_then(rss::read).map(|m| m.rss_kib);

    let c = scratch.csi(plan.timeout).await?;
    report.cleanup_problems = cycle::cleanup(&c, &volumes, NODE_ID, plan.concurrency).await;
    if let Some(pid) = scratch.pid() {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        if let Some(mut child) = scratch.child.take() {
            let _ = tokio::task::spawn_blocking(move || child.wait()).await;
        }
    }
    Ok(report)
}

/// Creates, attaches, stages and publishes the volumes; returns them for clean-up.
async fn populate(c: &Csi, plan: &Plan) -> Result<Vec<BenchVolume>, String> {
    let base = plan.dir.join("mounts/bench");
    let fs: Arc<str> = Arc::from(plan.fs_type.as_str());
    let (c2, base2) = (c.clone(), base.clone());
    let results = cycle::par_all(plan.volumes, plan.concurrency, move |i| {
        let (c, fs, base) = (c2.clone(), Arc::clone(&fs), base2.clone());
        async move {
            let mut v = BenchVolume {
                name: format!("restart-{i}"),
                staging: base.join(format!("{i}/stage")),
                target: base.join(format!("{i}/target")),
                ..Default::default()
            };
            let step = |what: &str, s: tonic::Status| format!("{what}: {}", s.message());
            std::fs::create_dir_all(&v.staging).map_err(|e| e.to_string())?;
            cycle::create(&c, &mut v, VOLUME_BYTES, &fs)
                .await
                .map_err(|s| step("CreateVolume", s))?;
            cycle::controller_publish(&c, &mut v, NODE_ID, &fs)
                .await
                .map_err(|s| step("ControllerPublishVolume", s))?;
            cycle::stage(&c, &v, &fs)
                .await
                .map_err(|s| step("NodeStageVolume", s))?;
            cycle::publish(&c, &v, &fs)
                .await
                .map_err(|s| step("NodePublishVolume", s))?;
            Ok::<_, String>(v)
        }
    })
    .await;
    results.into_iter().collect()
}
