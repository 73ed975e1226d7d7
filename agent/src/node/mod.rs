//! The node domain: stage, publish, unpublish, unstage (and later expand and stats) as explicit
//! step pipelines over the host, journaled through the store. No gRPC here.

mod expand;
mod format;
mod grow;
mod health_check;
pub mod identity;
pub mod journal;
mod known;
mod locks;
mod publish;
mod read_probe;
pub mod reclaim;
pub mod recovery;
mod stage;
mod stats;
mod unstage;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ebs_store::Store;

pub use expand::{ExpandCommand, expand};
pub use health_check::Condition;
pub use known::{Known, require_known};
pub use locks::{VolumeGuard, VolumeLocks};
pub use publish::{PublishCommand, UnpublishCommand, publish, unpublish};
pub use stage::{StageCommand, stage};
pub use stats::{Counts, StatsCommand, Usage, VolumeStats, volume_stats};
pub use unstage::{UnstageCommand, unstage};

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::host::fstools::FsTools;
use crate::host::mount_root::{MountRoot, mount_root};
use crate::host::mountinfo::{MountEntry, MountTable};

/// Everything a node operation needs, shared by all calls.
pub struct NodeCtx {
    pub store: Arc<Store>,
    pub backend: Arc<dyn Backend>,
    pub fstools: FsTools,
    pub locks: VolumeLocks,
    pub crash_after: Option<String>,
    pub health: Arc<crate::health::Health>,
}

impl NodeCtx {
    pub fn crash_after(&self) -> Option<&str> {
        self.crash_after.as_deref()
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
/// work has ended.
pub async fn run_locked<T, F>(ctx: &Arc<NodeCtx>, volume: &str, f: F) -> Result<T>
where
    T: Send + 'static,
    F: FnOnce(&NodeCtx) -> Result<T> + Send + 'static,
{
    ctx.ready()?;
    let guard = ctx
        .locks
        .try_lock(volume)
        .ok_or_else(|| Error::Busy(volume.to_string()))?;
    let ctx = Arc::clone(ctx);
    crate::error::blocking(move || {
        let _guard = guard;
        f(&ctx)
    })
    .await
}

/// Locks a mutex whose data stays consistent even if a holder panicked (plain lists and maps,
/// changed in one step).
fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

pub fn mount_table() -> Result<MountTable> {
    MountTable::read().map_err(|e| Error::Internal(format!("reading /proc/self/mountinfo: {e}")))
}

/// What is mounted exactly at `path`, if anything (the top-most mount). The mount table is read
/// only when statx cannot rule a mount out.
pub fn mounted_at(path: &Path) -> Result<Option<MountEntry>> {
    if mount_root(path) == MountRoot::NotMounted {
        return Ok(None);
    }
    Ok(mount_table()?.at(path).cloned())
}

/// Creates a directory (and parents) for a staging or target path the CO handed us.
pub fn ensure_dir(path: &Path) -> Result<()> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(Error::Precondition(format!(
            "{} exists and is not a directory",
            path.display()
        ))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => std::fs::create_dir_all(path)
            .map_err(|e| Error::io(format!("creating {}", path.display()), e)),
        Err(e) => Err(Error::io(format!("inspecting {}", path.display()), e)),
    }
}

pub fn path_string(p: &Path) -> String {
    p.display().to_string()
}

pub fn pb(p: &Path) -> PathBuf {
    p.to_path_buf()
}
