//! The agent's own, writable state file, able to come back after a failed commit.
//!
//! redb refuses every later transaction once a commit failed on I/O (a full disk: "Previous I/O
//! error occurred. Please close and re-open the database"). A node plugin cannot wait for a
//! restart to write again: the failure is remembered (Probe reports it), and the next read or
//! write reopens the file, which makes redb repair it back to its last durable commit; the writes
//! of the batches applied since come back from the boot log (`boot_log`), as at a start after a
//! crash.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, RwLock, RwLockReadGuard};

use crate::StoreError;
use crate::group_commit::Level;

pub(crate) struct LiveDb {
    path: PathBuf,
    db: RwLock<Option<redb::Database>>,
    needs_reopen: AtomicBool,
    /// How many times the file was reopened after a failed commit (each may have lost lazy
    /// records committed since the last durable one).
    reopens: AtomicU64,
    /// Why the last commit failed, until one succeeds again.
    failure: Mutex<Option<String>>,
    /// Its boot log replays what a reopen loses.
    group: std::sync::Arc<crate::group_commit::GroupCommit>,
}

/// Opens the state file, creating it first when there is none (see `creation`). A file at its
/// name that is empty or has no header is refused; one an older agent's first start left
/// unfinished is set aside and made again.
pub(crate) fn open_or_create(path: &Path) -> Result<redb::Database, StoreError> {
    use crate::creation::{self, Shape};
    let missing =
        std::fs::symlink_metadata(path).is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound);
    if missing {
        creation::create_whole(path)?;
    } else {
        match creation::shape(path) {
            Shape::CreationCutShort => {
                creation::set_aside(path, path)?;
                creation::create_whole(path)?;
            }
            shape => {
                if let Some(refused) = creation::refusal(path, &shape) {
                    return Err(refused);
                }
                creation::tidy_creating(path)?;
            }
        }
    }
    open_database(path)
}

/// Opens the existing file: never `create`, which would take an emptied file for a new one.
pub(crate) fn open_database(path: &Path) -> Result<redb::Database, StoreError> {
    redb::Database::builder()
        .set_check_integrity_on_open(true)
        .open(path)
        .map_err(|e| StoreError::open(path, e))
}

impl LiveDb {
    pub(crate) fn new(
        path: &Path,
        db: redb::Database,
        group: std::sync::Arc<crate::group_commit::GroupCommit>,
    ) -> Self {
        LiveDb {
            path: path.to_path_buf(),
            db: RwLock::new(Some(db)),
            needs_reopen: AtomicBool::new(false),
            reopens: AtomicU64::new(0),
            failure: Mutex::new(None),
            group,
        }
    }

    /// The database, reopened first if a commit failed since it was last opened.
    pub(crate) fn get(&self) -> Result<DbGuard<'_>, StoreError> {
        if self.needs_reopen.load(Ordering::Acquire) {
            self.reopen();
        }
        let guard = self.db.read().unwrap_or_else(|p| p.into_inner());
        if guard.is_none() {
            return Err(StoreError::NotReopened {
                path: self.path.clone(),
                detail: self.failure().unwrap_or_default(),
            });
        }
        Ok(DbGuard(guard))
    }

    fn reopen(&self) {
        let mut slot = self.db.write().unwrap_or_else(|p| p.into_inner());
        if !self.needs_reopen.load(Ordering::Acquire) {
            return;
        }
        // The old handle goes first: it holds the file's lock.
        *slot = None;
        // What the batches applied since its last durable commit wrote comes back from the
        // boot log, as at a start after a crash; until it does, the file stays closed.
        let reopened = open_database(&self.path)
            .and_then(|db| self.group.replay_after_reopen(&db).map(|()| db));
        match reopened {
            Ok(db) => {
                *slot = Some(db);
                self.needs_reopen.store(false, Ordering::Release);
                self.reopens.fetch_add(1, Ordering::AcqRel);
                tracing::warn!(path = %self.path.display(), "state file reopened after a failed commit");
            }
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "state file not reopened yet");
            }
        }
    }

    /// Called with every commit's outcome.
    pub(crate) fn committed<E: std::fmt::Display>(&self, outcome: &Result<(), E>) {
        let mut failure = self.failure.lock().unwrap_or_else(|p| p.into_inner());
        match outcome {
            Ok(()) => {
                if failure.take().is_some() {
                    tracing::info!(path = %self.path.display(), "state file writable again");
                }
            }
            Err(e) => {
                *failure = Some(e.to_string());
                self.needs_reopen.store(true, Ordering::Release);
            }
        }
    }

    /// A commit failed and none succeeded since, or the file waits to be reopened.
    pub(crate) fn failing(&self) -> bool {
        self.needs_reopen.load(Ordering::Acquire) || self.failure().is_some()
    }

    pub(crate) fn failure(&self) -> Option<String> {
        self.failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// Commits through the live file, remembering a failure until a commit succeeds again.
impl crate::Store {
    pub(crate) fn commit(
        &self,
        live: &LiveDb,
        ops: Vec<crate::writer::Op>,
        level: Level,
    ) -> Result<(), StoreError> {
        // A lazy write nobody needs to wait for returns at once; the flusher commits it. Not
        // while the file is failing: then the write commits here and its caller hears why not.
        let ops = if level == Level::Durable || live.failing() {
            ops
        } else {
            match self.group.hold(ops, level) {
                Ok(()) => return Ok(()),
                Err(ops) => ops,
            }
        };
        let db = live.get()?;
        let outcome = self.group.commit(&db, ops, level);
        live.committed(&outcome);
        outcome
    }

    /// Makes every commit so far durable, the lazy ones included (one empty durable commit,
    /// batched like any other). The agent calls it when it stops, so a clean stop leaves no
    /// record for start-up recovery to complete.
    pub fn sync(&self) -> Result<(), StoreError> {
        let crate::Db::ReadWrite(live) = &self.db else {
            return Err(StoreError::ReadOnly);
        };
        self.commit(live, Vec::new(), Level::Durable)
    }

    /// How many times the file was reopened after a failed commit. Each reopen goes back to the
    /// last durable commit: lazy records since then are lost, as in a crash, so the agent checks
    /// its volumes against the host again, as start-up does.
    pub fn reopens(&self) -> u64 {
        match &self.db {
            crate::Db::ReadWrite(live) => live.reopens.load(Ordering::Acquire),
            _ => 0,
        }
    }

    /// Why the last commit failed, while no commit has succeeded since (a full or failing
    /// state disk): the agent reports it as not ready.
    pub fn write_failure(&self) -> Option<String> {
        match &self.db {
            crate::Db::ReadWrite(live) => live.failure(),
            _ => None,
        }
    }

    /// After a failed commit: reopens the file and tries an empty durable commit, so the failure
    /// clears as soon as the disk has room again, even if no call comes.
    pub fn try_heal(&self) -> Result<(), StoreError> {
        let crate::Db::ReadWrite(live) = &self.db else {
            return Err(StoreError::ReadOnly);
        };
        self.commit(live, Vec::new(), Level::Durable)
    }
}

pub(crate) struct DbGuard<'a>(RwLockReadGuard<'a, Option<redb::Database>>);

impl std::ops::Deref for DbGuard<'_> {
    type Target = redb::Database;

    fn deref(&self) -> &redb::Database {
        self.0.as_ref().expect("checked in LiveDb::get")
    }
}
