//! Lazy writes that have not reached redb yet, readable at once.
//!
//! A lazy write (a call's closing journal lines, its staged or publication record) needs no fsync,
//! but under load it still waited for redb's one writer lock, which a durable commit holds
//! through its fsync: 5.8–6.5 ms per call at concurrency 16 (docs/performance.md). Now such a
//! write is queued for the next batch and kept here until that batch is committed, and every read
//! lays these entries over redb's snapshot, so the caller reads its own write as before and
//! returns without waiting.
//!
//! Holding a write here changes nothing a crash keeps: the boot log (`boot_log`) has it from the
//! moment it is queued, and a durable commit still carries every lazy write queued before it (one
//! queue, in order).
//!
//! A read must not apply an entry twice or miss one: entries leave the overlay only after their
//! batch is visible, and each batch records its last ticket in redb (`META.applied_ticket`), so a
//! reader takes the overlay first, then redb's snapshot, and applies only entries newer than the
//! ticket that snapshot holds.

use std::collections::BTreeMap;

use redb::TableHandle;

use crate::writer::Op;
use crate::{FORMATS, STAGED, StepRecord};

/// The key of the last ticket a committed batch holds.
pub(crate) const APPLIED_TICKET: &str = "applied_ticket";

/// Beyond this many entries a lazy writer waits for its commit as before: memory stays bounded
/// whatever the disk's speed.
pub(crate) const MAX_ENTRIES: usize = 8192;

/// One record's newest lazy value: `None` for a delete.
pub(crate) type Entry = (u64, Option<Vec<u8>>);

/// The lazy changes to one volume's records not yet in redb, each with its write's ticket.
#[derive(Clone, Default, Debug)]
pub(crate) struct VolumeOverlay {
    pub(crate) format: Option<Entry>,
    pub(crate) staged: Option<Entry>,
    /// By target path.
    pub(crate) publications: BTreeMap<String, Entry>,
    /// Journal lines in write order; their numbers are given when they are applied.
    pub(crate) steps: Vec<(u64, StepRecord)>,
}

impl VolumeOverlay {
    fn is_empty(&self) -> bool {
        self.format.is_none()
            && self.staged.is_none()
            && self.publications.is_empty()
            && self.steps.is_empty()
    }

    fn len(&self) -> usize {
        usize::from(self.format.is_some())
            + usize::from(self.staged.is_some())
            + self.publications.len()
            + self.steps.len()
    }

    /// Drops the entries a batch up to `ticket` holds.
    fn retire(&mut self, ticket: u64) {
        let old = |e: &Option<Entry>| matches!(e, Some((t, _)) if *t <= ticket);
        if old(&self.format) {
            self.format = None;
        }
        if old(&self.staged) {
            self.staged = None;
        }
        self.publications.retain(|_, (t, _)| *t > ticket);
        self.steps.retain(|(t, _)| *t > ticket);
    }

    /// Only what a snapshot holding batches up to `applied` does not hold yet.
    pub(crate) fn newer_than(mut self, applied: u64) -> Self {
        self.retire(applied);
        self
    }

    /// The record of `table` ("formats" or "staged"), if a lazy write changed it.
    pub(crate) fn keyed(&self, table: &str) -> Option<&Option<Vec<u8>>> {
        let entry = if table == FORMATS.name() {
            &self.format
        } else if table == STAGED.name() {
            &self.staged
        } else {
            return None;
        };
        entry.as_ref().map(|(_, v)| v)
    }
}

#[derive(Default)]
pub(crate) struct Overlay {
    volumes: BTreeMap<String, VolumeOverlay>,
    entries: usize,
}

/// Whether a lazy write can be served from the overlay: it touches only per-volume records
/// (format, staging, publications, journal lines). Loop volumes, snapshots and forgetting a
/// volume commit as before.
pub(crate) fn can_hold(ops: &[Op]) -> bool {
    ops.iter().all(|op| match op {
        Op::Put(def, ..) | Op::Delete(def, ..) => {
            def.name() == FORMATS.name() || def.name() == STAGED.name()
        }
        Op::PutPublication { .. } | Op::DeletePublication { .. } | Op::Step { .. } => true,
        Op::ForgetVolume(_) => false,
    })
}

/// The volumes whose overlay-visible records (format, staging, publications, journal) `ops`
/// change; a forgotten volume's included.
pub(crate) fn volumes_of(ops: &[Op]) -> Vec<String> {
    let mut out: Vec<String> = ops
        .iter()
        .filter_map(|op| match op {
            Op::Put(def, key, _) | Op::Delete(def, key)
                if def.name() == FORMATS.name() || def.name() == STAGED.name() =>
            {
                Some(key)
            }
            Op::Put(..) | Op::Delete(..) => None,
            Op::PutPublication { volume, .. }
            | Op::DeletePublication { volume, .. }
            | Op::Step { volume, .. }
            | Op::ForgetVolume(volume) => Some(volume),
        })
        .cloned()
        .collect();
    out.sort();
    out.dedup();
    out
}

impl Overlay {
    pub(crate) fn is_full(&self) -> bool {
        self.entries >= MAX_ENTRIES
    }

    /// Records a lazy write's changes (which `can_hold`) under its ticket.
    pub(crate) fn hold(&mut self, ticket: u64, ops: &[Op]) {
        for op in ops {
            let (volume, change) = match op {
                Op::Put(def, key, value) => (key, Change::Keyed(def.name(), Some(value.clone()))),
                Op::Delete(def, key) => (key, Change::Keyed(def.name(), None)),
                Op::PutPublication {
                    volume,
                    target,
                    value,
                } => (volume, Change::Publication(target, Some(value.clone()))),
                Op::DeletePublication { volume, target } => {
                    (volume, Change::Publication(target, None))
                }
                Op::Step { volume, line } => (volume, Change::Step(line)),
                Op::ForgetVolume(_) => continue,
            };
            let v = self.volumes.entry(volume.clone()).or_default();
            let before = v.len();
            match change {
                Change::Keyed(table, value) => {
                    if table == FORMATS.name() {
                        v.format = Some((ticket, value));
                    } else if table == STAGED.name() {
                        v.staged = Some((ticket, value));
                    }
                }
                Change::Publication(target, value) => {
                    v.publications.insert(target.clone(), (ticket, value));
                }
                Change::Step(line) => v.steps.push((ticket, line.clone())),
            }
            self.entries = self.entries + v.len() - before;
        }
    }

    /// Drops what batches up to `ticket` hold: called once such a batch is visible in redb, or
    /// failed (its lazy writes are then lost, as in a crash).
    pub(crate) fn retire(&mut self, ticket: u64) {
        if self.entries == 0 {
            return;
        }
        let mut entries = 0;
        self.volumes.retain(|_, v| {
            v.retire(ticket);
            entries += v.len();
            !v.is_empty()
        });
        self.entries = entries;
    }

    pub(crate) fn volume(&self, id: &str) -> Option<VolumeOverlay> {
        self.volumes.get(id).cloned()
    }

    pub(crate) fn all(&self) -> BTreeMap<String, VolumeOverlay> {
        self.volumes.clone()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.entries == 0
    }
}

enum Change<'a> {
    Keyed(&'a str, Option<Vec<u8>>),
    Publication(&'a String, Option<Vec<u8>>),
    Step(&'a StepRecord),
}
