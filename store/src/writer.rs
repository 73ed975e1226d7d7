//! The write side: one `Writer` per transaction, so a step's journal line and the record it changes
//! commit together or not at all.

use std::collections::BTreeMap;
use std::path::Path;

use redb::{ReadableTable, TableDefinition};
use serde::Serialize;

use crate::{
    FORMATS, FormatRecord, JOURNAL, JOURNAL_LINES_PER_VOLUME, LOOP_VOLUMES, LoopVolume, META,
    PUBLICATIONS, Phase, Publication, STAGED, StagedVolume, StepRecord, StoreError, decode,
    now_unix_ms, path_key,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// On disk when the commit returns: for records that must precede a host change.
    Immediate,
    /// Persisted by the next immediate commit: for bookkeeping that can be re-derived.
    Lazy,
}

impl From<Durability> for redb::Durability {
    fn from(d: Durability) -> Self {
        match d {
            Durability::Immediate => redb::Durability::Immediate,
            Durability::Lazy => redb::Durability::None,
        }
    }
}

pub struct Writer<'a> {
    tx: &'a redb::WriteTransaction,
}

fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, StoreError> {
    serde_json::to_vec(value).map_err(StoreError::Encode)
}

impl<'a> Writer<'a> {
    pub(crate) fn new(tx: &'a redb::WriteTransaction) -> Self {
        Writer { tx }
    }

    pub(crate) fn init_schema(&mut self, version: u64) -> Result<(), StoreError> {
        let mut t = self.tx.open_table(META)?;
        t.insert("schema_version", version)?;
        // Create every table up front so that read-only opens find them.
        drop(self.tx.open_table(LOOP_VOLUMES)?);
        drop(self.tx.open_table(FORMATS)?);
        drop(self.tx.open_table(STAGED)?);
        drop(self.tx.open_table(PUBLICATIONS)?);
        drop(self.tx.open_table(JOURNAL)?);
        Ok(())
    }

    fn put<T: Serialize>(
        &mut self,
        def: TableDefinition<&str, &[u8]>,
        key: &str,
        value: &T,
    ) -> Result<(), StoreError> {
        let bytes = encode(value)?;
        self.tx.open_table(def)?.insert(key, bytes.as_slice())?;
        Ok(())
    }

    fn delete(&mut self, def: TableDefinition<&str, &[u8]>, key: &str) -> Result<(), StoreError> {
        self.tx.open_table(def)?.remove(key)?;
        Ok(())
    }

    pub fn put_loop_volume(&mut self, v: &LoopVolume) -> Result<(), StoreError> {
        self.put(LOOP_VOLUMES, &v.id, v)
    }

    pub fn delete_loop_volume(&mut self, id: &str) -> Result<(), StoreError> {
        self.delete(LOOP_VOLUMES, id)
    }

    pub fn put_format(&mut self, f: &FormatRecord) -> Result<(), StoreError> {
        self.put(FORMATS, &f.volume_id, f)
    }

    pub fn delete_format(&mut self, volume_id: &str) -> Result<(), StoreError> {
        self.delete(FORMATS, volume_id)
    }

    pub fn put_staged(&mut self, s: &StagedVolume) -> Result<(), StoreError> {
        self.put(STAGED, &s.volume_id, s)
    }

    pub fn delete_staged(&mut self, volume_id: &str) -> Result<(), StoreError> {
        self.delete(STAGED, volume_id)
    }

    pub fn put_publication(&mut self, p: &Publication) -> Result<(), StoreError> {
        let bytes = encode(p)?;
        let target = path_key(&p.target_path)?;
        self.tx
            .open_table(PUBLICATIONS)?
            .insert((p.volume_id.as_str(), target), bytes.as_slice())?;
        Ok(())
    }

    pub fn delete_publication(&mut self, volume_id: &str, target: &Path) -> Result<(), StoreError> {
        let target = path_key(target)?;
        self.tx
            .open_table(PUBLICATIONS)?
            .remove((volume_id, target))?;
        Ok(())
    }

    /// Removes every record of a volume (DeleteVolume): format fact, staging, publications, journal.
    pub fn forget_volume(&mut self, volume_id: &str) -> Result<(), StoreError> {
        self.delete_format(volume_id)?;
        self.delete_staged(volume_id)?;
        self.tx
            .open_table(PUBLICATIONS)?
            .retain(|(v, _), _| v != volume_id)?;
        self.tx
            .open_table(JOURNAL)?
            .retain_in((volume_id, 0)..=(volume_id, u64::MAX), |_, _| false)?;
        Ok(())
    }

    /// Appends a journal line for a volume and trims the journal to its bounded length.
    pub fn step(
        &mut self,
        volume_id: &str,
        op: &str,
        step: &str,
        phase: Phase,
        detail: BTreeMap<String, String>,
    ) -> Result<StepRecord, StoreError> {
        let mut table = self.tx.open_table(JOURNAL)?;
        let mut seqs = Vec::new();
        for row in table.range((volume_id, 0)..=(volume_id, u64::MAX))? {
            seqs.push(row?.0.value().1);
        }
        let seq = seqs.last().map_or(1, |s| s + 1);
        let record = StepRecord {
            seq,
            op: op.to_string(),
            step: step.to_string(),
            phase,
            at_unix_ms: now_unix_ms(),
            detail,
        };
        let bytes = encode(&record)?;
        table.insert((volume_id, seq), bytes.as_slice())?;
        let excess = (seqs.len() + 1).saturating_sub(JOURNAL_LINES_PER_VOLUME);
        for old in seqs.into_iter().take(excess) {
            table.remove((volume_id, old))?;
        }
        Ok(record)
    }

    /// Reads a staged record inside the transaction (read-modify-write without a race).
    pub fn staged(&self, volume_id: &str) -> Result<Option<StagedVolume>, StoreError> {
        let table = self.tx.open_table(STAGED)?;
        let value = table.get(volume_id)?;
        value.map(|v| decode(v.value())).transpose()
    }
}
