//! The node domain: stage, publish, unpublish, unstage, expand and stats as explicit step
//! pipelines over the host, journaled through the store. No gRPC here.

pub mod attention;
mod claims;
mod compat;
mod expand;
mod format;
mod grow;
mod host_ops;
pub mod identity;
pub mod journal;
mod known;
mod locks;
pub mod ownership;
mod path_handles;
mod publish;
mod read_probe;
pub mod reclaim;
pub mod recovery;
pub mod ro_block;
mod stage;
mod stats;
mod unpublish;
mod unstage;
mod volume_condition;
mod volume_device;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ebs_store::Store;

pub use claims::{PathClaims, Use};
pub use expand::{ExpandCommand, expand};
pub use host_ops::{DeviceHandle, HostOps, RealHost};
pub use known::{Known, require_known};
pub use locks::{VolumeGuard, VolumeLocks};
pub use publish::{PublishCommand, check_publish_paths, publish};
pub use stage::{StageCommand, stage};
pub use stats::{Counts, StatsCommand, Usage, VolumeStats, volume_stats};
pub use unpublish::{UnpublishCommand, unpublish};
pub use unstage::{UnstageCommand, unstage};
pub use volume_condition::Condition;

use crate::backend::Backend;
use crate::error::{Error, Result};
use ebs_node_core::request::Roots;

/// Everything a node operation needs, shared by all calls.
pub struct NodeCtx {
    pub store: Arc<Store>,
    pub backend: Arc<dyn Backend>,
    /// The host, as the lifecycle pipeline asks and changes it (a double in its unit tests).
    pub host: Arc<dyn HostOps>,
    /// One operation per volume at a time.
    pub locks: VolumeLocks,
    /// One operation per device at a time: two volume ids that resolve to one device (a
    /// careless CO) never run mkfs or fsck on it together.
    pub device_locks: VolumeLocks,
    /// Which volume each staging and target path belongs to, and the paths in use.
    pub claims: PathClaims,
    /// Where request paths may lie (recorded paths are resolved below the same prefixes).
    pub roots: Roots,
    /// Where the crash matrix kills the agent (test builds only; nothing in a release).
    pub crash_after: crate::test_hooks::CrashPoint,
    pub health: Arc<crate::health::Health>,
    /// Volumes whose records could not be checked against the host (see `attention`).
    pub attention: Arc<attention::Attention>,
}

impl NodeCtx {
    pub fn crash_after(&self) -> &crate::test_hooks::CrashPoint {
        &self.crash_after
    }

    /// Node calls wait for start-up recovery: before it, the records may not match the host.
    pub fn ready(&self) -> Result<()> {
        if !self.health.is_ready() {
            return Err(Error::Unavailable(
                "the agent is starting (start-up recovery is running); retry shortly".into(),
            ));
        }
        Ok(())
    }
}

/// Runs `f` on the blocking pool while holding the volume's guard (a clash is ABORTED). The
/// guard moves into the blocking task, so a cancelled call keeps the volume busy until its host
/// work has ended. A volume that needs attention is checked again first: the call goes on only
/// once its records check out, and is otherwise refused naming the reason.
pub async fn run_locked<T, F>(ctx: &Arc<NodeCtx>, volume: &str, f: F) -> Result<T>
where
    T: Send + 'static,
    F: FnOnce(&NodeCtx) -> Result<T> + Send + 'static,
{
    ctx.ready()?;
    let guard = match ctx.locks.try_lock(volume) {
        Some(guard) if ctx.attention.is_marked(volume) => {
            let wait = recovery::VOLUME_WAIT;
            match attention::check(ctx, volume, guard, wait).await {
                attention::Checked::Recovered(guard, _) => guard,
                attention::Checked::Refused(e) => return Err(e),
            }
        }
        Some(guard) => guard,
        // A marked volume's guard is held by its check: the refusal says why, not "busy".
        None => {
            return Err(ctx
                .attention
                .refusal(volume)
                .unwrap_or_else(|| Error::Busy(volume.to_string())));
        }
    };
    let ctx = Arc::clone(ctx);
    crate::error::blocking(move || {
        let _guard = guard;
        f(&ctx)
    })
    .await
}

/// The refusal for a call that takes no guard (stats) on a volume that needs attention.
pub fn refuse_if_marked(ctx: &NodeCtx, volume: &str) -> Result<()> {
    match ctx.attention.refusal(volume) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Locks a mutex whose data stays consistent even if a holder panicked (plain lists and maps,
/// changed in one step).
fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

pub fn path_string(p: &Path) -> String {
    p.display().to_string()
}

pub fn pb(p: &Path) -> PathBuf {
    p.to_path_buf()
}
#[cfg(test)]
mod pipeline_tests;
