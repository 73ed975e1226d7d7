//! The boot log's writes back in redb: at start (after a crash of the agent on this boot) and
//! after a reopen (redb repaired the file to its last durable commit). Also what marks a file
//! as needing its log: an agent older than the log would read such a file without the writes
//! only the log holds, so while an agent runs on it (or was killed) the file says schema 2,
//! which such an agent refuses, and a clean stop sets it back to 1.

use redb::ReadableDatabase;

use crate::boot_log::{BootLog, Held, Logged};
use crate::overlay::APPLIED_TICKET;
use crate::writer::apply;
use crate::{META, SCHEMA_AT_REST, SCHEMA_VERSION, Store, StoreError};

/// The META key of the nonce that names this state file, for this run, in its boot log's
/// header. Made anew at every start, so that a log a run left is never taken for a later one's.
const NONCE: &str = "boot_log_nonce";

/// Applies `writes` (in ticket order) in one durable transaction that records the last ticket,
/// with `meta` (key, value) too.
pub(crate) fn apply_durably(
    db: &redb::Database,
    writes: Vec<Logged>,
    meta: &[(&str, u64)],
) -> Result<(), StoreError> {
    let last = writes.last().map(|(t, _)| *t);
    if last.is_none() && meta.is_empty() {
        return Ok(());
    }
    let count = writes.len();
    let tx = db.begin_write()?;
    for (_, ops) in &writes {
        for op in ops {
            apply(&tx, op)?;
        }
    }
    {
        let mut t = tx.open_table(META)?;
        if let Some(last) = last {
            t.insert(APPLIED_TICKET, last)?;
        }
        for (k, v) in meta {
            t.insert(*k, *v)?;
        }
    }
    tx.commit()?;
    if let Some(last) = last {
        tracing::info!(
            writes = count,
            through_ticket = last,
            "state writes the agent's last run made since its last durable commit, replayed from this boot's log"
        );
    }
    Ok(())
}

/// The writes to replay onto a file whose last committed ticket is `applied`: every ticket
/// after it must be in the log, or the log is not this file's continuation.
fn continuation(
    path: &std::path::Path,
    held: Held,
    applied: u64,
) -> Result<Vec<Logged>, StoreError> {
    let after: Vec<u64> = held.tickets.range(applied + 1..).copied().collect();
    let contiguous = after
        .iter()
        .enumerate()
        .all(|(i, t)| *t == applied + 1 + i as u64);
    if !contiguous {
        return Err(StoreError::BootLogDiverged {
            path: path.to_path_buf(),
            first: after.first().copied().unwrap_or_default(),
            applied,
        });
    }
    Ok(held
        .writes
        .into_iter()
        .filter(|(t, _)| *t > applied)
        .collect())
}

impl Store {
    /// Opens this boot's log of the live file, replays what it holds past the file's last
    /// committed batch, names the file anew, marks it as needing its log, and hands the log to
    /// the group commit; returns the last ticket now applied.
    pub(crate) fn start_boot_log(&self, db: &redb::Database) -> Result<u64, StoreError> {
        let applied = crate::reads::applied_ticket_of(db)?;
        let opened = BootLog::open(&self.path, nonce(db)?)?;
        let (log, writes) = match opened {
            Some((log, held)) => (Some(log), continuation(&self.path, held, applied)?),
            None => (None, Vec::new()),
        };
        let through = writes.last().map_or(applied, |(t, _)| *t);
        let nonce = crate::boot_log::new_nonce();
        // Durable before the log is emptied; the new nonce leaves any file of the old log
        // (one that cannot be emptied) naming another run.
        apply_durably(
            db,
            writes,
            &[(NONCE, nonce), ("schema_version", SCHEMA_VERSION)],
        )?;
        if let Some(log) = log.and_then(|log| log.begin(&self.path, nonce)) {
            self.group.attach_log(log);
        }
        Ok(through)
    }

    /// A clean stop: every write durable, the log emptied, and the file marked readable by an
    /// agent without the log. Skipped (the file stays marked) if a write is still in flight.
    pub fn close_cleanly(&self) -> Result<(), StoreError> {
        self.sync()?;
        let crate::Db::ReadWrite(live) = &self.db else {
            return Err(StoreError::ReadOnly);
        };
        let db = live.get()?;
        self.group.when_idle(|log| {
            apply_durably(&db, Vec::new(), &[("schema_version", SCHEMA_AT_REST)])?;
            if let Some(log) = log {
                log.clear();
            }
            Ok(())
        })
    }
}

/// The file's nonce for its last run, if it had a log.
fn nonce(db: &redb::Database) -> Result<Option<u64>, StoreError> {
    let tx = db.begin_read()?;
    let Ok(t) = tx.open_table(META) else {
        return Ok(None);
    };
    Ok(t.get(NONCE)?.map(|v| v.value()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(writes: &[u64], voided: &[u64]) -> Held {
        Held {
            writes: writes.iter().map(|t| (*t, Vec::new())).collect(),
            tickets: writes.iter().chain(voided).copied().collect(),
        }
    }

    fn replayed(h: Held, applied: u64) -> Result<Vec<u64>, StoreError> {
        continuation("/s".as_ref(), h, applied).map(|w| w.into_iter().map(|(t, _)| t).collect())
    }

    #[test]
    fn only_a_log_that_continues_the_file_is_replayed() {
        // The file holds up to 5: 6 and 8 are replayed, 7's batch failed.
        assert_eq!(replayed(held(&[3, 4, 5, 6, 8], &[7]), 5).unwrap(), [6, 8]);
        // Nothing past the file: nothing to replay.
        assert!(replayed(held(&[3, 4], &[]), 5).unwrap().is_empty());
        // A file restored from before the log's writes: 6 is missing.
        assert!(matches!(
            replayed(held(&[7, 8], &[]), 5),
            Err(StoreError::BootLogDiverged {
                first: 7,
                applied: 5,
                ..
            })
        ));
        // A hole inside the log.
        assert!(replayed(held(&[6, 8], &[]), 5).is_err());
    }
}
