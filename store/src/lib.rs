//! The agent's durable state: a redb file holding loop-backend volumes, format facts, staged volumes,
//! publications and a per-volume step journal. It knows nothing of gRPC or mounts; its API is
//! blocking, so async callers wrap it in `spawn_blocking`.

mod bounds;
mod error;
mod live;
mod records;
mod writer;

use std::path::{Path, PathBuf};

use redb::{ReadableDatabase, ReadableTable, TableDefinition};
use serde::de::DeserializeOwned;

pub use error::StoreError;
pub use records::*;
mod group_commit;

#[cfg(feature = "test-hooks")]
pub use group_commit::bench_make_all_commits_lazy;
pub use writer::{Durability, Writer};

/// Bump when a record changes shape incompatibly; a file written by a newer agent is refused.
pub const SCHEMA_VERSION: u64 = 1;
/// How many journal lines each volume keeps: enough to explain the last few operations.
pub const JOURNAL_LINES_PER_VOLUME: usize = 48;
/// How many lines past that a volume's journal may grow before its oldest are trimmed at once.
pub(crate) const JOURNAL_TRIM_SLACK: usize = 16;

pub(crate) const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
pub(crate) const LOOP_VOLUMES: TableDefinition<&str, &[u8]> = TableDefinition::new("loop_volumes");
pub(crate) const LOOP_SNAPSHOTS: TableDefinition<&str, &[u8]> =
    TableDefinition::new("loop_snapshots");
pub(crate) const FORMATS: TableDefinition<&str, &[u8]> = TableDefinition::new("formats");
pub(crate) const STAGED: TableDefinition<&str, &[u8]> = TableDefinition::new("staged");
pub(crate) const PUBLICATIONS: TableDefinition<(&str, &str), &[u8]> =
    TableDefinition::new("publications");
pub(crate) const JOURNAL: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("journal");

enum Db {
    ReadWrite(live::LiveDb),
    ReadOnly(redb::ReadOnlyDatabase),
    /// A repaired private copy of a file a crashed agent left: readable, never written.
    RepairedCopy(redb::Database),
}

pub struct Store {
    db: Db,
    path: PathBuf,
    scratch_copy: Option<PathBuf>,
    group: group_commit::GroupCommit,
    /// Whether the last write to return was durable: the pipeline's unit tests ask it at each
    /// change to the host, to see the intent before it on disk.
    last_durable: std::sync::atomic::AtomicBool,
}

impl Drop for Store {
    fn drop(&mut self) {
        if let Some(copy) = self.scratch_copy.take() {
            let _ = std::fs::remove_file(copy);
        }
    }
}

impl Store {
    /// Opens (or creates) the state file for the one agent that owns it.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        // Checked only once redb refused the file: an agent that holds it never gets here.
        let db = match live::open_database(path) {
            Err(StoreError::Corrupt { .. }) if live::set_aside_if_cut_short(path)? => {
                live::open_database(path)?
            }
            opened => opened?,
        };
        let store = Store {
            db: Db::ReadWrite(live::LiveDb::new(path, db)),
            path: path.to_path_buf(),
            scratch_copy: None,
            group: Default::default(),
            last_durable: Default::default(),
        };
        store.check_or_init_schema()?;
        Ok(store)
    }

    /// Opens an existing state file for reading only (`status` while no agent runs).
    ///
    /// redb trusts the pages of a read-only open: a damaged page reaches an `unreachable!` or an
    /// out-of-bounds index (a panic, an abort in release builds) instead of an error. Only a
    /// checked open verifies every page's checksum, and a checked open writes, so it runs on a
    /// private copy first; the file itself is opened only once its bytes proved sound.
    pub fn open_read_only(path: &Path) -> Result<Self, StoreError> {
        if !path.exists() {
            return Err(StoreError::Missing(path.to_path_buf()));
        }
        if live::creation_cut_short(path) {
            return Err(StoreError::Unfinished(path.to_path_buf()));
        }
        let checked = Self::open_checked_copy(path)?;
        match redb::Database::builder().open_read_only(path) {
            Ok(db) => {
                let store = Store {
                    db: Db::ReadOnly(db),
                    path: path.to_path_buf(),
                    scratch_copy: None,
                    group: Default::default(),
                    last_durable: Default::default(),
                };
                store.check_schema_version()?;
                Ok(store)
            }
            // Left by a crashed agent: a read-only open cannot repair; the checked copy did.
            Err(redb::DatabaseError::RepairAborted) => {
                checked.check_schema_version()?;
                Ok(checked)
            }
            Err(e) => Err(StoreError::open(path, e)),
        }
    }

    /// A private copy, opened with every page checked (and repaired if a crash left it so). A
    /// copy taken while an agent commits can be torn: a few tries tell that from a damaged file.
    fn open_checked_copy(path: &Path) -> Result<Self, StoreError> {
        let mut tries = 0;
        loop {
            tries += 1;
            match Self::open_checked_copy_once(path) {
                Err(StoreError::Corrupt { .. }) if tries < 3 => {
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
                other => return other,
            }
        }
    }

    fn open_checked_copy_once(path: &Path) -> Result<Self, StoreError> {
        let copy = std::env::temp_dir().join(format!(
            "ebs-node-agent-state-{}-{}.redb",
            std::process::id(),
            now_unix_ms()
        ));
        live::private_copy(path, &copy).map_err(|e| {
            let _ = std::fs::remove_file(&copy);
            StoreError::Corrupt {
                path: path.to_path_buf(),
                detail: format!("cannot copy it for a read-only check: {e}"),
            }
        })?;
        let store = Store {
            db: Db::RepairedCopy(
                redb::Database::builder()
                    .set_check_integrity_on_open(true)
                    .create(&copy)
                    .map_err(|e| {
                        let _ = std::fs::remove_file(&copy);
                        StoreError::open(path, e)
                    })?,
            ),
            path: path.to_path_buf(),
            scratch_copy: Some(copy),
            group: Default::default(),
            last_durable: Default::default(),
        };
        Ok(store)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn check_or_init_schema(&self) -> Result<(), StoreError> {
        match self.schema_version()? {
            Some(_) => self.check_schema_version(),
            None => self.init_schema(),
        }
    }

    fn init_schema(&self) -> Result<(), StoreError> {
        let Db::ReadWrite(live) = &self.db else {
            return Err(StoreError::ReadOnly);
        };
        let tx = live.get()?.begin_write()?;
        writer::init_schema(&tx, SCHEMA_VERSION)?;
        tx.commit()?;
        Ok(())
    }

    fn check_schema_version(&self) -> Result<(), StoreError> {
        match self.schema_version()? {
            Some(v) if v > SCHEMA_VERSION => Err(StoreError::NewerSchema {
                path: self.path.clone(),
                found: v,
                supported: SCHEMA_VERSION,
            }),
            _ => Ok(()),
        }
    }

    pub fn schema_version(&self) -> Result<Option<u64>, StoreError> {
        let tx = self.read_tx()?;
        let Some(table) = open_table(&tx, META)? else {
            return Ok(None);
        };
        Ok(table.get("schema_version")?.map(|v| v.value()))
    }

    fn read_tx(&self) -> Result<redb::ReadTransaction, StoreError> {
        Ok(match &self.db {
            Db::ReadWrite(live) => live.get()?.begin_read()?,
            Db::ReadOnly(db) => db.begin_read()?,
            Db::RepairedCopy(db) => db.begin_read()?,
        })
    }

    /// Records the changes `f` makes and commits them as one unit, batched with other callers'
    /// (see `group_commit`). When this returns they are visible, and on disk if `Immediate`.
    pub fn write<T>(
        &self,
        durability: Durability,
        f: impl FnOnce(&mut Writer) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let Db::ReadWrite(live) = &self.db else {
            return Err(StoreError::ReadOnly);
        };
        let mut w = Writer::default();
        let out = f(&mut w)?;
        if !w.ops.is_empty() {
            let durable = durability == Durability::Immediate;
            self.commit(live, w.ops, durable)?;
            self.last_durable
                .store(durable, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(out)
    }

    /// Whether the last write to return was `Immediate` (so on disk with everything before it).
    pub fn last_write_durable(&self) -> bool {
        self.last_durable.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn get<T: DeserializeOwned>(
        &self,
        def: TableDefinition<&str, &[u8]>,
        key: &str,
    ) -> Result<Option<T>, StoreError> {
        let tx = self.read_tx()?;
        let Some(table) = open_table(&tx, def)? else {
            return Ok(None);
        };
        match table.get(key)? {
            Some(v) => Ok(Some(decode(v.value())?)),
            None => Ok(None),
        }
    }

    fn all<T: DeserializeOwned>(
        &self,
        def: TableDefinition<&str, &[u8]>,
    ) -> Result<Vec<T>, StoreError> {
        let tx = self.read_tx()?;
        let Some(table) = open_table(&tx, def)? else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for row in table.iter()? {
            let (_, v) = row?;
            out.push(decode(v.value())?);
        }
        Ok(out)
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

    pub fn format(&self, volume_id: &str) -> Result<Option<FormatRecord>, StoreError> {
        self.get(FORMATS, volume_id)
    }

    pub fn staged(&self, volume_id: &str) -> Result<Option<StagedVolume>, StoreError> {
        self.get(STAGED, volume_id)
    }

    pub fn all_staged(&self) -> Result<Vec<StagedVolume>, StoreError> {
        self.all(STAGED)
    }

    /// One volume's publications: a range scan over its keys, not a pass over every volume's.
    pub fn publications(&self, volume_id: &str) -> Result<Vec<Publication>, StoreError> {
        let tx = self.read_tx()?;
        let Some(table) = open_table(&tx, PUBLICATIONS)? else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for row in table.range((volume_id, "")..)? {
            let (key, value) = row?;
            if key.value().0 != volume_id {
                break;
            }
            out.push(decode(value.value())?);
        }
        Ok(out)
    }

    pub fn publication(
        &self,
        volume_id: &str,
        target: &Path,
    ) -> Result<Option<Publication>, StoreError> {
        let key = path_key(target)?;
        let tx = self.read_tx()?;
        let Some(table) = open_table(&tx, PUBLICATIONS)? else {
            return Ok(None);
        };
        match table.get((volume_id, key))? {
            Some(v) => Ok(Some(decode(v.value())?)),
            None => Ok(None),
        }
    }

    pub fn all_publications(&self) -> Result<Vec<Publication>, StoreError> {
        let tx = self.read_tx()?;
        let Some(table) = open_table(&tx, PUBLICATIONS)? else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for row in table.iter()? {
            let (_, v) = row?;
            out.push(decode(v.value())?);
        }
        Ok(out)
    }

    /// The journal of one volume, oldest first.
    pub fn journal(&self, volume_id: &str) -> Result<Vec<StepRecord>, StoreError> {
        let tx = self.read_tx()?;
        let Some(table) = open_table(&tx, JOURNAL)? else {
            return Ok(Vec::new());
        };
        // Newest first, up to the kept length: lines past it wait for the next batch trim.
        let mut out = Vec::new();
        for row in table
            .range((volume_id, 0)..=(volume_id, u64::MAX))?
            .rev()
            .take(JOURNAL_LINES_PER_VOLUME)
        {
            let (_, v) = row?;
            out.push(decode(v.value())?);
        }
        out.reverse();
        Ok(out)
    }

    /// Every volume id with a staging or a publication record, from the keys alone: a record
    /// that cannot be decoded still names its volume (start-up recovery marks that one volume).
    pub fn recorded_volume_ids(&self) -> Result<Vec<String>, StoreError> {
        let mut ids = std::collections::BTreeSet::new();
        let tx = self.read_tx()?;
        if let Some(t) = open_table(&tx, STAGED)? {
            for row in t.iter()? {
                ids.insert(row?.0.value().to_string());
            }
        }
        if let Some(t) = open_table(&tx, PUBLICATIONS)? {
            for row in t.iter()? {
                ids.insert(row?.0.value().0.to_string());
            }
        }
        Ok(ids.into_iter().collect())
    }

    /// Every volume id that has a journal, a format record, a staging or a publication.
    pub fn known_volume_ids(&self) -> Result<Vec<String>, StoreError> {
        let mut ids = std::collections::BTreeSet::new();
        let tx = self.read_tx()?;
        if let Ok(t) = tx.open_table(JOURNAL) {
            for row in t.iter()? {
                ids.insert(row?.0.value().0.to_string());
            }
        }
        for def in [FORMATS, STAGED] {
            if let Ok(t) = tx.open_table(def) {
                for row in t.iter()? {
                    ids.insert(row?.0.value().to_string());
                }
            }
        }
        if let Ok(t) = tx.open_table(PUBLICATIONS) {
            for row in t.iter()? {
                ids.insert(row?.0.value().0.to_string());
            }
        }
        Ok(ids.into_iter().collect())
    }
}

/// A table for reading; `None` when no write has created it yet (a fresh or older file).
fn open_table<K: redb::Key + 'static, V: redb::Value + 'static>(
    tx: &redb::ReadTransaction,
    def: TableDefinition<K, V>,
) -> Result<Option<redb::ReadOnlyTable<K, V>>, StoreError> {
    match tx.open_table(def) {
        Ok(t) => Ok(Some(t)),
        Err(redb::TableError::TableDoesNotExist(_)) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

pub(crate) fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, StoreError> {
    serde_json::from_slice(bytes).map_err(StoreError::Decode)
}

pub(crate) fn path_key(path: &Path) -> Result<&str, StoreError> {
    path.to_str()
        .ok_or_else(|| StoreError::NonUtf8Path(path.to_path_buf()))
}
