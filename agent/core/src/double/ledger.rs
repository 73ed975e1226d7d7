//! The store as the pipeline's unit tests keep it: records and journal lines in memory, each
//! write applied whole or not at all, and whether the last one was durable (the real store's
//! `last_write_durable`), so the double can say what was on disk when the host was touched.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::ledger::{Changes as LedgerChanges, Ledger, LedgerResult, LedgerWriter};
use crate::records::{
    DeviceClaim, Durability, FormatRecord, Phase, Publication, StagedVolume, StepRecord,
};

#[derive(Clone, Default)]
struct Records {
    formats: HashMap<String, FormatRecord>,
    staged: HashMap<String, StagedVolume>,
    publications: BTreeMap<(String, PathBuf), Publication>,
    journal: HashMap<String, Vec<StepRecord>>,
    claims: BTreeMap<String, DeviceClaim>,
}

/// One change of a write. Collected while the pipeline builds the write (it may read the ledger
/// meanwhile, as it may read the store), then applied together under the lock.
#[derive(Clone)]
enum Change {
    PutFormat(FormatRecord),
    DeleteFormat(String),
    PutStaged(StagedVolume),
    DeleteStaged(String),
    PutPublication(Publication),
    DeletePublication(String, PathBuf),
    Step(String, String, String, Phase, BTreeMap<String, String>),
    PutClaim(String, DeviceClaim),
    DeleteClaim(String),
}

#[derive(Default)]
struct Changes(Vec<Change>);

impl LedgerWriter for Changes {
    fn put_format(&mut self, f: &FormatRecord) -> LedgerResult<()> {
        self.0.push(Change::PutFormat(f.clone()));
        Ok(())
    }
    fn delete_format(&mut self, volume_id: &str) -> LedgerResult<()> {
        self.0.push(Change::DeleteFormat(volume_id.to_string()));
        Ok(())
    }
    fn put_staged(&mut self, s: &StagedVolume) -> LedgerResult<()> {
        self.0.push(Change::PutStaged(s.clone()));
        Ok(())
    }
    fn delete_staged(&mut self, volume_id: &str) -> LedgerResult<()> {
        self.0.push(Change::DeleteStaged(volume_id.to_string()));
        Ok(())
    }
    fn put_publication(&mut self, p: &Publication) -> LedgerResult<()> {
        self.0.push(Change::PutPublication(p.clone()));
        Ok(())
    }
    fn delete_publication(&mut self, volume_id: &str, target: &Path) -> LedgerResult<()> {
        self.0.push(Change::DeletePublication(
            volume_id.to_string(),
            target.to_path_buf(),
        ));
        Ok(())
    }
    fn put_claim(&mut self, key: &str, claim: &DeviceClaim) -> LedgerResult<()> {
        self.0
            .push(Change::PutClaim(key.to_string(), claim.clone()));
        Ok(())
    }
    fn delete_claim(&mut self, key: &str) -> LedgerResult<()> {
        self.0.push(Change::DeleteClaim(key.to_string()));
        Ok(())
    }
    fn step(
        &mut self,
        volume_id: &str,
        op: &str,
        step: &str,
        phase: Phase,
        detail: BTreeMap<String, String>,
    ) -> LedgerResult<()> {
        self.0.push(Change::Step(
            volume_id.to_string(),
            op.to_string(),
            step.to_string(),
            phase,
            detail,
        ));
        Ok(())
    }
}

impl Kept {
    /// A durable commit: every write so far is kept, and a stopped log starts again.
    fn make_durable(&mut self) {
        for (change, _) in self.pending.drain(..) {
            self.records.apply(change);
        }
        self.log_stopped = false;
    }
}

impl Records {
    fn apply(&mut self, change: Change) {
        match change {
            Change::PutFormat(f) => {
                self.formats.insert(f.volume_id.clone(), f);
            }
            Change::DeleteFormat(v) => {
                self.formats.remove(&v);
            }
            Change::PutStaged(s) => {
                self.staged.insert(s.volume_id.clone(), s);
            }
            Change::DeleteStaged(v) => {
                self.staged.remove(&v);
            }
            Change::PutPublication(p) => {
                let key = (p.volume_id.clone(), p.target_path.clone());
                self.publications.insert(key, p);
            }
            Change::DeletePublication(v, target) => {
                self.publications.remove(&(v, target));
            }
            Change::PutClaim(key, claim) => {
                self.claims.insert(key, claim);
            }
            Change::DeleteClaim(key) => {
                self.claims.remove(&key);
            }
            Change::Step(v, op, step, phase, detail) => {
                let lines = self.journal.entry(v).or_default();
                // Bounded as the store bounds it (`JOURNAL_LINES_PER_VOLUME` plus its slack).
                if lines.len() >= JOURNAL_LINES + JOURNAL_SLACK {
                    lines.drain(..lines.len() - JOURNAL_LINES);
                }
                lines.push(StepRecord {
                    seq: lines.last().map_or(0, |l| l.seq + 1),
                    op,
                    step,
                    phase,
                    at_unix_ms: 0,
                    detail,
                });
            }
        }
    }
}

/// The store's bound on a volume's journal (`ebs_node_store::JOURNAL_LINES_PER_VOLUME`, with
/// its trim slack): the core does not link the store.
const JOURNAL_LINES: usize = 48;
const JOURNAL_SLACK: usize = 16;

#[derive(Default)]
pub struct MemLedger {
    records: Mutex<Records>,
    last_durable: AtomicBool,
    /// What a power cut leaves, and what a crash of the agent does (`Kept`).
    durable: Mutex<Kept>,
}

/// What a power cut leaves: every write up to the last durable one (redb keeps a non-durable
/// commit only until the next durable one). The non-durable changes since, which a durable write
/// makes durable with it, each with whether the store's boot log holds it: a crash of the agent
/// leaves those the log holds (a prefix: after a failed append the real log takes nothing until
/// every write it left out is durable). A log, not a copy per durable write, so the simulation's
/// millions of writes cost what they change.
#[derive(Default)]
struct Kept {
    records: Records,
    pending: Vec<(Change, bool)>,
    /// The boot log failed an append (a full state disk): it takes nothing more, and every
    /// `Boot` write is made durable, until a durable write holds what it left out.
    log_stopped: bool,
}

impl MemLedger {
    fn records(&self) -> std::sync::MutexGuard<'_, Records> {
        self.records.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The volume's journal lines, oldest first.
    pub fn journal(&self, volume_id: &str) -> Vec<StepRecord> {
        self.records()
            .journal
            .get(volume_id)
            .cloned()
            .unwrap_or_default()
    }

    /// A power cut: every write after the last durable one is lost, this boot's log with it.
    pub fn power_cut(&self) {
        let mut kept = self.kept();
        kept.pending.clear();
        kept.log_stopped = false;
        *self.records() = kept.records.clone();
    }

    /// The agent dies: the writes the boot log holds come back at its start, durably; the
    /// others are lost.
    pub fn crash(&self) {
        let mut kept = self.kept();
        for (change, logged) in std::mem::take(&mut kept.pending) {
            if !logged {
                break;
            }
            kept.records.apply(change);
        }
        kept.log_stopped = false;
        *self.records() = kept.records.clone();
    }

    /// The boot log's next append fails: until a durable write, a crash loses every lazy
    /// write, and `Boot` writes are made durable.
    pub fn stop_boot_log(&self) {
        self.kept().log_stopped = true;
    }

    fn kept(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.durable.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `recover --reset`: the state file is set aside and the agent starts on an empty one.
    pub fn reset(&self) {
        *self.kept() = Default::default();
        *self.records() = Records::default();
    }

    /// Every staged record.
    pub fn all_staged(&self) -> Vec<StagedVolume> {
        self.records().staged.values().cloned().collect()
    }

    /// `volume`'s staged record (the test knows there is one).
    pub fn staged_record(&self, volume: &str) -> StagedVolume {
        self.records().staged[volume].clone()
    }

    /// Writes a staged record as it is, durably.
    pub fn put(&self, s: StagedVolume) {
        Ledger::write(
            self,
            crate::records::Durability::Immediate,
            Box::new(move |w| w.put_staged(&s)),
        )
        .expect("write");
    }

    /// Every publication record.
    pub fn all_publications(&self) -> Vec<Publication> {
        self.records().publications.values().cloned().collect()
    }

    /// Every device claim, by key.
    pub fn claims(&self) -> BTreeMap<String, DeviceClaim> {
        self.records().claims.clone()
    }

    /// Whether the last write that changed anything outlives the agent's crash (`Immediate` or
    /// `Boot`).
    pub fn last_write_durable(&self) -> bool {
        self.last_durable.load(Ordering::Relaxed)
    }
}

impl Ledger for MemLedger {
    fn path(&self) -> &Path {
        Path::new("/double/state.redb")
    }
    fn format(&self, volume_id: &str) -> LedgerResult<Option<FormatRecord>> {
        Ok(self.records().formats.get(volume_id).cloned())
    }
    fn staged(&self, volume_id: &str) -> LedgerResult<Option<StagedVolume>> {
        Ok(self.records().staged.get(volume_id).cloned())
    }
    fn publications(&self, volume_id: &str) -> LedgerResult<Vec<Publication>> {
        Ok(self
            .records()
            .publications
            .iter()
            .filter(|((v, _), _)| v == volume_id)
            .map(|(_, p)| p.clone())
            .collect())
    }
    fn all_publications(&self) -> LedgerResult<Vec<Publication>> {
        Ok(MemLedger::all_publications(self))
    }
    fn publication(&self, volume_id: &str, target: &Path) -> LedgerResult<Option<Publication>> {
        let key = (volume_id.to_string(), target.to_path_buf());
        Ok(self.records().publications.get(&key).cloned())
    }
    fn recorded_volume_ids(&self) -> LedgerResult<Vec<String>> {
        let r = self.records();
        let mut ids: Vec<String> = r.staged.keys().cloned().collect();
        ids.extend(r.publications.keys().map(|(v, _)| v.clone()));
        ids.sort();
        ids.dedup();
        Ok(ids)
    }
    fn claim(&self, key: &str) -> LedgerResult<Option<DeviceClaim>> {
        Ok(self.records().claims.get(key).cloned())
    }
    fn knows_volume(&self, volume_id: &str) -> LedgerResult<bool> {
        let r = self.records();
        Ok(r.formats.contains_key(volume_id)
            || r.staged.contains_key(volume_id)
            || r.journal.contains_key(volume_id)
            || r.publications.keys().any(|(v, _)| v == volume_id))
    }
    fn write(&self, durability: Durability, changes: LedgerChanges<'_>) -> LedgerResult<()> {
        let mut collected = Changes::default();
        changes(&mut collected)?;
        if collected.0.is_empty() {
            return Ok(());
        }
        let mut records = self.records();
        let mut kept = self.kept();
        for change in &collected.0 {
            records.apply(change.clone());
        }
        let logged = !kept.log_stopped;
        kept.pending
            .extend(collected.0.into_iter().map(|c| (c, logged)));
        let durable = match durability {
            Durability::Immediate => true,
            Durability::Boot => !logged,
            Durability::Lazy => false,
        };
        if durable {
            kept.make_durable();
        }
        self.last_durable
            .store(durability != Durability::Lazy, Ordering::Relaxed);
        Ok(())
    }
    fn sync(&self) -> LedgerResult<()> {
        self.kept().make_durable();
        Ok(())
    }
}
