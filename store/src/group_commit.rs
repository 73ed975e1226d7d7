//! Group commit: concurrent `Durability::Immediate` writers share fsyncs. Each write commits
//! without a sync and takes a sequence number; it then returns only once a durable commit that
//! began after it has finished. While one durable commit is in flight, the writers arriving
//! behind it queue on one lock, and the next durable commit covers all of them. The contract of
//! `Immediate` is unchanged (on disk when the call returns); only the number of fsyncs drops,
//! from one per write to one per burst. redb makes a durable commit persist every non-durable
//! commit before it.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::StoreError;

/// Set only by the agent's hidden `--bench-lazy-journal` flag, so that the bench can show what
/// the journal's fsyncs cost. Never set in production: it gives up crash safety.
static BENCH_LAZY: AtomicBool = AtomicBool::new(false);

/// Makes every commit lazy (no fsync) for the rest of the process: for the bench only.
pub fn bench_make_all_commits_lazy() {
    BENCH_LAZY.store(true, Ordering::Relaxed);
}

#[derive(Default)]
pub(crate) struct GroupCommit {
    /// Sequence number of the last commit, taken inside its write transaction (redb runs one
    /// write transaction at a time, so numbers follow commit order).
    committed: AtomicU64,
    /// Every commit up to this number is durable.
    durable: Mutex<u64>,
    /// Writers between the start of their transaction and their return.
    writers: AtomicU64,
}

/// How one write transaction commits.
pub(crate) enum Plan<'a> {
    /// Nobody else is writing or syncing: commit durably in the transaction itself (one commit,
    /// one sync); holding the guard marks the sync in progress.
    Alone(std::sync::MutexGuard<'a, u64>),
    /// Others are about: commit without a sync, then join (or lead) the next group sync.
    Grouped,
}

/// Counts a writer in for the duration of its `write` call.
pub(crate) struct WriterSlot<'a>(&'a AtomicU64);

impl Drop for WriterSlot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl GroupCommit {
    pub(crate) fn enter(&self) -> WriterSlot<'_> {
        self.writers.fetch_add(1, Ordering::SeqCst);
        WriterSlot(&self.writers)
    }

    /// Called inside the write transaction of an immediate write. Never blocks: a writer holding
    /// redb's write lock must not wait for the sync lock, whose holder may wait for redb's.
    pub(crate) fn plan(&self) -> Plan<'_> {
        if BENCH_LAZY.load(Ordering::Relaxed) || self.writers.load(Ordering::SeqCst) > 1 {
            return Plan::Grouped;
        }
        match self.durable.try_lock() {
            Ok(guard) => Plan::Alone(guard),
            Err(_) => Plan::Grouped,
        }
    }

    /// Called inside a write transaction, just before its commit.
    pub(crate) fn next(&self) -> u64 {
        self.committed.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// Returns once commit `seq` is durable, running a durable commit if no one else has.
    pub(crate) fn make_durable(&self, db: &redb::Database, seq: u64) -> Result<(), StoreError> {
        if BENCH_LAZY.load(Ordering::Relaxed) {
            return Ok(());
        }
        let mut durable = self
            .durable
            .lock()
            .map_err(|_| StoreError::Internal("group commit lock poisoned".into()))?;
        if *durable >= seq {
            return Ok(());
        }
        // Inside this transaction no other writer runs: everything numbered so far has committed
        // (or failed, and its caller saw the error), so this sync covers it all.
        let tx = db.begin_write()?;
        let upto = self.committed.load(Ordering::SeqCst);
        tx.commit()?;
        *durable = upto;
        Ok(())
    }
}
