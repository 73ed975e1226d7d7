//! The boot log's writes back in redb: at start (after a crash of the agent on this boot) and
//! after a reopen (redb repaired the file to its last durable commit).

use redb::ReadableDatabase;

use crate::boot_log::{BootLog, Logged};
use crate::overlay::APPLIED_TICKET;
use crate::writer::apply;
use crate::{META, Store, StoreError};

/// The META key of the nonce that names this state file in its boot log's header.
const NONCE: &str = "boot_log_nonce";

/// Applies `writes` (in ticket order) in one durable transaction that records the last ticket.
pub(crate) fn apply_durably(db: &redb::Database, writes: Vec<Logged>) -> Result<(), StoreError> {
    let Some(last) = writes.last().map(|(t, _)| *t) else {
        return Ok(());
    };
    let count = writes.len();
    let tx = db.begin_write()?;
    for (_, ops) in writes {
        for op in ops {
            apply(&tx, op)?;
        }
    }
    tx.open_table(META)?.insert(APPLIED_TICKET, last)?;
    tx.commit()?;
    tracing::info!(
        writes = count,
        through_ticket = last,
        "state writes the agent's last run made since its last durable commit, replayed from this boot's log"
    );
    Ok(())
}

impl Store {
    /// Opens this boot's log of the live file, replays what it holds past the file's last
    /// committed batch, and hands it to the group commit; returns the last ticket now applied.
    pub(crate) fn start_boot_log(&self, db: &redb::Database) -> Result<u64, StoreError> {
        let nonce = nonce(db)?;
        let applied = crate::reads::applied_ticket_of(db)?;
        let Some((log, held)) = BootLog::open(&self.path, nonce) else {
            return Ok(applied);
        };
        let writes: Vec<Logged> = held.into_iter().filter(|(t, _)| *t > applied).collect();
        let through = writes.last().map_or(applied, |(t, _)| *t);
        // Durable before the log is emptied.
        apply_durably(db, writes)?;
        if let Some(log) = log.begin(&self.path) {
            self.group.attach_log(log);
        }
        Ok(through)
    }
}

/// The file's nonce, made (durably) the first time.
fn nonce(db: &redb::Database) -> Result<u64, StoreError> {
    if let Some(n) = db
        .begin_read()?
        .open_table(META)
        .ok()
        .and_then(|t| t.get(NONCE).ok().flatten().map(|v| v.value()))
    {
        return Ok(n);
    }
    let n = crate::boot_log::new_nonce();
    let tx = db.begin_write()?;
    tx.open_table(META)?.insert(NONCE, n)?;
    tx.commit()?;
    Ok(n)
}
