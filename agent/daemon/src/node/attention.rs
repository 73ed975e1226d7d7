//! Volumes that need attention: a volume whose records could not be checked against the host
//! (a recorded path refused or below a dead mount, an I/O error, a record that does not decode,
//! a check that did not finish in time). Only that volume is affected: calls on it answer
//! FAILED_PRECONDITION naming the reason, every other volume and Probe carry on.
//!
//! In memory only: start-up recovery checks every volume again at each start, so a mark is never
//! older than the process. A mark clears when a check of the volume succeeds: the background
//! retry (every `retry` at first, backing off to ten times that), or any call on the volume,
//! which checks it again before anything else (so the CO's retry of NodeUnpublish or
//! NodeUnstage is the retry of the check too).
//!
//! Checks run on the blocking pool, where everything that walks paths runs ("nothing on the
//! async side touches the host"), and are waited for a bounded time: a check hanging below a dead
//! mount keeps its thread and the volume's guard until the kernel lets go, but nobody waits for
//! it, and no second check of that volume starts meanwhile.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{AgentCtx, lock};
use ebs_node_core::error::Error;
use ebs_node_core::node::VolumeGuard;
use ebs_node_core::node::recover::{VolumeReport, recover_volume};

/// The background retry's pause after the first failed check, by default.
pub const RETRY: Duration = Duration::from_secs(30);
/// The longest pause between background checks, as a multiple of the first.
const BACKOFF_CAP: u32 = 10;

#[derive(Clone, Debug)]
struct Mark {
    reason: String,
    since_unix_ms: u64,
    failed_checks: u32,
    next_check: Instant,
}

#[derive(Default)]
struct State {
    marks: HashMap<String, Mark>,
    /// Volumes with a check running, since when.
    checking: HashMap<String, Instant>,
}

pub struct Attention {
    state: Mutex<State>,
    retry: Duration,
    /// The store's reopens already answered (`after_reopen`).
    seen_reopens: std::sync::atomic::AtomicU64,
}

impl Default for Attention {
    fn default() -> Self {
        Attention::new(RETRY)
    }
}

impl Attention {
    pub fn new(retry: Duration) -> Self {
        Attention {
            state: Mutex::default(),
            retry: retry.max(Duration::from_millis(100)),
            seen_reopens: Default::default(),
        }
    }

    /// Marks the volume to be checked again at once, in the background and by the next call on
    /// it (its records may have lost what the host shows), without counting a failed check.
    pub fn recheck(&self, volume: &str, reason: &str) {
        let mut s = lock(&self.state);
        let mark = s.marks.entry(volume.to_string()).or_insert_with(|| Mark {
            reason: String::new(),
            since_unix_ms: ebs_node_core::records::now_unix_ms(),
            failed_checks: 0,
            next_check: Instant::now(),
        });
        mark.reason = reason.to_string();
        mark.next_check = Instant::now();
    }

    /// Marks the volume (or updates its reason); the next background check backs off.
    pub fn mark(&self, volume: &str, reason: &str) {
        let mut s = lock(&self.state);
        let mark = s.marks.entry(volume.to_string()).or_insert_with(|| {
            tracing::warn!(volume, reason, "volume needs attention: its records cannot be checked against the host; other volumes are not affected");
            Mark {
                reason: String::new(),
                since_unix_ms: ebs_node_core::records::now_unix_ms(),
                failed_checks: 0,
                next_check: Instant::now(),
            }
        });
        mark.reason = reason.to_string();
        mark.failed_checks = mark.failed_checks.saturating_add(1);
        let factor = 1u32
            .checked_shl(mark.failed_checks - 1)
            .unwrap_or(BACKOFF_CAP)
            .min(BACKOFF_CAP);
        mark.next_check = Instant::now() + self.retry * factor;
    }

    pub fn is_marked(&self, volume: &str) -> bool {
        lock(&self.state).marks.contains_key(volume)
    }

    /// How many volumes are marked.
    pub fn count(&self) -> usize {
        lock(&self.state).marks.len()
    }

    /// The refusal for a call on a marked volume, naming the reason; `None` if it is not marked.
    pub fn refusal(&self, volume: &str) -> Option<Error> {
        let s = lock(&self.state);
        let mark = s.marks.get(volume)?;
        let now = Instant::now();
        let when = match s.checking.get(volume) {
            Some(since) => format!(
                "a check has been running for {} s",
                now.saturating_duration_since(*since).as_secs()
            ),
            None => format!(
                "checked again in the background in {} s and by each call on it",
                mark.next_check.saturating_duration_since(now).as_secs()
            ),
        };
        Some(Error::NeedsAttention {
            volume: volume.to_string(),
            reason: mark.reason.clone(),
            failed_checks: mark.failed_checks,
            when,
        })
    }

    /// Starts a check of `volume`; false while one is running.
    fn begin(&self, volume: &str) -> bool {
        let mut s = lock(&self.state);
        if s.checking.contains_key(volume) {
            return false;
        }
        s.checking.insert(volume.to_string(), Instant::now());
        true
    }

    /// A check ended: success clears the mark, failure marks with its reason.
    fn end(&self, volume: &str, outcome: &Result<VolumeReport, String>) {
        lock(&self.state).checking.remove(volume);
        match outcome {
            Ok(_) => {
                if lock(&self.state).marks.remove(volume).is_some() {
                    tracing::info!(
                        volume,
                        "volume checked out against the host; no longer needs attention"
                    );
                }
            }
            Err(why) => self.mark(volume, why),
        }
    }

    /// Nobody waits any longer for a check that is still running: the volume is marked.
    fn gave_up(&self, volume: &str, waited: Duration) {
        let running = lock(&self.state).checking.contains_key(volume);
        if running {
            self.mark(
                volume,
                &format!(
                    "checking its records against the host did not finish within {} s (a \
                     recorded path below a dead NFS or FUSE mount?); the check keeps waiting",
                    waited.as_secs()
                ),
            );
        }
    }

    /// Marked volumes whose next background check is due and that no check is running for.
    fn due(&self) -> Vec<String> {
        let s = lock(&self.state);
        let now = Instant::now();
        s.marks
            .iter()
            .filter(|(v, m)| m.next_check <= now && !s.checking.contains_key(*v))
            .map(|(v, _)| v.clone())
            .collect()
    }

    /// The marks for `status`: volume id → what `needs_attention` shows.
    pub fn snapshot(&self) -> HashMap<String, Value> {
        let s = lock(&self.state);
        let now = Instant::now();
        s.marks
            .iter()
            .map(|(v, m)| {
                let checking = s.checking.get(v).map(|t| now.saturating_duration_since(*t));
                let value = json!({
                    "reason": m.reason,
                    "since_unix_ms": m.since_unix_ms,
                    "failed_checks": m.failed_checks,
                    "checking_for_s": checking.map(|d| d.as_secs()),
                    "next_check_in_s": checking.is_none()
                        .then(|| m.next_check.saturating_duration_since(now).as_secs()),
                });
                (v.clone(), value)
            })
            .collect()
    }
}

pub enum Checked {
    /// The records check out (the mark, if any, is cleared); the guard is still held.
    Recovered(VolumeGuard, VolumeReport),
    /// Marked: the refusal naming why.
    Refused(Error),
}

/// Checks `volume`'s records against the host (start-up recovery of one volume) on a blocking
/// thread, holding `guard`, and waits `wait` at most. A check that runs on keeps the guard and
/// settles the mark itself when it ends.
pub async fn check(
    ctx: &Arc<AgentCtx>,
    volume: &str,
    guard: VolumeGuard,
    wait: Duration,
) -> Checked {
    let refused = |ctx: &AgentCtx| {
        Checked::Refused(
            ctx.attention
                .refusal(volume)
                .unwrap_or_else(|| Error::BeingChecked {
                    volume: volume.to_string(),
                }),
        )
    };
    if !ctx.attention.begin(volume) {
        return refused(ctx);
    }
    let (tx, rx) = tokio::sync::oneshot::channel();
    let worker = Arc::clone(ctx);
    let vol = volume.to_string();
    let spawned = tokio::task::spawn_blocking(move || {
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            recover_volume(&worker, &vol)
        }))
        .unwrap_or_else(|_| {
            Err(Error::Panicked {
                what: format!("the check of volume {vol}"),
            })
        })
        .map_err(|e| e.to_string());
        worker.attention.end(&vol, &outcome);
        let _ = tx.send((outcome, guard));
    });
    drop(spawned);
    match tokio::time::timeout(wait, rx).await {
        Ok(Ok((Ok(report), guard))) => Checked::Recovered(guard, report),
        Ok(_) => refused(ctx),
        Err(_) => {
            ctx.attention.gave_up(volume, wait);
            refused(ctx)
        }
    }
}

/// After the state file was reopened following a failed commit (a full disk), what it recorded
/// lazily since its last durable commit is gone, as in a crash: every recorded volume is marked,
/// so it is checked against the host again (as start-up does) before anything else is done with
/// it, and in the background (a twenty-first fresh review's F4: records of mounts already gone
/// came back, and the controller refused to detach over them until a restart).
pub fn after_reopen(ctx: &AgentCtx) {
    use std::sync::atomic::Ordering;
    let now = ctx.store.reopens();
    let seen = &ctx.attention.seen_reopens;
    if seen.load(Ordering::Acquire) == now || seen.swap(now, Ordering::AcqRel) == now {
        return;
    }
    match ctx.store.recorded_volume_ids() {
        Ok(ids) => {
            tracing::warn!(
                volumes = ids.len(),
                "the state file was reopened after a failed commit: every volume is checked against the host again"
            );
            for id in ids {
                ctx.attention.recheck(
                    &id,
                    "the state file was reopened after a failed commit (a full disk?): what it \
                     recorded last may be lost, so the volume is checked against the host again",
                );
            }
        }
        Err(e) => tracing::warn!(error = %e, "the volumes to check again cannot be listed"),
    }
}

/// Checks marked volumes again in the background, each when its back-off is over, never more
/// than one check per volume, never waiting on one for another.
pub fn spawn_retries(ctx: Arc<AgentCtx>, wait: Duration) {
    let tick = ctx.attention.retry.min(Duration::from_secs(1));
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(tick).await;
            let seen = Arc::clone(&ctx);
            let checked = crate::error::blocking(move || {
                after_reopen(&seen);
                Ok(())
            });
            drop(checked.await);
            for volume in ctx.attention.due() {
                // A call holds the volume: it checks the volume itself.
                let Some(guard) = ctx.locks.try_lock(&volume) else {
                    continue;
                };
                let ctx = Arc::clone(&ctx);
                tokio::spawn(async move {
                    drop(check(&ctx, &volume, guard, wait).await);
                });
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mark_backs_off_and_clears_on_a_good_check() {
        let a = Attention::new(Duration::from_secs(30));
        assert!(a.refusal("v").is_none());
        a.mark("v", "a component of it is a symbolic link");
        let e = a.refusal("v").expect("marked");
        assert!(
            e.to_string().contains("needs attention: a component"),
            "{e}"
        );
        assert!(a.due().is_empty(), "not before the first pause");
        for _ in 0..6 {
            a.mark("v", "still");
        }
        let next = lock(&a.state).marks["v"].next_check;
        let pause = next.saturating_duration_since(Instant::now());
        assert!(pause > Duration::from_secs(290) && pause <= Duration::from_secs(300));
        assert!(a.begin("v"));
        assert!(!a.begin("v"), "one check per volume at a time");
        assert!(a.refusal("v").unwrap().to_string().contains("running for"));
        a.end("v", &Ok(VolumeReport::default()));
        assert!(!a.is_marked("v"));
        assert!(a.begin("v"));
    }

    #[test]
    fn giving_up_marks_only_a_check_still_running() {
        let a = Attention::new(Duration::from_secs(1));
        assert!(a.begin("slow"));
        a.gave_up("slow", Duration::from_secs(5));
        assert!(
            a.snapshot()["slow"]["reason"]
                .as_str()
                .unwrap()
                .contains("did not finish within 5 s")
        );
        assert!(a.begin("quick"));
        a.end("quick", &Ok(VolumeReport::default()));
        a.gave_up("quick", Duration::from_secs(5));
        assert!(!a.is_marked("quick"));
        assert_eq!(a.count(), 1);
    }
}
