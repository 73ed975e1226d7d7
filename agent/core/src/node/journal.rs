//! Write-ahead steps: every host mutation is recorded as an intent before it starts and as done
//! after it finishes. The journal explains what happened; resume decisions read the records it
//! commits together with the step (format fact, staged volume, publication) and the host itself.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use super::{NodeCtx, Observer, lock};
use crate::error::Result;
use crate::ledger::{Ledger, LedgerResult, LedgerWriter};
use crate::records::{Durability, Phase};
use crate::request::VolumeId;
use crate::steps::{Op, Step};

/// Extra facts for one journal line (device, UUID, paths, options).
pub type Detail = BTreeMap<String, String>;

pub fn detail<const N: usize>(pairs: [(&str, String); N]) -> Detail {
    pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

/// The journal of one operation on one volume.
pub struct Journal<'a> {
    ledger: &'a dyn Ledger,
    volume: &'a VolumeId,
    op: Op,
    observer: &'a dyn Observer,
    /// When each open step's intent was committed, for the step-duration metric.
    intents: Mutex<BTreeMap<Step, Instant>>,
    /// Lazy lines not yet written: they ride along with the next commit of this operation, or
    /// are written when it ends. A lazy line is lost in a crash either way (the store, the real
    /// ledger, keeps lazy commits in memory until a durable one), so holding it here changes
    /// nothing about what survives; it only saves a write per line, and the store's writes queue
    /// behind whichever fsync is in flight.
    pending: Mutex<Vec<(Step, Phase, Detail)>>,
    /// Whether this operation committed anything yet.
    committed: AtomicBool,
}

impl<'a> Journal<'a> {
    pub fn new(ctx: &'a NodeCtx, volume: &'a VolumeId, op: Op) -> Self {
        Journal {
            ledger: &*ctx.ledger,
            volume,
            op,
            observer: &*ctx.observer,
            intents: Default::default(),
            pending: Default::default(),
            committed: AtomicBool::new(false),
        }
    }

    pub fn volume(&self) -> &VolumeId {
        self.volume
    }

    /// Holds a lazy line with no record attached until the next commit or the end of the
    /// operation.
    pub fn note(&self, step: Step, phase: Phase, detail: Detail) {
        lock(&self.pending).push((step, phase, detail));
        self.observe_step(step, phase);
        self.report_reached(step, phase);
    }

    /// Commits a journal line, plus any records `also` writes, in one transaction.
    pub fn record(
        &self,
        step: Step,
        phase: Phase,
        detail: Detail,
        durability: Durability,
        also: impl FnOnce(&mut dyn LedgerWriter) -> LedgerResult<()>,
    ) -> Result<()> {
        let commit = Instant::now();
        self.ledger.write(
            durability,
            Box::new(|w| {
                self.write_pending(w)?;
                also(w)?;
                self.line(w, step, phase, detail)
            }),
        )?;
        self.committed.store(true, Ordering::Relaxed);
        self.observer.journal_commit(durability, commit.elapsed());
        self.observe_step(step, phase);
        self.report_reached(step, phase);
        Ok(())
    }

    /// Runs one step between an intent and a done line. A failure is journaled too.
    pub fn step<T>(
        &self,
        step: Step,
        detail: Detail,
        durability: Durability,
        f: impl FnOnce() -> Result<T>,
    ) -> Result<T> {
        match durability {
            Durability::Immediate | Durability::Boot => {
                self.record(step, Phase::Intent, detail.clone(), durability, |_| Ok(()))?
            }
            Durability::Lazy => self.note(step, Phase::Intent, detail.clone()),
        }
        let started = Instant::now();
        match f() {
            Ok(v) => {
                let mut done = detail;
                done.insert("ms".into(), started.elapsed().as_millis().to_string());
                self.note(step, Phase::Done, done);
                Ok(v)
            }
            Err(e) => {
                let mut failed = detail;
                failed.insert("error".into(), e.to_string());
                self.note(step, Phase::Failed, failed);
                Err(e)
            }
        }
    }

    /// Moves the lines held so far into `w`.
    fn write_pending(&self, w: &mut dyn LedgerWriter) -> LedgerResult<()> {
        for (step, phase, detail) in std::mem::take(&mut *lock(&self.pending)) {
            self.line(w, step, phase, detail)?;
        }
        Ok(())
    }

    /// One line of this operation into `w`.
    fn line(
        &self,
        w: &mut dyn LedgerWriter,
        step: Step,
        phase: Phase,
        detail: Detail,
    ) -> LedgerResult<()> {
        w.step(
            self.volume.as_str(),
            self.op.name(),
            step.name(),
            phase,
            detail,
        )
    }

    fn observe_step(&self, step: Step, phase: Phase) {
        let mut intents = lock(&self.intents);
        match phase {
            Phase::Intent => {
                intents.insert(step, Instant::now());
            }
            Phase::Done | Phase::Failed => {
                if let Some(started) = intents.remove(&step) {
                    let ok = matches!(phase, Phase::Done);
                    self.observer.step(self.op, step, ok, started.elapsed());
                }
            }
        }
    }

    /// Tells the observer this line was reached: the daemon's crash matrix kills the agent here
    /// in a `test-hooks` build; otherwise nothing happens.
    fn report_reached(&self, step: Step, phase: Phase) {
        self.observer.reached(self.op, step, phase);
    }
}

impl Drop for Journal<'_> {
    /// Writes the lines still held, lazily and best effort: they explain, nothing resumes from
    /// them. Not those of a call that only looked, on a volume nothing here names.
    fn drop(&mut self) {
        if lock(&self.pending).is_empty() || self.only_looked_at_an_unknown_volume() {
            return;
        }
        let result = self
            .ledger
            .write(Durability::Lazy, Box::new(|w| self.write_pending(w)));
        if let Err(e) = result {
            tracing::warn!(volume = %self.volume, op = self.op.name(), error = %e, "journal lines not written");
        }
    }
}

impl Journal<'_> {
    /// Steps that only look at the host (find the volume's device, prove it is the volume's): a
    /// call that ended in them changed nothing there, so its lines are kept only for a volume
    /// the node knows. Otherwise every id a CO (or anyone on the socket) names would leave its
    /// lines for good: 2000 stages of unknown ids took the state file from 73 KB to 4.4 MB.
    fn only_looked_at_an_unknown_volume(&self) -> bool {
        !self.committed.load(Ordering::Relaxed)
            && lock(&self.pending)
                .iter()
                .all(|(step, _, _)| Step::LOOKING.contains(step))
            && matches!(self.ledger.knows_volume(self.volume.as_str()), Ok(false))
    }
}
