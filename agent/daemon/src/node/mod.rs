//! The daemon's side of the node domain: the core's pipeline (`ebs_node_core::node`: stage,
//! publish, unpublish, unstage) wired to the real host, store and metrics, and what needs the
//! daemon itself: the blocking pool, start-up recovery, volumes that need attention, expansion,
//! stats, reclaim and read-only block devices. No gRPC here.

pub mod attention;
pub mod recovery;

use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use ebs_node_core::records::{Durability, Phase};
use ebs_store::Store;

use ebs_node_core::node::{NodeCtx, Observer, PathClaims, VolumeLocks};

use ebs_node_core::error::{Error, Result};
use ebs_node_core::node::backend::Backend;
use ebs_node_core::node::host::HostOps;
use ebs_node_core::request::Roots;
use ebs_node_core::steps::{Op, Step};

/// The node pipeline's context and what the daemon adds to it: the store itself (recovery, the
/// inventory and the v0.1 door read more of it than the pipeline's `Ledger` does), start-up's
/// state and the volumes that need attention. Derefs to the core's `NodeCtx`, so the pipeline's
/// calls take it as is.
pub struct AgentCtx {
    pub node: NodeCtx,
    pub store: Arc<Store>,
    pub health: Arc<crate::health::Health>,
    /// Volumes whose records could not be checked against the host (see `attention`).
    pub attention: Arc<attention::Attention>,
}

impl Deref for AgentCtx {
    type Target = NodeCtx;
    fn deref(&self) -> &NodeCtx {
        &self.node
    }
}

impl AgentCtx {
    /// The context over `store`, which is also the pipeline's ledger: one store, so what the
    /// pipeline commits is what recovery, the inventory and the v0.1 door read. Fails only when
    /// the instance id beside the store's file can be neither read nor made.
    pub fn new(
        store: Arc<Store>,
        backend: Arc<dyn Backend>,
        host: Arc<dyn HostOps>,
        roots: Roots,
        observer: Arc<dyn Observer>,
        health: Arc<crate::health::Health>,
        attention: Arc<attention::Attention>,
    ) -> std::io::Result<Self> {
        // The instance id beside the store's file (made with the state directory) names the
        // read-only block devices this agent lays.
        let state_file = store.path().to_path_buf();
        let state_dir = state_file.parent().unwrap_or(std::path::Path::new("."));
        let agent_tag = ebs_node_host::instance::agent_tag(state_dir, &state_file)?;
        Ok(AgentCtx {
            node: NodeCtx {
                ledger: Arc::clone(&store) as _,
                backend,
                host,
                locks: VolumeLocks::default(),
                device_locks: VolumeLocks::default(),
                claims: PathClaims::default(),
                roots,
                observer,
                agent_tag,
            },
            store,
            health,
            attention,
        })
    }

    /// Node calls wait for start-up recovery: before it, the records may not match the host.
    pub fn ready(&self) -> Result<()> {
        if !self.health.is_ready() {
            return Err(Error::Starting);
        }
        Ok(())
    }
}

/// What the pipeline reports, as metrics; and in a test build, where the crash matrix kills it.
pub struct AgentObserver {
    pub crash_after: crate::test_hooks::CrashPoint,
}

impl Observer for AgentObserver {
    fn journal_commit(&self, durability: Durability, elapsed: Duration) {
        crate::metrics::observe_journal_commit(durability, elapsed);
    }
    fn step(&self, op: Op, step: Step, ok: bool, elapsed: Duration) {
        crate::metrics::observe_step(op.name(), step.name(), ok, elapsed);
    }
    fn reached(&self, op: Op, step: Step, phase: Phase) {
        self.crash_after.reached(op, step, phase);
    }
}

/// Runs `f` on the blocking pool while holding the volume's guard (a clash is ABORTED). The
/// guard moves into the blocking task, so a cancelled call keeps the volume busy until its host
/// work has ended. A volume that needs attention is checked again first: the call goes on only
/// once its records check out, and is otherwise refused naming the reason.
pub async fn run_locked<T, F>(ctx: &Arc<AgentCtx>, volume: &str, f: F) -> Result<T>
where
    T: Send + 'static,
    F: FnOnce(&AgentCtx) -> Result<T> + Send + 'static,
{
    ctx.ready()?;
    attention::after_reopen(ctx);
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
pub fn refuse_if_marked(ctx: &AgentCtx, volume: &str) -> Result<()> {
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
