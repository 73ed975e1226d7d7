//! The journal's store as the node pipeline sees it: the records it reads before it decides, and
//! one write that commits a step's journal line together with the records it changes. The store
//! crate's redb file is the real one; the pipeline's unit tests keep theirs in memory.

use std::collections::BTreeMap;
use std::path::Path;

use crate::records::{DeviceClaim, Durability, FormatRecord, Phase, Publication, StagedVolume};

/// The store failed (its own words; the daemon reports it as an internal error).
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct LedgerError(pub Box<dyn std::error::Error + Send + Sync + 'static>);

impl LedgerError {
    pub fn new(e: impl std::error::Error + Send + Sync + 'static) -> Self {
        LedgerError(Box::new(e))
    }
}

pub type LedgerResult<T> = Result<T, LedgerError>;

/// What one write changes, called exactly once with the write's changes to fill.
pub type Changes<'a> = Box<dyn FnOnce(&mut dyn LedgerWriter) -> LedgerResult<()> + 'a>;

/// The changes of one write: applied together, or not at all.
pub trait LedgerWriter {
    fn put_format(&mut self, f: &FormatRecord) -> LedgerResult<()>;
    fn delete_format(&mut self, volume_id: &str) -> LedgerResult<()>;
    fn put_staged(&mut self, s: &StagedVolume) -> LedgerResult<()>;
    fn delete_staged(&mut self, volume_id: &str) -> LedgerResult<()>;
    fn put_publication(&mut self, p: &Publication) -> LedgerResult<()>;
    fn delete_publication(&mut self, volume_id: &str, target: &Path) -> LedgerResult<()>;
    /// Takes a device for a volume id under `key` (`records::claim_key`).
    fn put_claim(&mut self, key: &str, claim: &DeviceClaim) -> LedgerResult<()>;
    fn delete_claim(&mut self, key: &str) -> LedgerResult<()>;
    /// Appends a line to the volume's step journal.
    fn step(
        &mut self,
        volume_id: &str,
        op: &str,
        step: &str,
        phase: Phase,
        detail: BTreeMap<String, String>,
    ) -> LedgerResult<()>;
}

/// The records the pipeline reads, and its one way to change them.
pub trait Ledger: Send + Sync {
    /// Where the records live: it scopes this agent's names on the host (see `node::ro_tag`).
    fn path(&self) -> &Path;
    fn format(&self, volume_id: &str) -> LedgerResult<Option<FormatRecord>>;
    fn staged(&self, volume_id: &str) -> LedgerResult<Option<StagedVolume>>;
    /// One volume's publications.
    fn publications(&self, volume_id: &str) -> LedgerResult<Vec<Publication>>;
    fn publication(&self, volume_id: &str, target: &Path) -> LedgerResult<Option<Publication>>;
    /// Every volume's publications (start-up's sweep of read-only devices).
    fn all_publications(&self) -> LedgerResult<Vec<Publication>>;
    /// Every volume id with a staging or a publication record.
    fn recorded_volume_ids(&self) -> LedgerResult<Vec<String>>;
    /// Which volume id holds a device (`records::claim_key`).
    fn claim(&self, key: &str) -> LedgerResult<Option<DeviceClaim>>;
    /// Whether any record names the volume.
    fn knows_volume(&self, volume_id: &str) -> LedgerResult<bool>;
    /// Commits what `changes` writes as one unit; on disk when it returns if `Immediate`.
    fn write(&self, durability: Durability, changes: Changes<'_>) -> LedgerResult<()>;
    /// Makes every write so far durable, the lazy ones included.
    fn sync(&self) -> LedgerResult<()>;
}
