//! The agent's durable state: a redb file holding loop-backend volumes, format facts, staged volumes,
//! publications and a per-volume step journal. It knows nothing of gRPC or mounts; its API is
//! blocking, so async callers wrap it in `spawn_blocking`.

mod boot_log;
mod bounds;
mod checked_read;
mod creation;
mod error;
mod live;
mod overlay;
mod reads;
mod replay;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use redb::{ReadableDatabase, TableDefinition};
use serde::de::DeserializeOwned;

use ebs_node_core::records::*;
pub use error::StoreError;
mod group_commit;
mod ledger;

#[cfg(feature = "test-hooks")]
pub use group_commit::bench_make_all_commits_lazy;
pub use writer::Writer;

/// Bump when a record changes shape incompatibly; a file written by a newer agent is refused.
/// 2: the file needs its boot log (an agent runs on it, or was killed): an agent older than the
/// log refuses it, as it must, since it would read the file without the log's writes.
pub const SCHEMA_VERSION: u64 = 2;
/// What a cleanly stopped agent leaves: the records' shape is the same as in 1, and nothing is
/// in the log, so an older agent may read the file.
pub const SCHEMA_AT_REST: u64 = 1;
/// How many journal lines each volume keeps: enough to explain the last few operations.
pub const JOURNAL_LINES_PER_VOLUME: usize = 48;
/// How many lines past that a volume's journal may grow before its oldest are trimmed at once.
pub(crate) const JOURNAL_TRIM_SLACK: usize = 16;

pub(crate) const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
pub(crate) const LOOP_VOLUMES: TableDefinition<&str, &[u8]> = TableDefinition::new("loop_volumes");
pub(crate) const LOOP_SNAPSHOTS: TableDefinition<&str, &[u8]> =
    TableDefinition::new("loop_snapshots");
pub(crate) const FORMATS: TableDefinition<&str, &[u8]> = TableDefinition::new("formats");
/// Which volume id holds each device, by door and identity (`records::claim_key`). Never held
/// in the overlay: a claim is written with a durable intent, or waits for its commit.
pub(crate) const CLAIMS: TableDefinition<&str, &[u8]> = TableDefinition::new("device_claims");
pub(crate) const STAGED: TableDefinition<&str, &[u8]> = TableDefinition::new("staged");
pub(crate) const PUBLICATIONS: TableDefinition<(&str, &str), &[u8]> =
    TableDefinition::new("publications");
pub(crate) const JOURNAL: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("journal");

enum Db {
    ReadWrite(Arc<live::LiveDb>),
    /// A checked private copy's bytes under the file's own locks (`checked_read`).
    ReadOnly(redb::ReadOnlyDatabase),
}

/// The read-only locks of a state file, held (`Store::hold_locks`): no agent starts on the file
/// while this lives.
pub struct LockHeld {
    _reader: redb::ReadOnlyDatabase,
}

impl std::fmt::Debug for LockHeld {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LockHeld")
    }
}

pub struct Store {
    db: Db,
    path: PathBuf,
    group: Arc<group_commit::GroupCommit>,
    /// Commits the lazy writes nobody waits for (`overlay`); only for the live file.
    flusher: Option<std::thread::JoinHandle<()>>,
    /// Whether the last write to return was durable: the pipeline's unit tests ask it at each
    /// change to the host, to see the intent before it on disk.
    last_durable: std::sync::atomic::AtomicBool,
}

impl Drop for Store {
    fn drop(&mut self) {
        // The lazy writes still held are committed before the file is closed, as a lazy
        // commit was before: what a clean drop leaves is what it left.
        self.group.close();
        if let Some(flusher) = self.flusher.take() {
            let _ = flusher.join();
        }
    }
}

impl Store {
    /// Opens (or creates) the state file for the one agent that owns it.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let db = live::open_or_create(path)?;
        let group: Arc<group_commit::GroupCommit> = Default::default();
        let live = Arc::new(live::LiveDb::new(path, db, group.clone()));
        let mut store = Store {
            db: Db::ReadWrite(live.clone()),
            path: path.to_path_buf(),
            group: group.clone(),
            flusher: None,
            last_durable: Default::default(),
        };
        store.check_or_init_schema()?;
        let applied = store.start_boot_log(&*live.get()?)?;
        store.group.continue_tickets_after(applied);
        let flusher = std::thread::Builder::new()
            .name("state-flusher".into())
            .spawn(move || {
                group.flush_unattended(|| live.get(), |outcome| live.committed(outcome));
            })
            .map_err(StoreError::Flusher)?;
        store.flusher = Some(flusher);
        Ok(store)
    }

    /// Opens an existing state file for reading only (`status` while no agent runs).
    ///
    /// redb trusts the pages of a read-only open: a damaged page reaches an `unreachable!` or an
    /// out-of-bounds index (a panic, an abort in release builds) instead of an error. Only a
    /// checked open verifies every page's checksum, and a checked open writes, so it runs on a
    /// private copy in memory; the reader then reads that copy's bytes, holding the file's own
    /// locks, taken before anything of the file is read (`checked_read`).
    pub fn open_read_only(path: &Path) -> Result<Self, StoreError> {
        let _locks = Self::hold_locks(path)?;
        match creation::shape(path) {
            creation::Shape::CreationCutShort => {
                return Err(StoreError::Unfinished(path.to_path_buf()));
            }
            shape => {
                if let Some(refused) = creation::refusal(path, &shape) {
                    return Err(refused);
                }
            }
        }
        let corrupt = |detail: String| StoreError::Corrupt {
            path: path.to_path_buf(),
            detail,
        };
        let copy = Self::copy_in_memory(path)
            .map_err(|e| corrupt(format!("cannot copy it for a read-only check: {e}")))?;
        checked_read::check(&copy).map_err(|e| StoreError::open(path, e))?;
        let db = checked_read::CheckedRead::new(path, copy)
            .and_then(|backend| redb::Database::builder().open_read_only_with_backend(backend))
            .map_err(|e| StoreError::open(path, e))?;
        let store = Store {
            db: Db::ReadOnly(db),
            path: path.to_path_buf(),
            group: Default::default(),
            flusher: None,
            last_durable: Default::default(),
        };
        store.check_schema_version()?;
        Ok(store)
    }

    /// Proves no agent holds the state file at `path`, and keeps it so while the answer lives
    /// (an agent's start is refused meanwhile): `Locked` while one does; any other error means
    /// it could not be told, which `recover` takes as a refusal too.
    pub fn hold_locks(path: &Path) -> Result<LockHeld, StoreError> {
        if !path.exists() {
            return Err(StoreError::Missing(path.to_path_buf()));
        }
        checked_read::hold_locks(path)
            .map(|reader| LockHeld { _reader: reader })
            .map_err(|e| StoreError::open(path, e))
    }

    /// The file's bytes in an anonymous memory file, if it is a regular file of a state file's
    /// size at most.
    fn copy_in_memory(path: &Path) -> std::io::Result<std::fs::File> {
        let mut from = creation::open_regular(path)?.map_err(std::io::Error::other)?;
        let mut copy = checked_read::anonymous("ebs-node-agent-state-copy")?;
        let limit = creation::MAX_STATE_BYTES + 1;
        let copied = std::io::copy(&mut std::io::Read::take(&mut from, limit), &mut copy)?;
        if copied >= limit {
            return Err(std::io::Error::other("it grew past any state file's size"));
        }
        Ok(copy)
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
        })
    }

    /// Records the changes `f` makes and commits them as one unit, batched with other callers'
    /// (see `group_commit`). When this returns they are visible, and on disk if `Immediate`.
    pub fn write<T>(
        &self,
        durability: Durability,
        f: impl FnOnce(&mut Writer) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.write_with(durability, f)
    }

    /// `write` for a caller whose changes fail with its own error type (the core's ledger): an
    /// error of `f` commits nothing and is returned as it is.
    pub fn write_with<T, E: From<StoreError>>(
        &self,
        durability: Durability,
        f: impl FnOnce(&mut Writer) -> Result<T, E>,
    ) -> Result<T, E> {
        let Db::ReadWrite(live) = &self.db else {
            return Err(StoreError::ReadOnly.into());
        };
        let mut w = Writer::default();
        let out = f(&mut w)?;
        if !w.ops.is_empty() {
            let level = match durability {
                Durability::Immediate => group_commit::Level::Durable,
                Durability::Boot => group_commit::Level::Boot,
                Durability::Lazy => group_commit::Level::Lazy,
            };
            self.commit(live, w.ops, level)?;
            self.last_durable.store(
                level != group_commit::Level::Lazy,
                std::sync::atomic::Ordering::Relaxed,
            );
        }
        Ok(out)
    }

    /// Whether the last write to return outlives the agent's crash (`Immediate`, on disk with
    /// everything before it, or `Boot`).
    pub fn last_write_durable(&self) -> bool {
        self.last_durable.load(std::sync::atomic::Ordering::Relaxed)
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
