//! One batch: applied in one transaction, made durable with one fsync if anyone in it needs
//! that, its outcome handed to every waiter, and its tickets told to the boot log.

use std::sync::{Arc, MutexGuard};

use super::{BatchOutcome, GroupCommit, Queue, Request};
use crate::overlay::APPLIED_TICKET;
use crate::writer::apply;
use crate::{META, StoreError};

impl GroupCommit {
    /// Applies everything waiting as one batch; returns with the queue locked again. The leader's
    /// own request is in the batch, so it then hands leadership to a waiter and returns: under a
    /// steady stream of writers no caller is kept leading for others.
    pub(super) fn lead_one_batch<'a>(
        &'a self,
        db: &redb::Database,
        mut q: MutexGuard<'a, Queue>,
    ) -> (MutexGuard<'a, Queue>, BatchOutcome) {
        if q.waiting.is_empty() {
            return (q, None);
        }
        let batch = std::mem::take(&mut q.waiting);
        let last = batch.iter().map(|r| r.ticket).max().unwrap_or_default();
        let volumes: Vec<String> = batch.iter().flat_map(|r| r.volumes.clone()).collect();
        // (ticket, wants durability) of each request whose caller waits.
        let tickets: Vec<(u64, bool)> = batch
            .iter()
            .filter(|r| r.attended)
            .map(|r| (r.ticket, r.durable))
            .collect();
        q.in_flight = tickets.iter().map(|&(t, _)| t).collect();
        q.in_flight_last = last;
        q.in_flight_volumes = volumes.clone();
        drop(q);
        let any_durable = tickets.iter().any(|&(_, d)| d);
        let all_durable = batch.iter().all(|r| r.durable);
        // A batch of immediate writes alone commits durably at once; a mixed one first
        // commits without a sync, so its lazy writers need not wait for the fsync.
        let applied = self
            .injected_failure()
            .and_then(|()| apply_batch(db, &batch, last, all_durable));
        q = self.lock();
        if applied.is_ok() {
            // Visible in redb now: the overlay no longer holds them.
            q.overlay.retire(last);
            q.applied_ok = last;
        } else {
            // Their callers were told OK and went on (a bind, an unstage's answer): they stay
            // held and readable, go first into the next batch, and their log frames stay whole.
            // Dropped, a held bind intent vanished while the agent ran, and a second publish of
            // a single-writer volume was let through (an eightieth fresh review's
            // F1). The waited-for ones' callers hear of the failure: a replay leaves
            // them out.
            let attended: Vec<u64> = tickets.iter().map(|&(t, _)| t).collect();
            if let Some(log) = q.log.as_mut() {
                log.void(&attended);
            }
            let held: Vec<Request> = batch.into_iter().filter(|r| !r.attended).collect();
            q.waiting.splice(0..0, held);
        }
        // No later lazy write to these volumes need wait for the waited-for ones.
        q.pending_done(&volumes);
        q.in_flight_volumes.clear();
        // The durable ones stay in flight through the sync below (a panic there fails them).
        q.in_flight = if applied.is_ok() && !all_durable && any_durable {
            tickets.iter().filter(|t| t.1).map(|t| t.0).collect()
        } else {
            Vec::new()
        };
        match applied {
            Err(e) => {
                let e = Arc::new(e);
                for (t, _) in tickets {
                    q.outcomes.insert(t, Err(Arc::clone(&e)));
                }
                return (q, Some(Err(e)));
            }
            Ok(()) if all_durable || !any_durable => {
                if all_durable {
                    q.log_durable_through(last);
                }
                for (t, _) in tickets {
                    q.outcomes.insert(t, Ok(()));
                }
                return (q, Some(Ok(())));
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
        let synced = sync(db).map_err(Arc::new);
        q = self.lock();
        q.in_flight.clear();
        if synced.is_ok() {
            q.log_durable_through(last);
        }
        for (t, durable) in tickets {
            if durable {
                q.outcomes.insert(t, synced.clone());
            }
        }
        (q, Some(synced))
    }
}

impl GroupCommit {
    /// A batch failure the unit tests asked for (never in another build).
    #[cfg(test)]
    fn injected_failure(&self) -> Result<(), StoreError> {
        use std::sync::atomic::Ordering;
        let take = |n: u32| n.checked_sub(1);
        match self
            .fail_batches
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, take)
        {
            Ok(_) => Err(StoreError::WriterPanicked),
            Err(_) => Ok(()),
        }
    }

    #[cfg(not(test))]
    fn injected_failure(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

/// If the leader unwinds (a bug in redb or here), its batch fails and another caller may lead,
/// instead of every waiter waiting forever.
pub(super) struct AbandonOnPanic<'a>(pub(super) &'a GroupCommit);

impl Drop for AbandonOnPanic<'_> {
    fn drop(&mut self) {
        let mut q = self.0.lock();
        for t in std::mem::take(&mut q.in_flight) {
            q.outcomes
                .insert(t, Err(Arc::new(StoreError::WriterPanicked)));
        }
        // The batch's unattended writes are lost with it, as in a crash.
        let last = q.in_flight_last;
        q.overlay.retire(last);
        let volumes = std::mem::take(&mut q.in_flight_volumes);
        q.pending_done(&volumes);
        q.leading = false;
        self.0.changed.notify_all();
        self.0.unattended_queued.notify_one();
    }
}

/// One transaction for the whole batch, which records its last ticket: a reader's snapshot
/// tells which overlay entries it already holds.
fn apply_batch(
    db: &redb::Database,
    batch: &[Request],
    last: u64,
    durable: bool,
) -> Result<(), StoreError> {
    let mut tx = db.begin_write()?;
    for request in batch {
        for op in &request.ops {
            apply(&tx, op)?;
        }
    }
    tx.open_table(META)?.insert(APPLIED_TICKET, last)?;
    tx.set_durability(if durable {
        redb::Durability::Immediate
    } else {
        redb::Durability::None
    })?;
    tx.commit()?;
    Ok(())
}

/// An empty durable commit: it persists every non-durable commit before it.
fn sync(db: &redb::Database) -> Result<(), StoreError> {
    let tx = db.begin_write()?;
    tx.commit()?;
    Ok(())
}
