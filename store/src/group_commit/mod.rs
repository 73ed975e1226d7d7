//! Group commit by combining: callers hand their changes to a queue, and one of them (the leader)
//! applies everything queued in one write transaction. redb runs one write transaction at a time
//! and holds its writer lock through the fsync of a durable commit, so with one transaction per
//! caller, 16 volumes staging at once queued one by one behind each other's fsyncs. Here callers
//! only queue on a short mutex; the leader applies a whole batch at once, commits it without a
//! sync (the lazy callers return), then, if anyone in the batch needs it, makes it durable with one
//! fsync (the immediate callers return). Whoever arrives meanwhile forms the next batch, led by
//! one of them.
//!
//! The contract: a write is visible when `write` returns, on disk too if it was `Immediate`, and
//! in this boot's log (`boot_log`) whatever it was, where the log can take it; a `Boot` write the
//! log cannot take is made `Immediate`. redb makes a durable commit persist every non-durable
//! commit before it. Every write is appended to the log under the queue's lock as its ticket is
//! given, so the log holds the writes in ticket order.
//!
//! A lazy write of per-volume records does not wait at all: it is queued unattended and held in
//! the overlay (`overlay.rs`), where reads find it until its batch commits. The store's flusher
//! thread leads the batches that only such writes are in; any caller that leads takes them too.

use std::collections::BTreeMap;
#[cfg(feature = "test-hooks")]
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use crate::StoreError;
use crate::boot_log::BootLog;
use crate::overlay::{self, Overlay, VolumeOverlay};
use crate::writer::Op;

mod batch;
mod flusher;
#[cfg(test)]
mod tests;

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

/// How a write outlives what: `Lazy` the agent's crash when the boot log holds it, `Boot` the
/// agent's crash always (the log, or an fsync), `Durable` a power cut too (an fsync).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Level {
    Lazy,
    Boot,
    Durable,
}

/// How long the flusher lets held writes wait for a caller's batch before it commits them.
const RIDE_ALONG: Duration = Duration::from_millis(10);

#[derive(Default)]
pub(crate) struct GroupCommit {
    queue: Mutex<Queue>,
    /// An outcome is ready, or leadership is free.
    changed: Condvar,
    /// The flusher's: writes are queued that nobody waits for.
    unattended_queued: Condvar,
    /// Unit tests only: how many of the next batches fail as a failing disk's would.
    #[cfg(test)]
    fail_batches: std::sync::atomic::AtomicU32,
}

#[derive(Default)]
struct Queue {
    next_ticket: u64,
    waiting: Vec<Request>,
    /// Someone is applying a batch; the others wait for their outcome.
    leading: bool,
    /// Outcomes not yet collected by their callers, by ticket.
    outcomes: BTreeMap<u64, Outcome>,
    /// The batch being applied: its waited-for tickets (which fail if the leader panics) and
    /// its last ticket.
    in_flight: Vec<u64>,
    in_flight_last: u64,
    /// Lazy writes whose callers returned at once, readable here until their batch commits.
    overlay: Overlay,
    /// Per volume, how many waited-for requests that change its records are queued or being
    /// applied. A lazy write to such a volume is not held: held, it would read as applied
    /// before an older write that is not visible yet (a journal line shown under one number,
    /// then under the next once the older line lands before it).
    pending: BTreeMap<String, usize>,
    /// The volumes of the batch being applied, by its waited-for requests (for a panic).
    in_flight_volumes: Vec<String>,
    /// The store is closing: the flusher commits what is left and stops.
    closing: bool,
    /// This boot's log of every write (`boot_log`), when it can be kept.
    log: Option<BootLog>,
    /// The last ticket of the last batch applied without an error.
    applied_ok: u64,
}

impl Queue {
    /// Whether the boot log can take a `Boot` write without an fsync.
    fn log_has_room(&self) -> bool {
        self.log.as_ref().is_some_and(|l| !l.wants_durable())
    }

    /// Appends a write to the boot log; whether it is there.
    fn log(&mut self, ticket: u64, ops: &[Op]) -> bool {
        self.log.as_mut().is_some_and(|l| l.append(ticket, ops))
    }

    fn log_durable_through(&mut self, covered: u64) {
        if let Some(log) = self.log.as_mut() {
            log.durable_through(covered);
        }
    }

    /// How many queued requests nobody waits for (held in the overlay), counted, never kept:
    /// a count kept apart could drift from the queue on some error path and spin the flusher.
    fn unattended(&self) -> usize {
        self.waiting.iter().filter(|r| !r.attended).count()
    }

    fn pending_done(&mut self, volumes: &[String]) {
        for v in volumes {
            if let Some(n) = self.pending.get_mut(v) {
                *n -= 1;
                if *n == 0 {
                    self.pending.remove(v);
                }
            }
        }
    }
}

struct Request {
    ticket: u64,
    ops: Vec<Op>,
    durable: bool,
    /// Whether its caller waits for the outcome (every write but an overlay-held lazy one).
    attended: bool,
    /// For a waited-for request: the volumes it counts in `Queue::pending`.
    volumes: Vec<String>,
}

/// What one batch came to, for the live file's failure state.
/// A batch's outcome, one for all its waiters.
pub(crate) type Outcome = Result<(), Arc<StoreError>>;
pub(crate) type BatchOutcome = Option<Outcome>;

impl GroupCommit {
    /// Tickets continue after the last one a committed batch recorded in the file, so that an
    /// overlay entry is never taken for one that file already holds.
    pub(crate) fn continue_tickets_after(&self, applied: u64) {
        let mut q = self.lock();
        q.next_ticket = q.next_ticket.max(applied.saturating_add(1));
    }

    /// Runs `f` with the boot log while no write is queued or being applied, holding off any
    /// new one meanwhile; does nothing when one is.
    pub(crate) fn when_idle(
        &self,
        f: impl FnOnce(Option<&mut BootLog>) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let mut q = self.lock();
        if q.leading || !q.waiting.is_empty() {
            return Ok(());
        }
        f(q.log.as_mut())
    }

    /// From here on every write is appended to `log` (`boot_log`).
    pub(crate) fn attach_log(&self, log: BootLog) {
        self.lock().log = Some(log);
    }

    /// After the file was reopened (redb repaired it to its last durable commit): the writes
    /// of batches applied since, from the boot log, back in it with one durable commit.
    pub(crate) fn replay_after_reopen(&self, db: &redb::Database) -> Result<(), StoreError> {
        let q = self.lock();
        let Some(log) = q.log.as_ref() else {
            return Ok(());
        };
        let applied = crate::reads::applied_ticket_of(db)?;
        let writes = log.read_since(applied, q.applied_ok);
        drop(q);
        crate::replay::apply_durably(db, writes, &[])
    }

    /// A lazy write that needs no waiting: queued for the next batch and held in the overlay,
    /// so that it reads back at once. Hands the changes back when the overlay cannot hold them,
    /// or when a `Boot` write is not in the boot log.
    pub(crate) fn hold(&self, ops: Vec<Op>, level: Level) -> Result<(), Vec<Op>> {
        if !overlay::can_hold(&ops) {
            return Err(ops);
        }
        let volumes = overlay::volumes_of(&ops);
        let mut q = self.lock();
        let unattended = q.unattended();
        if q.closing
            || q.overlay.is_full()
            || unattended >= overlay::MAX_ENTRIES
            || volumes.iter().any(|v| q.pending.contains_key(v))
        {
            return Err(ops);
        }
        let ticket = q.next_ticket;
        // A `Boot` write the log cannot take is made durable by `commit`, under this ticket: it
        // is appended here only when it is held, so no ticket is ever logged twice.
        if level == Level::Boot && !q.log_has_room() {
            return Err(ops);
        }
        if !q.log(ticket, &ops) && level == Level::Boot {
            // The append failed and stopped the log: nothing more is appended, so the durable
            // commit takes this ticket again without a second frame.
            return Err(ops);
        }
        q.next_ticket += 1;
        q.overlay.hold(ticket, &ops);
        q.waiting.push(Request {
            ticket,
            ops,
            durable: false,
            attended: false,
            volumes: Vec::new(),
        });
        // The flusher wakes for the first one; it collects those that follow.
        if unattended == 0 && !q.leading {
            self.unattended_queued.notify_one();
        }
        Ok(())
    }

    /// Commits `ops` as one unit with others' changes; returns once they are visible and, if
    /// `durable`, on disk.
    pub(crate) fn commit(
        &self,
        db: &redb::Database,
        ops: Vec<Op>,
        level: Level,
    ) -> Result<(), StoreError> {
        let volumes = overlay::volumes_of(&ops);
        let mut q = self.lock();
        let ticket = q.next_ticket;
        q.next_ticket += 1;
        let room = q.log_has_room();
        let logged = q.log(ticket, &ops);
        let durable = durable_as_asked(match level {
            Level::Durable => true,
            Level::Boot => !(room && logged),
            Level::Lazy => false,
        });
        for v in &volumes {
            *q.pending.entry(v.clone()).or_default() += 1;
        }
        q.waiting.push(Request {
            ticket,
            ops,
            durable,
            attended: true,
            volumes,
        });
        loop {
            if let Some(outcome) = q.outcomes.remove(&ticket) {
                return outcome.map_err(StoreError::BatchFailed);
            }
            if !q.leading {
                q = self.lead(db, q).0;
                continue;
            }
            q = self
                .changed
                .wait(q)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
    }

    /// Takes the lead for one batch and gives it up again, waking whoever waits.
    fn lead<'a>(
        &'a self,
        db: &redb::Database,
        mut q: MutexGuard<'a, Queue>,
    ) -> (MutexGuard<'a, Queue>, BatchOutcome) {
        q.leading = true;
        let guard = batch::AbandonOnPanic(self);
        let (mut q, outcome) = self.lead_one_batch(db, q);
        std::mem::forget(guard);
        q.leading = false;
        self.changed.notify_all();
        if q.unattended() > 0 {
            self.unattended_queued.notify_one();
        }
        (q, outcome)
    }

    /// Tells the flusher to commit what is left and stop.
    pub(crate) fn close(&self) {
        self.lock().closing = true;
        self.unattended_queued.notify_all();
    }

    /// The lazy writes not yet in redb for one volume (`Some`) or all, taken before a read.
    pub(crate) fn overlay_of(&self, volume: Option<&str>) -> BTreeMap<String, VolumeOverlay> {
        let q = self.lock();
        if q.overlay.is_empty() {
            return BTreeMap::new();
        }
        match volume {
            Some(id) => q
                .overlay
                .volume(id)
                .map(|v| BTreeMap::from([(id.to_string(), v)]))
                .unwrap_or_default(),
            None => q.overlay.all(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
