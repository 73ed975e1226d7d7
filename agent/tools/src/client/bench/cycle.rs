//! The CSI side of the bench: create and attach volumes, run the node cycle at a fixed
//! concurrency with every RPC timed, probe the agent meanwhile, and clean up after itself. Only
//! CSI calls here, so it runs against any driver that offers CreateVolume.

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use csi::controller_client::ControllerClient;
use csi::identity_client::IdentityClient;
use csi::node_client::NodeClient;
use ebs_proto::csi::v1 as csi;
use tokio::task::JoinSet;
use tonic::transport::Channel;
use tonic::{Code, Request, Status};

use super::stats::Series;

/// CSI clients on one connection, with the deadline every call carries.
#[derive(Clone)]
pub struct Csi {
    pub identity: IdentityClient<Channel>,
    pub controller: ControllerClient<Channel>,
    pub node: NodeClient<Channel>,
    pub timeout: Duration,
}

impl Csi {
    pub fn new(ch: Channel, timeout: Duration) -> Csi {
        Csi {
            identity: IdentityClient::new(ch.clone()),
            controller: ControllerClient::new(ch.clone()),
            node: NodeClient::new(ch),
            timeout,
        }
    }

    pub fn req<T>(&self, msg: T) -> Request<T> {
        let mut r = Request::new(msg);
        r.set_timeout(self.timeout);
        r
    }
}

/// One volume of the run: what the controller answered and where the node mounts it.
#[derive(Clone, Debug, Default)]
pub struct BenchVolume {
    pub name: String,
    pub id: String,
    pub volume_context: HashMap<String, String>,
    pub publish_context: Option<HashMap<String, String>>,
    pub staging: PathBuf,
    pub target: PathBuf,
    /// The block device seen mounted at the staging path during the warm-up stage.
    pub device: Option<PathBuf>,
}

/// Runs `f(i)` for i in 0..n with at most `concurrency` calls in flight; results in order, `None`
/// for the items not started because the bench is stopping. Dropping the future aborts the
/// workers (a second Ctrl-C), which is why a JoinSet holds them.
pub async fn par<R, F, Fut>(n: usize, concurrency: usize, f: F) -> Vec<Option<R>>
where
    R: Send + 'static,
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = R> + Send + 'static,
{
    run_items(n, concurrency, true, f).await
}

/// `par` for the clean-up, which runs every item whatever the bench is doing.
pub async fn par_all<R, F, Fut>(n: usize, concurrency: usize, f: F) -> Vec<R>
where
    R: Send + 'static,
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = R> + Send + 'static,
{
    run_items(n, concurrency, false, f)
        .await
        .into_iter()
        .flatten()
        .collect()
}

async fn run_items<R, F, Fut>(n: usize, concurrency: usize, stoppable: bool, f: F) -> Vec<Option<R>>
where
    R: Send + 'static,
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = R> + Send + 'static,
{
    let f = Arc::new(f);
    let next = Arc::new(AtomicUsize::new(0));
    let mut set = JoinSet::new();
    for _ in 0..concurrency.clamp(1, n.max(1)) {
        let (f, next) = (Arc::clone(&f), Arc::clone(&next));
        set.spawn(async move {
            let mut out = Vec::new();
            loop {
                if stoppable && super::interrupt::stopping() {
                    break;
                }
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    break;
                }
                out.push((i, f(i).await));
            }
            out
        });
    }
    let mut all: Vec<Option<R>> = (0..n).map(|_| None).collect();
    while let Some(joined) = set.join_next().await {
        for (i, r) in joined.into_iter().flatten() {
            all[i] = Some(r);
        }
    }
    all
}

pub fn capability(fs_type: &str) -> csi::VolumeCapability {
    use csi::volume_capability::access_mode::Mode;
    use csi::volume_capability::{AccessMode, AccessType, MountVolume};
    csi::VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: fs_type.to_string(),
            ..Default::default()
        })),
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
    }
}

pub async fn create(c: &Csi, v: &mut BenchVolume, bytes: u64, fs: &str) -> Result<(), Status> {
    let r = c
        .controller
        .clone()
        .create_volume(c.req(csi::CreateVolumeRequest {
            name: v.name.clone(),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: bytes as i64,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![capability(fs)],
            ..Default::default()
        }))
        .await?
        .into_inner();
    let vol = r
        .volume
        .ok_or_else(|| Status::internal("CreateVolume answered without a volume"))?;
    v.id = vol.volume_id;
    v.volume_context = vol.volume_context;
    Ok(())
}

pub async fn controller_publish(
    c: &Csi,
    v: &mut BenchVolume,
    node_id: &str,
    fs: &str,
) -> Result<(), Status> {
    let r = c
        .controller
        .clone()
        .controller_publish_volume(c.req(csi::ControllerPublishVolumeRequest {
            volume_id: v.id.clone(),
            node_id: node_id.to_string(),
            volume_capability: Some(capability(fs)),
            volume_context: v.volume_context.clone(),
            ..Default::default()
        }))
        .await?
        .into_inner();
    v.publish_context = Some(r.publish_context);
    Ok(())
}

pub async fn stage(c: &Csi, v: &BenchVolume, fs: &str) -> Result<(), Status> {
    c.node
        .clone()
        .node_stage_volume(c.req(csi::NodeStageVolumeRequest {
            volume_id: v.id.clone(),
            publish_context: v.publish_context.clone().unwrap_or_default(),
            staging_target_path: v.staging.display().to_string(),
            volume_capability: Some(capability(fs)),
            volume_context: v.volume_context.clone(),
            ..Default::default()
        }))
        .await
        .map(drop)
}

pub async fn publish(c: &Csi, v: &BenchVolume, fs: &str) -> Result<(), Status> {
    c.node
        .clone()
        .node_publish_volume(c.req(csi::NodePublishVolumeRequest {
            volume_id: v.id.clone(),
            publish_context: v.publish_context.clone().unwrap_or_default(),
            staging_target_path: v.staging.display().to_string(),
            target_path: v.target.display().to_string(),
            volume_capability: Some(capability(fs)),
            volume_context: v.volume_context.clone(),
            ..Default::default()
        }))
        .await
        .map(drop)
}

pub async fn stats(c: &Csi, v: &BenchVolume) -> Result<(), Status> {
    c.node
        .clone()
        .node_get_volume_stats(c.req(csi::NodeGetVolumeStatsRequest {
            volume_id: v.id.clone(),
            volume_path: v.target.display().to_string(),
            staging_target_path: v.staging.display().to_string(),
        }))
        .await
        .map(drop)
}

pub async fn unpublish(c: &Csi, v: &BenchVolume) -> Result<(), Status> {
    c.node
        .clone()
        .node_unpublish_volume(c.req(csi::NodeUnpublishVolumeRequest {
            volume_id: v.id.clone(),
            target_path: v.target.display().to_string(),
        }))
        .await
        .map(drop)
}

pub async fn unstage(c: &Csi, v: &BenchVolume) -> Result<(), Status> {
    c.node
        .clone()
        .node_unstage_volume(c.req(csi::NodeUnstageVolumeRequest {
            volume_id: v.id.clone(),
            staging_target_path: v.staging.display().to_string(),
        }))
        .await
        .map(drop)
}

/// Whether the node advertises NodeGetVolumeStats.
pub async fn offers_stats(c: &Csi) -> Result<bool, Status> {
    use csi::node_service_capability::{Type, rpc};
    let caps = c
        .node
        .clone()
        .node_get_capabilities(c.req(csi::NodeGetCapabilitiesRequest {}))
        .await?
        .into_inner();
    Ok(caps.capabilities.iter().any(|cap| {
        matches!(&cap.r#type, Some(Type::Rpc(r)) if r.r#type == rpc::Type::GetVolumeStats as i32)
    }))
}

/// The measured cycle's timings, one series per RPC.
#[derive(Debug, Default)]
pub struct CycleResult {
    pub stage: Series,
    pub publish: Series,
    pub stats: Series,
    pub unpublish: Series,
    pub unstage: Series,
    pub wall: Duration,
    pub first_error: Option<String>,
}

impl CycleResult {
    pub fn errors(&self) -> usize {
        self.stage.errors()
            + self.publish.errors()
            + self.stats.errors()
            + self.unpublish.errors()
            + self.unstage.errors()
    }
}

async fn timed<F: Future<Output = Result<(), Status>>>(
    series: &mut Series,
    first_error: &mut Option<String>,
    what: &str,
    f: F,
) -> bool {
    let t = Instant::now();
    match f.await {
        Ok(()) => {
            series.ok(t.elapsed());
            true
        }
        Err(st) => {
            series.err();
            first_error.get_or_insert_with(|| format!("{what}: {:?}: {}", st.code(), st.message()));
            false
        }
    }
}

/// stage → publish → (stats) → unpublish → unstage for every volume, `concurrency` at a time.
/// A failed step ends that volume's cycle; the final clean-up undoes whatever it left.
pub async fn measured(
    c: &Csi,
    volumes: &[BenchVolume],
    concurrency: usize,
    fs: &str,
    with_stats: bool,
) -> CycleResult {
    let vols = Arc::new(volumes.to_vec());
    let (c, fs) = (c.clone(), fs.to_string());
    let started = Instant::now();
    let parts = par(volumes.len(), concurrency, move |i| {
        let (c, fs, vols) = (c.clone(), fs.clone(), Arc::clone(&vols));
        async move {
            let v = &vols[i];
            let mut r = CycleResult::default();
            let e = &mut r.first_error;
            let _ = timed(&mut r.stage, e, "NodeStageVolume", stage(&c, v, &fs)).await
                && timed(&mut r.publish, e, "NodePublishVolume", publish(&c, v, &fs)).await
                && (!with_stats
                    || timed(&mut r.stats, e, "NodeGetVolumeStats", stats(&c, v)).await)
                && timed(&mut r.unpublish, e, "NodeUnpublishVolume", unpublish(&c, v)).await
                && timed(&mut r.unstage, e, "NodeUnstageVolume", unstage(&c, v)).await;
            r
        }
    })
    .await;
    let mut total = CycleResult::default();
    for p in parts.into_iter().flatten() {
        total.merge(p);
    }
    total.wall = started.elapsed();
    total
}

impl CycleResult {
    /// Pools another run's samples; wall times add up.
    pub fn merge(&mut self, p: CycleResult) {
        self.stage.merge(p.stage);
        self.publish.merge(p.publish);
        self.stats.merge(p.stats);
        self.unpublish.merge(p.unpublish);
        self.unstage.merge(p.unstage);
        self.wall += p.wall;
        if self.first_error.is_none() {
            self.first_error = p.first_error;
        }
    }
}

/// Retries a clean-up call while the volume is busy (a cancelled call still finishing).
async fn settle<F, Fut>(what: &str, f: F) -> Option<String>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<(), Status>>,
{
    for _ in 0..50 {
        match f().await {
            Ok(()) => return None,
            Err(st) if st.code() == Code::NotFound => return None,
            Err(st) if matches!(st.code(), Code::Aborted | Code::Unavailable) => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(st) => return Some(format!("{what}: {:?}: {}", st.code(), st.message())),
        }
    }
    Some(format!("{what}: still busy after 10 s"))
}

/// Undoes everything the bench did to these volumes, newest step first; returns what failed.
pub async fn cleanup(
    c: &Csi,
    volumes: &[BenchVolume],
    node_id: &str,
    concurrency: usize,
) -> Vec<String> {
    let vols = Arc::new(volumes.to_vec());
    let (c, node_id) = (c.clone(), node_id.to_string());
    let per_volume = par_all(volumes.len(), concurrency, move |i| {
        let (c, vols, node_id) = (c.clone(), Arc::clone(&vols), node_id.clone());
        async move {
            let v = &vols[i];
            let mut problems = Vec::new();
            if v.id.is_empty() {
                return problems;
            }
            problems.extend(settle("NodeUnpublishVolume", || unpublish(&c, v)).await);
            problems.extend(settle("NodeUnstageVolume", || unstage(&c, v)).await);
            if v.publish_context.is_some() {
                let unpub = || {
                    let mut ctl = c.controller.clone();
                    let req = c.req(csi::ControllerUnpublishVolumeRequest {
                        volume_id: v.id.clone(),
                        node_id: node_id.clone(),
                        ..Default::default()
                    });
                    async move { ctl.controller_unpublish_volume(req).await.map(drop) }
                };
                problems.extend(settle("ControllerUnpublishVolume", unpub).await);
            }
            let delete = || {
                let mut ctl = c.controller.clone();
                let req = c.req(csi::DeleteVolumeRequest {
                    volume_id: v.id.clone(),
                    ..Default::default()
                });
                async move { ctl.delete_volume(req).await.map(drop) }
            };
            problems.extend(settle("DeleteVolume", delete).await);
            problems
                .into_iter()
                .map(|p| format!("{}: {p}", v.id))
                .collect::<Vec<_>>()
        }
    })
    .await;
    per_volume.into_iter().flatten().collect()
}
