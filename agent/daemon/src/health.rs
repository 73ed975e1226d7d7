//! Readiness and hard dependencies, checked once and cached: Probe answers from memory.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::Duration;

use ebs_store::Store;

#[derive(Default)]
pub struct Health {
    ready: AtomicBool,
    /// The state file: a failed commit makes Probe answer FAILED_PRECONDITION until one succeeds.
    store: OnceLock<Arc<Store>>,
    /// Hard problems (missing CAP_SYS_ADMIN, missing ext4 tools): Probe answers FAILED_PRECONDITION.
    problems: RwLock<Vec<String>>,
    /// Node identity (ebs backend), kept apart from `problems` so it clears on its own once the
    /// background lookup succeeds.
    identity: RwLock<IdentityState>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum IdentityState {
    /// Known, or not needed (loop backend, controller mode).
    #[default]
    Known,
    /// The first lookup is running: Probe answers ready=false.
    LookingUp,
    /// Probe answers FAILED_PRECONDITION with this hint.
    Missing(String),
}

impl Health {
    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::Release);
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// Watches the state file's commits from now on, and retries a failed one in the background
    /// so that readiness comes back by itself once the disk has room again.
    pub fn watch_store(&self, store: Arc<Store>) {
        let _ = self.store.set(Arc::clone(&store));
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(2)).await;
                if store.write_failure().is_none() {
                    continue;
                }
                let store = Arc::clone(&store);
                let _ = tokio::task::spawn_blocking(move || store.try_heal()).await;
            }
        });
    }

    pub fn set_problems(&self, problems: Vec<String>) {
        *self.problems.write().unwrap_or_else(|p| p.into_inner()) = problems;
    }

    pub fn set_identity(&self, state: IdentityState) {
        *self.identity.write().unwrap_or_else(|p| p.into_inner()) = state;
    }

    /// `Err` holds what an operator must fix.
    pub fn check(&self) -> Result<bool, String> {
        let mut problems = self
            .problems
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let identity = self.identity.read().unwrap_or_else(|p| p.into_inner());
        if let IdentityState::Missing(hint) = &*identity {
            problems.push(hint.clone());
        }
        if let Some(why) = self.store.get().and_then(|s| s.write_failure()) {
            problems.push(format!(
                "the state file cannot be written ({why}); node operations fail until it can \
                 (a full state disk? free space under the state directory)"
            ));
        }
        if problems.is_empty() {
            Ok(self.is_ready() && *identity == IdentityState::Known)
        } else {
            Err(problems.join("; "))
        }
    }
}

/// The hard dependencies of node work, checked at start.
pub fn node_problems(fstools: &ebs_node_host::fstools::FsTools) -> Vec<String> {
    let mut problems = Vec::new();
    match caps::has_cap(
        None,
        caps::CapSet::Effective,
        caps::Capability::CAP_SYS_ADMIN,
    ) {
        Ok(true) => {}
        Ok(false) => problems.push(
            "the agent lacks CAP_SYS_ADMIN, which mount(2) needs: run it as root or privileged"
                .to_string(),
        ),
        Err(e) => problems.push(format!("cannot read the agent's capabilities: {e}")),
    }
    if let Err(why) = fstools.supports(ebs_node_core::request::FsType::Ext4) {
        problems.push(format!("ext4, the default filesystem, is unusable: {why}"));
    }
    problems
}
