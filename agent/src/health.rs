//! Readiness and hard dependencies, checked once and cached: Probe answers from memory.

use std::sync::RwLock;
use std::sync::atomic::{AtomicBool, Ordering};

#[derive(Default)]
pub struct Health {
    ready: AtomicBool,
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
        if problems.is_empty() {
            Ok(self.is_ready() && *identity == IdentityState::Known)
        } else {
            Err(problems.join("; "))
        }
    }
}

/// The hard dependencies of node work, checked at start.
pub fn node_problems(fstools: &crate::host::fstools::FsTools) -> Vec<String> {
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
    if let Err(why) = fstools.supports(crate::request::FsType::Ext4) {
        problems.push(format!("ext4, the default filesystem, is unusable: {why}"));
    }
    problems
}
