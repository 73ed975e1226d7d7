//! The node pipeline: stage, publish, unpublish and unstage as the spec's lifecycle reads, each
//! step journaled before and after through the `Ledger`, every question and change to the host
//! through the `HostOps` seam, and the volume's device proven through its `Backend`. No gRPC,
//! no host calls, no store: the daemon wires in the real ones, the unit tests (`tests/`) a
//! recording double of each.

mod adopted;
pub mod backend;
pub mod claims;
pub mod compat;
pub mod device_claim;
pub mod expand;
pub mod format;
pub mod grow;
pub mod host;
pub mod identity;
mod interrupted;
pub mod journal;
mod known;
mod locks;
mod mount_steps;
pub mod ownership;
pub mod path_handles;
mod publish;
mod publish_target;
pub mod read_only;
pub mod reclaim;
pub mod recover;
mod reused_number;
pub mod ro_tag;
mod stacking;
mod stage;
pub mod stats;
pub mod unpublish;
mod unstage;
pub mod views;
pub mod volume_condition;
pub mod volume_device;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

pub use claims::{PathClaims, Use};
pub use known::{Known, require_known};
pub use locks::{VolumeGuard, VolumeLocks};
pub use publish::{PublishCommand, check_publish_paths, publish};
pub use stage::{StageCommand, stage};
pub use unpublish::{UnpublishCommand, unpublish};
pub use unstage::{UnstageCommand, unstage};

use crate::ledger::Ledger;
use crate::records::{Durability, Phase};
use crate::request::Roots;
use crate::steps::{Op, Step};
use backend::Backend;
use host::HostOps;

/// What the pipeline reports as it goes: the daemon turns it into metrics, and a test build's
/// crash matrix into a kill at one step. Every method does nothing unless implemented.
pub trait Observer: Send + Sync {
    /// A journal commit took `elapsed`.
    fn journal_commit(&self, _durability: Durability, _elapsed: Duration) {}
    /// A step ended (`ok`) `elapsed` after its intent.
    fn step(&self, _op: Op, _step: Step, _ok: bool, _elapsed: Duration) {}
    /// A journal line was written (or held) for `op.step.phase`: the crash matrix's kill point.
    fn reached(&self, _op: Op, _step: Step, _phase: Phase) {}
}

/// An observer that notes nothing.
pub struct Unobserved;
impl Observer for Unobserved {}

/// Everything a node operation needs, shared by all calls.
pub struct NodeCtx {
    /// The records and the step journal (the store's redb file; a double in the unit tests).
    pub ledger: Arc<dyn Ledger>,
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
    /// Metrics and, in test builds only, the crash matrix's kill point.
    pub observer: Arc<dyn Observer>,
    /// This agent instance's part of the names it gives on the host (`ro_tag`).
    pub agent_tag: ro_tag::AgentTag,
}

/// Locks a mutex whose data stays consistent even if a holder panicked (plain lists and maps,
/// changed in one step).
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

pub fn path_string(p: &Path) -> String {
    p.display().to_string()
}

#[cfg(test)]
mod tests;
