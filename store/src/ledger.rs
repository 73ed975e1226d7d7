//! The redb store behind the core's `Ledger`: the node pipeline reads and writes through it.

use std::collections::BTreeMap;
use std::path::Path;

use ebs_node_core::ledger::{Changes, Ledger, LedgerError, LedgerResult, LedgerWriter};

use crate::{
    DeviceClaim, Durability, FormatRecord, Phase, Publication, StagedVolume, Store, StoreError,
    Writer,
};

impl From<StoreError> for LedgerError {
    fn from(e: StoreError) -> Self {
        LedgerError::new(e)
    }
}

/// A store failure in the domain's error (the daemon's code reads the store directly too).
impl From<StoreError> for ebs_node_core::error::Error {
    fn from(e: StoreError) -> Self {
        ebs_node_core::error::Error::Store(e.into())
    }
}

impl LedgerWriter for Writer {
    fn put_format(&mut self, f: &FormatRecord) -> LedgerResult<()> {
        Ok(Writer::put_format(self, f)?)
    }
    fn delete_format(&mut self, volume_id: &str) -> LedgerResult<()> {
        Ok(Writer::delete_format(self, volume_id)?)
    }
    fn put_staged(&mut self, s: &StagedVolume) -> LedgerResult<()> {
        Ok(Writer::put_staged(self, s)?)
    }
    fn delete_staged(&mut self, volume_id: &str) -> LedgerResult<()> {
        Ok(Writer::delete_staged(self, volume_id)?)
    }
    fn put_publication(&mut self, p: &Publication) -> LedgerResult<()> {
        Ok(Writer::put_publication(self, p)?)
    }
    fn delete_publication(&mut self, volume_id: &str, target: &Path) -> LedgerResult<()> {
        Ok(Writer::delete_publication(self, volume_id, target)?)
    }
    fn put_claim(&mut self, key: &str, claim: &DeviceClaim) -> LedgerResult<()> {
        Ok(Writer::put_claim(self, key, claim)?)
    }
    fn delete_claim(&mut self, key: &str) -> LedgerResult<()> {
        Ok(Writer::delete_claim(self, key)?)
    }
    fn step(
        &mut self,
        volume_id: &str,
        op: &str,
        step: &str,
        phase: Phase,
        detail: BTreeMap<String, String>,
    ) -> LedgerResult<()> {
        Ok(Writer::step(self, volume_id, op, step, phase, detail)?)
    }
}

impl Ledger for Store {
    fn path(&self) -> &Path {
        Store::path(self)
    }
    fn format(&self, volume_id: &str) -> LedgerResult<Option<FormatRecord>> {
        Ok(Store::format(self, volume_id)?)
    }
    fn staged(&self, volume_id: &str) -> LedgerResult<Option<StagedVolume>> {
        Ok(Store::staged(self, volume_id)?)
    }
    fn publications(&self, volume_id: &str) -> LedgerResult<Vec<Publication>> {
        Ok(Store::publications(self, volume_id)?)
    }
    fn publication(&self, volume_id: &str, target: &Path) -> LedgerResult<Option<Publication>> {
        Ok(Store::publication(self, volume_id, target)?)
    }
    fn all_publications(&self) -> LedgerResult<Vec<Publication>> {
        Ok(Store::all_publications(self)?)
    }
    fn recorded_volume_ids(&self) -> LedgerResult<Vec<String>> {
        Ok(Store::recorded_volume_ids(self)?)
    }
    fn claim(&self, key: &str) -> LedgerResult<Option<DeviceClaim>> {
        Ok(Store::claim(self, key)?)
    }
    fn knows_volume(&self, volume_id: &str) -> LedgerResult<bool> {
        Ok(Store::knows_volume(self, volume_id)?)
    }
    fn write(&self, durability: Durability, changes: Changes<'_>) -> LedgerResult<()> {
        self.write_with(durability, |w: &mut Writer| changes(w))
    }
    fn sync(&self) -> LedgerResult<()> {
        Ok(Store::sync(self)?)
    }
}
