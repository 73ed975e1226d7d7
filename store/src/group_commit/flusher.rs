//! The flusher: the thread that commits the lazy writes nobody waits for.

use std::time::Instant;

use super::{GroupCommit, Outcome, RIDE_ALONG};
use crate::StoreError;

impl GroupCommit {
    /// The flusher's loop: commits the writes nobody waits for whenever no caller is leading,
    /// until the store closes (then what is left first). `db` is taken only to commit, never
    /// while waiting: a reopen after a failed commit needs it free.
    pub(crate) fn flush_unattended<G: std::ops::Deref<Target = redb::Database>>(
        &self,
        db: impl Fn() -> Result<G, StoreError>,
        committed: impl Fn(&Outcome),
    ) {
        let mut q = self.lock();
        loop {
            if q.unattended() == 0 && q.closing {
                return;
            }
            if q.unattended() == 0 || q.leading {
                q = self
                    .unattended_queued
                    .wait(q)
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
                continue;
            }
            // Held writes first wait a little to ride along with a batch a caller leads (under
            // load a durable write is rarely far off): fewer transactions, each of which queues
            // on redb's one writer. Nobody waits for them, and they are no less durable.
            let deadline = Instant::now() + RIDE_ALONG;
            while q.unattended() > 0 && !q.closing {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                q = self
                    .unattended_queued
                    .wait_timeout(q, left)
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .0;
            }
            if q.unattended() == 0 || q.leading {
                continue;
            }
            drop(q);
            let handle = db();
            q = self.lock();
            let handle = match handle {
                Ok(handle) => handle,
                // Another caller leads meanwhile: what it takes is its to settle.
                Err(_) if q.leading => continue,
                Err(e) => {
                    // The file cannot be reopened: what is held stays held (its callers were
                    // told OK; the boot log has it for a start after a crash), and is tried
                    // again a while later. The failure is on record already.
                    tracing::warn!(error = %e, "held state writes wait: the state file cannot be reopened");
                    if q.closing {
                        return;
                    }
                    q = self.back_off(q);
                    continue;
                }
            };
            if q.leading || q.unattended() == 0 {
                continue;
            }
            let (again, outcome) = self.lead(&handle, q);
            q = again;
            drop(handle);
            if let Some(outcome) = outcome {
                committed(&outcome);
                // A failed batch's held writes went back to the queue: tried again a while
                // later, not at once (the file is failing), and not at all once closing.
                if outcome.is_err() {
                    if q.closing {
                        return;
                    }
                    q = self.back_off(q);
                }
            }
        }
    }

    /// Waits a while before the held writes are tried again on a failing file.
    fn back_off<'a>(
        &'a self,
        q: std::sync::MutexGuard<'a, super::Queue>,
    ) -> std::sync::MutexGuard<'a, super::Queue> {
        self.unattended_queued
            .wait_timeout(q, RETRY_AFTER_FAILURE)
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .0
    }
}

/// How long held writes wait before they are tried again on a file whose commit failed.
const RETRY_AFTER_FAILURE: std::time::Duration = std::time::Duration::from_secs(1);
