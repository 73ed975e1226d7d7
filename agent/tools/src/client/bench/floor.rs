//! The floor: the same host work a stage/publish/unpublish/unstage cycle does, done directly with
//! the agent's own host modules: no agent, no gRPC, no journal. Every agent figure is quoted
//! against it, measured on the same devices in the same run.

use rustix::mount::{MountFlags, UnmountFlags};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use ebs_node_core::request::FsType;
use ebs_node_host::blkid;
use ebs_node_host::fstools::FsTools;

use super::stats::Series;

/// One device to cycle, with the directories the floor mounts it on.
#[derive(Debug, Clone)]
pub struct FloorVolume {
    pub device: PathBuf,
    pub staging: PathBuf,
    pub target: PathBuf,
}

/// Per-phase timings, and the per-volume sums that stand against each RPC.
#[derive(Debug, Default)]
pub struct FloorResult {
    pub probe: Series,
    pub check: Series,
    pub mount: Series,
    pub stats: Series,
    /// The checks of one owner per device (`--floor-checks`), each of the two a stage makes.
    pub checks: Series,
    /// (checks +) probe + check + mount: what NodeStageVolume does on an already-formatted volume.
    pub stage: Series,
    /// mkdir + bind: NodePublishVolume.
    pub publish: Series,
    /// unmount + rmdir: NodeUnpublishVolume.
    pub unpublish: Series,
    /// unmount: NodeUnstageVolume.
    pub unstage: Series,
    pub wall: Duration,
    pub first_error: Option<String>,
}

impl FloorResult {
    /// Pools another run's samples; wall times add up.
    pub fn merge(&mut self, o: FloorResult) {
        self.wall += o.wall;
        self.probe.merge(o.probe);
        self.check.merge(o.check);
        self.mount.merge(o.mount);
        self.stats.merge(o.stats);
        self.checks.merge(o.checks);
        self.stage.merge(o.stage);
        self.publish.merge(o.publish);
        self.unpublish.merge(o.unpublish);
        self.unstage.merge(o.unstage);
        if self.first_error.is_none() {
            self.first_error = o.first_error;
        }
    }

    pub fn errors(&self) -> usize {
        self.stage.errors()
            + self.publish.errors()
            + self.unpublish.errors()
            + self.unstage.errors()
            + self.stats.errors()
    }
}

/// Runs the floor cycle over `volumes` with `concurrency` threads.
pub fn run(volumes: &[FloorVolume], concurrency: usize, fs: FsType, checks: bool) -> FloorResult {
    let tools = FsTools::detect();
    let next = AtomicUsize::new(0);
    let total = Mutex::new(FloorResult::default());
    let started = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..concurrency.max(1) {
            s.spawn(|| {
                let mut mine = FloorResult::default();
                loop {
                    // Ctrl-C: the volume in its cycle ends it, no other starts.
                    if super::interrupt::stopping() {
                        break;
                    }
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(v) = volumes.get(i) else { break };
                    if let Err(e) = cycle(&tools, fs, checks, v, &mut mine) {
                        mine.first_error
                            .get_or_insert(format!("{}: {e}", v.device.display()));
                        undo(&v.staging, &v.target);
                    }
                }
                if let Ok(mut t) = total.lock() {
                    t.merge(mine);
                }
            });
        }
    });
    let mut result = total.into_inner().unwrap_or_default();
    result.wall = started.elapsed();
    result
}

/// Times one phase; a failure is counted in its series and ends the volume's cycle.
fn timed<T>(
    series: &mut Series,
    f: impl FnOnce() -> Result<T, String>,
) -> Result<(T, Duration), String> {
    let t = Instant::now();
    match f() {
        Ok(v) => {
            let d = t.elapsed();
            series.ok(d);
            Ok((v, d))
        }
        Err(e) => {
            series.err();
            Err(e)
        }
    }
}

fn cycle(
    tools: &FsTools,
    fs: FsType,
    checks: bool,
    v: &FloorVolume,
    r: &mut FloorResult,
) -> Result<(), String> {
    let dev = v.device.as_path();
    let owned = |series: &mut Series| match checks {
        true => timed(series, || owned(dev)).map(|(_, d)| d),
        false => Ok(Duration::ZERO),
    };
    let stage = (|| {
        let before = owned(&mut r.checks)?;
        let (_, a) = timed(&mut r.probe, || probe(dev))?;
        let (_, b) = timed(&mut r.check, || check(tools, fs, dev))?;
        let (_, c) = timed(&mut r.mount, || mount(fs, dev, &v.staging))?;
        let after = owned(&mut r.checks)?;
        Ok::<_, String>(before + a + b + c + after)
    })();
    record(&mut r.stage, stage)?;
    let published = timed(&mut Series::default(), || publish(&v.staging, &v.target));
    record(&mut r.publish, published.map(|(_, d)| d))?;
    timed(&mut r.stats, || stats(&v.target))?;
    let unpublished = timed(&mut Series::default(), || unpublish(&v.target));
    record(&mut r.unpublish, unpublished.map(|(_, d)| d))?;
    let unstaged = timed(&mut Series::default(), || unstage(&v.staging));
    record(&mut r.unstage, unstaged.map(|(_, d)| d))?;
    Ok(())
}

// The host work of each node call, shared by this floor and the gRPC floor (`grpc_floor`), so
// that both do exactly the same.

/// One owner per device (issue 49), the host's side, as the agent's filesystem stage asks it
/// before its mount and again after: nothing uses the device raw (a bind of its node in any
/// mount namespace, a holder), and no other device showing its bytes (a loop device over the
/// same file, one laid over it) is in use.
pub fn owned(dev: &Path) -> Result<(), String> {
    let devnum = ebs_node_host::device::block_devnum(dev).map_err(|e| e.to_string())?;
    if let Some(used) = ebs_node_host::raw_use::raw_use(dev, devnum).map_err(|e| e.to_string())? {
        return Err(format!("used raw: {used}"));
    }
    let views = ebs_node_host::loopdev::views::views_of(devnum).map_err(|e| e.to_string())?;
    match views.iter().find(|v| v.in_use.is_some()) {
        Some(v) => Err(format!("a view of its bytes is in use: {}", v.devnum)),
        None => Ok(()),
    }
}

/// NodeStageVolume's first step: libblkid's probe, as the agent makes it.
pub fn probe(dev: &Path) -> Result<(), String> {
    blkid::probe(dev).map(drop).map_err(|e| e.to_string())
}

/// NodeStageVolume's check: the agent's own fsck invocation.
pub fn check(tools: &FsTools, fs: FsType, dev: &Path) -> Result<(), String> {
    tools.check(fs, dev).map(drop).map_err(|e| e.to_string())
}

/// NodeStageVolume's mount.
pub fn mount(fs: FsType, dev: &Path, staging: &Path) -> Result<(), String> {
    rustix::mount::mount(dev, staging, fs.name(), MountFlags::empty(), None)
        .map_err(|e| format!("mount: {e}"))
}

/// NodePublishVolume: mkdir + bind.
pub fn publish(staging: &Path, target: &Path) -> Result<(), String> {
    std::fs::create_dir_all(target).map_err(|e| format!("mkdir: {e}"))?;
    rustix::mount::mount_bind(staging, target).map_err(|e| format!("bind: {e}"))
}

/// NodeGetVolumeStats: statvfs.
pub fn stats(target: &Path) -> Result<(), String> {
    nix::sys::statvfs::statvfs(target)
        .map(drop)
        .map_err(|e| format!("statvfs: {e}"))
}

/// NodeUnpublishVolume: umount + rmdir.
pub fn unpublish(target: &Path) -> Result<(), String> {
    unmount(target).map_err(|e| format!("unmount: {e}"))?;
    std::fs::remove_dir(target).map_err(|e| format!("rmdir: {e}"))
}

/// NodeUnstageVolume: umount.
pub fn unstage(staging: &Path) -> Result<(), String> {
    unmount(staging).map_err(|e| format!("unmount: {e}"))
}

fn record(series: &mut Series, outcome: Result<Duration, String>) -> Result<(), String> {
    match outcome {
        Ok(d) => {
            series.ok(d);
            Ok(())
        }
        Err(e) => {
            series.err();
            Err(e)
        }
    }
}

/// The bare host work: umount(2) by path, as a script would.
fn unmount(path: &Path) -> std::io::Result<()> {
    Ok(rustix::mount::unmount(path, UnmountFlags::empty())?)
}

/// Best-effort: leave nothing mounted after a failed floor cycle.
pub fn undo(staging: &Path, target: &Path) {
    let _ = unmount(target);
    let _ = std::fs::remove_dir(target);
    let _ = unmount(staging);
}

/// The block device mounted at `path`, as the mount table names it (or by its numbers).
pub fn device_mounted_at(path: &Path) -> Option<PathBuf> {
    let table = ebs_node_host::mount::table::MountTable::read().ok()?;
    let m = table.at(path)?;
    let source = Path::new(&m.source);
    if source.is_absolute() && source.exists() {
        return Some(source.to_path_buf());
    }
    let by_numbers = PathBuf::from(format!("/dev/block/{}:{}", m.major, m.minor));
    by_numbers.exists().then_some(by_numbers)
}
