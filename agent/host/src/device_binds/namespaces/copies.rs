//! This agent's own private copies of mount namespaces (`unveil`), counted while they may live.
//! A copy holds every mount of the namespace it was made of, so a filesystem unmounted there
//! meanwhile stays claimed until the copy goes: the claim is the agent's own, and an unstage
//! that met it was refused "still mounted elsewhere" (a fifty-third fresh review's F5; rehearsal
//! 71). `settled` lets a caller that found a device claimed ask again once the agent's own
//! copies are gone.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How many copies may live now, and when the last one went.
struct Count {
    live: usize,
    last_gone: Option<Instant>,
}

static COUNT: Mutex<Count> = Mutex::new(Count {
    live: 0,
    last_gone: None,
});
static GONE: Condvar = Condvar::new();

/// The kernel tears a thread's namespace down as the thread exits, after its joiner may have
/// woken: a copy counts as live for this long after its thread was joined.
const TEARDOWN: Duration = Duration::from_millis(100);

fn count() -> MutexGuard<'static, Count> {
    COUNT.lock().unwrap_or_else(|p| p.into_inner())
}

/// One entering thread's copy, if it makes one: counted from `made` until the slot drops, which
/// its owner does only once the thread is joined.
#[derive(Default)]
pub(super) struct Slot(AtomicBool);

impl Slot {
    /// The thread is about to copy its namespace.
    pub fn made(&self) {
        if !self.0.swap(true, Ordering::AcqRel) {
            count().live += 1;
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if self.0.load(Ordering::Acquire) {
            let mut c = count();
            c.live -= 1;
            c.last_gone = Some(Instant::now());
            GONE.notify_all();
        }
    }
}

/// Waits, `limit` at most, until no copy of this agent's may still hold a mount: none live, and
/// the last gone `TEARDOWN` ago. Whether any might have held one meanwhile (so that a claim seen
/// before is worth asking again); `false` at once when none was made lately.
pub fn settled(limit: Duration) -> bool {
    let until = Instant::now() + limit;
    let mut c = count();
    let recent = |c: &Count| c.last_gone.is_some_and(|at| at.elapsed() < TEARDOWN);
    if c.live == 0 && !recent(&c) {
        return false;
    }
    loop {
        let now = Instant::now();
        if now >= until {
            return true;
        }
        if c.live == 0 {
            match c.last_gone.map(|at| at + TEARDOWN) {
                Some(quiet) if quiet > now => {
                    let wait = quiet.min(until) - now;
                    drop(c);
                    std::thread::sleep(wait);
                    c = count();
                }
                _ => return true,
            }
        } else {
            c = GONE
                .wait_timeout(c, until - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A caller that saw a claim while a copy lived waits for the copy, and a moment more, before
    /// it asks again (other tests' copies may only make it wait longer).
    #[test]
    fn a_claim_is_asked_again_only_once_the_copies_are_gone() {
        let slot = Slot::default();
        slot.made();
        let started = Instant::now();
        std::thread::scope(|s| {
            s.spawn(move || {
                std::thread::sleep(Duration::from_millis(50));
                drop(slot);
            });
            assert!(settled(Duration::from_secs(5)));
        });
        assert!(started.elapsed() >= Duration::from_millis(50) + TEARDOWN);
    }
}
