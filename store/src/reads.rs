//! The read side: redb's snapshot, with the lazy writes it does not hold yet laid over it (see
//! `overlay`), so that a caller reads its own lazy write the moment `write` returns.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use redb::{ReadableTable, TableHandle};
use serde::de::DeserializeOwned;

use crate::overlay::{APPLIED_TICKET, VolumeOverlay};
use crate::writer::StrTable;
use crate::{
    Db, FORMATS, JOURNAL, JOURNAL_LINES_PER_VOLUME, LOOP_SNAPSHOTS, LOOP_VOLUMES, LoopSnapshot,
    LoopVolume, META, PUBLICATIONS, Publication, STAGED, StagedVolume, StepRecord, Store,
    StoreError, decode, open_table, path_key,
};

/// One consistent read: redb's snapshot and the overlay entries newer than it.
pub(crate) struct View {
    pub(crate) tx: redb::ReadTransaction,
    /// By volume; empty when no lazy write is waiting (the usual case when idle).
    pub(crate) over: BTreeMap<String, VolumeOverlay>,
}

impl View {
    /// A record of `def` for volume `id`: `Some(None)` when a lazy write deleted it.
    fn keyed(&self, def: StrTable, id: &str) -> Option<Option<&[u8]>> {
        let v = self.over.get(id)?.keyed(def.name())?;
        Some(v.as_deref())
    }

    fn has(&self, def: StrTable, id: &str) -> Result<bool, StoreError> {
        if let Some(v) = self.keyed(def, id) {
            return Ok(v.is_some());
        }
        Ok(match open_table(&self.tx, def)? {
            Some(t) => t.get(id)?.is_some(),
            None => false,
        })
    }

    /// One volume's publications by target, raw.
    fn publications(&self, id: &str) -> Result<BTreeMap<String, Vec<u8>>, StoreError> {
        let mut out = BTreeMap::new();
        if let Some(table) = open_table(&self.tx, PUBLICATIONS)? {
            for row in table.range((id, "")..)? {
                let (key, value) = row?;
                if key.value().0 != id {
                    break;
                }
                out.insert(key.value().1.to_string(), value.value().to_vec());
            }
        }
        if let Some(o) = self.over.get(id) {
            for (target, (_, value)) in &o.publications {
                match value {
                    Some(v) => out.insert(target.clone(), v.clone()),
                    None => out.remove(target),
                };
            }
        }
        Ok(out)
    }

    /// The volume ids that key the records of `defs` and the publications (and the journal, if
    /// `journal`), as redb holds them.
    fn ids_in(
        &self,
        defs: &[StrTable],
        journal: bool,
        ids: &mut BTreeSet<String>,
    ) -> Result<(), StoreError> {
        for def in defs {
            if let Some(t) = open_table(&self.tx, *def)? {
                for row in t.iter()? {
                    ids.insert(row?.0.value().to_string());
                }
            }
        }
        if let Some(t) = open_table(&self.tx, PUBLICATIONS)? {
            for row in t.iter()? {
                ids.insert(row?.0.value().0.to_string());
            }
        }
        if journal && let Some(t) = open_table(&self.tx, JOURNAL)? {
            for row in t.iter()? {
                ids.insert(row?.0.value().0.to_string());
            }
        }
        Ok(())
    }

    /// Corrects `ids` for the volumes held writes changed: in if `counts` says so now, else out.
    fn settle_held(
        &self,
        ids: &mut BTreeSet<String>,
        counts: fn(&View, &str) -> Result<bool, StoreError>,
    ) -> Result<Vec<String>, StoreError> {
        for id in self.over.keys() {
            if counts(self, id)? {
                ids.insert(id.clone());
            } else {
                ids.remove(id);
            }
        }
        Ok(std::mem::take(ids).into_iter().collect())
    }

    /// Whether a staging or a publication record names the volume.
    fn recorded(&self, id: &str) -> Result<bool, StoreError> {
        Ok(self.has(STAGED, id)? || !self.publications(id)?.is_empty())
    }

    /// Whether a format, staging or publication record or a journal line names the volume.
    fn named(&self, id: &str) -> Result<bool, StoreError> {
        if self.recorded(id)? || self.has(FORMATS, id)? {
            return Ok(true);
        }
        if self.over.get(id).is_some_and(|o| !o.steps.is_empty()) {
            return Ok(true);
        }
        Ok(match open_table(&self.tx, JOURNAL)? {
            Some(t) => t.range((id, 0)..=(id, u64::MAX))?.next().is_some(),
            None => false,
        })
    }
}

/// Whether lazy writes to `def` can be waiting in the overlay.
fn overlaid(def: StrTable) -> bool {
    def.name() == FORMATS.name() || def.name() == STAGED.name()
}

impl Store {
    /// A consistent read of one volume's records (`Some`) or of all. The overlay is taken first:
    /// an entry leaves it only once redb shows it, so none is missed, and the snapshot's ticket
    /// drops those it already holds, so none counts twice.
    pub(crate) fn view(&self, volume: Option<&str>) -> Result<View, StoreError> {
        let over = match &self.db {
            Db::ReadWrite(_) => self.group.overlay_of(volume),
            _ => BTreeMap::new(),
        };
        let tx = self.read_tx()?;
        if over.is_empty() {
            return Ok(View { tx, over });
        }
        let applied = applied_ticket(&tx)?;
        let over = over
            .into_iter()
            .map(|(id, o)| (id, o.newer_than(applied)))
            .collect();
        Ok(View { tx, over })
    }

    /// A view for reading `def`: redb's snapshot alone for a table no lazy write is held for.
    fn view_of_table(&self, def: StrTable, volume: Option<&str>) -> Result<View, StoreError> {
        if overlaid(def) {
            return self.view(volume);
        }
        Ok(View {
            tx: self.read_tx()?,
            over: BTreeMap::new(),
        })
    }

    fn get<T: DeserializeOwned>(&self, def: StrTable, key: &str) -> Result<Option<T>, StoreError> {
        let view = self.view_of_table(def, Some(key))?;
        if let Some(v) = view.keyed(def, key) {
            return v.map(decode).transpose();
        }
        let Some(table) = open_table(&view.tx, def)? else {
            return Ok(None);
        };
        match table.get(key)? {
            Some(v) => Ok(Some(decode(v.value())?)),
            None => Ok(None),
        }
    }

    /// Every record of `def`, in key order.
    fn all<T: DeserializeOwned>(&self, def: StrTable) -> Result<Vec<T>, StoreError> {
        let view = self.view_of_table(def, None)?;
        let mut rows: BTreeMap<String, Vec<u8>> = BTreeMap::new();
        if let Some(table) = open_table(&view.tx, def)? {
            if view.over.is_empty() {
                return decode_all(&table);
            }
            for row in table.iter()? {
                let (k, v) = row?;
                rows.insert(k.value().to_string(), v.value().to_vec());
            }
        }
        for id in view.over.keys() {
            match view.keyed(def, id) {
                Some(Some(v)) => rows.insert(id.clone(), v.to_vec()),
                Some(None) => rows.remove(id),
                None => None,
            };
        }
        rows.values().map(|v| decode(v)).collect()
    }

    pub fn loop_volume(&self, id: &str) -> Result<Option<LoopVolume>, StoreError> {
        self.get(LOOP_VOLUMES, id)
    }

    /// Loop volumes in id order: the order ListVolumes pages through.
    pub fn loop_volumes(&self) -> Result<Vec<LoopVolume>, StoreError> {
        self.all(LOOP_VOLUMES)
    }

    pub fn loop_snapshot(&self, id: &str) -> Result<Option<LoopSnapshot>, StoreError> {
        self.get(LOOP_SNAPSHOTS, id)
    }

    /// Loop snapshots in id order: the order ListSnapshots pages through.
    pub fn loop_snapshots(&self) -> Result<Vec<LoopSnapshot>, StoreError> {
        self.all(LOOP_SNAPSHOTS)
    }

    pub fn format(&self, volume_id: &str) -> Result<Option<crate::FormatRecord>, StoreError> {
        self.get(FORMATS, volume_id)
    }

    /// Which volume id holds a device (`records::claim_key`).
    pub fn claim(&self, key: &str) -> Result<Option<crate::DeviceClaim>, StoreError> {
        self.get(crate::CLAIMS, key)
    }

    pub fn staged(&self, volume_id: &str) -> Result<Option<StagedVolume>, StoreError> {
        self.get(STAGED, volume_id)
    }

    pub fn all_staged(&self) -> Result<Vec<StagedVolume>, StoreError> {
        self.all(STAGED)
    }

    /// One volume's publications: a range scan over its keys, not a pass over every volume's.
    pub fn publications(&self, volume_id: &str) -> Result<Vec<Publication>, StoreError> {
        let view = self.view(Some(volume_id))?;
        view.publications(volume_id)?
            .values()
            .map(|v| decode(v))
            .collect()
    }

    pub fn publication(
        &self,
        volume_id: &str,
        target: &Path,
    ) -> Result<Option<Publication>, StoreError> {
        let key = path_key(target)?;
        let view = self.view(Some(volume_id))?;
        if let Some((_, v)) = view
            .over
            .get(volume_id)
            .and_then(|o| o.publications.get(key))
        {
            return v.as_deref().map(decode).transpose();
        }
        let Some(table) = open_table(&view.tx, PUBLICATIONS)? else {
            return Ok(None);
        };
        match table.get((volume_id, key))? {
            Some(v) => Ok(Some(decode(v.value())?)),
            None => Ok(None),
        }
    }

    pub fn all_publications(&self) -> Result<Vec<Publication>, StoreError> {
        let view = self.view(None)?;
        let mut rows: BTreeMap<(String, String), Vec<u8>> = BTreeMap::new();
        if let Some(table) = open_table(&view.tx, PUBLICATIONS)? {
            if view.over.is_empty() {
                return decode_all(&table);
            }
            for row in table.iter()? {
                let (k, v) = row?;
                let (volume, target) = k.value();
                rows.insert((volume.to_string(), target.to_string()), v.value().to_vec());
            }
        }
        for (id, o) in &view.over {
            for (target, (_, value)) in &o.publications {
                let key = (id.clone(), target.clone());
                match value {
                    Some(v) => rows.insert(key, v.clone()),
                    None => rows.remove(&key),
                };
            }
        }
        rows.values().map(|v| decode(v)).collect()
    }

    /// The journal of one volume, oldest first.
    pub fn journal(&self, volume_id: &str) -> Result<Vec<StepRecord>, StoreError> {
        let view = self.view(Some(volume_id))?;
        let mut out = Vec::new();
        if let Some(table) = open_table(&view.tx, JOURNAL)? {
            // Newest first, up to the kept length: lines past it wait for the next batch trim.
            for row in table
                .range((volume_id, 0)..=(volume_id, u64::MAX))?
                .rev()
                .take(JOURNAL_LINES_PER_VOLUME)
            {
                let (_, v) = row?;
                out.push(decode::<StepRecord>(v.value())?);
            }
        }
        out.reverse();
        // Lines still in the overlay follow, numbered as their commit will number them.
        if let Some(o) = view.over.get(volume_id) {
            let after = out.last().map_or(0, |l| l.seq);
            for (seq, (_, line)) in (after + 1..).zip(&o.steps) {
                out.push(StepRecord {
                    seq,
                    ..line.clone()
                });
            }
            let excess = out.len().saturating_sub(JOURNAL_LINES_PER_VOLUME);
            out.drain(..excess);
        }
        Ok(out)
    }

    /// Every volume id with a staging or a publication record, from the keys alone: a record
    /// that cannot be decoded still names its volume (start-up recovery marks that one volume).
    pub fn recorded_volume_ids(&self) -> Result<Vec<String>, StoreError> {
        let view = self.view(None)?;
        let mut ids = BTreeSet::new();
        view.ids_in(&[STAGED], false, &mut ids)?;
        view.settle_held(&mut ids, View::recorded)
    }

    /// Every volume id that has a journal, a format record, a staging or a publication.
    pub fn known_volume_ids(&self) -> Result<Vec<String>, StoreError> {
        let view = self.view(None)?;
        let mut ids = BTreeSet::new();
        view.ids_in(&[FORMATS, STAGED], true, &mut ids)?;
        view.settle_held(&mut ids, View::named)
    }

    /// Whether a record names the volume: a loop volume, a format fact, a staging, a publication
    /// or a journal line. A volume none names is unknown to this node.
    pub fn knows_volume(&self, id: &str) -> Result<bool, StoreError> {
        let view = self.view(Some(id))?;
        if let Some(t) = open_table(&view.tx, LOOP_VOLUMES)?
            && t.get(id)?.is_some()
        {
            return Ok(true);
        }
        view.named(id)
    }

    /// Whether a record other than journal lines names the volume (`bounds`).
    pub(crate) fn names_beyond_journal(view: &View, id: &str) -> Result<bool, StoreError> {
        Ok(view.has(LOOP_VOLUMES, id)? || view.has(FORMATS, id)? || view.recorded(id)?)
    }
}

/// Every record of a table, in key order, as redb holds them.
fn decode_all<K: redb::Key + 'static, T: DeserializeOwned>(
    table: &redb::ReadOnlyTable<K, &'static [u8]>,
) -> Result<Vec<T>, StoreError> {
    let mut out = Vec::new();
    for row in table.iter()? {
        out.push(decode(row?.1.value())?);
    }
    Ok(out)
}

/// The last ticket a committed batch recorded in `db`.
pub(crate) fn applied_ticket_of(db: &redb::Database) -> Result<u64, StoreError> {
    applied_ticket(&redb::ReadableDatabase::begin_read(db)?)
}

fn applied_ticket(tx: &redb::ReadTransaction) -> Result<u64, StoreError> {
    let Some(meta) = open_table(tx, META)? else {
        return Ok(0);
    };
    Ok(meta.get(APPLIED_TICKET)?.map_or(0, |v| v.value()))
}
