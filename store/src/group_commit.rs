//! Group commit by combining: callers hand their changes to a queue, and one of them (the leader)
//! applies everything queued in one write transaction. redb runs one write transaction at a time
//! and holds its writer lock through the fsync of a durable commit, so with one transaction per
//! caller, 16 volumes staging at once queued one by one behind each other's fsyncs. Here callers
//! only queue on a short mutex; the leader applies a whole batch at once, commits it without a
//! sync (the lazy callers return), then, if anyone in the batch needs it, makes it durable with one
//! fsync (the immediate callers return). Whoever arrives meanwhile forms the next batch, led by
//! one of them.
//!
//! The contract is unchanged: a write is visible when `write` returns, and on disk too if it was
//! `Immediate`. redb makes a durable commit persist every non-durable commit before it.

use std::collections::BTreeMap;
#[cfg(feature = "test-hooks")]
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};

use crate::StoreError;
use crate::writer::{Op, apply};

/// Set only by the agent's hidden `--bench-lazy-journal` flag, so that the bench can show what
/// the journal's fsyncs cost. Compiled only with the `test-hooks` feature, which no release
/// build enables: it gives up crash safety.
#[cfg(feature = "test-hooks")]
static BENCH_LAZY: AtomicBool = AtomicBool::new(false);

/// Makes every commit lazy (no fsync) for the rest of the process: for the bench only.
#[cfg(feature = "test-hooks")]
pub fn bench_make_all_commits_lazy() {
    BENCH_LAZY.store(true, Ordering::Relaxed);
}

/// Whether a commit asked to be durable is made so: unless the bench turned fsyncs off.
#[cfg(feature = "test-hooks")]
fn durable_as_asked(durable: bool) -> bool {
    durable && !BENCH_LAZY.load(Ordering::Relaxed)
}

/// Whether a commit asked to be durable is made so: always.
#[cfg(not(feature = "test-hooks"))]
fn durable_as_asked(durable: bool) -> bool {
    durable
}

#[derive(Default)]
pub(crate) struct GroupCommit {
    queue: Mutex<Queue>,
    changed: Condvar,
}

#[derive(Default)]
struct Queue {
    next_ticket: u64,
    waiting: Vec<Request>,
    /// Someone is applying a batch; the others wait for their outcome.
    leading: bool,
    /// Outcomes not yet collected by their callers, by ticket.
    outcomes: BTreeMap<u64, Result<(), String>>,
    /// Tickets of the batch being applied, which fail if the leader panics.
    in_flight: Vec<u64>,
}

struct Request {
    ticket: u64,
    ops: Vec<Op>,
    durable: bool,
}

impl GroupCommit {
    /// Commits `ops` as one unit with others' changes; returns once they are visible and, if
    /// `durable`, on disk.
    pub(crate) fn commit(
        &self,
        db: &redb::Database,
        ops: Vec<Op>,
        durable: bool,
    ) -> Result<(), StoreError> {
        let durable = durable_as_asked(durable);
        let mut q = self.lock();
        let ticket = q.next_ticket;
        q.next_ticket += 1;
        q.waiting.push(Request {
            ticket,
            ops,
            durable,
        });
        loop {
            if let Some(outcome) = q.outcomes.remove(&ticket) {
                return outcome.map_err(StoreError::Internal);
            }
            if !q.leading {
                q.leading = true;
                let guard = AbandonOnPanic(self);
                q = self.lead_one_batch(db, q);
                std::mem::forget(guard);
                q.leading = false;
                self.changed.notify_all();
                continue;
            }
            q = self
                .changed
                .wait(q)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
    }

    /// Applies everything waiting as one batch; returns with the queue locked again. The leader's
    /// own request is in the batch, so it then hands leadership to a waiter and returns: under a
    /// steady stream of writers no caller is kept leading for others.
    fn lead_one_batch<'a>(
        &'a self,
        db: &redb::Database,
        mut q: MutexGuard<'a, Queue>,
    ) -> MutexGuard<'a, Queue> {
        if !q.waiting.is_empty() {
            let batch = std::mem::take(&mut q.waiting);
            // (ticket, wants durability) of each request in the batch.
            let tickets: Vec<(u64, bool)> = batch.iter().map(|r| (r.ticket, r.durable)).collect();
            q.in_flight = tickets.iter().map(|&(t, _)| t).collect();
            drop(q);
            let any_durable = tickets.iter().any(|&(_, d)| d);
            let all_durable = tickets.iter().all(|&(_, d)| d);
            // A batch of immediate writes alone commits durably at once; a mixed one first
            // commits without a sync, so its lazy writers need not wait for the fsync.
            let applied = apply_batch(db, batch, all_durable);
            q = self.lock();
            match applied {
                Err(e) => {
                    let msg = message(&e);
                    for (t, _) in tickets {
                        q.outcomes.insert(t, Err(msg.clone()));
                    }
                    return q;
                }
                Ok(()) if all_durable || !any_durable => {
                    for (t, _) in tickets {
                        q.outcomes.insert(t, Ok(()));
                    }
                    return q;
                }
                Ok(()) => {}
            }
            for (t, durable) in &tickets {
                if !durable {
                    q.outcomes.insert(*t, Ok(()));
                }
            }
            self.changed.notify_all();
            drop(q);
            let synced = sync(db).map_err(|e| message(&e));
            q = self.lock();
            for (t, durable) in tickets {
                if durable {
                    q.outcomes.insert(t, synced.clone());
                }
            }
        }
        q
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// If the leader unwinds (a bug in redb or here), its batch fails and another caller may lead,
/// instead of every waiter waiting forever.
struct AbandonOnPanic<'a>(&'a GroupCommit);

impl Drop for AbandonOnPanic<'_> {
    fn drop(&mut self) {
        let mut q = self.0.lock();
        for t in std::mem::take(&mut q.in_flight) {
            q.outcomes
                .insert(t, Err("the state-file writer panicked".into()));
        }
        q.leading = false;
        self.0.changed.notify_all();
    }
}

/// An error's text without the "state store error" prefix, which the caller's error adds again.
fn message(e: &StoreError) -> String {
    match e {
        StoreError::Internal(m) => m.clone(),
        other => other.to_string(),
    }
}

/// One transaction for the whole batch.
fn apply_batch(db: &redb::Database, batch: Vec<Request>, durable: bool) -> Result<(), StoreError> {
    let mut tx = db.begin_write()?;
    for request in batch {
        for op in request.ops {
            apply(&tx, op)?;
        }
    }
    tx.set_durability(if durable {
        redb::Durability::Immediate
    } else {
        redb::Durability::None
    })
    .map_err(|e| StoreError::Internal(e.to_string()))?;
    tx.commit()?;
    Ok(())
}

/// An empty durable commit: it persists every non-durable commit before it.
fn sync(db: &redb::Database) -> Result<(), StoreError> {
    let tx = db.begin_write()?;
    tx.commit()?;
    Ok(())
}
